"""`ContextualEnv`: an env whose physics is resampled per episode or trial.

The env is a Brax env, a MuJoCo Playground env or a user's own MJCF
(`metarl.envs.MjcfEnv`); `metarl.envs.sources` adapts each to one interface.

One env (batch it with `jax.vmap`). `reset(rng, ranges)` draws a context from
`ranges` (a `ContextSpace`; the bound space if None), writes it into the
System and stores the draw in ``state.info["context"]``, and the model
constants MuJoCo derives from it (`Binding.derive`) in ``state.info["derived"]``;
`step` rebuilds the System from those two. Episodes end on termination or after
`episode_length` steps (truncation, kept distinct); the env then resets
itself, and every `episodes_per_trial` episodes it draws a new context from
the ranges stored in its state, which `set_ranges` replaces between calls
without recompiling.

Per-step bookkeeping lives in ``state.info["trial"]``, a typed `TrialInfo`.
"""

from __future__ import annotations

import functools
import math
import numbers
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from brax import envs as brax_envs
from brax.envs.base import Env, PipelineEnv, State
from flax import struct

from metarl import parallel
from metarl.contexts import BACKENDS, Binding, Context, ContextSpace, PerEnv, bind
from metarl.contexts.space import per_env_hint
from metarl.envs import sources
from metarl.envs.autoreset import (
    POOLED,
    check_chunk,
    check_strategy,
    on_cpu,
    pooled_where_done,
    stock_refill,
    where_done,
)
from metarl.envs.mjcf import MjcfEnv

CONTEXT = "context"  # state.info key: {name: sampled value}
DERIVED = "derived"  # state.info key: {System field: value} derived from the context
TRIAL = "trial"  # state.info key: TrialInfo
POOL = "reset_pool"  # state.info key, strategies "pool", "stock": ResetPool (ResetStock: stocked)

VISIBILITY = (False, True, "privileged")


@struct.dataclass
class TrialInfo:
    """Per-env episode and trial bookkeeping (shapes for one env)."""

    ranges: ContextSpace  # distributions new contexts are drawn from
    key: jax.Array  # typed key[]: this env's reset stream; episode i uses fold_in(key, i)
    resets: jax.Array  # int32[]: episodes started so far
    steps: jax.Array  # int32[]: steps of the episode the last transition belongs to
    episode_return: jax.Array  # float32[]: its return so far (the full return where done)
    episode: jax.Array  # int32[]: index of the current episode within its trial
    truncated: jax.Array  # float32[]: 1 where the last step hit the time limit
    nonfinite: jax.Array  # float32[]: 1 where the last step produced NaN/inf and was cut
    new_episode: jax.Array  # float32[]: 1 where `obs` is the first of an episode
    new_trial: jax.Array  # float32[]: 1 where `obs` is the first of a trial
    final_obs: Any  # observation the finished episode ended on (== obs where not done)
    # float32[]: 1 where the running trial's context was drawn from `ranges` as they are
    # now; 0 after `set_ranges` changed this env's ranges, until its next trial starts
    # (an episode then still runs in a context of the earlier ranges: ADR must not
    # credit it to the new ones)
    current_ranges: jax.Array


@struct.dataclass
class ResetPool:
    """reset_strategy="pool": this env's next fresh
    (pipeline_state, obs, env info, (context, derived))."""

    pending: Any
    ready: jax.Array  # bool[]: pending is this env's next reset (False: to be refilled)


@struct.dataclass
class ResetStock:
    """reset_strategy="stock" in a trainer's rollout (`ContextualEnv.stock`): this
    env's next ``depth`` fresh (pipeline_state, obs, env info, (context, derived)),
    refilled by `ContextualEnv.refill` before it could run out. A step takes
    its entry and never resets: the reset is not in the step's program at all."""

    # {dtype name: [depth, n]}, a ring: the entry of reset number r (base <= r < base +
    # depth) is entry r mod depth, so that a refill moves none of them. An entry is its
    # fresh state's leaves flattened and joined per dtype (`_pack`): a step reads it with
    # one gather per dtype, not one per leaf, and a refill writes it with one scatter per
    # dtype (until 2026-12-05 one per leaf: on 2 CPU cores, 1024 envs, the packed stock
    # ran 1.011x (inverted_pendulum) and 1.021x (ant on MJX) of the unpacked one's speed;
    # compiled for an H100, ant on MJX at 8192 envs, a refill's trip launched 182 kernels,
    # not 271; benchmarks/results/README.md)
    entries: dict[str, jax.Array]
    base: jax.Array  # int32[]: it holds resets [TrialInfo.resets, base + depth) (a full
    # refill sets base = resets)
    overrun: jax.Array  # bool[], sticky: a done env found no entry left (refilled too late)

    def depth(self, batch: tuple[int, ...] = ()) -> int:
        """Entries per env (`batch`: the states' batch shape, in front of the depth)."""
        return jax.tree.leaves(self.entries)[0].shape[len(batch)]


def _strong(tree):
    """Drops JAX weak types (a Python float in env code) so that states keep one
    signature from call to call: a weak-typed leaf would recompile the trainer."""
    return jax.tree.map(lambda x: jax.lax.convert_element_type(x, jnp.result_type(x)), tree)


# MuJoCo's bound on a sane state (mjMAXVAL: its mj_checkPos, mj_checkVel and
# mj_checkAcc reset a simulation past it); MJX checks nothing. Observations and
# rewards past it come from physics that blew up: finite, they reached the learner
# (observations of 1e22 a step before NaN) and overflowed its statistics and losses.
MAX_VALUE = 1e10


def _finite(tree) -> jax.Array:
    """Whether every value of `tree` is finite and within `MAX_VALUE` of 0."""
    leaves = [jnp.all(jnp.isfinite(x) & (jnp.abs(x) <= MAX_VALUE)) for x in jax.tree.leaves(tree)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.array(True)


def _cut(finite: jax.Array, tree: Any) -> Any:
    """`tree`'s floating-point leaves, zeroed where the step was not `finite`."""

    def zero(x):
        x = jnp.asarray(x)
        return (
            jnp.where(finite, x, 0).astype(x.dtype) if jnp.issubdtype(x.dtype, jnp.inexact) else x
        )

    return jax.tree.map(zero, tree)


def _pack(tree) -> dict[str, jax.Array]:
    """`tree`'s leaves flattened and joined, one array per dtype, in leaf order:
    {dtype name: [n]}. `_unpack` takes it apart again."""
    groups: dict[str, list] = {}
    for leaf in jax.tree.leaves(tree):
        groups.setdefault(jnp.dtype(leaf.dtype).name, []).append(jnp.ravel(leaf))
    return {k: jnp.concatenate(v) for k, v in groups.items()}


def _unpack(packed: dict[str, jax.Array], like: Any) -> Any:
    """The tree that `_pack` packed into `packed`: `like`'s structure, shapes and dtypes
    (arrays or `jax.ShapeDtypeStruct`s)."""
    leaves, treedef = jax.tree.flatten(like)
    kinds = [jnp.dtype(leaf.dtype).name for leaf in leaves]
    sizes = [math.prod(leaf.shape) for leaf in leaves]
    wanted: dict[str, int] = {}
    for k, n in zip(kinds, sizes):
        wanted[k] = wanted.get(k, 0) + n
    held = {k: v.shape[0] for k, v in packed.items()}
    if wanted != held:
        raise ValueError(
            f"a stock's entry holds {held} numbers per dtype, the env's running state "
            f"{wanted}: the stock was made by another env (or another version of metarl), "
            "or the env's step returns other arrays than its reset"
        )
    at = dict.fromkeys(held, 0)
    out = []
    for leaf, k, n in zip(leaves, kinds, sizes, strict=True):
        out.append(jax.lax.slice_in_dim(packed[k], at[k], at[k] + n).reshape(leaf.shape))
        at[k] += n
    return jax.tree.unflatten(treedef, out)


class ContextualEnv(Env):
    """See module docstring. Build one with `make_contextual`."""

    def __init__(
        self,
        env: sources.Source,
        binding: Binding,
        episode_length: int,
        episodes_per_trial: int,
        visible_context: bool | str,
        reset_chunk: float,
        reset_strategy: str = "auto",
    ):
        self._env = env
        self.binding = binding
        self.episode_length = episode_length
        self.episodes_per_trial = episodes_per_trial
        self.visible_context = visible_context
        # "auto": on a CPU the loop, for every backend (2 CPU cores, 1024 envs, loop /
        # pool: ant 1.00x / 0.97x of plain Brax, inverted_pendulum 0.96x / 0.95x,
        # hopper 0.98x / 0.98x; benchmarks/results/README.md). Elsewhere the stock, on
        # every backend: on Brax's own, whose reset costs most of a step (an H200 at
        # 8192 envs, stock / pool: hopper 0.98x / 0.85x of plain Brax, ant 0.99x /
        # 0.96x, inverted_pendulum 0.98x / 0.96x; PPO's iteration, hopper at 2048
        # envs, in two runs of paired rounds: 0.84x and 0.98x of the pool's time), and
        # on MJX, where dense draws a context and derives its constants for every env
        # at every step (ant, H200, 8192 envs: stock 0.967x of plain, dense 0.940x).
        # Outside a stocked rollout the stock is the pool. Decided here, from JAX's
        # default backend: the stock lives in the state. The strategy in use is
        # `reset_strategy`, recorded with a run (a resume keeps it).
        self.requested_strategy = check_strategy(reset_strategy)  # "auto" or the one given
        if reset_strategy == "auto":
            reset_strategy = "loop" if on_cpu() else "stock"
        self.reset_strategy = reset_strategy
        check_chunk(reset_chunk, "reset_chunk")
        self.reset_chunk = reset_chunk
        # One trace of an episode's first state, shared by `reset` and every reset a
        # `step` may make (its operands have the same shapes in both): the wrapped
        # env's reset, the draw and its derived constants were traced and lowered
        # twice in every program that resets and steps. XLA inlines the call.
        self._first = jax.jit(self._first_state)
        if reset_strategy in POOLED:
            self._select = pooled_where_done(self._fresh, reset_chunk)
            self._refill = stock_refill(self._fresh_at, pack=_pack)
        else:
            self._select = where_done(self._fresh, reset_chunk, reset_strategy)

    # ---- Brax Env interface ----
    @property
    def observation_size(self):
        base = self._env.observation_size
        if self.visible_context == "privileged":
            return {"state": base, "privileged": self.binding.context_size}
        return base + (self.binding.context_size if self.visible_context else 0)

    @property
    def action_size(self) -> int:
        return self._env.action_size

    @property
    def backend(self) -> str:
        return self._env.backend

    @property
    def unwrapped(self) -> Any:
        """The env as given: a Brax PipelineEnv, a Playground env or an MjcfEnv."""
        return self._env.env

    @property
    def space(self) -> ContextSpace:
        """The space the env was built with (its default ranges)."""
        return self.binding.space

    def default_context(self) -> Context:
        """The loaded environment's own values for every context name."""
        return self.binding.default_context()

    def reset(
        self, rng: jax.Array, ranges: ContextSpace | None = None, *, checked: bool = False
    ) -> State:
        """A fresh state in a context drawn from `ranges` (default: the env's space).

        Concrete ranges are validated at once, as `set_ranges` validates them; ranges
        traced inside jit by a host callback as the program runs, unless `checked`
        (see `set_ranges`)."""
        if not hasattr(rng, "dtype"):
            raise TypeError(
                f"reset needs a PRNG key (jax.random.key(seed)), got {type(rng).__name__} {rng!r}"
            )
        if ranges is None:
            ranges = self.space
        elif all(not isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(ranges)):
            ranges = self.binding.check_ranges(ranges)  # concrete: validate as set_ranges does
        elif checked:  # validated on the host before the program took them as arguments
            ranges = self.space.check_meaning(ranges)
        else:  # traced: numbers checked as the program runs
            ranges = self.binding.check_traced(self.space.check_meaning(ranges))
        key = (
            rng
            if jax.dtypes.issubdtype(rng.dtype, jax.dtypes.prng_key)
            else jax.random.wrap_key_data(rng)  # a legacy uint32 jax.random.PRNGKey
        )
        context0 = {e.name: jnp.zeros(e.draw_shape, jnp.float32) for e in self.binding.entries}
        derived0 = jax.eval_shape(self.binding.derive, context0)
        derived0 = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), derived0)
        first, (context, derived) = self._first(
            (key, jnp.int32(0), jnp.int32(0), jnp.zeros((), bool), (context0, derived0), ranges)
        )
        obs = self._observe(first.obs, context)
        zero = jnp.zeros((), jnp.float32)
        trial = TrialInfo(
            ranges=ranges,
            key=key,
            resets=jnp.int32(1),
            steps=jnp.int32(0),
            episode_return=zero,
            episode=jnp.int32(0),
            truncated=zero,
            nonfinite=zero,
            new_episode=jnp.ones((), jnp.float32),
            new_trial=jnp.ones((), jnp.float32),
            final_obs=obs,
            current_ranges=jnp.ones((), jnp.float32),
        )
        info = {**first.info, CONTEXT: context, DERIVED: derived, TRIAL: trial}
        if self.reset_strategy in POOLED:  # empty: filled when an env first finishes
            pending = (
                first.pipeline_state,
                first.obs,
                self._reset_info(first.info),
                (context, derived),
            )
            info[POOL] = ResetPool(pending, jnp.zeros((), bool))
        return _strong(State(first.pipeline_state, obs, zero, zero, first.metrics, info))

    @property
    def discrete_actions(self) -> bool:
        """True if the wrapped env takes an int action index (it sets
        ``discrete_actions = True``), False for a float action vector."""
        return bool(getattr(self._env.env, "discrete_actions", False))

    def step(self, state: State, action: jax.Array) -> State:
        expected = () if self.discrete_actions else (self.action_size,)
        if np.shape(action) != expected:
            raise ValueError(
                f"step: action of shape {np.shape(action)} for one env; expected {expected} "
                + ("(an action index)" if self.discrete_actions else f"({self.action_size} floats)")
                + "; batch envs with jax.vmap(env.step)"
            )
        trial: TrialInfo = state.info[TRIAL]
        drawn = (state.info[CONTEXT], state.info[DERIVED])
        context = drawn[0]
        # The wrapped env sees its own observation, without the context appended, and
        # done 0 (as Brax's AutoResetWrapper gives it): an env whose step never sets
        # done (reacher, half_cheetah, swimmer, pusher) passes on the one it gets, and
        # the 1 of the step that ended the last episode would end every later one.
        inner = state.replace(obs=self._base(state.obs), done=jnp.zeros_like(state.done))
        # No barrier between the physics and the reset's select: one on a CPU
        # (2026-11-24 to 2026-11-28) changed no state in any configuration tried,
        # on two hosts (benchmarks/results/README.md, 2026-11-28 (fence)).
        nstate = self._call(self._env.step, drawn, inner, action)

        steps = jnp.where(trial.new_episode > 0, 0, trial.steps) + 1
        finite = _finite((nstate.obs, nstate.reward))
        reward = jnp.where(finite, nstate.reward, 0.0).astype(jnp.float32)
        terminated = jnp.where(finite, nstate.done, 1.0).astype(jnp.float32)
        timeout = (steps >= self.episode_length).astype(jnp.float32)
        truncated = timeout * (1.0 - terminated)
        done = jnp.maximum(terminated, timeout)
        trial_over = (done > 0) & (trial.episode + 1 >= self.episodes_per_trial)
        final_obs = _cut(finite, self._observe(nstate.obs, context))

        operand = self._operand(trial, drawn, 0)  # this env's next reset, were it done now
        # A done env restarts from its own reset: physics, observation and the env's
        # own info (an episode's state kept there, such as a Playground task's
        # target or step counter, starts afresh, as Playground's full reset does).
        current = (nstate.pipeline_state, nstate.obs, self._reset_info(nstate.info), drawn)
        info = {}
        if isinstance(state.info.get(POOL), ResetStock):
            stock: ResetStock = state.info[POOL]
            depth = stock.depth()
            used = trial.resets - stock.base
            slot = jnp.mod(trial.resets, depth)  # this env's next reset's entry
            row = {  # this reset's entry: one gather per dtype (`ResetStock.entries`)
                k: jax.lax.dynamic_index_in_dim(e, slot, 0, False) for k, e in stock.entries.items()
            }
            entry = _unpack(row, current)  # a fresh state is shaped as the running one
            selected = jax.tree.map(lambda e, c: jnp.where(done > 0, e, c), entry, current)
            info[POOL] = stock.replace(overrun=stock.overrun | ((done > 0) & (used >= depth)))
        elif self.reset_strategy in POOLED:
            pool: ResetPool = state.info[POOL]
            selected, pending, ready = self._select(
                done > 0, operand, current, pool.pending, pool.ready
            )
            info[POOL] = ResetPool(pending, ready)
        else:
            selected = self._select(done > 0, operand, current)
        pipeline_state, base_obs, env_info, (context, derived) = selected
        obs = self._observe(base_obs, context)
        trial = trial.replace(
            resets=trial.resets + (done > 0).astype(jnp.int32),
            steps=steps,
            episode_return=jnp.where(trial.new_episode > 0, 0.0, trial.episode_return) + reward,
            episode=jnp.where(done > 0, jnp.where(trial_over, 0, trial.episode + 1), trial.episode),
            truncated=truncated,
            nonfinite=1.0 - finite.astype(jnp.float32),
            new_episode=done,
            new_trial=trial_over.astype(jnp.float32),
            final_obs=final_obs,
            current_ranges=jnp.where(trial_over, 1.0, trial.current_ranges),
        )
        # A cut step's metrics and the info only the step writes are zeroed like its
        # reward: no NaN leaves the env.
        ours = (CONTEXT, DERIVED, TRIAL, POOL)
        step_info = _cut(
            finite, {k: v for k, v in nstate.info.items() if k not in env_info and k not in ours}
        )
        info = {**step_info, **env_info, CONTEXT: context, DERIVED: derived, TRIAL: trial, **info}
        return _strong(
            nstate.replace(
                pipeline_state=pipeline_state,
                obs=obs,
                reward=reward,
                done=done,
                metrics=_cut(finite, nstate.metrics),
                info=info,
            )
        )

    def set_ranges(
        self, state: State, ranges: ContextSpace | PerEnv, *, checked: bool = False
    ) -> State:
        """Replaces the ranges new contexts are drawn from, for every env in `state`.

        `ranges`: shared by every env, or one row per env of a batched `state`
        (`PerEnv`: every parameter with the state's batch shape in front; nothing
        is guessed from shapes). Shapes are checked at once, in and out of jit;
        numbers (NaN or infinite bounds, low > high, physical limits) at once
        when they are concrete, and, when a jitted function computes them, by a
        host callback as its program runs (`Binding.check_traced`): the call
        raises the same ValueError. No recompilation when a jitted function
        receives the result.
        A trial already running keeps its context: an env whose ranges changed
        has ``TrialInfo.current_ranges`` 0 until its next trial starts.

        `checked=True` says that traced ranges are the program's arguments and their
        numbers were validated on the host before the call (``env.binding.check_ranges``,
        as `init_env_state`, `run_train` and the `Evaluator` do): the program then holds
        no callback. JAX's persistent compilation cache stores no program that holds a
        host callback, so without it every process compiles the program anew.
        """
        trial: TrialInfo = state.info[TRIAL]
        batch = trial.current_ranges.shape  # () for one env, [B] (or [S, B]) batched
        if isinstance(ranges, PerEnv):
            ranges, rows = ranges.ranges, batch
            self.space.check_compatible(ranges, rows)
        else:
            rows = ()
            try:
                self.space.check_compatible(ranges)
            except ValueError as shared:
                if hint := per_env_hint(self.space, ranges, batch):
                    raise ValueError(f"{shared}{hint}") from None
                raise
        if all(not isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(ranges)):
            ranges = self.binding.check_ranges(ranges, rows)
        elif not checked:  # computed inside jit: numbers checked when the program runs
            ranges = self.binding.check_traced(ranges, rows)
        new = jax.tree.map(
            lambda old, x: jnp.broadcast_to(jnp.asarray(x, old.dtype), old.shape),
            trial.ranges,
            ranges,
        )

        def same(old, x):  # per env: every number unchanged (NaN pins included)
            equal = (old == x) | (jnp.isnan(old) & jnp.isnan(x))
            return jnp.all(equal.reshape(batch + (-1,)), -1)

        unchanged = jnp.stack(
            [jnp.ones(batch, bool)] + jax.tree.leaves(jax.tree.map(same, trial.ranges, new))
        ).all(0)
        current = jnp.where(unchanged, trial.current_ranges, 0.0)
        info = {**state.info, TRIAL: trial.replace(ranges=new, current_ranges=current)}
        # the fresh states of the envs whose ranges changed were drawn from the old ones
        if isinstance(info.get(POOL), ResetStock):  # every entry to be drawn again
            empty = trial.resets - info[POOL].depth(batch)
            info[POOL] = info[POOL].replace(base=jnp.where(unchanged, info[POOL].base, empty))
        elif POOL in info:
            info[POOL] = info[POOL].replace(ready=info[POOL].ready & unchanged)
        return state.replace(info=info)

    def stock(self, state: State, depth: int) -> State:
        """One env's `state` (reset_strategy "stock" or "pool") holding a stock of its next `depth`
        fresh states, all still to be computed: call `refill` before stepping it, and
        again before it could run out (`stock_left`: every step takes at most one; a
        batch: `refill_stocks`). Its steps then take their fresh states from the stock
        and compile no reset. A done env that finds the stock empty sets
        ``state.info[POOL].overrun`` (and goes on from a wrong state): metarl's trainer
        calls `refill_stocks` before every unroll and refuses a state with an overrun.
        Vmap it over a batch of states."""
        if self.reset_strategy not in POOLED:
            raise ValueError(
                f'stock needs reset_strategy="stock" (or "pool"); this env resets with '
                f"{self.reset_strategy!r}"
            )
        if not isinstance(depth, int) or isinstance(depth, bool) or depth < 1:
            raise ValueError(f"stock: depth must be an integer >= 1, got {depth!r}")
        pool = state.info[POOL]
        if not isinstance(pool, ResetPool):
            raise ValueError("stock: this state already holds a stock")
        entries = {
            k: jnp.broadcast_to(x, (depth,) + x.shape) for k, x in _pack(pool.pending).items()
        }
        resets = state.info[TRIAL].resets
        stock = ResetStock(entries, resets - depth, jnp.zeros((), bool))
        return state.replace(info={**state.info, POOL: stock})

    def refill(self, state: State, level: jax.Array | int | None = None) -> State:
        """Computes fresh states into a stocked `state` (`stock`) until it holds its next
        `level` resets (None: the stock's depth, every entry used since the last refill;
        a level at or below what it holds computes nothing). Vmap it over a batch of
        states, with one level per env or one for all: only the entries to compute are
        computed, in chunks of num_envs over every env. `refill_stocks` picks the levels
        a loop of blocks of steps needs."""
        stock = state.info.get(POOL)
        if not isinstance(stock, ResetStock):
            raise ValueError("refill needs a stocked state: see ContextualEnv.stock")
        trial: TrialInfo = state.info[TRIAL]
        drawn = (state.info[CONTEXT], state.info[DERIVED])
        depth = stock.depth()
        held = depth - (trial.resets - stock.base)  # entries for resets [resets, resets + held)
        level = depth if level is None else jnp.clip(level, held, depth)
        # the stock is a ring (`ResetStock`): reset number resets + a sits at entry
        # (resets + a) mod depth, and those with a in [held, level) are computed
        entries = self._refill((trial, drawn), trial.resets, held, level, stock.entries)
        base = trial.resets + level - depth  # the stock holds resets [resets, base + depth)
        return state.replace(info={**state.info, POOL: stock.replace(entries=entries, base=base)})

    def stock_left(self, state: State) -> jax.Array:
        """int32[]: the fresh states a stocked `state` holds for its next resets: it may
        step that many more steps before a `refill` (every step takes at most one)."""
        stock = state.info.get(POOL)
        if not isinstance(stock, ResetStock):
            raise ValueError("stock_left needs a stocked state: see ContextualEnv.stock")
        return stock.depth() - (state.info[TRIAL].resets - stock.base)

    # ---- internals ----
    def _call(self, fn, drawn: tuple[Context, Context], *args):
        """`fn(*args)` on the System of `drawn` = (context, derived)."""
        b = self.binding
        context, derived = drawn
        with self._env.using(b.apply(context, derived), b.task_params(context)):
            return fn(*args)

    def _operand(self, trial: TrialInfo, drawn, ahead):
        """The inputs of this env's reset `ahead` resets after its next one (0: the next):
        (key, its number, the number of the reset that starts its trial, whether that
        trial is the running one, the running trial's (context, derived), ranges)."""
        r = trial.resets + ahead
        # the episode it starts is the episode index (trial.episode + ahead + 1) mod k
        start = r - (trial.episode + ahead + 1) % self.episodes_per_trial
        return (trial.key, r, start, start < trial.resets, drawn, trial.ranges)

    def _first_state(self, operand) -> tuple[State, tuple[Context, Context]]:
        """`_operand`'s inputs -> the first state of that episode and its (context,
        derived): the running trial's if it belongs to it, else the draw its trial
        started with (from the reset numbered `start`, the same at every reset of
        that trial)."""
        key, resets, start, running, (context, derived), ranges = operand
        k_context = jax.random.split(jax.random.fold_in(key, start))[0]
        k_reset = jax.random.split(jax.random.fold_in(key, resets))[1]
        new = self.binding.sample(k_context, ranges)
        new = (new, self.binding.derive(new))  # once per draw: `step` reuses it
        drawn = jax.tree.map(lambda n, c: jnp.where(running, c, n), new, (context, derived))
        first = self._call(self._env.reset, drawn, jax.random.key_data(k_reset))
        # its info keys, static: `_reset_info` reads them without tracing the reset again
        self.__dict__.setdefault("_reset_info_keys", tuple(first.info))
        # A reset that diverged (one that lets the robot settle, under a context that
        # blows up): its observation is zeroed, as a cut step's is; the next step,
        # simulating the same non-finite state, is cut and counted in `nonfinite`.
        return first.replace(obs=_cut(_finite(first.obs), first.obs)), drawn

    def _fresh(self, operand):
        first, drawn = self._first(operand)
        return first.pipeline_state, first.obs, self._reset_info(first.info), drawn

    def _fresh_at(self, args, ahead):
        """`_fresh` of this env's reset `ahead` resets after its next one; `args` =
        (its `TrialInfo`, its running (context, derived)): a stock's refill."""
        return self._fresh(self._operand(*args, ahead))

    @functools.cached_property
    def _reset_info_keys(self) -> tuple[str, ...]:
        """The wrapped env's own info keys that its reset sets: those of the first
        reset `_first` traced, else traced here (once, not run)."""
        key = jax.random.key_data(jax.random.key(0))
        return tuple(jax.eval_shape(lambda k: self._env.reset(k).info, key))

    def _reset_info(self, info: dict) -> dict:
        """The entries of the wrapped env's `info` that its reset sets (what an
        auto-reset restores); keys only its step adds keep their running values."""
        return {k: info[k] for k in self._reset_info_keys if k in info}

    def _base(self, obs):
        """The wrapped env's observation inside `obs` (the context removed)."""
        if not self.visible_context:
            return obs
        if self.visible_context == "privileged":
            return obs["state"]
        return obs[..., : obs.shape[-1] - self.binding.context_size]

    def _observe(self, base_obs, context):
        if not self.visible_context:
            return base_obs
        c = self.binding.normalise(context)
        if self.visible_context == "privileged":
            return {"state": base_obs, "privileged": c}
        return jnp.concatenate([base_obs, c])


def refill_stocks(env: ContextualEnv, states: State, steps: int) -> State:
    """A batch of stocked `states` ([num_envs] in front) made ready for `steps` more steps,
    in the fewest chunks of num_envs fresh states that get there, every chunk full.

    Each env must hold at least `steps` fresh states (`stock_left`: every step takes at
    most one). Where some env holds fewer, their deficit is computed in
    ceil(deficit / num_envs) chunks, and the room left in the last chunk raises the
    envs that hold the fewest (water-filling), up to the stock's depth: a stock deeper
    than `steps` then goes several blocks between refills, and each of its refills
    computes whole chunks of states that steps will take. A stock as deep as `steps`
    refills the entries the last block used, in as many chunks, as
    ``jax.vmap(env.refill)`` does (until 2026-12-04 every rollout did that: ant on MJX
    under random actions at 8192 envs computed a chunk of 8,192 for the 3,440 of 16
    steps). Exact all the same: an entry is its env's own next reset, whenever it is
    computed. Under an outer vmap (seeds) each batch chooses its own."""
    depth = states.info[POOL].depth(states.info[TRIAL].resets.shape)
    if not isinstance(steps, int) or isinstance(steps, bool) or not 1 <= steps <= depth:
        raise ValueError(
            f"refill_stocks: steps must be an int in 1..{depth} (the stock's depth), got {steps!r}"
        )
    held = jax.vmap(env.stock_left)(states)  # [B]
    chunk = max(2, held.shape[0])  # `stock_refill`'s chunks: num_envs, at least 2
    short = lambda level: jnp.sum(jnp.maximum(level - held, 0))  # noqa: E731
    room = -(-short(steps) // chunk) * chunk  # the deficit, rounded up to whole chunks
    costs = jax.vmap(short)(jnp.arange(depth + 1))  # [depth + 1], nondecreasing
    level = jnp.sum(costs[1:] <= room)  # the highest level whose cost fits (>= steps)
    # the rest of the room: one more entry for the first envs still at that level
    spare = room - costs[level]
    at_level = (held <= level) & (level < depth)
    bonus = at_level & (jnp.cumsum(at_level) <= spare)
    return jax.vmap(env.refill)(states, jnp.maximum(held, level) + bonus)


def _source(env: Any, backend: str | None, env_kwargs: dict) -> sources.Source:
    """The env argument of `make_contextual` as a source."""
    if isinstance(env, str) and env.startswith(sources.PLAYGROUND_PREFIX):
        if backend not in (None, "mjx"):
            raise ValueError(
                f"Playground envs run on MJX: backend must be None or 'mjx', got {backend!r}"
            )
        name = env[len(sources.PLAYGROUND_PREFIX) :]
        return sources.PlaygroundSource(sources.load_playground(name, env_kwargs))
    if isinstance(env, str):
        known = sorted(brax_envs._envs)  # noqa: SLF001 - Brax has no public listing
        if env not in known:
            raise ValueError(
                f"unknown Brax env {env!r}; valid names: {', '.join(known)} (or "
                f"'{sources.PLAYGROUND_PREFIX}<name>' for a MuJoCo Playground env)"
            )
        if backend is not None:
            env_kwargs["backend"] = backend
        return sources.BraxSource(brax_envs.get_environment(env, **env_kwargs))
    if env_kwargs:
        raise ValueError(f"env_kwargs {sorted(env_kwargs)} only apply to an env given by name")
    if isinstance(env, PipelineEnv):
        if backend is not None and backend != env.backend:
            raise ValueError(
                f"backend={backend!r} differs from the instance's backend {env.backend!r}; "
                "build the instance with that backend instead"
            )
        return sources.BraxSource(env)
    if isinstance(env, MjcfEnv) or sources.is_playground_env(env):
        if backend not in (None, "mjx"):
            raise ValueError(
                f"{type(env).__name__} runs on MJX: backend must be None or 'mjx', got {backend!r}"
            )
        return env if isinstance(env, MjcfEnv) else sources.PlaygroundSource(env)
    raise ValueError(
        "env must be a Brax env name, an unwrapped brax.envs.PipelineEnv, "
        f"'{sources.PLAYGROUND_PREFIX}<name>', a MuJoCo Playground env or a metarl.envs.MjcfEnv; "
        f"got {type(env).__name__} (pass the env before any training wrapper: metarl "
        "handles episodes and resets itself)"
    )


def make_contextual(
    env: Any,
    space: ContextSpace,
    *,
    backend: str | None = None,
    episode_length: int = 1000,
    episodes_per_trial: int = 1,
    visible_context: bool | str = False,
    reset_chunk: float = 0.0625,
    reset_strategy: str = "auto",
    **env_kwargs,
) -> ContextualEnv:
    """A contextual version of an env.

    Args:
      env: a Brax env name (``"hopper"``) or an unwrapped `PipelineEnv`; a MuJoCo
        Playground env name (``"playground/CartpoleBalance"``) or instance; or a
        `metarl.envs.MjcfEnv` (your own MJCF).
      space: the `ContextSpace` of quantities to vary (physics, elements chosen by
        name such as ``"mass[torso]"``, or the env's task parameters).
      backend: physics backend for a Brax env given by name (None: the env's
        default); Playground and MJCF envs run on "mjx".
      episode_length: steps before an episode is truncated.
      episodes_per_trial: episodes that share one context (RL^2 trials).
      visible_context: False (hidden), True (normalised context appended to the
        observation) or "privileged" (observation is
        ``{"state": obs, "privileged": context}`` for an asymmetric critic).
      reset_chunk: under vmap, fraction of the batch reset per loop trip (at least 2 envs).
      reset_strategy: how done envs get their fresh reset under vmap, one of
        ``metarl.envs.RESET_STRATEGIES``: "dense" (a reset for every env, kept where
        done), "loop" (resets only for done envs, in chunks; best on CPU),
        "compact", "pool" (each env's next reset computed ahead, refilled in
        bulk only at steps where a done env needs it; the state carries the
        pool), "stock" (the pool, which PPO's rollout deepens into `unroll_length`
        fresh states per env, refilled in bulk before its steps, which then hold no
        reset: `ContextualEnv.stock`; outside such a rollout it is the pool) or
        "auto" (where JAX's default backend is a CPU, the loop; else the stock).
        All give the same
        episodes and states to float rounding (each strategy's program is compiled
        apart; a few agree bit for bit). A resume continues bit for bit only with the
        strategy it was saved with. A run records
        the strategy in use (`reset_strategy`): to resume it on another kind of
        device, pass that strategy instead of "auto".
      **env_kwargs: for a Brax env name, passed to its constructor; for a
        Playground name, its config overrides (``impl="jax"`` unless given).
    """
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}: backend should be in {', '.join(BACKENDS)}")
    with parallel.process_local_devices():
        source = _source(env, backend, env_kwargs)
    parallel.check_local(source.model, f"the model of {type(source.env).__name__}")
    for name, value, least in (
        ("episode_length", episode_length, 1),
        ("episodes_per_trial", episodes_per_trial, 1),
    ):
        if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < least:
            raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
    episode_length, episodes_per_trial = int(episode_length), int(episodes_per_trial)
    if not (isinstance(visible_context, bool) or visible_context == "privileged"):
        raise ValueError(f"visible_context must be one of {VISIBILITY}, got {visible_context!r}")
    check_strategy(reset_strategy)
    periods = sources.check_task(source.env, source.task_params)
    binding = bind(space, source.model, source.backend, source.task_params, source.stale)
    sources.check_periodic(periods, binding.space, "make_contextual")
    return ContextualEnv(
        source,
        binding,
        episode_length,
        episodes_per_trial,
        visible_context,
        reset_chunk,
        reset_strategy,
    )
