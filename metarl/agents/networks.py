"""Actor and critic towers: encoder MLP -> core (none, GRU or LSTM) -> head MLP.

One step at a time: `Tower.__call__(carry, x, reset)` resets the carry where
`reset` is 1, advances it on `x` and returns (carry, output). Training scans
this step over an unroll (truncated BPTT), so rollout and learning share one
code path. Cores come from a registry, not from a chain of conditionals.
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp


class MLP(nn.Module):
    """Dense layers with an activation between them (none after the last)."""

    sizes: Sequence[int]
    activate_last: bool = False

    @nn.compact
    def __call__(self, x):
        for i, size in enumerate(self.sizes):
            x = nn.Dense(size, kernel_init=nn.initializers.lecun_uniform())(x)
            if i < len(self.sizes) - 1 or self.activate_last:
                x = nn.swish(x)
        return x


# Recurrent cores: flax cells, stepped one time step at a time (None: feed-forward).
CORES = {"mlp": None, "gru": nn.GRUCell, "lstm": nn.OptimizedLSTMCell}


def initial_carry(core: str, hidden: int, batch_shape: tuple[int, ...]):
    """Zero carry of a core for `batch_shape` leading dims (GRU: h; LSTM: (c, h))."""
    zeros = lambda: jnp.zeros(batch_shape + (hidden,), jnp.float32)  # noqa: E731
    return {"mlp": lambda: (), "gru": zeros, "lstm": lambda: (zeros(), zeros())}[core]()


class Tower(nn.Module):
    """encoder -> core -> head. Output size `out`.

    `encode` and `decode` have no time dependency, so a learner can apply them
    to a whole [T, B] sequence at once and loop over time for `recur` only.
    """

    encoder: Sequence[int]
    core: str
    hidden: int
    head: Sequence[int]
    out: int

    def setup(self):
        self.encode_mlp = MLP(tuple(self.encoder), activate_last=True)
        self.cell = None if CORES[self.core] is None else CORES[self.core](self.hidden)
        self.head_mlp = MLP(tuple(self.head) + (self.out,))

    def encode(self, x):
        return self.encode_mlp(x)

    def recur(self, carry, h, reset):
        """One core step on features `h`; the carry restarts where `reset` is 1."""
        if self.cell is None:
            return carry, h
        fresh = initial_carry(self.core, self.hidden, reset.shape)
        keep = (1.0 - reset)[..., None]
        carry = jax.tree.map(lambda c, z: c * keep + z * (1.0 - keep), carry, fresh)
        return self.cell(carry, h)

    def decode(self, h):
        return self.head_mlp(h)

    def __call__(self, carry, x, reset):
        carry, h = self.recur(carry, self.encode(x), reset)
        return carry, self.decode(h)
