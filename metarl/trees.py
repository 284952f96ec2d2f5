"""Pytree helpers shared by checks, checkpoints and tests."""

from __future__ import annotations

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
