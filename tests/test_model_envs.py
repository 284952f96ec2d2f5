"""MJX-native envs: a user's own MJCF (`MjcfEnv`) and MuJoCo Playground envs.

Every canonical quantity the MJX backend simulates, including the ones
Playground's randomizers vary (frictionloss, com_offset, PD gains, armature,
pair friction), reaches the physics of a plain `mjx.Model`; the default
context reproduces the plain MJX rollout bit for bit; Playground envs work by
name and by instance, refuse the constants they cache, and train.
"""

import re

import conftest
import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import perturbations
import pytest
from mujoco import mjx

from metarl import contexts as C
from metarl.contexts.quantities import QUANTITIES
from metarl.envs import CONTEXT, DERIVED, ContractError, MjcfEnv, check_env, make_contextual

# Two legs on a torso that slides along x; position servos on the hips, a motor on
# the slide; frictionloss on one hip; an explicit contact pair foot/floor.
XML = """
<mujoco model="walker2">
  <option timestep="0.01" viscosity="0.1" density="1.2"/>
  <worldbody>
    <geom name="floor" type="plane" size="5 5 0.1"/>
    <body name="torso" pos="0 0 0.6">
      <joint name="slide" type="slide" axis="1 0 0" damping="0.1" armature="0.01"/>
      <joint name="lift" type="slide" axis="0 0 1" stiffness="5"/>
      <geom name="torso_geom" type="box" size="0.15 0.1 0.05" mass="2"/>
      <body name="thigh_left" pos="0.1 0 -0.05">
        <joint name="hip_left" type="hinge" axis="0 1 0" damping="0.05" frictionloss="0.05"/>
        <geom name="left_leg" type="capsule" fromto="0 0 0 0 0 -0.4" size="0.04" mass="0.5"/>
      </body>
      <body name="thigh_right" pos="-0.1 0 -0.05">
        <joint name="hip_right" type="hinge" axis="0 1 0" damping="0.05"/>
        <geom name="right_leg" type="capsule" fromto="0 0 0 0 0 -0.4" size="0.04" mass="0.5"/>
      </body>
    </body>
  </worldbody>
  <contact>
    <pair geom1="left_leg" geom2="floor" friction="0.8 0.8 0.005 0.0001 0.0001"/>
  </contact>
  <actuator>
    <motor name="push" joint="slide" gear="20"/>
    <position name="hip_left_servo" joint="hip_left" kp="8" kv="0.5"/>
    <position name="hip_right_servo" joint="hip_right" kp="8" kv="0.5"/>
  </actuator>
</mujoco>
"""
STEPS = 30


def _observe(data, task):
    return jnp.concatenate([data.qpos, data.qvel])


def _reward(data, action, next_data, task):
    return next_data.qpos[0] - data.qpos[0]


def _walker(**kw) -> MjcfEnv:
    return MjcfEnv(XML, observe=_observe, reward=_reward, n_frames=2, **kw)


# Every quantity MJX simulates; those that need a model feature, on the elements that have it.
SELECT = {
    "frictionloss": "frictionloss[hip_left]",
    "actuator_kp": "actuator_kp[*servo*]",
    "actuator_kd": "actuator_kd[*servo*]",
}
PERTURB = {
    SELECT.get(n, n): p for n, p in perturbations.PERTURB.items() if "mjx" in QUANTITIES[n].backends
}


def test_every_mjx_quantity_is_covered():
    covered = {C.names.split(n)[0] for n in PERTURB}
    assert covered == {n for n, q in QUANTITIES.items() if "mjx" in q.backends}


def _space(values):
    return C.ContextSpace(
        {n: C.Fixed(values[n], relative=r, per_element=p) for n, (r, p, _) in PERTURB.items()}
    )


@pytest.fixture(scope="module")
def walker_rollouts():
    return _walker_rollouts()


def _walker_rollouts():
    probe = make_contextual(
        _walker(),
        C.ContextSpace(
            {n: C.Fixed(1.0, relative=r, per_element=False) for n, (r, p, _) in PERTURB.items()}
        ),
    )
    defaults = probe.default_context()
    env = make_contextual(_walker(), _space(defaults), episode_length=1000)
    actions = 0.5 * jnp.stack([jnp.sin(jnp.arange(STEPS) / 4.0 + k) for k in range(3)], -1)

    @jax.jit
    def rollout(ranges):
        s = env.reset(jax.random.key(0), ranges)
        return jax.lax.scan(lambda s, a: (env.step(s, a),) * 2, s, actions)[1].obs

    return env, defaults, rollout, actions


@pytest.mark.parametrize("name", list(PERTURB))
def test_quantity_changes_the_mjcf_trajectory(walker_rollouts, name):
    env, defaults, rollout, _ = walker_rollouts
    reference = np.asarray(rollout(env.space))
    values = dict(defaults)
    values[name] = PERTURB[name][2](np.asarray(defaults[name]))
    diff = np.nanmax(np.abs(np.asarray(rollout(_space(values))) - reference))
    assert diff > 1e-4, f"{name} changed the MJCF trajectory by only {diff}"


def _plain_mjx_difference() -> float:
    """Every quantity Fixed at its default against the plain MJX simulation: the
    largest difference in their observations."""
    env, _, rollout, actions = _walker_rollouts()
    plain = _walker()
    m = plain.model

    @jax.jit
    def reference():
        key = jax.random.key_data(jax.random.split(jax.random.fold_in(jax.random.key(0), 0))[1])
        with plain.using(m, {}):
            s = plain.reset(key)
            return jax.lax.scan(lambda s, a: (plain.step(s, a),) * 2, s, actions)[1].obs

    return float(np.max(np.abs(np.asarray(rollout(env.space)) - np.asarray(reference()))))


def test_default_context_reproduces_plain_mjx():
    """Bit for bit the plain MJX simulation, with XLA's current CPU emitters: in a
    process of its own, without the older emitters tests/conftest.py sets (with them
    the two programs fuse differently and differ by 1.5e-6)."""
    out = conftest.with_xla_defaults("test_model_envs", "_plain_mjx_difference()")
    assert float(out) == 0.0, out


def test_an_mjcf_envs_observation_size_traces_its_reset_once(monkeypatch):
    """Read by every env built on it, by check_env (twice) and by the agents: each
    reading traced the reset again (0.8 s for two bodies on 2 cores)."""
    reset, traced = MjcfEnv.reset, []
    monkeypatch.setattr(
        MjcfEnv, "reset", lambda self, key: (traced.append(key), reset(self, key))[1]
    )
    env = _walker()
    assert env.observation_size == env.observation_size == env.model.nq + env.model.nv
    assert len(traced) == 1


def test_mjcf_env_takes_a_model_or_a_path(tmp_path):
    path = tmp_path / "walker.xml"
    path.write_text(XML)
    a = MjcfEnv(str(path), observe=_observe, reward=_reward)
    b = MjcfEnv(
        mjx.put_model(__import__("mujoco").MjModel.from_xml_string(XML)),
        observe=_observe,
        reward=_reward,
    )
    assert a.action_size == b.action_size == 3 and a.observation_size == 8
    with pytest.raises(ValueError, match="no MJCF file"):
        MjcfEnv(str(tmp_path / "missing.xml"), observe=_observe, reward=_reward)
    with pytest.raises(ValueError, match="needs reward="):
        MjcfEnv(XML, observe=_observe)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"reset_noise": float("nan")}, "reset_noise must be a finite number >= 0, got nan"),
        ({"reset_noise": -0.1}, "reset_noise must be a finite number >= 0"),
        ({"n_frames": 0}, "n_frames must be an integer >= 1"),
        ({"task_params": [1, 2]}, "task_params must be a mapping"),
        ({"observe": 3}, "observe must be a function, got int"),
        (
            {"observe": lambda d, t: d.qpos[0]},
            "observe must return a 1-D vector for one env, got shape ()",
        ),
        ({"observe": lambda d, t: jnp.stack([d.qpos] * 2)}, "observe must return a 1-D vector"),
        (
            {"reward": lambda d, a, n, t: n.qpos[:3]},
            "reward must return one number (shape ()) for one env, got shape (3,)",
        ),
        ({"terminated": lambda d, t: d.qpos[:2] > 0}, "terminated must return one number"),
        # accepted as a noise of 1.0, where n_frames=True was refused
        ({"reset_noise": True}, "reset_noise must be a finite number >= 0, got True"),
        # each failed at the first trace, not naming MjcfEnv or the function
        ({"observe": lambda d: d.qpos}, "observe is called as observe(data, task); its"),
        ({"reward": lambda d, a, n: 0.0}, "reward is called as reward(data, action, next_data"),
        (
            {"observe": lambda d, t: {"q": d.qpos}},
            "observe must return a 1-D vector for one env, got a dict",
        ),
        (
            {"reward": lambda d, a, n, t: None},
            "reward must return one number (shape ()) for one env, got a NoneType",
        ),
    ],
)
def test_mjcf_env_refuses_bad_settings_and_outputs_before_anything_runs(kwargs, message):
    """A reward of shape (3,) made each env's return a vector, a NaN reset noise gave
    non-finite resets whose observations were silently zeroed."""
    settings = {"observe": _observe, "reward": _reward, **kwargs}
    with pytest.raises(ValueError, match=re.escape(message)):
        env = make_contextual(
            MjcfEnv(XML, **settings), C.ContextSpace({"gravity": C.Scale(0.5, 2)})
        )
        jax.eval_shape(
            lambda k: env.step(env.reset(k), jnp.zeros(env.action_size)), jax.random.key(0)
        )
    assert MjcfEnv(XML, observe=_observe, reward=_reward, n_frames=np.int64(2)).n_frames == 2


@pytest.mark.parametrize(
    "name, message",
    [
        ("frictionloss", "hip_right would not change"),
        ("actuator_kp", "push would not change"),
        ("frictionloss[slide]", "slide would not change"),
        # the torso only slides: its rotational inertia and centre of mass do nothing
        ("inertia[torso]", "slide joints alone move it"),
        ("com_offset[torso]", "slide joints alone move it"),
    ],
)
def test_quantities_refuse_elements_the_physics_never_reads(name, message):
    dist = C.Uniform(-0.1, 0.1) if name.startswith("com_offset") else C.Scale(0.5, 2.0)
    with pytest.raises(ValueError, match=message):
        make_contextual(_walker(), C.ContextSpace({name: dist}))


_WRAPPED = """<mujoco><compiler><lengthrange mode="none"/></compiler><worldbody>
  <site name="s0" pos="0 0 0.5"/><site name="side" pos="0.5 0 0.5"/>
  <geom name="drum" type="cylinder" size="0.2 0.05" euler="90 0 0" contype="0" conaffinity="0"/>
  <geom name="floor" type="plane" size="1 1 0.1" pos="0 0 -1"/>
  <body name="arm"><joint name="h" type="hinge" axis="0 1 0"/>
    <geom name="rod" type="capsule" fromto="0 0 0 0.5 0 0" size="0.03" mass="1"/>
    <site name="s1" pos="0.5 0 0"/></body></worldbody>
  <tendon><spatial name="cable" TENDON><site site="s0"/><geom geom="drum" sidesite="side"/>
    <site site="s1"/></spatial></tendon><actuator><ACTUATOR tendon="cable"/></actuator></mujoco>"""


def test_a_geom_a_tendon_wraps_takes_a_size_unless_the_tendon_has_compiled_constants():
    """A drum a motor's cable wraps: its size moves the cable's path at every step. With
    a limit (or a muscle, ...) MuJoCo derived the cable's length and inverse weight at
    qpos0 from the drum's size when it compiled; those stayed stale (a muscle's peak
    force 13% off, the limit's regularisation 22% off), so the size is refused."""
    from metarl.contexts.space import bind

    space = C.ContextSpace({"geom_size[drum]": C.Scale(2.0, 2.0)})
    model = mjx.put_model(
        mujoco.MjModel.from_xml_string(_WRAPPED.replace("TENDON", "").replace("ACTUATOR", "motor"))
    )
    binding = bind(space, model, "mjx")

    @jax.jit
    def length(sys):
        d = mjx.make_data(sys).replace(qpos=sys.qpos0)
        return mjx.tendon(sys, mjx.kinematics(sys, d)).ten_length

    grown = binding.apply(binding.sample(jax.random.key(0)))
    assert float(length(grown)[0]) > float(length(model)[0]) + 1e-3  # the path reaches it
    for tendon, actuator, why in [
        ('limited="true" range="0 0.9"', "motor", "a limit"),
        ("", 'muscle force="-1" lengthrange="0.3 1"', "a muscle"),
    ]:
        xml = _WRAPPED.replace("TENDON", tendon).replace("ACTUATOR", actuator)
        model = mjx.put_model(mujoco.MjModel.from_xml_string(xml))
        with pytest.raises(ValueError, match=f"geoms drum: .* tendon cable, which has {why}"):
            bind(space, model, "mjx")
        with pytest.raises(
            ValueError, match=re.escape("choose the others by name: 'geom_size[rod]'")
        ):
            bind(C.ContextSpace({"geom_size": C.Scale(0.5, 2.0)}), model, "mjx")


def test_pair_friction_needs_contact_pairs():
    xml = XML.replace(XML[XML.index("<contact>") : XML.index("</contact>") + 10], "")
    env = MjcfEnv(xml, observe=_observe, reward=_reward)
    with pytest.raises(ValueError, match="explicit contact pairs"):
        make_contextual(env, C.ContextSpace({"pair_friction": C.Scale(0.5, 2.0)}))


# A box pushed diagonally on a floor it touches only through an explicit pair.
SLIDE_XML = """
<mujoco model="pairslide">
  <option timestep="0.01"/>
  <worldbody>
    <geom name="floor" type="plane" size="0 0 0.1" contype="0" conaffinity="0"/>
    <body name="box" pos="0 0 0.1">
      <joint name="x" type="slide" axis="1 0 0"/>
      <joint name="y" type="slide" axis="0 1 0"/>
      <joint name="z" type="slide" axis="0 0 1"/>
      <geom name="box" type="box" size="0.1 0.1 0.1" mass="1" contype="0" conaffinity="0"/>
    </body>
  </worldbody>
  <contact><pair geom1="box" geom2="floor"/></contact>
  <actuator>
    <motor joint="x" gear="10" ctrlrange="-1 1"/>
    <motor joint="y" gear="10" ctrlrange="-1 1"/>
  </actuator>
</mujoco>"""


def test_pair_friction_slides_as_mujoco_does_in_both_tangent_directions():
    """pair_friction is the pair's friction in both tangent directions of the contact
    (MuJoCo reads pair_friction[:, 0] and [:, 1]): a box pushed diagonally slides
    equally along x and y, exactly as far as MuJoCo's C engine moves it with both
    coefficients set, and farther on less friction."""
    import mujoco

    def mujoco_c(f):
        m = mujoco.MjModel.from_xml_string(SLIDE_XML)
        d = mujoco.MjData(m)
        m.pair_friction[:, :2] = f
        d.ctrl[:] = 0.3
        for _ in range(60):
            mujoco.mj_step(m, d)
        return d.qpos[:2]

    space = C.ContextSpace({"pair_friction": C.Uniform(0.01, 2.0)})
    box = MjcfEnv(SLIDE_XML, observe=_observe, reward=_reward, n_frames=2, reset_noise=0.0)
    env = make_contextual(box, space)

    @jax.jit
    def slid(ranges):  # 30 steps of 2 frames: 60 physics steps
        s = env.reset(jax.random.key(0), ranges)
        s = jax.lax.fori_loop(0, 30, lambda i, s: env.step(s, jnp.full(2, 0.3)), s)
        return s.pipeline_state.qpos[:2]

    low, high = (np.asarray(slid(space.pinned({"pair_friction": f}))) for f in (0.05, 0.5))
    np.testing.assert_allclose(low, mujoco_c(0.05), rtol=1e-3)
    np.testing.assert_allclose(high, mujoco_c(0.5), rtol=1e-3)
    assert low[0] > 2 * high[0] > 0.1


def test_a_geom_touching_only_through_a_pair_takes_a_size_but_no_friction():
    """MJX's collision reads the sizes of a pair's geoms but the pair's own friction:
    geom friction there is refused, geom size is accepted and reaches the physics."""
    box = lambda: MjcfEnv(SLIDE_XML, observe=_observe, reward=_reward, reset_noise=0.0)  # noqa: E731
    for name in ("friction", "friction[box]"):
        with pytest.raises(ValueError, match="vary 'pair_friction'"):
            make_contextual(box(), C.ContextSpace({name: C.Uniform(0.05, 2.0)}))
    space = C.ContextSpace({"geom_size[box]": C.Scale(0.5, 2.0)})
    env = make_contextual(box(), space)

    @jax.jit
    def rest_height(ranges):
        s = env.reset(jax.random.key(0), ranges)
        s = jax.lax.fori_loop(0, 40, lambda i, s: env.step(s, jnp.zeros(2)), s)
        return s.pipeline_state.qpos[2]

    small = rest_height(space.pinned({"geom_size[box]": 1.0}))
    large = rest_height(space.pinned({"geom_size[box]": 1.5}))
    # the larger box rests on its larger half-height (0.15 m, not 0.1 m)
    assert float(large - small) == pytest.approx(0.05, abs=0.01)


FAMILY_XML = """
<mujoco>
  <worldbody>
    <geom name="floor" type="plane" size="5 5 0.1"/>
    <geom name="stage" type="plane" pos="0 0 0.5" size="5 5 0.1" contype="8" conaffinity="8"/>
    <body name="box" pos="0 0 0.1">
      <joint name="x" type="slide" axis="1 0 0"/>
      <joint name="z" type="slide" axis="0 0 1"/>
      <geom name="box" type="box" size="0.1 0.1 0.1" mass="1"/>
    </body>
    <body name="arm" pos="0 0 1">
      <joint name="a" type="hinge" axis="0 1 0"/>
      <geom name="arm" type="capsule" fromto="0 0 0 0.3 0 0" size="0.05" contype="14"
            conaffinity="14"/>
      <body name="hand" pos="0.3 0 0">
        <joint name="h" type="hinge" axis="0 1 0"/>
        <geom name="hand" type="sphere" size="0.05" contype="2" conaffinity="2"/>
      </body>
    </body>
    <body name="wall" pos="1 0 1">
      <joint name="w" type="slide" axis="1 0 0"/>
      <geom name="wall" type="box" size="0.05 0.5 0.5" contype="4" conaffinity="4"/>
    </body>
  </worldbody>
  <contact>
    <pair geom1="floor" geom2="box" friction="0.5 0.5 0.005 0.0001 0.0001"/>
    <exclude body1="wall" body2="arm"/>
  </contact>
</mujoco>"""


@pytest.mark.parametrize("filterparent", [True, False])
def test_the_geoms_that_collide_are_those_mjx_collision_driver_tests(filterparent):
    """metarl's contype/conaffinity rule against MJX's own list of the geom pairs it
    tests: the hand collides only with its parent, the arm (filtered unless the model
    disables filterparent), the wall only with the arm, which an <exclude> names, and
    the box with the floor only through an explicit pair; the arm also with the stage.
    Brax's envs as well."""
    from brax import envs as brax_envs
    from mujoco.mjx._src.collision_driver import geom_pairs

    from metarl.contexts.quantities import _can_collide

    flag = "" if filterparent else '<option><flag filterparent="disable"/></option>'
    models = [mujoco.MjModel.from_xml_string(FAMILY_XML.replace("<mujoco>", "<mujoco>" + flag))]
    if filterparent:
        models += [
            brax_envs.get_environment(name, backend="mjx").sys
            for name in ("hopper", "ant", "humanoid", "reacher")
        ]
    for model in models:
        ours = {tuple(sorted(map(int, p))) for p in np.argwhere(np.triu(_can_collide(model)))}
        theirs = {tuple(sorted((int(a), int(b)))) for a, b, pair in geom_pairs(model) if pair < 0}
        assert ours == theirs
    m = mjx.put_model(models[0])
    if filterparent:
        for name in ("friction[box]", "friction[hand]", "friction[wall]"):
            with pytest.raises(ValueError, match="would not change"):
                C.bind(C.ContextSpace({name: C.Scale(0.5, 2.0)}), m, "mjx")
        # the unnamed entry varies the geoms that rub by contype/conaffinity
        bound = C.bind(C.ContextSpace({"friction": C.Scale(0.5, 2.0)}), m, "mjx")
        assert bound.entries[0].labels == ("stage", "arm")
    else:
        C.bind(C.ContextSpace({"friction[hand]": C.Scale(0.5, 2.0)}), m, "mjx")


def test_geom_friction_under_an_explicit_pair_changes_nothing_in_mjx():
    """The ground truth behind refusing `friction` there: a box that the default
    contype/conaffinity and a <contact><pair> both let touch the floor slides as far
    under any geom friction, and not as far under another pair friction."""
    model = mujoco.MjModel.from_xml_string(FAMILY_XML)
    m = mjx.put_model(model)

    @jax.jit
    @jax.vmap
    def slid(geom, pair):
        sys = m.replace(
            geom_friction=m.geom_friction.at[:, 0].set(geom),
            pair_friction=m.pair_friction.at[:, :2].set(pair),
        )
        d = mjx.make_data(sys).replace(qfrc_applied=jnp.zeros(model.nv).at[0].set(6.0))
        d = jax.lax.fori_loop(0, 60, lambda i, d: mjx.step(sys, d), d)
        return d.qpos[0]

    x = np.asarray(slid(jnp.array([0.1, 2.0, 0.1]), jnp.array([0.5, 0.5, 0.1])))
    assert x[0] == x[1] and x[2] > 2 * x[0] > 0


def test_mjcf_env_refuses_brax_backends():
    with pytest.raises(ValueError, match="runs on MJX"):
        make_contextual(
            _walker(), C.ContextSpace({"gravity": C.Uniform(5, 15)}), backend="generalized"
        )


# ---- MuJoCo Playground (dm_control-suite envs ship their assets) ----
playground = pytest.importorskip("mujoco_playground")


@pytest.fixture(scope="module")
def cartpole():
    space = C.ContextSpace(
        {
            "gravity": C.Uniform(5.0, 15.0),
            "mass[pole_1]": C.Scale(0.5, 2.0),
            "damping[hinge_1]": C.Uniform(0.0, 0.5),
        }
    )
    return make_contextual("playground/CartpoleBalance", space, episode_length=50)


def test_playground_env_by_name_resamples_and_reaches_the_physics(cartpole):
    env = cartpole

    @jax.jit
    def rollout(ranges):
        s = env.reset(jax.random.key(3), ranges)
        s = jax.lax.fori_loop(0, 25, lambda i, s: env.step(s, jnp.zeros(1)), s)
        return s.obs

    reference = np.asarray(rollout(env.space.pinned(env.default_context())))
    for name, value in (("gravity", 15.0), ("mass[pole_1]", 2.0), ("damping[hinge_1]", 0.5)):
        moved = np.asarray(rollout(env.space.pinned({**env.default_context(), name: value})))
        assert np.abs(moved - reference).max() > 1e-3, name
    states = jax.jit(jax.vmap(env.reset))(jax.random.split(jax.random.key(0), 4))
    gravity = np.asarray(states.info[CONTEXT]["gravity"])
    assert len(set(gravity.round(4))) == 4 and np.all((gravity >= 5) & (gravity <= 15))


def test_playground_instance_and_name_agree():
    from mujoco_playground import registry

    space = C.ContextSpace({"mass[cart]": C.Scale(0.5, 2.0)})
    by_name = make_contextual("playground/CartpoleBalance", space)
    instance = make_contextual(
        registry.load("CartpoleBalance", config_overrides={"impl": "jax"}), space
    )
    a = jax.jit(by_name.reset)(jax.random.key(1))
    b = jax.jit(instance.reset)(jax.random.key(1))
    np.testing.assert_array_equal(np.asarray(a.obs), np.asarray(b.obs))
    assert float(a.info[CONTEXT]["mass[cart]"]) == float(b.info[CONTEXT]["mass[cart]"])


def test_playground_env_behind_a_wrapper_is_refused():
    """A wrapper would simulate its inner env's own model, never the drawn one."""
    from mujoco_playground import registry, wrapper

    inner = registry.load("CartpoleBalance", config_overrides={"impl": "jax"})
    space = C.ContextSpace({"gravity": C.Uniform(2.0, 30.0)})
    for wrapped in (wrapper.Wrapper(inner), wrapper.wrap_for_brax_training(inner)):
        with pytest.raises(ValueError, match="wraps the Playground env Balance.*before any wrap"):
            make_contextual(wrapped, space)


def test_check_env_passes_on_playground(cartpole):
    assert check_env(cartpole, num_envs=4, max_steps=120)["episodes_ended"] > 0


@pytest.mark.parametrize(
    "name, message",
    [
        ("timestep", "n_substeps"),
        ("geom_size", "geom sizes"),
        ("jnt_range[1, 0]", "joint ranges"),
        ("jnt_actfrcrange[1, 1]", "force ranges"),  # Apollo's reward divides by them
    ],
)
def test_playground_refuses_cached_constants(name, message):
    with pytest.raises(ValueError, match=message):
        make_contextual("playground/CartpoleBalance", C.ContextSpace({name: C.Scale(0.5, 2.0)}))


def test_playground_refuses_what_its_reset_copies_from_the_host_model():
    """A Playground reset makes its data from the host MjModel (mjx_env.make_data):
    qpos0 reached only the inverse weights derived at it (BallInCup reset at the host's
    qpos0), and the target's mocap pose stayed the host's (FingerSpin)."""
    from metarl.envs.sources import PlaygroundSource, load_playground

    sources = {n: PlaygroundSource(load_playground(n, {})) for n in ("BallInCup", "FingerSpin")}

    def bind(name, space):  # as make_contextual binds
        source = sources[name]
        return C.bind(C.ContextSpace(space), source.model, "mjx", {}, source.stale)

    for name in ("qpos0[2]", "eq_active0"):
        with pytest.raises(ValueError, match="MjModel they were built with"):
            bind("BallInCup", {name: C.Uniform(0, 0.1)})
    for name in ("body_pos[4, 1]", "body_quat[:, 0]", "body_pos"):  # 4: the target
        with pytest.raises(ValueError, match=r"bodies \[4\] are mocap bodies"):
            bind("FingerSpin", {name: C.Scale(0.9, 1.1)})
    bind("FingerSpin", {"body_pos[1:4, 2]": C.Scale(0.9, 1)})  # the others reach: accepted


def test_playground_refuses_a_mass_the_env_keeps_and_an_implementation_other_than_jax():
    """Go1, Spot, OP3, Barkour and the LEAP hand keep a torso's (cube's) mass read at
    construction to scale their pushes; MJX's warp implementation took mass contexts
    and crashed at the first reset (metarl derives their constants with JAX code)."""
    from mujoco_playground import registry

    env = registry.load("CartpoleBalance", config_overrides={"impl": "jax"})
    env._torso_mass = float(env.mj_model.body_subtreemass[1])  # as Go1's joystick does
    for name in ("mass[pole_1]", "body_mass[2]"):
        with pytest.raises(ValueError, match="reads _torso_mass from the model at construction"):
            make_contextual(env, C.ContextSpace({name: C.Scale(0.5, 2.0)}))
    make_contextual(env, C.ContextSpace({"gravity": C.Scale(0.5, 2.0)}))  # others stay
    with pytest.raises(ValueError, match="MJX's 'warp' implementation.*impl='jax'"):
        make_contextual(
            "playground/CartpoleBalance",
            C.ContextSpace({"gravity": C.Scale(0.5, 2.0)}),
            impl="warp",
        )


@pytest.mark.parametrize(
    "env, kwargs, message",
    [
        ("playground/NoSuchEnv", {}, "valid names: AcrobotSwingup"),
        ("playground/CartpoleBalance", {"backend": "generalized"}, "run on MJX"),
        # read only by Playground's Brax training wrapper: the env would step once anyway
        ("playground/CartpoleBalance", {"action_repeat": 4}, "action_repeat=4, which only"),
        # Playground rounds ctrl_dt / sim_dt: 0.025 s asked, 2 steps of 0.01 s simulated
        ("playground/CartpoleBalance", {"ctrl_dt": 0.025}, r"= 2 physics steps .* 0\.02 s"),
        ("playground/CartpoleBalance", {"ctrl_dt": 0.004}, "= 0 physics steps"),  # frozen
    ],
)
def test_playground_bad_names(env, kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_contextual(env, C.ContextSpace({"gravity": C.Uniform(5, 15)}), **kwargs)


def test_raw_paths_mjx_reads_in_this_model_are_accepted():
    """The table of fields no backend reads was measured on Brax's own envs, whose
    joints have no frictionloss: MJX reads dof_frictionloss only where a model loads
    it > 0, as this walker's left hip does. Such paths were refused on a plain
    mjx.Model as "never read"; they are accepted and written into the model."""
    space = C.ContextSpace(
        {"dof_frictionloss[2]": C.Uniform(0.1, 0.5), "dof_solref[2, 0]": C.Uniform(0.05, 0.3)}
    )
    env = make_contextual(_walker(), space)
    model = env.binding.apply({"dof_frictionloss[2]": 0.4, "dof_solref[2, 0]": 0.25})
    assert float(model.dof_frictionloss[2]) == pytest.approx(0.4)
    assert float(model.dof_solref[2, 0]) == pytest.approx(0.25)
    # Brax's own envs keep the measured table: hopper's joints load no frictionloss.
    with pytest.raises(ValueError, match="never reads 'dof_frictionloss'"):
        make_contextual(
            "hopper", C.ContextSpace({"dof_frictionloss": C.Uniform(0.1, 0.5)}), backend="mjx"
        )


# A box sliding on a frictionless floor (condim 1) beside a post welded to the world.
STATIC_XML = """
<mujoco>
  <option timestep="0.01"/>
  <worldbody>
    <geom name="floor" type="plane" size="5 5 .1" condim="1" friction="0.1"/>
    <body name="post" pos="2 2 0.5">
      <geom name="post" type="box" size=".1 .1 .5" contype="0" conaffinity="0" mass="3"/>
    </body>
    <body name="box" pos="0 0 .1">
      <joint name="x" type="slide" axis="1 0 0"/><joint name="y" type="slide" axis="0 1 0"/>
      <joint name="z" type="slide" axis="0 0 1"/>
      <geom name="box" type="box" size=".1 .1 .1" mass="1" condim="1"/>
    </body>
  </worldbody>
  <actuator>
    <motor joint="x" gear="5" ctrlrange="-1 1"/><motor joint="y" gear="5" ctrlrange="-1 1"/>
  </actuator>
</mujoco>"""


def test_check_env_refuses_contexts_that_move_only_derived_quantities():
    """A static post's mass (like a frictionless contact's friction) changes MJX's
    derived fields (the post's inertia in world frame) but no motion: check_env
    compared every pipeline_state leaf and passed it. The canonical `mass[post]` is
    now refused when the env is built (no joint moves the post); the raw field, which
    writes exactly what it names, is left to check_env. An env that observes the
    model's centre of mass (which the post's mass moves) passed it too: a change in
    what the env observes or rewards alone is now refused by a message of its own."""

    def observe(data, task):  # the whole model's centre of mass too
        return jnp.concatenate([_observe(data, task), data.subtree_com[0]])

    robot = MjcfEnv(STATIC_XML, observe=observe, reward=_reward, n_frames=2)
    space = C.ContextSpace(
        {"body_mass[1]": C.Scale(0.5, 2.0), "body_inertia[1]": C.Scale(0.5, 2.0)}
    )
    env = make_contextual(robot, space, episode_length=5)
    with pytest.raises(ContractError) as refused:
        check_env(env, num_envs=4, max_steps=12)
    message = str(refused.value)
    assert "context 'body_mass[1]' changes only what the env observes or rewards" in message
    assert "context 'body_inertia[1]' changes nothing a step simulates" in message
    with pytest.raises(ValueError, match="bodies post would not change: it is welded"):
        make_contextual(robot, C.ContextSpace({"mass[post]": C.Scale(0.5, 2.0)}))


# A ball pushed along x at a height (HEIGHT) above a floor: at 0.5 it never touches
# it, at 0.099 (radius 0.1) it slides on it. A sled rests on the floor throughout; a
# drone (geom 3) hovers at 0.5 throughout.
HOVER_XML = """
<mujoco>
  <option timestep="0.01"/>
  <worldbody>
    <geom name="floor" type="plane" size="5 5 .1"/>
    <body name="ball" pos="0 0 HEIGHT">
      <joint name="x" type="slide" axis="1 0 0"/>
      <geom name="ball" type="sphere" size=".1" mass="1"/>
    </body>
    <body name="sled" pos="2 0 .099">
      <joint name="sled_x" type="slide" axis="1 0 0"/>
      <geom name="sled" type="box" size=".1 .1 .1" mass="1"/>
    </body>
    <body name="drone" pos="-2 0 .5">
      <joint name="drone_x" type="slide" axis="1 0 0"/>
      <geom name="drone" type="sphere" size=".1" mass="1"/>
    </body>
  </worldbody>
  <actuator><motor joint="x" gear="5" ctrlrange="-1 1"/></actuator>
</mujoco>"""


def test_check_env_says_a_contact_context_was_never_exercised_where_nothing_touched():
    """A friction reaches the physics only where a contact of its geoms is active. A
    rollout in which the ball never touched anything (BallInCup's ball, which rarely
    reaches its cup, under other contexts) was reported as a step that ignores the
    friction, though the sled's contact with the floor is active throughout; it is
    now reported as a context never exercised, and the same ball on the floor passes.
    A quantity (the ball's) and a raw path (the drone's) alike, in one check (check_env
    finds their geoms apart: had it taken the sled's, it would have said the friction
    changes nothing). The ball on the floor with the quantity alone and the sled's
    mass: an MJCF env passes the whole contract, trials of 2 episodes ending (each
    check compiles a rollout, about 8 s)."""
    names = ["friction[ball]", "geom_friction[3, 0]"]

    def env(height, varied):
        ball = MjcfEnv(HOVER_XML.replace("HEIGHT", height), observe=_observe, reward=_reward)
        space = C.ContextSpace({name: C.Scale(0.5, 2.0) for name in varied})
        return make_contextual(ball, space, episode_length=5, episodes_per_trial=2)

    with pytest.raises(ContractError) as refused:
        check_env(env("0.5", names), num_envs=4, max_steps=12)
    for name in names:
        assert re.search(
            rf"'{re.escape(name)}' was never exercised: .* in "
            r"none of the \d+ states stepped was a contact of its geoms active",
            str(refused.value),
        ), str(refused.value)
    report = check_env(env("0.099", [names[0], "mass[sled]"]), num_envs=4, max_steps=12)
    assert report["contexts_reaching"] == 2 and report["trials_ended"] > 0


# A pendulum resting on its joint limit: how far it sinks past the limit is set by
# the limit's regularisation, which MuJoCo derives from dof_invweight0 (mj_setConst).
PENDULUM_XML = """<mujoco><option timestep="0.002"/><worldbody>
<body name="arm"><joint name="hinge" type="hinge" axis="0 1 0" limited="true" range="-10 10"
  armature="{armature}"/>
<geom type="capsule" fromto="0 0 0 0.5 0 0" size="0.02" mass="1" contype="0" conaffinity="0"/>
</body></worldbody></mujoco>"""


def test_an_armature_context_simulates_the_model_mujoco_compiles():
    """armature 0 -> 1 on a pendulum resting on its joint limit: every episode of the
    trial runs as MJX runs the model MuJoCo compiles with armature 1, constraint
    weights included (`state.info[DERIVED]`, computed when the context is drawn and
    carried into the trial's second episode). With the loaded weights kept (what
    metarl did before 2026-11-26), it sank 7x as far past the limit."""
    pendulum = MjcfEnv(
        PENDULUM_XML.format(armature=0),
        observe=lambda data, task: data.qpos,
        reward=lambda data, action, next_data, task: jnp.float32(0),
        n_frames=50,
        reset_noise=0.0,
    )
    env = make_contextual(
        pendulum,
        C.ContextSpace({"armature": C.Uniform(0.5, 1.5)}),
        episode_length=12,
        episodes_per_trial=2,
    )

    @jax.jit
    def angles(ranges):  # both episodes of one trial: the last states of each
        s = env.reset(jax.random.key(0), ranges)
        s, q = jax.lax.scan(lambda s, _: (s := env.step(s, jnp.zeros(0)), s), s, None, 23)
        return q.pipeline_state.qpos[jnp.array([10, 22]), 0], q.info[DERIVED]

    got, derived = angles(env.space.pinned({"armature": 1.0}))
    model = mujoco.MjModel.from_xml_string(PENDULUM_XML.format(armature=1.0))
    m = mjx.put_model(model)
    data = jax.jit(lambda d: jax.lax.fori_loop(0, 11 * 50, lambda _, d: mjx.step(m, d), d))(
        mjx.make_data(m)
    )
    np.testing.assert_allclose(got, float(data.qpos[0]), rtol=1e-6)
    sunk = float(data.qpos[0]) - np.deg2rad(10)
    assert 5e-5 < sunk < 2e-4  # resting past the limit, as the compiled model does
    np.testing.assert_allclose(derived["dof_invweight0"][:, 0], model.dof_invweight0[0], rtol=1e-7)


def test_a_default_mass_context_is_the_loaded_playground_model_under_jit():
    """FingerSpin's masses: XLA divides m / m0 as m * (1 / m0), 1 + 2e-10 for some, and
    the derived inverse weights then came out 5e-4 off the loaded model's."""
    from metarl.envs import sources

    source = sources.PlaygroundSource(sources.load_playground("FingerSpin", {}))
    space = C.ContextSpace({"mass": C.Fixed(1.0, relative=True, per_element=True)})
    binding = C.bind(space, source.model, "mjx", {}, source.stale)
    model = jax.jit(binding.apply)(binding.default_context())
    for field in ("body_mass", "body_inertia", "body_invweight0", "dof_invweight0"):
        np.testing.assert_array_equal(getattr(model, field), getattr(source.model, field), field)


def test_a_raw_joint_range_is_refused_on_joints_mjx_builds_no_limit_for():
    """jnt_range on a joint the model does not mark limited was written and never read
    (the same 80 actions, max |dqpos| 0.0)."""
    free = MjcfEnv(SLIDE_XML, observe=_observe, reward=_reward)
    for path in ("jnt_range[2, 1]", "jnt_range[:, 0]", "jnt_range"):
        with pytest.raises(ValueError, match=r"joints \[.*\] are not limited"):
            make_contextual(free, C.ContextSpace({path: C.Uniform(0.05, 0.2)}))
    xml = SLIDE_XML.replace(
        'name="z" type="slide"', 'name="z" type="slide" limited="true" range="-1 0.3"'
    )
    env = make_contextual(
        MjcfEnv(xml, observe=_observe, reward=_reward),
        C.ContextSpace({"jnt_range[:, 1]": C.Uniform(0.05, 0.2)}),  # z's limit is read
    )

    def height(top):  # the box pushed up against z's upper limit
        sys = env.binding.apply({"jnt_range[:, 1]": jnp.full(3, top, jnp.float32)})
        data = mjx.make_data(sys).replace(qvel=jnp.asarray([0.0, 0.0, 2.0]))
        step = jax.jit(mjx.step)
        for _ in range(30):
            data = step(sys, data)
        return float(data.qpos[2])

    assert height(0.2) - height(0.05) > 0.1


def test_a_raw_fluid_path_is_refused_where_mjx_keeps_the_fluid_model_off():
    """A raw 'opt.viscosity' on a model that loads none was written and never read: MJX
    fixes has_fluid_params when it loads the model (a Playground cartpole's check_env:
    "changes nothing a step simulates"). The canonical name switches it on."""
    still = MjcfEnv(SLIDE_XML, observe=_observe, reward=_reward)
    for field, canonical in (
        ("opt.viscosity", "viscosity"),
        ("opt.density", "density"),
        ("opt.wind[0]", "viscosity' or 'density"),  # wind acts through the fluid model
    ):
        with pytest.raises(ValueError, match=f"vary the canonical '{canonical}' \\(in this"):
            make_contextual(still, C.ContextSpace({field: C.Uniform(0.5, 3.0)}))
    # a canonical entry switches the fluid model on for the raw paths, before it or after
    windy = C.ContextSpace({"opt.wind[0]": C.Uniform(0.0, 5.0), "density": C.Uniform(0.5, 3.0)})
    env = make_contextual(still, windy)
    sys = env.binding.apply({"opt.wind[0]": jnp.float32(5.0), "density": jnp.float32(1.2)})
    data = mjx.make_data(sys)
    calm = sys.replace(opt=sys.opt.replace(wind=jnp.zeros(3)))
    forward = jax.jit(mjx.forward)  # one compilation for both models
    drag = forward(sys, data).qfrc_passive - forward(calm, data).qfrc_passive
    assert float(jnp.abs(drag).max()) > 1e-3
    # a model that loads a viscosity simulates the raw path's values
    fluid = make_contextual(
        MjcfEnv(XML, observe=_observe, reward=_reward),
        C.ContextSpace({"opt.viscosity": C.Uniform(0.5, 3.0)}),
    )

    def moved(viscosity):
        sys = fluid.binding.apply({"opt.viscosity": jnp.float32(viscosity)})
        data = mjx.make_data(sys).replace(qvel=jnp.ones(sys.nv))
        return jax.jit(mjx.step)(sys, data).qvel

    assert float(jnp.max(jnp.abs(moved(0.5) - moved(3.0)))) > 1e-3
