"""Exact auto-reset: ``fresh_fn(operand) if done else current``, per env.

`where_done(fresh_fn, chunk, strategy)` returns `select(done, operand, current)`.
Every strategy computes the same states: a done env restarts from
``fresh_fn(operand)``, its own fresh reset. They agree to float rounding, and bit
for bit only where XLA happens to round each strategy's program alike: it fuses
each differently and computes a reset in batches of another size, and contacts
amplify a rounding difference (hopper, 32 envs, 40 random steps on 2 CPU cores:
the loop against dense 4.7e-4 apart in an observation on Brax's generalized
backend, 1.9e-6 on MJX; at 8 envs bit for bit on one host, 6.6e-7 apart on
another, whose CPU has AVX-512). They differ in what they compute
under `jax.vmap` (users and trainers keep writing ``jax.vmap(env.step)``; the
function carries a `jax.custom_batching` rule):

* ``"dense"``: ``jnp.where(done, vmap(fresh_fn)(operand), current)``: a reset
  for every env at every step, kept only where done. No data-dependent
  control flow, so nothing waits on the host: the fastest on a GPU, where a
  step is a fixed sequence of kernels whose cost barely depends on the batch.
* ``"loop"``: gathers the indices of the done envs and computes fresh states
  only for them, in chunks of ``ceil(chunk * batch)`` envs (at least 2), then
  scatters them back. Cost proportional to the number of done envs: the fastest
  on a CPU (DESIGN.md: a dense reset costs 6-15% of CPU throughput), slow on a
  GPU, where every trip waits on the host. The chunks are a loop of a fixed
  batch / chunk trips, each a `lax.cond` that skips the chunks past the last
  done env, not a `while_loop` of ceil(#done / chunk) trips: JAX's dead-code
  elimination enters scans and conditionals but not while loops, and XLA did not
  prune the state through the nested loops of a rollout either, so a while loop
  kept every field of the physics state alive through the step, also those the
  next step recomputes before reading (ant on MJX: all 144 arrays of `mjx.Data`
  carried through each physics substep, against plain Brax's 60, and 0.90x of
  its speed on 2 CPU cores; 0.97-0.99x with the fixed loop,
  benchmarks/results/README.md).
* ``"compact"``: the loop, with its first chunk computed unconditionally
  (outside the loop).
* ``"auto"`` (default): ``"loop"`` where JAX's default backend is the CPU,
  ``"dense"`` elsewhere, chosen when the function is traced (`on_cpu`).
  (`ContextualEnv`'s own ``"auto"`` is the loop on CPU and the stock elsewhere.)
* ``"pool"``: `pooled_where_done`. Every env keeps its *next* fresh state,
  computed ahead; a done env swaps it in, and the pool is refilled in bulk
  (loop on CPU, dense elsewhere) only at steps where some done env's entry was
  already used. Exact because an env's next reset depends only on inputs that
  change when it resets (its key, reset count, episode index, context) or
  through `ContextualEnv.set_ranges`, which empties the pool of every env whose
  ranges it changes. A dense refill
  every k steps costs 1/k of "dense"; it adds one `lax.cond` per step.
* ``"stock"``: the pool, which PPO's rollout deepens into a *stock* of each
  env's next ``depth`` fresh states (`stock_refill`), refilled by its owner in whole
  chunks where some env could run short before its next chance
  (`ContextualEnv.refill`, `refill_stocks`): the step then only takes an entry
  (`ContextualEnv.stock`). Outside a stocked rollout it is the pool.

Nested vmaps (envs inside contexts) work: the outer vmap batches the loop
with a select.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

STRATEGIES = ("auto", "loop", "compact", "dense", "pool", "stock")
POOLED = ("pool", "stock")  # the strategies whose state carries fresh states


def _where(done: jax.Array, new: Any, old: Any) -> Any:
    def pick(n, o):
        d = jnp.reshape(done, done.shape + (1,) * (o.ndim - done.ndim))
        return jnp.where(d, n, o)

    return jax.tree.map(pick, new, old)


def check_strategy(strategy: str) -> str:
    if strategy not in STRATEGIES:
        raise ValueError(
            f"unknown reset strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}"
        )
    return strategy


def where_done(
    fresh_fn: Callable[[Any], Any], chunk: float, strategy: str = "auto"
) -> Callable[[Any, Any, Any], Any]:
    """Builds select(done, operand, current) -> fresh_fn(operand) where done, else current.

    Args:
      fresh_fn: one env's operand -> a pytree shaped like `current`. It must
        not close over traced values (pass them in `operand`).
      chunk: fraction of the batch reset per loop trip under vmap, in (0, 1]
        (used by the "loop" and "compact" strategies).
      strategy: one of `STRATEGIES` (see the module docstring).
    """
    if check_strategy(strategy) in POOLED:
        raise ValueError(f"strategy {strategy!r} keeps state: build it with pooled_where_done")
    fresh_fn = _traced_once(fresh_fn)
    batched_impl = _batched_impls(fresh_fn, chunk)

    @jax.custom_batching.custom_vmap
    def select(done, operand, current):
        return _where(done, fresh_fn(operand), current)

    @select.def_vmap
    def _batched(axis_size, in_batched, done, operand, current):
        done, operand, current = _broadcast(axis_size, (done, operand, current), in_batched)
        out = batched_impl[strategy](done, operand, current)
        return out, jax.tree.map(lambda _: True, out)

    return select


def _traced_once(fresh_fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """`fresh_fn` jitted: `custom_vmap` traces the unbatched `select` (one reset) and
    its batching rule vmaps the reset again; both find one trace in JAX's cache, and
    the rule batches its jaxpr instead of running the env's Python a second time.
    With the learner's loop traced once (`learner.iterate_fn`), hopper's PPO program
    traces in 2.8 s instead of 5.8 s (2 CPU cores): host time before every first
    compile, on any device."""
    return jax.jit(fresh_fn)


def _broadcast(axis_size: int, args: tuple, in_batched: list) -> list:
    def batch(x, is_batched):
        return x if is_batched else jnp.broadcast_to(x, (axis_size,) + jnp.shape(x))

    return [jax.tree.map(batch, a, b) for a, b in zip(args, in_batched, strict=True)]


def trip_size(batch: int, chunk: float) -> int:
    """Envs the loop resets per trip: `chunk` of the `batch`, at least 2. At least 2
    because XLA compiles a vmap over one env as the unbatched function, which rounded
    differently from the batched reset (6e-8 in inverted_pendulum's mass matrix), where
    the tests check the strategies bit for bit."""
    return min(batch, max(2, math.ceil(batch * chunk)))


def check_chunk(chunk: Any, name: str = "chunk") -> None:
    """Refuses a `chunk` that is not a fraction of the batch in (0, 1] (a string
    failed at a comparison, naming neither it nor its range; True read as 1.0)."""
    if isinstance(chunk, bool) or not isinstance(chunk, numbers.Real) or not 0 < chunk <= 1:
        raise ValueError(f"{name} must be a fraction of the batch in (0, 1], got {chunk!r}")


def _batched_impls(fresh_fn: Callable[[Any], Any], chunk: float) -> dict[str, Callable]:
    """strategy -> batched (done[B], operand, current) -> fresh where done, else current."""
    check_chunk(chunk)

    def dense(done, operand, current):
        return _where(done, jax.vmap(fresh_fn)(operand), current)

    def looped(done, operand, current, *, first_outside: bool):
        axis_size = done.shape[0]
        size = trip_size(axis_size, chunk)
        padded = math.ceil(axis_size / size) * size
        order = jnp.nonzero(done, size=padded, fill_value=axis_size)[0]
        trips = (jnp.sum(done.astype(jnp.int32)) + size - 1) // size  # chunks to reset

        def reset_chunk(i, state):
            idx = jax.lax.dynamic_slice(order, (i * size,), (size,))
            rows = jnp.minimum(idx, axis_size - 1)
            fresh = jax.vmap(fresh_fn)(jax.tree.map(lambda x: x[rows], operand))
            return jax.tree.map(lambda s, f: s.at[idx].set(f, mode="drop"), state, fresh)

        def body(i, state):  # a fixed trip count: JAX lowers the loop as a scan
            return jax.lax.cond(i < trips, reset_chunk, lambda i, s: s, i, state)

        if not first_outside:
            return jax.lax.fori_loop(0, padded // size, body, current)
        state = reset_chunk(0, current)
        if padded == size:
            return state
        return jax.lax.fori_loop(1, padded // size, body, state)

    impls = {
        "dense": dense,
        "loop": lambda *a: looped(*a, first_outside=False),
        "compact": lambda *a: looped(*a, first_outside=True),
    }
    impls["auto"] = lambda *a: impls["loop" if on_cpu() else "dense"](*a)
    return impls


def on_cpu() -> bool:
    """Whether "auto" picks the CPU's strategies: JAX's default backend, read at trace
    time. Not `jax.lax.platform_dependent`: on a GPU (H200, JAX 0.11.2) a step holding
    one ran MJX's ant at 0.76x of plain Brax, the same step without it at 1.00x
    (benchmarks/results/README.md). A program jitted onto a device of another kind
    than the default still resets exactly, with the other platform's strategy."""
    return jax.default_backend() == "cpu"


GUARDS = ("loop", "cond")


def pooled_where_done(
    fresh_fn: Callable[[Any], Any], chunk: float, refill: str = "auto", guard: str = "loop"
) -> Callable[[Any, Any, Any, Any, Any], Any]:
    """Builds select(done, operand, current, pending, ready) -> (state, pending, ready).

    ``pending`` is one env's next fresh state, valid where ``ready``; `operand`
    must be the inputs of that next reset (what `fresh_fn` would be called with
    if the env were done now). Returns ``pending if done else current`` (with
    `pending` computed first where it was not ready), the pool and the new
    readiness (False where done: the entry was used). Under vmap the pool is
    refilled, for every env whose entry is not ready, only at steps where a
    done env needs it (a loop of 0 or 1 trips per step), by the stateless
    strategy `refill` ("auto": loop on CPU, dense elsewhere). Same states as
    `where_done`. `guard`: how a step decides whether to refill, a loop of 0 or 1
    trips ("loop") or `lax.cond` ("cond", which XLA on a GPU may run as a CUDA-graph
    conditional node without the host reading the predicate; measured by
    `benchmarks/env_throughput.py --variants contextual_pool_cond`).
    """
    if check_strategy(refill) in POOLED:
        raise ValueError(f"refill must be a stateless strategy, not {refill!r}")
    if guard not in GUARDS:
        raise ValueError(f"unknown refill guard {guard!r}; choose one of {', '.join(GUARDS)}")
    fresh_fn = _traced_once(fresh_fn)
    refill_impl = _batched_impls(fresh_fn, chunk)[refill]

    @jax.custom_batching.custom_vmap
    def select(done, operand, current, pending, ready):
        pending = _where(ready, pending, fresh_fn(operand))
        return _where(done, pending, current), pending, ready & ~done

    @select.def_vmap
    def _batched(axis_size, in_batched, done, operand, current, pending, ready):
        done, operand, current, pending, ready = _broadcast(
            axis_size, (done, operand, current, pending, ready), in_batched
        )
        needed = jnp.any(done & ~ready)
        refilled = lambda p: refill_impl(~ready, operand, p)  # noqa: E731
        if guard == "cond":
            pending = jax.lax.cond(needed, refilled, lambda p: p, pending)
        else:  # A loop of 0 or 1 trips: XLA rounds a cond branch differently (seen on
            # CPU), a loop body as the other strategies do.
            trips = needed.astype(jnp.int32)
            pending = jax.lax.fori_loop(0, trips, lambda _, p: refilled(p), pending)
        ready = ready | needed
        out = (_where(done, pending, current), pending, ready & ~done)
        return out, jax.tree.map(lambda _: True, out)

    return select


def stock_refill(
    fresh_fn: Callable[[Any, Any], Any], pack: Callable[[Any], Any] = lambda fresh: fresh
) -> Callable[[Any, Any, Any, Any, Any], Any]:
    """Builds refill(args, origin, lo, hi, entries) -> entries, for a stock of fresh states.

    A stock holds one env's next ``depth`` fresh states, each as `pack` makes it of one
    env's fresh state (`ContextualEnv`'s: its leaves joined per dtype), in leaves with a
    leading [depth] axis, as a ring: the state ``a`` places ahead (0 <= a < depth) sits
    at entry ``(origin + a) mod depth``, so that a refill moves none of them (until
    2026-11-27 the stock was shifted so that entry 0 came next, a copy of the whole
    stock at every refill: on 2 CPU cores, stocks of 16, the refill took 32.6 ms against
    16.2 ms on hopper at 2048 envs, 73.0 ms against 27.2 ms on ant (MJX) at 1024,
    `benchmarks/stock_refill.py`). The refill computes the states ``a`` in [lo, hi),
    ``pack(fresh_fn(args, a))`` from the env's `args`, into their entries, and keeps
    every other entry.

    Under vmap only those states are computed, gathered over every env into chunks of
    num_envs (at least 2), in a `while_loop` of as many trips as the chunks need: once
    per refill, where the per-step strategies ask at every step. A trip finds the env
    and the ``a`` of each of its rows from the envs' counts (hi - lo) alone, and gathers
    one env's `args` per row: no work in proportion to num_envs x depth (until
    2026-12-05 each refill broadcast every env's inputs over the depth and searched all
    num_envs x depth entries for the stale ones; on 2 CPU cores, inverted_pendulum with
    a stock of 32, `benchmarks/stock_refill.py`, two runs each: a refill took 10.6-11.7 ms
    at 1024 envs and 127-133 ms at 16384, now 9.2-11.4 and 111-120 ms; hopper at 2048
    envs and ant on MJX at 1024, stocks of 16, whose resets cost more, unchanged to
    noise; benchmarks/results/README.md). Chunks of num_envs, not the
    env's `reset_chunk`: on 2 CPU cores, inverted_pendulum at 1024 envs ran at 0.888x
    of plain Brax with chunks of 1/16 (44 trips a refill), 0.912x with 1/4 and 0.933x
    with whole chunks (3 trips), against the pool's 0.92-0.94x. Same states as
    `where_done`: every entry is its env's own fresh reset.
    """
    fresh_fn = _traced_once(fresh_fn)

    @jax.custom_batching.custom_vmap
    def refill(args, origin, lo, hi, entries):
        depth = jax.tree.leaves(entries)[0].shape[0]
        ahead = jnp.mod(jnp.arange(depth) - origin, depth)  # the state entry k holds
        fresh = jax.vmap(fresh_fn, in_axes=(None, 0))(args, ahead)
        return _where((ahead >= lo) & (ahead < hi), jax.vmap(pack)(fresh), entries)

    @refill.def_vmap
    def _batched(axis_size, in_batched, args, origin, lo, hi, entries):
        args, origin, lo, hi, entries = _broadcast(
            axis_size, (args, origin, lo, hi, entries), in_batched
        )
        depth = jax.tree.leaves(entries)[0].shape[1]
        pairs = axis_size * depth
        kept = jax.tree.map(lambda x: x.reshape((pairs,) + x.shape[2:]), entries)
        lo = jnp.clip(lo, 0, depth)
        count = jnp.maximum(jnp.clip(hi, 0, depth) - lo, 0)  # [B] states to compute
        ends = jnp.cumsum(count)  # the states are numbered env by env: env e's are
        starts = ends - count  # [starts[e], ends[e])
        size = min(pairs, max(2, axis_size))
        trips = (ends[-1] + size - 1) // size
        envs = jnp.arange(axis_size)

        def body(carry):
            i, state = carry
            first = i * size  # this trip computes states [first, first + size)
            numbers = first + jnp.arange(size)
            # each row's env: the last env whose first state is at or before the row
            # (an env that began before the trip holds its first row)
            begins = (count > 0) & (starts >= first) & (starts < first + size)
            mark = jnp.full(size, -1, jnp.int32).at[jnp.where(begins, starts - first, size)]
            mark = mark.max(envs, mode="drop").at[0].max(jnp.sum(ends <= first))
            env = jnp.minimum(jax.lax.cummax(mark), axis_size - 1)
            ahead = jnp.clip(lo[env] + numbers - starts[env], 0, depth - 1)
            slot = jnp.mod(origin[env] + ahead, depth)
            idx = jnp.where(numbers < ends[-1], env * depth + slot, pairs)  # pairs: dropped
            fresh = jax.vmap(fresh_fn)(jax.tree.map(lambda x: x[env], args), ahead)
            fresh = jax.vmap(pack)(fresh)
            state = jax.tree.map(lambda s, f: s.at[idx].set(f, mode="drop"), state, fresh)
            return i + 1, state

        out = jax.lax.while_loop(lambda c: c[0] < trips, body, (jnp.int32(0), kept))[1]
        out = jax.tree.map(lambda x: x.reshape((axis_size, depth) + x.shape[1:]), out)
        return out, jax.tree.map(lambda _: True, out)

    return refill
