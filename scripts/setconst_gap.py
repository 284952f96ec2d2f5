"""metarl's derived model fields against MuJoCo's `mj_setConst` (README, "Derived
quantities"; audit of 2026-11-26): a context metarl writes into the mjx.Model whose
derived field is read by MJX's constraint rows or muscle model. Before 2026-11-26 all
four cases differed; `Binding.derive` now computes the inverse weights (A, B) and a
muscle's `actuator_acc0` (C, D) per drawn context, and `actuator_gain` scales
`actuator_lengthrange` (D): metarl and the MuJoCo-compiled model agree.
Run: `python scripts/setconst_gap.py` (about 35 s on 2 CPU cores).

Each case: a system settling to rest on a constraint (steady state is set by the
constraint's regularisation R ~ invweight0), or a muscle's force (F0 = 1/acc0).
Compares
  metarl : binding.apply(context) on the loaded mjx.Model (with what binding.derive
           computes), stepped by mjx.step
  fresh  : MJCF compiled with the changed parameter, stepped by mjx.step
  C      : same fresh MjModel, stepped by MuJoCo C (mj_step, float64)
"""

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
from mujoco import mjx

from metarl import contexts as C


def run_mjx(m, qpos, steps, ctrl=None):
    d = mjx.make_data(m).replace(qpos=jnp.asarray(qpos, jnp.float32))
    if ctrl is not None:
        d = d.replace(ctrl=jnp.asarray(ctrl, jnp.float32))
    d = jax.jit(lambda m, d: jax.lax.fori_loop(0, steps, lambda _, d: mjx.step(m, d), d))(m, d)
    return d


def run_c(mm, qpos, steps, ctrl=None):
    d = mujoco.MjData(mm)
    d.qpos[:] = qpos
    if ctrl is not None:
        d.ctrl[:] = ctrl
    for _ in range(steps):
        mujoco.mj_step(mm, d)
    return d


def run_all(m, fresh, qpos, steps, ctrl=None):
    """(metarl's model on MJX, the MuJoCo-compiled model on MJX, the same in MuJoCo C)."""
    return (
        run_mjx(m, qpos, steps, ctrl),
        run_mjx(mjx.put_model(fresh), qpos, steps, ctrl),
        run_c(fresh, qpos, steps, ctrl),
    )


def metarl(xml, name, value, relative=False):
    m0 = mjx.put_model(mujoco.MjModel.from_xml_string(xml))
    b = C.bind(C.ContextSpace({name: C.Fixed(value, relative=relative)}), m0, "mjx")
    return b.apply({name: jnp.float32(value)})


# --- A: armature -> dof_invweight0 (joint limit) -----------------------------
PEND = """<mujoco><option timestep="0.002"/><worldbody>
<body name="arm"><joint name="hinge" type="hinge" axis="0 1 0" limited="true" range="-10 10"
  armature="{arm}"/>
<geom type="capsule" fromto="0 0 0 0.5 0 0" size="0.02" mass="1" contype="0" conaffinity="0"/>
</body></worldbody></mujoco>"""

# --- B: mass of a jointless child -> parent's body_invweight0 (contact) ------
BOX = """<mujoco><option timestep="0.002"/><worldbody>
<geom name="floor" type="plane" size="2 2 .1"/>
<body name="torso" pos="0 0 0.1"><freejoint/>
 <geom name="torso" type="box" size=".1 .1 .1" mass="1"/>
 <body name="payload" pos="0 0 0.15">
  <geom name="payload" type="sphere" size=".05" mass="{pm}" contype="0" conaffinity="0"/></body>
</body></worldbody></mujoco>"""

# --- C: mass -> actuator_acc0 (muscle peak force) -----------------------------
MUSCLE = """<mujoco><option timestep="0.002" gravity="0 0 0"/><worldbody>
<body name="arm"><joint name="hinge" type="hinge" axis="0 1 0" limited="true" range="-60 60"/>
<geom type="capsule" fromto="0 0 0 0.5 0 0" size="0.02" mass="{m}" contype="0" conaffinity="0"/>
</body></worldbody><actuator><muscle name="mus" joint="hinge" gear="{g}"/></actuator></mujoco>"""

if __name__ == "__main__":
    steps = 1500
    lim = np.deg2rad(10)
    print("A: pendulum resting on its +10 deg joint limit, armature 0 -> 1.0 kg m^2")
    q0 = [lim]
    m_a = metarl(PEND.format(arm=0), "armature", 1.0)
    fresh = mujoco.MjModel.from_xml_string(PEND.format(arm=1.0))
    print(
        f"   dof_invweight0 metarl {m_a.dof_invweight0[0]:.4f}  fresh {fresh.dof_invweight0[0]:.4f}"
    )
    pm, pf, pc = (float(d.qpos[0] - lim) for d in run_all(m_a, fresh, q0, steps))
    print(
        f"   limit penetration [rad] metarl {pm:.3e}  fresh-mjx {pf:.3e}  fresh-C {pc:.3e}"
        f"  |metarl-fresh| {abs(pm - pf):.2e}  ratio {pm / pf:.2f}"
    )

    print("B: box resting on the floor, mass[payload] 0.1 -> 2.0 kg (jointless child)")
    q0 = [0, 0, 0.1, 1, 0, 0, 0]
    m_b = metarl(BOX.format(pm=0.1), "mass[payload]", 2.0)
    fresh = mujoco.MjModel.from_xml_string(BOX.format(pm=2.0))
    print(
        "   body_invweight0[torso] metarl",
        np.asarray(m_b.body_invweight0[1]),
        " fresh",
        fresh.body_invweight0[1],
    )
    zm, zf, zc = (float(d.qpos[2]) for d in run_all(m_b, fresh, q0, steps))
    print(
        f"   rest height - 0.1 [m] metarl {zm - 0.1:.3e}  fresh-mjx {zf - 0.1:.3e}  "
        f"fresh-C {zc - 0.1:.3e}  |metarl-fresh| {abs(zm - zf):.2e}  "
        f"ratio {(zm - 0.1) / (zf - 0.1):.2f}"
    )

    print("C: muscle on a hinge, mass 1 -> 3 kg (ctrl=1, first 50 steps)")
    m_c = metarl(MUSCLE.format(m=1, g=1), "mass", 3.0)
    fresh = mujoco.MjModel.from_xml_string(MUSCLE.format(m=3, g=1))
    print(f"   actuator_acc0 metarl {m_c.actuator_acc0[0]:.3f} fresh {fresh.actuator_acc0[0]:.3f}")
    dm, df, dc = run_all(m_c, fresh, [0.0], 50, [1.0])
    print(
        f"   actuator_force metarl {float(dm.actuator_force[0]):.3f} fresh-mjx "
        f"{float(df.actuator_force[0]):.3f} fresh-C {dc.actuator_force[0]:.3f}; qpos "
        f"{float(dm.qpos[0]):.4f} vs {float(df.qpos[0]):.4f} vs {dc.qpos[0]:.4f}"
    )

    print("D: same muscle, actuator_gain (gear) 1 -> 2")
    m_d = metarl(MUSCLE.format(m=1, g=1), "actuator_gain", 2.0)
    fresh = mujoco.MjModel.from_xml_string(MUSCLE.format(m=1, g=2))
    print(
        f"   acc0 metarl {m_d.actuator_acc0[0]:.3f} fresh {fresh.actuator_acc0[0]:.3f}; "
        f"lengthrange metarl {np.asarray(m_d.actuator_lengthrange[0])} "
        f"fresh {fresh.actuator_lengthrange[0]}"
    )
    dm, df, dc = run_all(m_d, fresh, [0.0], 50, [1.0])
    print(
        f"   qfrc_actuator metarl {float(dm.qfrc_actuator[0]):.3f} fresh-mjx "
        f"{float(df.qfrc_actuator[0]):.3f} fresh-C {dc.qfrc_actuator[0]:.3f}; qpos "
        f"{float(dm.qpos[0]):.4f} vs {float(df.qpos[0]):.4f} vs {dc.qpos[0]:.4f}"
    )
