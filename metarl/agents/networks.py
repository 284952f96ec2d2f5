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


class _Stateless(nn.Module):
    """The feed-forward 'core': no carry."""

    features: int

    def initialize_carry(self, batch_shape):
        return ()

    def __call__(self, carry, x):
        return carry, x


def _gru(features):
    return nn.GRUCell(features)


def _lstm(features):
    return nn.OptimizedLSTMCell(features)


CORES = {"mlp": _Stateless, "gru": _gru, "lstm": _lstm}


def initial_carry(core: str, hidden: int, batch_shape: tuple[int, ...]):
    """Zero carry of a core for `batch_shape` leading dims."""
    if core == "mlp":
        return ()
    cell = CORES[core](hidden)
    return cell.initialize_carry(jax.random.key(0), batch_shape + (hidden,))


class Tower(nn.Module):
    """encoder -> core -> head. Output size `out`."""

    encoder: Sequence[int]
    core: str
    hidden: int
    head: Sequence[int]
    out: int

    @nn.compact
    def __call__(self, carry, x, reset):
        h = MLP(tuple(self.encoder), activate_last=True)(x)
        if self.core != "mlp":
            fresh = initial_carry(self.core, self.hidden, reset.shape)
            keep = (1.0 - reset)[..., None]
            carry = jax.tree.map(lambda c, z: c * keep + z * (1.0 - keep), carry, fresh)
            carry, h = CORES[self.core](self.hidden)(carry, h)
        return carry, MLP(tuple(self.head) + (self.out,))(h)
