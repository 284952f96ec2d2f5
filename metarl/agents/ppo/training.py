"""The compile-once pieces: `make_train_space`, `init_training_state`,
`init_env_state`, `run_train`, and the `train` convenience wrapper."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from brax.training.acme import running_statistics
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from metarl.agents.agent import Agent
from metarl.agents.ppo.config import PPOConfig
from metarl.agents.ppo.learner import IterationStats, TrainingState, iterate_fn
from metarl.agents.ppo.rollout import EnvState
from metarl.contexts import ContextSpace
from metarl.envs import ContextualEnv
from metarl.parallel import AXIS, data_mesh


@dataclasses.dataclass(frozen=True)
class TrainSpace:
    """The compiled pieces of one training setup (see `make_train_space`)."""

    env: ContextualEnv
    config: PPOConfig
    agent: Agent
    mesh: jax.sharding.Mesh
    init_training: Callable
    init_env: Callable
    set_ranges: Callable
    iterate: Callable

    @property
    def num_devices(self) -> int:
        return self.mesh.size

    def env_steps(self, training_state: TrainingState) -> int:
        return int(training_state.iterations) * self.config.batch_size


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


def make_train_space(env: ContextualEnv, config: PPOConfig) -> TrainSpace:
    """Builds and jits every training function once for `env` and `config`.

    Data parallelism: the envs are split over every device of `jax.devices()`
    (all hosts after `jax.distributed.initialize()`) with `shard_map`;
    gradients and observation statistics are averaged across devices.
    """
    if not isinstance(env, ContextualEnv):
        raise ValueError(
            f"env must be a metarl ContextualEnv (make_contextual), got {type(env).__name__}"
        )
    if not isinstance(config, PPOConfig):
        raise ValueError(f"config must be a PPOConfig, got {type(config).__name__}")
    mesh = data_mesh()
    if config.num_envs % (mesh.size * config.num_minibatches):
        raise ValueError(
            f"num_envs ({config.num_envs}) must be divisible by devices x num_minibatches "
            f"({mesh.size} x {config.num_minibatches})"
        )
    agent = _agent(env, config)
    optimizer = _optimizer(config)
    replicated, sharded = NamedSharding(mesh, P()), NamedSharding(mesh, P(AXIS))

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
        states = jax.vmap(env.reset)(keys[1:], ranges)
        return EnvState(
            env=states,
            carry=agent.init_carry((config.num_envs,)),
            key=jax.random.split(keys[0], config.num_envs),
        )

    # Totals and losses are replicated after the psum; per-env sums stay sharded.
    stats_spec = IterationStats(totals=P(), losses=P(), per_env=P(AXIS))
    iterate = jax.shard_map(
        iterate_fn(env, agent, config, optimizer),
        mesh=mesh,
        in_specs=(P(), P(AXIS), P()),
        out_specs=(P(), P(AXIS), stats_spec),
        check_vma=False,
    )
    return TrainSpace(
        env=env,
        config=config,
        agent=agent,
        mesh=mesh,
        init_training=jax.jit(init_training, out_shardings=replicated),
        init_env=jax.jit(init_env, out_shardings=sharded),
        set_ranges=jax.jit(
            lambda es, ranges: es.replace(env=env.set_ranges(es.env, ranges)),
            out_shardings=sharded,
            donate_argnums=0,
        ),
        iterate=jax.jit(iterate, donate_argnums=(0, 1)),
    )


def _check_key(key, what: str) -> None:
    if not (isinstance(key, jax.Array) and jnp.issubdtype(key.dtype, jax.dtypes.prng_key)):
        raise TypeError(f"{what} needs a typed PRNG key from jax.random.key(seed), got {key!r:.80}")
    if key.shape != ():
        raise ValueError(f"{what} needs a single key (shape ()), got shape {key.shape}")


def init_training_state(space: TrainSpace, key: jax.Array) -> TrainingState:
    """Fresh parameters, optimizer state, observation statistics and counters."""
    _check_key(key, "init_training_state")
    return space.init_training(key)


def _per_env_ranges(space: TrainSpace, context: ContextSpace | None) -> ContextSpace:
    """Validated ranges with a leading [num_envs] axis on every leaf (one signature)."""
    env, n = space.env, space.config.num_envs
    context = env.space if context is None else context
    if not isinstance(context, ContextSpace):
        raise ValueError(f"context must be a ContextSpace, got {type(context).__name__}")
    base = [np.shape(x) for x in jax.tree.leaves(env.space)]
    leaves = [np.asarray(x, np.float32) for x in jax.tree.leaves(context)]
    if [x.shape for x in leaves] == base:
        env.binding.check_ranges(context)
        leaves = [np.broadcast_to(x, (n,) + x.shape) for x in leaves]
    elif [x.shape for x in leaves] == [(n,) + s for s in base]:
        rows = np.unique(
            np.concatenate([x.reshape(n, -1) for x in leaves], 1), axis=0, return_index=True
        )[1]
        for i in rows:  # per-env ranges (ADR): validate each distinct row once
            env.binding.check_ranges(jax.tree.map(lambda x, i=i: np.asarray(x)[i], context))
    else:
        raise ValueError(
            "context leaves must have the env space's shapes (shared ranges) or a leading "
            f"num_envs={n} axis (per-env ranges); got {[x.shape for x in leaves]}, expected {base}"
        )
    return jax.tree.unflatten(jax.tree.structure(env.space), leaves)


def init_env_state(
    space: TrainSpace, key: jax.Array, context: ContextSpace | None = None
) -> EnvState:
    """Batched env states (reset in contexts drawn from `context`), fresh carries, keys."""
    _check_key(key, "init_env_state")
    return space.init_env(key, _per_env_ranges(space, context))


def run_train(
    space: TrainSpace,
    training_state: TrainingState,
    env_state: EnvState,
    num_steps: int,
    context: ContextSpace | None = None,
    progress: Callable[[int, int], None] | None = None,
    chunks: int = 1,
) -> tuple[TrainingState, EnvState, dict[str, Any]]:
    """Trains for at least `num_steps` env steps (whole iterations) without recompiling.

    Args:
      context: new ranges (same names, kinds and shapes as the env's space, or
        the same with a leading num_envs axis for per-env ranges); they apply
        to every trial that starts from now on. None keeps the current ranges.
      progress: called as progress(steps_done, steps_total) after each chunk.
      chunks: split the segment into this many calls of the compiled loop
        (for progress reporting); results do not depend on it.
    Returns:
      (training_state, env_state, metrics). Metrics: episode_return,
      episode_length (means over episodes completed in the segment; NaN if
      none), episodes, nonfinite_episodes, env_return_sum / env_episodes
      ([num_envs] per-env sums, for ADR), the mean PPO terms (policy_loss,
      value_loss, entropy, approx_kl, clip_fraction), env_steps (total so
      far), segment_env_steps and env_steps_per_sec.
    """
    _check_run(space, training_state, env_state, num_steps)
    if context is not None:
        env_state = space.set_ranges(env_state, _per_env_ranges(space, context))
    batch = space.config.batch_size
    total = math.ceil(num_steps / batch)
    sizes = [len(c) for c in np.array_split(np.arange(total), min(max(1, chunks), total))]
    sums = None
    start, done = time.perf_counter(), 0
    for size in sizes:
        training_state, env_state, acc = space.iterate(training_state, env_state, jnp.int32(size))
        sums = acc if sums is None else jax.tree.map(jnp.add, sums, acc)
        done += size
        if progress is not None:
            jax.block_until_ready(acc)
            progress(done * batch, total * batch)
    sums = jax.device_get(sums)
    elapsed = time.perf_counter() - start
    return training_state, env_state, _summarise(space, training_state, sums, total, elapsed)


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
    n = space.config.num_envs
    if es.key.shape != (n,):
        raise ValueError(
            f"run_train: env_state holds {es.key.shape[0] if es.key.ndim else 0} envs but the "
            f"train space has num_envs={n}: build it with init_env_state(space, ...)"
        )
    expected = jax.tree.structure(jax.eval_shape(space.init_training, jax.random.key(0)))
    if jax.tree.structure(ts) != expected:
        raise ValueError(
            "run_train: training_state does not match this train space (another agent or "
            "config): build it with init_training_state(space, key)"
        )


def _summarise(space, ts, sums: IterationStats, iterations, elapsed) -> dict[str, Any]:
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
        "env_steps_per_sec": iterations * space.config.batch_size / elapsed,
    }
    return metrics


def train(
    env: ContextualEnv,
    config: PPOConfig,
    num_timesteps: int,
    *,
    segments: int = 10,
    progress: Callable[[int, dict[str, Any]], None] | None = None,
) -> tuple[TrainSpace, TrainingState, list[dict[str, Any]]]:
    """Convenience: builds the space and trains in `segments` equal segments.

    `progress(env_steps, metrics)` is called after each segment. Returns
    (space, training_state, per-segment metrics).
    """
    space = make_train_space(env, config)
    key = jax.random.key(config.seed)
    k_train, k_env = jax.random.split(key)
    ts = init_training_state(space, k_train)
    es = init_env_state(space, k_env)
    history = []
    per_segment = max(1, math.ceil(num_timesteps / segments))
    for _ in range(segments):
        ts, es, metrics = run_train(space, ts, es, per_segment)
        history.append(metrics)
        if progress is not None:
            progress(metrics["env_steps"], metrics)
    return space, ts, history
