"""Action distributions: a registry of heads turning network outputs into actions.

A head knows how many network outputs it needs (`param_size`), how to sample
a *raw* action (what the learner stores and scores: the pre-tanh value for
continuous control, the index for discrete), its log-probability and entropy,
and how to turn a raw action into what the env receives (`postprocess`).
"""

from __future__ import annotations

import dataclasses

import distrax
import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class TanhNormal:
    """Diagonal normal squashed by tanh into [-1, 1] (continuous control)."""

    min_std: float = 1e-3

    def param_size(self, action_size: int) -> int:
        return 2 * action_size

    def _normal(self, params):
        loc, raw_scale = jnp.split(params, 2, axis=-1)
        return distrax.MultivariateNormalDiag(loc, jax.nn.softplus(raw_scale) + self.min_std)

    def sample(self, params, key):
        return self._normal(params).sample(seed=key)

    def mode(self, params):
        return self._normal(params).mode()

    def log_prob(self, params, raw):
        fldj = distrax.Block(distrax.Tanh(), 1).forward_log_det_jacobian(raw)
        return self._normal(params).log_prob(raw) - fldj

    def entropy(self, params, key):
        """H[normal] + E[log|d tanh|], the second term estimated with one sample."""
        normal = self._normal(params)
        fldj = distrax.Block(distrax.Tanh(), 1).forward_log_det_jacobian(normal.sample(seed=key))
        return normal.entropy() + fldj

    def postprocess(self, raw):
        return jnp.tanh(raw)

    def encode(self, action, action_size: int):
        """The env action as a float vector (an RL^2 input)."""
        return action


@dataclasses.dataclass(frozen=True)
class Categorical:
    """A categorical over `action_size` discrete actions; the env gets an int32 index."""

    def param_size(self, action_size: int) -> int:
        return action_size

    def sample(self, params, key):
        return distrax.Categorical(logits=params).sample(seed=key)

    def mode(self, params):
        return jnp.argmax(params, axis=-1)

    def log_prob(self, params, raw):
        return distrax.Categorical(logits=params).log_prob(raw)

    def entropy(self, params, key):
        return distrax.Categorical(logits=params).entropy()

    def postprocess(self, raw):
        return raw.astype(jnp.int32)

    def encode(self, action, action_size: int):
        return jax.nn.one_hot(action, action_size)


ACTION_DISTRIBUTIONS = {"tanh_normal": TanhNormal(), "categorical": Categorical()}
