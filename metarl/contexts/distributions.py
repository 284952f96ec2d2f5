"""Distributions over one context quantity.

A distribution is a frozen dataclass and a JAX pytree: its numeric parameters
(bounds, means, values, ...) are float32 array leaves, its flags (`relative`,
`per_element`) are static. Replacing the numbers keeps the tree structure, so
a jitted function that takes a distribution as an argument does not recompile
when a curriculum moves the ranges.

Flags shared by every distribution:

* ``relative=False``: values are absolute (``mass=2.0`` means 2 kg). With
  ``relative=True`` a value is a scale factor applied to the environment's
  default (``mass=1.2`` means 20% heavier than loaded).
* ``per_element=False``: one value is drawn and shared by every element of the
  quantity (every body, geom, dof, ...). With ``per_element=True`` each element
  gets its own draw; the numeric parameters may then be scalars or arrays with
  one entry per element.

Validation of the numbers happens when a distribution is built from concrete
values; JAX's own tree rebuilding (inside jit or vmap) skips it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "Distribution",
    "Uniform",
    "LogUniform",
    "Normal",
    "TruncatedNormal",
    "Choice",
    "Fixed",
    "Scale",
]


def _is_concrete(x: Any) -> bool:
    if isinstance(x, jax.core.Tracer):
        return False
    if isinstance(x, (jax.Array, np.ndarray, np.generic, int, float)):
        return True
    if isinstance(x, (list, tuple)):
        return all(_is_concrete(v) for v in x)
    return False


def _as_float32(x: Any) -> Any:
    """Numbers become float32 NumPy arrays (never weak-typed Python floats, and the
    same text in a run record whether they were given as NumPy or JAX numbers)."""
    return np.asarray(x, dtype=np.float32)


@dataclasses.dataclass(frozen=True, eq=False)
class Distribution:
    """Base class: numeric fields are pytree leaves, flags are static."""

    _numeric: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        jax.tree_util.register_pytree_with_keys(
            cls, cls._flatten_with_keys, cls._unflatten, cls._flatten
        )

    # -- equality: same kind, flags and numbers (arrays compared whole, NaN == NaN) --
    def __eq__(self, other: Any) -> bool:
        if type(other) is not type(self) or other._static() != self._static():
            return False
        mine, theirs = self.numbers(), other.numbers()
        return all(
            mine[f].shape == theirs[f].shape and np.array_equal(mine[f], theirs[f], equal_nan=True)
            for f in self._numeric
        )

    def __hash__(self) -> int:
        numbers = self.numbers()
        return hash((type(self), self._static(), *(numbers[f].tobytes() for f in self._numeric)))

    # -- pytree protocol (unflatten bypasses __init__ and validation) --
    def _flatten(self):
        return [getattr(self, f) for f in self._numeric], self._static()

    def _flatten_with_keys(self):
        children = [(jax.tree_util.GetAttrKey(f), getattr(self, f)) for f in self._numeric]
        return children, self._static()

    def _static(self) -> tuple:
        return (self.relative, self.per_element)

    @classmethod
    def _unflatten(cls, static, children):
        obj = object.__new__(cls)
        for name, value in zip(cls._numeric, children):
            object.__setattr__(obj, name, value)
        object.__setattr__(obj, "relative", static[0])
        object.__setattr__(obj, "per_element", static[1])
        return obj

    def __post_init__(self):
        if not isinstance(self.relative, bool) or not isinstance(self.per_element, bool):
            raise ValueError(
                f"{type(self).__name__}: relative and per_element must be True or False, "
                f"got relative={self.relative!r}, per_element={self.per_element!r}"
            )
        values = [getattr(self, f) for f in self._numeric]
        if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(values)):
            return  # built inside jit/vmap: validated where the numbers are concrete
        if not all(_is_concrete(v) for v in values):
            raise ValueError(
                f"{type(self).__name__} needs numbers or arrays for {', '.join(self._numeric)}; "
                f"got {values!r}"
            )
        for name in self._numeric:
            object.__setattr__(self, name, _as_float32(getattr(self, name)))
        self.validate()

    def validate(self, defaults_pin: bool = False) -> None:
        """The construction checks (finite numbers, shapes that broadcast, the
        distribution's own rules such as low <= high), on the current numbers.

        Ranges that JAX rebuilds (``jax.tree.map`` over a space, as a curriculum
        does) skip ``__init__``; `Binding.check_ranges` calls this so that they get
        the same checks and messages. Traced numbers are skipped: they are
        checked where they are concrete. `defaults_pin`: accept the NaN locations
        of `pin_to_defaults` (only the spreads are checked then).
        """
        values = {f: getattr(self, f) for f in self._numeric}
        if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(list(values.values()))):
            return
        if defaults_pin and self.pinned_to_defaults():
            values = {f: v for f, v in values.items() if f in _SPREADS}
        for name, value in values.items():
            value = np.asarray(value, np.float32)
            if not np.all(np.isfinite(value)):
                raise ValueError(f"{type(self).__name__}.{name} must be finite, got {value}")
        if len(values) < len(self._numeric):
            return
        if not isinstance(self, Choice):
            shapes = {f: np.shape(v) for f, v in values.items()}
            try:
                np.broadcast_shapes(*shapes.values())
            except ValueError:
                raise ValueError(
                    f"{type(self).__name__}: parameter shapes {shapes} do not broadcast together; "
                    "give scalars or arrays of one shape (one value per element)"
                ) from None
        self._check()

    def pinned_to_defaults(self) -> bool:
        """Whether this is `pin_to_defaults`'s form: every location parameter NaN."""
        locations = [np.asarray(getattr(self, f)) for f in self._numeric if f not in _SPREADS]
        return bool(locations) and all(x.size and np.all(np.isnan(x)) for x in locations)

    # -- to implement per distribution --
    def _check(self) -> None:
        """Raises ValueError on inconsistent concrete parameters."""

    def sample(self, key: jax.Array, shape: tuple[int, ...] = ()) -> jax.Array:
        """Draws values of the given shape; pure, usable under jit and vmap."""
        raise NotImplementedError

    def support(self) -> tuple[np.ndarray, np.ndarray]:
        """Smallest and largest value a draw can take (may be infinite)."""
        raise NotImplementedError

    def centre(self) -> np.ndarray:
        """The middle of the distribution, used by `scaled`."""
        raise NotImplementedError

    def _rescaled(self, f: float, c: Any) -> Distribution:
        raise NotImplementedError

    def normaliser(self) -> tuple[np.ndarray, np.ndarray]:
        """(offset, scale) mapping draws to roughly [-1, 1]: (visible(x) - offset) / scale."""
        low, high = (self.visible(b) for b in self.support())
        return (low + high) / 2, np.maximum((high - low) / 2, 1e-6)

    def visible(self, x: Any) -> Any:
        """A draw in the coordinates `normaliser` is in (NumPy or JAX, as given): the
        value itself, but log space for a LogUniform."""
        return x

    # -- shared behaviour --
    def scaled(self, f: float, centre: Any = None) -> Distribution:
        """Shrinks (f < 1) or widens (f > 1) the spread around `centre`.

        `centre` defaults to the distribution's own centre. Every location
        parameter x becomes ``centre + f * (x - centre)`` and every scale
        parameter is multiplied by f; LogUniform does this in log space.
        """
        f = float(f)
        if not f >= 0:
            raise ValueError(f"scaled() needs a factor >= 0, got {f}")
        c = self.centre() if centre is None else np.asarray(centre, np.float32)
        return self._rescaled(f, c)

    def pin(self, value: Any) -> Distribution:
        """A distribution of the same kind and shapes that always draws `value`."""
        raise NotImplementedError

    def pin_to_defaults(self) -> Distribution:
        """The same kind and shapes, always drawing NaN: "every element at the env's own
        default". Only a shared absolute entry whose elements' defaults differ gives a
        NaN draw that meaning (see `ContextSpace.pinned`); nothing else accepts NaN, so
        this bypasses validation. Spreads (std, probs) keep their pinned values."""
        pinned = self.pin(1.0)  # a valid point for every kind; sets spreads to 0
        children = [
            getattr(pinned, f)
            if f in _SPREADS
            else np.full(np.shape(getattr(pinned, f)), np.nan, np.float32)
            for f in self._numeric
        ]
        return type(self)._unflatten(self._static(), children)

    def numbers(self) -> dict[str, np.ndarray]:
        """The numeric parameters by name (host copies)."""
        return {f: np.asarray(getattr(self, f)) for f in self._numeric}


_SPREADS = ("std", "probs")  # parameters that are not locations: kept by pin_to_defaults


def _fit(value, like):
    """`value` broadcast to the shape of parameter `like`, or a clear error."""
    if isinstance(value, jax.core.Tracer):
        return jnp.broadcast_to(value.astype(jnp.float32), np.shape(like))
    try:
        return np.broadcast_to(np.asarray(value, np.float32), np.shape(like)).copy()
    except ValueError:
        raise ValueError(
            f"cannot pin to a value of shape {np.shape(value)}: this distribution's parameters "
            f"have shape {np.shape(like)}"
        ) from None


def _move(x, c, f):
    return c + f * (np.asarray(x) - c)


@dataclasses.dataclass(frozen=True, eq=False)
class Uniform(Distribution):
    """Uniform on [low, high]."""

    low: Any
    high: Any
    relative: bool = False
    per_element: bool = False
    _numeric: ClassVar = ("low", "high")

    def _check(self):
        low, high = np.asarray(self.low, np.float32), np.asarray(self.high, np.float32)
        if np.any(low > high):
            raise ValueError(f"Uniform needs low <= high, got low={self.low}, high={self.high}")
        with np.errstate(over="ignore"):
            span = high - low
        if not np.all(np.isfinite(span)):
            raise ValueError(
                f"Uniform(low={self.low}, high={self.high}): high - low overflows float32 "
                "(draws are low + u * (high - low): every one would be inf); keep the width "
                f"below {float(np.finfo(np.float32).max):.3g}"
            )

    def sample(self, key, shape=()):
        return jax.random.uniform(key, shape, minval=self.low, maxval=self.high)

    def support(self):
        return np.asarray(self.low), np.asarray(self.high)

    def centre(self):
        return (np.asarray(self.low) + np.asarray(self.high)) / 2

    def _rescaled(self, f, c):
        return dataclasses.replace(self, low=_move(self.low, c, f), high=_move(self.high, c, f))

    def pin(self, value):
        return dataclasses.replace(self, low=_fit(value, self.low), high=_fit(value, self.high))


_SMALLEST = np.finfo(np.float32).tiny  # LogUniform.visible's floor: log gives -87.3


@dataclasses.dataclass(frozen=True, eq=False)
class LogUniform(Distribution):
    """Log-uniform on [low, high], 0 < low <= high; or the point low = high = 0, where
    ``space.pinned(env.default_context())`` puts an absolute range whose default is 0
    (a viscosity, an armature)."""

    low: Any
    high: Any
    relative: bool = False
    per_element: bool = False
    _numeric: ClassVar = ("low", "high")

    def _check(self):
        low, high = np.asarray(self.low), np.asarray(self.high)
        if np.any((low <= 0) & ~((low == 0) & (high == 0))):
            raise ValueError(f"LogUniform needs low > 0 (or low = high = 0), got low={self.low}")
        if np.any(np.asarray(self.low) > np.asarray(self.high)):
            raise ValueError(f"LogUniform needs low <= high, got low={self.low}, high={self.high}")

    def sample(self, key, shape=()):
        low, high = jnp.asarray(self.low, jnp.float32), jnp.asarray(self.high, jnp.float32)
        point = low == high  # a pinned range draws exactly its value, 0 included
        u = jax.random.uniform(
            key, shape, minval=jnp.log(jnp.where(point, 1.0, low)), maxval=jnp.log(high)
        )
        # exp(log(x)) can round one float32 step off x: keep draws inside [low, high]
        return jnp.where(point, low, jnp.clip(jnp.exp(u), low, high))

    def support(self):
        return np.asarray(self.low), np.asarray(self.high)

    def centre(self):
        return np.sqrt(np.asarray(self.low) * np.asarray(self.high))

    def visible(self, x):
        """log x, as the draws are uniform in it (linear, LogUniform(0.01, 1)'s geometric
        centre 0.1 was observed at -0.82 and half its draws within 0.18 of -1). A value
        <= 0 (a default of 0, or an evaluated 0) is taken as float32's smallest normal
        value: finite, far below any draw."""
        xp = jnp if isinstance(x, jax.Array) else np
        return xp.log(xp.maximum(x, _SMALLEST))

    def _rescaled(self, f, c):
        if np.any(c <= 0):
            raise ValueError(f"LogUniform.scaled needs a centre > 0, got {c}")
        lc = np.log(c)
        return dataclasses.replace(
            self,
            low=np.exp(_move(np.log(self.low), lc, f)),
            high=np.exp(_move(np.log(self.high), lc, f)),
        )

    def pin(self, value):
        return dataclasses.replace(self, low=_fit(value, self.low), high=_fit(value, self.high))


@dataclasses.dataclass(frozen=True, eq=False)
class Normal(Distribution):
    """Normal(mean, std), std >= 0. Unbounded: use TruncatedNormal for quantities
    that must stay positive."""

    mean: Any
    std: Any
    relative: bool = False
    per_element: bool = False
    _numeric: ClassVar = ("mean", "std")

    def _check(self):
        if np.any(np.asarray(self.std) < 0):
            raise ValueError(f"Normal needs std >= 0, got std={self.std}")

    def sample(self, key, shape=()):
        return self.mean + self.std * jax.random.normal(key, shape)

    def support(self):
        spread = np.where(np.asarray(self.std) > 0, np.inf, 0.0)
        return np.asarray(self.mean) - spread, np.asarray(self.mean) + spread

    def centre(self):
        return np.asarray(self.mean)

    def normaliser(self):
        return np.asarray(self.mean), np.maximum(np.asarray(self.std), 1e-6)

    def _rescaled(self, f, c):
        return dataclasses.replace(self, mean=_move(self.mean, c, f), std=f * np.asarray(self.std))

    def pin(self, value):
        return dataclasses.replace(self, mean=_fit(value, self.mean), std=_fit(0.0, self.std))


_TWO_STD_BELOW = 0.5 * math.erfc(2 / math.sqrt(2))  # P(Normal < mean - 2 std), 2.275%


@dataclasses.dataclass(frozen=True, eq=False)
class TruncatedNormal(Distribution):
    """Normal(mean, std) conditioned on [low, high]."""

    mean: Any
    std: Any
    low: Any
    high: Any
    relative: bool = False
    per_element: bool = False
    _numeric: ClassVar = ("mean", "std", "low", "high")

    def _check(self):
        if np.any(np.asarray(self.std) < 0):
            raise ValueError(f"TruncatedNormal needs std >= 0, got std={self.std}")
        if np.any(np.asarray(self.low) > np.asarray(self.high)):
            raise ValueError(
                f"TruncatedNormal needs low <= high, got low={self.low}, high={self.high}"
            )

    def sample(self, key, shape=()):
        mean, std, low, high = (
            jnp.asarray(getattr(self, f), jnp.float32) for f in ("mean", "std", "low", "high")
        )
        safe = jnp.maximum(std, 1e-30)
        # jitted: outside jit its Newton scan would otherwise compile at every call
        z = _truncated_standard_normal(key, (low - mean) / safe, (high - mean) / safe, tuple(shape))
        value = jnp.where(std > 0, mean + std * z, mean)
        # An interval under 1/100 std wide: its inverse CDF in log space resolves a few
        # hundred values (13 at 1e-6 std, their mean off by 9%). There the density is
        # exp(-m t) times exp(-t^2 / 2) about the midpoint m, the second factor within
        # 1.3e-5 of 1: draw the first by its own inverse CDF, from the low end.
        width, m = (high - low) / safe, ((low + high) / 2 - mean) / safe
        u = jax.random.uniform(key, shape, jnp.float32, minval=1e-7, maxval=1.0 - 1e-7)
        flat = jnp.abs(m * width) < 1e-6
        tilt = jnp.where(flat, 1.0, m)
        t = jnp.where(flat, u * width, -jnp.log1p(u * jnp.expm1(-tilt * width)) / tilt)
        value = jnp.where((std > 0) & (width < 1e-2), low + std * t, value)
        return jnp.clip(value, low, high)

    def support(self):
        """[low, high]; the one value it draws where std is 0 (its mean, clipped)."""
        low, high = np.asarray(self.low), np.asarray(self.high)
        point = np.clip(np.asarray(self.mean), low, high)
        spread = np.asarray(self.std) > 0
        return np.where(spread, low, point), np.where(spread, high, point)

    def _quantiles(self, q) -> np.ndarray:
        """The values below which a fraction `q` of the draws lie (float64 numpy; per
        element where the parameters are arrays): the truncated distribution's own,
        which a mean outside the bounds puts near the bound it is beyond."""
        from scipy import stats

        mean, std, low, high = (
            np.asarray(getattr(self, f), np.float64) for f in ("mean", "std", "low", "high")
        )
        spread = (std > 0) & (high > low)
        safe = np.where(spread, std, 1.0)
        with np.errstate(invalid="ignore", divide="ignore"):
            z = stats.truncnorm.ppf(q, (low - mean) / safe, (high - mean) / safe)
        return np.where(spread, mean + safe * z, np.clip(mean, low, high))

    def central(self) -> tuple[np.ndarray, np.ndarray]:
        """Where the central 95.45% of the draws lie (a Normal's mean +- 2 std): for
        TruncatedNormal(1, 0.1, 0.05, 5), [0.8, 1.2]; for one whose bounds cut into
        that, the quantiles of the truncated draws (TruncatedNormal(2, 0.1, 0, 1): its
        draws lie in [0.963, 1.0], not in mean - 2 std clipped, [0.8, 1.0])."""
        return tuple(
            self._quantiles(q).astype(np.float32) for q in (_TWO_STD_BELOW, 1 - _TWO_STD_BELOW)
        )

    def normaliser(self):
        low, high = self.central()
        return (low + high) / 2, np.maximum((high - low) / 2, 1e-6)

    def centre(self):
        """The mean clipped into the bounds: the range shrinks toward where its draws
        lie (about a mean beyond a bound, it would leave its support)."""
        return np.clip(np.asarray(self.mean), self.low, self.high)

    def _rescaled(self, f, c):
        return dataclasses.replace(
            self,
            mean=_move(self.mean, c, f),
            std=f * np.asarray(self.std),
            low=_move(self.low, c, f),
            high=_move(self.high, c, f),
        )

    def pin(self, value):
        return dataclasses.replace(
            self,
            mean=_fit(value, self.mean),
            std=_fit(0.0, self.std),
            low=_fit(value, self.low),
            high=_fit(value, self.high),
        )


@dataclasses.dataclass(frozen=True, eq=False)
class Choice(Distribution):
    """One of `values` (shape [k]), with probabilities `probs` (uniform if None)."""

    values: Any
    probs: Any = None
    relative: bool = False
    per_element: bool = False
    _numeric: ClassVar = ("values", "probs")

    def __post_init__(self):
        if self.probs is None and _is_concrete(self.values):
            k = np.asarray(self.values).shape[-1] if np.ndim(self.values) else 0
            object.__setattr__(self, "probs", np.full((k,), 1.0 / max(k, 1), np.float32))
        super().__post_init__()

    def _check(self):
        values, probs = np.asarray(self.values), np.asarray(self.probs)
        if values.ndim != 1 or values.shape[0] == 0:
            raise ValueError(f"Choice needs a non-empty 1-D list of values, got {values!r}")
        if probs.shape != values.shape:
            raise ValueError(
                f"Choice needs one probability per value: {values.shape[0]} values, "
                f"probs of shape {probs.shape}"
            )
        if np.any(probs < 0) or not math.isclose(float(probs.sum()), 1.0, abs_tol=1e-5):
            raise ValueError(
                f"Choice probabilities must be >= 0 and sum to 1, got {probs.tolist()} "
                f"(sum {float(probs.sum()):.6g})"
            )

    def sample(self, key, shape=()):
        idx = jax.random.categorical(key, jnp.log(self.probs), shape=shape)
        return jnp.asarray(self.values)[idx]

    def support(self):
        v = self._drawn()
        return v.min(), v.max()

    def centre(self):
        v = self._drawn()
        return (v.min() + v.max()) / 2

    def _drawn(self) -> np.ndarray:
        """The values a draw can take: those of probability > 0."""
        v = np.asarray(self.values)
        return v if self.probs is None else v[np.asarray(self.probs) > 0]

    def _rescaled(self, f, c):
        return dataclasses.replace(self, values=_move(self.values, c, f))

    def pin(self, value):
        if np.ndim(value):
            raise ValueError(
                f"Choice draws one value for all elements; pin it to a number, got {value!r}"
            )
        return dataclasses.replace(self, values=_fit(value, self.values))


@dataclasses.dataclass(frozen=True, eq=False)
class Fixed(Distribution):
    """Always `value`."""

    value: Any
    relative: bool = False
    per_element: bool = False
    _numeric: ClassVar = ("value",)

    def sample(self, key, shape=()):
        return jnp.broadcast_to(jnp.asarray(self.value), shape)

    def support(self):
        return np.asarray(self.value), np.asarray(self.value)

    def centre(self):
        return np.asarray(self.value)

    def _rescaled(self, f, c):
        return dataclasses.replace(self, value=_move(self.value, c, f))

    def pin(self, value):
        return dataclasses.replace(self, value=_fit(value, self.value))


def Scale(low: Any, high: Any, per_element: bool = False) -> Uniform:  # noqa: N802
    """Shorthand for ``Uniform(low, high, relative=True)``: a scale of the default."""
    return Uniform(low, high, relative=True, per_element=per_element)


def _log_ndtr_inverse(log_p: jax.Array, steps: int = 4) -> jax.Array:
    """z with log Phi(z) = log_p, accurate deep in the left tail (float32).

    Starts from ndtri(exp(log_p)) where exp does not underflow, else from the
    tail asymptote -sqrt(-2 log_p), then refines with Newton steps on log Phi,
    whose derivative is phi(z) / Phi(z) = exp(log phi(z) - log Phi(z)).
    """
    tail = log_p < -60.0
    start = jnp.where(
        tail,
        -jnp.sqrt(-2.0 * log_p),
        jax.scipy.special.ndtri(jnp.exp(jnp.where(tail, -1.0, log_p))),
    )

    def newton(z, _):
        log_phi = -0.5 * z * z - 0.5 * jnp.log(2 * jnp.pi)
        slope = jnp.exp(log_phi - jax.scipy.special.log_ndtr(z))
        return z - (jax.scipy.special.log_ndtr(z) - log_p) / slope, None

    return jax.lax.scan(newton, start, None, length=steps)[0]


@functools.partial(jax.jit, static_argnames="shape")
def _truncated_standard_normal(key, a, b, shape) -> jax.Array:
    """Samples of N(0, 1) conditioned on [a, b] by inverse-CDF in log space.

    An interval in the right tail is reflected into the left one, where
    log Phi is accurate; so an interval many sigma from the mean samples as
    well as one around it (jax.random.truncated_normal collapses there).
    """
    flip = a > 0
    lo, hi = jnp.where(flip, -b, a), jnp.where(flip, -a, b)
    u = jax.random.uniform(key, shape, jnp.float32, minval=1e-7, maxval=1.0 - 1e-7)
    log_lo, log_hi = jax.scipy.special.log_ndtr(lo), jax.scipy.special.log_ndtr(hi)
    # log((1 - u) Phi(lo) + u Phi(hi)), stable for tiny Phi values
    log_p = jnp.logaddexp(jnp.log1p(-u) + log_lo, jnp.log(u) + log_hi)
    z = jnp.clip(_log_ndtr_inverse(log_p), lo, hi)
    return jnp.where(flip, -z, z)
