"""ContextualEnv: the contract on several envs and backends, trials, truncation,
visible contexts, range replacement without recompiling, non-finite states."""

import json
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from brax.envs.base import State
from conftest import load_script

from metarl import contexts as C
from metarl.compilation import count_compilations
from metarl.envs import (
    CONTEXT,
    RESET_STRATEGIES,
    TRIAL,
    ContractError,
    check_env,
    make_contextual,
)
from metarl.envs.autoreset import POOLED
from metarl.envs.contextual import MAX_VALUE
from metarl.envs.toy import Puck

PENDULUM_SPACE = C.ContextSpace(
    {
        "gravity": C.Uniform(6.0, 14.0),
        "mass": C.Scale(0.5, 1.5, per_element=True),
        "actuator_gain": C.Choice([-1.0, 1.0], relative=True),
    }
)


@pytest.mark.parametrize(
    "name,backend,space,kwargs",
    [
        ("inverted_pendulum", "generalized", PENDULUM_SPACE, {"episodes_per_trial": 2}),
        ("inverted_pendulum", "mjx", PENDULUM_SPACE, {"visible_context": True}),
        (
            "hopper",
            "generalized",
            C.ContextSpace(
                {  # bounds per body: check_env drew these with shape () and crashed
                    "mass": C.Scale([0.7, 0.8, 0.8, 0.9], [1.3, 1.2, 1.2, 1.1], per_element=True),
                    "friction": C.Uniform(0.5, 1.5),
                    # std 0 draws its mean in every env: check_env demanded that they differ
                    "gravity": C.TruncatedNormal(12.0, 0.0, 5.0, 15.0),
                }
            ),
            {"episode_length": 100},
        ),
        (
            "puck",
            "spring",
            C.ContextSpace({"elasticity": C.Uniform(0.0, 0.5), "gravity": C.Uniform(5.0, 12.0)}),
            {"episode_length": 20, "visible_context": "privileged"},
        ),
        (  # spring keeps the masses in its state from the reset; its step reads them now
            "walker2d",
            "spring",
            C.ContextSpace({"mass": C.Scale(0.5, 2.0)}),
            {"episode_length": 50},
        ),
    ],
    ids=[
        "pendulum-generalized",
        "pendulum-mjx",
        "hopper-generalized",
        "puck-spring",
        "walker-spring",
    ],
)
def test_contract(name, backend, space, kwargs):
    env = Puck(backend=backend) if name == "puck" else name
    env = make_contextual(env, space, **({} if name == "puck" else {"backend": backend}), **kwargs)
    report = check_env(env, num_envs=8, max_steps=120)
    assert report["trials_ended"] > 0
    assert report["contexts_reaching"] == len(space)


def test_observation_size_compiles_nothing():
    """Brax's own `observation_size` runs reset op by op (hundreds of one-op
    compilations, 17 s on hopper); the contextual env only traces it. The size
    itself is checked against real resets by `check_env` above."""
    env = make_contextual("hopper", PENDULUM_SPACE, visible_context=True)
    with count_compilations() as compiles:
        size = env.observation_size
    assert compiles.count == 0
    assert size == 11 + env.binding.context_size


def test_observation_size_under_another_prng_implementation():
    """A raw key of the PRNG in use (rbg: 4 words, threefry: 2) traces the reset."""
    before = jax.config.jax_default_prng_impl
    jax.config.update("jax_default_prng_impl", "rbg")
    try:
        env = make_contextual("puck", C.ContextSpace({"mass": C.Scale(0.5, 2.0)}))
        assert env.observation_size == 6
    finally:
        jax.config.update("jax_default_prng_impl", before)


class _CachesItsSystem(Puck):
    """Steps a System cached at construction: the drawn contexts never reach it."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self._frozen = self.sys

    def pipeline_step(self, ps, action):
        sys, self.sys = self.sys, self._frozen
        try:
            return super().pipeline_step(ps, action)
        finally:
            self.sys = sys


class _ResetReadsStepCaches(_CachesItsSystem):
    """Steps a cached System, but its reset observes the drawn mass: only the
    observations an auto-reset returns follow the context."""

    def reset(self, rng):
        drawn, self.sys = self.sys, self._frozen
        try:
            state = super().reset(rng)
        finally:
            self.sys = drawn
        return state.replace(obs=state.obs.at[0].add(drawn.link.inertia.mass[0]))


class _ResetSettlesStepCaches(_CachesItsSystem):
    """Steps a cached System, but its reset places the ball where the drawn gravity
    would have it settle: the physics of every auto-reset, and so of every step
    after it, follows the context; no step reads it."""

    def reset(self, rng):
        sag = 0.01 * self.sys.gravity[2]  # the drawn System's
        ps = self.pipeline_init(self.sys.init_q.at[1].add(sag), jnp.zeros(self.sys.qd_size()))
        zero = jnp.zeros(())
        return State(ps, self._obs(ps), zero, zero, {}, {})


STEP_IGNORES_IT = "changes nothing a step simulates: .* the step ignores it"


def test_check_env_catches_a_context_that_changes_nothing():
    """A physical context must change what a step simulates, not only the resets
    (whose physics and observations reach every later step of a whole rollout): a reset
    that settles the ball where the drawn gravity would have it, under a step that
    ignores gravity, is named (spring: the backend that compiles fastest)."""
    env = make_contextual(
        _ResetSettlesStepCaches(backend="spring"),
        C.ContextSpace({"gravity": C.Scale(0.1, 3.0)}),
        episode_length=5,
    )
    with pytest.raises(ContractError, match=f"context 'gravity' {STEP_IGNORES_IT}"):
        check_env(env, num_envs=4, max_steps=12)


def test_check_env_names_every_context_that_changes_nothing_at_once():
    """Each check_env compiles a rollout: it named only the first context that did not
    reach the simulation, so a user fixed one and compiled again to learn of the next.
    One env, each context failing its own way: a System cached for the steps ignores
    gravity; the mass only the reset observes (an auto-reset's observations follow it,
    no step simulates it); a task parameter declared and never read. The goal the puck
    observes reaches its observations and is not named."""
    space = {
        "gravity": C.Scale(0.1, 3.0),
        "goal": C.Uniform(-1.0, 1.0),
        "mass": C.Scale(0.5, 2),
        "unused": C.Uniform(-1.0, 1.0),
    }

    class CachedObservingItsGoal(_ResetReadsStepCaches):
        task_params = {"goal": 1.0, "unused": 1.0}  # "unused": declared, never read

        def _obs(self, ps):
            return super()._obs(ps).at[0].add(self.task_params["goal"])

    env = make_contextual(CachedObservingItsGoal(), C.ContextSpace(space), episode_length=5)
    with pytest.raises(ContractError) as refused:
        check_env(env, num_envs=4, max_steps=12)
    message = str(refused.value)
    assert message.startswith(
        "3 of the 4 contexts checked ('gravity', 'goal', 'mass', 'unused') do not reach the "
        "simulation:"
    )
    for name in ("gravity", "mass"):
        assert re.search(f"\n- context '{name}' {STEP_IGNORES_IT}", message), message
    assert re.search(
        "\n- context 'unused' changes nothing: .* never uses this task parameter", message
    ), message
    assert "'goal' changes" not in message


def test_check_env_passes_a_choice_of_two_values_drawn_alike_by_chance():
    """A Choice of two motor signs is the same in 2 envs half the time: check_env's
    reset clause does not call that a shared context (seed 0 drew one sign in both
    envs), but still refuses a continuous range drawn alike."""
    from metarl.envs import check

    space = C.ContextSpace(
        {"actuator_gain": C.Choice([-1.0, 1.0], relative=True), "gravity": C.Scale(0.5, 2.0)}
    )
    env = make_contextual("puck", space, episode_length=10)
    state = jax.jit(jax.vmap(env.reset))(jax.random.split(jax.random.key(0), 2))
    drawn = state.info[CONTEXT]["actuator_gain"]
    assert float(drawn[0]) == float(drawn[1])  # the draw the old check refused
    check._check_reset(env, state, 2)
    shared = jax.tree.map(lambda x: jnp.concatenate([x[:1], x[:1]]), state)  # env 0 twice
    with pytest.raises(ContractError, match="'gravity' is identical in all 2 envs"):
        check._check_reset(env, shared, 2)
    assert check._p_all_equal(env, "actuator_gain", 2) == 0.5
    assert check._p_all_equal(env, "gravity", 2) == 0.0


def test_check_env_catches_a_broken_env():
    """A context that is shared by all envs violates the contract."""
    env = make_contextual("inverted_pendulum", PENDULUM_SPACE)
    broken_reset = env.reset
    env.reset = lambda rng, ranges=None: broken_reset(jax.random.key(0), ranges)
    with pytest.raises(ContractError, match="identical in all"):
        check_env(env, num_envs=4, max_steps=20)


# A range checked inside jit fails as its program runs (`Binding.check_traced`)
RANGE_ERRORS = (ValueError, jax.errors.JaxRuntimeError)


@pytest.fixture(scope="module")
def pendulum():
    """Episodes of 5 steps, trials of 3 episodes, gravity visible in the observation."""
    space = C.ContextSpace({"gravity": C.Uniform(5.0, 15.0)})
    env = make_contextual(
        "inverted_pendulum", space, episode_length=5, episodes_per_trial=3, visible_context=True
    )
    n = 6

    @jax.jit
    def rollout(key, ranges, actions):
        state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(key, n), ranges)

        def body(s, a):
            s = jax.vmap(env.step)(s, jnp.broadcast_to(a, (n, 1)))
            t = s.info[TRIAL]
            return s, (
                s.obs,
                s.done,
                t.truncated,
                t.new_trial,
                s.info[CONTEXT]["gravity"],
                t.final_obs,
            )

        return jax.lax.scan(body, state, actions)

    return env, rollout


def test_time_limit_truncates_and_trials_span_episodes(pendulum):
    env, rollout = pendulum
    _, (obs, done, truncated, new_trial, gravity, final_obs) = rollout(
        jax.random.key(0), env.space, jnp.zeros((30, 1))
    )
    done, truncated, new_trial = np.asarray(done), np.asarray(truncated), np.asarray(new_trial)
    # Zero action keeps the pole up for 5 steps: every episode is truncated at step 5.
    assert np.all(done[4::5] == 1) and done.sum() == done[4::5].sum()
    np.testing.assert_array_equal(truncated, done)
    # A new trial every 3 episodes = every 15 steps; gravity changes only there.
    np.testing.assert_array_equal(new_trial[14::15], 1)
    assert new_trial.sum() == new_trial[14::15].sum()
    g = np.asarray(gravity)
    assert np.all(g[14] != g[13]) and np.all(g[4] == g[3]) and np.all(g[9] == g[8])
    # Visible context: the last observation entry is the normalised gravity.
    np.testing.assert_allclose(np.asarray(obs)[..., -1], (g - 10.0) / 5.0, rtol=1e-5)
    # The final observation of an episode is not the reset observation that replaces it.
    assert not np.allclose(np.asarray(final_obs)[4], np.asarray(obs)[4])


def test_termination_is_not_truncation(pendulum):
    env, rollout = pendulum
    _, (_, done, truncated, _, _, _) = rollout(jax.random.key(0), env.space, jnp.ones((30, 1)))
    done, truncated = np.asarray(done), np.asarray(truncated)
    terminated = done * (1 - truncated)
    assert terminated[:4].sum() > 0  # full throttle topples the pole before the time limit
    assert np.all(truncated <= done)


def test_new_ranges_apply_without_recompiling(pendulum):
    env, rollout = pendulum
    rollout(jax.random.key(0), env.space, jnp.zeros((30, 1)))  # compiled
    narrow = C.ContextSpace({"gravity": C.Uniform(20.0, 20.5)})
    with count_compilations() as compiles:
        _, (*_, gravity, _) = rollout(jax.random.key(1), narrow, jnp.zeros((30, 1)))
        jax.block_until_ready(gravity)
    assert compiles.count == 0
    g = np.asarray(gravity)
    assert np.all((g >= 20.0) & (g <= 20.5))


def test_set_ranges_reaches_the_next_trial():
    env = make_contextual(
        "inverted_pendulum", C.ContextSpace({"gravity": C.Uniform(5.0, 15.0)}), episode_length=3
    )
    state = jax.jit(jax.vmap(env.reset))(jax.random.split(jax.random.key(0), 4))
    state = env.set_ranges(state, C.ContextSpace({"gravity": C.Uniform(30.0, 31.0)}))
    step = jax.jit(jax.vmap(env.step))
    for _ in range(3):
        state = step(state, jnp.zeros((4, 1)))
    g = np.asarray(state.info[CONTEXT]["gravity"])
    assert np.all((g >= 30.0) & (g <= 31.0))
    with pytest.raises(ValueError, match="same names"):
        env.set_ranges(state, C.ContextSpace({"mass": C.Scale(0.5, 1.0)}))


def test_set_ranges_marks_the_running_trials_of_changed_envs_until_their_next_trial():
    """An env whose ranges change keeps its running trial's context, which the new
    ranges did not draw: current_ranges is 0 until its next trial starts (ADR must not
    credit such an episode to the new ranges); an env with unchanged ranges keeps 1."""
    space = C.ContextSpace({"gravity": C.Uniform(5.0, 15.0)})
    env = make_contextual("inverted_pendulum", space, episode_length=3, episodes_per_trial=2)
    state = jax.jit(jax.vmap(env.reset))(jax.random.split(jax.random.key(0), 4))
    assert np.all(np.asarray(state.info[TRIAL].current_ranges) == 1)
    rows = C.ContextSpace(
        {"gravity": C.Uniform(np.array([5.0, 30, 5, 5]), np.array([15.0, 31, 15, 15]))}
    )
    state = jax.jit(env.set_ranges)(state, C.PerEnv(rows))  # per-env rows, as PPO passes them
    step = jax.jit(jax.vmap(env.step))
    flags = [np.asarray(state.info[TRIAL].current_ranges)]
    for _ in range(6):  # two episodes of 3 steps: one trial
        state = step(state, jnp.zeros((4, 1)))
        flags.append(np.asarray(state.info[TRIAL].current_ranges))
    np.testing.assert_array_equal(np.stack(flags)[:, 1], [0, 0, 0, 0, 0, 0, 1])
    assert np.all(np.stack(flags)[:, [0, 2, 3]] == 1)
    assert float(state.info[CONTEXT]["gravity"][1]) >= 30.0  # the new trial drew from them


def test_set_ranges_takes_per_env_rows_in_and_out_of_jit_and_checks_them():
    space = C.ContextSpace({"gravity": C.Uniform(5.0, 15.0)})
    env = make_contextual(Puck(), space, episode_length=3)
    state = jax.jit(jax.vmap(env.reset))(jax.random.split(jax.random.key(0), 4))
    rows = C.ContextSpace(
        {"gravity": C.Uniform(np.array([5.0, 30, 5, 5]), np.array([15.0, 31, 15, 15]))}
    )
    for call in (env.set_ranges, jax.jit(env.set_ranges)):
        flags = call(state, C.PerEnv(rows)).info[TRIAL].current_ranges
        np.testing.assert_array_equal(flags, [1, 0, 1, 1])
        # rows not marked as such are refused, not guessed from their shapes (as
        # run_train refuses them), and the error says how to mark them
        with pytest.raises(ValueError, match=r"one row per env .*PerEnv\(ranges\)"):
            call(state, rows)
    # the numbers of per-env rows are checked like shared ones
    bad = jax.tree.map(np.array, rows)  # a copy, rebuilt without the constructor's checks
    bad["gravity"].low[2], bad["gravity"].high[2] = 9.0, 8.0
    for call in (env.set_ranges, jax.jit(env.set_ranges)):  # in jit: as the program runs
        with pytest.raises(RANGE_ERRORS, match=r"low <= high.* \(row \(2,\) of \(4,\)\)"):
            jax.block_until_ready(call(state, C.PerEnv(bad)))
    # rows of another length are refused in and out of jit, naming the shapes
    three = C.PerEnv(jax.tree.map(lambda x: x[:3], rows))
    for call in (env.set_ranges, jax.jit(env.set_ranges)):
        with pytest.raises(ValueError, match="parameter shapes differ"):
            call(state, three)


def test_ranges_a_jitted_function_computes_are_checked_as_it_runs():
    """Numbers traced inside jit cannot be checked when traced: a host callback checks
    them when the program runs and the call raises the ValueError a concrete range
    gets (before, a row of low > high drew its low bound, silently): JAX raises the
    ValueError itself, or its runtime error carrying the message where it reports the
    callback's failure later (`RANGE_ERRORS`). Valid ranges
    pass through unchanged, and a new value compiles nothing."""
    space = C.ContextSpace({"gravity": C.Uniform(5.0, 15.0)})
    env = make_contextual(Puck(), space, episode_length=3)
    keys = jax.random.split(jax.random.key(0), 4)
    state = jax.jit(jax.vmap(env.reset))(keys)

    def ranges(width):  # what a curriculum running inside jit would compute
        return C.ContextSpace({"gravity": C.Uniform(10.0 - width, 10.0 + width)})

    widen = jax.jit(lambda s, w: env.set_ranges(s, ranges(w)))
    reset = jax.jit(lambda k, w: jax.vmap(env.reset, in_axes=(0, None))(k, ranges(w)))
    # a seed axis in front, each seed its own width: the rows of both are checked
    seeds = jax.jit(jax.vmap(lambda k, w: jax.vmap(env.reset, in_axes=(0, None))(k, ranges(w))))
    seed_keys = jnp.stack([keys, keys])
    for w in (2.0, 4.0):  # valid ranges: what concrete ones give
        out = widen(state, w)
        np.testing.assert_array_equal(out.info[TRIAL].ranges["gravity"].high, 10.0 + w)
        want = env.set_ranges(state, ranges(w))  # concrete: checked at once
        for got, x in zip(jax.tree.leaves(out), jax.tree.leaves(want), strict=True):
            if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
                got, x = jax.random.key_data(got), jax.random.key_data(x)
            np.testing.assert_array_equal(got, x)
        drawn = reset(keys, w).info[CONTEXT]["gravity"]
        assert np.all((drawn >= 10.0 - w) & (drawn <= 10.0 + w)) and np.ptp(drawn) > 0
    seeds(seed_keys, jnp.array([1.0, 3.0]))
    with count_compilations() as compiles:
        message = "inside jit, checked as it ran: context 'gravity': Uniform needs low <= high"
        with pytest.raises(RANGE_ERRORS, match=message):
            jax.block_until_ready(widen(state, -1.0))
        with pytest.raises(RANGE_ERRORS, match=message):
            jax.block_until_ready(reset(keys, -1.0))
        # a seed axis in front, each seed its own width: the bad row is named
        with pytest.raises(RANGE_ERRORS, match=r"low <= high.* \(row \(1,\) of \(2,\)\)"):
            jax.block_until_ready(seeds(seed_keys, jnp.array([1.0, -3.0])))
    assert compiles.count == 0
    # a step resets from the ranges in its state, checked when they were set: no
    # callback on the step's path, whatever the reset strategy
    for strategy in RESET_STRATEGIES:
        env = make_contextual(Puck(), space, episode_length=3, reset_strategy=strategy)

        def start(keys, env=env, strategy=strategy):
            batch = jax.vmap(env.reset)(keys)
            if strategy in POOLED:
                batch = jax.vmap(lambda s: env.stock(s, 2))(batch)
            return batch

        batch = jax.eval_shape(start, keys)  # traced, not run: nothing to compile
        action = jnp.zeros((4, env.action_size))
        assert "callback" not in str(jax.make_jaxpr(jax.vmap(env.step))(batch, action)), strategy


def test_privileged_observation_is_a_dict():
    env = make_contextual("inverted_pendulum", PENDULUM_SPACE, visible_context="privileged")
    state = env.reset(jax.random.key(0))
    assert set(state.obs) == {"state", "privileged"}
    assert env.observation_size == {"state": 4, "privileged": 1 + 2 + 1}
    assert state.obs["privileged"].shape == (4,)


class _PuckWithMetrics(Puck):
    """Brax-style metrics and an info entry that only its step writes."""

    def reset(self, rng):
        s = super().reset(rng)
        return s.replace(metrics={"x_velocity": jnp.zeros(())})

    def step(self, state, action):
        s = super().step(state, action)
        speed = s.pipeline_state.qd[0]
        return s.replace(metrics={"x_velocity": speed}, info={**s.info, "speed": speed})


class _SettlingPuck(_PuckWithMetrics):
    """Lets the ball settle for 40 physics steps in its reset, as envs that settle a
    robot do: under a context that blows up, the reset itself returns NaN."""

    def reset(self, rng):
        s = super().reset(rng)
        ps = jax.lax.fori_loop(
            0, 40, lambda i, p: self.pipeline_step(p, jnp.ones(1)), s.pipeline_state
        )
        return s.replace(pipeline_state=ps, obs=self._obs(ps))


@pytest.mark.parametrize("puck", [_PuckWithMetrics, _SettlingPuck], ids=["step", "reset"])
def test_non_finite_state_is_cut_and_reported(puck):
    """A stiff spring with a long timestep blows up, in a step or already in the reset:
    the env must report it, not train on NaN; nothing of the cut step (metrics, info the
    step writes) and no diverged reset's observation leaves the env as NaN."""
    env = make_contextual(
        puck(), C.ContextSpace({"stiffness": C.Fixed(1e4), "timestep": C.Fixed(0.2)})
    )

    @jax.jit  # one program: the first reset's observation too
    def run(key):
        s = env.reset(key)
        first = s.obs
        s = s.replace(info={**s.info, "speed": jnp.zeros(())})

        def body(s, _):
            s = env.step(s, jnp.ones(1))
            trial = s.info[TRIAL]
            out = (s.obs, s.reward, s.metrics, s.info["speed"], trial.final_obs)
            return s, (s.done, trial.nonfinite, out)

        return first, jax.lax.scan(body, s, None, length=60)[1]

    first, (done, nonfinite, outputs) = run(jax.random.key(0))
    assert np.all(np.isfinite(np.asarray(first)))
    assert float(np.asarray(nonfinite).sum()) > 0
    assert np.all(np.asarray(done)[np.asarray(nonfinite) > 0] == 1)
    for x in jax.tree.leaves(outputs):
        assert np.all(np.isfinite(np.asarray(x)))


def test_a_finite_state_past_mujocos_bound_is_cut_too():
    """Physics that blows up passes through huge finite values first: observations of
    1e22 and rewards of 4e11 a step before the NaN reached the learner and overflowed
    its observation statistics and value loss. MuJoCo resets a state past 1e10."""
    space = C.ContextSpace({"stiffness": C.Uniform(0.0, 1e4), "timestep": C.Uniform(0.01, 0.2)})
    env = make_contextual(Puck(), space, episode_length=10)

    @jax.jit
    def run(key):
        s = jax.vmap(env.reset)(jax.random.split(key, 8))

        def body(s, k):
            s = jax.vmap(env.step)(s, jax.random.uniform(k, (8, 1), minval=-1.0, maxval=1.0))
            trial = s.info[TRIAL]
            return s, (trial.nonfinite, (s.obs, s.reward, trial.final_obs))

        return jax.lax.scan(body, s, jax.random.split(key, 30))[1]

    nonfinite, outputs = run(jax.random.key(0))
    assert float(np.asarray(nonfinite).sum()) > 0
    for x in jax.tree.leaves(outputs):
        assert np.all(np.abs(np.asarray(x)) <= MAX_VALUE)


def test_raw_and_typed_keys_give_the_same_state():
    env = make_contextual("inverted_pendulum", PENDULUM_SPACE)
    a = env.reset(jax.random.key(3))
    b = env.reset(jax.random.PRNGKey(3))
    np.testing.assert_array_equal(a.obs, b.obs)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"env": "hoper"}, "unknown Brax env 'hoper'.*hopper"),
        ({"episode_length": 0}, "episode_length must be an integer >= 1"),
        ({"episodes_per_trial": 1.5}, "episodes_per_trial must be an integer"),
        ({"visible_context": "yes"}, "visible_context must be one of"),
        ({"env": Puck(backend="mjx"), "backend": "generalized"}, "differs from the instance"),
        ({"env": Puck(), "n_frames": 3}, "only apply to an env given by name"),
        ({"backend": "warp"}, "backend should be in"),
    ],
)
def test_bad_arguments_raise(kwargs, message):
    args = {"env": "inverted_pendulum", "space": PENDULUM_SPACE} | kwargs
    with pytest.raises(ValueError, match=message):
        make_contextual(args.pop("env"), args.pop("space"), **args)


def test_wrapped_env_is_refused():
    from brax.envs.wrappers.training import EpisodeWrapper

    with pytest.raises(ValueError, match="unwrapped"):
        make_contextual(EpisodeWrapper(Puck(), 10, 1), PENDULUM_SPACE)


def test_check_env_steps_a_discrete_action_env_with_action_indices():
    # check_env drew float action vectors for every env, which a discrete env refuses
    class ThreePushes(Puck):
        discrete_actions = True

        @property
        def action_size(self):
            return 3

        def step(self, state, action):
            return super().step(state, jnp.reshape(action.astype(jnp.float32) - 1.0, (1,)))

    space = C.ContextSpace({"friction": C.Uniform(0.3, 0.7)})
    env = make_contextual(ThreePushes(), space, episode_length=40)
    report = check_env(env, num_envs=4, max_steps=60)
    assert report["trials_ended"] > 0 and report["contexts_reaching"] == 1


def test_check_env_checks_an_env_of_no_contexts():
    """A plain baseline (an empty space): the contract's other clauses still hold and
    are checked; no context to reach the physics."""
    env = make_contextual(Puck(), C.ContextSpace({}), episode_length=20)
    report = check_env(env, num_envs=4, max_steps=50)
    assert report["trials_ended"] > 0 and report["contexts_reaching"] == 0


class _Silent(Puck):
    """Passes on the done it is given, as Brax's reacher, half_cheetah, swimmer and
    pusher do: their step never sets it."""

    def step(self, state, action):
        return super().step(state, action).replace(done=state.done)


# The loop and the pool: compact and dense select the same resets as the loop from the
# same step (test_strategies_agree_on_env_states), 9 s each to compile here.
@pytest.mark.parametrize("strategy", ["loop", "pool"])
def test_an_env_whose_step_never_sets_done_ends_episodes_at_their_length(strategy):
    """The step that ended an episode returned done 1, and the wrapped env got it back
    with the next step: every later episode 'terminated' after one step (PPO counted
    four times as many episodes on reacher_goal, each 1.25 steps long)."""
    env = make_contextual(
        _Silent(),
        C.ContextSpace({"gravity": C.Uniform(5.0, 12.0)}),
        episode_length=3,
        reset_strategy=strategy,
    )
    ends = _ends(env, steps=9)
    np.testing.assert_array_equal(ends, np.tile([0, 0, 1], 3)[:, None] * np.ones((1, 2)))


def test_reacher_ends_episodes_at_their_length():
    env = make_contextual(
        "reacher_goal", C.ContextSpace({"goal_distance": C.Uniform(0.1, 0.2)}), episode_length=3
    )
    np.testing.assert_array_equal(
        _ends(env, steps=6), np.tile([0, 0, 1], 2)[:, None] * np.ones((1, 2))
    )


def _ends(env, steps: int) -> np.ndarray:
    """[steps, 2]: which of 2 envs ended an episode at each step, zero actions."""

    @jax.jit
    def run(key):
        state = jax.vmap(env.reset)(jax.random.split(key, 2))

        def body(s, _):
            s = jax.vmap(env.step)(s, jnp.zeros((2, env.action_size)))
            return s, s.done

        return jax.lax.scan(body, state, None, steps)[1]

    return np.asarray(run(jax.random.key(0)))


def test_the_sources_sweep_reports_refusals_and_the_contract_per_env(tmp_path):
    """scripts/check_sources.py: each context bound alone (refusals kept with their
    reason), then check_env on every accepted one at once."""
    script = load_script(
        pathlib.Path(__file__).parents[1] / "scripts/check_sources.py", "check_sources"
    )
    out = tmp_path / "sweep.json"
    args = script.Args(envs=["walker2d:spring"], episode_length=50, max_steps=120, out=out)
    assert script.main(args) == 0
    (row,) = json.loads(out.read_text())
    assert row["failure"] is None and row["report"]["contexts_reaching"] == len(row["accepted"])
    assert {"mass", "gravity", "friction"} <= set(row["accepted"])
    assert "ignore per-joint damping" in row["refused"]["damping"]
