"""The compile-once pieces: `make_train_space`, `init_training_state`,
`init_env_state`, `run_train`, `precompile`, and the `train` convenience wrapper."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import math
import time
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from brax.training.acme import running_statistics
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from metarl import parallel
from metarl.agents.agent import Agent
from metarl.agents.ppo.config import PPOConfig, _is_int, check_seeds, divisors
from metarl.agents.ppo.learner import IterationStats, TrainingState, iterate_fn
from metarl.agents.ppo.rollout import EnvState
from metarl.compilation import count_compilations
from metarl.contexts import ContextSpace, PerEnv
from metarl.contexts.space import per_env_hint
from metarl.envs import POOL, TRIAL, ContextualEnv, ResetStock
from metarl.parallel import AXIS, data_mesh
from metarl.trees import check_alive

# XLA's options for compiling the training iteration (`jax.jit`'s `compiler_options`);
# None: XLA_FLAGS alone decide. The tests compile at XLA's optimization level 0, which
# compiles an env's programs faster but runs a training 6x slower, and a test that
# trains long sets XLA's default level here (tests/conftest.py, `optimized_training`).
_ITERATE_COMPILER_OPTIONS: dict[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class TrainSpace:
    """The compiled pieces of one training setup (see `make_train_space`).

    `init_env` and `set_ranges` take ranges as `init_env_state` and `run_train` hand
    them over: rows validated on the host (`_ranges_arg`). Their programs hold no
    host callback to check the numbers again, so JAX's persistent compilation cache
    can store them (`ContextualEnv.set_ranges`'s ``checked``)."""

    env: ContextualEnv
    config: PPOConfig
    agent: Agent
    mesh: jax.sharding.Mesh
    num_seeds: int | None  # None: one run; N: a leading [N] seed axis on every state
    init_training: Callable
    init_env: Callable
    set_ranges: Callable
    iterate: Callable
    # reset_strategy "stock": fresh states stocked per env (`PPOConfig.stock_depth`
    # resolved); None for the other strategies
    stock_depth: int | None = None

    @property
    def num_devices(self) -> int:
        return self.mesh.size

    def env_steps(self, training_state: TrainingState) -> int:
        """Env steps so far (of each run: seeds advance together)."""
        return int(np.asarray(training_state.iterations).reshape(-1)[0]) * self.config.batch_size


def _agent(env: ContextualEnv, config: PPOConfig) -> Agent:
    return Agent(
        action_size=env.action_size,
        action_distribution=config.action_distribution,
        core=config.core,
        hidden_size=config.hidden_size,
        policy_hidden=tuple(config.policy_hidden),
        value_hidden=tuple(config.value_hidden),
        rl2_inputs=config.rl2_inputs,
        reset_every_episode=config.reset_every_episode,
        normalize_observations=config.normalize_observations,
    )


def _optimizer(config: PPOConfig) -> optax.GradientTransformation:
    clip = (
        optax.clip_by_global_norm(config.max_grad_norm)
        if config.max_grad_norm
        else optax.identity()
    )
    return optax.chain(clip, optax.adam(config.learning_rate))


def _normalizer_state(obs):
    state = running_statistics.init_state(
        jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), obs)
    )
    return state.replace(std_eps=jnp.float32(state.std_eps))


# The most of a device's memory a stock takes when `PPOConfig.stock_depth` is None.
# The stock is most of the env state (hopper at 2048 envs x 16 entries: 62 of 66 MB;
# MuJoCo Playground's HumanoidRun on MJX: 7,635 numbers per entry, 4 GiB at 8192 envs
# x 16), and a rollout also needs the physics' own temporaries.
STOCK_MEMORY_SHARE = 0.25
# `PPOConfig.stock_depth` None: this many rollouts' worth of fresh states per env. Twice
# a rollout leaves room for `refill_stocks` to fill every chunk it computes; deeper
# stocks refill less often in as many chunks, and hold more states that `set_ranges`
# throws away.
STOCK_ROLLOUTS = 2


# The most env steps (per seed) one call of the compiled loop runs: the loop counts the
# steps of the episodes that end in int32 (exact, where float32 stops at 2**24), which
# past 2**31 wraps to a negative episode_length; `run_train` splits a longer segment
# into more calls (its results do not depend on the split) and adds their counts on the
# host in 64 bits (`add_totals`).
MAX_CALL_STEPS = 2**30


def add_totals(total: dict | None, more: dict) -> dict:
    """`total` + `more`, two calls' totals (`IterationStats.totals`), on the host in 64
    bits: int64 counts, float64 sums."""
    wide = {k: np.asarray(v) for k, v in more.items()}
    wide = {
        k: v.astype(np.int64 if np.issubdtype(v.dtype, np.integer) else np.float64)
        for k, v in wide.items()
    }
    return wide if total is None else {k: total[k] + wide[k] for k in wide}


def default_stock_depth(unroll_length: int) -> int:
    """The stock's depth where the device's memory holds it: `STOCK_ROLLOUTS` rollouts."""
    return STOCK_ROLLOUTS * unroll_length


def _choose_stock_depth(
    unroll_length: int, requested: int | None, bytes_per_depth: int, limit: int | None
) -> int:
    """The stock's depth: `requested` (refused if its stock alone exceeds the device's
    memory `limit`); else `STOCK_ROLLOUTS` * `unroll_length` where that stock fits
    `STOCK_MEMORY_SHARE` of `limit` (or `limit` is unknown: a CPU reports none), else
    the largest divisor of `unroll_length` that fits (at least 1). `bytes_per_depth`:
    one fresh state for every env a device holds."""
    gib = lambda b: f"{b / 2**30:.1f} GiB"  # noqa: E731
    if requested is not None:
        if limit is not None and requested * bytes_per_depth > limit:
            raise ValueError(
                f"PPOConfig.stock_depth={requested}: the stock would take "
                f"{gib(requested * bytes_per_depth)} of the device's {gib(limit)}; choose a "
                "smaller depth, or None to fit it automatically"
            )
        return requested
    deepest = default_stock_depth(unroll_length)
    if limit is None:
        return deepest
    depths = [deepest, *divisors(unroll_length)]
    fits = [d for d in depths if d * bytes_per_depth <= STOCK_MEMORY_SHARE * limit]
    return max(fits, default=1)


def _stock_depth(env: ContextualEnv, config: PPOConfig, num_seeds, mesh) -> int | None:
    """`PPOConfig.stock_depth` resolved for this env, batch and device (None: no stock).
    A depth given for an env without a stock is refused, or, where "auto" chose
    another strategy on this device (the loop on a CPU), unused with a warning: the
    same config stocks on a GPU."""
    if env.reset_strategy != "stock":
        if config.stock_depth is not None:
            unused = (
                f"PPOConfig.stock_depth={config.stock_depth} needs an env that resets from a "
                f'stock (reset_strategy="stock"); this env resets with {env.reset_strategy!r}'
            )
            if env.requested_strategy != "auto":
                raise ValueError(f"{unused}: drop stock_depth, or make the env with the stock")
            warnings.warn(f'{unused}, which "auto" chose on this device: unused', stacklevel=3)
        return None
    limit = _memory_limit(mesh)
    if limit is None:  # nothing to fit (a CPU): the reset is not traced for its size
        depth = _choose_stock_depth(config.unroll_length, config.stock_depth, 0, None)
    else:
        entry = jax.eval_shape(env.reset, jax.random.key(0)).info[POOL].pending
        entry_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(entry))
        envs = config.num_envs // mesh.size * (num_seeds or 1)  # held by one device
        depth = _choose_stock_depth(
            config.unroll_length, config.stock_depth, entry_bytes * envs, limit
        )
    if jax.process_count() > 1:  # one program on every process: the shallowest depth
        from jax.experimental import multihost_utils

        depth = int(np.min(multihost_utils.process_allgather(np.int32(depth))))
    return depth


def _memory_limit(mesh) -> int | None:
    """The least memory (``bytes_limit``) among the mesh's devices this process
    addresses; None where one reports none (a CPU). Another process's device is not
    asked: under several processes the mesh's first device is process 0's, which until
    2026-12-07 every process asked, and a process it answered nothing could choose a
    deeper stock, another program than process 0's."""
    limits = []
    for device in mesh.devices.flat:
        if getattr(device, "process_index", 0) != jax.process_index():
            continue
        try:
            limit = (device.memory_stats() or {}).get("bytes_limit")
        except Exception:  # noqa: BLE001 - a backend without memory statistics
            limit = None
        if limit is None:
            return None
        limits.append(limit)
    return min(limits, default=None)


def make_train_space(
    env: ContextualEnv, config: PPOConfig, num_seeds: int | None = None
) -> TrainSpace:
    """Builds and jits every training function once for `env` and `config`.

    Data parallelism: the envs are split over every device of `jax.devices()`
    (all hosts after `jax.distributed.initialize()`) with `shard_map`;
    gradients and observation statistics are averaged across devices.

    `num_seeds`: None trains one run. An integer N trains N independent runs
    in one compiled program (vmapped, as purejaxrl does): every state gets a
    leading [N] seed axis, devices still split the envs, and `run_train`
    returns one metrics dict per seed. Run k equals the single run started
    from the k-th key (up to float rounding).
    """
    if not isinstance(env, ContextualEnv):
        raise ValueError(
            f"env must be a metarl ContextualEnv (make_contextual), got {type(env).__name__}"
        )
    if not isinstance(config, PPOConfig):
        raise ValueError(f"config must be a PPOConfig, got {type(config).__name__}")
    if num_seeds is not None and (
        not isinstance(num_seeds, int) or isinstance(num_seeds, bool) or num_seeds < 1
    ):
        raise ValueError(f"num_seeds must be None or an integer >= 1, got {num_seeds!r}")
    discrete = config.action_distribution == "categorical"
    if discrete != env.discrete_actions:
        raise ValueError(
            f"action_distribution={config.action_distribution!r} does not fit this env, whose "
            f"actions are {'indices' if env.discrete_actions else 'float vectors'}: use "
            f"{'categorical' if env.discrete_actions else 'tanh_normal'}"
        )
    unused = [
        setting
        for setting, on in (
            ("reset_every_episode=True", config.reset_every_episode),
            ('returns_span="episode"', config.returns_span == "episode"),
        )
        if on
    ]
    if env.episodes_per_trial == 1 and unused:
        raise ValueError(
            f"{' and '.join(unused)} would change nothing: this env's trials are one episode "
            "each (episodes_per_trial=1), so every episode start is a trial start. Leave "
            "it out, or make the env with episodes_per_trial > 1"
        )
    mesh = data_mesh()
    if config.num_envs % (mesh.size * config.num_minibatches):
        raise ValueError(
            f"num_envs ({config.num_envs}) must be divisible by devices x num_minibatches "
            f"({mesh.size} x {config.num_minibatches})"
        )
    agent = _agent(env, config)
    optimizer = _optimizer(config)
    stock_depth = _stock_depth(env, config, num_seeds, mesh)

    def init_training(key):
        shapes = jax.eval_shape(env.reset, key).obs
        obs = jax.tree.map(lambda s: jnp.zeros(s.shape, jnp.float32), shapes)
        k_params, k_state = jax.random.split(key)
        params = agent.init_params(k_params, obs)
        return TrainingState(
            params=params,
            opt_state=optimizer.init(params),
            normalizer=_normalizer_state(obs),
            key=k_state,
            iterations=jnp.int32(0),
        )

    def init_env(key, ranges):
        keys = jax.random.split(key, config.num_envs + 1)
        states = jax.vmap(functools.partial(env.reset, checked=True))(keys[1:], ranges)
        if stock_depth is not None:  # refilled before every stock_depth steps (rollout.py)
            states = jax.vmap(functools.partial(env.stock, depth=stock_depth))(states)
        return EnvState(
            env=states,
            carry=agent.init_carry((config.num_envs,)),
            key=jax.random.split(keys[0], config.num_envs),
        )

    def set_ranges(es, ranges):  # [num_envs] rows (`_ranges_arg`)
        return es.replace(env=env.set_ranges(es.env, PerEnv(ranges), checked=True))

    iterate = iterate_fn(env, agent, config, optimizer)
    envs = _env_spec(num_seeds)
    if num_seeds is not None:  # the seed axis leads; devices split the env axis after it
        init_env, set_ranges = map(jax.vmap, (init_env, set_ranges))
        # A loop, not vmap: vmapped, the recurrent cores' orthogonal initialiser
        # becomes a batched QR whose LAPACK kernel can deadlock XLA's CPU thread
        # pool (seen here: quickstart --num-seeds 10 hung for good, 3 runs in 5).
        init_training = functools.partial(jax.lax.map, init_training)
        iterate = jax.vmap(iterate, in_axes=(0, 0, None))
    # Totals and losses are replicated after the psum; per-env sums stay sharded.
    stats_spec = IterationStats(totals=P(), losses=P(), per_env=envs)
    iterate = jax.shard_map(
        iterate,
        mesh=mesh,
        in_specs=(P(), envs, P()),
        out_specs=(P(), envs, stats_spec),
        check_vma=False,
    )
    replicated, sharded = NamedSharding(mesh, P()), NamedSharding(mesh, envs)
    return TrainSpace(
        env=env,
        config=config,
        agent=agent,
        mesh=mesh,
        num_seeds=num_seeds,
        init_training=jax.jit(init_training, out_shardings=replicated),
        init_env=jax.jit(init_env, out_shardings=sharded),
        set_ranges=jax.jit(set_ranges, out_shardings=sharded, donate_argnums=0),
        iterate=jax.jit(iterate, donate_argnums=(0, 1), compiler_options=_ITERATE_COMPILER_OPTIONS),
        stock_depth=stock_depth,
    )


def seed_keys(seed: int, num_seeds: int | None = None) -> jax.Array:
    """``jax.random.key(seed)``, or the keys of seeds seed, seed+1, ... stacked [num_seeds]."""
    if num_seeds is not None and (not _is_int(num_seeds) or num_seeds < 1):
        raise ValueError(f"num_seeds must be an int >= 1 (or None for one run), got {num_seeds!r}")
    check_seeds(seed, 1 if num_seeds is None else num_seeds)
    if num_seeds is None:
        return jax.random.key(seed)
    return jnp.stack([jax.random.key(seed + k) for k in range(num_seeds)])


def select_seed(tree: Any, k: int) -> Any:
    """Run k of a state with a leading seed axis (e.g. to build its policy)."""
    sizes = {np.shape(x)[0] if np.ndim(x) else None for x in jax.tree.leaves(tree)}
    if None in sizes or len(sizes) != 1:
        raise ValueError("select_seed needs a tree whose every leaf has the same leading seed axis")
    (n,) = sizes
    # JAX clamps an index past the end: seed 5 of 2 would be seed 1, silently
    if not _is_int(k) or not 0 <= k < n:
        raise ValueError(f"select_seed: run k={k!r} outside 0..{n - 1} (the state holds {n} runs)")
    return jax.tree.map(lambda x: x[k], tree)


def _check_key(space: TrainSpace, key, what: str) -> None:
    if not (isinstance(key, jax.Array) and jnp.issubdtype(key.dtype, jax.dtypes.prng_key)):
        raise TypeError(f"{what} needs a typed PRNG key from jax.random.key(seed), got {key!r:.80}")
    shape = () if space.num_seeds is None else (space.num_seeds,)
    if key.shape != shape:
        raise ValueError(
            f"{what} needs "
            + ("a single key (shape ())" if not shape else f"one key per seed, shape {shape}")
            + f", got shape {key.shape}"
            + ("" if not shape else "; see ppo.seed_keys(seed, num_seeds)")
        )


def init_training_state(space: TrainSpace, key: jax.Array) -> TrainingState:
    """Fresh parameters, optimizer state, observation statistics and counters
    (`key`: one key, or [num_seeds] keys for a space with a seed axis).

    Give it and `init_env_state` the two keys of ``split_keys(seed_keys(seed), 2)``:
    both functions split their key, and ``jax.random.split(k, n)[i]`` does not
    depend on n, so one key for both (or ``key(s)`` and ``key(s + 1)``, which the
    next seed reuses) makes runs share random streams."""
    _check_key(space, key, "init_training_state")
    return space.init_training(key)


def _env_rows(space: TrainSpace, ranges: Any) -> ContextSpace:
    """One run's validated ranges with a leading [num_envs] axis on every leaf."""
    env, n = space.env, space.config.num_envs
    ranges = env.space if ranges is None else ranges
    if isinstance(ranges, PerEnv):
        env.binding.check_ranges(ranges.ranges, (n,))
        return jax.tree.map(lambda x: np.asarray(x, np.float32), ranges.ranges)
    if not isinstance(ranges, ContextSpace):
        raise ValueError(
            "context must be a ContextSpace (shared ranges) or metarl.contexts.PerEnv "
            f"(one row per env), got {type(ranges).__name__}"
        )
    try:
        env.binding.check_ranges(ranges)
    except ValueError as e:
        if hint := per_env_hint(env.space, ranges, (n,)):
            raise ValueError(f"{e}{hint}") from None
        raise
    return jax.tree.map(
        lambda x: np.broadcast_to(np.asarray(x, np.float32), (n,) + np.shape(x)), ranges
    )


def _ranges_arg(space: TrainSpace, context: Any) -> ContextSpace:
    """`context` as the compiled functions take it: [num_envs, ...] leaves, with
    [num_seeds] in front for a space with a seed axis. A seeded space takes one
    ranges object for every seed or a sequence of one per seed."""
    if space.num_seeds is None:
        return _env_rows(space, context)
    if isinstance(context, list | tuple):
        if len(context) != space.num_seeds:
            raise ValueError(
                f"context: got {len(context)} ranges for {space.num_seeds} seeds; give one per "
                "seed, or one for all"
            )
        rows = [_env_rows(space, c) for c in context]
    else:
        rows = [_env_rows(space, context)] * space.num_seeds
    return jax.tree.map(lambda *x: np.stack(x), *rows)


def init_env_state(space: TrainSpace, key: jax.Array, context: Any = None) -> EnvState:
    """Batched env states (reset in contexts drawn from `context`), fresh carries, keys.

    `context`: shared ranges (a ContextSpace), `PerEnv` ranges, None for the
    env's own space; with a seed axis also a sequence of those, one per seed.
    """
    _check_key(space, key, "init_env_state")
    return space.init_env(key, _ranges_arg(space, context))


def thin_env_state(env_state: EnvState) -> EnvState:
    """`env_state` as a checkpoint needs it: with reset_strategy "stock" ("auto" on a
    GPU), each env's stock keeps 1 of its `stock_depth` fresh states, marked as used:
    a resumed run computes them all again (`restock_env_state`), with any depth; any
    other state is returned as it is. The stock is most of the env state (hopper,
    2048 envs x 16: 62 MB of a 66 MB state). Save it, restore it with `like` thinned
    too, and give the restored state to `restock_env_state` before `run_train`."""
    stock = env_state.env.info.get(POOL)
    if not isinstance(stock, ResetStock):
        return env_state
    axis = jnp.ndim(stock.base)  # the depth axis follows the batch (seeds, envs)
    entries = jax.tree.map(lambda x: jax.lax.slice_in_dim(x, 0, 1, axis=axis), stock.entries)
    due = env_state.env.info[TRIAL].resets - 1  # the entry counts as used
    return _with_stock(env_state, stock.replace(entries=entries, base=due))


def restock_env_state(space: TrainSpace, env_state: EnvState) -> EnvState:
    """A thinned `env_state` (`thin_env_state`, e.g. restored from a checkpoint) with
    its stock whole again (`TrainSpace.stock_depth` entries), every entry due: the next
    rollout's refill computes all of them, the resets those envs would take next, so that
    `run_train` continues exactly as from the state before thinning (bit for bit on
    a CPU, with the reset strategy the state was made with). A state that is not
    thinned is returned as it is."""
    stock = env_state.env.info.get(POOL)
    depth = space.stock_depth
    if not isinstance(stock, ResetStock):
        return env_state
    if depth is None:
        raise ValueError(
            "restock_env_state: the state holds a stock but this train space's env resets "
            f"with {space.env.reset_strategy!r}: build the space with the env the state "
            "was made with"
        )
    held = stock.depth(jnp.shape(stock.base))
    if held == depth and depth > 1:
        return env_state
    if held != 1:
        raise ValueError(
            f"restock_env_state: the stock holds {held} fresh states per env: neither "
            f"thinned (1) nor this train space's stock_depth ({depth})"
        )
    return _restock(depth, NamedSharding(space.mesh, _env_spec(space.num_seeds)))(env_state)


@functools.cache
def _restock(depth: int, sharding: NamedSharding) -> Callable[[EnvState], EnvState]:
    def restock(env_state: EnvState) -> EnvState:
        stock = env_state.env.info[POOL]
        resets = env_state.env.info[TRIAL].resets
        axis = resets.ndim
        grow = lambda x: jnp.repeat(x, depth, axis=axis)  # noqa: E731
        due = stock.replace(entries=jax.tree.map(grow, stock.entries), base=resets - depth)
        return _with_stock(env_state, due)

    return jax.jit(restock, out_shardings=sharding)


def _with_stock(env_state: EnvState, stock: ResetStock) -> EnvState:
    env = env_state.env
    return env_state.replace(env=env.replace(info={**env.info, POOL: stock}))


def _env_spec(num_seeds: int | None) -> P:
    """How env states are placed: the env axis split over the devices (after the seed
    axis, which leads where there is one)."""
    return P(AXIS) if num_seeds is None else P(None, AXIS)


def precompile(space: TrainSpace, context: Any = None, *, skip_cpu: bool = False) -> float:
    """Compiles the space's programs (init_training, init_env, set_ranges and the
    iteration loop) at once, one thread each, and returns the seconds it took
    (0.0 with `skip_cpu` where the space's devices are CPUs: nothing compiled).

    Optional: without it each program compiles in its first call, one after the
    other. After it, `init_training_state`, `init_env_state` (with ranges shaped
    like `context`'s, None: the env's own space) and `run_train` compile nothing:
    each call finds its program in JAX's cache. XLA compiles one program's kernels
    largely on one core; the programs' compilations overlap here. `train` and
    `metarl.experiment` call it on accelerators (one H100, hopper: the first update
    34.7 s -> 23.3 s) with `skip_cpu`: on 2 CPU cores it changed nothing measurable,
    and in threads beside pytest's two workers it slowed the suite from 10 to 18 min.
    """
    if skip_cpu and space.mesh.devices.flat[0].platform == "cpu":
        return 0.0
    key = seed_keys(0, space.num_seeds)
    ranges = _ranges_arg(space, context)
    training = jax.eval_shape(space.init_training, key)
    env = jax.eval_shape(space.init_env, key, ranges)
    programs = (
        (space.iterate, (training, env, jnp.int32(1))),
        (space.init_env, (key, ranges)),
        (space.set_ranges, (env, ranges)),
        (space.init_training, (key,)),
    )
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(len(programs)) as pool:
        jobs = [pool.submit(lambda f, a: f.trace(*a).lower().compile(), *p) for p in programs]
        for job in jobs:
            job.result()  # re-raises a compilation's error here
    return time.perf_counter() - start


def run_train(
    space: TrainSpace,
    training_state: TrainingState,
    env_state: EnvState,
    num_steps: int,
    context: Any = None,
    progress: Callable[[int, int], None] | None = None,
    chunks: int = 1,
) -> tuple[TrainingState, EnvState, Any]:
    """Trains for at least `num_steps` env steps (whole iterations) without recompiling.

    Args:
      context: new ranges: a ContextSpace of the env space's names, kinds and
        shapes (shared by all envs), or `metarl.contexts.PerEnv` (one row per
        env, as ADR uses); with a seed axis also a sequence of those, one per
        seed. They apply to every trial that starts from now on. None keeps
        the current ranges.
      progress: called as progress(steps_done, steps_total) after each chunk.
      chunks: split the segment into this many calls of the compiled loop
        (for progress reporting); results do not depend on it.
    Returns:
      (training_state, env_state, metrics). Metrics: episode_return,
      episode_length (means over episodes completed in the segment; NaN if
      none), episodes, nonfinite_episodes, env_return_sum / env_episodes
      ([num_envs] per-env sums, for ADR, over the episodes whose trial drew its
      context from this segment's ranges), the mean PPO terms (policy_loss,
      value_loss, entropy, approx_kl, clip_fraction), env_steps (total so
      far), segment_env_steps, env_steps_per_sec (of the whole compiled
      program: all seeds together; time spent compiling left out) and
      compile_seconds (tracing and compiling inside this call: the first
      call's loop, 0 after). With a seed axis,
      metrics is a list of such dicts, one per seed.
    """
    _check_run(space, training_state, env_state, num_steps)
    if not isinstance(chunks, int | np.integer) or isinstance(chunks, bool) or chunks < 1:
        raise ValueError(f"run_train: chunks must be an int >= 1, got {chunks!r}")
    if context is not None:
        env_state = space.set_ranges(env_state, _ranges_arg(space, context))
    batch = space.config.batch_size
    total = math.ceil(num_steps / batch)
    calls = max(min(chunks, total), math.ceil(total * batch / MAX_CALL_STEPS))
    sizes = [len(c) for c in np.array_split(np.arange(total), calls)]
    sums, totals = None, None
    start, done = time.perf_counter(), 0
    with count_compilations() as compiles:  # the first segment compiles the loop
        for size in sizes:
            training_state, env_state, acc = space.iterate(
                training_state, env_state, jnp.int32(size)
            )
            chunk_totals = parallel.fetch(acc.totals)  # added on the host, in 64 bits
            totals = add_totals(totals, chunk_totals)
            acc = acc.replace(totals={})  # the losses and per-env sums: on the device
            sums = acc if sums is None else jax.tree.map(jnp.add, sums, acc)
            start_step, done = done, done + size
            bad = np.asarray(chunk_totals["nonfinite_learner"])
            if np.any(bad):
                raise TrainingDivergedError(
                    _diverged(space, training_state, bad, start_step * batch, done * batch),
                    training_state,
                    env_state,
                    seeds=[int(k) for k in np.flatnonzero(bad.reshape(-1))],
                )
            if progress is not None:
                progress(done * batch, total * batch)
        sums = parallel.fetch(sums).replace(totals=totals)  # per_env: every host's devices
    timing = (time.perf_counter() - start, compiles.seconds)  # (wall, compiling)
    stock = env_state.env.info.get(POOL)
    if isinstance(stock, ResetStock) and np.any(parallel.fetch(stock.overrun)):
        raise RuntimeError(  # cannot happen: every rollout refills first (a bug if it does)
            "run_train: a done env found its stock of fresh states empty, so its state is "
            "wrong; the env states must hold a stock of stock_depth entries (init_env_state)"
        )
    if space.num_seeds is None:
        return training_state, env_state, _summarise(space, training_state, sums, total, timing)
    per_seed = [
        _summarise(space, training_state, select_seed(sums, k), total, timing)
        for k in range(space.num_seeds)
    ]
    return training_state, env_state, per_seed


class TrainingDivergedError(FloatingPointError):
    """`run_train` found NaN or inf in the learner's state (parameters, optimizer
    state or observation statistics) after a chunk of iterations: the PPO update
    blew up, and every later iteration would train on garbage. The message names
    the values; `training_state` and `env_state` hold the states reached (the
    compiled loop consumed the ones passed in), `seeds` the diverged indices of
    a seed axis ([0] without one)."""

    def __init__(self, message: str, training_state, env_state, seeds: list[int]):
        super().__init__(message)
        self.training_state, self.env_state, self.seeds = training_state, env_state, seeds


def _diverged(space: TrainSpace, ts: TrainingState, bad: np.ndarray, first, last) -> str:
    """`TrainingDivergedError`'s message: where the NaN/inf values are (of the first
    diverged seed), when, and the settings that let an update blow up."""
    seeds = np.flatnonzero(bad.reshape(-1))
    parts = {"params": ts.params, "opt_state": ts.opt_state, "normalizer": ts.normalizer}
    if space.num_seeds is not None:
        parts = {name: select_seed(part, int(seeds[0])) for name, part in parts.items()}
    found = []
    for name, part in parts.items():
        leaves = jax.tree_util.tree_flatten_with_path(parallel.fetch(part))[0]
        floats = [(p, x) for p, x in leaves if np.issubdtype(np.asarray(x).dtype, np.inexact)]
        bad_leaves = [
            f"{jax.tree_util.keystr(p)} {int((~np.isfinite(x)).sum())} of {np.size(x)}"
            for p, x in floats
            if not np.isfinite(x).all()
        ]
        if bad_leaves:
            shown = ", ".join(bad_leaves[:3]) + (", ..." if len(bad_leaves) > 3 else "")
            found.append(f"{name}: {len(bad_leaves)} of {len(floats)} arrays ({shown})")
    c = space.config
    which = "" if space.num_seeds is None else f" of seed index {seeds.tolist()} (the first shown)"
    return (
        f"run_train: training diverged: the learner's state{which} holds NaN or inf values "
        f"after env steps {first:,}-{last:,} of this call; "
        + "; ".join(found)
        + f". A PPO update blew up: lower learning_rate (now {c.learning_rate:g}), clip "
        f"gradients with max_grad_norm (now {c.max_grad_norm}) or shrink the rewards with "
        f"reward_scaling (now {c.reward_scaling:g}). Every later iteration would train on "
        "these values, so none runs"
    )


def _check_run(space: TrainSpace, ts, es, num_steps) -> None:
    """States and sizes must belong to this train space (checked before any compilation)."""
    if not isinstance(num_steps, int | np.integer) or isinstance(num_steps, bool):
        raise TypeError(f"run_train: num_steps must be an int >= 1, got {num_steps!r}")
    if num_steps < 1:
        raise ValueError(f"run_train: num_steps must be >= 1, got {num_steps}")
    if not isinstance(ts, TrainingState):
        raise TypeError(
            f"run_train: training_state must be a TrainingState (init_training_state), "
            f"got {type(ts).__name__}"
        )
    if not isinstance(es, EnvState):
        raise TypeError(
            f"run_train: env_state must be an EnvState (init_env_state), got {type(es).__name__}"
        )
    check_alive(ts, "training_state", "run_train")
    check_alive(es, "env_state", "run_train")
    seeds = () if space.num_seeds is None else (space.num_seeds,)
    if es.key.shape != seeds + (space.config.num_envs,):
        raise ValueError(
            f"run_train: env_state has batch shape {es.key.shape} but the train space has "
            f"num_envs={space.config.num_envs}"
            + (f" and num_seeds={space.num_seeds}" if seeds else "")
            + ": build it with init_env_state(space, ...)"
        )
    stock = es.env.info.get(POOL)
    if isinstance(stock, ResetStock):
        depth = stock.depth(es.key.shape)
        if depth != space.stock_depth:
            raise ValueError(
                f"run_train: env_state's stock holds {depth} fresh states per env, the train "
                f"space's stock_depth is {space.stock_depth}"
                + (
                    ": it was thinned for a checkpoint (thin_env_state); pass it through "
                    "restock_env_state(space, env_state) first"
                    if depth == 1
                    else ": build it with init_env_state(space, ...)"
                )
            )
    if not fits(space, ts):
        raise ValueError(
            "run_train: training_state does not match this train space (another agent or "
            "config): build it with init_training_state(space, key)"
        )


def fits(space: TrainSpace, ts, seeds: int = 0) -> bool:
    """Whether `ts` has the structure and shapes of `space`'s training state, less
    `seeds` leading seed axes (1: one seed of a multi-seed space's state)."""
    expected = jax.eval_shape(space.init_training, seed_keys(0, space.num_seeds))
    shapes = lambda t, k: [(x.shape[k:], x.dtype) for x in jax.tree.leaves(t)]  # noqa: E731
    same = jax.tree.structure(ts) == jax.tree.structure(expected)
    return same and shapes(ts, 0) == shapes(expected, seeds)


def _summarise(space, ts, sums: IterationStats, iterations, timing) -> dict[str, Any]:
    seconds, compiling = timing
    totals = {k: float(v) for k, v in sums.totals.items()}
    episodes = totals["episodes"]
    updates = iterations * space.num_devices
    metrics = {
        "episode_return": totals["return_sum"] / episodes if episodes else float("nan"),
        "episode_length": totals["length_sum"] / episodes if episodes else float("nan"),
        "episodes": int(episodes),
        "nonfinite_episodes": int(totals["nonfinite_episodes"]),
        **{k: np.asarray(v) for k, v in sums.per_env.items()},
        **{k: float(v) / updates for k, v in sums.losses.items()},
        "env_steps": space.env_steps(ts),
        "segment_env_steps": iterations * space.config.batch_size,
        "env_steps_per_sec": iterations
        * space.config.batch_size
        * (space.num_seeds or 1)
        / max(seconds - compiling, 1e-9),
        "compile_seconds": compiling,
    }
    return metrics


def split_keys(keys: jax.Array, num: int) -> list[jax.Array]:
    """`jax.random.split(key, num)` of one key, or of each key of a [num_seeds] stack
    (so that run k of a seeded run derives its keys as the single run would)."""
    parts = (
        jax.random.split(keys, num)
        if keys.shape == ()
        else jax.vmap(lambda k: jax.random.split(k, num))(keys).swapaxes(0, 1)
    )
    return list(parts)


def _check_reusable(
    space: TrainSpace, env: ContextualEnv, config: PPOConfig, num_seeds: int | None
) -> None:
    """A space reused by `train` must match the run asked for, seed aside."""
    differ = ["env"] if space.env is not env else []
    if space.num_seeds != num_seeds:
        differ.append(f"num_seeds ({space.num_seeds} vs {num_seeds})")
    differ += [
        f"config.{f.name}"
        for f in dataclasses.fields(config)
        if f.name != "seed" and getattr(config, f.name) != getattr(space.config, f.name)
    ]
    if differ:
        raise ValueError(
            f"space was built for another run: {', '.join(differ)} differ; build one with "
            "make_train_space(env, config, num_seeds)"
        )


def train(
    env: ContextualEnv,
    config: PPOConfig,
    num_timesteps: int,
    *,
    segments: int = 10,
    num_seeds: int | None = None,
    progress: Callable[[int, Any], None] | None = None,
    space: TrainSpace | None = None,
) -> tuple[TrainSpace, TrainingState, list[Any]]:
    """Convenience: builds the space and trains in `segments` equal segments.

    Seeds ``config.seed, config.seed + 1, ...`` with `num_seeds` (one compiled
    program). `progress(env_steps, metrics)` is called after each segment.
    `space`: one built by `make_train_space` for this env, num_seeds and config
    (its seed aside), whose compiled programs are reused: another seed trains
    without compiling. Returns (space, training_state, per-segment metrics).
    """
    for name, value in (("num_timesteps", num_timesteps), ("segments", segments)):
        if not isinstance(value, int | np.integer) or isinstance(value, bool) or value < 1:
            raise ValueError(f"train: {name} must be an int >= 1, got {value!r}")
    if space is None:
        space = make_train_space(env, config, num_seeds)
        precompile(space, skip_cpu=True)
    else:
        _check_reusable(space, env, config, num_seeds)
    k_train, k_env = split_keys(seed_keys(config.seed, num_seeds), 2)
    ts = init_training_state(space, k_train)
    es = init_env_state(space, k_env)
    history = []
    per_segment = max(1, math.ceil(num_timesteps / segments))
    for _ in range(segments):
        ts, es, metrics = run_train(space, ts, es, per_segment)
        history.append(metrics)
        if progress is not None:
            progress(space.env_steps(ts), metrics)
    return space, ts, history
