"""Every canonical context reaches the physics, on every backend that supports it.

One env per backend holds *every* supported quantity as a `Fixed` context;
a perturbation is a new set of ranges passed to the same compiled rollout, so
each backend compiles once.
"""

import functools
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import perturbations
import pytest
from brax import envs as brax_envs

from metarl import contexts as C
from metarl.contexts.quantities import QUANTITIES
from metarl.envs import CONTEXT, TRIAL, make_contextual
from metarl.envs.toy import Puck

STEPS = 40
PERTURB = perturbations.PERTURB
NEEDS_MODEL_FEATURE = {"frictionloss", "actuator_kp", "actuator_kd", "pair_friction"}
# The puck's ball, its centre of mass at its origin, is compiled as a simple body, which
# refuses com_offset (generalized and mjx): test_com_offset_moves_the_pendulums_pole and
# tests/test_model_envs.py's walker cover it
NOT_ON_THE_PUCK = {"generalized": {"com_offset"}, "mjx": {"com_offset"}}


def test_every_canonical_quantity_has_a_perturbation():
    assert sorted(PERTURB) == sorted(QUANTITIES)


def _supported(backend):
    skip = NEEDS_MODEL_FEATURE | NOT_ON_THE_PUCK.get(backend, set())
    return [n for n, q in QUANTITIES.items() if backend in q.backends and n not in skip]


def _space(values: dict, backend: str) -> C.ContextSpace:
    """Every quantity in `values` (those `backend` supports), Fixed at its value."""
    return C.ContextSpace(
        {
            n: C.Fixed(values[n], relative=PERTURB[n][0], per_element=PERTURB[n][1])
            for n in _supported(backend)
            if n in values
        }
    )


class Rollouts:
    """A Puck env with every supported quantity fixed; rollout(ranges) compiled once.
    The same program steps the plain Puck beside it from the same start
    (`_beside_plain`): `plain` holds both at the defaults' ranges."""

    def __init__(self, backend):
        self.backend = backend
        probe = make_contextual(
            Puck(backend=backend), _space(_placeholders(Puck(backend=backend), backend), backend)
        )
        self.defaults = probe.default_context()
        self.env = make_contextual(Puck(backend=backend), _space(self.defaults, backend))
        actions = jnp.sin(jnp.arange(STEPS) / 5.0)[:, None]
        run = _beside_plain(self.env, Puck(backend=backend), actions)
        self.rollout = jax.jit(lambda ranges: run(jax.random.key(0), ranges))
        self.plain = jax.device_get(self.rollout(self.env.space))
        self.reference = np.asarray(self.plain[2])

    def perturbed(self, name):
        values = dict(self.defaults)
        values[name] = PERTURB[name][2](np.asarray(self.defaults[name]))
        return np.asarray(self.rollout(_space(values, self.backend))[2])


def _beside_plain(env, plain, actions):
    """run(key, ranges): the contextual env and the plain one stepped side by side from
    the contextual reset's state, in one program -> (q, plain q, obs, plain obs, done)
    per step. In one program, as two compiled apart may round apart."""

    def run(key, ranges):
        start = env.reset(key, ranges)
        base = start.replace(
            info={k: v for k, v in start.info.items() if k not in (CONTEXT, TRIAL)}
        )

        def body(carry, a):
            s, b = carry
            s, b = env.step(s, a), plain.step(b, a)
            return (s, b), (s.pipeline_state.q, b.pipeline_state.q, s.obs, b.obs, s.done)

        return jax.lax.scan(body, (start, base), actions)[1]

    return run


_cache = {}


def rollouts(backend) -> Rollouts:
    if backend not in _cache:
        _cache[backend] = Rollouts(backend)
    return _cache[backend]


CASES = [(b, n) for b in C.BACKENDS for n in _supported(b)]


@pytest.mark.parametrize("backend,name", CASES, ids=[f"{b}-{n}" for b, n in CASES])
def test_context_changes_the_trajectory(backend, name):
    r = rollouts(backend)
    out = r.perturbed(name)
    diff = np.nanmax(np.abs(out - r.reference))
    assert diff > 1e-3, f"{name} on {backend} changed the trajectory by only {diff}"


@pytest.mark.parametrize("backend", ["generalized", "mjx"])
def test_stronger_gravity_falls_faster(backend):
    r = rollouts(backend)
    stronger = r.perturbed("gravity")  # x1.5
    z_ref, z_strong = r.reference[3, 1], stronger[3, 1]  # obs[1] is the ball's height
    assert z_strong < z_ref < 0.0


@pytest.mark.parametrize("backend", ["generalized", "mjx"])
def test_heavier_ball_accelerates_less(backend):
    r = rollouts(backend)
    heavier = r.perturbed("mass")  # x2, same motor force
    assert 0.0 < heavier[10, 0] < 0.8 * r.reference[10, 0]


def test_braxs_swimmer_steps_and_a_thicker_fluid_slows_its_joints():
    """Brax's swimmer loads a viscosity, which switches Brax's fluid model on, and that
    model called jnp.clip(a_min=...), which JAX 0.10 refuses: its first step raised
    TypeError (`metarl.brax_fluid`). It steps now, plain and contextual, and the
    viscosity a context draws acts: under the same actions its joints turn slower in a
    thicker fluid."""
    plain = brax_envs.get_environment("swimmer")
    assert plain.sys.enable_fluid and float(plain.sys.viscosity) == pytest.approx(0.1)
    first = jax.jit(lambda k: plain.step(plain.reset(k), jnp.ones(plain.action_size)))
    assert np.all(np.isfinite(np.asarray(first(jax.random.key(0)).pipeline_state.qd)))

    env = make_contextual("swimmer", C.ContextSpace({"viscosity": C.Scale(0.1, 10.0)}))
    actions = jnp.stack([jnp.sin(jnp.arange(40) / 4.0), jnp.cos(jnp.arange(40) / 4.0)], -1)

    @jax.jit
    def joint_speed(ranges):
        def body(s, a):
            s = env.step(s, a)
            return s, jnp.abs(s.pipeline_state.qd[3:])

        return jax.lax.scan(body, env.reset(jax.random.key(0), ranges), actions)[1].mean()

    speeds = [
        float(joint_speed(C.ContextSpace({"viscosity": C.Fixed(s, relative=True)})))
        for s in (0.0, 1.0, 10.0)  # x the loaded 0.1
    ]
    assert speeds[0] > speeds[1] > speeds[2], speeds


def test_importing_metarl_starts_no_jax_backend():
    """The fix above is installed when metarl is imported, and reads jnp.clip's signature:
    a call would start JAX's backends there, after which a program can no longer choose
    them (`jax.distributed.initialize` must come before any computation)."""
    imports = "import curricula, metarl.envs, metarl.agents.ppo, metarl.experiment, metarl.probe"
    check = "from jax._src import xla_bridge; assert not xla_bridge.backends_are_initialized()"
    subprocess.run([sys.executable, "-c", f"{imports}; {check}"], check=True, timeout=300)


@pytest.mark.parametrize("backend", ["generalized", "mjx"])
def test_com_offset_moves_the_pendulums_pole(backend):
    """The pole's centre of mass 5 cm higher: it topples another way."""
    space = C.ContextSpace({"com_offset[pole]": C.Fixed(0.0, per_element=True)})
    env = make_contextual("inverted_pendulum", space, backend=backend)

    @jax.jit
    def rollout(ranges):
        state = env.reset(jax.random.key(3), ranges)
        body = lambda s, _: (env.step(s, jnp.zeros(1)),) * 2  # noqa: E731
        return jax.lax.scan(body, state, None, length=STEPS)[1].obs

    def at(offset):  # ranges of one shape: one compiled rollout
        return C.ContextSpace({"com_offset[pole]": C.Fixed(offset, per_element=True)})

    offset = np.zeros((1, 3), np.float32)
    offset[0, 2] = 0.05
    moved = rollout(at(offset))
    assert np.abs(np.asarray(moved - rollout(at(np.zeros((1, 3), np.float32))))).max() > 1e-3
    assert rollout._cache_size() == 1


@pytest.fixture(scope="module")
def pendulum_fall_time():
    space = C.ContextSpace({"gravity": C.Fixed(9.81)})
    env = make_contextual("inverted_pendulum", space, backend="generalized")

    @jax.jit
    def fall_time(ranges):
        state = env.reset(jax.random.key(3), ranges)

        def body(s, _):
            s = env.step(s, jnp.zeros(1))
            return s, s.done

        done = jax.lax.scan(body, state, None, length=200)[1]
        return jnp.argmax(done)

    return fall_time


def test_stronger_gravity_topples_the_pendulum_sooner(pendulum_fall_time):
    normal = int(pendulum_fall_time(C.ContextSpace({"gravity": C.Fixed(9.81)})))
    strong = int(pendulum_fall_time(C.ContextSpace({"gravity": C.Fixed(20.0)})))
    assert 0 < strong < normal


@pytest.mark.parametrize("env_name", ["puck", "pendulum"])
@pytest.mark.parametrize("backend", ["generalized", "mjx"])
def test_default_context_reproduces_plain_brax(env_name, backend):
    """Every quantity Fixed at its default: the same trajectory as the plain env. The
    puck's is the program test_context_changes_the_trajectory runs (`Rollouts`)."""
    if env_name == "puck":
        q_ctx, q_plain, obs_ctx, obs_plain, done = rollouts(backend).plain
    else:
        pendulum = functools.partial(
            brax_envs.get_environment, "inverted_pendulum", backend=backend
        )
        plain = pendulum()
        placeholders = _space(_placeholders(plain, backend), backend)
        defaults = make_contextual(pendulum(), placeholders).default_context()
        env = make_contextual(pendulum(), _space(defaults, backend))
        actions = 0.3 * jnp.sin(jnp.arange(30) / 4.0)[:, None]
        run = _beside_plain(env, plain, actions)
        q_ctx, q_plain, obs_ctx, obs_plain, done = jax.jit(run)(jax.random.key(1), env.space)
    # Compare up to the first episode end: there the contextual env resets itself.
    n = int(np.argmax(np.asarray(done))) if np.any(done) else len(done)
    assert n >= 5
    np.testing.assert_array_equal(np.asarray(q_ctx)[:n], np.asarray(q_plain)[:n])
    np.testing.assert_array_equal(np.asarray(obs_ctx)[:n], np.asarray(obs_plain)[:n])


@pytest.mark.parametrize("backend", ["positional", "spring"])
def test_actuator_gain_scales_the_gear_the_backend_simulates(backend):
    """Brax's reacher sets its gear to 25 on positional and spring (its MJCF says 200),
    in the copy those backends read: the default context simulates the env itself,
    and a scale of 2 simulates gear 50."""
    plain = brax_envs.get_environment("reacher", backend=backend)
    space = C.ContextSpace({"actuator_gain": C.Scale(0.5, 2.0)})
    env = make_contextual("reacher", space, backend=backend)
    gear = np.asarray(plain.sys.actuator.gear)
    np.testing.assert_array_equal(gear, [25.0, 25.0])
    for scale in (1.0, 2.0):
        sys = env.binding.apply({"actuator_gain": jnp.float32(scale)})
        np.testing.assert_array_equal(np.asarray(sys.actuator.gear), scale * gear)
    actions = jnp.stack([jnp.sin(jnp.arange(8) / 2.0), jnp.cos(jnp.arange(8) / 3.0)], -1)

    @jax.jit
    def both(ranges):
        start = env.reset(jax.random.key(1), ranges)
        base = start.replace(
            info={k: v for k, v in start.info.items() if k not in (CONTEXT, TRIAL)}
        )

        def body(carry, a):
            s, b = carry
            s, b = env.step(s, a), plain.step(b, a)
            return (s, b), (s.pipeline_state.q, b.pipeline_state.q)

        return jax.lax.scan(body, (start, base), actions)[1]

    q_ctx, q_plain = both(space.pinned({"actuator_gain": 1.0}))
    np.testing.assert_array_equal(np.asarray(q_ctx), np.asarray(q_plain))
    q_double, _ = both(space.pinned({"actuator_gain": 2.0}))
    assert np.abs(np.asarray(q_double) - np.asarray(q_plain)).max() > 1e-3


def _placeholders(env, backend):
    """Values of the right shapes, to build a probe env that reports the true defaults,
    for the quantities the env can take: a name without elements covers the live ones
    (inverted_pendulum's geoms collide with nothing, so it takes no friction or size)."""
    out = {}
    for n in _supported(backend):
        q = QUANTITIES[n]
        default = np.asarray(q.default(env.sys))
        if q.live is not None:
            live = np.asarray(q.live(env.sys, backend))
            if not live.any():
                continue
            default = default[live]
        out[n] = default if PERTURB[n][1] else 1.0
    return out


def test_raw_path_reaches_the_physics():
    space = C.ContextSpace({"geom_friction[:, 0]": C.Fixed(0.5, per_element=False)})
    env = make_contextual(Puck(), space)

    @jax.jit
    def final_x(ranges):
        s = env.reset(jax.random.key(0), ranges)
        s = jax.lax.fori_loop(0, 30, lambda i, s: env.step(s, jnp.ones(1)), s)
        return s.obs[0], s.info[CONTEXT]["geom_friction[:, 0]"]

    x_ref, f_ref = final_x(space)
    x_slick, f_slick = final_x(C.ContextSpace({"geom_friction[:, 0]": C.Fixed(0.05)}))
    assert float(f_ref) == 0.5 and float(f_slick) == pytest.approx(0.05)
    assert abs(float(x_slick) - float(x_ref)) > 1e-3
