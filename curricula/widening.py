"""Fixed schedules: the ranges widen from a fraction of the target to all of it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from curricula.base import (
    Curriculum,
    CurriculumState,
    as_defaults,
    check_count,
    check_shapes,
    check_start,
    check_state,
    check_target,
    scaled,
)
from metarl.contexts import ContextSpace


class WideningState(CurriculumState):
    """State of `LinearWidening` and `GeometricWidening`.

    Attributes:
      fraction: float32, the fraction of the target the next segment trains on.
    """

    fraction: np.ndarray


def LinearWidening(start: float, segments: int) -> Curriculum:  # noqa: N802
    """Fraction ``start + (1 - start) * k / segments`` after k updates, then 1.

    ``ranges(state) = target.scaled(fraction, around=defaults)`` (each range's own
    centre if `init` got no defaults) clipped into the target (a default outside
    it: about its nearest edge), exactly the target once the fraction is 1.
    `update` ignores its results.

    Args:
      start: the first segment's fraction of the target, in (0, 1].
      segments: number of updates after which the ranges are the target (>= 1).
    """
    who = "LinearWidening"
    start = check_start(start, who)
    segments = check_count(segments, "segments", who)
    return _widening(who, start, segments, lambda k: start + (1.0 - start) * k / segments)


def GeometricWidening(start: float, segments: int) -> Curriculum:  # noqa: N802
    """Fraction ``start * (1 / start) ** (k / segments)`` after k updates, then 1.

    The ranges grow by the same factor every segment. Otherwise as `LinearWidening`.

    Args:
      start: the first segment's fraction of the target, in (0, 1].
      segments: number of updates after which the ranges are the target (>= 1).
    """
    who = "GeometricWidening"
    start = check_start(start, who)
    segments = check_count(segments, "segments", who)
    return _widening(who, start, segments, lambda k: start * (1.0 / start) ** (k / segments))


def _widening(
    who: str, start: float, segments: int, schedule: Callable[[int], float]
) -> Curriculum:
    def fraction(k: int) -> np.ndarray:
        return np.asarray(1.0 if k >= segments else schedule(k), np.float32)

    def init(
        target: ContextSpace,
        *,
        defaults: Mapping | None = None,
        num_envs: Any = None,
        key: Any = None,
    ) -> WideningState:
        """The state before the first segment; num_envs and key are not used."""
        target = check_target(target, who)
        defaults = as_defaults(target, defaults, who)
        f = fraction(0)
        if start < 1:  # start 1 (fixed ranges) never scales the target: nothing to check
            check_shapes(target, float(min(f, 0.5)), defaults, who)
        return WideningState(
            segment=np.asarray(0, np.int32), target=target, defaults=defaults, fraction=f
        )

    def update(state: WideningState, results: Mapping[str, Any] | None = None) -> WideningState:
        """Advances one segment; `results` is not used."""
        check_state(state, WideningState, f"{who}.update")
        k = int(state.segment) + 1
        return state.replace(segment=np.asarray(k, np.int32), fraction=fraction(k))

    def ranges(state: WideningState) -> ContextSpace:
        """The target scaled by the state's fraction about the defaults."""
        check_state(state, WideningState, f"{who}.ranges")
        return scaled(state.target, float(state.fraction), state.defaults)

    def summary(state: WideningState, results: Mapping[str, Any] | None = None) -> dict:
        """The fraction of the target the segment trained on."""
        check_state(state, WideningState, f"{who}.summary")
        return {"fraction": float(state.fraction)}

    params = {"name": who, "start": start, "segments": segments}
    return Curriculum(init=init, update=update, ranges=ranges, params=params, summary=summary)
