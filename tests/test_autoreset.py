"""Reset strategies: every strategy gives the same states, bit for bit, and the
state a done env restarts from is its own fresh reset."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metarl import contexts as C
from metarl.envs import RESET_STRATEGIES, make_contextual
from metarl.envs.autoreset import where_done


def _fresh(operand):
    key, scale = operand
    return {"x": jax.random.uniform(key, (3,), minval=1.0, maxval=2.0) * scale, "n": jnp.int32(7)}


@pytest.mark.parametrize("chunk", [0.25, 1.0])
@pytest.mark.parametrize("strategy", RESET_STRATEGIES)
def test_where_done_matches_plain_select(strategy, chunk):
    select = where_done(_fresh, chunk, strategy)
    n = 10
    keys = jax.random.split(jax.random.key(0), n)
    scale = jnp.arange(n, dtype=jnp.float32)
    current = {"x": -jnp.ones((n, 3)), "n": jnp.arange(n, dtype=jnp.int32)}
    for pattern in ([0] * n, [1] * n, [0, 1, 1, 0, 0, 0, 1, 0, 1, 1], [1] + [0] * (n - 1)):
        done = jnp.asarray(pattern, bool)
        got = jax.jit(jax.vmap(select))(done, (keys, scale), current)
        fresh = jax.jit(jax.vmap(_fresh))((keys, scale))
        for name in ("x", "n"):
            d = done.reshape((n,) + (1,) * (current[name].ndim - 1))
            want = np.where(d, fresh[name], current[name])
            np.testing.assert_array_equal(got[name], want)


@pytest.mark.parametrize("strategy", RESET_STRATEGIES)
def test_where_done_nested_vmap(strategy):
    select = where_done(_fresh, 0.5, strategy)
    keys = jax.random.split(jax.random.key(1), 6).reshape(2, 3)
    scale = jnp.ones((2, 3))
    done = jnp.asarray([[True, False, True], [False, False, True]])
    current = {"x": jnp.zeros((2, 3, 3)), "n": jnp.zeros((2, 3), jnp.int32)}
    got = jax.jit(jax.vmap(jax.vmap(select)))(done, (keys, scale), current)
    np.testing.assert_array_equal(got["n"], np.where(done, 7, 0))
    assert np.all((np.abs(got["x"]).sum(-1) > 0) == np.asarray(done))


def test_unknown_strategy_lists_the_choices():
    with pytest.raises(ValueError, match="dense"):
        make_contextual("inverted_pendulum", C.ContextSpace({}), reset_strategy="fast")
    with pytest.raises(ValueError, match="loop"):
        where_done(_fresh, 0.5, "sparse")


def test_strategies_give_identical_env_states():
    """A real Brax env, episodes ending at different steps (short episodes and
    random actions), contexts resampled per episode: same states for every
    strategy, and resets happened."""
    space = C.ContextSpace(
        {"gravity": C.Scale(0.5, 1.5), "mass": C.Scale(0.7, 1.3, per_element=True)}
    )
    n, steps = 12, 40
    rollouts = {}
    for strategy in RESET_STRATEGIES:
        env = make_contextual(
            "inverted_pendulum",
            space,
            backend="generalized",
            episode_length=9,
            reset_strategy=strategy,
            reset_chunk=0.25,
        )

        def run(key, env=env):
            state = jax.vmap(env.reset)(jax.random.split(key, n))

            def body(state, k):
                a = jax.random.uniform(k, (n, env.action_size), minval=-1, maxval=1)
                state = jax.vmap(env.step)(state, a)
                return state, (state.obs, state.info["context"]["gravity"], state.done)

            return jax.lax.scan(body, state, jax.random.split(key, steps))

        rollouts[strategy] = jax.jit(run)(jax.random.key(3))
    _, (obs, gravity, done) = rollouts["loop"]
    assert 0 < float(done.mean()) < 1
    # a done step returns the first state of the next episode, in a new context
    changed = np.asarray(gravity[1:] != gravity[:-1])
    np.testing.assert_array_equal(changed, np.asarray(done[1:] > 0))
    for strategy, rollout in rollouts.items():
        for a, b in zip(jax.tree.leaves(rollout), jax.tree.leaves(rollouts["loop"]), strict=True):
            np.testing.assert_array_equal(_raw(a), _raw(b), err_msg=strategy)


def _raw(x):
    return np.asarray(jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x)
