"""The curriculum interface: three pure functions over an explicit pytree state.

A curriculum is built by a factory (``LinearWidening(0.1, 10)``, ``ADR(...)``)
and used between training segments:

```python
curriculum = LinearWidening(start=0.1, segments=10)
state = curriculum.init(target, defaults=env.default_context())
for _ in range(num_segments):
    ts, es, metrics = run_train(space, ts, es, steps, context=curriculum.ranges(state))
    state = curriculum.update(state, metrics)
```

The state is a `flax.struct.PyTreeNode` of numpy arrays and `ContextSpace`s,
so it is saved in the same checkpoint as the rest of the run and restored
into a template made by ``init`` with the same arguments. ``ranges`` always
returns a space with the target's tree structure and leaf shapes (ADR: a
`metarl.contexts.PerEnv` with one row per env), so the trainer never recompiles.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import numpy as np
from flax import struct

from metarl.contexts import Choice, ContextSpace, Fixed, Normal
from metarl.trees import in_shape_of

__all__ = ["Curriculum", "CurriculumState", "check_compatible"]


class CurriculumState(struct.PyTreeNode):
    """What every curriculum state holds; each curriculum adds its own fields.

    Attributes:
      segment: int32[], the number of updates so far (segments finished).
      target: the space the curriculum widens towards (the final ranges).
      defaults: {name: float32 array}, the centre the ranges grow from (the env's
        defaults passed to init), or None for each range's own centre.
    """

    segment: Any
    target: ContextSpace
    defaults: Any


class Curriculum(NamedTuple):
    """A curriculum as three pure functions (optax style).

    Attributes:
      init: ``init(target, *, defaults=None, num_envs=None, key=None) -> state``.
        ``target`` is the final `ContextSpace`; ``defaults`` (usually
        ``env.default_context()``) is the centre ranges grow from; ``num_envs``
        and ``key`` are needed by curricula that assign envs (ADR) and ignored
        by the others.
      update: ``update(state, results) -> state``, called once after each
        training segment with that segment's results (see the package
        docstring for the keys).
      ranges: ``ranges(state) -> ContextSpace | PerEnv``, the ranges the next
        training segment trains on (shared, or one row per env).
      params: the factory's name and arguments, ``{"name": "LinearWidening",
        "start": 0.1, "segments": 10}``; an experiment records them in its
        run.json, so that a run is never resumed under another schedule. None:
        run.json records a digest of init's, update's and ranges' code and of the
        values and functions they capture instead.
      summary: ``summary(state, results) -> {tag: float}``, what ``update(state,
        results)`` reads and decides, as numbers to log (`experiment.run` logs
        each under ``curriculum/<tag>`` at every segment and keeps them in its
        history), so every decision can be checked against its inputs; None: nothing.
    """

    init: Callable[..., CurriculumState]
    update: Callable[[CurriculumState, Mapping[str, Any]], CurriculumState]
    ranges: Callable[[CurriculumState], ContextSpace]
    params: Mapping[str, Any] | None = None
    summary: Callable[[CurriculumState, Mapping[str, Any]], Mapping[str, float]] | None = None


def check_compatible(state: CurriculumState, space: ContextSpace) -> None:
    """Raises ValueError unless `state` was made for `space` (same names, kinds, shapes).

    Use it when pairing a restored curriculum state with the env's space: a
    state made for a target space of other names, or other distribution
    kinds or parameter shapes, cannot drive that env without recompiling.
    """
    if not isinstance(state, CurriculumState):
        raise ValueError(
            f"check_compatible needs a curriculum state (made by a curriculum's init), "
            f"got {type(state).__name__}"
        )
    if not isinstance(space, ContextSpace):
        raise ValueError(f"check_compatible needs a ContextSpace, got {type(space).__name__}")
    try:
        space.check_compatible(state.target)
    except ValueError as e:
        raise ValueError(
            f"this curriculum state was made for a target space of other names or structure: {e}"
        ) from None


def check_target(target: Any, who: str) -> ContextSpace:
    """`target` if it is a ContextSpace, else a ValueError naming the valid type."""
    if not isinstance(target, ContextSpace):
        raise ValueError(
            f"{who}: target must be a ContextSpace (metarl.contexts.ContextSpace), "
            f"got {type(target).__name__}"
        )
    return target


def check_real(value: Any, name: str, who: str) -> float:
    """`value` as a finite float, else a ValueError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real | np.ndarray | jax.Array):
        raise ValueError(f"{who}: {name} must be a finite number, got {value!r}")
    if np.ndim(value) != 0 or not np.isfinite(float(value)):
        raise ValueError(f"{who}: {name} must be a finite number, got {value!r}")
    return float(value)


def check_start(start: Any, who: str) -> float:
    """A start fraction in (0, 1], else a ValueError."""
    start = check_real(start, "start", who)
    if not 0 < start <= 1:
        raise ValueError(f"{who}: start must be a fraction of the target in (0, 1], got {start}")
    return start


def check_count(value: Any, name: str, who: str) -> int:
    """An integer >= 1, else a ValueError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{who}: {name} must be an integer >= 1, got {value!r}")
    return int(value)


def check_state(state: Any, cls: type, who: str) -> None:
    """A ValueError unless `state` is a `cls` (the state this curriculum's init makes)."""
    if not isinstance(state, cls):
        raise ValueError(
            f"{who} needs the state made by this curriculum's init ({cls.__name__}), "
            f"got {type(state).__name__}"
        )


def as_defaults(target: ContextSpace, defaults: Any, who: str) -> dict[str, np.ndarray] | None:
    """The defaults of the target's names as float32 arrays (None: each range's own centre)."""
    if defaults is None:
        return None
    target.check_defaults(defaults, f"{who}: defaults (None: each range's own centre)")
    return {name: np.asarray(defaults[name], np.float32) for name in target}


def check_shapes(
    target: ContextSpace, fraction: float, defaults: Mapping | None, who: str
) -> ContextSpace:
    """`scaled(target, fraction, defaults)` if it can replace the target's ranges
    (`ContextSpace.check_compatible`)."""
    try:
        return target.check_compatible(scaled(target, fraction, defaults))
    except ValueError as e:
        if defaults is None:  # about each range's own centre: no defaults to blame
            raise ValueError(f"{who}: the target's ranges cannot be scaled: {e}") from None
        raise ValueError(
            f"{who}: scaling the target about its defaults breaks its structure ({e}); give "
            "the target per-element parameters of the defaults' shape, or defaults=None"
        ) from None


def scaled(target: ContextSpace, fraction: float, defaults: Mapping | None) -> ContextSpace:
    """``target.scaled(fraction, around=defaults)`` clipped into the target (`inside`);
    exactly `target` once fraction >= 1. A `Fixed` value or a `Choice`'s values have
    no range to widen: they stay as the target declares them from the first segment
    (scaled, they would move toward the default, off the target: a fixed friction
    that is not the one declared, a Choice of motor signs -1 or 1 that is always
    positive)."""
    if fraction >= 1:
        return target
    ranged = ContextSpace({n: d for n, d in target.items() if not isinstance(d, (Fixed, Choice))})
    around = None if defaults is None else {n: defaults[n] for n in ranged}
    grown = inside(ranged, ranged.scaled(fraction, around=around))
    return ContextSpace({n: grown[n] if n in grown else d for n, d in target.items()})


def inside(target: ContextSpace, space: ContextSpace) -> ContextSpace:
    """`space` kept inside the target's training intervals (`ContextSpace.intervals`:
    the support of a bounded range, mean +- 2 std of a Normal, and of a
    TruncatedNormal within its bounds). `ContextSpace.scaled` grows a range about
    its nearest point to a default outside it (mass x 1.5-3, whose default x1 is
    below it: about x1.5); this keeps every segment inside the target's intervals,
    never training outside the target nor in the held-out extrapolation sets just
    beyond it. Bounds (``low``, ``high``)
    are clipped into the interval, keeping low <= high; a Normal, which has none,
    keeps its own mean +- 2 std inside it (its mean clipped, its std at most a
    quarter of the interval): clipping the mean alone left half its draws outside.
    Choice and Fixed are returned as they are."""
    intervals = target.intervals()
    out = {}
    for name, dist in space.items():
        t_lo, t_hi = (np.asarray(x, np.float32) for x in intervals[name])
        # a parameter clipped against per-element intervals keeps its shape where it is
        # still one number (a std of 0.1 inside intervals that differ was refused as
        # one per element, until 2026-12-07)
        if isinstance(dist, Normal):  # its own mean +- 2 std inside the target's
            std = np.minimum(np.asarray(dist.std, np.float32), (t_hi - t_lo) / 4)
            mean = np.clip(np.asarray(dist.mean, np.float32), t_lo + 2 * std, t_hi - 2 * std)
            mean, std = in_shape_of(mean, dist.mean), in_shape_of(std, dist.std)
            dist = dataclasses.replace(dist, mean=mean, std=std)
        elif hasattr(dist, "low") and hasattr(dist, "high"):
            low = np.clip(np.asarray(dist.low, np.float32), t_lo, t_hi)
            high = np.clip(np.asarray(dist.high, np.float32), low, t_hi)
            low, high = in_shape_of(low, dist.low), in_shape_of(high, dist.high)
            dist = dataclasses.replace(dist, low=low, high=high)
        out[name] = dist
    return ContextSpace(out)


def require(results: Any, key: str, who: str) -> Any:
    """``results[key]``; a KeyError naming the missing key (ValueError if not a mapping)."""
    if not isinstance(results, Mapping):
        raise ValueError(
            f"{who}: results must be a mapping such as run_train's metrics, "
            f"got {type(results).__name__}"
        )
    if key not in results:
        raise KeyError(f"{who} needs results[{key!r}]; got keys {sorted(results)}")
    return results[key]
