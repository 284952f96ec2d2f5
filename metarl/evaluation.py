"""Held-out evaluation: context sets, a compiled evaluator, summary figures.

Context sets pin every context name to one value per evaluation context
(`ContextSpace.pinned`), so evaluation runs the training env itself with new
ranges: no new env, no recompilation between segments. Splits, following the
evaluation modes of Kirk et al. 2023 ("A Survey of Zero-shot Generalisation in
Deep RL") that apply to continuous context spaces:

* ``train`` (in-distribution): contexts drawn from the training ranges.
* ``interpolation``: inside the training intervals but off the training
  support where that support is discrete (midpoints between `Choice` values;
  for a relative `Choice`, not between scales of opposite sign, whose midpoint
  is a scale near 0: the quantity switched off, not a value between two
  trained ones). A continuous range is drawn afresh at every reset, so every
  value inside it is trained on: for a `Uniform` or `LogUniform` range shared
  by its elements, ``interpolation`` is a second sample of the training
  distribution (uniform over the interval, in log space for `LogUniform`),
  and its gap to ``train`` estimates zero: read it as the noise floor of the
  gaps.
* ``extrapolation``: every dimension outside its training interval, within
  `factor` times the interval about its centre (1.5: a quarter of the interval
  more on each side, gravity 5-15 gives 2.5-5 and 15-17.5; for `LogUniform`, in
  log space: [0.5, 2] becomes [0.35, 2.83]),
  on the physically valid side: above the quantity's lower limit (mass > 0),
  and, for a quantity of either sign whose training interval does not contain
  zero (a motor's gear, absolute or a scale), on the same side of zero as that
  interval (a context across zero, a reversed motor, is another task, not
  farther along this one). A dimension that does not
  vary in training (`Fixed`, or an interval of zero width) keeps its value in
  every split. A task parameter the env reads as an integer or a flag is held
  out only on the values its `Choice` declares with probability 0 (between the
  trained ones, or below / above them), else drawn as in training: any other
  value would be read rounded, a trained value under a held-out name. A
  periodic task parameter (an angle: the env declares
  ``task_periods = {name: period}``) is taken outside its interval modulo
  the period, across zero too, at most halfway round to the other side; one whose interval
  spans the whole period has no outside, and is drawn from its interval.
  ``extrapolation_low`` and ``extrapolation_high`` take every dimension below
  (above) its interval: reported per side, because one side is often easier
  than the other (less gravity, more motor) and a mixed split hides which way
  a policy fails.
* ``grid``: a regular grid over one or two names (others at their centre,
  geometric for `LogUniform`, per element for per-element intervals, and for a
  `Choice` the trained value nearest it), for heatmaps.

A `Normal` range is taken as its mean +- 2 std (`ContextSpace.intervals`), a
`TruncatedNormal` as the same clipped to its bounds (whose width may be many
std: they bound the draws, they are not where the draws lie): training draws
fall beyond that at most 4.6% of the time, so its extrapolation splits (2-3 std
out at factor 1.5) are rare in training, not unseen, and its interpolation
split is uniform over +- 2 std.

A per-element quantity (``per_element=True``) gets one value per element in
every split but ``grid``, each drawn on its own as training draws it (elements
of one context may lie on different sides in ``extrapolation``); give the
builders the env (``env=``) so that they know how many elements a range shared
by its elements covers. ``grid`` moves all elements of a name together.
Each context runs `episodes` episodes with the deterministic policy: parallel
envs each run one trial (the recurrent carry starts fresh per trial), so
`episodes` is a whole number of trials (a multiple of the env's
``episodes_per_trial``), each episode of a trial counted alike.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import numbers
import warnings
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from metarl.contexts import Choice, ContextSpace, Fixed, LogUniform
from metarl.envs import TRIAL, ContextualEnv

SIDES = ("both", "low", "high")


class NoHeldOutValuesError(ValueError):
    """A split has no valid values for some name (nothing between a `Choice`'s
    values, no physical value beyond a range): the run leaves that split out."""


@dataclasses.dataclass(frozen=True)
class ContextSet:
    """`values[name]`: [C] values, one per evaluation context, for split `split`."""

    split: str
    values: dict[str, np.ndarray]

    def __post_init__(self):
        lengths = {n: np.shape(v)[0] if np.ndim(v) else None for n, v in self.values.items()}
        if len(set(lengths.values())) > 1 or None in lengths.values():
            raise ValueError(
                f"context set {self.split!r}: every name needs one value per context, "
                f"[C, ...] with the same C; got lengths {lengths} (None: not an array)"
            )

    def __len__(self) -> int:
        # An empty space has one context: the env's own physics.
        return len(next(iter(self.values.values()))) if self.values else 1


def _element_bounds(space: ContextSpace) -> dict[str, tuple[Any, Any]]:
    """Each name's training interval: two floats when its elements share one interval,
    else the per-element (low, high) arrays, so that every element's value is placed
    against its own interval (the union of unequal intervals is none of them)."""
    out = {}
    for name, (lo, hi) in space.intervals().items():
        # one bound may be one number and the other one per element (Scale(0.5, [1, 4])):
        # the elements' intervals are still their own
        lo, hi = np.broadcast_arrays(np.asarray(lo, np.float64), np.asarray(hi, np.float64))
        shared = lo.size == 1 or (np.ptp(lo) == 0 and np.ptp(hi) == 0)
        out[name] = (float(np.min(lo)), float(np.max(hi))) if shared else (lo, hi)
    return out


def _draw_shapes(env: ContextualEnv) -> dict[str, tuple[int, ...]]:
    """Each context name's shape as training draws it: () for one draw, else one per element."""
    return {e.name: e.draw_shape for e in env.binding.entries}


def _shape(space: ContextSpace, name: str, env: ContextualEnv | None) -> tuple[int, ...]:
    """The shape of one context's value of `name`, as training draws it: one value per
    element for a per-element entry (the env's binding knows how many elements a range
    shared by them covers), else one value (or the parameters' own shape)."""
    if env is not None and name in (shapes := _draw_shapes(env)):
        return shapes[name]
    dist = space[name]
    # a Choice's parameters are lists over its values, not over elements
    shape = (
        ()
        if isinstance(dist, Choice)
        else np.broadcast_shapes(*map(np.shape, jax.tree.leaves(dist)))
    )
    if env is None and dist.per_element and not shape:
        # one number per context would pin every element alike, where training draws
        # each element on its own: the split would not be the training distribution
        raise ValueError(
            f"context {name!r} is per element with one range for all elements: pass env= "
            "(the env knows how many elements it covers) to draw one value per element"
        )
    return shape


def _count(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{what} must be an integer >= 1, got {value!r}")
    return int(value)


def in_distribution(
    space: ContextSpace, num: int, seed: int = 0, env: ContextualEnv | None = None
) -> ContextSet:
    """`num` contexts drawn from the training ranges themselves (with `env`: one
    value per element of a per-element entry, as training draws them)."""
    num = _count(num, "in_distribution: num")
    keys = jax.random.split(jax.random.key(seed), len(space))
    values = {}
    for (name, dist), k in zip(space.items(), keys):
        shape = _shape(space, name, env)
        values[name] = np.asarray(dist.sample(k, (num,) + shape), np.float32)
    return ContextSet("train", values)


def interpolation(
    space: ContextSpace, num: int, seed: int = 1, env: ContextualEnv | None = None
) -> ContextSet:
    """`num` contexts inside the training intervals, off any discrete training support
    (with `env`: one value per element of a per-element entry)."""
    num = _count(num, "interpolation: num")
    rng = np.random.default_rng(seed)
    values = {}
    for name, dist in space.items():
        shape = (num,) + _shape(space, name, env)
        if env is not None and env.binding.discrete_kind(name) is not None:
            values[name] = _whole_values(dist, "between", shape, rng)
        elif isinstance(dist, Choice):
            support = _trained_values(dist)
            if len(support) == 1:  # not varied in training: kept at its value
                values[name] = np.full(num, support[0], np.float32)
                continue
            mids = choice_midpoints(dist)
            if not mids:
                raise NoHeldOutValuesError(
                    f"interpolation: nothing lies between the values of {name!r}"
                    + (" without crossing a scale of 0" if len(support) > 1 else "")
                )
            values[name] = rng.choice(np.asarray(mids), shape).astype(np.float32)
        else:  # each element in its own interval
            to, back = _scale(dist)
            bounds = _element_bounds(ContextSpace({name: dist}))[name]
            lo, hi = map(to, bounds)
            u = rng.uniform(0.0, 1.0, shape)
            values[name] = _kept(back(lo + u * (hi - lo)), *bounds).astype(np.float32)
    return ContextSet("interpolation", values)


def _trained_values(dist: Choice) -> np.ndarray:
    """The values a `Choice` draws (probability > 0), sorted, without repeats."""
    return np.unique(dist._drawn())


def choice_midpoints(dist: Choice) -> list[float]:
    """The values between a `Choice`'s trained ones that `interpolation` takes: each
    midpoint of two neighbours, except, for a relative Choice, between scales of
    opposite sign (their midpoint, a scale near 0, switches the quantity off)."""
    support = _trained_values(dist)
    pairs = zip(support[:-1], support[1:], strict=True)
    return [(a + b) / 2 for a, b in pairs if not (dist.relative and a < 0 < b)]


def whole_axis(dist) -> np.ndarray:
    """The values an integer or flag task parameter can be evaluated at: those its
    `Choice` declares (trained or of probability 0), or its `Fixed` value."""
    return np.unique(np.asarray(dist.values if isinstance(dist, Choice) else dist.value))


def _whole_values(dist, where: str, shape: tuple[int, ...], rng) -> np.ndarray:
    """`shape` held-out values of an integer or flag task parameter (`dist`: an absolute
    `Choice` or `Fixed` of whole values, as binding checks). Only the values its Choice
    declares with probability 0 are held out: those between its trained values
    (`where` "between"), below or above them ("low", "high"; "both": either side). A
    value the env does not declare (an index between two, a flag of 0.5) would be
    rounded back to a trained one as it is read, a training context under a held-out
    name; so where the Choice declares none, the split draws it as training does."""
    declared = whole_axis(dist)
    trained = _trained_values(dist) if isinstance(dist, Choice) else declared
    untried = np.setdiff1d(declared, trained)
    lo, hi = trained[0], trained[-1]
    held_out = untried[
        {
            "between": (untried > lo) & (untried < hi),
            "low": untried < lo,
            "high": untried > hi,
            "both": (untried < lo) | (untried > hi),
        }[where]
    ]
    if len(held_out):
        return rng.choice(held_out, shape).astype(np.float32)
    if not isinstance(dist, Choice):
        return np.full(shape, trained[0], np.float32)
    values, probs = np.asarray(dist.values), np.asarray(dist.probs, np.float64)
    return rng.choice(values, shape, p=probs / probs.sum()).astype(np.float32)


def _scale(dist) -> tuple[Any, Any]:
    """(to, back): the coordinates held-out values are placed in: log for `LogUniform`
    (its training draws are uniform there; `LogUniform.visible`, which takes 0, the
    point ``space.pinned`` gives a default of 0, at float32's smallest normal value:
    `np.log` made it -inf, and every held-out value NaN), the values themselves
    otherwise. `_kept` restores the exact value of an element not varied."""
    if isinstance(dist, LogUniform):
        return dist.visible, np.exp
    return (lambda x: x), (lambda x: x)


def _kept(values, lo, hi):
    """`values` where the training interval [lo, hi] (its own units, per element where
    arrays) is a point, that point: an element not varied in training keeps its value
    in every split, exactly (`_scale`'s log and back can move it)."""
    lo, hi = np.asarray(lo), np.asarray(hi)
    return np.where(lo == hi, lo, values)


def periods(env: ContextualEnv) -> Mapping[str, float]:
    """The env's periodic task parameters (angles), ``{name: period}``; {} if none."""
    return getattr(env.unwrapped, "task_periods", None) or {}


def clip_physical(env: ContextualEnv, name: str, dist, lo, hi, values, margin):
    """`values` of `name` (in `_scale` coordinates; `lo`, `hi`: its training interval
    there, per element where they are arrays) kept `margin` inside what is physical:
    the quantity's lower limit (mass > 0, ...), and, for an interval that does not
    contain zero, the same side of zero (absolute or relative: a gear of 2-20 or of
    x0.2-2 stays positive, of -20..-2 negative): a context across zero (a reversed
    motor) is another task, not farther along this one. A `LogUniform`'s log space
    has no bound, and neither has a periodic task parameter: zero is just another
    angle (`outside` keeps it within half a turn)."""
    if isinstance(dist, LogUniform) or name in periods(env):
        return values
    lower = env.binding.lower_limit(name)
    floor = np.where(np.asarray(lo) > 0, 0.0, -np.inf)  # a positive interval stays positive
    if lower is not None:
        floor = np.maximum(floor, lower)
    values = np.maximum(values, floor + margin)
    return np.where(np.asarray(hi) < 0, np.minimum(values, -margin), values)  # negative stays


def outside(env: ContextualEnv, name: str, dist, lo, hi, factor: float, margin):
    """(outer_lo, outer_hi): `factor` x the training interval [lo, hi] about its centre
    (`_scale` coordinates, per element where they are arrays), kept physical
    (`clip_physical`); for a periodic task parameter at most halfway round the rest
    of the turn on either side (farther would come back toward the interval)."""
    centre, half = (lo + hi) / 2, (hi - lo) / 2
    outer_lo, outer_hi = centre - factor * half, centre + factor * half
    if name in (turns := periods(env)):
        rest = float(turns[name]) - (hi - lo)
        outer_lo = np.maximum(outer_lo, lo - rest / 2)
        outer_hi = np.minimum(outer_hi, hi + rest / 2)
    return tuple(clip_physical(env, name, dist, lo, hi, v, margin) for v in (outer_lo, outer_hi))


def extrapolation(
    env: ContextualEnv,
    space: ContextSpace,
    num: int,
    factor: float = 1.5,
    seed: int = 2,
    side: str = "both",
) -> ContextSet:
    """`num` contexts with every dimension outside its training interval.

    Values lie within `factor` x the interval about its centre (per element, for
    per-element intervals that differ); a side that
    would be non-physical for the quantity (mass <= 0, ...) is not used. Every
    element of a per-element entry is a dimension of its own.
    `side`: "both" (each dimension picks a side at random; split name
    ``extrapolation``), "low" or "high" (every dimension below / above its
    interval; split ``extrapolation_low`` / ``extrapolation_high``).
    """
    if not math.isfinite(factor) or factor <= 1:
        raise ValueError(f"extrapolation needs a finite factor > 1, got {factor}")
    if side not in SIDES:
        raise ValueError(f"extrapolation: side must be one of {SIDES}, got {side!r}")
    num = _count(num, "extrapolation: num")
    rng = np.random.default_rng(seed)
    turns = periods(env)
    values = {}
    for name, bounds in _element_bounds(space).items():
        dist = space[name]
        lo, hi = bounds
        if env.binding.discrete_kind(name) is not None:
            values[name] = _whole_values(dist, side, (num,) + _shape(space, name, env), rng)
            continue
        to, back = _scale(dist)
        lo, hi = to(lo), to(hi)
        fixed = lo == hi  # not varied in training: kept at its value
        outer_lo, outer_hi = outside(env, name, dist, lo, hi, factor, 1e-3 * (hi - lo) / 2)
        sides = {"low": (outer_lo, lo), "high": (hi, outer_hi)}
        if name in turns and np.all(turns[name] - (hi - lo) <= 1e-3 * float(turns[name])):
            sides = {"low": (lo, hi), "high": (lo, hi)}  # the whole turn: no outside
        chosen = list(sides) if side == "both" else [side]
        elements = _shape(space, name, env)
        # [side, *elements]: whether each element has room on each side of its own interval
        room = np.stack(
            [np.broadcast_to((sides[k][1] > sides[k][0]) | fixed, elements) for k in chosen]
        )
        if not np.all(room.any(axis=0)):
            where = "outside" if side == "both" else side + " of"
            blocked = np.argwhere(~room.any(axis=0)).tolist()
            which = f" (elements {blocked}, by index)" if elements else ""
            raise NoHeldOutValuesError(
                f"extrapolation: no valid values {where} the training range of {name!r}{which}"
            )
        # each element on a side of its own interval, drawn on its own as in training; an
        # element with room on one side only takes that side (until 2026-12-07 one element
        # at a physical limit took that side from every element)
        chosen = [k for k, r in zip(chosen, room, strict=True) if r.any()]
        room = room[room.reshape(len(room), -1).any(axis=1)]
        shape = (num,) + elements
        ends = [[np.broadcast_to(sides[k][j], shape) for k in chosen] for j in (0, 1)]
        if room.all():
            pick = rng.integers(0, len(chosen), shape)
        else:  # the n-th of each element's own usable sides
            nth = rng.integers(0, np.broadcast_to(room.sum(axis=0), shape))
            rank = np.cumsum(room, axis=0) - 1
            pick = np.argmax(room[:, None] & (rank[:, None] == nth), axis=0)
        start, end = (np.choose(pick, e) for e in ends)
        drawn = back(start + rng.uniform(0.0, 1.0, shape) * (end - start))
        values[name] = _kept(drawn, *bounds).astype(np.float32)
    return ContextSet("extrapolation" if side == "both" else f"extrapolation_{side}", values)


def grid(space: ContextSpace, axes: Mapping[str, Any]) -> ContextSet:
    """A grid over one or two names (`axes`: name -> values); others at their centre."""
    if not 1 <= len(axes) <= 2 or set(axes) - set(space):
        raise ValueError(f"grid needs one or two of {list(space)}, got {list(axes)}")
    points = list(itertools.product(*[np.asarray(v, np.float32) for v in axes.values()]))
    values = {
        n: np.broadcast_to(_centre(space[n], lo, hi), (len(points),) + np.shape(lo))
        for n, (lo, hi) in _element_bounds(space).items()
    }
    for i, name in enumerate(axes):
        values[name] = np.asarray([p[i] for p in points], np.float32)
    return ContextSet("grid", {n: np.asarray(v, np.float32) for n, v in values.items()})


def _centre(dist, lo, hi) -> Any:
    """The middle of a training interval (each element's own, for per-element
    intervals) in the coordinates its draws are uniform in (geometric for a
    `LogUniform`); for a `Choice`, the trained value nearest it (the middle of
    a relative Choice([-1, 1]) would switch the quantity off)."""
    to, back = _scale(dist)
    middle = _kept(back((to(np.asarray(lo)) + to(np.asarray(hi))) / 2), lo, hi)
    if isinstance(dist, Choice):
        trained = _trained_values(dist)[::-1]  # a tie goes to the larger value
        return trained[np.argmin(np.abs(trained - middle))]
    return middle


@dataclasses.dataclass(frozen=True)
class EvalResult:
    """Per-context returns of one context set."""

    contexts: ContextSet
    returns: np.ndarray  # [C, episodes] episode returns
    mean: np.ndarray  # [C]
    std: np.ndarray  # [C]
    by_episode: np.ndarray  # [C, episodes_per_trial]: mean return of the i-th episode of a trial
    # [C, episodes] bool: the episode was cut because its physics went non-finite (NaN or
    # inf); its return is what it earned until then, counted in `mean` like any other
    # early end, and reported (eval/<split>/nonfinite_episodes) so that a return made
    # from a simulator's failure is seen as one
    nonfinite: np.ndarray


# Chunk i > 0 of a large set hangs off this tag of the set's key: ``fold_in(key, i)``
# is ``split(key, n)[i]``, the reset key of env i of chunk 0, which that reset splits
# and draws from in turn (a key is drawn from or split, never both).
_CHUNKS = 0x63686E6B


def _chunk_key(key: jax.Array, i: int) -> jax.Array:
    """The key of chunk i of a set larger than the evaluator (`Evaluator.evaluate`):
    `key` itself for the first chunk (as a set that fits), then a stream no split of
    `key` reaches."""
    return key if i == 0 else jax.random.fold_in(jax.random.fold_in(key, _CHUNKS), i)


class Evaluator:
    """Runs context sets with a policy; one compilation for every set and segment.

    Sets are padded to `max_contexts`, so sets of any size up to it share the
    compiled function (a larger set runs in chunks of `max_contexts`); policies
    from the same TrainSpace share it too. `episodes`
    per context is a multiple of the env's ``episodes_per_trial`` (k): whole
    trials are run and all their episodes counted, so that no episode of a trial
    weighs more in the mean than another (a part trial would count its first
    episodes, where an adapting agent knows least, more often than its later ones).
    """

    def __init__(self, env: ContextualEnv, episodes: int = 4, max_contexts: int = 32):
        episodes = _count(episodes, "Evaluator: episodes")
        max_contexts = _count(max_contexts, "Evaluator: max_contexts")
        k = env.episodes_per_trial
        if episodes % k:
            raise ValueError(
                f"evaluation episodes={episodes} (eval.episodes in an experiment) is not a "
                f"multiple of the env's episodes_per_trial={k}: whole trials of {k} episodes "
                f"are run and every episode counted alike; choose {k}, {2 * k}, {3 * k}, ..."
            )
        self.env = env
        self.episodes = episodes
        self.max_contexts = max_contexts
        self.trials = episodes // k
        self._run = jax.jit(self._rollout)
        self._elements = {n: shape for n, shape in _draw_shapes(env).items() if shape}

    def _point(self, values: Mapping[str, Any]) -> ContextSpace:
        """Ranges that draw exactly `values`: a shared entry pinned
        (`ContextSpace.pinned`, same kind and shapes), a per-element one as `Fixed`
        at one value per element. Its training range may be one range for all
        elements, which can pin only one number; training draws every element on its
        own, so evaluation sets each element's value. Always the same structure: one
        compilation for every set."""
        out = dict(
            self.env.space.pinned({n: v for n, v in values.items() if n not in self._elements})
        )
        for name, shape in self._elements.items():
            value = np.asarray(values[name], np.float32)
            if value.shape not in ((), shape):
                raise ValueError(
                    f"context {name!r}: a value of shape {value.shape}; this per-element entry "
                    f"takes one number or one per element, shape {shape}"
                )
            trained = self.env.space[name]  # its flags: a value means what a draw means
            out[name] = Fixed(
                np.broadcast_to(value, shape).copy(),
                relative=trained.relative,
                per_element=trained.per_element,
            )
        return ContextSpace(out)

    def _rollout(self, policy, ranges, key):
        env, k = self.env, self.env.episodes_per_trial
        n = self.max_contexts * self.trials
        reset = functools.partial(env.reset, checked=True)  # `ranges` checked them
        state = jax.vmap(reset)(jax.random.split(key, n), ranges)
        carry = policy.init_carry(n)
        returns = jnp.full((n, k), jnp.nan, jnp.float32)
        nonfinite = jnp.zeros((n, k), bool)

        def cond(c):
            t, _, _, _, _, active = c
            return (t < k * env.episode_length) & jnp.any(active)

        def body(c):
            t, state, carry, returns, nonfinite, active = c
            action, carry = policy(state.obs, carry)
            state = jax.vmap(env.step)(state, action)
            carry = policy.observe(carry, action, state)
            trial = state.info[TRIAL]
            ended = (state.done > 0) & active
            slot = jax.nn.one_hot(trial.episode - 1 + k * trial.new_trial.astype(jnp.int32), k) > 0
            returns = jnp.where(ended[:, None] & slot, trial.episode_return[:, None], returns)
            cut = (ended & (trial.nonfinite > 0))[:, None] & slot
            nonfinite = nonfinite | cut
            return t + 1, state, carry, returns, nonfinite, active & (trial.new_trial == 0)

        init = (jnp.int32(0), state, carry, returns, nonfinite, jnp.ones((n,), bool))
        return jax.lax.while_loop(cond, body, init)[3:5]

    def ranges(self, contexts: ContextSet) -> tuple[ContextSpace, int]:
        """(ranges, C): per-env ranges [max_contexts * trials] that run context i of
        `contexts` in envs i * trials .. (i + 1) * trials - 1 (contexts past C repeat
        the last one), checked against the env's space and physical limits.

        `contexts` gives every name of the env's space a value (a name left out would
        be drawn from the training range, not held out) and no other name."""
        names = list(self.env.space)
        missing = [n for n in names if n not in contexts.values]
        unknown = [n for n in contexts.values if n not in self.env.space]
        if missing or unknown:
            raise ValueError(
                f"context set {contexts.split!r} must give a value to every name of the "
                f"env's space {names} and no other: missing {missing}, unknown {unknown}"
            )
        for name in names:
            values = np.asarray(contexts.values[name], np.float64)
            if not np.isfinite(values).all():
                i = int(np.argwhere(~np.isfinite(values))[0][0])
                raise ValueError(
                    f"context set {contexts.split!r}: context {name!r} is {values[i]} in its "
                    f"context {i}; a held-out value must be a finite number"
                )
            self.env.binding.check_task_values(
                name, contexts.values[name], f"context set {contexts.split!r}"
            )
        c = len(contexts)
        if not 1 <= c <= self.max_contexts:
            raise ValueError(f"a context set must hold 1..{self.max_contexts} contexts, got {c}")
        idx = np.minimum(np.arange(self.max_contexts), c - 1)
        spaces = [self._point({n: v[i] for n, v in contexts.values.items()}) for i in idx]
        points = jax.tree.map(lambda *x: np.stack(x), *spaces)
        try:  # the physical limits training's ranges are held to (mass > 0, ...)
            self.env.binding.check_limits(points, (self.max_contexts,))
        except ValueError as e:
            raise ValueError(f"context set {contexts.split!r}: {e}") from None
        ranges = jax.tree.map(lambda x: np.repeat(x, self.trials, axis=0), points)
        return ranges, c

    def evaluate(self, policy, contexts: ContextSet, key: jax.Array) -> EvalResult:
        """Mean and std of episode returns per context (deterministic for a fixed key);
        `contexts` as `ranges` takes them, any number of them: a set of more than
        `max_contexts` runs in chunks of `max_contexts` in the same compiled program,
        chunk i with `_chunk_key(key, i)` (the first with `key`, as a set that fits)."""
        if len(contexts) > self.max_contexts:
            if getattr(policy, "rows_are_envs", False):  # a steered policy (metarl.probe)
                raise ValueError(
                    f"evaluate: {type(policy).__name__} holds a row per env of one batch of "
                    f"at most {self.max_contexts} contexts; a set of {len(contexts)} runs in "
                    "chunks, each of which would reuse the first rows: split the set"
                )
            chunks = [
                self.evaluate(
                    policy,
                    ContextSet(
                        contexts.split,
                        {n: v[i : i + self.max_contexts] for n, v in contexts.values.items()},
                    ),
                    _chunk_key(key, i // self.max_contexts),
                )
                for i in range(0, len(contexts), self.max_contexts)
            ]
            return EvalResult(
                contexts=contexts,
                **{
                    f.name: np.concatenate([getattr(r, f.name) for r in chunks])
                    for f in dataclasses.fields(EvalResult)
                    if f.name != "contexts"
                },
            )
        ranges, c = self.ranges(contexts)
        raw, cut = map(np.asarray, self._run(policy, ranges, key))  # [contexts * trials, k]
        per_context = raw.reshape(self.max_contexts, -1)[:c]  # [c, trials * k = episodes]
        per_trial = raw.reshape(self.max_contexts, self.trials, -1)[:c]
        # an episode slot no trial reached stays NaN; a context with none is NaN, unwarned
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return EvalResult(
                contexts=contexts,
                returns=per_context,
                mean=np.nanmean(per_context, axis=1),
                std=np.nanstd(per_context, axis=1),
                by_episode=np.nanmean(per_trial, axis=1),
                nonfinite=cut.reshape(self.max_contexts, -1)[:c],
            )


def summarize(results: Mapping[str, EvalResult]) -> dict[str, float]:
    """Mean return per split and the generalization gaps.

    ``generalization_gap`` = train - the WORSE of ``extrapolation_low`` and
    ``extrapolation_high`` (or of ``extrapolation`` where the sides are not
    evaluated): how much return is lost on the harder side of the training
    ranges. ``interpolation_gap`` = train - interpolation (where those splits exist).
    """
    with warnings.catch_warnings():  # a split with no finished episode is NaN, unwarned
        warnings.simplefilter("ignore", RuntimeWarning)
        out = {split: float(np.nanmean(r.mean)) for split, r in results.items()}
    sides = [out[k] for k in ("extrapolation_low", "extrapolation_high") if k in out]
    if not sides and "extrapolation" in out:
        sides = [out["extrapolation"]]
    if "train" in out and sides:
        # np.min: a NaN side (no episode ended there) makes the gap NaN whatever its
        # place; min() kept or dropped it by the order of the two sides
        out["generalization_gap"] = out["train"] - float(np.min(sides))
    if "train" in out and "interpolation" in out:
        out["interpolation_gap"] = out["train"] - out["interpolation"]
    return out
