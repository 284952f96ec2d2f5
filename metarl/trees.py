"""Pytree helpers shared by checks, checkpoints, run records and tests."""

from __future__ import annotations

import re
import sys
from typing import Any

import jax
import numpy as np


def is_key(x: Any) -> bool:
    """True for a typed PRNG key array (`jax.random.key`)."""
    return hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def to_numpy(tree: Any) -> Any:
    """Every leaf as a NumPy array on the host; typed keys become their raw data."""
    return jax.tree.map(
        lambda x: np.asarray(jax.random.key_data(x) if is_key(x) else x), jax.device_get(tree)
    )


def check_alive(tree: Any, what: str, who: str) -> None:
    """Raises ValueError if any array of `tree` was deleted: donated to (consumed by)
    a jitted call such as `run_train`, whose returned states replace it. JAX's own
    error ("Array has been deleted") names neither the call nor the fix."""
    if any(isinstance(x, jax.Array) and x.is_deleted() for x in jax.tree.leaves(tree)):
        raise ValueError(
            f"{who}: {what} was consumed by an earlier call that donates its inputs (such as "
            "ppo.run_train, whose inputs are reused for its outputs): use the states that "
            "call returned (copy one first with jax.tree.map(jnp.copy, state) to keep it)"
        )


# A memory address in a repr ("<function f at 0x7f...>"): different in every process.
ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
# NumPy's default print options, except that every float is printed exactly (the
# shortest text that reads back as the same value) and no array is summarised.
_EXACT_PRINT = dict(
    precision=8,
    threshold=sys.maxsize,
    edgeitems=3,
    linewidth=75,
    suppress=False,
    nanstr="nan",
    infstr="inf",
    formatter=None,
    sign="-",
    floatmode="unique",
    legacy=False,
)


def stable_repr(value: Any) -> str:
    """`repr(value)` as every process prints it: arrays exact whatever
    `np.set_printoptions` says (two float32 values that differ give different
    text), and memory addresses dropped. For run records compared across runs."""
    with np.printoptions(**_EXACT_PRINT):
        return ADDRESS.sub("", repr(value))


def in_shape_of(value: np.ndarray, like: Any) -> np.ndarray:
    """`value` in the shape of `like` where it holds one number: a parameter clipped
    against per-element bounds comes back one per element, and where every element is
    the same, the parameter keeps the shape it had (a range's structure is what
    compiled programs take). Any other `value` is returned as it is."""
    value, shape = np.asarray(value), np.shape(like)
    if value.shape == shape or value.size == 0 or np.any(value != value.flat[0]):
        return value
    return np.full(shape, value.flat[0], value.dtype)
