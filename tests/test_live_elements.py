"""Elements the physics never reads are refused, not silently varied.

A geom that collides with nothing (MuJoCo's contype/conaffinity rule) has no
contact to read its friction, size or restitution; a contact of an explicit
<contact><pair> reads the pair's friction, not the geoms'; and a free joint's
stiffness pulls the body back on MJX but is ignored by Brax's generalized
backend. A name without elements covers only the live ones, the others keep
their loaded values. (A geom touching only through a pair: tests/test_model_envs.py.)
"""

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest
from brax import envs as brax_envs
from brax.envs.base import PipelineEnv, State
from brax.io import mjcf

from metarl import contexts as C
from metarl.envs import make_contextual

PENDULUM = brax_envs.get_environment("inverted_pendulum", backend="generalized").sys
HOPPER = brax_envs.get_environment("hopper", backend="generalized").sys


@pytest.mark.parametrize(
    "name, dist, backend",
    [
        ("friction", C.Uniform(0.1, 2.0), "generalized"),
        ("friction", C.Uniform(0.1, 2.0, per_element=True), "mjx"),
        ("geom_size", C.Scale(0.5, 2.0), "generalized"),
        ("elasticity", C.Uniform(0.0, 0.5), "spring"),
    ],
)
def test_geom_quantities_are_refused_where_no_geom_collides(name, dist, backend):
    """Every geom of Brax's inverted_pendulum has contype 0: nothing collides."""
    with pytest.raises(ValueError, match="rail, cart, cpole would not change.*no element"):
        C.bind(C.ContextSpace({name: dist}), PENDULUM, backend)


def test_naming_a_geom_that_never_collides_lists_the_ones_that_do():
    usable = r"torso_geom would not change.*'friction\[floor, foot_geom\]'"
    with pytest.raises(ValueError, match=usable):
        C.bind(C.ContextSpace({"friction[torso_geom]": C.Scale(0.5, 2.0)}), HOPPER, "generalized")


def test_shared_friction_writes_the_colliding_geoms_only():
    """hopper: the floor and the foot collide; torso, thigh and leg keep their 0.9."""
    binding = C.bind(C.ContextSpace({"friction": C.Uniform(0.1, 2.0)}), HOPPER, "generalized")
    np.testing.assert_array_equal(binding.default_context()["friction"], [1.0, 2.0])
    sys = binding.apply({"friction": jnp.float32(0.3)})
    np.testing.assert_allclose(np.asarray(sys.geom_friction[:, 0]), [0.3, 0.9, 0.9, 0.9, 0.3])


# A free-floating torso with an arm on a hinge; nothing collides.
FLOATING_XML = """
<mujoco model="floating">
  <option timestep="0.01"/>
  <worldbody>
    <body name="torso" pos="0 0 1">
      <joint name="root" type="free"/>
      <geom name="t" type="sphere" size="0.1" mass="1" contype="0" conaffinity="0"/>
      <body name="arm" pos="0.2 0 0">
        <joint name="hinge" type="hinge" axis="0 1 0" damping="0.1"/>
        <geom name="a" type="capsule" fromto="0 0 0 0.2 0 0" size="0.03" mass="0.2"
              contype="0" conaffinity="0"/>
      </body>
    </body>
  </worldbody>
  <actuator><motor joint="hinge" gear="1" ctrlrange="-1 1"/></actuator>
</mujoco>"""


class Floating(PipelineEnv):
    def __init__(self, backend="generalized"):
        super().__init__(sys=mjcf.loads(FLOATING_XML), backend=backend, n_frames=1)

    def reset(self, rng):
        ps = self.pipeline_init(self.sys.init_q, jnp.zeros(self.sys.qd_size()))
        zero = jnp.zeros(())
        return State(ps, ps.q, zero, zero, {}, {})

    def step(self, state, action):
        ps = self.pipeline_step(state.pipeline_state, action)
        return state.replace(pipeline_state=ps, obs=ps.q)


def test_shared_stiffness_gives_the_same_free_fall_on_every_joint_backend():
    """Stiffness 10 on every joint: the hinge gets it, the free root does not, so the
    torso falls freely on generalized and on mjx alike (Brax's generalized backend
    ignores a free joint's stiffness; MJX would pull a stiff root back up to -0.04)."""
    space = C.ContextSpace({"stiffness": C.Uniform(0.0, 20.0)})
    # semi-implicit Euler from z = 1: z_50 = 1 - g dt^2 (50 * 51 / 2)
    free_fall = 1.0 - 9.81 * 0.01**2 * 50 * 51 / 2
    for backend in ("generalized", "mjx"):
        env = make_contextual(Floating(backend), space)

        @jax.jit
        def height(ranges, env=env):
            s = env.reset(jax.random.key(0), ranges)
            return jax.lax.fori_loop(0, 50, lambda i, s: env.step(s, jnp.zeros(1)), s).obs[2]

        z = float(height(space.pinned({"stiffness": 10.0})))
        assert z == pytest.approx(free_fall, abs=1e-3), backend


def test_naming_a_free_joint_for_stiffness_is_refused():
    with pytest.raises(ValueError, match=r"root would not change.*'stiffness\[hinge\]'"):
        C.bind(
            C.ContextSpace({"stiffness[root]": C.Uniform(0.0, 50.0)}),
            mjcf.loads(FLOATING_XML),
            "mjx",
        )


# A floor plane, a box made of a mesh and a sphere, all colliding.
MESH_XML = """
<mujoco>
  <asset><mesh name="cube" vertex="-.1 -.1 -.1  .1 -.1 -.1  -.1 .1 -.1  .1 .1 -.1
                                   -.1 -.1 .1  .1 -.1 .1  -.1 .1 .1  .1 .1 .1"/></asset>
  <worldbody>
    <geom name="floor" type="plane" size="5 5 .1"/>
    <body name="box" pos="0 0 .3"><freejoint/><geom name="meshbox" type="mesh" mesh="cube"/></body>
    <body name="ball" pos="1 0 .3"><freejoint/><geom name="ball" type="sphere" size=".1"/></body>
  </worldbody>
</mujoco>"""


def test_geom_size_skips_planes_and_meshes():
    """MJX collides a mesh through its hull's vertices and a plane as infinite: their
    geom_size is never read. A scaled mesh box came to rest at the same height, bit
    for bit, and an unnamed 'geom_size' let check_env pass on the sphere alone."""
    model = mujoco.MjModel.from_xml_string(MESH_XML)
    binding = C.bind(C.ContextSpace({"geom_size": C.Scale(0.5, 2.0)}), model, "mjx")
    assert binding.entries[0].select.tolist() == [2]  # the ball only
    for geom in ("floor", "meshbox"):
        with pytest.raises(ValueError, match=rf"geoms {geom} would not change: it is a plane"):
            C.bind(C.ContextSpace({f"geom_size[{geom}]": C.Scale(0.5, 2.0)}), model, "mjx")


_FIXED_BODIES = """<mujoco><worldbody>
  <body name="post" pos="0 0 0.5"><geom type="box" size="0.1 0.1 0.5" mass="3"/></body>
  <body name="goal" mocap="true" pos="1 0 0"><geom type="sphere" size="0.05" contype="0"
    conaffinity="0" mass="1"/><body name="flag"><geom size="0.02" mass="1"/></body></body>
  <body name="arm"><joint name="h" type="hinge" axis="0 1 0"/>
    <geom type="capsule" fromto="0 0 0 0.5 0 0" size="0.03" mass="1"/></body>
</worldbody><actuator><motor joint="h"/></actuator></mujoco>"""


@pytest.mark.parametrize("name", ["mass", "inertia", "com_offset"])
def test_body_quantities_are_refused_on_bodies_no_joint_moves(name):
    """A post welded to the world, a mocap goal and the flag welded to it have no dof:
    their mass, inertia and centre of mass enter no equation of motion (the reacher's
    and finger's targets took a mass context that changed nothing)."""
    from mujoco import mjx

    model = mjx.put_model(mujoco.MjModel.from_xml_string(_FIXED_BODIES))
    dist = C.Uniform(-0.1, 0.1) if name == "com_offset" else C.Scale(0.5, 2.0)
    for fixed in ("post", "goal", "flag"):
        with pytest.raises(ValueError, match=f"bodies {fixed} would not change: it is welded"):
            C.bind(C.ContextSpace({f"{name}[{fixed}]": dist}), model, "mjx")
    per_element = (
        C.Uniform(-0.1, 0.1, per_element=True)
        if name == "com_offset"
        else (C.Scale(0.5, 2.0, per_element=True))
    )
    binding = C.bind(C.ContextSpace({name: per_element}), model, "mjx")
    assert binding.entries[0].draw_shape[:1] == (1,)  # the arm alone


# A two-link arm and a point mass sliding on a table: nothing they do moves a body along
# gravity, so gravity acts on no dof. Tilted (the arm's hinges about y), it does.
ARM = """<mujoco><worldbody>
  <body name="upper"><joint type="hinge" axis="AXIS"/>
    <geom type="capsule" fromto="0 0 0 0.5 0 0" size="0.03" mass="1"/>
    <body name="lower" pos="0.5 0 0" euler="0 0 30"><joint type="hinge" axis="AXIS"/>
      <geom type="capsule" fromto="0 0 0 0.5 0 0" size="0.03" mass="1"/></body></body>
  <body name="puck" pos="1 1 0"><joint type="slide" axis="1 1 0"/><joint type="slide" axis="0 1 0"/>
    <geom type="sphere" size="0.1" mass="1"/></body>
</worldbody></mujoco>"""


@pytest.mark.parametrize("backend", ["generalized", "mjx"])
def test_gravity_is_refused_where_every_joint_moves_across_it(backend):
    space = C.ContextSpace({"gravity": C.Uniform(5.0, 15.0)})
    with pytest.raises(ValueError, match="'gravity' changes nothing here: every joint moves"):
        C.bind(space, mjcf.loads(ARM.replace("AXIS", "0 0 1")), backend)
    tilted = C.bind(space, mjcf.loads(ARM.replace("AXIS", "0 1 0")), backend)
    # ... where it does reach the dofs: the arm falls faster under more gravity
    from mujoco import mjx

    def fall(g):
        model = tilted.apply({"gravity": jnp.float32(g)})
        d = mjx.make_data(model)
        return jax.lax.fori_loop(0, 20, lambda i, d: mjx.step(model, d), d).qpos

    assert np.abs(np.asarray(fall(15.0)) - np.asarray(fall(5.0)))[:2].max() > 1e-3
    with pytest.raises(ValueError, match="every joint moves its body at right angles"):
        make_contextual("reacher", space, backend=backend)
