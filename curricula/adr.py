"""Automatic Domain Randomization (ADR).

OpenAI et al. 2019, "Solving Rubik's Cube with a Robot Hand", Algorithm 1. Every
context name is a dimension with a low and a high boundary. Each segment, a
fraction `boundary_prob` of the envs evaluates one boundary (a dimension and a
side chosen uniformly): that env trains on the current ranges with the dimension
pinned to the boundary value. Their mean episode returns go to that boundary's
buffer; once it holds `buffer_size` entries its mean is compared with the
thresholds: at or above `high_threshold` the boundary moves outwards by `delta`
times the target's width, at or below `low_threshold` inwards (the paper's >= t_H
and <= t_L), and the buffer is cleared.
The ranges never leave the target, and low <= high always. A boundary never
shrinks past the starting range (NVIDIA's DeXtreme ADR clamps at its initial range
too; the paper's ranges start as a point, the default, and cannot shrink past
it): a range that fails on both sides returns to where it started, not to a point
that the order of the boundaries picks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from curricula.base import (
    Curriculum,
    CurriculumState,
    as_defaults,
    check_count,
    check_real,
    check_shapes,
    check_start,
    check_state,
    check_target,
    require,
    scaled,
)
from metarl.contexts import ContextSpace, LogUniform, PerEnv, Uniform

LOW, HIGH = 0, 1  # boundary b = 2 * dimension + side


class ADRState(CurriculumState):
    """State of `ADR`: fixed shapes whatever happens, so it restores into `init`'s output.

    Attributes:
      current: the shared current ranges (the target's kinds and parameter shapes),
        inside the target, low <= high.
      buffers: float32 [2 * dims, buffer_size], per-boundary returns; boundary
        ``b = 2 * d + side`` (side 0 low, 1 high) for the d-th name of the target.
      counts: int32 [2 * dims], how many entries of each buffer are filled.
      key: typed key (`jax.random.key`) for the next draw.
      assignment: int32 [num_envs], the boundary each env evaluates in the next
        segment, -1 for none.
    """

    current: ContextSpace
    buffers: np.ndarray
    counts: np.ndarray
    key: jax.Array
    assignment: np.ndarray


def ADR(  # noqa: N802
    start: float,
    delta: float,
    low_threshold: float,
    high_threshold: float,
    buffer_size: int,
    boundary_prob: float = 0.5,
) -> Curriculum:
    """Automatic Domain Randomization over Uniform and LogUniform target ranges.

    `init(target, defaults=..., num_envs=N, key=key)` needs num_envs and a key.
    `ranges(state)` is `PerEnv` ranges (every leaf has a leading [num_envs] axis);
    `adr_ranges(state)` the shared current ranges. `update` needs
    ``results["env_return_sum"]`` and ``results["env_episodes"]`` ([num_envs] each).

    A boundary moves at most once per update: once it has moved, the rest of that
    segment's entries for it (measured at the old value) are dropped. Envs with no
    completed episode in the segment contribute nothing, and neither does an episode
    whose trial was drawn under other ranges than the env's current row (the shared
    ranges with its boundary pinned): a trial running when the segment starts counts
    only where every number of that row is unchanged (`TrialInfo.current_ranges`); an
    env kept on a boundary that moved, or on one dimension's boundary while another
    dimension's range moved, is not credited for it. A segment must
    give each env a few trials:
    otherwise the longest, most successful trials never end inside one and are never
    credited; `metarl.experiment.run` refuses fewer than two trials' worth of steps
    per env (`MIN_TRIALS_PER_SEGMENT`).
    Per-element parameters move together: each element by `delta` times its own
    target width.

    Args:
      start: the starting ranges, as a fraction of the target around the defaults
        (`target.scaled(start, around=defaults)` clipped to the target), in (0, 1):
        at 1 no boundary could move (shrinking stops at the starting range).
      delta: one boundary step as a fraction of the target's width (of log-width
        for LogUniform), in (0, 1]; `init` refuses a step below float32's resolution
        at the target's bounds, which would never move one.
      low_threshold: a buffer mean at or below it shrinks the boundary (return units).
      high_threshold: a buffer mean at or above it widens the boundary; > low_threshold.
      buffer_size: entries per boundary before a decision (>= 1).
      boundary_prob: the fraction of envs that evaluate a boundary each segment, in (0, 1]
        (at 0 no boundary is ever evaluated, and the ranges never move).
    """
    who = "ADR"
    start, delta, t_low, t_high, m, p = _check_args(
        who, start, delta, low_threshold, high_threshold, buffer_size, boundary_prob
    )

    def init(
        target: ContextSpace,
        *,
        defaults: Mapping | None = None,
        num_envs: int | None = None,
        key: jax.Array | None = None,
    ) -> ADRState:
        """Starting ranges, empty buffers and the first segment's boundary assignment."""
        target = check_target(target, who)
        _check_dimensions(target)
        _check_resolution(target, delta)
        n = check_count(num_envs, "num_envs (the trainer's number of parallel envs)", f"{who}.init")
        key = _key(key)
        defaults = as_defaults(target, defaults, who)
        current = check_shapes(target, start, defaults, who)
        key, assignment = _assign(key, n, 2 * len(target), p)
        return ADRState(
            segment=np.asarray(0, np.int32),
            target=target,
            defaults=defaults,
            current=current,
            buffers=np.zeros((2 * len(target), m), np.float32),
            counts=np.zeros((2 * len(target),), np.int32),
            key=key,
            assignment=assignment,
        )

    def decide(state: ADRState, results: Mapping[str, Any], where: str) -> _Decisions:
        """Each boundary's entries of the segment recorded into copies of the buffers."""
        check_state(state, ADRState, f"{who}.{where}")
        n = state.assignment.shape[0]
        sums = _per_env(results, "env_return_sum", n)
        episodes = _per_env(results, "env_episodes", n)
        buffers, counts = np.array(state.buffers), np.array(state.counts)
        seen, decided, steps = [], [], []
        for b in range(2 * len(state.target)):
            envs = (state.assignment == b) & (episodes > 0)
            values = sums[envs] / episodes[envs]
            seen.append(values[np.isfinite(values)])
            step, mean = _record(buffers[b], counts, b, values, t_low, t_high)
            decided.append(mean)
            steps.append(step)
        return _Decisions(buffers, counts, seen, decided, steps)

    def update(state: ADRState, results: Mapping[str, Any]) -> ADRState:
        """Needs results "env_return_sum" and "env_episodes" ([num_envs] each)."""
        recorded = decide(state, results, "update")
        n = state.assignment.shape[0]
        names = list(state.target)
        buffers, counts = recorded.buffers, recorded.counts
        bounds = {k: [np.asarray(d.low), np.asarray(d.high)] for k, d in state.current.items()}
        initial = scaled(state.target, start, state.defaults)  # what init started from
        for b, step in enumerate(recorded.steps):
            if step:
                name = names[b // 2]
                _move(state.target[name], initial[name], bounds[name], b % 2, step * delta)
        current = ContextSpace(
            {
                k: dataclasses.replace(d, low=bounds[k][LOW], high=bounds[k][HIGH])
                for k, d in state.current.items()
            }
        )
        key, assignment = _assign(state.key, n, 2 * len(names), p)
        return state.replace(
            segment=np.asarray(int(state.segment) + 1, np.int32),
            current=current,
            buffers=buffers,
            counts=counts,
            key=key,
            assignment=assignment,
        )

    def ranges(state: ADRState) -> PerEnv:
        """Per-env ranges (one row per env): the current ones, the assigned boundary pinned."""
        check_state(state, ADRState, f"{who}.ranges")
        current = state.current
        variants = [current]  # row 0: no boundary; row 1 + b: boundary b pinned
        for name, dist in current.items():
            variants.append(current.pinned({name: dist.low}))
            variants.append(current.pinned({name: dist.high}))
        stacked = jax.tree.map(lambda *x: np.stack(x), *variants)
        rows = np.asarray(state.assignment) + 1
        return PerEnv(jax.tree.map(lambda x: x[rows], stacked))

    def summary(state: ADRState, results: Mapping[str, Any]) -> dict[str, float]:
        """Per boundary ``<name>/low/`` and ``<name>/high/``: ``return``, the mean of the
        segment's entries (one per env evaluating it and completing an episode; NaN
        for none), ``entries``, how many, ``buffer_mean``, the mean of the full buffer
        that decided (NaN: the buffer did not fill), and ``move``, what the boundary
        did: +1 widened, -1 shrunk (the ranges logged for the next segment show where
        to), 0 held (a mean between the thresholds, or a boundary already at the
        target's edge or, shrinking, at the starting range), NaN no decision."""
        decided = decide(state, results, "summary")
        after = update(state, results).current
        out = {}
        for b, name in enumerate(state.target):
            for side, bound in enumerate(("low", "high")):
                seen, mean = decided.seen[2 * b + side], decided.decided[2 * b + side]
                tag = f"{name}/{bound}"
                out[f"{tag}/return"] = (
                    float(seen.astype(np.float64).mean()) if seen.size else np.nan
                )
                out[f"{tag}/entries"] = float(seen.size)
                out[f"{tag}/buffer_mean"] = mean
                change = np.asarray(getattr(after[name], bound), np.float64) - np.asarray(
                    getattr(state.current[name], bound), np.float64
                )
                outward = -change if side == LOW else change  # > 0: widened
                move = 1.0 if np.any(outward > 0) else -1.0 if np.any(outward < 0) else 0.0
                out[f"{tag}/move"] = np.nan if np.isnan(mean) else move
        return out

    params = {
        "name": who,
        "start": start,
        "delta": delta,
        "low_threshold": t_low,
        "high_threshold": t_high,
        "buffer_size": m,
        "boundary_prob": p,
    }
    return Curriculum(init=init, update=update, ranges=ranges, params=params, summary=summary)


class _Decisions(NamedTuple):
    """One update's recording: the buffers and counts after it and, per boundary, the
    segment's finite entries, the mean of the buffer that filled (NaN: none) and its
    move (+1, -1, 0; 0 also where none filled)."""

    buffers: np.ndarray
    counts: np.ndarray
    seen: list[np.ndarray]
    decided: list[float]
    steps: list[int]


def adr_ranges(state: ADRState) -> ContextSpace:
    """The shared current ranges of an ADR state, without pinning (for logging)."""
    check_state(state, ADRState, "adr_ranges")
    return state.current


def _check_dimensions(target: ContextSpace) -> None:
    if not len(target):
        raise ValueError("ADR: the target space is empty; give it Uniform or LogUniform ranges")
    for name, dist in target.items():
        if type(dist) not in (Uniform, LogUniform):
            raise ValueError(
                f"ADR: context {name!r} is a {type(dist).__name__}; ADR moves the bounds of "
                "Uniform (or Scale) and LogUniform ranges only"
            )
        if np.shape(dist.low) != np.shape(dist.high):
            raise ValueError(
                f"ADR: context {name!r} has low of shape {np.shape(dist.low)} and high of shape "
                f"{np.shape(dist.high)}; give both the same shape"
            )


def _check_resolution(target: ContextSpace, delta: float) -> None:
    """A ValueError if a step of delta x an entry's width (log-width for LogUniform)
    is below float32's resolution at the entry's largest bound: bounds are float32,
    so such a step would round away and the boundary never move."""
    for name, dist in target.items():
        low = np.asarray(dist.low, np.float64)
        high = np.asarray(dist.high, np.float64)
        moves = high > low  # a point target has nothing to move
        if isinstance(dist, LogUniform):  # a log step s moves a bound b by b (e^s - 1)
            width = np.log(np.where(moves, high, 1.0)) - np.log(np.where(moves, low, 1.0))
            ulp = np.full_like(width, 2.0**-23)
        else:
            width = high - low
            ulp = np.spacing(np.maximum(np.abs(low), np.abs(high)).astype(np.float32))
        need = np.where(moves, ulp / np.where(moves, width, 1.0), 0.0)
        if delta < need.max():
            raise ValueError(
                f"ADR: delta={delta} moves {name!r}'s bounds by less than float32's resolution "
                f"at them, so no boundary would ever move; give delta >= {need.max():.3g}"
            )


def _key(key: Any) -> jax.Array:
    """A single typed JAX key (legacy uint32 keys are wrapped)."""
    if key is None:
        raise ValueError("ADR.init needs a key (jax.random.key(seed)) to draw boundary assignments")
    if not isinstance(key, jax.Array | np.ndarray):
        raise ValueError(f"ADR.init: key must be a jax.random.key, got {type(key).__name__}")
    if not jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        if key.dtype != np.uint32:
            raise ValueError(f"ADR.init: key must be a jax.random.key, got an array of {key.dtype}")
        key = jax.random.wrap_key_data(jnp.asarray(key))  # a legacy jax.random.PRNGKey
    if key.shape != ():
        raise ValueError(f"ADR.init: key must be a single key, got a batch of shape {key.shape}")
    return key


def _assign(key: jax.Array, n: int, boundaries: int, p: float):
    """(next key, int32 [n] assignment): each env evaluates a uniform boundary w.p. p."""
    key, k_eval, k_which = jax.random.split(key, 3)
    evaluate = np.asarray(jax.random.uniform(k_eval, (n,))) < p
    which = np.asarray(jax.random.randint(k_which, (n,), 0, boundaries))
    assignment = np.where(evaluate, which, -1).astype(np.int32)
    return key, assignment


def _move(target, initial, bounds: list[np.ndarray], side: int, step: float) -> None:
    """Moves bounds[side] outwards by step * target width (inwards if step < 0), in place.

    Log space for LogUniform; the result stays inside the target, never crosses
    the other boundary and never shrinks past the `initial` range (a bound that
    already lies inside it, from a state saved before this rule, stays put).
    """
    log = isinstance(target, LogUniform)
    fwd, inv = (np.log, np.exp) if log else (lambda x: x, lambda x: x)
    t_lo = np.asarray(target.low)
    t_hi = np.asarray(target.high)
    width = fwd(t_hi.astype(np.float64)) - fwd(t_lo.astype(np.float64))
    low, high = bounds
    if side == LOW:
        new = inv(fwd(low.astype(np.float64)) - step * width).astype(np.float32)
        floor = np.maximum(low, np.asarray(initial.low, np.float32))
        bounds[LOW] = np.clip(new, t_lo, np.minimum(high, floor))
    else:
        new = inv(fwd(high.astype(np.float64)) + step * width).astype(np.float32)
        floor = np.minimum(high, np.asarray(initial.high, np.float32))
        bounds[HIGH] = np.clip(new, np.maximum(low, floor), t_hi)


def _per_env(results: Mapping[str, Any], key: str, n: int) -> np.ndarray:
    x = np.asarray(require(results, key, "ADR.update"), np.float64)
    if x.shape != (n,):
        raise ValueError(
            f"ADR.update: results[{key!r}] must have one entry per env, shape (num_envs,) = "
            f"({n},); got shape {x.shape}"
        )
    return x


def _check_args(who, start, delta, low_threshold, high_threshold, buffer_size, boundary_prob):
    """Validated (start, delta, low and high thresholds, buffer size, boundary_prob) of ADR."""
    start = check_start(start, who)
    if start == 1:
        raise ValueError(
            f"{who}: start=1 begins at the target, where no boundary can widen, and shrinking "
            "stops at the starting range, so the ranges would never move; give start in (0, 1), "
            "or train on the target without a curriculum for fixed ranges"
        )
    delta = check_real(delta, "delta", who)
    if not 0 < delta <= 1:
        raise ValueError(
            f"{who}: delta must be a fraction of the target width in (0, 1], got {delta}"
        )
    t_low = check_real(low_threshold, "low_threshold", who)
    t_high = check_real(high_threshold, "high_threshold", who)
    if not t_low < t_high:
        raise ValueError(
            f"{who}: the thresholds are in the wrong order: low_threshold ({t_low}) must be < "
            f"high_threshold ({t_high})"
        )
    m = check_count(buffer_size, "buffer_size", who)
    p = check_real(boundary_prob, "boundary_prob", who)
    if not 0 < p <= 1:
        raise ValueError(
            f"{who}: boundary_prob must be a probability in (0, 1], got {p} (at 0 no env "
            "evaluates a boundary and the ranges never move)"
        )
    return start, delta, t_low, t_high, m, p


def _record(buffer, counts, b, values, t_low, t_high) -> tuple[int, float]:
    """Appends boundary b's finite `values` to its buffer (in place); when the buffer
    fills, empties it and decides +1 (widen: mean >= t_high), -1 (shrink: <= t_low) or
    0. After a move the rest of the values (measured at the old value) are dropped.
    Returns (the move, the mean of the last buffer that filled, NaN if none did)."""
    m = buffer.shape[0]
    decided = np.nan
    for value in values[np.isfinite(values)]:
        buffer[counts[b]] = value
        counts[b] += 1
        if counts[b] < m:
            continue
        # in float32, as the returns are (PerformanceGated's gate too): a mean on a
        # threshold of 0.7 read 0.699999988 against the float64 0.7 and held
        decided = float(np.float32(buffer.astype(np.float64).mean()))
        buffer[:], counts[b] = 0.0, 0
        high, low = float(np.float32(t_high)), float(np.float32(t_low))
        step = 1 if decided >= high else -1 if decided <= low else 0
        if step:
            return step, decided
    return 0, decided
