"""`count_compilations` counts every executable JAX builds, including one loaded
from the persistent compilation cache (tests/conftest.py switches it on)."""

import os
import re
import time
import uuid
from pathlib import Path

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metarl import contexts as C
from metarl import evaluation as E
from metarl.agents import ppo
from metarl.compilation import count_compilations
from metarl.envs import make_contextual
from metarl.envs.toy import Puck

CACHE_HIT = "/jax/compilation_cache/cache_hits"


@pytest.mark.skipif(
    not os.environ.get("JAX_COMPILATION_CACHE_DIR"), reason="persistent cache switched off"
)
def test_a_cache_load_counts_as_a_compilation():
    old_min = jax.config.jax_persistent_cache_min_compile_time_secs
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    hits = []

    def listener(event, **kwargs):
        if event == CACHE_HIT:
            hits.append(event)

    jax.monitoring.register_event_listener(listener)
    try:
        shift = float(uuid.uuid4().int % 1000)  # a program no earlier run cached
        f = jax.jit(lambda x: jnp.sin(x) * 3.0 + jnp.cos(x) + shift)
        x = np.arange(5.0, dtype=np.float32)
        with count_compilations() as first:
            want = f(x)
        with count_compilations() as again:
            f(x)  # in memory: nothing built
        jax.clear_caches()
        hits.clear()
        with count_compilations() as loaded:
            got = f(x)  # from the persistent cache
        assert len(hits) == 1, "the third call did not load from the persistent cache"
        assert (first.count, again.count, loaded.count) == (1, 0, 1)
        np.testing.assert_array_equal(got, want)
    finally:
        jax.monitoring.unregister_event_listener(listener)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", old_min)


@pytest.mark.skipif(
    not os.environ.get("JAX_COMPILATION_CACHE_DIR"), reason="persistent cache switched off"
)
def test_the_programs_that_take_ranges_are_stored_in_the_persistent_cache():
    """JAX's persistent cache stores no program that holds a host callback. Until
    2026-12-04 every program taking ranges as arguments held one (set_ranges'
    check of traced numbers), so a resumed run, a second evaluation script or the
    next test compiled init_env, set_ranges and the evaluator's rollout anew: a
    probe-and-steer test compiled 82 s, 60 s without them. Their callers validate the
    ranges on the host (`checked`): the programs are stored. A program that computes
    ranges inside jit keeps its check (test_envs.py)."""
    cache = Path(os.environ["JAX_COMPILATION_CACHE_DIR"])
    space = C.ContextSpace({"gravity": C.Uniform(5.0, 15.0)})
    env = make_contextual(Puck(), space, episode_length=3)
    old_min = jax.config.jax_persistent_cache_min_compile_time_secs
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    start = time.time()
    try:
        train = ppo.make_train_space(
            env, ppo.PPOConfig(num_envs=4, num_minibatches=2, unroll_length=2)
        )
        env_state = ppo.init_env_state(train, jax.random.key(0), context=space)
        rows = jax.tree.map(lambda x: np.broadcast_to(np.float32(x), (4, *np.shape(x))), space)
        train.set_ranges(env_state, rows)  # as run_train calls it with a new context
        contexts = E.ContextSet("test", {"gravity": np.array([7.0, 12.0], np.float32)})
        E.Evaluator(env, episodes=1, max_contexts=2).evaluate(_Still(), contexts, jax.random.key(1))
    finally:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", old_min)
    stored = {  # written, or read: JAX touches an entry's "-atime" file either way
        p.name.rpartition("-")[0].rpartition("-")[0]
        for p in cache.glob("jit_*-atime")
        if p.stat().st_mtime >= start - 1
    }
    for program in ("jit_init_env", "jit_set_ranges", "jit__rollout"):
        assert program in stored, f"{program} not stored; stored since the test began: {stored}"

    def computed(state, width):  # ranges a curriculum computes inside jit: still checked
        return env.set_ranges(state, C.ContextSpace({"gravity": C.Uniform(9.0, 9.0 + width)}))

    state = jax.vmap(env.reset)(jax.random.split(jax.random.key(2), 4))
    assert "callback" in jax.jit(computed).lower(state, 1.0).as_text()
    bad = jax.tree.map(np.array, space)  # rebuilt without the constructor's checks
    bad["gravity"].low[...], bad["gravity"].high[...] = 9.0, 8.0
    with pytest.raises(ValueError, match="low <= high"):  # concrete: checked all the same
        env.set_ranges(state, bad, checked=True)


@flax.struct.dataclass
class _Still:
    """A policy that never pushes, as the evaluator calls one."""

    def init_carry(self, n):
        return jnp.zeros((n,))

    def __call__(self, obs, carry):
        return jnp.zeros((obs.shape[0], 1)), carry

    def observe(self, carry, action, state):
        return carry


def test_a_count_prints_its_count_and_seconds():
    """Its spans are raw clock readings; printed, they hid the two numbers a user reads."""
    with count_compilations() as compiles:
        jax.jit(lambda x: x * 3 + 1)(jnp.ones(5))
    expected = rf"CompileCount\(count={compiles.count}, seconds=\d+\.\d\d\)"
    assert re.fullmatch(expected, repr(compiles)), repr(compiles)
    assert compiles.count >= 1


def test_the_suite_adds_no_xla_flag_that_xla_refuses(monkeypatch):
    """XLA exits a process whose XLA_FLAGS holds a flag it does not know, and under
    pytest's capture it exits without a word: JAX 0.11.2's XLA dropped one of the
    flags tests/conftest.py adds, and every test died so on the GPU machine. The
    conftest tries each flag first (`_unknown_to_xla`) and leaves out what XLA
    refuses."""
    import conftest

    added = os.environ.get(conftest._ADDED_VAR, "").split()  # noqa: SLF001
    unknown = os.environ.get(conftest._UNKNOWN_VAR, "").split()  # noqa: SLF001
    assert not set(added) & set(unknown)
    # tried again, not read back (unset too under METARL_TEST_XLA_DEFAULTS=1)
    monkeypatch.delenv(conftest._UNKNOWN_VAR, raising=False)  # noqa: SLF001
    made_up, known = "--xla_metarl_made_up_flag=1", "--xla_backend_optimization_level=0"
    assert conftest._unknown_to_xla((made_up, known)) == [made_up]  # noqa: SLF001
