"""Exact auto-reset that computes fresh states only for the envs that are done.

`where_done(fresh_fn, chunk)` returns `select(done, operand, current)`, which
for one env means ``fresh_fn(operand) if done else current``. Written plainly,
``jnp.where(done, fresh_fn(operand), current)`` computes a fresh reset for
every env at every step, even though only a few are done: that costs 6-15% of
throughput with 1024 envs (DESIGN.md). Brax avoids the cost by reusing a
cached first state, which is wrong once every episode has its own context.

Here the function carries a custom batching rule (`jax.custom_batching`):
under `jax.vmap` it gathers the indices of the done envs, computes fresh
states for them in chunks of `chunk` envs inside a `while_loop` whose trip
count is ceil(#done / chunk), and scatters them back. The result is exactly
the plain `where`, at a cost proportional to the number of done envs. Users
and trainers keep writing `jax.vmap(env.step)`. Nested vmaps (envs inside
contexts) still work: the outer vmap batches the loop with a select.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp


def _where(done: jax.Array, new: Any, old: Any) -> Any:
    def pick(n, o):
        d = jnp.reshape(done, done.shape + (1,) * (o.ndim - done.ndim))
        return jnp.where(d, n, o)

    return jax.tree.map(pick, new, old)


def where_done(fresh_fn: Callable[[Any], Any], chunk: float) -> Callable[[Any, Any, Any], Any]:
    """Builds select(done, operand, current) -> fresh_fn(operand) where done, else current.

    Args:
      fresh_fn: one env's operand -> a pytree shaped like `current`. It must
        not close over traced values (pass them in `operand`).
      chunk: fraction of the batch reset per loop trip under vmap, in (0, 1].
    """
    if not 0 < chunk <= 1:
        raise ValueError(f"chunk must be a fraction in (0, 1], got {chunk}")

    @jax.custom_batching.custom_vmap
    def select(done, operand, current):
        return _where(done, fresh_fn(operand), current)

    @select.def_vmap
    def _batched(axis_size, in_batched, done, operand, current):
        def batch(x, is_batched):
            return x if is_batched else jnp.broadcast_to(x, (axis_size,) + jnp.shape(x))

        done = batch(done, in_batched[0])
        operand = jax.tree.map(batch, operand, in_batched[1])
        current = jax.tree.map(batch, current, in_batched[2])

        size = max(1, math.ceil(axis_size * chunk))
        padded = math.ceil(axis_size / size) * size
        order = jnp.nonzero(done, size=padded, fill_value=axis_size)[0]
        trips = (jnp.sum(done.astype(jnp.int32)) + size - 1) // size

        def body(i, state):
            idx = jax.lax.dynamic_slice(order, (i * size,), (size,))
            rows = jnp.minimum(idx, axis_size - 1)
            fresh = jax.vmap(fresh_fn)(jax.tree.map(lambda x: x[rows], operand))
            return jax.tree.map(lambda s, f: s.at[idx].set(f, mode="drop"), state, fresh)

        out = jax.lax.fori_loop(0, trips, body, current)
        return out, jax.tree.map(lambda _: True, out)

    return select
