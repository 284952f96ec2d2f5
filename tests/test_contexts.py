"""Distributions and ContextSpace: sampling properties and every bad-input case."""

import dataclasses
import functools
import re
import weakref

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest
from brax.io import mjcf
from hypothesis import given, settings
from hypothesis import strategies as st

from metarl import contexts as C
from metarl.envs import toy
from metarl.envs.toy import Puck

SYS = Puck().sys
# XLA on CPU flushes subnormal floats to zero, so bounds like 1e-40 are not representable there.
floats = st.floats(-100, 100, allow_nan=False, allow_subnormal=False, width=32)


def _bind(space, backend="generalized", sys=SYS):
    return C.bind(C.ContextSpace(space), sys, backend)


@settings(max_examples=40, deadline=None)
@given(a=floats, b=floats, seed=st.integers(0, 2**31 - 1))
def test_uniform_draws_stay_in_bounds(a, b, seed):
    low, high = min(a, b), max(a, b)
    x = C.Uniform(low, high).sample(jax.random.key(seed), (64,))
    assert x.shape == (64,)
    assert np.all((np.asarray(x) >= np.float32(low)) & (np.asarray(x) <= np.float32(high)))


@settings(max_examples=40, deadline=None)
@given(a=st.floats(1e-3, 1e3), ratio=st.floats(1.0, 100.0), seed=st.integers(0, 2**31 - 1))
def test_loguniform_draws_stay_in_bounds(a, ratio, seed):
    d = C.LogUniform(a, a * ratio)
    x = np.asarray(d.sample(jax.random.key(seed), (64,)))
    low, high = d.support()
    assert np.all((x >= low) & (x <= high))


def test_a_pinned_loguniform_draws_exactly_its_value():
    """exp(log(x)) can round a float32 step off x (0.3 -> 0.29999998): a pinned
    LogUniform, and the env's own gravity and timestep pinned through
    `pinned(default_context())`, must draw the value itself."""
    x = np.asarray(C.LogUniform(0.3, 0.3).sample(jax.random.key(0), (4,)))
    np.testing.assert_array_equal(x, np.float32(0.3))
    space = {"gravity": C.LogUniform(5.0, 15.0), "timestep": C.LogUniform(0.001, 0.1)}
    binding = _bind(space)
    own = binding.default_context()
    drawn = binding.sample(jax.random.key(0), binding.space.pinned(own))
    for name in space:
        assert float(drawn[name]) == float(own[name])
    sys = binding.apply(drawn)
    np.testing.assert_array_equal(np.asarray(sys.gravity), np.asarray(SYS.gravity))
    assert float(sys.opt.timestep) == float(SYS.opt.timestep)


def test_an_absolute_loguniform_pins_to_a_default_of_zero():
    """MJX's viscosity is 0 unless a model sets it: pinned(default_context()) refused it
    (LogUniform needs low > 0), though it must run every env in its own physics."""
    from metarl.envs import make_contextual

    space = C.ContextSpace({"viscosity": C.LogUniform(1e-3, 1e-1)})
    env = make_contextual("inverted_pendulum", space, backend="mjx")
    own = env.space.pinned(env.default_context())
    drawn = env.binding.sample(jax.random.key(0), own)
    assert float(drawn["viscosity"]) == 0.0
    assert float(env.binding.apply(drawn).opt.viscosity) == 0.0
    with pytest.raises(ValueError, match=r"LogUniform needs low > 0 \(or low = high = 0\)"):
        C.LogUniform(0.0, 1.0)


def test_spaces_compare_by_value_and_record_the_same_text_from_numpy_or_jax_numbers():
    from metarl.trees import stable_repr

    per_element = C.Uniform([1.0, 2.0], [2.0, 3.0], per_element=True)
    same = C.Uniform(np.array([1.0, 2.0]), jnp.array([2.0, 3.0]), per_element=True)
    assert per_element == same and hash(per_element) == hash(same)
    assert C.ContextSpace({"mass": per_element}) == C.ContextSpace({"mass": same})
    assert per_element != C.Uniform([1.0, 2.0], [2.0, 4.0], per_element=True)
    assert per_element != C.Uniform([1.0, 2.0], [2.0, 3.0], per_element=True, relative=True)
    assert C.Uniform(1.0, 2.0) != C.LogUniform(1.0, 2.0)
    pinned = C.Scale(0.5, 2.0).pin_to_defaults()  # NaN locations: equal to themselves
    assert pinned == C.Scale(0.5, 2.0).pin_to_defaults()
    a = C.ContextSpace({"gravity": C.Uniform(5.0, 15.0)})
    b = C.ContextSpace({"gravity": C.Uniform(jnp.float32(5.0), jnp.float32(15.0))})
    assert stable_repr(a) == stable_repr(b)  # a run's identity does not depend on it


SERVOS = """<mujoco><worldbody>
 <body name="a"><joint name="ja" type="slide" axis="1 0 0"/><geom size="0.1" mass="1"/></body>
 <body name="b" pos="0 1 0"><joint name="jb" type="slide" axis="1 0 0"/>
  <geom size="0.1" mass="1"/></body>
 <body name="c" pos="0 2 0"><joint name="jc" type="slide" axis="1 0 0"/>
  <geom size="0.1" mass="1"/></body>
</worldbody><actuator>
 <position name="pos" joint="ja" kp="10"/>
 <velocity name="vel" joint="jb" kv="5"/>
 <position name="pos2" joint="jc" kp="20"/>
</actuator></mujoco>"""


def test_actuator_kp_writes_only_the_position_servos():
    """kp is written into gainprm[0] and biasprm[1] of position servos; a velocity
    servo (biasprm[1] = 0) and the servos an entry does not select keep every
    parameter, also when kp is pinned at its own value."""
    from mujoco import mjx

    model = mjx.put_model(mujoco.MjModel.from_xml_string(SERVOS))
    gain, bias = np.asarray(model.actuator_gainprm), np.asarray(model.actuator_biasprm)
    for kp in (10.0, 3.0):
        binding = C.bind(C.ContextSpace({"actuator_kp[pos]": C.Fixed(kp)}), model, "mjx")
        sys = binding.apply(binding.sample(jax.random.key(0)))
        new_gain, new_bias = np.asarray(sys.actuator_gainprm), np.asarray(sys.actuator_biasprm)
        np.testing.assert_array_equal(new_gain[1:], gain[1:])
        np.testing.assert_array_equal(new_bias[1:], bias[1:])
        assert (new_gain[0, 0], new_bias[0, 1]) == (kp, -kp)
    with pytest.raises(ValueError, match="actuators vel would not change"):
        C.bind(C.ContextSpace({"actuator_kp[vel]": C.Fixed(1.0)}), model, "mjx")


def _model(xml: str):
    from mujoco import mjx

    return mjx.put_model(mujoco.MjModel.from_xml_string(xml))


def _applied(xml: str, name: str, value: float):
    binding = C.bind(C.ContextSpace({name: C.Fixed(value)}), _model(xml), "mjx")
    return binding.apply(binding.sample(jax.random.key(0)))


def test_actuator_kd_writes_a_velocity_servos_kv_where_mujoco_holds_it():
    """<velocity kv> holds kv in gainprm[0] and -biasprm[2]; <position kv> in
    biasprm[2] alone: kd applied gives the fields MuJoCo compiles from the XML."""
    for name, old, new in (
        ("actuator_kd[vel]", 'kv="5"', 'kv="2"'),
        ("actuator_kd[pos]", 'kp="10"/>', 'kp="10" kv="2"/>'),
    ):
        sys = _applied(SERVOS, name, 2.0)
        truth = mujoco.MjModel.from_xml_string(SERVOS.replace(old, new, 1))
        np.testing.assert_allclose(np.asarray(sys.actuator_gainprm), truth.actuator_gainprm)
        np.testing.assert_allclose(np.asarray(sys.actuator_biasprm), truth.actuator_biasprm)


THRUSTER = """<mujoco><worldbody><body name="b"><freejoint/><geom size="0.1" mass="1"/>
 <site name="s"/></body></worldbody>
 <actuator><motor name="up" site="s" gear="0 0 GEAR 0 0 0"/></actuator></mujoco>"""


def test_actuator_gain_scales_a_site_actuators_whole_gear_vector():
    """A site actuator's gear is a 6-vector (here a thrust along z): the gain is its
    length and scales it, as gear="0 0 2 0 0 0" in the XML does."""
    sys = _applied(THRUSTER.replace("GEAR", "1"), "actuator_gain", 2.0)
    truth = mujoco.MjModel.from_xml_string(THRUSTER.replace("GEAR", "2"))
    np.testing.assert_array_equal(np.asarray(sys.actuator_gear), truth.actuator_gear)
    binding = C.bind(
        C.ContextSpace({"actuator_gain": C.Uniform(-4.0, -2.0)}),
        _model(THRUSTER.replace("GEAR", "-3")),
        "mjx",
    )
    assert float(binding.default_context()["actuator_gain"]) == -3.0
    # two selections, applied in one jitted call (the second after the first)
    two = THRUSTER.replace("GEAR", "1").replace(
        "</worldbody>",
        '<body name="c" pos="1 0 0"><joint name="h" type="hinge"/><geom size="0.1" mass="1"/>'
        "</body></worldbody>",
    )
    two = two.replace("</actuator>", '<motor name="m" joint="h" gear="0.3"/></actuator>')
    space = C.ContextSpace({"actuator_gain[up]": C.Fixed(2.0), "actuator_gain[m]": C.Fixed(0.7)})
    binding = C.bind(space, _model(two), "mjx")
    gear = jax.jit(lambda k: binding.apply(binding.sample(k)).actuator_gear)(jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(gear)[:, :3], np.float32([[0, 0, 2], [0.7, 0, 0]]))


BOX = """<mujoco><option><flag FLAG/></option><worldbody>
 <geom name="floor" type="plane" size="1 1 0.1" FLOOR/>
 <body name="box" pos="0 0 0.1"><joint name="x" type="slide" axis="1 0 0" frictionloss="0.1"/>
  <geom name="box" type="box" size="0.1 0.1 0.1" mass="1" BOX/></body>
</worldbody><actuator><motor joint="x"/></actuator></mujoco>"""


@pytest.mark.parametrize(
    "flag, floor, box, name, message",
    [
        ('contact="disable"', "", "", "friction", "geoms floor, box would not change"),
        ('constraint="disable"', "", "", "friction", "geoms floor, box would not change"),
        ('contact="disable"', "", "", "geom_size", "no element of this model can take it"),
        ("", 'condim="1"', 'condim="1"', "friction", "geoms floor, box would not change"),
        ("", 'priority="1"', "", "friction[box]", "geoms box would not change"),
        ('gravity="disable"', "", "", "gravity", "switches gravity off"),
        ('frictionloss="disable"', "", "", "frictionloss", "dofs x would not change"),
        ('damper="disable"', "", "", "viscosity", "springs or dampers off"),
        # MJX skips every passive force if springs or dampers are off, and actuator
        # forces if actuation is off (Brax's own backends ignore these flags)
        ('damper="disable"', "", "", "damping", 'sets <flag damper="disable"/>'),
        ('spring="disable"', "", "", "damping", 'sets <flag spring="disable"/>'),
        ('spring="disable"', "", "", "stiffness", "switches spring or damper off"),
        ('actuation="disable"', "", "", "actuator_gain", "switches actuation off"),
    ],
)
def test_a_context_the_models_flags_or_contact_rules_never_read_is_refused(
    flag, floor, box, name, message
):
    """MJX honours <flag> switches, condim and geom priority: a context those make a
    no-op is refused at bind time, not simulated silently."""
    model = _model(BOX.replace("FLAG", flag).replace("FLOOR", floor).replace("BOX", box))
    with pytest.raises(ValueError, match=re.escape(message)):
        C.bind(C.ContextSpace({name: C.Scale(0.5, 2.0)}), model, "mjx")
    if flag == "" and floor == 'priority="1"':  # the floor's own friction is read
        C.bind(C.ContextSpace({"friction[floor]": C.Scale(0.5, 2.0)}), model, "mjx")
    if name in ("damping", "stiffness", "actuator_gain"):  # the flag is what refuses it
        unflagged = _model(BOX.replace("FLAG", "").replace("FLOOR", "").replace("BOX", ""))
        C.bind(C.ContextSpace({name: C.Uniform(0.5, 2.0)}), unflagged, "mjx")


def test_geom_size_is_refused_where_a_geom_collides_with_a_height_field():
    xml = """<mujoco><asset><hfield name="h" nrow="3" ncol="3" size="1 1 0.1 0.1"/></asset>
     <worldbody><geom type="hfield" hfield="h"/><body pos="0 0 0.5"><freejoint/>
     <geom name="ball" size="0.05" mass="1"/></body></worldbody></mujoco>"""
    with pytest.raises(ValueError, match="height field"):
        C.bind(C.ContextSpace({"geom_size": C.Scale(0.5, 2.0)}), _model(xml), "mjx")


@settings(max_examples=40, deadline=None)
@given(
    mean=floats,
    std=st.floats(0, 10, width=32),
    lo=st.floats(-5, 0, width=32),
    hi=st.floats(0.125, 5, width=32),
    seed=st.integers(0, 2**31 - 1),
)
def test_truncated_normal_draws_stay_in_bounds(mean, std, lo, hi, seed):
    d = C.TruncatedNormal(mean, std, mean + lo, mean + hi)
    x = np.asarray(d.sample(jax.random.key(seed), (3, 5)))
    assert x.shape == (3, 5)
    assert np.all(np.isfinite(x))
    assert np.all((x >= d.low) & (x <= d.high))


@settings(max_examples=30, deadline=None)
@given(values=st.lists(floats, min_size=1, max_size=5), seed=st.integers(0, 2**31 - 1))
def test_choice_draws_only_its_values(values, seed):
    x = np.asarray(C.Choice(values).sample(jax.random.key(seed), (32,)))
    assert set(x.tolist()) <= set(np.asarray(values, np.float32).tolist())


def test_choice_respects_probabilities():
    x = np.asarray(C.Choice([-1.0, 1.0], [0.9, 0.1]).sample(jax.random.key(0), (20000,)))
    assert abs((x == -1).mean() - 0.9) < 0.02


def _shapes_space(low, width):
    return C.ContextSpace(
        {
            "gravity": C.Uniform(low, low + width),
            "mass": C.Scale(low, low + width, per_element=True),
            "friction": C.Uniform(low, low + width),
        }
    )


@functools.cache
def _shapes_programs():
    """One binding, its sample and apply compiled once: the examples vary only numbers."""
    binding = C.bind(_shapes_space(0.5, 1.0), SYS, "generalized")
    return jax.jit(binding.sample), jax.jit(binding.apply)


@settings(max_examples=25, deadline=None)
@given(low=st.floats(0.1, 1.0), width=st.floats(0, 2.0), seed=st.integers(0, 2**31 - 1))
def test_space_samples_have_the_element_shapes(low, width, seed):
    sample, apply = _shapes_programs()
    ctx = sample(jax.random.key(seed), _shapes_space(low, width))
    assert ctx["gravity"].shape == () and ctx["friction"].shape == ()
    assert ctx["mass"].shape == (SYS.num_links(),)
    for name in ("gravity", "friction"):
        assert np.float32(low) <= ctx[name] <= np.float32(low + width)
    sys = apply(ctx)
    np.testing.assert_allclose(sys.geom_friction[:, 0], ctx["friction"])
    np.testing.assert_allclose(
        sys.link.inertia.mass, SYS.link.inertia.mass * ctx["mass"], rtol=1e-6
    )
    np.testing.assert_allclose(sys.body_mass[1:], sys.link.inertia.mass)


def test_sampling_is_pure_and_vmappable():
    binding = _bind({"gravity": C.Uniform(5.0, 15.0)})
    keys = jax.random.split(jax.random.key(1), 16)
    a = jax.jit(jax.vmap(binding.sample, in_axes=(0, None)))(keys, binding.space)
    b = jax.vmap(binding.sample, in_axes=(0, None))(keys, binding.space)
    np.testing.assert_array_equal(a["gravity"], b["gravity"])
    assert len(set(np.asarray(a["gravity"]).tolist())) == 16


def test_parameters_are_float32_leaves_not_weak_python_floats():
    leaves = jax.tree.leaves(C.ContextSpace({"gravity": C.Uniform(5, 15)}))
    assert all(isinstance(x, np.ndarray) and x.dtype == np.float32 for x in leaves)


def test_mass_scales_inertia_and_derived_quantities():
    binding = _bind({"mass": C.Fixed(2.0, relative=True)})
    sys = binding.apply(binding.default_context() | {"mass": jnp.float32(2.0)})
    np.testing.assert_allclose(sys.link.inertia.i, 2 * SYS.link.inertia.i, rtol=1e-6)
    np.testing.assert_allclose(sys.body_inertia, 2 * SYS.body_inertia, rtol=1e-6)
    np.testing.assert_allclose(sys.body_subtreemass, 2 * SYS.body_subtreemass, rtol=1e-6)
    model = mujoco.MjModel.from_xml_string(toy.XML)  # the inverse weights: MuJoCo's
    model.body_mass[1:] *= 2.0
    model.body_inertia[1:] *= 2.0
    mujoco.mj_setConst(model, mujoco.MjData(model))
    np.testing.assert_allclose(sys.link.invweight, model.body_invweight0[1:, 0], rtol=1e-5)


def test_a_raw_path_into_braxs_copy_of_the_model_derives_the_inverse_weights():
    """On generalized a raw path into Brax's copy of a mass, an inertia or the pose
    (`link.inertia.mass`, `link.transform.pos`, ...) left the inverse weights Brax
    derived at load as they were: they are derived from the copy, as from the quantity
    that writes the same (`mass`) and as MJX derives them from MuJoCo's own field. A raw
    path into the weights next to a context that derives them, and into a copy of the
    pose no MuJoCo field holds, are refused."""
    from brax import envs as brax_envs

    hopper = {b: brax_envs.get_environment("hopper", backend=b).sys for b in ("generalized", "mjx")}

    def derived(space, backend):
        binding = _bind(space, backend, hopper[backend])
        sys = binding.apply(binding.sample(jax.random.key(0)))
        return {f: np.asarray(getattr(sys, f)) for f in ("body_invweight0", "dof_invweight0")}

    twice = C.Fixed(2.0, relative=True)
    raw = derived({"link.inertia.mass": twice, "link.inertia.i": twice}, "generalized")
    canonical = derived({"mass": twice}, "generalized")
    loaded = derived({"gravity": C.Fixed(9.81)}, "generalized")
    for f in raw:
        np.testing.assert_allclose(raw[f], canonical[f], rtol=1e-6, err_msg=f)
        assert not np.allclose(raw[f], loaded[f]), f  # (they stayed these)
    longer = C.Fixed(1.2, relative=True)
    brax_pose = derived({"link.transform.pos": longer}, "generalized")
    mujoco_pose = derived({"body_pos[1:]": longer}, "mjx")
    for f in brax_pose:
        np.testing.assert_allclose(brax_pose[f], mujoco_pose[f], rtol=1e-5, err_msg=f)
        assert not np.allclose(brax_pose[f], loaded[f]), f
    hopper = hopper["generalized"]
    with pytest.raises(ValueError, match=r"dof.invweight is derived .*\(here among 'armature'\)"):
        _bind({"dof.invweight": twice, "armature": C.Scale(0.5, 2.0)}, sys=hopper)
    _bind({"dof.invweight": twice}, sys=hopper)  # alone: nothing derives it
    with pytest.raises(ValueError, match=r"no MuJoCo field holds link.joint.pos .* backend='mjx'"):
        _bind({"link.joint.pos": twice}, sys=hopper)


def test_the_inverse_weights_basis_is_computed_when_bound_not_in_the_first_trace():
    """`bind` computes what the inverse weights need of the default model (one program,
    which the persistent cache keeps): a reset traced later compiles nothing. Asked for
    inside the trace, it folded each of MJX's constants in a program of its own (about
    145 compiles for hopper) and took about 4 s longer to build and trace on 2 cores."""
    from metarl.compilation import count_compilations

    binding = _bind({"mass": C.Scale(0.5, 1.5, per_element=True)})
    with count_compilations() as count:
        jax.jit(binding.derive).trace(binding.default_context())
    assert count.count == 0, count


def test_spaces_bound_to_models_of_one_structure_share_the_basis_program():
    """The basis is one jitted function for every model: binding a space to another
    System of the same env (loaded again: its MjModel, which Brax keeps in the pytree's
    structure, is another object) traces and compiles nothing. Jitted per `bind`, it
    was traced and compiled again for every env built (1.3 s for inverted_pendulum
    on 2 cores), and the basis is the same."""
    from metarl.compilation import count_compilations

    space = {"mass": C.Scale(0.5, 1.5, per_element=True)}
    first = _bind(space, sys=mjcf.loads(toy.XML))._setconst_basis
    with count_compilations() as count:
        again = _bind(space, sys=mjcf.loads(toy.XML))._setconst_basis
    assert count.count == 0, count
    for name in first:
        np.testing.assert_array_equal(first[name], again[name], err_msg=name)


# Bodies hanging off the world alone, where MuJoCo's inverse weights follow an
# inertia scale exactly: one on a free joint, one on a ball joint at its centre of mass.
FREE_AND_BALL_XML = """
<mujoco><worldbody>
  <body name="free" pos="0 0 1"><joint type="free"/>
    <geom type="box" size="0.1 0.2 0.3" mass="2" contype="0" conaffinity="0"/></body>
  <body name="ball" pos="1 0 1"><joint type="ball"/>
    <geom type="ellipsoid" size="0.3 0.1 0.2" mass="3" contype="0" conaffinity="0"/></body>
</worldbody></mujoco>"""


@pytest.mark.parametrize("xml", [toy.XML, FREE_AND_BALL_XML], ids=["puck", "free and ball"])
@pytest.mark.parametrize("backend", ["generalized", "mjx"])
def test_inertia_sets_the_inverse_weights_mujoco_computes(xml, backend):
    """inertia x2 halves the rotational inverse weights only (hinge, ball, a free
    joint's last three dofs); translational dofs (the puck's slides, a free joint's
    first three) keep theirs, as MuJoCo's mj_setConst recomputes them."""
    sys = mjcf.loads(xml)
    binding = _bind({"inertia": C.Fixed(2.0, relative=True)}, backend, sys)
    got = binding.apply({"inertia": jnp.float32(2.0)})
    model = mujoco.MjModel.from_xml_string(xml)
    model.body_inertia[1:] *= 2.0
    mujoco.mj_setConst(model, mujoco.MjData(model))
    np.testing.assert_allclose(got.dof_invweight0, model.dof_invweight0, rtol=1e-5)
    np.testing.assert_allclose(got.dof.invweight, model.dof_invweight0, rtol=1e-5)
    np.testing.assert_allclose(got.body_invweight0, model.body_invweight0, rtol=1e-5)


# A chain with coupled bodies, armature and two tendons: where
# first-order inverse weights were off by 27-700% (audit of 2026-11-26); the fixed
# tendon's armature enters the inertia at qpos0 (left out, tendon_invweight0 was 12x)
CHAIN_XML = """
<mujoco><worldbody><geom name="floor" type="plane" size="2 2 .1"/>
  <body name="torso" pos="0 0 1"><freejoint/>
    <geom type="box" size="0.1 0.1 0.1" mass="2"/><site name="s0" pos="0 0.1 0"/>
    <body name="thigh" pos="0 0 -0.15"><joint name="hip" type="hinge" axis="0 1 0"
        range="-1 1" armature="0.01" frictionloss="0.1"/>
      <geom type="capsule" fromto="0 0 0 0 0 -0.3" size="0.04" mass="1"/>
      <site name="s1" pos="0 0.05 -0.2"/>
      <body name="shin" pos="0 0 -0.35"><joint name="knee" type="hinge" axis="0 1 0"
          range="-1 0" armature="0.05"/>
        <geom type="capsule" fromto="0 0 0 0 0 -0.3" size="0.03" mass="0.5"/>
      </body></body></body></worldbody>
  <tendon><fixed name="coupled" limited="true" range="-0.5 0.5" armature="0.2">
      <joint joint="hip" coef="1"/><joint joint="knee" coef="-0.5"/></fixed>
    <spatial name="cable"><site site="s0"/><site site="s1"/></spatial></tendon>
</mujoco>"""


@pytest.mark.parametrize("offset", [True, False], ids=["com_offset", "linear"])
@pytest.mark.parametrize("backend", ["generalized", "mjx"])
def test_inertia_contexts_set_the_inverse_weights_mujoco_computes(backend, offset):
    """mass, inertia, armature and com_offset together on a chain: the constraint
    solver's inverse weights (body, dof, tendon; Brax's copies too) are those
    mj_setConst computes for a model compiled with the same values, and for the
    default context the loaded ones, bit for bit; `apply` given `derive`'s constants
    builds the same System as `apply` alone. Without com_offset the inertia at qpos0
    is linear in what the context writes, and is computed from Jacobians taken once
    (`quantities.setconst_basis`), with the same result."""
    sys = mjcf.loads(CHAIN_XML)
    space = {
        "mass": C.Fixed(1.0, relative=True, per_element=True),
        "inertia": C.Fixed(1.0, relative=True, per_element=True),
        "armature[hip, knee]": C.Fixed(1.0, relative=True, per_element=True),
    }
    if offset:
        space["com_offset"] = C.Fixed(0.0, per_element=True)
    binding = _bind(space, backend, sys)
    assert binding.derives
    assert (binding._setconst_basis is None) == offset
    exact = jax.jit(binding.apply)
    same = exact(binding.default_context())
    for f in ("body_invweight0", "dof_invweight0", "tendon_invweight0"):
        np.testing.assert_array_equal(getattr(same, f), getattr(binding.sys, f))
    mass = np.array([2.0, 0.5, 3.0], np.float32)
    inertia = np.array([1.0, 2.0, 0.5], np.float32)
    armature = np.array([20.0, 0.2], np.float32)
    context = {"mass": mass, "inertia": inertia, "armature[hip, knee]": armature}
    com = np.zeros((3, 3), np.float32)
    if offset:
        com[1] = [0.0, 0.0, -0.08]
        context["com_offset"] = com
    got = exact(context)
    model = mujoco.MjModel.from_xml_string(CHAIN_XML)
    model.body_mass[1:] *= mass
    model.body_inertia[1:] *= (mass * inertia)[:, None]
    model.dof_armature[6:] *= armature
    model.body_ipos[1:] += com
    mujoco.mj_setConst(model, mujoco.MjData(model))
    for f in ("body_invweight0", "dof_invweight0", "tendon_invweight0"):
        np.testing.assert_allclose(
            getattr(got, f), getattr(model, f), rtol=2e-5, atol=1e-6, err_msg=f
        )
    if backend == "generalized":
        np.testing.assert_array_equal(got.link.invweight, got.body_invweight0[1:, 0])
        np.testing.assert_array_equal(got.dof.invweight, got.dof_invweight0)
    carried = jax.jit(lambda c: binding.apply(c, binding.derive(c)))(context)
    jax.tree.map(np.testing.assert_array_equal, carried, got)


# A ball that two slide joints move (MuJoCo's body_simple 2; their armature is left
# out of its dofs' inverse weights too), a slider carrying a hinged pole, and a wheel
# turning about its centre of mass
SLIDING_XML = """
<mujoco><worldbody><geom name="floor" type="plane" size="2 2 .1"/>
  <body name="ball" pos="0 0 1"><joint type="slide" axis="1 0 0" armature="0.5"/>
    <joint type="slide" axis="0 0 1" armature="0.5"/>
    <geom type="sphere" size="0.1" mass="2"/></body>
  <body name="slider" pos="1 0 1"><joint type="slide" axis="1 0 0"/>
    <geom type="box" size="0.1 0.1 0.1" mass="3"/>
    <body name="pole"><joint type="hinge" axis="0 1 0"/>
      <geom type="capsule" fromto="0 0 0 0 0 0.5" size="0.03" mass="0.5"/></body></body>
  <body name="wheel" pos="2 0 1"><joint type="hinge" axis="0 1 0"/>
    <geom type="sphere" size="0.2" mass="1" contype="0" conaffinity="0"/></body>
</worldbody></mujoco>"""


@pytest.mark.parametrize("backend", ["generalized", "mjx"])
def test_a_body_that_only_slides_gets_the_inverse_weights_mujoco_computes(backend):
    """mj_setConst gives a body moved by slide joints alone [1 / mass, 0], not the
    trace of J M^-1 J' over three directions (it was 1/6 instead of 1/4 for the ball:
    its contacts' softness followed). Its inertia does nothing, and is refused."""
    sys = mjcf.loads(SLIDING_XML)
    space = {
        "mass": C.Fixed(1.0, relative=True, per_element=True),
        "inertia": C.Fixed(1.0, relative=True, per_element=True),
    }
    binding = _bind(space, backend, sys)
    assert binding.default_context()["inertia"].shape == (2,)  # the pole and the wheel
    mass = np.array([2.0, 0.5, 3.0, 1.5], np.float32)
    inertia = np.array([2.0, 0.5], np.float32)
    got = jax.jit(binding.apply)({"mass": mass, "inertia": inertia})
    model = mujoco.MjModel.from_xml_string(SLIDING_XML)
    assert model.body_simple[1] == 2
    model.body_mass[1:] *= mass
    model.body_inertia[1:] *= (mass * np.r_[1.0, 1.0, inertia])[:, None]
    mujoco.mj_setConst(model, mujoco.MjData(model))
    for f in ("body_invweight0", "dof_invweight0"):
        np.testing.assert_allclose(getattr(got, f), getattr(model, f), rtol=1e-5, err_msg=f)
    with pytest.raises(ValueError, match="slide joints alone move it"):
        _bind({"inertia[ball]": C.Scale(0.5, 2.0)}, backend, sys)


@pytest.mark.parametrize(
    "path, value",
    [("body_pos[3]", [0.0, 0.05, -0.5]), ("jnt_axis[1]", [1.0, 0.0, 0.0])],
    ids=["body_pos", "jnt_axis"],
)
def test_a_raw_path_into_the_pose_sets_the_inverse_weights_mujoco_computes(path, value):
    """MJX reads the model's pose (where a body hangs, a joint's axis): a raw path that
    moves it gets the inverse weights mj_setConst computes for the moved model. They
    stayed the loaded ones: body_invweight0 11% off with the shin lowered, the tendons'
    100% off with the hip turned about x."""
    sys = mjcf.loads(CHAIN_XML)
    binding = _bind({path: C.Fixed(np.asarray(value, np.float32), per_element=True)}, "mjx", sys)
    assert binding.derives == ("weights",)
    got = jax.jit(binding.apply)({path: jnp.asarray(value, jnp.float32)})
    model = mujoco.MjModel.from_xml_string(CHAIN_XML)
    field, row = path[:-3], int(path[-2])
    getattr(model, field)[row] = value
    mujoco.mj_setConst(model, mujoco.MjData(model))
    for f in ("body_invweight0", "dof_invweight0", "tendon_invweight0"):
        np.testing.assert_allclose(
            getattr(got, f), getattr(model, f), rtol=2e-5, atol=1e-6, err_msg=f
        )


def test_every_field_mj_setconst_reads_is_an_input_of_its_constants():
    """Perturbs each float field of MJX's Model in MuJoCo's own model and reruns
    mj_setConst: a field that moves a constant of a `SETCONST` group is one of that
    group's inputs, so a raw path into it derives the constants again (a chain with
    tendons, and a muscle for acc0). Fails for a field MuJoCo starts to read."""
    from mujoco import mjx

    from metarl.contexts.quantities import INERTIAL_FIELDS, POSE_FIELDS, SETCONST

    outputs = {
        "weights": ("body_invweight0", "dof_invweight0", "tendon_invweight0"),
        "acc0": ("actuator_acc0",),
    }
    # The other constants mj_setConst computes that MJX's Model holds, from these inputs
    # (a field that moves one of them must be listed): how a context keeps each right.
    others = {
        # follows body_mass (`mass`; a raw path: quantities.subtree_masses). It stayed
        # the loaded one under a raw body_mass until 2026-12-07.
        "body_subtreemass": ("body_mass",),
        # a tendon equality's reference: raw paths into the pose are refused on a model
        # with one (space._pose_constants)
        "tendon_length0": ("body_pos", "body_quat", "qpos0", "site_pos"),
        # the collision bounds: `geom_size` scales them; MJX reads geom_rbound only to
        # cull geom pairs under a max_geom_pairs numeric, geom_aabb never
        "geom_rbound": ("geom_size",),
        "geom_aabb": ("geom_size",),
        # read by no MJX code (MuJoCo 4.0.1; MJX 3.17.0)
        "dof_M0": INERTIAL_FIELDS + POSE_FIELDS,
        "body_margin": ("geom_margin", "geom_gap"),
    }
    mjx_fields = {f.name for f in dataclasses.fields(mjx.Model)}
    rng = np.random.default_rng(0)
    for xml in (CHAIN_XML, MUSCLE_XML.format(mass=1.0, gear=1.0)):
        base = mujoco.MjModel.from_xml_string(xml)
        mujoco.mj_setConst(base, mujoco.MjData(base))
        for field in sorted(mjx_fields):
            value = getattr(base, field, None)
            if not isinstance(value, np.ndarray) or value.dtype != np.float64 or not value.size:
                continue
            model = mujoco.MjModel.from_xml_string(xml)
            moved = getattr(model, field)
            noise = rng.standard_normal((2,) + moved.shape)
            moved[:] = moved * (1 + 0.2 * noise[0]) + 0.05 * noise[1]
            mujoco.mj_setConst(model, mujoco.MjData(model))
            for group, names in outputs.items():
                if any(not np.array_equal(getattr(model, n), getattr(base, n)) for n in names):
                    assert field in SETCONST[group][0], (group, field)
            for out in sorted(mjx_fields - {field}):
                value = getattr(model, out, None)
                if isinstance(value, np.ndarray) and value.dtype.kind == "f":
                    if not np.array_equal(value, getattr(base, out)):
                        assert out in outputs["weights"] + outputs["acc0"] + tuple(others), out
                        assert out not in others or field in others[out], (out, field)


@pytest.mark.parametrize("path", ["body_mass[2]", "link.inertia.mass[1]"])
def test_a_raw_mass_moves_the_subtrees_masses_as_mujoco_computes_them(path):
    """MJX divides the subtrees' momenta by their masses (the subtreelinvel sensors that
    Playground's CheetahRun rewards): a raw path into a body's mass left them the loaded
    model's (CheetahRun's torso x2: its rewarded speed 1.45x off)."""
    backend = "generalized" if path.startswith("link") else "mjx"
    binding = _bind({path: C.Fixed(2.0, relative=True)}, backend, mjcf.loads(CHAIN_XML))
    got = binding.apply({path: jnp.float32(2.0)}, derived={})  # not the inverse weights
    model = mujoco.MjModel.from_xml_string(CHAIN_XML)
    model.body_mass[2] *= 2.0  # link 1 is body 2
    mujoco.mj_setConst(model, mujoco.MjData(model))
    np.testing.assert_allclose(got.body_subtreemass, model.body_subtreemass, rtol=1e-6)
    loaded = binding.apply(binding.default_context(), derived={})
    np.testing.assert_array_equal(loaded.body_subtreemass, binding.sys.body_subtreemass)


@pytest.mark.parametrize(
    "added, refused",
    [
        ('<equality><tendon tendon1="cable" polycoef="0 1 0 0 0"/></equality>', "tendon equal"),
        ('<equality><connect body1="shin" body2="torso" anchor="0 0 0"/></equality>', "connect"),
        ('<tendon><spatial stiffness="50"><site site="s0"/><site site="s1"/></spatial></tendon>',
         "tendon springs"),
        ('<actuator><muscle tendon="coupled"/></actuator>', "muscles on tendons"),
    ],
    ids=["tendon equality", "connect", "tendon spring", "tendon muscle"],
)  # fmt: skip
def test_a_raw_pose_is_refused_where_the_compiler_derives_more_from_it(added, refused):
    """MuJoCo's compiler derives from the pose at qpos0 more than the inverse weights
    metarl derives: a tendon equality's reference lengths, a connect's anchor (the
    bodies pulled back to the loaded distance, 0.50 for 0.70), a tendon spring's rest
    length (a pendulum at rest swung 0.48 rad), a tendon muscle's length range
    (MjSpec-compiled models against metarl's, 2026-12-07). Raw pose paths are refused
    on such a model, and accepted elsewhere."""
    xml = CHAIN_XML.replace("</mujoco>", added + "</mujoco>")
    for path in ("body_pos[3]", "site_pos[0, 1]", "qpos0[7]", "jnt_axis[1]", "wrap_prm"):
        with pytest.raises(ValueError, match=f"the model has {refused}"):
            _bind({path: C.Scale(0.9, 1.1)}, "mjx", mjcf.loads(xml))
    _bind({"body_pos[3]": C.Scale(0.9, 1.1)}, "mjx", mjcf.loads(CHAIN_XML))


def test_raw_rows_the_compiler_derives_from_or_never_reads_are_refused():
    """A free body's pose (MuJoCo writes it into qpos0: the box reset where it was),
    a centre of mass on a body compiled as simple (as `com_offset`: the coupling it
    makes was dropped), a muscle's gear and joint range (its length range stayed: its
    force 6x and 1.5x off). Other rows are accepted."""
    box = mjcf.loads(
        '<mujoco><worldbody><body pos="0 0 1"><freejoint/><geom type="box" size=".1 .2 .3"/>'
        "</body></worldbody></mujoco>"
    )
    muscle = mjcf.loads(MUSCLE_XML.format(mass=1, gear=1))
    cases = [
        (box, "body_pos[1]", "row 1: a free joint places it.*qpos0"),
        (box, "body_quat[:2]", "row 1: a free joint"),
        (box, "body_ipos[1, 0]", "row 1: MuJoCo compiled it as a simple body"),
        (muscle, "actuator_gear[0, 0]", "row 0: it is a muscle.*'actuator_gain'"),
        (muscle, "jnt_range[0]", "row 0: a muscle pulls it"),
    ]
    for sys, path, message in cases:
        with pytest.raises(ValueError, match=message):
            _bind({path: C.Uniform(0.1, 0.2)}, "mjx", sys)
    space = {"body_pos[2:]": C.Scale(0.9, 1.1), "body_ipos[2, 2]": C.Scale(0.9, 1.1)}
    _bind(space, "mjx", mjcf.loads(CHAIN_XML))  # the thigh and shin hang from hinges


def test_a_raw_joint_axis_or_quaternion_is_normalized_as_mujoco_compiles_it():
    """MJX's kinematics take a joint's axis and a body's quaternion as unit: an axis
    (0, 2, 0) made a body's orientation matrix of determinant 1.66."""
    sys = mjcf.loads(CHAIN_XML)
    space = {"jnt_axis[1]": C.Scale(0.5, 2), "body_quat[2]": C.Scale(0.5, 2)}
    binding = _bind(space, "mjx", sys)
    write = functools.partial(binding.apply, derived={})  # the written fields alone
    got = write({"jnt_axis[1]": jnp.float32(2), "body_quat[2]": jnp.float32(3)})
    np.testing.assert_allclose(got.jnt_axis, sys.jnt_axis, atol=1e-7)
    np.testing.assert_allclose(got.body_quat, sys.body_quat, atol=1e-7)
    loaded = write(binding.default_context())
    np.testing.assert_array_equal(loaded.body_quat, sys.body_quat)  # bit for bit


@pytest.mark.parametrize("backend", ["generalized", "mjx"])
def test_a_centre_of_mass_offset_is_refused_on_a_body_compiled_as_simple(backend):
    """MuJoCo compiles a body whose centre of mass is its frame's origin (here a free
    box and a ball joint's body) as simple: the mass matrix's fixed sparsity pattern
    leaves out the coupling of its dofs, so a moved centre of mass was dropped from
    the dynamics (a spinning box 0.9 off MuJoCo's path). An <inertial> off its origin
    makes it a general body, which takes the offset."""
    sys = mjcf.loads(FREE_AND_BALL_XML)
    with pytest.raises(ValueError, match=r"free: MuJoCo compiled it as a simple body"):
        _bind({"com_offset[free]": C.Uniform(-0.05, 0.05)}, backend, sys)
    with pytest.raises(ValueError, match=r"(?s)simple body.*ball: MuJoCo compiled"):
        _bind({"com_offset": C.Uniform(-0.05, 0.05)}, backend, sys)
    general = FREE_AND_BALL_XML.replace(
        '<joint type="free"/>',
        '<joint type="free"/><inertial pos="1e-6 0 0" mass="2" diaginertia=".1 .1 .1"/>',
    )
    assert mujoco.MjModel.from_xml_string(general).body_simple[1] == 0
    _bind({"com_offset[free]": C.Uniform(-0.05, 0.05)}, backend, mjcf.loads(general))


# A muscle whose peak force MuJoCo derives from the limb it moves (force < 0: F0 =
# scale / actuator_acc0), on a hinge whose range sets the muscle's length range
MUSCLE_XML = """<mujoco><option timestep="0.002" gravity="0 0 0"/><worldbody>
<body name="arm"><joint name="hinge" type="hinge" axis="0 1 0" limited="true" range="-60 60"/>
<geom type="capsule" fromto="0 0 0 0.5 0 0" size="0.02" mass="{mass}" contype="0" conaffinity="0"/>
</body></worldbody><actuator><muscle name="muscle" joint="hinge" gear="{gear}"/></actuator>
</mujoco>"""


def test_a_muscle_under_mass_and_gear_contexts_pulls_as_the_compiled_model_does():
    """mass x3 and gear x2 on a muscle: `actuator_acc0` (from which MJX derives the
    muscle's peak force) and `actuator_lengthrange` are those of the model MuJoCo
    compiles with the same values, and 50 steps pulling on it end where that model's
    do; the default context keeps the loaded acc0 bit for bit. acc0 is derived only
    on MJX (Brax's backends have no muscles) and only for a model with a muscle."""
    from mujoco import mjx

    loaded = mjx.put_model(mujoco.MjModel.from_xml_string(MUSCLE_XML.format(mass=1, gear=1)))
    space = {"mass": C.Fixed(1.0, relative=True), "actuator_gain": C.Fixed(1.0, relative=True)}
    binding = _bind(space, "mjx", loaded)
    assert binding.derives == ("weights", "acc0")
    assert _bind({"actuator_gain": C.Scale(0.5, 2)}, "mjx", loaded).derives == ("acc0",)
    assert _bind({"mass": C.Scale(0.5, 2)}, "generalized", mjcf.loads(MUSCLE_XML.format(
        mass=1, gear=1))).derives == ("weights",)  # fmt: skip
    assert _bind({"actuator_gain": C.Scale(0.5, 2)}, "mjx").derives == ()  # no muscle
    apply = jax.jit(binding.apply)
    same = apply(binding.default_context())
    np.testing.assert_array_equal(same.actuator_acc0, loaded.actuator_acc0)

    def pulled(m):
        d = mjx.make_data(m).replace(ctrl=jnp.ones(1))
        return jax.jit(lambda d: jax.lax.fori_loop(0, 50, lambda _, d: mjx.step(m, d), d))(d)

    got = apply({"mass": jnp.float32(3.0), "actuator_gain": jnp.float32(2.0)})
    compiled = mujoco.MjModel.from_xml_string(MUSCLE_XML.format(mass=3, gear=2))
    np.testing.assert_allclose(got.actuator_acc0, compiled.actuator_acc0, rtol=1e-6)
    np.testing.assert_allclose(got.actuator_lengthrange, compiled.actuator_lengthrange, rtol=1e-6)
    ours, theirs = pulled(got), pulled(mjx.put_model(compiled))
    np.testing.assert_allclose(ours.qpos, theirs.qpos, rtol=1e-5)
    np.testing.assert_allclose(ours.actuator_force, theirs.actuator_force, rtol=1e-5)
    assert abs(float(ours.qpos[0])) > 0.1  # it moved


def test_geom_size_scales_collision_bounds():
    """The ball's size and bounds scale; the floor, a plane (infinite in collisions,
    its size never read), keeps its own."""
    binding = _bind({"geom_size": C.Fixed(1.5, relative=True, per_element=True)}, "mjx")
    assert binding.default_context()["geom_size"].shape == (1,)  # the ball
    sys = binding.apply({"geom_size": jnp.full((1,), 1.5)})
    scale = np.where(np.asarray(SYS.geom_type) == int(mujoco.mjtGeom.mjGEOM_PLANE), 1.0, 1.5)
    np.testing.assert_allclose(sys.geom_rbound, scale * SYS.geom_rbound, rtol=1e-6)
    np.testing.assert_allclose(sys.geom_size, scale[:, None] * SYS.geom_size, rtol=1e-6)


def test_viscosity_switches_the_mjx_fluid_model_on():
    assert not SYS.opt._impl.has_fluid_params
    binding = _bind({"viscosity": C.Uniform(0.0, 1.0)}, "mjx")
    assert binding.sys.opt._impl.has_fluid_params


@pytest.mark.parametrize("backend", ["generalized", "positional", "spring"])
@pytest.mark.parametrize("name", ["viscosity", "density"])
def test_a_fluid_context_switches_braxs_fluid_model_on(backend, name):
    """Brax's own backends simulate drag only where the System's static enable_fluid is
    set (the model loaded a viscosity or density): a fluid context sets it, and writes
    both copies of the value (Brax's and MuJoCo's)."""
    sys = Puck(backend=backend).sys
    assert not sys.enable_fluid
    binding = _bind({name: C.Uniform(0.0, 1.0)}, backend, sys)
    assert binding.sys.enable_fluid and not binding.sys.opt._impl.has_fluid_params
    moved = binding.apply({name: jnp.float32(0.5)})
    assert float(getattr(moved, name)) == float(getattr(moved.opt, name)) == 0.5


def test_scaled_shrinks_about_the_centre_or_the_default():
    space = C.ContextSpace({"gravity": C.Uniform(5.0, 15.0), "mass": C.Scale(0.5, 1.5)})
    narrow = space.scaled(0.1)
    assert float(narrow["gravity"].low) == pytest.approx(9.5)
    assert float(narrow["gravity"].high) == pytest.approx(10.5)
    about_default = space.scaled(0.5, around={"gravity": 9.81, "mass": 1.0})
    assert float(about_default["gravity"].low) == pytest.approx(9.81 - 0.5 * 4.81, rel=1e-5)
    assert float(about_default["mass"].low) == pytest.approx(0.75)  # relative: about 1
    assert jax.tree.structure(narrow) == jax.tree.structure(space)


def test_scaled_about_a_default_outside_a_range_narrows_inside_it():
    """About a default beyond a range, a range shrinks toward the range's nearest point,
    so f <= 1 gives ranges inside the space. Hopper's friction: the mean of its floor
    and foot defaults (1, 2) is 1.5, above Uniform(0.6, 1.0); the narrowed range was
    Uniform(1.32, 1.4), where every draw lay beyond the space, nearer an
    extrapolation set than the space itself."""
    space = C.ContextSpace(
        {
            "friction": C.Uniform(0.6, 1.0),
            "mass": C.Scale(1.5, 3.0),  # relative: about x1, below it
            "damping": C.LogUniform(0.5, 2.0),
            "gravity": C.Normal(5.0, 0.5),  # its interval: 4-6
            "armature": C.Uniform([0.1, 0.2], [0.3, 0.4], per_element=True),
        }
    )
    defaults = {
        "friction": np.array([1.0, 2.0], np.float32).view(C.EnvDefaults),
        "mass": 1.0,
        "damping": 0.0,  # below a LogUniform: in log space, nowhere
        "gravity": 9.81,
        "armature": np.array([0.0, 0.25], np.float32),
    }
    narrow = space.scaled(0.2, around=defaults)
    np.testing.assert_allclose([narrow["friction"].low, narrow["friction"].high], [0.92, 1.0])
    np.testing.assert_allclose([narrow["mass"].low, narrow["mass"].high], [1.5, 1.8])
    np.testing.assert_allclose(narrow["damping"].low, 0.5)
    np.testing.assert_allclose(narrow["damping"].high, 0.5 * 4**0.2, rtol=1e-6)
    np.testing.assert_allclose(float(narrow["gravity"].mean), 6 - 0.2, rtol=1e-6)
    np.testing.assert_allclose(narrow["armature"].low, [0.1, 0.24], rtol=1e-6)
    np.testing.assert_allclose(narrow["armature"].high, [0.14, 0.28], rtol=1e-6)
    for f in (0.0, 0.2, 0.7, 1.0):
        ranges = space.scaled(f, around=defaults).intervals()
        for name, (low, high) in space.intervals().items():
            assert np.all(ranges[name][0] >= low - 1e-6), (f, name)
            assert np.all(ranges[name][1] <= high + 1e-6), (f, name)
    assert space.scaled(1.0, around=defaults) == space


def test_intervals_are_finite():
    space = C.ContextSpace({"g": C.Normal(9.8, 1.0), "m": C.Uniform(1, 2), "c": C.Choice([1, 3])})
    iv = space.intervals()
    assert iv["g"] == (pytest.approx(7.8), pytest.approx(11.8))
    assert (float(iv["c"][0]), float(iv["c"][1])) == (1.0, 3.0)


BAD = {
    "unknown name lists valid names": (
        lambda: _bind({"masss": C.Uniform(1, 2)}),
        r"unknown context name 'masss'.*gravity, mass, inertia",
    ),
    "low > high": (lambda: C.Uniform(2.0, 1.0), "low <= high"),
    "loguniform low <= 0": (lambda: C.LogUniform(0.0, 1.0), "low > 0"),
    "negative std": (lambda: C.Normal(0.0, -1.0), "std >= 0"),
    "negative truncated std": (lambda: C.TruncatedNormal(0.0, -1.0, -1, 1), "std >= 0"),
    "probs do not sum to 1": (lambda: C.Choice([1, 2], [0.5, 0.6]), "sum to 1"),
    "probs wrong length": (lambda: C.Choice([1, 2], [1.0]), "one probability per value"),
    "empty choice": (lambda: C.Choice([]), "non-empty"),
    "non-finite bound": (lambda: C.Uniform(0.0, float("inf")), "finite"),
    "non-physical mass": (
        lambda: _bind({"mass": C.Uniform(-1.0, 2.0)}),
        r"mass values \(kg\) must be > 0",
    ),
    "zero mass scale": (lambda: _bind({"mass": C.Scale(0.0, 2.0)}), "must be > 0"),
    "non-physical timestep": (
        lambda: _bind({"timestep": C.Normal(0.01, 0.001)}),
        "timestep values .* must be > 0",
    ),
    "non-physical size": (lambda: _bind({"geom_size": C.Scale(0.0, 1.0)}), "must be > 0"),
    "absolute size": (lambda: _bind({"geom_size": C.Uniform(0.1, 0.2)}), "relative=True"),
    "shape does not fit": (
        lambda: _bind({"mass": C.Uniform([1.0, 2.0, 3.0], [2.0, 3.0, 4.0], per_element=True)}),
        r"does not fit the field \(element shape \(1,\): ball\)",
    ),
    "array for a shared draw": (
        lambda: _bind({"friction": C.Uniform([0.1, 0.1], [0.2, 0.2])}),
        "per_element=True",
    ),
    "per element on a scalar": (
        lambda: _bind({"gravity": C.Uniform(1.0, 2.0, per_element=True)}),
        "single value",
    ),
    "elasticity on generalized": (
        lambda: _bind({"elasticity": C.Uniform(0.0, 0.5)}, "generalized"),
        r"Backends that simulate it: \['positional', 'spring'\]",
    ),
    "relative scale of a zero default": (
        lambda: _bind({"stiffness": C.Scale(0.5, 2.0)}),
        "default is 0 everywhere",
    ),
    "raw path the backend never reads": (
        lambda: _bind({"body_mass": C.Uniform(1.0, 2.0)}, "generalized"),
        "never reads 'body_mass'",
    ),
    "raw path index out of range": (
        lambda: _bind({"geom_friction[:, 7]": C.Uniform(1.0, 2.0)}),
        "index does not fit",
    ),
    "raw path not a float array": (
        lambda: _bind({"body_parentid": C.Uniform(1.0, 2.0)}),
        "not a float array",
    ),
    "raw path to a static (numpy) field": (
        lambda: _bind({"body_margin[1]": C.Uniform(0.0, 0.1)}, "mjx"),
        "static field",
    ),
    "not a distribution": (
        lambda: C.ContextSpace({"gravity": (1.0, 2.0)}),
        "expected a distribution",
    ),
    "bad flag": (lambda: C.Uniform(1.0, 2.0, relative="yes"), "True or False"),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_bad_input_raises_a_clear_value_error(case):
    make, message = BAD[case]
    with pytest.raises(ValueError, match=message):
        make()


def test_mass_on_a_spring_env_that_ignores_masses_raises():
    from brax import envs as brax_envs

    hopper = brax_envs.get_environment("hopper", backend="spring")
    with pytest.raises(ValueError, match="spring_mass_scale"):
        _bind({"mass": C.Scale(0.5, 1.5)}, "spring", hopper.sys)


def test_check_ranges_rejects_other_names_kinds_and_shapes():
    binding = _bind({"gravity": C.Uniform(5.0, 15.0), "mass": C.Scale(0.5, 1.5)})
    ok = C.ContextSpace({"gravity": C.Uniform(8.0, 9.0), "mass": C.Scale(0.9, 1.1)})
    assert binding.check_ranges(ok) is ok
    with pytest.raises(ValueError, match="same names"):
        binding.check_ranges(C.ContextSpace({"gravity": C.Uniform(8.0, 9.0)}))
    with pytest.raises(ValueError, match="distribution kind"):
        binding.check_ranges(
            C.ContextSpace({"gravity": C.Normal(8.0, 1.0), "mass": C.Scale(0.9, 1.1)})
        )
    with pytest.raises(ValueError, match="must be > 0"):
        binding.check_ranges(
            C.ContextSpace({"gravity": C.Uniform(8.0, 9.0), "mass": C.Scale(-1.0, 1.1)})
        )


RANGES = {
    "gravity": C.Uniform(5.0, 15.0),
    "mass": C.LogUniform(0.5, 2.0),
    "geom_pos[1, 0]": C.Normal(0.0, 0.01),  # a raw path: no physical bound
    "damping": C.TruncatedNormal(0.2, 0.05, 0.0, 1.0),
    "actuator_gain": C.Choice([-1.0, 1.0], relative=True),
}


def _rebuilt(name, field, value):
    """The space with one number replaced by jax.tree.map, as a curriculum rebuilds
    ranges: no distribution __init__ runs."""
    return jax.tree_util.tree_map_with_path(
        lambda path, x: (
            np.asarray(value, np.float32)
            if path == (jax.tree_util.DictKey(name), jax.tree_util.GetAttrKey(field))
            else x
        ),
        C.ContextSpace(RANGES),
    )


REBUILT = {
    "NaN bound": (("gravity", "low", np.nan), r"context 'gravity': Uniform.low must be finite"),
    "infinite bound": (("gravity", "high", np.inf), "Uniform.high must be finite"),
    "low > high": (("gravity", "low", 20.0), "Uniform needs low <= high"),
    "loguniform low <= 0": (("mass", "low", 0.0), "LogUniform needs low > 0"),
    "negative std": (("geom_pos[1, 0]", "std", -0.01), "Normal needs std >= 0"),
    "NaN mean": (("geom_pos[1, 0]", "mean", np.nan), "Normal.mean must be finite"),
    "truncated low > high": (("damping", "low", 2.0), "TruncatedNormal needs low <= high"),
    "truncated negative std": (("damping", "std", -1.0), "TruncatedNormal needs std >= 0"),
    "probs not summing to 1": (
        ("actuator_gain", "probs", [0.9, 0.9]),
        "Choice probabilities must be >= 0 and sum to 1",
    ),
    "negative prob": (("actuator_gain", "probs", [1.5, -0.5]), "must be >= 0 and sum to 1"),
}


@pytest.mark.parametrize("case", list(REBUILT), ids=list(REBUILT))
def test_check_ranges_validates_ranges_rebuilt_by_jax(case):
    """The same checks and messages as construction, for ranges that skipped it."""
    (name, field, value), message = REBUILT[case]
    binding = _bind(RANGES)
    assert binding.check_ranges(C.ContextSpace(RANGES))  # the valid ranges pass
    with pytest.raises(ValueError, match=message):
        binding.check_ranges(_rebuilt(name, field, value))
    rows = jax.tree.map(
        lambda a, b: np.stack([a, b, a]), binding.space, _rebuilt(name, field, value)
    )
    with pytest.raises(ValueError, match=message):  # one bad row of per-env ranges
        binding.check_ranges(rows, (3,))


def test_check_ranges_takes_nan_only_as_each_elements_own_default():
    """pinned(default_context()) draws NaN for an absolute entry whose elements'
    defaults differ (each keeps its own); anywhere else NaN is refused."""
    from brax import envs as brax_envs

    hopper = brax_envs.get_environment("hopper", backend="generalized").sys
    binding = _bind({"friction": C.Uniform(0.4, 1.2), "gravity": C.Uniform(5.0, 15.0)}, sys=hopper)
    pinned = binding.space.pinned(binding.default_context())
    assert np.isnan(pinned["friction"].low) and binding.check_ranges(pinned) is pinned
    nan_gravity = jax.tree.map(lambda x: np.float32(np.nan), pinned)
    with pytest.raises(ValueError, match="context 'gravity': Uniform.low must be finite"):
        binding.check_ranges(nan_gravity)


# ---- pinning a shared absolute entry to defaults that differ per element ----


def _hopper_env(space):
    from metarl.envs import make_contextual

    return make_contextual("hopper", C.ContextSpace(space), backend="generalized")


# env -> its jitted trajectory: a second set of ranges for the same env is not traced
# again (hopper's rollout: about 5 s to trace)
_TRAJECTORIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _trajectory(env, ranges):
    if env not in _TRAJECTORIES:
        actions = jax.random.uniform(jax.random.key(1), (10, env.action_size), minval=-1, maxval=1)

        def run(ranges):
            state = env.reset(jax.random.key(0), ranges)

            def step(s, a):
                s = env.step(s, a)
                return s, (s.pipeline_state.q, s.pipeline_state.qd, s.obs, s.reward)

            return jax.lax.scan(step, state, actions)[1]

        _TRAJECTORIES[env] = jax.jit(run)
    return jax.device_get(_TRAJECTORIES[env](ranges))


def test_pinned_default_context_runs_the_env_in_its_own_physics():
    """hopper's colliding geoms have different frictions (floor 1, foot 2): a shared
    absolute `friction` pinned to env.default_context() reproduces the env bit for bit."""
    space = {"friction": C.Uniform(0.4, 1.2), "gravity": C.Uniform(5.0, 15.0)}
    env = _hopper_env(space)
    defaults = env.default_context()
    assert np.shape(defaults["friction"]) == (2,)  # only the floor and the foot collide
    assert len(set(np.asarray(defaults["friction"]).tolist())) > 1
    pinned = env.space.pinned(defaults)
    # the ranges keep the space's shapes: accepted wherever ranges are
    assert env.space.check_compatible(pinned) is pinned
    env.binding.check_ranges(pinned)
    state = jax.jit(env.reset)(jax.random.key(0), pinned)  # op by op, hopper compiles for 16 s
    assert state.info["context"]["friction"].shape == ()
    assert env.observation_size == _hopper_env({"gravity": C.Uniform(5.0, 15.0)}).observation_size
    state = env.set_ranges(state, pinned)
    assert np.all(np.isfinite(np.asarray(state.obs)))
    # exactly the default physics: same as a space without that entry
    reference = _hopper_env({"gravity": C.Uniform(5.0, 15.0)})
    got = _trajectory(env, pinned)
    want = _trajectory(reference, reference.space.pinned({"gravity": defaults["gravity"]}))
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    # and a pinned value still changes the physics
    other = _trajectory(env, env.space.pinned({**defaults, "friction": 0.3}))
    assert not np.array_equal(other[0], got[0])


def test_pinned_ranges_do_not_recompile_a_jitted_reset():
    env = _hopper_env({"friction": C.Uniform(0.4, 1.2)})
    reset = jax.jit(env.reset)
    reset(jax.random.key(0), env.space)
    reset(jax.random.key(0), env.space.pinned(env.default_context()))
    assert reset._cache_size() == 1


def test_visible_pinned_defaults_observe_the_mean_default():
    from metarl.envs import make_contextual

    env = make_contextual(
        "hopper", C.ContextSpace({"friction": C.Uniform(0.4, 1.2)}), visible_context=True
    )
    mean = float(np.mean(env.default_context()["friction"]))
    state = jax.jit(env.reset)(jax.random.key(0), env.space.pinned(env.default_context()))
    np.testing.assert_allclose(state.obs[-1], (mean - 0.8) / 0.4, rtol=1e-6)
    # an env built on the pinned space (the env's own physics, the same observation
    # layout) observed NaN: its normaliser came from NaN bounds
    own = make_contextual("hopper", env.space.pinned(env.default_context()), visible_context=True)
    drawn = own.binding.sample(jax.random.key(0))
    assert np.isnan(float(drawn["friction"]))  # "each element at its default"
    np.testing.assert_array_equal(np.asarray(own.binding.normalise(drawn)), [0.0])


@pytest.mark.parametrize(
    "mass",
    [C.Scale(0.5, 2.0, per_element=True), C.Uniform(1.0, 12.0, per_element=True)],
    ids=["relative", "absolute"],
)
def test_per_element_entries_with_one_range_pin_to_the_envs_own_physics(mass):
    """One range for every element (scalar parameters), drawn per element: pinned to
    env.default_context() (x1 each, or the cart's and pole's own masses), the env runs
    exactly in its own physics, and the shapes stay those of the space."""
    from metarl.envs import make_contextual

    gravity = {"gravity": C.Uniform(5.0, 15.0)}
    env = make_contextual("inverted_pendulum", C.ContextSpace({"mass": mass, **gravity}))
    reference = make_contextual("inverted_pendulum", C.ContextSpace(gravity))
    defaults = env.default_context()
    pinned = env.space.pinned(defaults)
    assert jax.tree.structure(pinned) == jax.tree.structure(env.space)
    assert [np.shape(x) for x in jax.tree.leaves(pinned)] == [
        np.shape(x) for x in jax.tree.leaves(env.space)
    ]
    got = _trajectory(env, pinned)
    want = _trajectory(reference, reference.space.pinned({"gravity": defaults["gravity"]}))
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    heavier = np.asarray(defaults["mass"]) * 1.5
    if mass.relative:  # x1.5 for every element: one number
        other = _trajectory(env, env.space.pinned({**defaults, "mass": heavier}))
        assert not np.array_equal(other[0], got[0])
    else:  # differing values that are not the env's own: one range cannot hold them
        with pytest.raises(ValueError, match="one range for all elements"):
            env.space.pinned({**defaults, "mass": heavier})


def test_pinned_shared_entry_to_arbitrary_differing_values_raises():
    space = C.ContextSpace({"friction": C.Uniform(0.4, 1.2)})
    with pytest.raises(ValueError, match="default_context"):
        space.pinned({"friction": np.array([0.5, 0.6], np.float32)})
    # equal values pin to that value; EnvDefaults is a plain array elsewhere
    low = space.pinned({"friction": np.array([0.7, 0.7])})["friction"].low
    assert float(low) == np.float32(0.7)
    d = np.array([1.0, 2.0], np.float32).view(C.EnvDefaults)
    assert type(d * 2) is np.ndarray


def test_a_log_uniform_context_is_visible_in_log_space():
    """Normalised linearly, LogUniform(0.1, 10)'s geometric centre 1 was observed at
    -0.82 and half its draws lay within 0.18 of -1. A value of 0 (MJX's viscosity
    pinned to its default, or evaluated there) is observed finite."""
    from metarl.envs import make_contextual

    mass = C.ContextSpace({"mass": C.LogUniform(0.1, 10.0, relative=True)})
    env = make_contextual("hopper", mass, visible_context=True)
    draws = jax.vmap(env.binding.sample)(jax.random.split(jax.random.key(0), 4000))
    seen = np.asarray(jax.vmap(env.binding.normalise)(draws))[:, 0]
    quantiles = np.quantile(seen, [0.05, 0.25, 0.5, 0.75, 0.95])
    np.testing.assert_allclose(quantiles, [-0.9, -0.5, 0.0, 0.5, 0.9], atol=0.05)
    np.testing.assert_allclose(np.asarray(env.binding.normalise({"mass": 1.0})), [0.0], atol=1e-6)

    viscosity = C.ContextSpace({"viscosity": C.LogUniform(0.01, 1.0)})
    env = make_contextual("hopper", viscosity, backend="mjx", visible_context=True)
    assert np.isfinite(np.asarray(env.binding.normalise({"viscosity": 0.0}))).all()
    own = make_contextual(
        "hopper", viscosity.pinned(env.default_context()), backend="mjx", visible_context=True
    )
    drawn = own.binding.sample(jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(own.binding.normalise(drawn)), [0.0])
