"""The actor-critic agent: inputs, towers, action head, and its per-env carry.

`Agent` is static (built once from a config); parameters and observation
statistics are passed in. Rollouts, the learner and `Policy` (inference) all
use the same `act` / `observe` / `value` functions, so there is one code path
for what the agent sees.

What the agent sees at each step: the normalised observation, clipped to
+-`OBS_CLIP` standard deviations (the actor gets
``obs["state"]`` and the critic ``state ++ privileged`` when the env gives a
privileged dict), and with ``rl2_inputs`` the previous action, the previous
reward and a new-episode flag (RL^2). Recurrent cores are reset where a new
trial begins (or every episode with ``reset_every_episode``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from brax.training.acme import running_statistics
from flax import struct

from metarl.agents.distributions import ACTION_DISTRIBUTIONS
from metarl.agents.networks import Tower, initial_carry
from metarl.envs import TRIAL

# Normalised observations are clipped to [-OBS_CLIP, OBS_CLIP]: a dimension that was
# constant in the first batch (a ball at rest, a contact flag) gets the statistics'
# floor of 1e-6 as its std, and its first nonzero value would reach the networks as
# ~1e5 (value losses of 1e12 in the next iteration). 10, as Stable-Baselines3's
# VecNormalize; a value inside the bound passes unchanged.
OBS_CLIP = 10.0


@struct.dataclass
class AgentCarry:
    """What the agent remembers between steps, per env (leading batch dims)."""

    policy: Any  # policy core carry (() for a feed-forward core)
    value: Any  # value core carry
    prev_action: jax.Array  # [..., A] encoded previous action (zeros where the cores reset)
    prev_reward: jax.Array  # [...] previous reward (zero where the cores reset)
    new_episode: jax.Array  # [...] 1 where the next observation starts an episode
    reset: jax.Array  # [...] 1 where the cores must start fresh on the next observation


@dataclasses.dataclass(frozen=True)
class Agent:
    """Static description of the agent; see module docstring."""

    action_size: int
    action_distribution: str
    core: str
    hidden_size: int
    policy_hidden: tuple[int, ...]
    value_hidden: tuple[int, ...]
    rl2_inputs: bool
    reset_every_episode: bool
    normalize_observations: bool

    @property
    def head(self):
        return ACTION_DISTRIBUTIONS[self.action_distribution]

    def towers(self) -> tuple[Tower, Tower]:
        policy = Tower(
            self.policy_hidden,
            self.core,
            self.hidden_size,
            (),
            self.head.param_size(self.action_size),
        )
        value = Tower(self.value_hidden, self.core, self.hidden_size, (), 1)
        return policy, value

    # ---- carries ----
    def init_carry(self, batch_shape: tuple[int, ...]) -> AgentCarry:
        ones = jnp.ones(batch_shape, jnp.float32)
        return AgentCarry(
            policy=initial_carry(self.core, self.hidden_size, batch_shape),
            value=initial_carry(self.core, self.hidden_size, batch_shape),
            prev_action=jnp.zeros(batch_shape + (self.action_size,), jnp.float32),
            prev_reward=jnp.zeros(batch_shape, jnp.float32),
            new_episode=ones,
            reset=ones,
        )

    def observe(self, carry: AgentCarry, action: jax.Array, state) -> AgentCarry:
        """Records the env's answer to `action` (a batched Brax State)."""
        trial = state.info[TRIAL]
        fresh = trial.new_episode if self.reset_every_episode else trial.new_trial
        keep = 1.0 - fresh  # the RL^2 inputs start over with the cores
        return carry.replace(
            prev_action=self.head.encode(action, self.action_size) * keep[..., None],
            prev_reward=state.reward * keep,
            new_episode=trial.new_episode,
            reset=fresh,
        )

    # ---- inputs ----
    def inputs(self, normalizer, obs, carry: AgentCarry) -> tuple[jax.Array, jax.Array]:
        """(actor input, critic input) for one step."""
        if self.normalize_observations:
            obs = running_statistics.normalize(obs, normalizer, max_abs_value=OBS_CLIP)
        if isinstance(obs, dict):
            actor, critic = obs["state"], jnp.concatenate([obs["state"], obs["privileged"]], -1)
        else:
            actor = critic = obs
        if self.rl2_inputs:
            extra = jnp.concatenate(
                [carry.prev_action, carry.prev_reward[..., None], carry.new_episode[..., None]], -1
            )
            actor = jnp.concatenate([actor, extra], -1)
            critic = jnp.concatenate([critic, extra], -1)
        return actor, critic

    # ---- steps ----
    def policy_params(self, params, normalizer, obs, carry: AgentCarry):
        """(new policy core carry, distribution parameters) for one step."""
        actor_in, _ = self.inputs(normalizer, obs, carry)
        return self.towers()[0].apply(params["policy"], carry.policy, actor_in, carry.reset)

    def value(self, params, normalizer, obs, carry: AgentCarry):
        """(new value core carry, V(obs)) for one step."""
        _, critic_in = self.inputs(normalizer, obs, carry)
        core, v = self.towers()[1].apply(params["value"], carry.value, critic_in, carry.reset)
        return core, v[..., 0]

    def act(self, params, normalizer, obs, carry: AgentCarry, key, deterministic: bool):
        """One step: (carry with advanced policy core, raw action, log-prob, env action)."""
        core, dist = self.policy_params(params, normalizer, obs, carry)
        raw = self.head.mode(dist) if deterministic else self.head.sample(dist, key)
        log_prob = self.head.log_prob(dist, raw)
        return carry.replace(policy=core), raw, log_prob, self.head.postprocess(raw)

    def init_params(self, key, observation):
        """Parameters for one example observation (no batch dims)."""
        carry = self.init_carry(())
        raw = dataclasses.replace(self, normalize_observations=False)
        actor_in, critic_in = raw.inputs(None, observation, carry)
        policy, value = self.towers()
        k1, k2 = jax.random.split(key)
        zero = jnp.zeros(())
        return {
            "policy": policy.init(k1, carry.policy, actor_in, zero),
            "value": value.init(k2, carry.value, critic_in, zero),
        }
