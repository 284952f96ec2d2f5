"""PPO losses as pure functions. Shapes: T time steps, B envs."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def bootstrap_values(
    values_next: jax.Array, values_final: jax.Array, boundary: jax.Array, terminated: jax.Array
) -> jax.Array:
    """Value of what follows each step, [T, B].

    Args:
      values_next: V(obs_{t+1}), [T, B] (the next observation the agent sees).
      values_final: V(final_obs_t), [T, B] (the observation an episode ended on).
      boundary: 1 where step t ends what the return spans (an episode, or a
        trial for RL^2), [T, B].
      terminated: 1 where that end is a true termination, [T, B].
    Returns:
      V(obs_{t+1}) inside a return; at a boundary, V(final_obs_t) if the end is
      a truncation (bootstrap) and 0 if it is a termination.
    """
    at_end = jnp.where(terminated > 0, 0.0, values_final)
    return jnp.where(boundary > 0, at_end, values_next)


def compute_gae(
    rewards: jax.Array,
    values: jax.Array,
    next_values: jax.Array,
    boundary: jax.Array,
    discount: float,
    gae_lambda: float,
) -> tuple[jax.Array, jax.Array]:
    """Generalized advantage estimation.

    Args: rewards, values V(obs_t), next_values (from `bootstrap_values`) and
      boundary, all [T, B].
    Returns: (advantages, returns), both [T, B]; returns = advantages + values.
    """
    deltas = rewards + discount * next_values - values

    def backward(carry, x):
        delta, end = x
        adv = delta + discount * gae_lambda * (1.0 - end) * carry
        return adv, adv

    _, advantages = jax.lax.scan(
        backward, jnp.zeros_like(values[0]), (deltas, boundary), reverse=True
    )
    return advantages, advantages + values


def ppo_losses(
    log_prob: jax.Array,
    old_log_prob: jax.Array,
    advantages: jax.Array,
    values: jax.Array,
    returns: jax.Array,
    entropy: jax.Array,
    clipping_epsilon: float,
    axis_name: str | None = None,
) -> dict[str, jax.Array]:
    """Clipped-surrogate PPO terms, all inputs [T, B]; scalar outputs.

    Advantages are normalised over the minibatch: with `axis_name`, over the
    minibatch of every device along that axis together (the shards are of equal
    size), so the normalisation does not depend on how many devices share the
    envs. Returns policy_loss, value_loss (0.5 * MSE), entropy (mean), approx_kl
    and clip_fraction.
    """
    if axis_name is None:
        adv = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    else:
        mean = jax.lax.pmean(advantages.mean(), axis_name)
        var = jax.lax.pmean(jnp.mean(jnp.square(advantages - mean)), axis_name)
        adv = (advantages - mean) / (jnp.sqrt(var) + 1e-8)
    log_ratio = log_prob - old_log_prob
    ratio = jnp.exp(log_ratio)
    surrogate = jnp.minimum(
        ratio * adv, jnp.clip(ratio, 1 - clipping_epsilon, 1 + clipping_epsilon) * adv
    )
    return {
        "policy_loss": -surrogate.mean(),
        "value_loss": 0.5 * jnp.mean((returns - values) ** 2),
        "entropy": entropy.mean(),
        "approx_kl": jnp.mean((ratio - 1) - log_ratio),
        "clip_fraction": jnp.mean(jnp.abs(ratio - 1) > clipping_epsilon),
    }
