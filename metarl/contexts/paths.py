"""Raw System paths with optional indexing, for experts.

``"geom_friction[:, 0]"`` or ``"link.inertia.mass[1]"``: a dotted attribute
path into the System, then an optional index made of integers and slices
(``a:b:c``), comma separated. Parsed without `eval`.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import jax.numpy as jnp
import numpy as np
from brax.base import System

_PATH = re.compile(r"^\s*([A-Za-z_][\w]*(?:\.[A-Za-z_][\w]*)*)\s*(?:\[(.*)\])?\s*$")
_INT = r"-?\d+"
_SLICE = re.compile(rf"^\s*({_INT})?\s*:\s*({_INT})?\s*(?::\s*({_INT})?\s*)?$")


@dataclasses.dataclass(frozen=True)
class RawPath:
    """A parsed raw path: `field` (dotted) and a static numpy-style `index`."""

    text: str
    field: str
    index: tuple[Any, ...]

    def read(self, sys: System) -> Any:
        leaf = sys
        for part in self.field.split("."):
            leaf = getattr(leaf, part)
        return leaf

    def default(self, sys: System) -> np.ndarray:
        return np.asarray(self.read(sys), np.float32)[self.index]

    def write(self, sys: System, values: jnp.ndarray) -> System:
        leaf = jnp.asarray(self.read(sys))
        return sys.tree_replace({self.field: leaf.at[self.index].set(values.astype(leaf.dtype))})


def _parse_index_item(item: str) -> Any:
    item = item.strip()
    if re.fullmatch(_INT, item):
        return int(item)
    m = _SLICE.match(item)
    if m:
        start, stop, step = (int(g) if g is not None else None for g in m.groups())
        return slice(start, stop, step)
    raise ValueError(f"cannot parse index item {item!r}: use integers and slices like 1, :, 0:3")


def parse(text: str) -> RawPath | None:
    """Parses `text` into a RawPath, or returns None if it is not path-shaped."""
    m = _PATH.match(text)
    if not m:
        return None
    field, index = m.group(1), m.group(2)
    items = () if index is None else tuple(_parse_index_item(i) for i in index.split(","))
    return RawPath(text=text, field=field, index=items)


def resolve(path: RawPath, sys: System) -> np.ndarray:
    """Checks that the path exists and its index fits; returns the default values."""
    try:
        leaf = path.read(sys)
    except AttributeError:
        raise ValueError(
            f"raw path {path.text!r}: the System has no field {path.field!r}"
        ) from None
    try:
        arr = np.asarray(leaf)
    except Exception:  # noqa: BLE001 - a sub-structure, not an array
        arr = None
    if arr is None or not np.issubdtype(arr.dtype, np.floating):
        raise ValueError(
            f"raw path {path.text!r}: {path.field!r} is not a float array "
            f"(got {type(leaf).__name__}); name a numeric leaf such as 'geom_friction'"
        )
    if isinstance(leaf, np.ndarray):
        raise ValueError(
            f"raw path {path.text!r}: {path.field!r} is a static field of the model (a numpy "
            "array, which MJX compiles into the program): it cannot vary inside jit; vary a "
            "field the simulation reads at run time instead (a JAX array of the System)"
        )
    try:
        default = path.default(sys)
    except (IndexError, ValueError) as e:  # ValueError: a slice step of 0
        raise ValueError(
            f"raw path {path.text!r}: index does not fit field {path.field!r} of shape "
            f"{arr.shape} ({e})"
        ) from None
    if default.size == 0:
        raise ValueError(
            f"raw path {path.text!r}: the index selects no element of field {path.field!r} "
            f"of shape {arr.shape}; name elements inside it"
        )
    return default
