"""Inference: the trained agent as ``action, carry = policy(obs, carry)``."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from metarl.agents.agent import Agent, AgentCarry
from metarl.agents.ppo.training import fits
from metarl.trees import check_alive


class Policy(struct.PyTreeNode):
    """Inference: ``action, carry = policy(obs, carry)`` on batched inputs.

    After each env step call ``carry = policy.observe(carry, action, state)``:
    a recurrent agent's memory then starts over at each trial (or episode) start,
    where the env says one begins, and an RL^2 agent sees its previous action and
    reward. Without it the memory runs on across trials and the RL^2 inputs stay
    zero (the agent acts as it never did in training). A Policy is a pytree
    (parameters are leaves): pass it into jitted code; policies from the same
    TrainSpace share one compiled evaluation.
    """

    params: Any
    normalizer: Any
    agent: Agent = struct.field(pytree_node=False)
    deterministic: bool = struct.field(pytree_node=False, default=True)

    def init_carry(self, batch: int) -> AgentCarry:
        return self.agent.init_carry((batch,))

    def __call__(self, obs, carry: AgentCarry, key: jax.Array | None = None):
        self._check_observation(obs)
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
        # the core has seen its first observation: it starts over only where `observe`
        # says (left at 1, a loop without `observe` wiped the memory at every step)
        zero = jnp.zeros_like(carry.reset)
        return action, carry.replace(reset=zero, new_episode=zero)

    def observe(self, carry: AgentCarry, action: jax.Array, state) -> AgentCarry:
        return self.agent.observe(carry, action, state)

    def _check_observation(self, obs) -> None:
        """Refuses a batch whose per-env observation is not the one trained on (an env
        built with another context space or `visible_context`, or one env's unbatched
        vector): it failed deep inside, with a broadcasting TypeError or vmap's sizes."""
        trained = jax.tree.map(lambda x: tuple(jnp.shape(x)), self.normalizer.mean)
        given = jax.tree.map(lambda x: tuple(jnp.shape(x))[1:], obs)
        if given != trained:  # containers of shapes: another structure differs too
            raise ValueError(
                f"policy: observations of per-env shape {given} (after the batch axis); this "
                f"policy was trained on {trained}. Pass a batch [envs, ...] of the env it was "
                "trained on (the same context space and visible_context)"
            )


def make_policy(space, training_state, deterministic: bool = True) -> Policy:
    """The agent of `space` (a TrainSpace) with `training_state`'s parameters and
    observation statistics, as an inference function (see `Policy`). A state of a
    multi-seed space holds every seed: pass one, ``ppo.select_seed(training_state, k)``.
    The policy holds copies: `run_train`, which consumes the state it is given, leaves
    it working (a snapshot of the best parameters so far, say)."""
    if np.ndim(training_state.iterations):
        raise ValueError(
            f"make_policy: training_state holds {len(training_state.iterations)} seeds (the "
            "space's seed axis); build one seed's policy from ppo.select_seed(training_state, k)"
        )
    check_alive(training_state, "training_state", "make_policy")
    if not fits(space, training_state, seeds=0 if space.num_seeds is None else 1):
        raise ValueError(
            "make_policy: training_state does not match this train space (another agent or "
            "config): pass the state run_train returned for this space"
        )
    copy = lambda tree: jax.tree.map(jnp.copy, tree)  # noqa: E731
    return Policy(
        params=copy(training_state.params),
        normalizer=copy(training_state.normalizer),
        agent=space.agent,
        deterministic=deterministic,
    )
