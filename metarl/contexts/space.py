"""`ContextSpace`: which System quantities vary, and how.

A space maps names to distributions. It is plain data and a JAX pytree whose
leaves are the distributions' numbers, so a space can be passed into jitted
code and replaced by another with the same names, kinds and shapes (a
curriculum's new ranges) without recompiling.

A space means nothing until it is bound to a model and a backend
(`bind(space, sys, backend)`), which resolves every name, checks it against
the fields that backend really reads and the shape of each field, and returns
a `Binding` that samples and applies contexts inside jit. The model is a Brax
`System` or a plain `mjx.Model` (Playground and MJCF envs).

A name is one of:
* a canonical quantity (``"mass"``), optionally with elements chosen by MJCF
  name, pattern or index (``"mass[torso]"``, ``"friction[floor]"``; see
  `metarl.contexts.names`);
* a task parameter the env declares in its ``task_params`` (a goal distance);
* a raw model path (``"geom_solref[:, 0]"``), for experts.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
from brax.base import System
from flax import struct

from metarl.contexts import names as element_names
from metarl.contexts import paths, reads
from metarl.contexts.distributions import Choice, Distribution, Fixed, Normal
from metarl.contexts.quantities import (
    BRAX_POSE_UNTWINNED,
    BRAX_TWINS,
    LINEAR_INPUTS,
    NOT_LINEAR,
    QUANTITIES,
    SETCONST_INPUT,
    SETCONST_OUTPUT,
    Quantity,
    _simple_bodies,
    _wrapped_with_constants,
    mirror_brax_copies,
    setconst,
    setconst_basis,
    setconst_groups,
    spring_scale_check,
    subtree_masses,
    write_setconst,
)
from metarl.trees import in_shape_of

Context = dict[str, jax.Array]

# A key of `bind`'s `stale`: the reason a source refuses raw paths into the pose
# (`body_pos`, `body_quat`) of its mocap bodies, which MuJoCo reads only where it
# makes the data (a mocap body's pose is `data.mocap_pos` and `mocap_quat` after that).
MOCAP_POSE = "(the pose of a mocap body)"
_EQ_TENDON = int(mujoco.mjtEq.mjEQ_TENDON)


class ContextSpace(Mapping):
    """An ordered mapping {name: Distribution}.

    A name is a canonical quantity (see `CANONICAL_NAMES`) or a raw System path
    with optional indexing (``"geom_friction[:, 0]"``, ``"link.inertia.mass[1]"``).
    """

    def __init__(self, distributions: Mapping[str, Distribution]):
        if not isinstance(distributions, Mapping):
            raise ValueError(
                "ContextSpace takes a mapping {name: distribution}, got "
                f"{type(distributions).__name__}"
            )
        for name, dist in distributions.items():
            if not isinstance(name, str) or not name:
                raise ValueError(f"context names must be non-empty strings, got {name!r}")
            if not isinstance(dist, Distribution):
                raise ValueError(
                    f"context {name!r}: expected a distribution (Uniform, LogUniform, Normal, "
                    f"TruncatedNormal, Choice, Fixed), got {type(dist).__name__}"
                )
        self._dists = dict(distributions)

    # Mapping protocol
    def __getitem__(self, name: str) -> Distribution:
        return self._dists[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._dists)

    def __len__(self) -> int:
        return len(self._dists)

    def __repr__(self) -> str:
        inner = ", ".join(f"{k!r}: {v!r}" for k, v in self._dists.items())
        return f"ContextSpace({{{inner}}})"

    # pytree protocol (names are the keys of the key paths)
    def _flatten_with_keys(self):
        children = [(jax.tree_util.DictKey(n), d) for n, d in self._dists.items()]
        return children, tuple(self._dists)

    def _flatten(self):
        return tuple(self._dists.values()), tuple(self._dists)

    @classmethod
    def _unflatten(cls, names, dists):
        obj = object.__new__(cls)
        obj._dists = dict(zip(names, dists))
        return obj

    def check_compatible(self, ranges: Any, batch_shape: tuple[int, ...] = ()) -> ContextSpace:
        """The one compatibility rule: `ranges` can replace this space's ranges.

        Same names in the same order, the same distribution kinds and flags,
        and every parameter of this space's shape with `batch_shape` in front
        (``()`` for shared ranges, ``(num_envs,)`` for per-env ranges). Such
        ranges reach compiled code without recompiling it. Returns `ranges`;
        raises ValueError naming the first difference. Physical limits are
        checked by `Binding.check_ranges`, which knows the fields.
        """
        if not isinstance(batch_shape, tuple | list) or not all(
            isinstance(n, int | np.integer) and not isinstance(n, bool) and n >= 0
            for n in batch_shape
        ):
            raise ValueError(
                f"batch_shape must be a tuple of sizes, () or (num_envs,), got {batch_shape!r}"
            )
        self.check_meaning(ranges)
        batch = tuple(int(n) for n in batch_shape)
        for name in self:
            old, new = self[name], ranges[name]
            if jax.tree.structure(new) != jax.tree.structure(old):
                raise ValueError(
                    f"context {name!r}: the ranges must keep the distribution kind and flags: "
                    f"expected {old!r}, got {new!r}"
                )
            for a, b in zip(jax.tree.leaves(old), jax.tree.leaves(new)):
                if batch + np.shape(a) != np.shape(b):
                    raise ValueError(
                        f"context {name!r}: parameter shapes differ: got {np.shape(b)}, need "
                        f"{batch + np.shape(a)}"
                        + (f" (batch {batch} + the space's {np.shape(a)})" if batch else "")
                        + "; another shape would recompile"
                    )
        return ranges

    def check_meaning(self, ranges: Any) -> ContextSpace:
        """What a draw from `ranges` means is what it means in this space: the same
        names in the same order, each with the same `relative` and `per_element`
        flags (a relative draw is a scale factor, an absolute one a value). The
        distribution kind may differ (the evaluator pins values with `Fixed`).
        Returns `ranges`; raises ValueError naming the first difference."""
        if not isinstance(ranges, ContextSpace):
            raise ValueError(f"expected ranges as a ContextSpace, got {type(ranges).__name__}")
        if tuple(ranges) != tuple(self):
            raise ValueError(
                f"the ranges must have the same names in the same order as the env's space: "
                f"expected {list(self)}, got {list(ranges)}"
            )
        for name in self:
            old, new = self[name], ranges[name]
            if (new.relative, new.per_element) != (old.relative, old.per_element):
                raise ValueError(
                    f"context {name!r}: the ranges must keep the flags relative={old.relative} "
                    f"and per_element={old.per_element} (a relative draw is a scale factor, an "
                    f"absolute one a value): got {new!r}"
                )
        return ranges

    def scaled(self, f: float, around: Any = None) -> ContextSpace:
        """Every range shrunk (f < 1) or widened (f > 1) by factor f.

        around=None scales each distribution about its own centre. A mapping
        (usually ``env.default_context()``) scales about the environment's
        defaults: relative distributions about 1, absolute ones about the
        given default (for a shared one whose elements' defaults differ, about
        their mean). A default outside the distribution's interval (`intervals`)
        is replaced by the interval's nearest point, so f <= 1 always gives
        ranges inside this space: hopper's friction Uniform(0.6, 1.0), whose
        defaults' mean is 1.5, scaled by 0.2 is Uniform(0.92, 1.0), not
        Uniform(1.32, 1.4), where every draw would lie beyond the space. An
        absolute `LogUniform` is scaled in log space.
        """
        if around is not None:
            self.check_defaults(around, "scaled(around=...)")
            intervals = self.intervals()
        out = {}
        for name, dist in self._dists.items():
            centre = None
            if around is not None:
                centre = 1.0 if dist.relative else _fitting_centre(name, dist, around)
                low, high = (np.asarray(x, np.float32) for x in intervals[name])
                # against per-element bounds, one centre for all elements stays one
                centre = in_shape_of(np.clip(np.asarray(centre, np.float32), low, high), centre)
            out[name] = dist.scaled(f, centre)
        return ContextSpace(out)

    def check_defaults(self, defaults: Any, who: str) -> Mapping:
        """`defaults` (usually ``env.default_context()``) as ranges are scaled about:
        a mapping with a value for each of this space's names and no other, 1 for a
        relative entry (a scale's default is x1; another value would be ignored)."""
        if not isinstance(defaults, Mapping):
            raise ValueError(
                f"{who} takes a mapping of defaults such as env.default_context(), "
                f"got {type(defaults).__name__}"
            )
        missing = [n for n in self if n not in defaults]
        unknown = [n for n in defaults if n not in self._dists]
        if missing or unknown:
            raise ValueError(
                f"{who}: the defaults must give every name of the space {list(self)} and no "
                f"other: missing {missing}, unknown {unknown}"
            )
        for name, dist in self._dists.items():
            value = np.asarray(defaults[name], np.float64)
            if dist.relative and not np.all(value == 1):
                raise ValueError(
                    f"{who}: {name!r} is relative, a scale of the env's own value, whose "
                    f"default is 1; got {value.tolist()} (give an absolute range to move it "
                    "about another value)"
                )
        return defaults

    def pinned(self, values: Mapping[str, Any]) -> ContextSpace:
        """The same names, kinds and shapes, every distribution degenerate at `values[name]`.

        Names missing from `values` keep their distribution. The result is a
        valid set of ranges for an env built on this space (no recompilation):
        evaluation and ADR use it to run episodes in chosen contexts.

        A per-element entry whose parameters hold one number per element is
        pinned to one value per element. A shared entry draws one number for
        all its elements, and a per-element one with scalar parameters draws
        each from one range, so their parameters have shape (): an array of
        equal values pins them to that value, and an array of differing values
        cannot be represented, except one: the `EnvDefaults` array that
        ``env.default_context()`` returns for an absolute entry whose elements'
        defaults differ (hopper's shared ``friction``, a per-element ``mass``).
        That one pins the entry to NaN, which the binding writes as "each
        element at the env's own default" and observes as those defaults (their
        mean for a shared entry).
        Shapes, the context's shape in ``state.info`` and the observation size
        stay those of the space, so ``env.space.pinned(env.default_context())``
        runs the env in exactly its own physics wherever ranges are accepted.
        """
        unknown = set(values) - set(self._dists)
        if unknown:
            raise ValueError(
                f"pinned(): unknown names {sorted(unknown)}; valid: {list(self._dists)}"
            )
        return ContextSpace(
            {n: _pin(n, d, values[n]) if n in values else d for n, d in self._dists.items()}
        )

    def intervals(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """A finite (low, high) per name, where the draws lie: the support; mean +- 2
        std for a Normal; for a TruncatedNormal, where the same 95.45% of its draws lie
        (`TruncatedNormal.central`): its bounds only limit the draws, so of
        TruncatedNormal(1, 0.1, 0.05, 5), [0.8, 1.2], not [0.05, 5], where 72% of
        the interval lies beyond any training draw. Held-out sets, the heatmap axes
        and the logged curriculum ranges read these intervals."""
        from metarl.contexts.distributions import TruncatedNormal

        out = {}
        for name, dist in self._dists.items():
            if isinstance(dist, TruncatedNormal):
                out[name] = dist.central()
            elif isinstance(dist, Normal):
                m, s = np.asarray(dist.mean), np.asarray(dist.std)
                out[name] = (m - 2 * s, m + 2 * s)
            else:
                out[name] = dist.support()
        return out


def _check_discrete_task(name: str, dist: Distribution, declared: Any) -> None:
    """An integer or flag task parameter (an index, a switch) takes only a `Choice` or
    a `Fixed` of its own kind of values, absolute: a continuous draw would be cut to a
    few values the env reads (a flag drawn in [0, 1] read as True every time)."""
    kind = np.asarray(declared).dtype
    if np.issubdtype(kind, np.floating):
        return
    if isinstance(dist, Choice):
        values = dist._drawn()  # noqa: SLF001 - what a draw can take
    elif isinstance(dist, Fixed):
        values = np.asarray(dist.value)
    else:
        values = None
    if values is None or dist.relative or np.any(_not_whole(kind, values)):
        raise ValueError(
            f"context {name!r}: the env declares this task parameter as {_whole_kind(kind)}, "
            f"so it takes an absolute Choice or Fixed of such values, got {dist!r}"
        )


def _whole_kind(kind: np.dtype) -> str:
    """An integer or flag task parameter's kind, as the refusals name it."""
    return (
        "a flag (bool): values 0 and 1"
        if kind == np.bool_
        else f"an integer ({kind}): whole values"
    )


def _not_whole(kind: np.dtype, values: Any) -> np.ndarray:
    """Where `values` are none a task parameter of integer or flag `kind` can take."""
    values = np.asarray(values)
    out = np.round(values) != values
    return out | ((values != 0) & (values != 1)) if kind == np.bool_ else out


def _task_value(value: Any) -> jax.Array:
    """A task parameter's default as the env reads it: a float as float32, an integer
    or a flag as it was declared."""
    value = np.asarray(value)
    return jnp.asarray(value, jnp.float32 if np.issubdtype(value.dtype, np.floating) else None)


class EnvDefaults(np.ndarray):
    """Per-element env defaults of a shared absolute entry whose elements differ.

    A plain float32 array in every use (arithmetic returns plain arrays); only
    `ContextSpace.pinned` reads the type, to pin the shared entry to the env's
    own per-element values (which no single shared number reproduces).
    """

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        inputs = tuple(np.asarray(x) if isinstance(x, EnvDefaults) else x for x in inputs)
        return getattr(ufunc, method)(*inputs, **kwargs)


def _pin(name: str, dist: Distribution, value: Any) -> Distribution:
    if isinstance(value, jax.core.Tracer) or np.ndim(value) == 0:
        return dist.pin(value)
    if dist.per_element:  # one value per element, where its parameters hold one each
        try:
            return dist.pin(value)
        except ValueError:
            pass
    if isinstance(value, EnvDefaults) and not dist.relative:
        return dist.pin_to_defaults()
    flat = np.asarray(value, np.float32).reshape(-1)
    if flat.size and np.all(flat == flat[0]):
        return dist.pin(flat[0])
    kind = (
        "has one range for all elements"
        if dist.per_element
        else "is shared (one draw for all elements)"
    )
    raise ValueError(
        f"pinned(): {name!r} {kind} but got differing per-element values "
        f"{flat.tolist()}; pin it to one number, give its distribution per-element "
        "parameters, or pin it to env.default_context()[name] for the env's own values"
    )


def _fitting_centre(name: str, dist: Distribution, defaults: Mapping) -> np.ndarray:
    """`_shared_default`, refused where scaling about it would change the shape of the
    distribution's parameters (which `set_ranges` refuses: another structure would
    recompile): a range shared by the elements, or a `Choice`'s list of values (one
    entry per choice, not per element), about defaults that differ per element."""
    centre = _shared_default(name, dist, defaults)
    if centre.ndim == 0:
        return centre
    if np.all(centre == centre.reshape(-1)[0]):
        return centre.reshape(-1)[0]
    shapes = [np.shape(v) for v in dist.numbers().values()]
    grows = isinstance(dist, Choice) or any(
        np.broadcast_shapes(shape, centre.shape) != shape for shape in shapes
    )
    if grows:
        what, fix = (
            ("a Choice's values are one list for all its elements", "")
            if isinstance(dist, Choice)
            else (
                "its range is one for all its elements",
                f"give it per-element parameters of shape {centre.shape}, or ",
            )
        )
        shown = ", ".join(f"{x:.6g}" for x in centre.reshape(-1))
        raise ValueError(
            f"scaled(around=...): {name!r} cannot be scaled about its per-element defaults "
            f"[{shown}]: {what}, and scaling it about each element's own default would give "
            "every element its own values (another structure, which set_ranges refuses); "
            f"{fix}scale it about one number (around={{{name!r}: value}})"
        )
    return centre


def _shared_default(name: str, dist: Distribution, defaults: Mapping) -> np.ndarray:
    """The centre an absolute entry is scaled about: its default, per element where
    it draws per element; for a shared entry whose elements' defaults differ
    (hopper's floor and foot friction), their mean, which is also what its visible
    context observes for the env's own values."""
    if name not in defaults:
        raise ValueError(f"scaled(around=...): no default given for {name!r}")
    value = np.asarray(defaults[name], np.float32)
    if not dist.per_element and value.ndim > 0:
        value = np.float32(value.mean())
    return value


jax.tree_util.register_pytree_with_keys(
    ContextSpace,
    ContextSpace._flatten_with_keys,
    ContextSpace._unflatten,
    ContextSpace._flatten,
)

CANONICAL_NAMES = tuple(QUANTITIES)


@dataclasses.dataclass(frozen=True)
class TaskParam:
    """A parameter of the env's own task (a goal distance, a target direction),
    declared by the env as ``task_params = {name: default}`` and read by its
    reset and step from ``self.task_params``; metarl swaps in the drawn values."""

    name: str


@dataclasses.dataclass(frozen=True)
class _Entry:
    name: str
    target: Quantity | paths.RawPath | TaskParam
    shape: tuple[int, ...]  # element shape of the quantity (of the selected elements)
    default: np.ndarray  # default values, shape `shape`
    relative: bool
    per_element: bool
    select: np.ndarray | None = None  # chosen element indices (name selection)
    labels: tuple[str, ...] | None = None  # the elements' names, in the order values take

    @property
    def draw_shape(self) -> tuple[int, ...]:
        return self.shape if self.per_element else ()

    @property
    def mixed_default(self) -> bool:
        """An absolute entry whose elements' defaults differ: a NaN draw
        (`ContextSpace.pinned` to `EnvDefaults`, for a distribution with one
        range for all elements) writes each element's default."""
        d = self.default
        return not self.relative and d.ndim > 0 and bool(np.any(d != d.flat[0]))

    def value(self, draw: jax.Array) -> jax.Array:
        """The drawn context in the target's units, one value per element."""
        value = jnp.broadcast_to(draw, self.shape)
        if self.mixed_default:
            value = jnp.where(jnp.isnan(value), self.default, value)
        return value * self.default if self.relative else value

    def write(self, sys: System, draw: jax.Array) -> System:
        value = self.value(draw)
        if isinstance(self.target, TaskParam):
            return sys
        if isinstance(self.target, Quantity):
            if self.select is not None:  # the other elements keep their current values
                current = jnp.asarray(self.target.default(sys), jnp.float32)
                value = current.at[self.select].set(value)
            return self.target.apply(sys, value)
        return self.target.write(sys, value)


class PerEnv(struct.PyTreeNode):
    """Ranges with one row per env: every parameter has a leading [num_envs] axis.

    Pass ``PerEnv(ranges)`` wherever shared ranges are accepted (`run_train`'s
    `context`, `init_env_state`); ADR's curriculum returns one. Being explicit
    means no code guesses from leaf shapes whether ranges are shared.
    """

    ranges: ContextSpace

    @property
    def num_envs(self) -> int:
        leaves = jax.tree.leaves(self.ranges)
        return int(np.shape(leaves[0])[0]) if leaves else 0

    def row(self, i: int) -> ContextSpace:
        """The ranges of env `i`."""
        return jax.tree.map(lambda x: np.asarray(x)[i], self.ranges)


def per_env_hint(space: ContextSpace, ranges: Any, rows: tuple[int, ...]) -> str:
    """For an error about shared `ranges`: a hint to wrap them in `PerEnv` when they
    would fit `space` as rows of batch shape `rows` ("" otherwise)."""
    if not rows:
        return ""
    try:
        space.check_compatible(ranges, rows)
    except (ValueError, TypeError):
        return ""
    return (
        f"; these ranges have one row per env (batch shape {rows}): pass them as "
        "metarl.contexts.PerEnv(ranges)"
    )


@dataclasses.dataclass(frozen=True)
class Binding:
    """A space resolved against one System and backend; samples and applies contexts."""

    space: ContextSpace
    backend: str
    sys: System  # the default model (Brax System or mjx.Model), switches turned on
    entries: tuple[_Entry, ...]
    task: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # env's task defaults

    def sample(self, key: jax.Array, ranges: ContextSpace | None = None) -> Context:
        """Draws one context {name: value}; `ranges` defaults to the bound space."""
        ranges = self.space if ranges is None else ranges
        keys = jax.random.split(key, max(len(self.entries), 1))
        return {
            e.name: ranges[e.name].sample(k, e.draw_shape).astype(jnp.float32)
            for e, k in zip(self.entries, keys)
        }

    def apply(self, context: Context, derived: Context | None = None) -> System:
        """The default model with `context` written into every field the backend reads,
        and the constants MuJoCo derives from those fields when it compiles a model
        (`derive`): `derived` where given (`derive(context)`, computed once per draw),
        else computed here."""
        sys = self._write(context)
        if self.derives:
            if derived is None:
                derived = setconst(self.sys, sys, self.derives, self._setconst_basis)
            sys = write_setconst(sys, derived)
        return sys

    def derive(self, context: Context) -> Context:
        """{field: value}: the model constants MuJoCo's `mj_setConst` derives from the
        fields `context` writes, which no setter can update alone (the groups in
        `derives`, `metarl.contexts.quantities.SETCONST`): the constraint solver's
        inverse weights (`body_invweight0`, `dof_invweight0`, `tendon_invweight0`, and
        Brax's copies) where the context changes masses, inertias, armatures or centres
        of mass, and a muscle's `actuator_acc0` where it changes those or gears; {}
        where none. As exact as a model compiled with these values, and the loaded
        values bit for bit for the default context. It costs about a physics step,
        so `ContextualEnv` computes it when it draws a context and carries it in
        ``state.info["derived"]`` beside the draw."""
        if not self.derives:
            return {}
        return setconst(self.sys, self._write(context), self.derives, self._setconst_basis)

    @functools.cached_property
    def _setconst_basis(self) -> dict[str, np.ndarray] | None:
        """`setconst_basis` of the default model where every entry writes setconst
        inputs linearly at most (`quantities.NOT_LINEAR`: none of those; a raw path
        only to `LINEAR_INPUTS`), else None: MJX's kinematics at every call."""
        for e in self.entries:
            if isinstance(e.target, paths.RawPath):
                if self._setconst_field(e.target.field) not in LINEAR_INPUTS:
                    return None
            elif any(e.target is QUANTITIES[name] for name in NOT_LINEAR):
                return None
        return setconst_basis(self.sys, self.derives) if self.derives else None

    @property
    def derives(self) -> tuple[str, ...]:
        """The groups of constants `derive` computes (empty: none)."""
        written = set()
        for e in self.entries:
            if isinstance(e.target, paths.RawPath):
                written.add(self._setconst_field(e.target.field))
            for name, field in SETCONST_INPUT.items():
                if e.target is QUANTITIES[name]:
                    written.add(field)
        return setconst_groups(self.sys, self.backend, written)

    def _setconst_field(self, field: str) -> str:
        """The field `setconst` reads for a raw path's: on generalized, a Brax copy's
        MuJoCo field (`BRAX_TWINS`, which `_write` mirrors it into)."""
        return BRAX_TWINS.get(field, field) if self.backend == "generalized" else field

    @functools.cached_property
    def _mirrored(self) -> set[str]:
        """The Brax copies (`BRAX_TWINS`) raw entries write on generalized."""
        if self.backend != "generalized":
            return set()
        raw = {e.target.field for e in self.entries if isinstance(e.target, paths.RawPath)}
        return raw & set(BRAX_TWINS)

    def _write(self, context: Context) -> System:
        sys = self.sys
        for e in self.entries:
            sys = e.write(sys, context[e.name])
        sys = mirror_brax_copies(sys, self._mirrored) if self._mirrored else sys
        for field in self._unit_rows:  # as MuJoCo's compiler normalizes them
            new, loaded = getattr(sys, field), getattr(self.sys, field)
            norm = jnp.linalg.norm(new, axis=-1, keepdims=True)
            unit = jnp.where(norm > 0, new / jnp.where(norm > 0, norm, 1), new)
            same = jnp.all(new == loaded, axis=-1, keepdims=True)  # bit for bit
            sys = sys.replace(**{field: jnp.where(same, loaded, unit)})
        return subtree_masses(self.sys, sys) if self._raw_masses else sys

    @functools.cached_property
    def _unit_rows(self) -> tuple[str, ...]:
        """The fields of unit rows (a joint's axis, quaternions) that raw entries write:
        MuJoCo normalizes them when it compiles a model, and MJX's kinematics take them
        as unit (a joint axis (0, 2, 0) made a body's xmat of determinant 1.66)."""
        raw = {e.target.field for e in self.entries if isinstance(e.target, paths.RawPath)}
        return tuple(sorted(raw & set(UNIT_ROWS)))

    @functools.cached_property
    def _raw_masses(self) -> bool:
        """Whether a raw entry writes `body_mass` (a Brax copy of it on generalized):
        the subtrees' masses follow it, as the canonical `mass`'s do."""
        return any(
            isinstance(e.target, paths.RawPath)
            and self._setconst_field(e.target.field) == "body_mass"
            for e in self.entries
        )

    @property
    def task_defaults(self) -> dict[str, Any]:
        """The env's own task parameters (empty when it declares none)."""
        return dict(self.task)

    def task_params(self, context: Context) -> dict[str, jax.Array]:
        """The env's task parameters with the drawn task contexts written in, each of
        its declared kind (a float as float32; an integer or flag as declared, a value
        a curriculum moved off the declared values rounded to the nearest)."""
        out = {k: _task_value(v) for k, v in self.task.items()}
        for e in self.entries:
            if isinstance(e.target, TaskParam):
                value, kind = e.value(context[e.name]), out[e.name].dtype
                out[e.name] = value if kind == jnp.float32 else jnp.round(value).astype(kind)
        return out

    def default_context(self) -> Context:
        """The environment's own values in each entry's units (1 where relative).

        A shared absolute entry whose elements have different defaults gets the
        per-element array as an `EnvDefaults`: no single shared draw reproduces it,
        but ``space.pinned(default_context())`` does (see `ContextSpace.pinned`).
        """
        out = {}
        for e in self.entries:
            if e.relative:
                out[e.name] = np.ones(e.draw_shape, np.float32)
            elif e.mixed_default:
                out[e.name] = e.default.copy().view(EnvDefaults)
            elif e.per_element or e.default.ndim == 0:
                out[e.name] = e.default
            else:
                out[e.name] = e.default.flat[0]
        return out

    def lower_limit(self, name: str) -> float | None:
        """The physical lower limit of context `name` (exclusive for sizes and masses),
        in the quantity's units or as a scale factor; None where any value is valid."""
        for e in self.entries:
            if e.name == name:
                return _limit(e.target)[0]
        raise ValueError(f"lower_limit: unknown context {name!r}; valid: {list(self.space)}")

    def discrete_kind(self, name: str) -> np.dtype | None:
        """The declared kind of context `name` where it is a task parameter the env
        declares as an integer or a flag (it reads whole values), else None."""
        for e in self.entries:
            if e.name == name and isinstance(e.target, TaskParam):
                kind = np.asarray(self.task[e.target.name]).dtype
                return None if np.issubdtype(kind, np.floating) else kind
        return None

    def check_task_values(self, name: str, values: Any, where: str) -> None:
        """Refuses `values` of context `name` that an integer or flag task parameter
        cannot take (not whole; a flag's: not 0 or 1): the env would read them rounded,
        other values than those asked for."""
        kind = self.discrete_kind(name)
        if kind is not None and np.any(bad := _not_whole(kind, values)):
            raise ValueError(
                f"{where}: the env declares {name!r} as {_whole_kind(kind)}, got "
                f"{np.unique(np.asarray(values)[bad])[:5].tolist()}: it would read them "
                "rounded, as other values than those asked for"
            )

    @property
    def context_size(self) -> int:
        return int(sum(np.prod(e.draw_shape, dtype=int) for e in self.entries))

    def normalise(self, context: Context) -> jax.Array:
        """The context as one flat vector, roughly in [-1, 1] over the bound space (in
        log space for a LogUniform entry)."""
        parts = []
        for e in self.entries:
            dist = self.space[e.name]
            offset, scale = _normaliser(dist)
            c = context[e.name]
            if e.mixed_default:  # the env's own values: per element, or their mean if shared
                own = e.default if e.per_element else np.float32(e.default.mean())
                c = jnp.where(jnp.isnan(c), own, c)
                # a space pinned to those values (NaN bounds) is a point at them
                own = dist.visible(own)
                offset = np.where(np.isnan(offset), own, offset)
                scale = np.where(np.isnan(scale), np.maximum(np.abs(own), 1.0), scale)
            v = (dist.visible(c) - offset) / scale
            parts.append(jnp.reshape(jnp.broadcast_to(v, e.draw_shape), (-1,)))
        if not parts:
            return jnp.zeros((0,), jnp.float32)
        return jnp.concatenate(parts).astype(jnp.float32)

    def check_ranges(self, ranges: Any, batch_shape: tuple[int, ...] = ()) -> ContextSpace:
        """Validates replacement ranges: `ContextSpace.check_compatible`, then the
        physical limits of every distinct row of a batch (`batch_shape` in front)."""
        self.space.check_compatible(ranges, batch_shape)
        return self.check_limits(ranges, batch_shape)

    def check_limits(self, ranges: Any, batch_shape: tuple[int, ...] = ()) -> ContextSpace:
        """The physical limits of every distinct row of a batch of ranges whose names
        and flags are this space's (`ContextSpace.check_meaning`), of any kind and
        shape: the evaluator's `Fixed` values for a space of `Uniform` ranges."""
        self.space.check_meaning(ranges)
        if not batch_shape or not self.entries:  # an empty space has no limits
            for e in self.entries:
                _check_values(e, ranges[e.name])
            return ranges
        n = int(np.prod(batch_shape))
        leaves = [
            np.asarray(x).reshape((n,) + np.shape(x)[len(batch_shape) :])
            for x in jax.tree.leaves(ranges)
        ]
        flat = jax.tree.unflatten(jax.tree.structure(ranges), leaves)
        rows = np.unique(
            np.concatenate([x.reshape(n, -1) for x in leaves], 1), axis=0, return_index=True
        )[1]
        for i in rows:  # validate each distinct row once
            try:
                self.check_limits(jax.tree.map(lambda x, i=i: x[i], flat))
            except ValueError as err:
                row = tuple(int(k) for k in np.unravel_index(i, batch_shape))
                raise ValueError(f"{err} (row {row} of {tuple(batch_shape)})") from None
        return ranges

    def check_traced(self, ranges: Any, batch_shape: tuple[int, ...] = ()) -> ContextSpace:
        """`check_limits` for ranges whose numbers are traced (computed inside jit).

        Returns the same ranges passed through a host callback of the compiled
        program: when the program runs, the callback checks the concrete numbers
        (every row, `batch_shape` and any vmapped axes in front) and raises the
        ValueError `check_limits` raises, which JAX raises again where the
        program is called. The program must use what this returns. Once per
        call of the program: a device-to-host copy of the ranges, no recompilation.
        """
        leaves, tree = jax.tree.flatten(ranges)
        if not self.entries or not leaves:
            return ranges
        leaves = [jnp.asarray(x) for x in leaves]
        ndim = leaves[0].ndim  # every leaf gets the same vmapped axes (broadcast_all)

        def check(*concrete):
            concrete = [np.asarray(x) for x in concrete]
            batch = concrete[0].shape[: concrete[0].ndim - ndim] + tuple(batch_shape)
            try:
                self.check_limits(jax.tree.unflatten(tree, concrete), batch)
            except ValueError as err:
                raise ValueError(f"ranges computed inside jit, checked as it ran: {err}") from None
            return concrete

        shapes = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in leaves]
        checked = jax.pure_callback(check, shapes, *leaves, vmap_method="broadcast_all")
        return jax.tree.unflatten(tree, checked)


def _normaliser(dist: Distribution) -> tuple[np.ndarray, np.ndarray]:
    offset, scale = dist.normaliser()
    low, high = dist.support()
    flat = np.asarray(high) - np.asarray(low) <= 0
    return offset, np.where(flat, np.maximum(np.abs(offset), 1.0), scale)


def _unknown(name: str, reason: str, task: Mapping[str, Any] = {}) -> ValueError:  # noqa: B006
    tasks = f"; this env's task parameters: {', '.join(task)}" if task else ""
    return ValueError(
        f"unknown context name {name!r}: {reason}. Valid canonical names: "
        f"{', '.join(CANONICAL_NAMES)} (optionally with elements chosen by name, e.g. "
        f"'mass[torso]'){tasks}; or a raw System path such as "
        "'geom_friction[:, 0]' or 'link.inertia.mass[1]'"
    )


# Raw fields that the positional and spring backends raise to the power
# (1 - scale): with the scale at 1 every value becomes 1 and writing them does nothing.
_SPRING_SCALED = {
    "link.inertia.mass": ("spring_mass_scale", "link.inertia.mass"),
    "link.inertia.i": ("spring_inertia_scale", "link.inertia.i"),
}


# (target, default values, selected element indices or None, the model prepared for it)
_Resolved = tuple[Quantity | paths.RawPath | TaskParam, np.ndarray, np.ndarray | None, System]


def _resolve(
    name: str, sys: System, backend: str, task: Mapping[str, Any], stale: Mapping[str, str]
) -> _Resolved:
    """(target, default values, selected element indices or None, prepared model) for one
    name. A canonical name without elements covers the live ones where the quantity
    skips dead elements (`Quantity.skip_dead`)."""
    base, selector = element_names.split(name)
    if base in stale:
        raise ValueError(f"context {name!r} is refused for this env: {stale[base]}")
    if base in QUANTITIES:
        q = QUANTITIES[base]
        if backend not in q.backends:
            raise ValueError(
                f"context {name!r} is not simulated by the {backend!r} backend: "
                f"{q.unsupported_hint} Backends that simulate it: {sorted(q.backends)}"
            )
        problem = q.requires(sys, backend)
        if problem:
            raise ValueError(problem)
        sys = q.prepare(sys, backend)
        select = None
        if selector is not None:
            if not q.elements:
                raise ValueError(
                    f"context {name!r}: {base!r} is a single value, it has no elements to choose"
                )
            select = element_names.select(sys, q.elements, selector, name)
        select = _live_selection(name, q, sys, backend, select)
        default = np.asarray(q.default(sys), np.float32)
        return q, default if select is None else default[select], select, sys
    if name in task:
        return TaskParam(name), np.asarray(task[name], np.float32), None, sys
    try:
        raw = paths.parse(name)
    except ValueError as e:
        raise _unknown(name, str(e), task) from None
    if raw is None:
        raise _unknown(name, "not a canonical quantity, a task parameter nor a System path", task)
    if raw.field in stale:
        raise ValueError(f"raw path {name!r} is refused for this env: {stale[raw.field]}")
    if MOCAP_POSE in stale and raw.field in ("body_pos", "body_quat"):
        mocap = [r for r in _rows(raw, sys) or () if np.asarray(sys.body_mocapid)[r] >= 0]
        if mocap:
            raise ValueError(
                f"raw path {name!r} is refused for this env: bodies {mocap} are mocap bodies, "
                f"{stale[MOCAP_POSE]}; select the other rows"
            )
    # The table was measured on Brax's own envs, through a Brax System. MJX reads some
    # fields only where a model loads them nonzero (frictionloss, an actuator's bias):
    # a plain mjx.Model (an MJCF, Playground) is left to `check_env`.
    if isinstance(sys, System) and reads.unread(backend, raw.field):
        raise ValueError(
            f"raw path {name!r}: {reads.explain(backend, raw.field)}, so changing it would "
            "not change the simulation. Use a canonical name "
            f"({', '.join(CANONICAL_NAMES)}), which writes the fields each backend reads"
        )
    if raw.field in _POSE_INPUTS and (problem := _pose_constants(sys)):
        raise ValueError(f"raw path {name!r}: {problem}")
    on_mjx = raw.field in _ROW_CHECKS and backend == "mjx"
    if on_mjx and (problem := _refused_rows(raw, sys, backend)):
        raise ValueError(f"raw path {name!r}: {problem}")
    if raw.field == "jnt_range" and (problem := _unlimited_joints(raw, sys, backend)):
        raise ValueError(f"raw path {name!r}: {problem}")
    if raw.field == "geom_friction" and (problem := _unread_friction_columns(raw, sys, backend)):
        raise ValueError(f"raw path {name!r}: {problem}")
    if raw.field in _SPRING_SCALED:
        problem = spring_scale_check(*_SPRING_SCALED[raw.field])(sys, backend)
        if problem:
            raise ValueError(f"raw path {name!r}: {problem}")
    try:
        return raw, paths.resolve(raw, sys), None, sys
    except ValueError as e:
        if not hasattr(sys, raw.field.split(".")[0]):
            raise _unknown(name, str(e), task) from None
        raise


_FLUID = {"opt.viscosity": "viscosity", "opt.density": "density", "opt.wind": None}


def _check_fluid(entries: list, sys: System) -> None:
    """Refuses a raw fluid path (viscosity, density, wind) that MJX never reads: its
    step simulates fluid forces only where the model loaded a viscosity, density or
    wind (has_fluid_params, fixed when loaded), or a canonical 'viscosity' or
    'density' entry of the same space switched them on (`sys`: after every entry)."""
    for entry in entries:
        field = getattr(entry.target, "field", None)
        if field not in _FLUID or _fluid_on(sys):
            continue
        canonical = _FLUID[field] or "viscosity' or 'density"
        raise ValueError(
            f"raw path {entry.name!r}: MJX simulates fluid forces only where the model loaded a "
            "viscosity, density or wind (its has_fluid_params flag, fixed when loaded), so "
            f"writing {field} would change nothing; vary the canonical '{canonical}' (in "
            "this space), which switches the fluid model on"
        )


# MuJoCo fields whose rows are unit vectors (normalized when MuJoCo compiles a model)
UNIT_ROWS = ("jnt_axis", "body_quat", "body_iquat", "geom_quat", "site_quat", "cam_quat")

# Raw fields of the model's pose at qpos0 from which MuJoCo's compiler derives more
# than the inverse weights metarl derives (`_pose_constants`)
_POSE_INPUTS = (
    *("body_pos", "body_quat", "jnt_pos", "jnt_axis", "qpos0", "site_pos", "site_quat"),
    "wrap_prm",
)
_EQ_CONNECT, _EQ_WELD = int(mujoco.mjtEq.mjEQ_CONNECT), int(mujoco.mjtEq.mjEQ_WELD)
_MUSCLE = int(mujoco.mjtGain.mjGAIN_MUSCLE)
_TRN_JOINT = int(mujoco.mjtTrn.mjTRN_JOINT)


def _pose_constants(sys: System) -> str | None:
    """Why a raw path into the pose is refused on `sys`, or None: MuJoCo's compiler
    derives constants from the pose at qpos0 that metarl does not recompute (it derives
    the solver's inverse weights and a muscle's acc0 alone). Found by compiling models
    with the pose moved in `mujoco.MjSpec` (2026-12-07): a tendon spring's rest length
    (a pendulum at rest swung 0.48 rad), a connect's anchor (the bodies pulled back
    to the loaded distance, 0.50 for 0.70), a tendon equality's reference lengths."""
    eq = np.asarray(getattr(sys, "eq_type", ()))
    pairs = np.stack([np.asarray(sys.eq_obj1id), np.asarray(sys.eq_obj2id)])[:, eq == _EQ_TENDON]
    muscles = np.asarray(sys.actuator_gaintype) == _MUSCLE
    reasons = {
        "tendon equalities (tendon_length0, their reference)": sorted(
            set(pairs[pairs >= 0].tolist())
        ),
        "connect and weld equalities (eq_data: the anchor, the relative pose)": np.flatnonzero(
            (eq == _EQ_CONNECT) | (eq == _EQ_WELD)
        ).tolist(),
        "tendon springs (tendon_lengthspring: the length at rest)": np.flatnonzero(
            np.asarray(sys.tendon_stiffness) > 0
        ).tolist(),
        "muscles on tendons or sites (actuator_lengthrange)": np.flatnonzero(
            muscles & (np.asarray(sys.actuator_trntype) != _TRN_JOINT)
        ).tolist(),
    }
    found = [f"{what} {ids}" for what, ids in reasons.items() if len(ids)]
    if not found:
        return None
    return (
        f"the model has {'; '.join(found)}, constants MuJoCo computes from the pose at qpos0 "
        "when it compiles the model, which metarl does not recompute: they would keep the "
        "loaded pose's values"
    )


def _free_bodies(sys: System, backend: str) -> dict[int, str]:
    """Bodies on a free joint: MuJoCo's compiler writes their pose into qpos0 and the
    step reads the joint's qpos alone (a box's body_pos moved: it reset where it was)."""
    free = np.asarray(sys.jnt_bodyid)[np.asarray(sys.jnt_type) == int(mujoco.mjtJoint.mjJNT_FREE)]
    why = (
        "a free joint places it: its pose is the joint's qpos, which MuJoCo starts at this "
        "pose by writing it into qpos0 when it compiles (an MjcfEnv resets there)"
    )
    return dict.fromkeys(free.tolist(), why)


def _muscle_targets(trntype: int):
    """{row: why} of the joints (or tendons) a muscle pulls: MuJoCo's compiler derives
    the muscle's length range from their ranges (a raw jnt_range [-0.5, 0.5] left it
    [-1, 1]: the muscle's force 1.5x off)."""

    def rows(sys: System, backend: str) -> dict[int, str]:
        pulled = (np.asarray(sys.actuator_gaintype) == _MUSCLE) & (
            np.asarray(sys.actuator_trntype) == trntype
        )
        why = "a muscle pulls it, whose length range MuJoCo derives from this range"
        return dict.fromkeys(np.asarray(sys.actuator_trnid)[pulled, 0].tolist(), why)

    return rows


def _muscle_gears(sys: System, backend: str) -> dict[int, str]:
    """Muscles: their length range follows the gear (canonical 'actuator_gain' scales
    both; a raw gear x2 left it, the muscle's force 6x off)."""
    why = "it is a muscle, whose length range MuJoCo derives from the gear: vary 'actuator_gain'"
    return dict.fromkeys(np.flatnonzero(np.asarray(sys.actuator_gaintype) == _MUSCLE).tolist(), why)


def _simple(sys: System, backend: str) -> dict[int, str]:
    return {b + 1: why for b, why in _simple_bodies(sys, backend).items()}


# Rows of raw fields that a raw path must not write: {field: (sys, backend) -> {row: why}}
_ROW_CHECKS = {
    "body_pos": _free_bodies,
    "body_quat": _free_bodies,
    "body_ipos": _simple,  # as 'com_offset' (a raw path got around its refusal)
    "body_iquat": _simple,
    "geom_pos": _wrapped_with_constants,  # as 'geom_size' (the tendon's path moves)
    "geom_quat": _wrapped_with_constants,
    "actuator_gear": _muscle_gears,
    "jnt_range": _muscle_targets(_TRN_JOINT),
    "tendon_range": _muscle_targets(int(mujoco.mjtTrn.mjTRN_TENDON)),
}


def _refused_rows(raw: paths.RawPath, sys: System, backend: str) -> str | None:
    """Why the rows `raw` selects are refused (`_ROW_CHECKS`), or None."""
    refused = _ROW_CHECKS[raw.field](sys, backend)
    hit = {r: refused[r] for r in _rows(raw, sys) or () if r in refused}
    if not hit:
        return None
    return "; ".join(f"row {r}: {why}" for r, why in hit.items()) + "; select the other rows"


def _rows(raw: paths.RawPath, sys: System) -> list[int] | None:
    """The rows (first index) of its field that `raw` selects, or None for an index
    that `paths.resolve` will refuse with its own message."""
    shape = np.shape(raw.read(sys))
    try:
        rows = np.broadcast_to(np.arange(shape[0]).reshape((-1,) + (1,) * (len(shape) - 1)), shape)
        return sorted(set(np.ravel(rows[raw.index]).tolist()))
    except (IndexError, ValueError):
        return None


def _unlimited_joints(raw: paths.RawPath, sys: System, backend: str) -> str | None:
    """Why a raw path into `jnt_range` changes nothing, or None: MJX builds joint
    limits only for joints the model marks limited (jnt_limited, fixed when loaded)."""
    limited = getattr(sys, "jnt_limited", None)
    if backend != "mjx" or limited is None:
        return None
    rows = _rows(raw, sys)
    if not rows or np.asarray(limited)[rows].any():
        return None
    return (
        f"joints {rows} are not limited (jnt_limited 0, fixed when the model loads), so "
        "MJX builds no limit from their range; mark them limited in the model "
        '(limited="true" range="...")'
    )


def _fluid_on(sys: System) -> bool:
    """Whether MJX's step reads the fluid parameters (Brax's own backends never do:
    `reads` refuses the raw paths there)."""
    impl = getattr(getattr(sys, "opt", None), "_impl", None)
    return bool(getattr(impl, "has_fluid_params", True))


def _unread_friction_columns(raw: paths.RawPath, sys: System, backend: str) -> str | None:
    """Why a raw path into `geom_friction` that selects only its torsional (1) and
    rolling (2) columns changes nothing, or None: Brax's own backends read the sliding
    coefficient (column 0) alone, and MuJoCo's contacts read column 1 only at
    condim >= 4 and column 2 at condim 6 (the README's own example once varied
    hopper's torsional friction on the generalized backend: nothing changed)."""
    shape = np.shape(raw.read(sys))
    try:
        columns = set(np.broadcast_to(np.arange(shape[-1]), shape)[raw.index].ravel().tolist())
    except (IndexError, ValueError):  # `paths.resolve` names a bad index
        return None
    if not columns or 0 in columns:
        return None
    if backend != "mjx":
        return (
            f"the {backend!r} backend reads the sliding friction (column 0) alone, not the "
            "torsional or rolling one (columns 1, 2): vary 'friction', or use backend='mjx' "
            "with geoms of condim 4 or 6"
        )
    condim = int(np.max(np.asarray(sys.geom_condim), initial=0))
    needs = {1: 4, 2: 6}
    unread = sorted(c for c in columns if condim < needs[c])
    if len(unread) < len(columns):
        return None
    return (
        f"no geom has the condim its columns {unread} need (torsional: 4, rolling: 6; the "
        f"largest here is {condim}), so no contact reads them"
    )


def _live_selection(
    name: str, q: Quantity, sys: System, backend: str, select: np.ndarray | None
) -> np.ndarray | None:
    """The elements entry `name` writes: `select`, or for an entry that names none
    and a quantity that skips dead elements, the live ones (None: all elements).
    Refuses elements the physics never reads (a silent no-op otherwise): a named
    dead element, an entry without live elements, and an entry without names over
    dead elements of a quantity that does not skip them; and frozen elements
    (`Quantity.frozen`), named or not."""
    return _without_frozen(name, q, sys, backend, _live(name, q, sys, backend, select))


def _without_frozen(
    name: str, q: Quantity, sys: System, backend: str, select: np.ndarray | None
) -> np.ndarray | None:
    """`select` (None: every element), refused where it chooses an element that
    `q.frozen` names: one whose derived constants metarl would leave stale."""
    frozen = q.frozen(sys, backend)
    if not frozen:
        return select
    labels = element_names.element_names(sys, q.elements)
    chosen = [int(i) for i in (range(len(labels)) if select is None else select)]
    if not (bad := [i for i in chosen if i in frozen]):
        return select
    reasons = "; ".join(f"{labels[i] or f'index {i}'}: {frozen[i]}" for i in bad)
    usable = [labels[i] or str(i) for i in chosen if i not in frozen]
    base = element_names.split(name)[0]
    hint = f"; choose the others by name: '{base}[{', '.join(usable)}]'" if usable else ""
    raise ValueError(f"context {name!r}: {q.elements} {reasons}{hint}")


def _live(
    name: str, q: Quantity, sys: System, backend: str, select: np.ndarray | None
) -> np.ndarray | None:
    if q.live is None:
        return select
    live = np.asarray(q.live(sys, backend), bool)
    if select is None and q.skip_dead and live.any():
        return None if live.all() else np.flatnonzero(live).astype(np.int32)
    chosen = np.arange(live.shape[0]) if select is None else select
    dead = [int(i) for i in chosen if not live[i]]
    if not dead:
        return select
    labels = element_names.element_names(sys, q.elements)
    shown = [labels[i] or f"index {i}" for i in dead]
    usable = [labels[i] or str(i) for i in np.flatnonzero(live)]
    base = element_names.split(name)[0]
    hint = (
        f"choose the others by name: '{base}[{', '.join(usable)}]'"
        + (f" (or '{base}' alone, which varies them all)" if q.skip_dead else "")
        if usable
        else "no element of this model can take it"
    )
    raise ValueError(
        f"context {name!r}: {q.elements} {', '.join(shown)} would not change: {q.dead_hint}; {hint}"
    )


def _zero_rows(default: np.ndarray) -> np.ndarray:
    """Indices of the elements whose default is 0 in every component."""
    default = np.asarray(default)
    if default.ndim == 0:
        return np.zeros((0,), np.int64)
    return np.flatnonzero(~np.reshape(default != 0, (default.shape[0], -1)).any(axis=1))


def _zero_default_message(
    name: str, target: Any, select: np.ndarray | None, sys: System, default: np.ndarray
) -> str:
    """Why a relative per-element entry over some elements whose default is 0 is
    refused: each such element's own draw would multiply 0 and change nothing."""
    zero = _zero_rows(default)
    base = element_names.split(name)[0]
    if isinstance(target, Quantity) and target.elements in element_names.SELECTABLE:
        labels = element_names.element_names(sys, target.elements)
        index = np.arange(len(labels)) if select is None else select
        shown = [labels[index[i]] or f"index {index[i]}" for i in zero]
        usable = [labels[index[i]] for i in range(len(index)) if i not in set(zero)]
        hint = (
            f"name the others ('{base}[{', '.join(usable)}]'), "
            if all(usable) and len(set(usable)) == len(usable)
            else ""
        )
        what = f"{target.elements} {', '.join(shown)}"
    else:
        what, hint = f"elements {zero.tolist()}", ""
    return (
        f"context {name!r}: {what} have default 0 in this env, so a relative scale drawn "
        f"for each element would change nothing there; {hint}use absolute values "
        "(relative=False), or one shared scale (per_element=False)"
    )


def _labels(
    target: Any, select: np.ndarray | None, sys: System, shape: tuple[int, ...]
) -> tuple[str, ...] | None:
    """The names of the elements a quantity's entry writes, in the order its values
    take (a selection's own order); None where they have no names."""
    if not isinstance(target, Quantity) or target.elements not in element_names.SELECTABLE:
        return None
    names = element_names.element_names(sys, target.elements)
    index = range(len(names)) if select is None else select
    if not shape or shape[0] != len(index):
        return None
    return tuple(names[i] or f"index {i}" for i in index)


def _check_values(e: _Entry, dist: Distribution) -> None:
    """The distribution's own rules (as at construction: ranges rebuilt by JAX skip
    it), shapes that fit the field, values that stay physical."""
    try:  # NaN locations only where they mean "each element's own default"
        dist.validate(defaults_pin=e.mixed_default)
    except ValueError as err:
        raise ValueError(f"context {e.name!r}: {err}") from None
    for field, value in dist.numbers().items():
        if isinstance(dist, Choice):
            continue  # values/probs are lists over choices, not over elements
        shape = np.shape(value)
        allowed = {(), e.shape} if dist.per_element else {()}
        if shape not in allowed:
            what = (
                f"one value or one per element {e.shape}" if dist.per_element else "a single number"
            )
            order = f": {', '.join(e.labels)}" if e.labels else ""
            order += ", in this order" if e.labels and len(e.labels) > 1 else ""
            raise ValueError(
                f"context {e.name!r}: {type(dist).__name__}.{field} has shape {shape}, which "
                f"does not fit the field (element shape {e.shape}{order}); expected {what}"
                + ("" if dist.per_element else "; pass per_element=True for per-element values")
            )
    lower, strict, units = _limit(e.target)
    if lower is None:
        return
    low, high = dist.support()
    worst = float(np.min(low))
    bad = worst <= lower if strict else worst < lower
    if bad:
        op = ">" if strict else ">="
        unit = "scale factors" if dist.relative else f"values ({units})"
        if np.array_equal(low, high) or isinstance(dist, Choice):  # evaluated points too
            fix = "Use values that keep it physical"
        elif isinstance(dist, Normal):
            fix = "A Normal is unbounded: use Uniform, LogUniform or TruncatedNormal"
        else:
            fix = "Use bounds that keep it physical"
        raise ValueError(
            f"context {e.name!r}: {type(dist).__name__} can produce {worst:g}, but {e.name} "
            f"{unit} must be {op} {lower:g}. {fix}"
        )


# Physical limits of raw System fields: (lower bound, strict). Same limits as the
# canonical quantities that write these fields.
def _limit(target: Quantity | paths.RawPath | TaskParam) -> tuple[float | None, bool, str]:
    """(lower limit or None, whether it is exclusive, units) of a context's target: a
    quantity's own, `RAW_LIMITS` for a raw path, none for a task parameter (the env's
    reset and step take any value)."""
    if isinstance(target, Quantity):
        return target.lower, target.strict, target.units
    if isinstance(target, paths.RawPath):
        return (*RAW_LIMITS.get(target.field, (None, False)), "System units")
    return None, False, ""


RAW_LIMITS = {
    **dict.fromkeys(
        (
            "link.inertia.mass",
            "body_mass",
            # the inertia tensor (Brax) and its principal moments (MuJoCo): a loaded
            # model's tensor is diagonal (principal axes), so no element may go <= 0
            "link.inertia.i",
            "body_inertia",
            "opt.timestep",
            "geom_size",
            "geom_rbound",
        ),
        (0.0, True),
    ),
    **dict.fromkeys(
        (
            "geom_friction",
            "pair_friction",
            "dof.damping",
            "dof_damping",
            "dof.armature",
            "dof_armature",
            "dof.stiffness",
            "jnt_stiffness",
            "dof_frictionloss",
            "opt.viscosity",
            "opt.density",
            "elasticity",
        ),
        (0.0, False),
    ),
}


def _written(e: _Entry, sys: System) -> dict[str, np.ndarray]:
    """{System leaf path: mask of the elements entry `e` writes}.

    A raw path writes exactly the elements its index selects of its one field.
    A quantity writes several copies and derived fields: found by writing a
    perturbed value and comparing, twice: on the System as loaded and on one
    with every float shifted by 0.5, so that an element whose default is 0 (a
    relative draw writes 0 there, which the loaded System already holds) still
    shows as written."""
    if isinstance(e.target, paths.RawPath):
        mask = np.zeros(np.shape(e.target.read(sys)), bool)
        mask[e.target.index] = True
        return {"." + e.target.field: mask}
    probe = np.full(e.draw_shape, 1.37 if e.relative else 0.0, np.float32)
    if not e.relative:
        probe = np.asarray(e.default * 1.37 + 0.71, np.float32).reshape(e.shape)
        probe = probe if e.per_element else probe.reshape(-1)[:1].reshape(())
    shifted = jax.tree.map(
        lambda x: x + 0.5 if hasattr(x, "dtype") and np.issubdtype(x.dtype, np.floating) else x,
        sys,
    )
    out: dict[str, np.ndarray] = {}
    for base in (sys, shifted):
        after = e.write(base, jnp.asarray(probe))
        before = dict(jax.tree_util.tree_flatten_with_path(base)[0])
        for path, new in jax.tree_util.tree_flatten_with_path(after)[0]:
            old = before.get(path)
            if old is None or not hasattr(new, "shape") or np.shape(old) != np.shape(new):
                continue
            mask = np.asarray(old) != np.asarray(new)
            if mask.any():
                key = jax.tree_util.keystr(path)
                out[key] = out.get(key, False) | mask
    return out


def _check_derived(binding: Binding) -> None:
    """Refuses a raw path whose field the binding derives (`SETCONST_OUTPUT`: the other
    contexts' inverse weights would overwrite its draw, until 2026-12-07 silently), and,
    on generalized, a raw path into a Brax copy of the pose no MuJoCo field holds
    (`BRAX_POSE_UNTWINNED`: the inverse weights would stay the loaded model's)."""
    raw = [e for e in binding.entries if isinstance(e.target, paths.RawPath)]
    groups = binding.derives
    for e in raw:
        field = e.target.field
        for group in groups:
            if field in SETCONST_OUTPUT[group]:
                others = [x.name for x in binding.entries if x is not e]
                raise ValueError(
                    f"context {e.name!r}: {field} is derived from the model (MuJoCo's "
                    "mj_setConst) where a context changes the masses, inertias, pose or "
                    f"armatures (here among {', '.join(map(repr, others))}), so its draw "
                    "would be overwritten: vary it in a space without those, or leave it out"
                )
        if binding.backend == "generalized" and field in BRAX_POSE_UNTWINNED:
            raise ValueError(
                f"context {e.name!r}: Brax derived the constraint solver's inverse weights "
                f"(link.invweight, dof.invweight) from the model's pose at load, and no "
                f"MuJoCo field holds {field} one to one, so they would stay the loaded "
                "model's; vary jnt_pos or jnt_axis on backend='mjx', where metarl derives "
                "them"
            )


def _check_overlaps(entries: list[_Entry], sys: System) -> None:
    """A raw path that writes the same elements of a System field as another name
    would fight with it (one overwrites the other): refuse, as for one canonical
    quantity named twice over the same elements ("mass" and "mass[torso]").
    Different canonical quantities are designed to compose (mass and inertia both
    scale the inertia tensor)."""
    for i, e in enumerate(entries):  # one quantity twice: its selections must not overlap
        for other in entries[:i]:
            if isinstance(e.target, Quantity) and e.target is other.target:
                mine, theirs = (
                    set(range(10**6)) if x.select is None else set(x.select.tolist())
                    for x in (e, other)
                )
                if mine & theirs:
                    raise ValueError(
                        f"contexts {other.name!r} and {e.name!r} both write the same elements "
                        "of one quantity (one would overwrite the other): keep one of them"
                    )
    if not any(isinstance(e.target, paths.RawPath) for e in entries):
        return  # quantities compose and task parameters write no field: nothing can fight
    seen: dict[str, list[tuple[_Entry, np.ndarray]]] = {}
    for e in entries:
        for field, mask in _written(e, sys).items():
            for other, other_mask in seen.get(field, []):
                both_canonical = isinstance(e.target, Quantity) and isinstance(
                    other.target, Quantity
                )
                if not both_canonical and np.any(mask & other_mask):
                    raise ValueError(
                        f"contexts {other.name!r} and {e.name!r} both write System field "
                        f"{field.lstrip('.')} (the same elements): keep one of them"
                    )
            seen.setdefault(field, []).append((e, mask))


def bind(
    space: ContextSpace,
    sys: System,
    backend: str,
    task: Mapping[str, Any] | None = None,
    stale: Mapping[str, str] | None = None,
) -> Binding:
    """Resolves every name of `space` for `backend`; raises ValueError on any problem.

    `sys` is a Brax System or an mjx.Model; `task` the env's own task parameters
    ({name: default}); `stale` maps quantity names and raw fields the env caches at
    construction (so changing them would go stale) to the reason they are refused, and
    `MOCAP_POSE` to why the rows of `body_pos` and `body_quat` of mocap bodies are.
    """
    task = dict(task or {})
    stale = dict(stale or {})
    impl = getattr(getattr(sys, "impl", None), "name", "JAX")
    if impl != "JAX":  # the constants a context derives are computed with MJX's JAX code
        raise ValueError(
            f"this model runs MJX's {impl.lower()!r} implementation; metarl writes contexts "
            "into the model and derives their constants with MJX's JAX implementation: build "
            "the env with impl='jax'"
        )
    clash = sorted(set(task) & set(QUANTITIES))
    if clash:
        raise ValueError(f"task parameters {clash} shadow canonical quantities: rename them")
    if not isinstance(space, ContextSpace):
        if isinstance(space, Mapping):
            space = ContextSpace(space)
        else:
            raise ValueError(f"expected a ContextSpace, got {type(space).__name__}")
    entries = []
    for name, dist in space.items():
        target, default, select, sys = _resolve(name, sys, backend, task, stale)
        if isinstance(target, Quantity):
            if not dist.relative and not target.absolute:
                raise ValueError(
                    f"context {name!r} only takes scale factors of the default: pass "
                    "relative=True (or use Scale(low, high))"
                )
        shape = tuple(np.shape(default))
        if dist.per_element and shape == ():
            raise ValueError(
                f"context {name!r} is a single value; per_element=True does not apply to it"
            )
        if dist.relative and np.all(default == 0):
            raise ValueError(
                f"context {name!r}: its default is 0 everywhere in this env, so a relative "
                "scale would change nothing; use absolute values (relative=False)"
            )
        if dist.relative and dist.per_element and len(_zero_rows(default)):
            raise ValueError(_zero_default_message(name, target, select, sys, default))
        if isinstance(target, TaskParam):
            _check_discrete_task(name, dist, task[name])
        entry = _Entry(
            name,
            target,
            shape,
            np.asarray(default, np.float32),
            dist.relative,
            dist.per_element,
            select,
            _labels(target, select, sys, shape),
        )
        _check_values(entry, dist)
        entries.append(entry)
    _check_fluid(entries, sys)
    if len(entries) > 1:
        _check_overlaps(entries, sys)
    binding = Binding(space=space, backend=backend, sys=sys, entries=tuple(entries), task=task)
    _check_derived(binding)
    # Computed here, where no trace is open: first asked for inside a reset's trace,
    # it folded each of MJX's constants in a program of its own (about 145 small
    # compiles, 3.5 s for hopper on 2 CPU cores) before compiling its own.
    binding._setconst_basis  # noqa: B018
    return binding
