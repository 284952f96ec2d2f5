"""The learner: critic over the unroll, GAE, and minibatch SGD on whole sequences.

One iteration (`iteration`): roll out and run the critic over the unroll to
get values and GAE advantages (bootstrapping truncated episodes from their
final observation, never terminated ones) -- `collect`; then
`num_updates_per_batch` epochs of minibatch SGD, minibatches split by
environment (whole sequences, truncated BPTT from each unroll's first carry),
never by time step; last, update the observation statistics with the unroll.

The critic and SGD use the statistics the rollout acted with, so that on the
first minibatch of the first epoch the learner's log-probs (`recompute`)
equal the rollout's exactly (ratio 1): updated statistics would change every
normalised input and bias the ratio.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax
from brax.training.acme import running_statistics
from flax import struct

from metarl.agents import losses, networks
from metarl.agents.ppo.rollout import EnvState, Transition, unroll
from metarl.parallel import AXIS


class TrainingState(struct.PyTreeNode):
    """Everything the learner owns (replicated across devices)."""

    params: Any  # {"policy": ..., "value": ...}
    opt_state: Any
    normalizer: running_statistics.RunningStatisticsState
    key: jax.Array  # typed key[]
    iterations: jax.Array  # int32[]


class IterationStats(struct.PyTreeNode):
    """What one iteration reports; summed over iterations by the training loop.

    `totals` and `losses` are summed over devices too; `per_env` stays sharded.
    """

    totals: dict  # episodes, return_sum, length_sum, nonfinite_episodes: scalars; the
    # loop adds nonfinite_learner (NaN/inf values in its final TrainingState, see `nonfinite`)
    losses: dict  # the PPO terms of `losses.ppo_losses`, means over minibatches
    per_env: dict  # env_return_sum, env_episodes: [num_envs], episodes whose trial drew
    # its context from the current ranges (an episode begun before set_ranges is not)


class Batch(struct.PyTreeNode):
    """What one iteration learns from: the unroll and what the critic made of it."""

    data: Transition  # [T, B]
    values: jax.Array  # [T, B] V(obs_t) the advantages were computed with
    advantages: jax.Array  # [T, B]
    returns: jax.Array  # [T, B]
    value_core: Any  # value core after the unroll, [B, ...] (the next unroll starts from it)


def over_time(agent, params, normalizer, fields: tuple[str, ...], cores0: dict, obs, carry):
    """Runs towers ("policy" and/or "value") over a [T, B] sequence.

    Encoders (with the cores' input projections) and heads take the whole
    sequence in one batched call; only the recurrent cores loop over time, all
    towers in one loop, starting from `cores0[field]` and resetting where the
    stored carry says so. Returns ({field: core after each step [T, B, ...]},
    {field: output [T, B, ...]}).
    """
    actor_in, critic_in = agent.inputs(normalizer, obs, carry)
    towers = dict(zip(("policy", "value"), agent.towers()))
    inputs = {"policy": actor_in, "value": critic_in}
    h = {f: towers[f].apply(params[f], inputs[f], method="encode") for f in fields}
    if agent.core == "mlp":
        cores = {f: () for f in fields}
    else:
        cores, h = _cores_over_time(agent, towers, params, fields, cores0, h, carry.reset)
    outs = {f: towers[f].apply(params[f], h[f], method="decode") for f in fields}
    if "value" in outs:
        outs["value"] = outs["value"][..., 0]
    return cores, outs


def _cores_over_time(agent, towers, params, fields, cores0, h, reset):
    """The recurrent cores of `fields` stepped over [T, B] encoded inputs `h`:
    ({field: core after each step}, {field: core output}), each [T, B, ...].

    The towers' cores have one shape (their step reads the hidden side only,
    `networks.recur_params`), so they advance together: one batched step over
    a stacked tower axis, half the operations per time step of one step per
    tower (on a GPU, half the kernel launches; `benchmarks/ppo_profile.py`
    counts them).
    """
    stack = lambda trees, axis: jax.tree.map(lambda *a: jnp.stack(a, axis), *trees)  # noqa: E731
    step_params = stack([networks.recur_params(agent.core, params[f]) for f in fields], 0)
    recur = jax.vmap(
        lambda p, c, x, r: towers[fields[0]].apply(p, c, x, r, method="recur"),
        in_axes=(0, 0, 0, None),
    )

    def step(cores, x):
        cores, out = recur(step_params, cores, *x)
        return cores, (cores, out)

    xs = (stack([h[f] for f in fields], 1), reset)  # [T, towers, B, ...]
    cores, outs = jax.lax.scan(step, stack([cores0[f] for f in fields], 0), xs)[1]
    unstack = lambda tree, i: jax.tree.map(lambda a: a[:, i], tree)  # noqa: E731
    return (
        {f: unstack(cores, i) for i, f in enumerate(fields)},
        {f: unstack(outs, i) for i, f in enumerate(fields)},
    )


def critic(agent, params, normalizer, value_carry, data: Transition, last_obs, last_carry):
    """V(obs_t), V(obs_{t+1}), V(final_obs_t) over an unroll [T, B], and the end carry."""
    value = lambda o, c: agent.value(params, normalizer, o, c)  # noqa: E731
    cores, outs = over_time(
        agent, params, normalizer, ("value",), {"value": value_carry}, data.obs, data.carry
    )
    cores, values = cores["value"], outs["value"]
    # The finished episode continued one step: from each step's core, no reset.
    _, values_final = value(data.final_obs, data.next_carry.replace(value=cores))
    end = jax.tree.map(lambda x: x[-1], cores) if agent.core != "mlp" else value_carry
    _, v_last = value(last_obs, last_carry.replace(value=end))
    values_next = jnp.concatenate([values[1:], v_last[None]], 0)
    return values, values_next, values_final, end


def recompute(agent, params, normalizer, data: Transition):
    """(distribution, log-prob of the taken raw action, value), each [T, b, ...], over
    whole sequences from each one's first stored carry, resetting the cores where
    the stored carry says so (what the loss differentiates).

    With the rollout's parameters and statistics (the first minibatch of the first
    epoch) log-prob equals ``data.log_prob`` and value equals `Batch.values`.
    """
    c0 = jax.tree.map(lambda x: x[0], data.carry)
    _, outs = over_time(
        agent,
        params,
        normalizer,
        ("policy", "value"),
        {"policy": c0.policy, "value": c0.value},
        data.obs,
        data.carry,
    )
    dist, values = outs["policy"], outs["value"]
    return dist, agent.head.log_prob(dist, data.raw_action), values


def _multi_device() -> str | None:
    """AXIS inside a program whose envs are split over several devices, else None
    (one device, or a call outside the trainer's shard_map, keeps the
    single-device arithmetic, bit for bit)."""
    try:
        return AXIS if jax.lax.axis_size(AXIS) > 1 else None
    except NameError:  # not inside the trainer's shard_map (a profiler, a test)
        return None


def loss(agent, config, params, normalizer, data: Transition, advantages, returns, key):
    """Total PPO loss on a minibatch of whole sequences [T, b], and its terms."""
    dist, log_prob, values = recompute(agent, params, normalizer, data)
    entropy = agent.head.entropy(dist, key)
    terms = losses.ppo_losses(
        log_prob,
        data.log_prob,
        advantages,
        values,
        returns,
        entropy,
        config.clipping_epsilon,
        axis_name=_multi_device(),
    )
    total = (
        terms["policy_loss"]
        + config.value_loss_coef * terms["value_loss"]
        - config.entropy_cost * terms["entropy"]
    )
    return total, terms


def minibatch_order(key: jax.Array, n_local: int, num_minibatches: int) -> jax.Array:
    """This device's envs shuffled into [num_minibatches, n_local / num_minibatches]
    indices. Each device draws its own shuffle (the key folded with its index), so a
    global minibatch is not the same local positions on every device."""
    if _multi_device():
        key = jax.random.fold_in(key, jax.lax.axis_index(AXIS))
    return jax.random.permutation(key, n_local).reshape(num_minibatches, -1)


def sgd(agent, config, optimizer, ts: TrainingState, normalizer, data, advantages, returns, key):
    """`num_updates_per_batch` epochs of minibatch updates, minibatches split by env."""
    n_local = advantages.shape[1]
    grad_fn = jax.grad(lambda p, *a: loss(agent, config, p, normalizer, *a), has_aux=True)

    def minibatch(carry, idx):
        params, opt_state, key = carry
        key, sub = jax.random.split(key)
        if _multi_device():  # each device's own entropy-sample noise
            sub = jax.random.fold_in(sub, jax.lax.axis_index(AXIS))
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
        order = minibatch_order(sub, n_local, config.num_minibatches)
        return jax.lax.scan(minibatch, (params, opt_state, key), order)

    (params, opt_state, _), terms = jax.lax.scan(
        epoch, (ts.params, ts.opt_state, key), None, length=config.num_updates_per_batch
    )
    return params, opt_state, jax.tree.map(jnp.mean, terms)


def advantages_and_returns(agent, config, ts: TrainingState, normalizer, value_carry, data, es):
    """GAE over an unroll: (values, advantages, returns, the value core's end carry)."""
    values, values_next, values_final, value_core = critic(
        agent, ts.params, normalizer, value_carry, data, es.env.obs, es.carry
    )
    next_values = losses.bootstrap_values(values_next, values_final, data.boundary, data.terminated)
    advantages, returns = losses.compute_gae(
        data.reward, values, next_values, data.boundary, config.discounting, config.gae_lambda
    )
    return values, advantages, returns, value_core


def collect(env, agent, config, ts: TrainingState, es: EnvState) -> tuple[EnvState, Batch]:
    """Rollout, critic and GAE under `ts`'s parameters and observation statistics."""
    value_carry = es.carry.value
    es, data = unroll(env, agent, config, ts.params, ts.normalizer, es)
    values, advantages, returns, value_core = advantages_and_returns(
        agent, config, ts, ts.normalizer, value_carry, data, es
    )
    return es, Batch(data, values, advantages, returns, value_core)


def iteration(env, agent, config, optimizer, ts: TrainingState, es: EnvState):
    """One rollout + learning iteration on this device's envs."""
    key, k_sgd = jax.random.split(ts.key)
    es, batch = collect(env, agent, config, ts, es)
    data = batch.data
    params, opt_state, terms = sgd(
        agent, config, optimizer, ts, ts.normalizer, data, batch.advantages, batch.returns, k_sgd
    )
    normalizer = ts.normalizer
    if config.normalize_observations:  # after learning: see the module docstring
        normalizer = running_statistics.update(normalizer, data.obs, pmap_axis_name=AXIS)
    ts = ts.replace(
        params=params,
        opt_state=opt_state,
        normalizer=normalizer,
        key=key,
        iterations=ts.iterations + 1,
    )
    es = es.replace(carry=es.carry.replace(value=batch.value_core))
    done = data.done
    credited = done * data.current_ranges  # episodes played under the current ranges
    count = lambda x: x.astype(jnp.int32).sum()  # noqa: E731 - exact beyond 2**24
    stats = IterationStats(
        totals={
            "episodes": count(done),
            "return_sum": (done * data.episode_return).sum(),
            "length_sum": count(done * data.episode_length),
            "nonfinite_episodes": count(data.nonfinite),
        },
        losses=terms,
        per_env={  # for per-env curricula (ADR): only what the current ranges produced
            "env_return_sum": (credited * data.episode_return).sum(0),
            "env_episodes": credited.sum(0),
        },
    )
    return ts, es, stats


def nonfinite(ts: TrainingState) -> jax.Array:
    """How many NaN or inf values the learner's state holds (params, optimizer
    state, observation statistics): int32[], 0 while training is sound."""
    floats = [
        x
        for x in jax.tree.leaves((ts.params, ts.opt_state, ts.normalizer))
        if jnp.issubdtype(x.dtype, jnp.inexact)
    ]
    return sum((~jnp.isfinite(x)).sum(dtype=jnp.int32) for x in floats)


def iterate_fn(env, agent, config, optimizer):
    """(ts, es, n) -> n iterations and their summed `IterationStats`
    (totals and losses summed over devices; totals also hold nonfinite_learner,
    `nonfinite` of the state after the n iterations, for `run_train` to stop on)."""

    # Jitted once: the shapes of its stats and the loop's body come from one trace
    # (JAX reuses it for the same argument types), not two of the whole env step.
    one = jax.jit(functools.partial(iteration, env, agent, config, optimizer))

    def run(ts, es, n):
        shapes = jax.eval_shape(one, ts, es)[2]
        init = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

        def body(i, carry):
            ts, es, acc = carry
            ts, es, stats = one(ts, es)
            return ts, es, jax.tree.map(jnp.add, acc, stats)

        ts, es, acc = jax.lax.fori_loop(0, n, body, (ts, es, init))
        totals = {**acc.totals, "nonfinite_learner": nonfinite(ts)}
        acc = acc.replace(totals=jax.lax.psum(totals, AXIS), losses=jax.lax.psum(acc.losses, AXIS))
        return ts, es, acc

    return run
