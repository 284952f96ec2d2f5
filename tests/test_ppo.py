"""PPO: losses, configuration, learning, zero recompilation, bit-exact resume,
discrete actions and data parallelism."""

import json
import os
import re
import subprocess
import sys
import textwrap
import time
import types
from dataclasses import replace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from brax.envs.base import State
from conftest import OPTIMIZED, optimized_training, xla_flags_without

from metarl import checkpoint
from metarl import contexts as C
from metarl import evaluation as E
from metarl.agents import losses, ppo
from metarl.agents.ppo import training
from metarl.compilation import count_compilations
from metarl.envs import POOL, TRIAL, make_contextual
from metarl.envs.toy import Puck
from metarl.trees import to_numpy

PENDULUM = ppo.PPOConfig(
    num_envs=256,
    unroll_length=16,
    num_minibatches=8,
    learning_rate=1e-3,
    entropy_cost=1e-3,
    policy_hidden=(32, 32),
    value_hidden=(64, 64),
)
GRAVITY = C.ContextSpace({"gravity": C.Uniform(9.0, 10.5)})


# ---- losses ----
def test_gae_bootstraps_truncation_but_not_termination():
    rewards = jnp.ones((3, 2))
    values = jnp.zeros((3, 2))
    values_next = jnp.full((3, 2), 10.0)
    values_final = jnp.full((3, 2), 5.0)
    boundary = jnp.array([[0, 0], [1, 1], [0, 0]], jnp.float32)
    terminated = jnp.array(
        [[0, 0], [1, 0], [0, 0]], jnp.float32
    )  # env 0 terminated, env 1 truncated
    nxt = losses.bootstrap_values(values_next, values_final, boundary, terminated)
    np.testing.assert_allclose(nxt[1], [0.0, 5.0])
    np.testing.assert_allclose(nxt[0], [10.0, 10.0])
    adv, ret = losses.compute_gae(rewards, values, nxt, boundary, discount=0.5, gae_lambda=1.0)
    # step 1: r + 0.5 * V_next ; step 0: delta_0 + 0.5 * A_1 (same episode)
    np.testing.assert_allclose(adv[1], [1.0, 3.5])
    np.testing.assert_allclose(adv[0], [1.0 + 5.0 + 0.5 * 1.0, 1.0 + 5.0 + 0.5 * 3.5])
    np.testing.assert_allclose(ret, adv + values)


def test_ppo_losses_clip_large_ratios():
    old = jnp.zeros((4, 2))
    new = jnp.full((4, 2), jnp.log(2.0))  # ratio 2, clipped at 1.3
    adv = jnp.array([[1.0, -1.0]] * 4)
    out = losses.ppo_losses(
        new, old, adv, jnp.zeros((4, 2)), jnp.ones((4, 2)), jnp.ones((4, 2)), 0.3
    )
    assert float(out["clip_fraction"]) == 1.0
    assert float(out["value_loss"]) == pytest.approx(0.5)
    # normalised advantages +1/-1: min(2*1, 1.3*1) = 1.3 and min(-2, -1.3) = -2
    assert float(out["policy_loss"]) == pytest.approx(-(1.3 - 2.0) / 2, rel=1e-4)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"num_envs": 100, "num_minibatches": 8}, "divisible by num_minibatches"),
        ({"core": "transformer"}, "core must be one of"),
        ({"action_distribution": "beta"}, "action_distribution must be one of"),
        ({"returns_span": "forever"}, "returns_span must be one of"),
        ({"discounting": 1.5}, "discounting"),
        ({"unroll_length": 0}, "unroll_length must be an integer >= 1"),
        ({"learning_rate": -1.0}, "must be > 0"),
        ({"max_grad_norm": 0.0}, "max_grad_norm"),
    ],
)
def test_invalid_config_raises(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ppo.PPOConfig(**kwargs)


# ---- learning on inverted_pendulum, reused by the tests below ----
@pytest.fixture(scope="module")
def pendulum():
    env = make_contextual("inverted_pendulum", GRAVITY, episode_length=1000)
    with optimized_training():  # 280k steps: level 0 would run them 6x slower
        space = ppo.make_train_space(env, PENDULUM)
    ts = ppo.init_training_state(space, jax.random.key(0))
    es = ppo.init_env_state(space, jax.random.key(1))
    history = []
    # 280k steps. Seeds 0-6 (keys seed, seed + 1; AMD EPYC, 2026-12-02): eval return
    # 1000 of 1000 from 200k on (seed 6: 47 at 160k), 1000 through 400k (seeds 0, 2, 4).
    for _ in range(7):
        start = time.perf_counter()
        ts, es, metrics = ppo.run_train(space, ts, es, 40_000)
        history.append({**metrics, "wall_seconds": time.perf_counter() - start})
    evaluator = E.Evaluator(env, episodes=2, max_contexts=4)
    return env, space, ts, es, history, evaluator


def test_feed_forward_ppo_learns_the_pendulum(pendulum):
    env, space, ts, _, history, evaluator = pendulum
    result = evaluator.evaluate(
        ppo.make_policy(space, ts), E.in_distribution(GRAVITY, 4), jax.random.key(9)
    )
    assert history[0]["episode_return"] < 100
    assert float(result.mean.mean()) >= 900, result.mean


def test_throughput_leaves_out_the_first_segments_compilation(pendulum):
    """The first segment compiles the training loop: its compile time is reported, and
    left out of its steps/s (which counted it, and read as a slow start)."""
    history = pendulum[4]
    first, later = history[0], history[1:]
    assert first["compile_seconds"] > 0
    assert all(m["compile_seconds"] == 0 for m in later)  # nothing compiles after
    for m in history:  # steps / (time inside run_train - compile time) <= steps / (wall - compile)
        steps = m["segment_env_steps"]
        assert steps / m["env_steps_per_sec"] <= m["wall_seconds"] - m["compile_seconds"] + 1e-6


def test_segments_and_context_changes_never_recompile(pendulum, tmp_path):
    env, space, ts, es, _, evaluator = pendulum
    ts, es = jax.tree.map(jnp.copy, (ts, es))  # run_train consumes (donates) its inputs
    ts, es, _ = ppo.run_train(space, ts, es, 1000, context=GRAVITY.scaled(0.5))  # warm set_ranges
    policy = ppo.make_policy(space, ts)
    evaluator.evaluate(policy, E.interpolation(GRAVITY, 3), jax.random.key(0))
    with count_compilations() as compiles:
        ts, es, m1 = ppo.run_train(
            space, ts, es, 5000, context=C.ContextSpace({"gravity": C.Uniform(5.0, 6.0)})
        )
        ts, es, m2 = ppo.run_train(space, ts, es, 12_345)
        ts, es, m3 = ppo.run_train(space, ts, es, 4096, context=GRAVITY, chunks=3)
        evaluator.evaluate(
            ppo.make_policy(space, ts), E.extrapolation(env, GRAVITY, 4), jax.random.key(1)
        )
    assert compiles.count == 0
    assert m2["segment_env_steps"] == 4 * space.config.batch_size  # whole iterations


def test_a_segment_past_int32s_reach_is_split_into_calls_counted_in_64_bits(pendulum, monkeypatch):
    """The loop counts the steps of the episodes that end in int32: past 2**31 env steps
    in one call (a GPU run of a few billion steps, `train(..., segments=1)`) it wrapped
    to a negative episode_length. A call runs at most `MAX_CALL_STEPS`; a longer segment
    is split into more calls (the same results) whose counts add up on the host."""
    from metarl.agents.ppo import training

    wrapped = training.add_totals({"length_sum": np.int32(2**31 - 1)}, {"length_sum": np.int32(5)})
    more = training.add_totals(wrapped, {"length_sum": np.int32(5)})
    assert more["length_sum"] == 2**31 + 9 and more["length_sum"].dtype == np.int64
    _, space, ts, es, _, _ = pendulum
    batch = space.config.batch_size
    _, _, whole = ppo.run_train(space, *jax.tree.map(jnp.copy, (ts, es)), 5 * batch)
    monkeypatch.setattr(training, "MAX_CALL_STEPS", 2 * batch)
    done = []
    _, _, split = ppo.run_train(
        space, *jax.tree.map(jnp.copy, (ts, es)), 5 * batch, progress=lambda d, t: done.append(d)
    )
    assert done == [2 * batch, 4 * batch, 5 * batch]  # 3 calls of 2, 2 and 1 iterations
    assert (split["episodes"], split["env_steps"]) == (whole["episodes"], whole["env_steps"])
    for name in ("episode_return", "episode_length", "policy_loss", "value_loss"):
        np.testing.assert_allclose(split[name], whole[name], rtol=1e-5, err_msg=name)
    np.testing.assert_array_equal(split["env_episodes"], whole["env_episodes"])


def test_run_train_rejects_ranges_of_another_shape(pendulum):
    _, space, ts, es, _, _ = pendulum
    with pytest.raises(ValueError, match="same names"):
        ppo.run_train(space, ts, es, 10, context=C.ContextSpace({"mass": C.Scale(0.5, 1.0)}))
    # per-env rows not marked as such: refused, and the error says how to mark them
    n = space.config.num_envs
    rows = C.ContextSpace({"gravity": C.Uniform(np.full(n, 9.0), np.full(n, 10.0))})
    with pytest.raises(ValueError, match=r"one row per env .*PerEnv\(ranges\)"):
        ppo.run_train(space, ts, es, 10, context=rows)


def test_states_a_run_train_consumed_are_refused_naming_the_fix(pendulum, tmp_path):
    """run_train donates its inputs: reusing one raised JAX's "Array has been
    deleted", which names neither the call nor the fix."""
    _, space, ts, es, _, _ = pendulum
    ts, es = jax.tree.map(jnp.copy, (ts, es))
    new_ts, new_es, _ = ppo.run_train(space, ts, es, 10)
    consumed = r"(training_state|env_state|the state) was consumed by an earlier call"
    for call in (
        lambda: ppo.run_train(space, ts, new_es, 10),
        lambda: ppo.run_train(space, new_ts, es, 10),
        lambda: ppo.make_policy(space, ts),
        lambda: checkpoint.save(tmp_path / "ckpt", 1, {"training": ts}, keep=1),
    ):
        with pytest.raises(ValueError, match=consumed):
            call()
    assert checkpoint.latest_step(tmp_path / "ckpt") is None
    ppo.run_train(space, new_ts, new_es, 10)  # the returned states work


def test_train_reuses_a_space_for_another_seed(pendulum):
    env, space, *_ = pendulum
    _, ts0, _ = ppo.train(env, PENDULUM, 4096, segments=1, space=space)  # warms the key ops
    with count_compilations() as compiles:
        _, ts1, _ = ppo.train(env, replace(PENDULUM, seed=1), 4096, segments=1, space=space)
    assert compiles.count == 0
    first = lambda ts: np.asarray(jax.tree.leaves(ts.params)[0])  # noqa: E731
    assert not np.array_equal(first(ts0), first(ts1))  # the seed reached the run
    with pytest.raises(ValueError, match=r"config.num_envs differ"):
        ppo.train(env, replace(PENDULUM, num_envs=128), 10, space=space)
    with pytest.raises(ValueError, match=r"num_seeds \(None vs 2\)"):
        ppo.train(env, PENDULUM, 10, num_seeds=2, space=space)


def test_precompile_leaves_nothing_to_compile(pendulum):
    """`precompile` compiles every program of a fresh space at once, in threads (on the
    H100 it brought hopper's first update from 34.7 s to 23.3 s): the calls that
    follow, with a seed axis and per-env ranges too, find them compiled and compile
    nothing."""
    env = pendulum[0]
    space = ppo.make_train_space(env, replace(PENDULUM, num_envs=32, num_minibatches=2), 2)
    assert ppo.precompile(space) > 0
    per_env = C.PerEnv(jax.tree.map(lambda x: np.broadcast_to(x, (32,) + x.shape), GRAVITY))
    keys = ppo.split_keys(ppo.seed_keys(3, 2), 2)
    with count_compilations() as compiles:
        ts = ppo.init_training_state(space, keys[0])
        es = ppo.init_env_state(space, keys[1], per_env)
        ts, es, metrics = ppo.run_train(space, ts, es, 100, context=[GRAVITY, per_env])
    assert compiles.count == 0
    assert all(m["compile_seconds"] == 0 and m["episodes"] > 0 for m in metrics)


def _poisoned(ts, seed=None):
    """`ts` with one policy parameter NaN (of seed index `seed` of a seed axis)."""
    leaves, tree = jax.tree.flatten(ts.params["policy"])
    index = () if seed is None else (seed,)
    index += (0,) * (leaves[0].ndim - len(index))
    leaves[0] = leaves[0].at[index].set(jnp.nan)
    return ts.replace(params={**ts.params, "policy": jax.tree.unflatten(tree, leaves)})


def test_a_diverged_update_stops_training_at_the_chunk_it_happened_in(pendulum):
    """NaN or inf in the learner's state (here one policy weight, as an overflowed
    update leaves it) spreads to every parameter; `run_train` stops after the chunk
    that found it, says where it is and what to change, and hands back the states
    reached. A run that went on would train, evaluate and checkpoint garbage."""
    _, space, ts, es, _, _ = pendulum
    ts, es = jax.tree.map(jnp.copy, (ts, es))  # run_train consumes (donates) its inputs
    before = space.env_steps(ts)
    batch = space.config.batch_size
    with pytest.raises(ppo.TrainingDivergedError) as caught:
        ppo.run_train(space, _poisoned(ts), es, 4 * batch, chunks=4)
    e = caught.value
    assert space.env_steps(e.training_state) == before + batch  # 1 of 4 chunks ran
    assert e.seeds == [0]
    params = jax.tree.leaves(e.training_state.params)
    assert all(not np.isfinite(np.asarray(x)).all() for x in params)  # it spread
    message = str(e)
    assert f"after env steps 0-{batch:,} of this call" in message
    assert re.search(r"params: \d+ of \d+ arrays \(\['policy'\]", message), message
    assert "learning_rate (now 0.001)" in message and "max_grad_norm (now 1.0)" in message


def test_a_diverged_seed_is_named_by_its_index():
    env = make_contextual("inverted_pendulum", GRAVITY, episode_length=100)
    space = ppo.make_train_space(env, replace(PENDULUM, num_envs=32, num_minibatches=2), 3)
    keys = ppo.split_keys(ppo.seed_keys(0, 3), 2)
    ts = ppo.init_training_state(space, keys[0])
    es = ppo.init_env_state(space, keys[1])
    with pytest.raises(ppo.TrainingDivergedError, match=r"of seed index \[1\]") as caught:
        ppo.run_train(space, _poisoned(ts, seed=1), es, 100)
    assert caught.value.seeds == [1]
    params = caught.value.training_state.params
    for k, sound in enumerate([True, False, True]):  # the other seeds trained on
        leaves = jax.tree.leaves(ppo.select_seed(params, k))
        assert all(np.isfinite(np.asarray(x)).all() for x in leaves) == sound


@pytest.mark.parametrize("strategy", ["loop", "pool"])  # "auto" on a CPU, on a GPU
def test_the_training_program_runs_the_envs_python_once(monkeypatch, strategy):
    """Tracing is host time before every first compile. The learner's loop once traced
    a whole iteration twice (for its stats' shapes, then as the loop's body), and the
    exact reset ran the env's reset twice (custom_vmap's unbatched trace, then its
    batching rule): hopper's program took 5.8 s to trace, now 2.8 s."""
    env = make_contextual("inverted_pendulum", GRAVITY, reset_strategy=strategy)
    calls = {"reset": 0, "step": 0}
    source = env._env  # noqa: SLF001 - the wrapped env's own functions

    def counted(name):
        fn = getattr(source, name)

        def call(*args):
            calls[name] += 1
            return fn(*args)

        return call

    for name in calls:
        monkeypatch.setattr(source, name, counted(name))
    space = ppo.make_train_space(env, replace(PENDULUM, num_envs=8, num_minibatches=2))
    key = jax.random.key(0)
    training = jax.eval_shape(lambda k: ppo.init_training_state(space, k), key)
    state = jax.eval_shape(lambda k: ppo.init_env_state(space, k), key)
    calls.update(reset=0, step=0)
    traced = space.iterate.trace(training, state, jnp.int32(1))
    assert calls == {"reset": 1, "step": 1}
    # resets draw from the ranges in the state, checked when set: the loop holds no
    # host callback (`Binding.check_traced`), which would stall an accelerator
    assert "callback" not in str(traced.jaxpr)


@pytest.mark.parametrize("strategy", ["pool", "stock"])
def test_checkpoint_resume_is_bit_exact(tmp_path, strategy):
    """With the pool and the stock ("auto" on a GPU), the reset strategies whose state
    holds most (the pool: the next fresh state of every env, and whether it is ready;
    the stock: 2 * unroll_length of them, the reset count at the last refill), restored
    too. The stock is thinned in the checkpoint and computed again on resume, so the
    resumed stock holds other entries ahead than the uninterrupted one (`refill_stocks`
    fills what each env lacks): every other number of the run is the same, bit for bit.
    The stock's checkpoint also resumes into a shallower stock (`stock_depth` 2,
    refilled 4 times a rollout) and continues as the run that was not interrupted, to
    float rounding: that is another program, which XLA may round otherwise."""
    env = make_contextual("inverted_pendulum", GRAVITY, episode_length=200, reset_strategy=strategy)
    config = ppo.PPOConfig(
        num_envs=32, unroll_length=8, num_minibatches=4, core="gru", hidden_size=16
    )
    space = ppo.make_train_space(env, config)
    ts = ppo.init_training_state(space, jax.random.key(0))
    es = ppo.init_env_state(space, jax.random.key(1))
    ts, es, _ = ppo.run_train(space, ts, es, 2000)
    thin = ppo.thin_env_state(es)  # the stock keeps 1 of its 8 entries per env
    checkpoint.save(tmp_path, 1, {"training": ts, "env": thin})
    like = jax.tree.map(jnp.copy, {"training": ts, "env": thin})
    stock = es.env.info[POOL]
    if strategy == "stock":
        assert stock.depth((32,)) == 16 and thin.env.info[POOL].depth((32,)) == 1
        assert int(jnp.sum(es.env.info[TRIAL].resets - stock.base)) > 0  # some entries used
        with pytest.raises(ValueError, match=r"holds 1 fresh states.*restock_env_state"):
            ppo.run_train(space, ts, thin, 2000)  # forgot to restock: refused, not recompiled
        other = ppo.make_train_space(env, replace(config, unroll_length=4))
        with pytest.raises(ValueError, match=r"holds 16 fresh states.*stock_depth \(8\)"):
            ppo.restock_env_state(other, jax.tree.map(jnp.copy, es))
    else:
        assert thin is es
    # Uninterrupted: two more segments, the second with new ranges.
    a_ts, a_es, _ = ppo.run_train(space, ts, es, 2000)
    a_ts, a_es, _ = ppo.run_train(space, a_ts, a_es, 2000, context=GRAVITY.scaled(0.3))
    # Resumed from disk: the stock's entries computed again, all of them.
    restored = checkpoint.restore(tmp_path, like=like)
    restocked = ppo.restock_env_state(space, restored["env"])
    assert jax.tree.structure(restocked) == jax.tree.structure(es)
    with count_compilations() as compiles:  # the training program's own arguments
        b_ts, b_es, _ = ppo.run_train(space, restored["training"], restocked, 2000)
    assert compiles.count == 0
    b_ts, b_es, _ = ppo.run_train(space, b_ts, b_es, 2000, context=GRAVITY.scaled(0.3))
    unstocked = lambda es: es.replace(  # noqa: E731
        env=es.env.replace(info={k: v for k, v in es.env.info.items() if k != POOL})
    )
    resumed = [((a_ts, unstocked(a_es)), (b_ts, unstocked(b_es)))]
    if strategy == "stock":
        assert not np.asarray(b_es.env.info[POOL].overrun).any()
        shallow = ppo.make_train_space(env, replace(config, stock_depth=2))
        assert (space.stock_depth, shallow.stock_depth) == (16, 2)
        again = checkpoint.restore(tmp_path, like=like)  # run_train donated the first
        c_es = ppo.restock_env_state(shallow, again["env"])
        c_ts, c_es, _ = ppo.run_train(shallow, again["training"], c_es, 2000)
        c_ts, c_es, _ = ppo.run_train(shallow, c_ts, c_es, 2000, context=GRAVITY.scaled(0.3))
        assert c_es.env.info[POOL].depth((32,)) == 2
        resumed.append(((a_ts, unstocked(a_es)), (c_ts, unstocked(c_es))))
    a, b = resumed[0]
    for x, y in zip(jax.tree.leaves(to_numpy(a)), jax.tree.leaves(to_numpy(b)), strict=True):
        np.testing.assert_array_equal(x, y)
    for a, c in resumed[1:]:  # another program (4 refills a rollout): XLA may round it
        # otherwise (at its default level, 3.7e-9 apart here; bit for bit at level 0)
        for x, y in zip(jax.tree.leaves(to_numpy(a)), jax.tree.leaves(to_numpy(c)), strict=True):
            if np.issubdtype(x.dtype, np.floating):
                np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)
            else:
                np.testing.assert_array_equal(x, y)


def test_the_stock_fits_the_devices_memory():
    """`PPOConfig.stock_depth=None`: two rollouts' worth of fresh states per env
    (2 * unroll_length) where the stock fits a quarter of the device's memory (or the
    device reports none, as a CPU does), else the largest divisor of unroll_length that
    fits. A depth asked for whose stock alone exceeds the device's memory is refused
    before anything compiles."""
    choose, gib = training._choose_stock_depth, 2**30  # noqa: SLF001
    assert choose(16, None, gib, None) == 32  # a CPU: no limit known
    assert choose(16, None, gib, 128 * gib) == 32  # 32 GiB: a quarter of 128
    assert choose(16, None, gib, 127 * gib) == 16  # one rollout's worth
    assert choose(16, None, gib, 63 * gib) == 8
    assert choose(20, None, gib, 24 * gib) == 5  # divisors of 20: 1, 2, 4, 5, 10, 20
    assert choose(16, None, 100 * gib, 80 * gib) == 1  # nothing fits: the least
    assert choose(16, 4, gib, 80 * gib) == 4  # asked for
    assert choose(16, 48, gib, 80 * gib) == 48  # deeper than a rollout: any depth
    with pytest.raises(ValueError, match=r"stock would take 32\.0 GiB of the device's 16\.0"):
        choose(16, 16, 2 * gib, 16 * gib)
    # A device that reports its memory (a GPU; here a stand-in), one env's entry measured
    # from the env's own reset: 32 entries for 1024 envs fit a quarter of it, by one byte
    env = make_contextual("inverted_pendulum", GRAVITY, reset_strategy="stock")
    entry = jax.eval_shape(env.reset, jax.random.key(0)).info[POOL].pending
    per_env = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(entry))

    class Device:
        def __init__(self, process_index=0, share=1.0):
            self.process_index, self.share = process_index, share

        def memory_stats(self):
            if self.process_index != jax.process_index():
                raise RuntimeError("memory_stats: not addressable")  # as PJRT refuses it
            return {"bytes_limit": int(self.share * 4 * 32 * 1024 * per_env)}

    config = ppo.PPOConfig(num_envs=1024, unroll_length=16, num_minibatches=4)
    mesh = types.SimpleNamespace(size=1, devices=np.array([Device()]))
    assert training._stock_depth(env, config, None, mesh) == 32  # noqa: SLF001
    assert training._stock_depth(env, config, 2, mesh) == 16  # two seeds: twice the envs
    mesh.size = 2  # two devices split the envs
    assert training._stock_depth(env, config, 2, mesh) == 32  # noqa: SLF001
    # Several processes: the mesh's first device may be another process's, and this
    # process's own devices tell its memory (the least of them). Asking the first one
    # found no limit on every process but process 0, which stocked deeper.
    mesh.devices = np.array([Device(process_index=1), Device(share=0.5), Device()])
    assert training._stock_depth(env, config, 2, mesh) == 16  # noqa: SLF001
    assert training._memory_limit(mesh) == 2 * 32 * 1024 * per_env  # noqa: SLF001
    assert ppo.make_train_space(env, config).stock_depth == 32  # a CPU: no limit


# ---- discrete actions ----
class DiscretePuck(Puck):
    """Three actions: push left, nothing, push right."""

    discrete_actions = True

    @property
    def action_size(self):
        return 3

    def step(self, state: State, action: jax.Array) -> State:
        return super().step(state, jnp.reshape(action.astype(jnp.float32) - 1.0, (1,)))


def test_categorical_policy_learns_to_push_right():
    env = make_contextual(
        DiscretePuck(), C.ContextSpace({"friction": C.Uniform(0.3, 0.7)}), episode_length=40
    )
    config = ppo.PPOConfig(
        num_envs=64,
        unroll_length=20,
        num_minibatches=4,
        action_distribution="categorical",
        learning_rate=1e-3,
        policy_hidden=(32,),
        value_hidden=(32,),
    )
    with optimized_training():
        space, ts, history = ppo.train(env, config, 60_000, segments=3)
    result = E.Evaluator(env, episodes=1, max_contexts=2).evaluate(
        ppo.make_policy(space, ts), E.in_distribution(env.space, 2), jax.random.key(0)
    )
    assert history[-1]["episode_return"] > 2 * max(history[0]["episode_return"], 1.0)
    assert float(result.mean.min()) > 50  # pushing right all episode long


# ---- meta-RL: a hidden context that only memory can infer ----
def _hidden_sign_returns(core: str) -> np.ndarray:
    """Eval return per motor sign after the same budget, for one agent core."""
    space = C.ContextSpace({"actuator_gain": C.Choice([-1.0, 1.0], relative=True)})
    env = make_contextual("puck", space, episode_length=50)
    config = ppo.PPOConfig(
        num_envs=128,
        unroll_length=25,
        num_minibatches=8,
        clipping_epsilon=0.2,
        core=core,
        rl2_inputs=core != "mlp",
        learning_rate=1e-3,
        entropy_cost=1e-2,
        hidden_size=32 if core != "mlp" else ppo.PPOConfig.hidden_size,  # mlp: none
        policy_hidden=(32,),
        value_hidden=(32,),
    )
    # Config seeds 0-15 at this budget, each its own run (eval return per sign; Intel
    # Xeon, 2026-12-03): all 16 pass both claims below; gru min - mlp min 24-115 (the
    # narrowest seeds: 6, whose gru min is 6 against the mlp's -18, and 14), mean
    # difference 13-72. At 100k steps 14 of 16 passed (seeds 0 and 14 did not).
    with optimized_training():
        trained, ts, _ = ppo.train(env, config, 150_000, segments=2)
    signs = E.ContextSet("train", {"actuator_gain": np.array([-1.0, 1.0], np.float32)})
    result = E.Evaluator(env, episodes=4, max_contexts=2).evaluate(
        ppo.make_policy(trained, ts), signs, jax.random.key(3)
    )
    return result.mean


@pytest.mark.slow
def test_recurrent_agent_infers_a_hidden_context_the_mlp_cannot():
    # In the test process: its trainings compile at XLA's level 2 (`optimized_training`),
    # its envs' other programs at level 0 (tests/conftest.py). Cold, 132 s on an AMD EPYC without
    # AVX-512 (2026-12-02); in a process of its own at level 2 throughout, 334 s.
    mlp, gru = (_hidden_sign_returns(core) for core in ("mlp", "gru"))
    print(f"hidden motor sign, eval return per sign (-1, +1): mlp {mlp}, gru {gru}")
    # A memoryless policy cannot tell the signs apart: it does well on at most one.
    assert gru.min() > mlp.min() + 20
    assert gru.mean() > mlp.mean() + 10


# ---- data parallelism over two (simulated) devices ----
MULTI_DEVICE = textwrap.dedent(
    """
    import json, jax, numpy as np
    from metarl import contexts as C
    from metarl.agents import ppo
    from metarl.envs import make_contextual
    env = make_contextual("inverted_pendulum", C.ContextSpace({"gravity": C.Uniform(9.0, 10.5)}))
    config = ppo.PPOConfig(num_envs=128, unroll_length=16, num_minibatches=4, learning_rate=1e-3,
                           entropy_cost=1e-3, policy_hidden=(32, 32), value_hidden=(64, 64))
    space = ppo.make_train_space(env, config)
    ts = ppo.init_training_state(space, jax.random.key(0))
    es = ppo.init_env_state(space, jax.random.key(1))
    returns, episodes = [], []
    for _ in range(6):
        ts, es, m = ppo.run_train(space, ts, es, 40_000)
        returns.append(m["episode_return"])  # NaN where no episode ended
        episodes.append(m["episodes"])
    leaves = jax.tree.leaves(ts.params)
    shards = [[np.asarray(s.data) for s in x.addressable_shards] for x in leaves]
    same = all(np.array_equal(a, b) for a, b in shards)
    obs = es.env.obs
    # Advantages normalised over both devices' minibatches together, as on one device,
    # even where the two shards differ (the second half's advantages are offset by 5).
    from jax.sharding import PartitionSpec as P
    from metarl.agents import losses
    from metarl.parallel import AXIS
    k = jax.random.split(jax.random.key(5), 6)
    lp, olp, adv, v, r, ent = (jax.random.normal(ki, (6, 16)) for ki in k)
    adv = adv.at[:, 8:].add(5.0)
    one = losses.ppo_losses(lp, olp, adv, v, r, ent, 0.2)
    def shard(*a):
        terms = losses.ppo_losses(*a, 0.2, axis_name=AXIS)
        return jax.tree.map(lambda t: jax.lax.pmean(t, AXIS), terms)
    two = jax.jit(jax.shard_map(shard, mesh=space.mesh, in_specs=P(None, AXIS), out_specs=P()))(
        lp, olp, adv, v, r, ent)
    losses_match = all(abs(float(one[n]) - float(two[n])) < 1e-5 for n in one)
    # Each device shuffles its envs into minibatches its own way, from one key.
    from metarl.agents.ppo.learner import minibatch_order
    orders = jax.jit(jax.shard_map(lambda key: minibatch_order(key, 64, 4)[None],
                                   mesh=space.mesh, in_specs=P(), out_specs=P(AXIS)))(
        jax.random.key(7))
    print(json.dumps({"devices": space.num_devices, "params_identical": same,
                      "obs_shards": [list(s.data.shape) for s in obs.addressable_shards],
                      "returns": returns, "episodes": episodes, "losses_match": losses_match,
                      "orders": np.asarray(orders).tolist()}))
    """
)


def test_data_parallel_training_on_two_devices():
    # Two host (CPU) devices through JAX's own setting, JAX_NUM_CPU_DEVICES, not
    # XLA_FLAGS=--xla_force_host_platform_device_count: the persistent compilation
    # cache's key leaves that flag out, so a two-device process loads executables
    # that single-device processes compiled (cache hits on JAX 0.10.2), while the
    # setting is part of the key (misses). JAX_PLATFORMS keeps the subprocess on the CPU on a GPU
    # machine too, where JAX would otherwise pick the one GPU.
    # Without the persistent cache: a cached executable loaded into a process of another
    # device count is the likeliest cause of a crash (signal 11) seen on JAX 0.11.2;
    # faulthandler prints the Python stack of such a crash. It mostly trains: without
    # the tests' level 0 (tests/conftest.py).
    out = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", MULTI_DEVICE],
        env=_cpu_env(JAX_NUM_CPU_DEVICES="2", XLA_FLAGS=xla_flags_without(OPTIMIZED)),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, f"exit status {out.returncode}: {out.stderr[-3000:]}"
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["devices"] == 2
    assert report["params_identical"]
    assert report["obs_shards"] == [[64, 4], [64, 4]]
    assert report["losses_match"]
    a, b = (np.asarray(o) for o in report["orders"])
    for order in (a, b):  # each a shuffle of the device's 64 envs into 4 minibatches
        assert order.shape == (4, 16) and sorted(order.ravel()) == list(range(64))
    assert not np.array_equal(a, b)
    # It learns: the last segment's episodes return 5x the first's, or none ended (NaN):
    # all 128 envs balanced through its 312 steps each, where the first's lasted ~20.
    first, last = report["returns"][0], report["returns"][-1]
    assert report["episodes"][0] > 0, report
    assert last > 5 * first or report["episodes"][-1] == 0, report


def _cpu_env(**extra: str) -> dict[str, str]:
    """The environment of a CPU subprocess: JAX_PLATFORMS keeps it off a GPU machine's GPU;
    no persistent compilation cache."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    return dict(env, JAX_PLATFORMS="cpu", **extra)


# Two processes of one CPU device each (two hosts, joined over gloo), or one process
# of two devices: a segment, then a segment under wider ranges.
TWO_HOSTS = textwrap.dedent(
    """
    import json, sys, jax, numpy as np
    process, port = int(sys.argv[1]), sys.argv[2]
    if process >= 0:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        from metarl.parallel import initialize_distributed
        initialize_distributed(f"localhost:{port}", 2, process)
    from metarl import contexts as C
    from metarl.agents import ppo
    from metarl.envs import make_contextual
    space = C.ContextSpace({"gravity": C.Uniform(9.0, 10.5), "mass": C.Scale(0.8, 1.2)})
    # the stock, as "auto" resets on GPUs: every process chooses one stock depth
    env = make_contextual("inverted_pendulum", space, episode_length=10, reset_strategy="stock")
    from brax.envs.inverted_pendulum import InvertedPendulum
    from metarl.parallel import process_local_devices
    try:  # built outside process_local_devices: its model lives on process 0's device
        make_contextual(InvertedPendulum(), space)
        refused = ""
    except ValueError as e:
        refused = str(e)
    with process_local_devices():
        make_contextual(InvertedPendulum(), space)
    config = ppo.PPOConfig(num_envs=8, unroll_length=4, num_minibatches=2,
                           num_updates_per_batch=2, policy_hidden=(8,), value_hidden=(8,))
    space = ppo.make_train_space(env, config)
    ts = ppo.init_training_state(space, jax.random.key(0))
    es = ppo.init_env_state(space, jax.random.key(1))
    rows = []
    for ranges in (None, C.ContextSpace({"gravity": C.Uniform(5.0, 15.0),
                                         "mass": C.Scale(0.5, 1.5)})):
        ts, es, m = ppo.run_train(space, ts, es, 64, context=ranges)
        rows.append({k: np.asarray(m[k]).tolist() for k in
                     ("episodes", "episode_return", "value_loss", "env_return_sum",
                      "env_episodes")})
    params = [np.asarray(x.addressable_shards[0].data).tolist() for x in jax.tree.leaves(ts.params)]
    # fetch of a tree mixing an array spread over both processes with host values
    from jax.sharding import NamedSharding, PartitionSpec
    from metarl import parallel
    spread = jax.make_array_from_process_local_data(
        NamedSharding(parallel.data_mesh(), PartitionSpec(parallel.AXIS)),
        np.full((2,), float(max(process, 0))) if process >= 0 else np.array([0.0, 0, 1, 1]))
    mixed = parallel.fetch({"spread": spread, "scalar": np.float32(7.0), "vec": np.arange(3.0)})
    print(json.dumps({"devices": space.num_devices, "processes": jax.process_count(),
                      "rows": rows, "params": params, "refused": refused,
                      "mixed": {k: np.asarray(v).tolist() for k, v in mixed.items()}}))
    """
)


def test_two_hosts_train_as_one_host_of_two_devices():
    """`initialize_distributed` on two hosts (two processes on localhost, one CPU device
    each): both build the env, train, and read every env's sums, and they train exactly
    as one process of two devices does; `parallel.fetch` gathers only the arrays spread
    over processes. An env instance built outside
    `process_local_devices` is refused where its model is out of reach."""
    import socket

    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = str(s.getsockname()[1])

    def start(process: int, **env: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-X", "faulthandler", "-c", TWO_HOSTS, str(process), port],
            env=_cpu_env(**env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    hosts = [start(0), start(1)]
    outs = [p.communicate(timeout=600) for p in hosts]
    one = subprocess.run(
        [sys.executable, "-c", TWO_HOSTS, "-1", "0"],
        env=_cpu_env(JAX_NUM_CPU_DEVICES="2"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    for p, (_, stderr) in zip(hosts, outs, strict=True):
        assert p.returncode == 0, f"exit status {p.returncode}: {stderr[-3000:]}"
    assert one.returncode == 0, one.stderr[-3000:]
    first, second = (json.loads(stdout.strip().splitlines()[-1]) for stdout, _ in outs)
    single = json.loads(one.stdout.strip().splitlines()[-1])
    assert (first["processes"], single["processes"]) == (2, 1)
    assert first["devices"] == single["devices"] == 2
    assert first["rows"][1]["episodes"] > 0
    # process 1 cannot read a model put on jax.devices()[0], process 0's device
    assert first["refused"] == single["refused"] == ""
    assert "cannot read it" in second["refused"], second["refused"]
    assert "process_local_devices()" in second["refused"]
    for report in (first, second, single):  # only the spread array is gathered
        assert report["mixed"] == {"spread": [0.0, 0.0, 1.0, 1.0], "scalar": 7.0, "vec": [0, 1, 2]}
    for report in (first, second):
        assert report["rows"] == single["rows"]
        assert report["params"] == single["params"]
