"""Elements chosen by their MJCF names: ``"mass[torso]"``, ``"friction[floor]"``,
``"actuator_gain[*hip*]"``, ``"damping[thigh_joint, 2]"``.

A canonical quantity followed by a bracketed, comma-separated list of element
names, shell-style patterns (``*``, ``?``, ``[...]``, matched with `fnmatch`)
or integer indices into the quantity's elements (bodies are counted without
the world body, so ``mass[0]`` is the first real body). Unnamed elements
(Brax's ant has some) are reachable by index. Names come from the model itself
(`mjx.Model.names`, which Brax's System shares), so they are the MJCF's.
Per-element values follow the order the selection names the elements in
(``"mass[thigh, torso]"``: thigh's first), each element named once.
"""

from __future__ import annotations

import fnmatch
import re

import numpy as np

# element kind -> (name address field, count field, first element: 1 skips the world body)
_KINDS = {
    "bodies": ("name_bodyadr", "nbody", 1),
    "geoms": ("name_geomadr", "ngeom", 0),
    "joints": ("name_jntadr", "njnt", 0),
    "actuators": ("name_actuatoradr", "nu", 0),
    "pairs": ("name_pairadr", "npair", 0),
    "tendons": ("name_tendonadr", "ntendon", 0),
}
SELECTABLE = (*_KINDS, "dofs")
_ONE = {
    "bodies": "body",
    "geoms": "geom",
    "joints": "joint",
    "actuators": "actuator",
    "pairs": "pair",
    "tendons": "tendon",
    "dofs": "dof",
}

_SELECTION = re.compile(r"^\s*([A-Za-z_]\w*)\s*\[(.*)\]\s*$")


def split(name: str) -> tuple[str, str | None]:
    """``"mass[torso]"`` -> ("mass", "torso"); ``"mass"`` -> ("mass", None)."""
    m = _SELECTION.match(name)
    return (m.group(1), m.group(2)) if m else (name.strip(), None)


def _name_at(model, adr: int) -> str:
    raw = bytes(model.names)
    return raw[adr : raw.index(b"\0", adr)].decode()


def element_names(model, kind: str) -> list[str]:
    """The MJCF name of every element of `kind` ("" where unnamed)."""
    if kind == "dofs":  # a dof is named after its joint (a free joint has 6 dofs)
        joints = element_names(model, "joints")
        return [joints[j] for j in np.asarray(model.dof_jntid)]
    if kind not in _KINDS:
        raise ValueError(f"elements of kind {kind!r} have no names; kinds: {SELECTABLE}")
    adr_field, count_field, first = _KINDS[kind]
    adrs = np.asarray(getattr(model, adr_field))
    return [_name_at(model, int(a)) for a in adrs[first : int(getattr(model, count_field))]]


def select(model, kind: str, selector: str, context: str) -> np.ndarray:
    """Indices of the elements `selector` names, in the order it names them (a
    pattern's matches in model order): per-element values follow this order.
    ValueError listing the valid names when an item matches nothing, and when two
    items choose the same element."""
    names = element_names(model, kind)
    items = [s.strip() for s in selector.split(",")]
    if not selector.strip() or any(not s for s in items):
        raise ValueError(f"context {context!r}: empty element selection; {_valid(names, kind)}")
    chosen: dict[int, str] = {}  # element -> the item that chose it, in the order named
    for item in items:
        if re.fullmatch(r"-?\d+", item):
            i = int(item)
            if not -len(names) <= i < len(names):
                raise ValueError(
                    f"context {context!r}: index {i} is out of range for {len(names)} {kind}; "
                    f"{_valid(names, kind)}"
                )
            hits = [i % len(names)]
        else:
            hits = [i for i, n in enumerate(names) if n and fnmatch.fnmatchcase(n, item)]
        if not hits:
            raise ValueError(
                f"context {context!r}: no {_ONE[kind]} named {item!r}; {_valid(names, kind)}"
            )
        for i in hits:
            if i in chosen:
                label = names[i] or f"index {i}"
                raise ValueError(
                    f"context {context!r}: {_ONE[kind]} {label} is chosen twice (by "
                    f"{chosen[i]!r} and {item!r}); name each element once, in the order "
                    "per-element values give them"
                )
            chosen[i] = item
    return np.asarray(list(chosen), np.int32)


def _valid(names: list[str], kind: str) -> str:
    shown = [n if n else f"<unnamed: index {i}>" for i, n in enumerate(names)]
    return f"valid {kind}: {', '.join(shown) if shown else '(none)'}"
