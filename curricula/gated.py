"""Widening gated by performance: the ranges grow only when the agent is good enough."""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from curricula.base import (
    Curriculum,
    CurriculumState,
    as_defaults,
    check_real,
    check_shapes,
    check_start,
    check_state,
    check_target,
    require,
    scaled,
)
from metarl.contexts import ContextSpace

METRICS = ("eval_return", "episode_return")
# A relative threshold above this is taken for a percentage (90 for 0.9) and refused:
# the gate would sit at 90x the first return and never open.
MAX_RELATIVE = 10.0


class GatedState(CurriculumState):
    """State of `PerformanceGated`.

    Attributes:
      fraction: float32, the fraction of the target the next segment trains on.
      reference: float32, the first finite return seen (relative thresholds), NaN before.
    """

    fraction: np.ndarray
    reference: np.ndarray


def PerformanceGated(  # noqa: N802
    start: float,
    step: float,
    threshold: float,
    relative: bool = False,
    metric: str = "eval_return",
) -> Curriculum:
    """Widens the fraction by `step` (capped at 1) when ``results[metric]`` reaches a threshold.

    ``ranges(state) = target.scaled(fraction, around=defaults)`` clipped into the
    target (a default outside it: about its nearest edge), exactly the target once the
    fraction is 1. A NaN metric (no episode completed) holds.

    Args:
      start: the first segment's fraction of the target, in (0, 1].
      step: how much the fraction grows when the gate opens, > 0.
      threshold: the return to reach (``>=``). With relative=True a fraction of the
        reference return: the first finite ``results[metric]`` (the return on the
        narrow starting ranges), stored in the state and compared in that same
        update too (so with threshold <= 1 the first update always widens); the
        gate then opens at ``threshold * reference`` (``reference - (1 - threshold) * |reference|``
        for a negative reference, the same distance below it); in (0, 10]
        (a relative 90 is refused as a percentage).
      relative: see threshold.
      metric: what `update` reads: "eval_return" (default), ``results["eval_return"]``;
        or "episode_return", the mean return of the training episodes the segment
        played on its own ranges: ``results["env_return_sum"].sum() /
        results["env_episodes"].sum()`` (`current_return`; NaN, which holds, where
        none ended). Not run_train's ``results["episode_return"]``, which also averages
        the episodes of trials drawn before the ranges last changed: with trials of 2
        episodes and a segment of one episode per env, every episode it averaged was
        played on the ranges before (until 2026-12-07, when the gate read it).
        `experiment.run` refuses a segment shorter than `MIN_TRIALS_PER_SEGMENT`
        trials per env for it.
    """
    who = "PerformanceGated"
    start, step, threshold = _check_args(who, start, step, threshold, relative, metric)

    def init(
        target: ContextSpace,
        *,
        defaults: Mapping | None = None,
        num_envs: Any = None,
        key: Any = None,
    ) -> GatedState:
        """The state before the first segment; num_envs and key are not used."""
        target = check_target(target, who)
        defaults = as_defaults(target, defaults, who)
        if start < 1:  # start 1 (fixed ranges) never scales the target: nothing to check
            check_shapes(target, min(start, 0.5), defaults, who)
        return GatedState(
            segment=np.asarray(0, np.int32),
            target=target,
            defaults=defaults,
            fraction=np.asarray(start, np.float32),
            reference=np.asarray(np.nan, np.float32),
        )

    def read(state: GatedState, results: Mapping[str, Any], where: str):
        """(the value read, the reference after it, the return that opens the gate)."""
        check_state(state, GatedState, f"{who}.{where}")
        if metric == "episode_return":
            value = current_return(results, f"{who}(metric={metric!r})")
        else:
            value = require(results, metric, f"{who}(metric={metric!r})")
        if (
            isinstance(value, bool)
            or not isinstance(value, numbers.Real | np.ndarray | jax.Array)
            or np.ndim(value) != 0
            or not np.issubdtype(np.asarray(value).dtype, np.number)
        ):
            raise ValueError(
                f"{who}.{where}: results[{metric!r}] must be one real number (NaN holds the "
                f"gate), got {value!r}"
            )
        # in float32, as the reference is stored: a float64 return compared with its own
        # float32 rounding could miss the first widening that threshold <= 1 promises
        value = float(np.float32(np.asarray(value)))
        reference = float(state.reference)
        if relative and not np.isfinite(reference) and np.isfinite(value):
            reference = value
        if relative and reference == 0:  # threshold x 0 is 0 for every threshold
            raise ValueError(
                f"{who}.{where}: a relative threshold ({threshold} x the reference return) "
                f"has no meaning here: the reference, the first finite results[{metric!r}], is "
                "0 (common in sparse-reward tasks), so any return >= 0 would open the gate; "
                "give an absolute threshold (relative=False)"
            )
        # the gate rounded as the value is: a return equal to the threshold opens it
        return value, reference, float(np.float32(_gate(threshold, relative, reference)))

    def update(state: GatedState, results: Mapping[str, Any]) -> GatedState:
        """Needs ``results[metric]``; widens if it reaches the threshold, else holds."""
        value, reference, gate = read(state, results, "update")
        fraction = float(state.fraction)
        if value >= gate:  # NaN: False
            # start + k * step from the openings so far, not a float32 running sum
            # (start 0.1, step 0.15 summed to 0.99999994 after 6 openings)
            opened = round((fraction - start) / step)
            fraction = min(1.0, start + (opened + 1) * step)
        return state.replace(
            segment=np.asarray(int(state.segment) + 1, np.int32),
            fraction=np.asarray(fraction, np.float32),
            reference=np.asarray(reference, np.float32),
        )

    def ranges(state: GatedState) -> ContextSpace:
        """The target scaled by the state's fraction about the defaults."""
        check_state(state, GatedState, f"{who}.ranges")
        return scaled(state.target, float(state.fraction), state.defaults)

    def summary(state: GatedState, results: Mapping[str, Any]) -> dict[str, float]:
        """The fraction trained on, the return read (``gate/return``) and the return
        that opens the gate (``gate/opens_at``; NaN before a relative reference)."""
        value, _, gate = read(state, results, "summary")
        return {"fraction": float(state.fraction), "gate/return": value, "gate/opens_at": gate}

    params = {
        "name": who,
        "start": start,
        "step": step,
        "threshold": threshold,
        "relative": relative,
        "metric": metric,
    }
    return Curriculum(init=init, update=update, ranges=ranges, params=params, summary=summary)


def current_return(results: Mapping[str, Any], who: str) -> float:
    """The mean return of the training episodes played on the segment's own ranges:
    ``results["env_return_sum"].sum() / results["env_episodes"].sum()`` (run_train's
    per-env sums of the episodes whose trial drew its context from the ranges the
    segment trained on), NaN where none ended."""
    sums, episodes = (
        np.asarray(require(results, key, who), np.float64)
        for key in ("env_return_sum", "env_episodes")
    )
    if sums.shape != episodes.shape:
        raise ValueError(
            f"{who}: results['env_return_sum'] and results['env_episodes'] must have one "
            f"entry per env each, got shapes {sums.shape} and {episodes.shape}"
        )
    count = float(episodes.sum())
    return float(sums.sum()) / count if count > 0 else float("nan")


def _check_args(who, start, step, threshold, relative, metric) -> tuple[float, float, float]:
    """Validated (start, step, threshold) of `PerformanceGated`."""
    start = check_start(start, who)
    step = check_real(step, "step", who)
    if step <= 0:
        raise ValueError(f"{who}: step must be > 0 (the fraction added when widening), got {step}")
    threshold = check_real(threshold, "threshold", who)
    if not isinstance(relative, bool):
        raise ValueError(f"{who}: relative must be True or False, got {relative!r}")
    if relative and threshold <= 0:
        raise ValueError(
            f"{who}: a relative threshold is a fraction of the reference return and must be "
            f"> 0 (e.g. 0.9), got {threshold}"
        )
    if relative and threshold > MAX_RELATIVE:
        raise ValueError(
            f"{who}: a relative threshold is a multiple of the reference return (0.9 for "
            f"90%), at most {MAX_RELATIVE:g}; {threshold:g} reads as a percentage. For a "
            "return far above the narrow ranges' one, give it as an absolute threshold "
            "(relative=False)"
        )
    if metric not in METRICS:
        raise ValueError(f"{who}: metric must be one of {list(METRICS)}, got {metric!r}")
    return start, step, threshold


def _gate(threshold: float, relative: bool, reference: float) -> float:
    """The return that opens the gate: threshold x reference (the same distance below a
    negative reference) if relative, else the threshold itself."""
    if not relative:
        return threshold
    return reference - (1.0 - threshold) * abs(reference)
