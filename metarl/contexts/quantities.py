"""Canonical physical quantities, and how each writes the System.

Brax's `System` subclasses `mjx.Model` and so holds two copies of many
parameters; each backend reads only one (measured: `metarl.contexts.reads`). Every setter
here writes *both* copies, so that env code reading the other copy (humanoid's
observed centre of mass reads `link.inertia` on every backend) stays
consistent, and it updates the derived quantities that would otherwise go
stale:

* mass: inertia tensors scale with the mass (a scaled body keeps its shape),
  `link.invweight`, `dof.invweight`, `body_invweight0` and `dof_invweight0` are
  divided by the same ratio (exact for a single body, first-order for chains),
  and `body_subtreemass` is recomputed exactly.
* geom_size: `geom_rbound` and `geom_aabb` scale with the size, so broad-phase
  collision culling stays right. Masses are *not* recomputed from the new
  volume (MuJoCo does that only at compile time): vary `mass` as well if the
  bodies should get heavier.

A setter receives the *current* System (other quantities may already have
been applied) and the new per-element values, never a Python constant.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax.numpy as jnp
import numpy as np
from brax.base import System

BACKENDS = ("generalized", "mjx", "positional", "spring")
_ALL = frozenset(BACKENDS)
_JOINT_BACKENDS = frozenset({"generalized", "mjx"})


@dataclasses.dataclass(frozen=True)
class Quantity:
    """A canonical context quantity.

    Attributes:
      elements: what one element is ("bodies", "geoms", ...), or "" for a scalar.
      default: System -> default values, shape () or (n,) (numpy, float32).
      apply: (sys, new_values) -> sys, writing every copy the backends read.
      lower / strict: values must be > lower (strict) or >= lower; None: any sign.
      absolute: whether absolute values make sense (False: only scale factors).
      backends: backends that simulate it; `unsupported_hint` says what to do elsewhere.
      requires: extra check (sys, backend) -> error message or None.
      prepare: (sys, backend) -> sys, run once at bind time (switches, ...).
    """

    units: str
    elements: str
    default: Callable[[System], np.ndarray]
    apply: Callable[[System, jnp.ndarray], System]
    lower: float | None = 0.0
    strict: bool = False
    absolute: bool = True
    backends: frozenset = _ALL
    unsupported_hint: str = ""
    requires: Callable[[System, str], str | None] = lambda sys, backend: None
    prepare: Callable[[System, str], System] = lambda sys, backend: sys


def _f32(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32)


# ---- gravity: the magnitude, along the loaded direction ----
def _gravity_default(sys):
    return _f32(np.linalg.norm(np.asarray(sys.opt.gravity, np.float64)))


def _gravity_apply(sys, g):
    g0 = _gravity_default(sys)
    if g0 == 0:  # no loaded direction: point down
        vec = jnp.array([0.0, 0.0, -1.0]) * g
        return sys.tree_replace({"gravity": vec, "opt.gravity": vec})
    ratio = g / g0
    return sys.tree_replace(
        {"gravity": sys.gravity * ratio, "opt.gravity": sys.opt.gravity * ratio}
    )


# ---- mass: per body (world excluded); inertia and inverse weights follow ----
def _mass_apply(sys, m):
    m0 = sys.link.inertia.mass
    ratio = jnp.where(m0 > 0, m / jnp.where(m0 > 0, m0, 1.0), 1.0)
    return _scale_inertia(sys, ratio, translational=True).tree_replace(
        {
            "link.inertia.mass": m,
            "body_mass": sys.body_mass.at[1:].set(m),
            "body_subtreemass": sys.body_subtreemass
            + jnp.asarray(_subtree_matrix(sys)[:, 1:]) @ (m - m0),
        }
    )


def _scale_inertia(sys, ratio, translational):
    """Scales inertia tensors by `ratio` per body, inverse weights by 1/ratio."""
    body = np.asarray(sys.dof_bodyid) - 1
    fields = {
        "link.inertia.i": sys.link.inertia.i * ratio[:, None, None],
        "body_inertia": sys.body_inertia.at[1:].multiply(ratio[:, None]),
        "body_invweight0": sys.body_invweight0.at[1:, 1].divide(ratio),
        "dof.invweight": sys.dof.invweight / ratio[body],
        "dof_invweight0": sys.dof_invweight0 / ratio[body],
    }
    if translational:
        fields["link.invweight"] = sys.link.invweight / ratio
        fields["body_invweight0"] = fields["body_invweight0"].at[1:, 0].divide(ratio)
    return sys.tree_replace(fields)


def _subtree_matrix(sys) -> np.ndarray:
    """A[i, j] = 1 where body j is in the subtree of body i."""
    parent = np.asarray(sys.body_parentid)
    n = parent.shape[0]
    a = np.eye(n, dtype=np.float32)
    for j in range(1, n):
        i = parent[j]
        while True:
            a[i, j] = 1.0
            if i == 0:
                break
            i = parent[i]
    return a


def spring_scale_check(field: str, quantity: str):
    """A `requires` check: `quantity` does nothing on positional/spring where `field` >= 1."""

    def check(sys, backend):
        if backend in ("positional", "spring") and float(getattr(sys, field)) >= 1.0:
            return (
                f"'{quantity}' changes nothing on the {backend!r} backend for this env: its "
                f"{field} is {float(getattr(sys, field))}, which replaces every {quantity} by 1. "
                f"Use backend='generalized' or 'mjx'."
            )
        return None

    return check


# ---- per-dof and per-joint fields ----
def _dof_field(brax_path, mjx_field):
    def default(sys):
        return _f32(getattr(sys, mjx_field))

    def apply(sys, v):
        return sys.tree_replace({brax_path: v, mjx_field: v})

    return default, apply


def _stiffness_apply(sys, v):
    return sys.tree_replace({"jnt_stiffness": v, "dof.stiffness": v[np.asarray(sys.dof_jntid)]})


def _gain_apply(sys, v):
    return sys.tree_replace(
        {"actuator.gear": v, "actuator_gear": sys.actuator_gear.at[:, 0].set(v)}
    )


def _geom_size_apply(sys, s):
    return sys.tree_replace(
        {
            "geom_size": sys.geom_size * s[:, None],
            "geom_rbound": sys.geom_rbound * s,
            "geom_aabb": sys.geom_aabb * s[:, None],
        }
    )


def _enable_fluid(sys, backend):
    impl = sys.opt._impl.replace(has_fluid_params=True)
    return sys.replace(opt=sys.opt.replace(_impl=impl))


def _fluid_field(name):
    def default(sys):
        return _f32(getattr(sys.opt, name))

    def apply(sys, v):
        return sys.tree_replace({f"opt.{name}": v, name: v})

    return default, apply


_FLUID_HINT = (
    "Brax's own fluid model sits behind a static switch and crashes with JAX 0.10; "
    "use backend='mjx', where metarl switches MuJoCo's fluid model on."
)
_JOINT_HINT = (
    "the positional and spring backends ignore per-joint {name}; their global "
    "damping fields are available as raw paths 'vel_damping' and 'ang_damping'."
)

_damping = _dof_field("dof.damping", "dof_damping")
_armature = _dof_field("dof.armature", "dof_armature")
_viscosity = _fluid_field("viscosity")
_density = _fluid_field("density")

QUANTITIES: dict[str, Quantity] = {
    "gravity": Quantity(units="m/s^2", elements="", default=_gravity_default, apply=_gravity_apply),
    "mass": Quantity(
        units="kg",
        elements="bodies",
        default=lambda sys: _f32(sys.link.inertia.mass),
        apply=_mass_apply,
        strict=True,
        requires=spring_scale_check("spring_mass_scale", "mass"),
    ),
    "inertia": Quantity(
        units="x default",
        elements="bodies",
        default=lambda sys: np.ones(sys.num_links(), np.float32),
        apply=lambda sys, r: _scale_inertia(sys, r, translational=False),
        strict=True,
        absolute=False,
        requires=spring_scale_check("spring_inertia_scale", "inertia"),
    ),
    "friction": Quantity(
        units="coefficient",
        elements="geoms",
        default=lambda sys: _f32(sys.geom_friction[:, 0]),
        apply=lambda sys, v: sys.tree_replace({"geom_friction": sys.geom_friction.at[:, 0].set(v)}),
    ),
    "damping": Quantity(
        units="N m s/rad",
        elements="dofs",
        default=_damping[0],
        apply=_damping[1],
        backends=_JOINT_BACKENDS,
        unsupported_hint=_JOINT_HINT.format(name="damping"),
    ),
    "armature": Quantity(
        units="kg m^2",
        elements="dofs",
        default=_armature[0],
        apply=_armature[1],
        backends=_JOINT_BACKENDS,
        unsupported_hint=_JOINT_HINT.format(name="armature"),
    ),
    "stiffness": Quantity(
        units="N m/rad",
        elements="joints",
        default=lambda sys: _f32(sys.jnt_stiffness),
        apply=_stiffness_apply,
        backends=_JOINT_BACKENDS,
        unsupported_hint=_JOINT_HINT.format(name="stiffness"),
    ),
    "actuator_gain": Quantity(
        units="gear",
        elements="actuators",
        default=lambda sys: _f32(sys.actuator_gear[:, 0]),
        apply=_gain_apply,
        lower=None,
    ),
    "geom_size": Quantity(
        units="x default",
        elements="geoms",
        default=lambda sys: np.ones(sys.ngeom, np.float32),
        apply=_geom_size_apply,
        strict=True,
        absolute=False,
    ),
    "viscosity": Quantity(
        units="Pa s",
        elements="",
        default=_viscosity[0],
        apply=_viscosity[1],
        backends=frozenset({"mjx"}),
        unsupported_hint=_FLUID_HINT,
        prepare=_enable_fluid,
    ),
    "density": Quantity(
        units="kg/m^3",
        elements="",
        default=_density[0],
        apply=_density[1],
        backends=frozenset({"mjx"}),
        unsupported_hint=_FLUID_HINT,
        prepare=_enable_fluid,
    ),
    "timestep": Quantity(
        units="s",
        elements="",
        default=lambda sys: _f32(sys.opt.timestep),
        apply=lambda sys, v: sys.tree_replace({"opt.timestep": v}),
        strict=True,
    ),
    "elasticity": Quantity(
        units="restitution",
        elements="geoms",
        default=lambda sys: _f32(sys.elasticity),
        apply=lambda sys, v: sys.tree_replace({"elasticity": v}),
        backends=frozenset({"positional", "spring"}),
        unsupported_hint="only the positional and spring backends model restitution.",
    ),
}
