"""PPO (feed-forward or recurrent, RL^2-style) in compile-once segments.

    space = make_train_space(env, PPOConfig(core="gru", num_envs=256))
    ts = init_training_state(space, jax.random.key(0))
    es = init_env_state(space, jax.random.key(1), context=narrow_space)
    for ranges in schedule:
        ts, es, metrics = run_train(space, ts, es, num_steps=200_000, context=ranges)

`make_train_space` builds and jits every function once; `run_train` calls
the same compiled iteration loop whatever `num_steps` or `context` is, so a
curriculum, checkpointing or evaluation runs between segments with no new XLA
compilation. Data parallelism: the envs are split over every device of
`jax.devices()` (all hosts after `jax.distributed.initialize()`) with
`shard_map`; gradients and observation statistics are averaged across devices.

One iteration: roll out `unroll_length` steps on every env; update the
observation statistics; run the critic over the unroll to get values and
GAE advantages (bootstrapping truncated episodes from their final
observation, never terminated ones); then `num_updates_per_batch` epochs of
minibatch SGD, minibatches split by environment (whole sequences, truncated
BPTT from each unroll's first carry), never by time step.
"""

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
from flax import struct
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from metarl.agents import losses
from metarl.agents.agent import Agent, AgentCarry
from metarl.agents.distributions import ACTION_DISTRIBUTIONS
from metarl.agents.networks import CORES
from metarl.contexts import ContextSpace
from metarl.envs import TRIAL, ContextualEnv
from metarl.parallel import AXIS, data_mesh

RETURNS_SPANS = ("trial", "episode")


@dataclasses.dataclass(frozen=True)
class PPOConfig:
    """PPO hyperparameters. Invalid combinations raise ValueError at construction."""

    num_envs: int = 256
    unroll_length: int = 20
    num_minibatches: int = 8
    num_updates_per_batch: int = 4
    learning_rate: float = 3e-4
    entropy_cost: float = 1e-2
    discounting: float = 0.97
    gae_lambda: float = 0.95
    clipping_epsilon: float = 0.3
    max_grad_norm: float | None = 1.0
    value_loss_coef: float = 0.5
    normalize_observations: bool = True
    reward_scaling: float = 1.0
    core: str = "mlp"  # one of networks.CORES: "mlp", "gru", "lstm"
    hidden_size: int = 64  # recurrent core size
    policy_hidden: tuple[int, ...] = (64, 64)
    value_hidden: tuple[int, ...] = (64, 64)
    action_distribution: str = "tanh_normal"  # or "categorical"
    rl2_inputs: bool = False  # feed previous action, reward and a new-episode flag
    reset_every_episode: bool = False  # reset recurrent state every episode, not every trial
    returns_span: str = "trial"  # "trial": RL^2 returns run across a trial's episodes
    seed: int = 0

    def __post_init__(self):
        for name in (
            "num_envs",
            "unroll_length",
            "num_minibatches",
            "num_updates_per_batch",
            "hidden_size",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"PPOConfig.{name} must be an integer >= 1, got {value!r}")
        if self.num_envs % self.num_minibatches:
            raise ValueError(
                f"num_envs ({self.num_envs}) must be divisible by num_minibatches "
                f"({self.num_minibatches}): minibatches split the envs"
            )
        if self.core not in CORES:
            raise ValueError(f"core must be one of {sorted(CORES)}, got {self.core!r}")
        if self.action_distribution not in ACTION_DISTRIBUTIONS:
            raise ValueError(
                f"action_distribution must be one of {sorted(ACTION_DISTRIBUTIONS)}, "
                f"got {self.action_distribution!r}"
            )
        if self.returns_span not in RETURNS_SPANS:
            raise ValueError(
                f"returns_span must be one of {RETURNS_SPANS}, got {self.returns_span!r}"
            )
        if not 0 < self.discounting <= 1 or not 0 <= self.gae_lambda <= 1:
            raise ValueError(
                f"need 0 < discounting <= 1 and 0 <= gae_lambda <= 1, got {self.discounting}, "
                f"{self.gae_lambda}"
            )
        if self.learning_rate <= 0 or self.clipping_epsilon <= 0 or self.reward_scaling <= 0:
            raise ValueError("learning_rate, clipping_epsilon and reward_scaling must be > 0")
        if self.entropy_cost < 0 or self.value_loss_coef < 0:
            raise ValueError("entropy_cost and value_loss_coef must be >= 0")
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            raise ValueError(f"max_grad_norm must be > 0 or None, got {self.max_grad_norm}")

    @property
    def batch_size(self) -> int:
        """Env steps per iteration."""
        return self.num_envs * self.unroll_length


class TrainingState(struct.PyTreeNode):
    """Everything the learner owns (replicated across devices)."""

    params: Any  # {"policy": ..., "value": ...}
    opt_state: Any
    normalizer: running_statistics.RunningStatisticsState
    key: jax.Array  # uint32[2]
    iterations: jax.Array  # int32[]


class EnvState(struct.PyTreeNode):
    """Everything the rollout owns; every leaf has a leading [num_envs] axis."""

    env: Any  # batched Brax State of the ContextualEnv
    carry: AgentCarry
    key: jax.Array  # uint32[num_envs, 2]


class Transition(struct.PyTreeNode):
    """One rollout step for every env; leaves are [B, ...] (stacked to [T, B, ...])."""

    obs: Any
    carry: AgentCarry  # the carry the agent acted with (inputs + reset flags)
    raw_action: jax.Array
    log_prob: jax.Array
    reward: jax.Array  # scaled
    done: jax.Array
    terminated: jax.Array
    boundary: jax.Array  # end of what a return spans (trial or episode)
    final_obs: Any
    next_carry: AgentCarry  # inputs for V(final_obs): the finished episode continued
    episode_return: jax.Array
    episode_length: jax.Array
    nonfinite: jax.Array


@dataclasses.dataclass(frozen=True)
class TrainSpace:
    """The compiled pieces of one training setup (see module docstring)."""

    env: ContextualEnv
    config: PPOConfig
    agent: Agent
    mesh: jax.sharding.Mesh
    optimizer: optax.GradientTransformation
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


def _split_keys(keys):
    pairs = jax.vmap(lambda k: jax.random.split(jax.random.wrap_key_data(k)))(keys)
    return jax.random.key_data(pairs[:, 0]), pairs[:, 1]


def _unroll(env, agent, config, params, normalizer, es: EnvState):
    """`unroll_length` steps on every env -> (new EnvState, Transition [T, B])."""

    def step(es: EnvState, _):
        keys, sample = _split_keys(es.key)
        state = es.env
        carry, raw, log_prob, action = jax.vmap(
            lambda o, c, k: agent.act(params, normalizer, o, c, k, deterministic=False)
        )(state.obs, es.carry, sample)
        nxt = jax.vmap(env.step)(state, action)
        trial = nxt.info[TRIAL]
        boundary = trial.new_trial if config.returns_span == "trial" else nxt.done
        next_carry = agent.observe(carry, action, nxt)
        # The input the agent would have seen had the finished episode gone on.
        continued = carry.replace(
            prev_action=agent.head.encode(action, agent.action_size),
            prev_reward=nxt.reward,
            new_episode=jnp.zeros_like(nxt.reward),
            reset=jnp.zeros_like(nxt.reward),
        )
        transition = Transition(
            obs=state.obs,
            carry=es.carry,
            raw_action=raw,
            log_prob=log_prob,
            reward=nxt.reward * config.reward_scaling,
            done=nxt.done,
            terminated=nxt.done * (1.0 - trial.truncated),
            boundary=boundary,
            final_obs=trial.final_obs,
            next_carry=continued,
            episode_return=trial.episode_return,
            episode_length=trial.steps,
            nonfinite=trial.nonfinite,
        )
        return es.replace(env=nxt, carry=next_carry, key=keys), transition

    return jax.lax.scan(step, es, None, length=config.unroll_length)


def _over_time(agent, params, normalizer, fields: tuple[str, ...], cores0: dict, obs, carry):
    """Runs towers ("policy" and/or "value") over a [T, B] sequence.

    Encoders and heads take the whole sequence in one batched call; only the
    recurrent core loops over time (all towers in one loop), starting from
    `cores0[field]` and resetting where the stored carry says so. Returns
    ({field: core after each step [T, B, ...]}, {field: output [T, B, ...]}).
    """
    actor_in, critic_in = agent.inputs(normalizer, obs, carry)
    towers = dict(zip(("policy", "value"), agent.towers()))
    inputs = {"policy": actor_in, "value": critic_in}
    h = {f: towers[f].apply(params[f], inputs[f], method="encode") for f in fields}
    if agent.core == "mlp":
        cores = {f: () for f in fields}
    else:

        def step(cores, x):
            h_t, reset_t = x
            out = {
                f: towers[f].apply(params[f], cores[f], h_t[f], reset_t, method="recur")
                for f in fields
            }
            cores = {f: o[0] for f, o in out.items()}
            return cores, (cores, {f: o[1] for f, o in out.items()})

        cores, h = jax.lax.scan(step, cores0, (h, carry.reset))[1]
    outs = {f: towers[f].apply(params[f], h[f], method="decode") for f in fields}
    if "value" in outs:
        outs["value"] = outs["value"][..., 0]
    return cores, outs


def _critic(agent, params, normalizer, value_carry, data: Transition, last_obs, last_carry):
    """V(obs_t), V(obs_{t+1}), V(final_obs_t) over an unroll [T, B], and the end carry."""
    value = lambda o, c: agent.value(params, normalizer, o, c)  # noqa: E731
    cores, outs = _over_time(
        agent, params, normalizer, ("value",), {"value": value_carry}, data.obs, data.carry
    )
    cores, values = cores["value"], outs["value"]
    # The finished episode continued one step: from each step's core, no reset.
    _, values_final = value(data.final_obs, data.next_carry.replace(value=cores))
    end = jax.tree.map(lambda x: x[-1], cores) if agent.core != "mlp" else value_carry
    _, v_last = value(last_obs, last_carry.replace(value=end))
    values_next = jnp.concatenate([values[1:], v_last[None]], 0)
    return values, values_next, values_final, end


def _loss(agent, config, params, normalizer, data: Transition, advantages, returns, key):
    """Total PPO loss on a minibatch of whole sequences [T, b]."""
    c0 = jax.tree.map(lambda x: x[0], data.carry)
    _, outs = _over_time(
        agent,
        params,
        normalizer,
        ("policy", "value"),
        {"policy": c0.policy, "value": c0.value},
        data.obs,
        data.carry,
    )
    dist, values = outs["policy"], outs["value"]
    log_prob = agent.head.log_prob(dist, data.raw_action)
    entropy = agent.head.entropy(dist, key)
    terms = losses.ppo_losses(
        log_prob, data.log_prob, advantages, values, returns, entropy, config.clipping_epsilon
    )
    total = (
        terms["policy_loss"]
        + config.value_loss_coef * terms["value_loss"]
        - config.entropy_cost * terms["entropy"]
    )
    return total, terms


def _sgd(agent, config, optimizer, ts: TrainingState, normalizer, data, advantages, returns, key):
    """`num_updates_per_batch` epochs of minibatch updates, minibatches split by env."""
    n_local = advantages.shape[1]
    size = n_local // config.num_minibatches
    grad_fn = jax.grad(lambda p, *a: _loss(agent, config, p, normalizer, *a), has_aux=True)

    def minibatch(carry, idx):
        params, opt_state, key = carry
        key, sub = jax.random.split(key)
        pick = lambda x: jnp.take(x, idx, axis=1)  # noqa: E731
        grads, terms = grad_fn(
            params, jax.tree.map(pick, data), pick(advantages), pick(returns), sub
        )
        grads = jax.lax.pmean(grads, AXIS)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state, key), terms

    def epoch(carry, _):
        params, opt_state, key = carry
        key, sub = jax.random.split(key)
        order = jax.random.permutation(sub, n_local).reshape(config.num_minibatches, size)
        return jax.lax.scan(minibatch, (params, opt_state, key), order)

    (params, opt_state, _), terms = jax.lax.scan(
        epoch, (ts.params, ts.opt_state, key), None, length=config.num_updates_per_batch
    )
    return params, opt_state, jax.tree.map(jnp.mean, terms)


def _iteration(env, agent, config, optimizer, ts: TrainingState, es: EnvState):
    """One rollout + learning iteration on this device's envs."""
    key, k_sgd = jax.random.split(jax.random.wrap_key_data(ts.key))
    value_carry = es.carry.value
    es, data = _unroll(env, agent, config, ts.params, ts.normalizer, es)
    normalizer = ts.normalizer
    if config.normalize_observations:
        normalizer = running_statistics.update(normalizer, data.obs, pmap_axis_name=AXIS)
    values, values_next, values_final, value_core = _critic(
        agent, ts.params, normalizer, value_carry, data, es.env.obs, es.carry
    )
    next_values = losses.bootstrap_values(values_next, values_final, data.boundary, data.terminated)
    advantages, returns = losses.compute_gae(
        data.reward, values, next_values, data.boundary, config.discounting, config.gae_lambda
    )
    params, opt_state, terms = _sgd(
        agent, config, optimizer, ts, normalizer, data, advantages, returns, k_sgd
    )
    ts = ts.replace(
        params=params,
        opt_state=opt_state,
        normalizer=normalizer,
        key=jax.random.key_data(key),
        iterations=ts.iterations + 1,
    )
    es = es.replace(carry=es.carry.replace(value=value_core))
    done = data.done
    stats = {
        "episodes": done.sum(),
        "return_sum": (done * data.episode_return).sum(),
        "length_sum": (done * data.episode_length).sum(),
        "nonfinite_episodes": data.nonfinite.sum(),
        "env_return_sum": (done * data.episode_return).sum(0),
        "env_episodes": done.sum(0),
        **{k: v for k, v in terms.items()},
    }
    return ts, es, stats


_PER_ENV = ("env_return_sum", "env_episodes")


def _iterate_fn(env, agent, config, optimizer):
    """(ts, es, n) -> n iterations; metric sums (scalars summed over devices)."""

    def run(ts, es, n):
        zeros = jax.eval_shape(lambda: _iteration(env, agent, config, optimizer, ts, es)[2])
        init = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), zeros)

        def body(i, carry):
            ts, es, acc = carry
            ts, es, stats = _iteration(env, agent, config, optimizer, ts, es)
            return ts, es, jax.tree.map(jnp.add, acc, stats)

        ts, es, acc = jax.lax.fori_loop(0, n, body, (ts, es, init))
        acc = {k: v if k in _PER_ENV else jax.lax.psum(v, AXIS) for k, v in acc.items()}
        return ts, es, acc

    return run


def make_train_space(env: ContextualEnv, config: PPOConfig) -> TrainSpace:
    """Builds and jits every training function once for `env` and `config`."""
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
    optimizer = optax.chain(
        optax.clip_by_global_norm(config.max_grad_norm)
        if config.max_grad_norm
        else optax.identity(),
        optax.adam(config.learning_rate),
    )
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
            key=jax.random.key_data(k_state),
            iterations=jnp.int32(0),
        )

    def init_env(key, ranges):
        keys = jax.random.split(key, config.num_envs + 1)
        states = jax.vmap(env.reset)(keys[1:], ranges)
        return EnvState(
            env=states,
            carry=agent.init_carry((config.num_envs,)),
            key=jax.random.key_data(jax.random.split(keys[0], config.num_envs)),
        )

    iterate = jax.shard_map(
        _iterate_fn(env, agent, config, optimizer),
        mesh=mesh,
        in_specs=(P(), P(AXIS), P()),
        out_specs=(P(), P(AXIS), {k: P(AXIS) if k in _PER_ENV else P() for k in _metric_names()}),
        check_vma=False,
    )
    return TrainSpace(
        env=env,
        config=config,
        agent=agent,
        mesh=mesh,
        optimizer=optimizer,
        init_training=jax.jit(init_training, out_shardings=replicated),
        init_env=jax.jit(init_env, out_shardings=sharded),
        set_ranges=jax.jit(
            lambda es, ranges: es.replace(env=env.set_ranges(es.env, ranges)),
            out_shardings=sharded,
            donate_argnums=0,
        ),
        iterate=jax.jit(iterate, donate_argnums=(0, 1)),
    )


def _metric_names():
    return (
        "episodes",
        "return_sum",
        "length_sum",
        "nonfinite_episodes",
        *_PER_ENV,
        "policy_loss",
        "value_loss",
        "entropy",
        "approx_kl",
        "clip_fraction",
    )


def _normalizer_state(obs):
    state = running_statistics.init_state(
        jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), obs)
    )
    return state.replace(std_eps=jnp.float32(state.std_eps))


def init_training_state(space: TrainSpace, key: jax.Array) -> TrainingState:
    """Fresh parameters, optimizer state, observation statistics and counters."""
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
    if context is not None:
        env_state = space.set_ranges(env_state, _per_env_ranges(space, context))
    batch = space.config.batch_size
    total = max(1, math.ceil(num_steps / batch))
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


def _summarise(space, ts, sums, iterations, elapsed) -> dict[str, Any]:
    episodes = float(sums["episodes"])
    updates = iterations * space.num_devices
    metrics = {
        "episode_return": float(sums["return_sum"]) / episodes if episodes else float("nan"),
        "episode_length": float(sums["length_sum"]) / episodes if episodes else float("nan"),
        "episodes": int(episodes),
        "nonfinite_episodes": int(sums["nonfinite_episodes"]),
        "env_return_sum": np.asarray(sums["env_return_sum"]),
        "env_episodes": np.asarray(sums["env_episodes"]),
        "env_steps": space.env_steps(ts),
        "segment_env_steps": iterations * space.config.batch_size,
        "env_steps_per_sec": iterations * space.config.batch_size / elapsed,
    }
    for k in ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction"):
        metrics[k] = float(sums[k]) / updates
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


class Policy(struct.PyTreeNode):
    """Inference: ``action, carry = policy(obs, carry)`` on batched inputs.

    After each env step call ``carry = policy.observe(carry, action, state)``
    so that recurrent and RL^2 agents see the reward and reset at trial starts.
    A Policy is a pytree (parameters are leaves): pass it into jitted code;
    policies from the same TrainSpace share one compiled evaluation.
    """

    params: Any
    normalizer: Any
    agent: Agent = struct.field(pytree_node=False)
    deterministic: bool = struct.field(pytree_node=False, default=True)

    def init_carry(self, batch: int) -> AgentCarry:
        return self.agent.init_carry((batch,))

    def __call__(self, obs, carry: AgentCarry, key: jax.Array | None = None):
        if key is None:
            if not self.deterministic:
                raise ValueError("a stochastic policy needs a key: policy(obs, carry, key)")
            key = jax.random.key(0)
        keys = jax.random.split(key, jax.tree.leaves(obs)[0].shape[0])
        carry, _, _, action = jax.vmap(
            lambda o, c, k: self.agent.act(
                self.params, self.normalizer, o, c, k, self.deterministic
            )
        )(obs, carry, keys)
        return action, carry

    def observe(self, carry: AgentCarry, action: jax.Array, state) -> AgentCarry:
        return self.agent.observe(carry, action, state)


def make_policy(
    space: TrainSpace, training_state: TrainingState, deterministic: bool = True
) -> Policy:
    """The agent as an inference function (see `Policy`)."""
    return Policy(
        params=training_state.params,
        normalizer=training_state.normalizer,
        agent=space.agent,
        deterministic=deterministic,
    )
