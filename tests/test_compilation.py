"""`count_compilations` counts every executable JAX builds, including one loaded
from the persistent compilation cache (tests/conftest.py switches it on)."""

import os
import re
import uuid

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metarl.compilation import count_compilations

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


def test_a_count_prints_its_count_and_seconds():
    """Its spans are raw clock readings; printed, they hid the two numbers a user reads."""
    with count_compilations() as compiles:
        jax.jit(lambda x: x * 3 + 1)(jnp.ones(5))
    expected = rf"CompileCount\(count={compiles.count}, seconds=\d+\.\d\d\)"
    assert re.fullmatch(expected, repr(compiles)), repr(compiles)
    assert compiles.count >= 1
