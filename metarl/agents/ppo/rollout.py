"""The rollout: `unroll_length` steps of every env under the current policy."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from metarl.agents.agent import AgentCarry
from metarl.envs import POOL, TRIAL, ResetStock, refill_stocks


class EnvState(struct.PyTreeNode):
    """Everything the rollout owns; every leaf has a leading [num_envs] axis."""

    env: Any  # batched Brax State of the ContextualEnv
    carry: AgentCarry
    key: jax.Array  # typed key[num_envs]: each env's action-sampling stream


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
    current_ranges: jax.Array  # 1 where the episode's trial drew its context from the
    # ranges the segment trains on (TrialInfo.current_ranges before the step)


def unroll(env, agent, config, params, normalizer, es: EnvState):
    """`unroll_length` steps on every env -> (new EnvState, Transition [T, B]).

    With reset_strategy="stock" the env states hold a stock of `stock_depth` fresh
    states each (`init_env_state`; 2 * `unroll_length` unless memory asks for fewer),
    refilled here in bulk (`refill_stocks`) before the unroll, or before every
    `stock_depth` steps of it where the stock is shallower: the steps take their
    fresh states from it and compile no reset."""

    def step(es: EnvState, _):
        pairs = jax.vmap(jax.random.split)(es.key)
        keys, sample = pairs[:, 0], pairs[:, 1]
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
            current_ranges=state.info[TRIAL].current_ranges,
        )
        return es.replace(env=nxt, carry=next_carry, key=keys), transition

    stock = es.env.info.get(POOL)
    if not isinstance(stock, ResetStock):
        return jax.lax.scan(step, es, None, length=config.unroll_length)
    size = min(stock.depth(es.key.shape), config.unroll_length)  # steps between refills

    def block(es: EnvState, _):
        es = es.replace(env=refill_stocks(env, es.env, size))
        return jax.lax.scan(step, es, None, length=size)

    if size == config.unroll_length:
        return block(es, None)
    es, transitions = jax.lax.scan(block, es, None, length=config.unroll_length // size)
    flat = lambda x: x.reshape((config.unroll_length,) + x.shape[2:])  # noqa: E731
    return es, jax.tree.map(flat, transitions)
