"""Actor and critic towers: encoder MLP -> core (none, GRU or LSTM) -> head MLP.

One step at a time: `Tower.__call__(carry, x, reset)` resets the carry where
`reset` is 1, advances it on `x` and returns (carry, output). Training scans
this step over an unroll (truncated BPTT), so rollout and learning share one
code path. Cores come from a registry, not from a chain of conditionals.

A core splits its step in two: `project` (what depends on the input only)
and `step` (what depends on the carry). The learner projects a whole [T, B]
sequence in one batched call and loops over time for `step` only.
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


class _Weights(nn.Module):
    """A Dense layer's parameters (`kernel`, and `bias` if used), returned, not applied."""

    features: int
    use_bias: bool
    kernel_init: nn.initializers.Initializer

    @nn.compact
    def __call__(self, in_features: int):
        kernel = self.param("kernel", self.kernel_init, (in_features, self.features))
        if not self.use_bias:
            return kernel, jnp.zeros((self.features,), jnp.float32)
        return kernel, self.param("bias", nn.initializers.zeros_init(), (self.features,))


class _FusedCell(nn.Module):
    """A flax recurrent cell's parameter tree (names, shapes, initialisers), with
    each side's gate matmuls fused into one.

    `project(x)` is the input side, x @ [W_i...] + b, with no time dependency;
    `step(carry, projected)` adds the hidden side, one h @ [W_h...] + b per
    time step, and applies the gates.
    """

    features: int
    inputs = ()  # (name, use_bias) of each input-side gate, in order
    hidden = ()  # the same for the hidden side (all that `step` reads)

    def setup(self):
        # setattr: flax names a submodule after its attribute ("in" is a keyword).
        for (name, bias), init in [(g, nn.initializers.lecun_normal()) for g in self.inputs] + [
            (g, nn.initializers.orthogonal()) for g in self.hidden
        ]:
            setattr(self, name, _Weights(self.features, bias, init))

    def _fused(self, gates, x):
        kernels, biases = zip(*(getattr(self, name)(x.shape[-1]) for name, _ in gates))
        return x @ jnp.concatenate(kernels, -1) + jnp.concatenate(biases, -1)

    def project(self, x):
        return self._fused(self.inputs, x)

    def __call__(self, carry, x):
        return self.step(carry, self.project(x))


class GRU(_FusedCell):
    """flax's `nn.GRUCell`: the same parameters and equations, 2 matmuls instead of 6."""

    inputs = (("ir", True), ("iz", True), ("in", True))
    hidden = (("hr", False), ("hz", False), ("hn", True))

    def step(self, h, projected):
        x_r, x_z, x_n = jnp.split(projected, 3, -1)
        h_r, h_z, h_n = jnp.split(self._fused(self.hidden, h), 3, -1)
        r = nn.sigmoid(x_r + h_r)
        z = nn.sigmoid(x_z + h_z)
        n = jnp.tanh(x_n + r * h_n)
        h = (1.0 - z) * n + z * h
        return h, h


class LSTM(_FusedCell):
    """flax's `nn.OptimizedLSTMCell` (and `nn.LSTMCell`): the same parameters and
    equations, with the input side projected outside the loop over time."""

    inputs = (("ii", False), ("if", False), ("ig", False), ("io", False))
    hidden = (("hi", True), ("hf", True), ("hg", True), ("ho", True))

    def step(self, carry, projected):
        c, h = carry
        i, f, g, o = jnp.split(projected + self._fused(self.hidden, h), 4, -1)
        c = nn.sigmoid(f) * c + nn.sigmoid(i) * jnp.tanh(g)
        h = nn.sigmoid(o) * jnp.tanh(c)
        return (c, h), h


# Recurrent cores, stepped one time step at a time (None: feed-forward).
CORES = {"mlp": None, "gru": GRU, "lstm": LSTM}


def recur_params(core: str, params) -> dict:
    """The part of a tower's `params` that `Tower.recur` reads: the core's hidden
    side, which has one shape in every tower of a given hidden size."""
    if CORES[core] is None:
        return {"params": {}}
    cell = params["params"]["cell"]
    return {"params": {"cell": {name: cell[name] for name, _ in CORES[core].hidden}}}


def initial_carry(core: str, hidden: int, batch_shape: tuple[int, ...]):
    """Zero carry of a core for `batch_shape` leading dims (GRU: h; LSTM: (c, h))."""
    zeros = lambda: jnp.zeros(batch_shape + (hidden,), jnp.float32)  # noqa: E731
    return {"mlp": lambda: (), "gru": zeros, "lstm": lambda: (zeros(), zeros())}[core]()


class Tower(nn.Module):
    """encoder -> core -> head. Output size `out`.

    `encode` (the encoder and the core's input projection) and `decode` have
    no time dependency, so a learner can apply them to a whole [T, B] sequence
    at once and loop over time for `recur` only.
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
        h = self.encode_mlp(x)
        return h if self.cell is None else self.cell.project(h)

    def recur(self, carry, h, reset):
        """One core step on encoded `h`; the carry restarts where `reset` is 1."""
        if self.cell is None:
            return carry, h
        fresh = initial_carry(self.core, self.hidden, reset.shape)
        keep = (1.0 - reset)[..., None]
        # A blend, not a select: jnp.where gives the same numbers but XLA fuses it
        # differently, and the shipped results would shift by float rounding. (A NaN
        # carry survives the blend; the env never lets a non-finite observation in.)
        carry = jax.tree.map(lambda c, z: c * keep + z * (1.0 - keep), carry, fresh)
        return self.cell.step(carry, h)

    def decode(self, h):
        return self.head_mlp(h)

    def __call__(self, carry, x, reset):
        carry, h = self.recur(carry, self.encode(x), reset)
        return carry, self.decode(h)
