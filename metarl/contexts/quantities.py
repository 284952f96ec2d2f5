"""Canonical physical quantities, and how each writes the System.

Brax's `System` subclasses `mjx.Model` and so holds two copies of many
parameters; each backend reads only one (measured: `metarl.contexts.reads`). Every setter
here writes *both* copies, so that env code reading the other copy (humanoid's
observed centre of mass reads `link.inertia` on every backend) stays
consistent, and it updates the derived quantities that would otherwise go
stale:

* mass: inertia tensors scale with the mass (a scaled body keeps its shape),
  `link.invweight`, `dof.invweight`, `body_invweight0` and `dof_invweight0` are
  divided by the same ratio (exact for a single body without armature, first-order for chains),
  and `body_subtreemass` is recomputed exactly.
* inertia: inertia tensors and the rotational inverse weights
  (`body_invweight0[:, 1]`, and `dof_invweight0` / `dof.invweight` of hinge,
  ball and the rotational half of free joints); translational dofs keep theirs
  (MuJoCo's `mj_setConst` gives the same for a single body).
* The exact inverse weights for mass, inertia, armature and com_offset together
  (what `mj_setConst` computes, tendons included), and a muscle's `actuator_acc0`
  under those and actuator_gain, are `setconst`'s; `Binding.derive` computes them
  once per drawn context and `Binding.apply` writes them over the setters'
  first-order ones (`write_setconst`).
* actuator_gain: the gear, and `actuator_lengthrange` with it (an actuator's length
  is linear in its gear; MuJoCo computes a muscle's range at compile time).
* geom_size: `geom_rbound` and `geom_aabb` scale with the size, so broad-phase
  collision culling stays right. Masses are *not* recomputed from the new
  volume (MuJoCo does that only at compile time): vary `mass` as well if the
  bodies should get heavier.

The same quantities apply to a plain `mjx.Model` (MuJoCo Playground envs and
a user's own MJCF), where only the MuJoCo copies exist: setters write the
Brax-only copies only when the model is a Brax `System`.

A setter receives the *current* model (other quantities may already have
been applied) and the new per-element values, never a Python constant;
`default` works on traced models too (name selection reads the current
values of the elements it leaves alone).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
from brax.base import System

from metarl import brax_fluid
from metarl.contexts import names as element_names

# Brax's fluid model (Brax's swimmer; 'viscosity' and 'density' on its own backends)
# steps on this JAX: `metarl.brax_fluid`
brax_fluid.install()

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
      prepare: (sys, backend) -> sys, run once at bind time, before the default is read
        (switches, aligning a copy only some backends read, ...).
      live: (sys, backend) -> bool mask of the elements the physics reads at all
        (None: all). MJX builds some constraint rows only where the loaded value is
        nonzero, a geom that collides with nothing has no contact to read its
        friction, a model's <flag> can switch contacts or constraints off;
        varying such an element would be a silent no-op, so naming it is refused.
      dead_hint: why an element is not live, for that error.
      through_contacts: it acts only through active contacts (a friction, a
        restitution): `check_env` can see it reach the physics only in states where
        some contact is active, and says so when none was.
      frozen: (sys, backend) -> {element index: why}, elements the simulation reads
        but that a context must not change, because the model holds constants
        derived from them that metarl does not recompute; choosing one (by name or
        through an entry that names none) is refused with the reason.
      skip_dead: what an entry that names no elements means when some are not
        live. True: the live ones (the others keep their values; refused only
        when none is live), for quantities a dead element has no use for (the
        friction of a geom that never touches anything). False: refused, for
        quantities a user could expect every element to take (frictionloss).
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
    live: Callable[[System, str], np.ndarray] | None = None
    dead_hint: str = ""
    skip_dead: bool = False
    through_contacts: bool = False
    frozen: Callable[[System, str], dict[int, str]] = lambda sys, backend: {}


def _f32(x) -> jnp.ndarray:
    return jnp.asarray(x, dtype=jnp.float32)


def _brax(sys) -> bool:
    """True for a Brax System (two copies of many fields), False for a plain mjx.Model."""
    return isinstance(sys, System)


# ---- gravity: the magnitude, along the loaded direction ----
def _gravity_default(sys):
    return np.float32(np.linalg.norm(np.asarray(sys.opt.gravity, np.float64)))


def _gravity_apply(sys, g):
    g0 = _gravity_default(sys)
    if g0 == 0:  # no loaded direction: point down
        opt = brax = jnp.array([0.0, 0.0, -1.0]) * g
    else:
        opt = sys.opt.gravity * (g / g0)
        brax = sys.gravity * (g / g0) if _brax(sys) else None
    fields = {"opt.gravity": opt}
    if _brax(sys):  # a plain mjx.Model has only the MuJoCo copy
        fields["gravity"] = brax
    return sys.tree_replace(fields)


def _gravity_check(sys, backend):
    if backend == "mjx" and _disabled(sys, mujoco.mjtDisableBit.mjDSBL_GRAVITY):
        return (
            "'gravity' changes nothing here: the model switches gravity off "
            '(<flag gravity="disable"/>), which MJX honours'
        )
    if _across_gravity(sys):
        return (
            "'gravity' changes nothing here: every joint moves its body at right angles to "
            "gravity (hinges about the gravity axis, slides across it: a planar arm, a "
            "swimmer, a point mass on a table), so no dof ever feels it"
        )
    return None


def _across_gravity(sys) -> bool:
    """Whether no joint can move any body along gravity, in any pose: every joint a
    hinge about the gravity axis or a slide at right angles to it (at the loaded
    pose; turning about the gravity axis keeps both so). A ball or free joint, a
    tilted hinge or slide: False."""
    g = np.asarray(sys.opt.gravity, np.float64)
    if not np.any(g):
        return False
    g = g / np.linalg.norm(g)
    parent, quat = np.asarray(sys.body_parentid), np.asarray(sys.body_quat, np.float64)
    frames = [np.eye(3)]
    for b in range(1, parent.shape[0]):  # a parent's index is below its child's
        turn = np.empty(9)
        mujoco.mju_quat2Mat(turn, quat[b])
        frames.append(frames[parent[b]] @ turn.reshape(3, 3))
    for kind, body, axis in zip(
        np.asarray(sys.jnt_type), np.asarray(sys.jnt_bodyid), np.asarray(sys.jnt_axis), strict=True
    ):
        along = abs(float(frames[body] @ axis @ g)) / max(float(np.linalg.norm(axis)), 1e-12)
        if not (kind == _HINGE and along > 1 - 1e-6 or kind == _SLIDE and along < 1e-6):
            return False
    return True


# ---- mass: per body (world excluded); inertia and inverse weights follow ----
def _mass_default(sys):
    return _f32(sys.link.inertia.mass if _brax(sys) else sys.body_mass[1:])


def _mass_apply(sys, m):
    m0 = _mass_default(sys)
    # exactly 1 where the mass is the loaded one: XLA may divide as m * (1 / m0), which
    # is not 1 for every m0, and a default context must be the env's own model
    ratio = jnp.where((m0 > 0) & (m != m0), m / jnp.where(m0 > 0, m0, 1.0), 1.0)
    fields = {
        "body_mass": sys.body_mass.at[1:].set(m),
        "body_subtreemass": sys.body_subtreemass
        + jnp.asarray(_subtree_matrix(sys)[:, 1:]) @ (m - m0),
    }
    if _brax(sys):
        fields["link.inertia.mass"] = m
    return _scale_inertia(sys, ratio, translational=True).tree_replace(fields)


def _scale_inertia(sys, ratio, translational):
    """Scales inertia tensors by `ratio` per body, inverse weights by 1/ratio: the
    rotational ones only, unless `translational` (the mass changes too)."""
    body = np.asarray(sys.dof_bodyid) - 1
    dof_ratio = ratio[body]
    if not translational:
        dof_ratio = jnp.where(_rotational_dofs(sys), dof_ratio, 1.0)
    fields = {
        "body_inertia": sys.body_inertia.at[1:].multiply(ratio[:, None]),
        "body_invweight0": sys.body_invweight0.at[1:, 1].divide(ratio),
        "dof_invweight0": sys.dof_invweight0 / dof_ratio,
    }
    if _brax(sys):
        fields["link.inertia.i"] = sys.link.inertia.i * ratio[:, None, None]
        fields["dof.invweight"] = sys.dof.invweight / dof_ratio
    if translational:
        if _brax(sys):
            fields["link.invweight"] = sys.link.invweight / ratio
        fields["body_invweight0"] = fields["body_invweight0"].at[1:, 0].divide(ratio)
    return sys.tree_replace(fields)


# ---- the constants MuJoCo's mj_setConst derives when it compiles a model ----
# The constraint solver's inverse weights (its regularisation) depend on the joint-space
# inertia at qpos0; a muscle's peak force (`force` < 0) on `actuator_acc0`, the
# acceleration a unit actuator force gives at qpos0. Each group: the System fields it
# depends on, the backends that read it, and the quantities (or raw fields) that write
# those fields.
INERTIAL_FIELDS = ("body_mass", "body_inertia", "body_ipos", "dof_armature", "tendon_armature")
# The model's pose at qpos0 (bodies, joints, the tendons' paths): MJX's kinematics there
# read them, and so do the Jacobians and the inertia the constants come from. Only raw
# paths write them (on MJX: Brax's backends read Brax's own copies, `link.*`). Until
# 2026-12-05 a raw path into one left the inverse weights at the loaded model's (a
# chain with body_pos moved: body_invweight0 11% off MuJoCo's, tendon_invweight0 100%
# off with jnt_axis turned). tests/test_contexts.py perturbs every float field of
# MJX's Model in MuJoCo's own model and checks that each one mj_setConst reads is here.
POSE_FIELDS = (
    *("body_pos", "body_quat", "body_iquat", "jnt_pos", "jnt_axis", "qpos0", "site_pos"),
    "wrap_prm",  # a spatial tendon's side sites and wrapping radii
)
SETCONST = {
    "weights": (INERTIAL_FIELDS + POSE_FIELDS, ("generalized", "mjx")),
    "acc0": (INERTIAL_FIELDS + POSE_FIELDS + ("actuator_gear",), ("mjx",)),
}
# The setconst input each canonical quantity writes
SETCONST_INPUT = {
    "mass": "body_mass",
    "inertia": "body_inertia",
    "com_offset": "body_ipos",
    "armature": "dof_armature",
    "actuator_gain": "actuator_gear",
}
_MUSCLE_GAIN, _MUSCLE_BIAS = int(mujoco.mjtGain.mjGAIN_MUSCLE), int(mujoco.mjtBias.mjBIAS_MUSCLE)
# Brax's generalized backend reads its own copies of MuJoCo's fields (`link.*`, `dof.*`,
# `init_q`), which Brax loaded from these (its links are bodies 1..; `link.inertia.i` is
# diag(body_inertia) in the body's inertial frame). A raw path into a copy is mirrored into
# the field it came from, which `setconst` reads: until 2026-12-07 the inverse weights
# stayed the loaded model's (hopper with raw `link.inertia.mass` and `link.inertia.i` x2:
# link.invweight 2x off, the trajectory 0.04 apart in 300 steps).
BRAX_TWINS = {
    "link.inertia.mass": "body_mass",
    "link.inertia.i": "body_inertia",
    "link.inertia.transform.pos": "body_ipos",
    "link.inertia.transform.rot": "body_iquat",
    "link.transform.pos": "body_pos",
    "link.transform.rot": "body_quat",
    "dof.armature": "dof_armature",
    "init_q": "qpos0",
}
# Brax's copies of the pose that no MuJoCo field holds one to one (a link's joint frame;
# the dofs' motion axes, which MuJoCo's joint axes give per joint type)
BRAX_POSE_UNTWINNED = ("link.joint.pos", "link.joint.rot", "dof.motion.ang", "dof.motion.vel")
# What each group of `SETCONST` computes (with Brax's copies): a raw path into one of them
# would be overwritten wherever the group is derived
SETCONST_OUTPUT = {
    "weights": (
        "body_invweight0",
        "dof_invweight0",
        "tendon_invweight0",
        "link.invweight",
        "dof.invweight",
    ),
    "acc0": ("actuator_acc0",),
}


def subtree_masses(default, sys):
    """`sys` with `body_subtreemass` following its `body_mass` (what `mj_setConst`
    computes), as the loaded value plus the subtrees' change from `default`: the loaded
    values bit for bit where no mass changed. For a raw path into a body's mass: MJX
    divides by it in the subtree velocities (the `subtreelinvel` sensors that
    Playground's CheetahRun, Hopper, Walker and Humanoid reward); until 2026-12-07 it
    stayed the loaded model's (CheetahRun's torso x2: the rewarded speed 1.45x off)."""
    change = jnp.asarray(_subtree_matrix(default)) @ (sys.body_mass - default.body_mass)
    return sys.replace(body_subtreemass=default.body_subtreemass + change)


def mirror_brax_copies(sys, fields: set[str]):
    """`sys` (generalized) with each Brax copy in `fields` (`BRAX_TWINS`) written into
    the MuJoCo field it was loaded from, which `setconst` reads."""
    copies = {
        "body_mass": lambda: sys.body_mass.at[1:].set(sys.link.inertia.mass),
        "body_inertia": lambda: sys.body_inertia.at[1:].set(
            jnp.diagonal(sys.link.inertia.i, axis1=-2, axis2=-1)
        ),
        "body_ipos": lambda: sys.body_ipos.at[1:].set(sys.link.inertia.transform.pos),
        "body_iquat": lambda: sys.body_iquat.at[1:].set(sys.link.inertia.transform.rot),
        "body_pos": lambda: sys.body_pos.at[1:].set(sys.link.transform.pos),
        "body_quat": lambda: sys.body_quat.at[1:].set(sys.link.transform.rot),
        "dof_armature": lambda: sys.dof.armature,
        "qpos0": lambda: sys.init_q,
    }
    twins = [BRAX_TWINS[f] for f in sorted(fields) if f in BRAX_TWINS]
    if not twins:
        return sys
    return sys.tree_replace(
        {t: jnp.asarray(copies[t]()).astype(getattr(sys, t).dtype) for t in twins}
    )


def setconst_groups(sys, backend: str, written: set[str]) -> tuple[str, ...]:
    """The groups of `SETCONST` that a context writing the System fields `written`
    changes and `backend` reads (acc0: only where some actuator is a muscle)."""
    muscles = np.any(np.asarray(sys.actuator_gaintype) == _MUSCLE_GAIN) or np.any(
        np.asarray(sys.actuator_biastype) == _MUSCLE_BIAS
    )
    return tuple(
        group
        for group, (inputs, backends) in SETCONST.items()
        if backend in backends and set(inputs) & written and (group != "acc0" or muscles)
    )


# Quantities whose fields enter the joint-space inertia at qpos0 only linearly (masses,
# inertias, armatures) and that write nothing the kinematics at qpos0 read: with only
# these (and quantities that touch no setconst input), `setconst_basis` applies
LINEAR_INPUTS = ("body_mass", "body_inertia", "dof_armature")
NOT_LINEAR = ("com_offset", "geom_size", "actuator_gain")  # kinematics, wrapping, gears


def setconst(default, sys, groups: tuple[str, ...], basis=None) -> dict[str, jnp.ndarray]:
    """{field: value} of `groups` as MuJoCo's `mj_setConst` computes them, at qpos0,
    with MJX (inside jit, float32); where no field a group depends on differs from
    `default`'s, the loaded values, bit for bit (a default context is the env's own
    model).

    weights: `body_invweight0`, `dof_invweight0` and `tendon_invweight0`: the mean
    diagonal of J M^-1 J' for each body's centre of mass (translation, rotation; 0 for
    a body welded to the world), the diagonal of M^-1 averaged over the translational
    and rotational dofs of a free joint and the dofs of a ball joint, and J M^-1 J' of
    each tendon. Against mj_setConst with masses, inertias, armatures and centres of
    mass changed: relative differences of 4e-7, 1e-7 and 1e-5 on hopper, ant and
    humanoid (checked once, 2026-11-26; hopper with each body's mass x0.5-2, 16 draws:
    2.7e-6 on 2026-11-29), within 2e-5 on a chain with two tendons
    (tests/test_contexts.py). M holds the tendons' armature, J' diag(armature) J, as
    MJX's dynamics do; a body that slide joints alone move (`body_simple` 2) gets
    MuJoCo's shortcut, [1 / mass, 0], and its dofs 1 / mass.

    acc0: `actuator_acc0`, the norm of M^-1 times each actuator's moment arms.

    `basis`: `setconst_basis(default)`, valid where `sys` differs from `default` in
    `LINEAR_INPUTS` only (among the fields the kinematics at qpos0 read): M is then
    sum_b m_b Jp_b' Jp_b + sum_bk I_bk (R_b' Jr_b)_k' (R_b' Jr_b)_k + diag(armature), the
    Jacobians taken once from the default model, a few contractions instead of MJX's
    kinematics, composite inertias and Jacobians at every call."""
    if basis is None:
        from mujoco.mjx._src import support

        d, jac, ten_j, moment = _setconst_terms(sys, groups)
        m = support.full_m(sys, d)
    else:
        m = jnp.tensordot(sys.body_mass, basis["mass"], 1)
        m += jnp.tensordot(sys.body_inertia, basis["inertia"], 2)
        m += jnp.diag(sys.dof_armature)
        jac, ten_j, moment = basis["jac"], basis["ten_J"], basis["moment"]
    if np.asarray(sys.tendon_adr).shape[0]:  # tendons' armature: J' diag(a) J, as MJX's
        m += ten_j.T @ (sys.tendon_armature[:, None] * ten_j)  # smooth.tendon_armature adds
    minv = jnp.linalg.inv(m)
    fields = {}
    if "weights" in groups:
        # trace of J M^-1 J' per body, translation and rotation: jac [nbody, 2, 3, nv]
        trace = jnp.einsum("bsin,nm,bsim->bs", jac, minv, jac)
        moving = jnp.asarray(np.asarray(sys.body_weldid) != 0, jnp.float32)[:, None]
        fields["body_invweight0"] = trace / 3 * moving
        # MuJoCo's shortcut for a body that slide joints alone move (body_simple 2):
        # [1 / mass, 0], where the trace would average its unmoving directions in
        sliding = np.asarray(sys.body_simple) == 2
        if sliding.any():
            mass = jnp.where(jnp.asarray(sliding), sys.body_mass, 1.0)
            alone = jnp.stack([1 / mass, jnp.zeros_like(mass)], axis=-1)
            fields["body_invweight0"] = jnp.where(
                jnp.asarray(sliding)[:, None], alone, fields["body_invweight0"]
            )
        groups_of = np.arange(np.asarray(sys.dof_jntid).shape[0])
        for kind, adr in zip(np.asarray(sys.jnt_type), np.asarray(sys.jnt_dofadr), strict=True):
            if kind == _FREE:
                groups_of[adr : adr + 3], groups_of[adr + 3 : adr + 6] = adr, adr + 3
            elif kind == _BALL:
                groups_of[adr : adr + 3] = adr
        same = (groups_of[:, None] == groups_of[None, :]).astype(np.float32)
        fields["dof_invweight0"] = jnp.asarray(same / same.sum(1, keepdims=True)) @ jnp.diag(minv)
        if sliding.any():  # the same shortcut for their dofs: 1 / mass, armature left out
            dof_body = np.asarray(sys.dof_bodyid)
            fields["dof_invweight0"] = jnp.where(
                jnp.asarray(sliding[dof_body]), 1 / mass[dof_body], fields["dof_invweight0"]
            )
        if np.asarray(sys.tendon_adr).shape[0]:
            fields["tendon_invweight0"] = jnp.sum((ten_j @ minv) * ten_j, axis=1)
    if "acc0" in groups:
        fields["actuator_acc0"] = jnp.linalg.norm(moment @ minv, axis=1)
    changed = {
        group: jnp.any(jnp.stack([jnp.any(getattr(sys, f) != getattr(default, f)) for f in inputs]))
        for group, (inputs, _) in SETCONST.items()
        if group in groups
    }
    return {
        k: jnp.where(
            changed["acc0" if k == "actuator_acc0" else "weights"], v, getattr(default, k)
        ).astype(getattr(default, k).dtype)
        for k, v in fields.items()
    }


def _setconst_terms(sys, groups):
    """MJX's data at qpos0 (kinematics, centres of mass, composite inertias), the
    Jacobians of every body's centre of mass [nbody, 2, 3, nv] (translation,
    rotation), the tendons' [ntendon, nv] and, where `groups` has acc0, the
    actuators' moment arms [nu, nv] (else None)."""
    from mujoco import mjx
    from mujoco.mjx._src import support

    d = mjx.make_data(sys).replace(qpos=sys.qpos0)
    d = mjx.crb(sys, mjx.com_pos(sys, mjx.kinematics(sys, d)))
    nbody = np.asarray(sys.body_parentid).shape[0]
    jac = jax.vmap(lambda b: jnp.stack(support.jac(sys, d, d.xipos[b], b)))(jnp.arange(nbody))
    jac = jnp.swapaxes(jac, 2, 3)  # [nbody, 2, nv, 3] -> [nbody, 2, 3, nv]
    d = mjx.tendon(sys, d)
    moment = mjx.transmission(sys, d)._impl.actuator_moment if "acc0" in groups else None
    return d, jac, d._impl.ten_J, moment


def _basis_terms(default, groups: tuple[str, ...]) -> dict[str, jax.Array]:
    d, jac, ten_j, moment = _setconst_terms(default, groups)
    jp = jac[:, 0]  # [nbody, 3, nv]
    rj = jnp.einsum("bij,bin->bjn", d.ximat, jac[:, 1])  # R' Jr: principal axes
    return {
        "mass": jnp.einsum("bin,bim->bnm", jp, jp),
        "inertia": jnp.einsum("bjn,bjm->bjnm", rj, rj),
        "jac": jac,
        "ten_J": ten_j,
        "moment": moment,
    }


# One jitted function for every model: spaces bound to models of one structure (the
# same env built again, with other contexts or another reset strategy) share its
# trace and compiled program; a function jitted per call traced and compiled it at
# every `bind` (1.3 s for inverted_pendulum on 2 CPU cores).
_basis_program = jax.jit(_basis_terms, static_argnums=1)


def setconst_basis(default, groups: tuple[str, ...]) -> dict[str, np.ndarray]:
    """What `setconst(default, sys, groups, basis)` needs of the default model, once:
    the Jacobians at qpos0 and the parts of M that each mass and each principal
    inertia multiply (mass [nbody, nv, nv], inertia [nbody, 3, nv, nv])."""
    # The model is the program's argument: closed over, its arrays were constants that
    # XLA folded through the whole computation when compiling it (8.1 s for
    # inverted_pendulum, now 3.7 s, on 2 CPU cores). On the host's CPU on every
    # platform: the same numbers everywhere, and no accelerator compile for constants.
    cpu = jax.local_devices(backend="cpu")[0]
    if _brax(default):  # its MjModel, part of the pytree's structure, differs per instance
        default = default.replace(mj_model=None)

    def basis():
        with jax.default_device(cpu):
            out = _basis_program(jax.device_put(default, cpu), tuple(groups))
            return jax.tree.map(np.asarray, out)

    try:  # outside any trace (`bind` asks for it): one program, which the persistent cache keeps
        return basis()
    except jax.errors.TracerArrayConversionError:
        # Asked for inside a trace: evaluated at once, each of MJX's constants folded
        # eagerly in a program of its own (about 145 small compiles for hopper).
        with jax.ensure_compile_time_eval():
            return basis()


def write_setconst(sys, fields: dict[str, jnp.ndarray]):
    """`sys` with `fields` (from `setconst`) written, Brax's copies of the weights too."""
    fields = dict(fields)
    if _brax(sys) and "body_invweight0" in fields:
        fields["link.invweight"] = fields["body_invweight0"][1:, 0]
        fields["dof.invweight"] = fields["dof_invweight0"]
    return sys.tree_replace(fields)


_FREE, _BALL, _SLIDE, _HINGE = (
    int(mujoco.mjtJoint.mjJNT_FREE),
    int(mujoco.mjtJoint.mjJNT_BALL),
    int(mujoco.mjtJoint.mjJNT_SLIDE),
    int(mujoco.mjtJoint.mjJNT_HINGE),
)


def _rotational_dofs(sys) -> np.ndarray:
    """Dofs that rotate a body: hinge and ball joints, dofs 3-5 of a free joint."""
    joint = np.asarray(sys.dof_jntid)
    kind = np.asarray(sys.jnt_type)[joint]
    first = np.asarray(sys.jnt_dofadr)[joint]
    rotates = (kind == _HINGE) | (kind == _BALL)
    return rotates | ((kind == _FREE) & (np.arange(joint.shape[0]) - first >= 3))


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
    """A `requires` check: `quantity` does nothing on positional/spring where `field` >= 1.

    Below 1 those backends simulate the written value v as ``v ** (1 - field)``; the
    context stays the MJCF value (the env as if its model declared v), which is what
    Brax's own randomisation writes too, so the exponent applies to every value alike."""

    def check(sys, backend):
        if not _brax(sys):
            return None
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
        return sys.tree_replace({brax_path: v, mjx_field: v} if _brax(sys) else {mjx_field: v})

    return default, apply


def _springy_joints(sys, backend) -> np.ndarray:
    """Hinge and slide joints: the only ones whose stiffness every backend reads alike."""
    kind = np.asarray(sys.jnt_type)
    return (kind == _HINGE) | (kind == _SLIDE)


def _stiffness_apply(sys, v):
    fields = {"jnt_stiffness": v}
    if _brax(sys):
        fields["dof.stiffness"] = v[np.asarray(sys.dof_jntid)]
    return sys.tree_replace(fields)


def _gain_rows(sys):
    """(gear [nu, 6], index of each row's first nonzero entry, whether that entry is
    its only one: a joint's or tendon's gear, or a row of zeros, and the gain)."""
    gear = jnp.asarray(sys.actuator_gear, jnp.float32)
    nonzero = gear != 0
    first, single = jnp.argmax(nonzero, axis=1), nonzero.sum(axis=1) <= 1
    lead = jnp.take_along_axis(gear, first[:, None], axis=1)[:, 0]
    gain = jnp.where(single, lead, jnp.sign(lead) * jnp.linalg.norm(gear, axis=1))
    return gear, first, single, gain


def _gain_default(sys):
    """An actuator's gain: its gear row's one nonzero entry (a joint's or tendon's
    gear[0], exactly), else the row's length signed as its first nonzero entry (a
    site's or ball joint's gear vector)."""
    return _gain_rows(sys)[3]


def _gain_apply(sys, v):
    """Gain `v` written into the row's one nonzero entry (gear[0] for a row of
    zeros), or the whole row scaled to length |v| along its direction (traced
    inputs welcome: an entry that selects some actuators applies after another);
    the actuator's length range scales with it."""
    gear, first, single, g0 = _gain_rows(sys)
    own = jnp.arange(gear.shape[1])[None, :] == first[:, None]
    ratio = v / jnp.where(g0 != 0, g0, 1.0)
    gear = jnp.where(single[:, None], jnp.where(own, v[:, None], gear), gear * ratio[:, None])
    length = sys.actuator_lengthrange * ratio[:, None]  # a row of zeros keeps its range
    length = jnp.where(g0[:, None] != 0, jnp.sort(length, axis=1), sys.actuator_lengthrange)
    fields = {"actuator_gear": gear, "actuator_lengthrange": length}
    if _brax(sys):
        fields["actuator.gear"] = v
    return sys.tree_replace(fields)


# ---- which geoms a contact, a tendon or a sensor reads ----
def _disabled(sys, flag: mujoco.mjtDisableBit) -> bool:
    """Whether the model's <option><flag> switches `flag` off."""
    return bool(int(sys.opt.disableflags) & int(flag))


def _no_contacts(sys, backend) -> bool:
    """No contact force at all: contacts off (MJX's collision driver, which every
    backend calls, then finds none), or on mjx the constraint solver off."""
    return _disabled(sys, mujoco.mjtDisableBit.mjDSBL_CONTACT) or (
        backend == "mjx" and _disabled(sys, mujoco.mjtDisableBit.mjDSBL_CONSTRAINT)
    )


def _can_collide(sys) -> np.ndarray:
    """[ngeom, ngeom]: the geom pairs MJX's collision driver tests by MuJoCo's
    contype/conaffinity rule (its `geom_pairs`, which every backend calls: Brax's own
    pipelines too), (contype_i & conaffinity_j) | (contype_j & conaffinity_i), less the
    pairs it skips: geoms welded to one body, a parent and its child (unless the model
    disables filterparent), bodies that a <contact><exclude> names, two planes or a
    plane and a height field, and a pair that a <contact><pair> declares (its contact
    takes the pair's parameters, not the geoms'). A pair may still never touch."""
    contype = np.asarray(sys.geom_contype)
    conaffinity = np.asarray(sys.geom_conaffinity)
    body = np.asarray(sys.geom_bodyid)
    weldid = np.asarray(sys.body_weldid)
    weld = weldid[body]
    can = (contype[:, None] & conaffinity[None, :]) | (contype[None, :] & conaffinity[:, None])
    can = (can != 0) & (weld[:, None] != weld[None, :])
    if not _disabled(sys, mujoco.mjtDisableBit.mjDSBL_FILTERPARENT):
        parent = weldid[np.asarray(sys.body_parentid)[weld]]
        moving = weld != 0  # the world's bodies are no one's parent here
        family = (weld[:, None] == parent[None, :]) | (parent[:, None] == weld[None, :])
        can &= ~(moving[:, None] & moving[None, :] & family)
    excluded = np.asarray(getattr(sys, "exclude_signature", ()), np.int64)
    if excluded.size:
        b = body.astype(np.int64)
        signature = (np.minimum(b[:, None], b[None, :]) << 16) + np.maximum(b[:, None], b[None, :])
        can &= ~np.isin(signature, excluded)
    kind = np.asarray(sys.geom_type)
    plane, flat = kind == _PLANE, np.isin(kind, (_PLANE, _HFIELD))
    can &= ~((plane[:, None] & flat[None, :]) | (flat[:, None] & plane[None, :]))
    first, second = np.asarray(sys.pair_geom1), np.asarray(sys.pair_geom2)
    can[first, second] = can[second, first] = False
    return can


def _colliding(sys, backend) -> np.ndarray:
    """Geoms in some contact by contype/conaffinity, where contacts act at all."""
    if _no_contacts(sys, backend):
        return np.zeros(sys.ngeom, bool)
    return _can_collide(sys).any(axis=1)


def _rubbing(sys, backend) -> np.ndarray:
    """Geoms whose friction some contact reads: MJX's collision driver gives a
    contact the friction of its higher-priority geom (the larger of the two at
    equal priority) on every backend, and on mjx a contact of dimension 1 (the
    condim of the higher-priority geom, or the larger one) is frictionless."""
    if _no_contacts(sys, backend):
        return np.zeros(sys.ngeom, bool)
    priority = np.asarray(sys.geom_priority)
    read = _can_collide(sys) & (priority[:, None] >= priority[None, :])
    if backend == "mjx":
        condim = np.asarray(sys.geom_condim)
        mine, theirs = priority[:, None], priority[None, :]
        dim = np.where(
            mine > theirs,
            condim[:, None],
            np.where(mine < theirs, condim[None, :], np.maximum(condim[:, None], condim[None, :])),
        )
        read &= dim > 1
    return read.any(axis=1)


def _paired(sys) -> np.ndarray:
    """Geoms in an explicit <contact><pair>."""
    live = np.zeros(sys.ngeom, bool)
    live[np.asarray(sys.pair_geom1)] = True
    live[np.asarray(sys.pair_geom2)] = True
    return live


def _touching(sys, backend) -> np.ndarray:
    """Geoms in some contact: by contype/conaffinity or in an explicit pair (Brax
    reads both geoms' elasticity for every contact, a pair's too)."""
    if _no_contacts(sys, backend):
        return np.zeros(sys.ngeom, bool)
    return _colliding(sys, backend) | _paired(sys)


def _pairs_read(sys, backend) -> np.ndarray:
    """Explicit pairs whose friction a contact reads: contacts on, dimension > 1."""
    if _no_contacts(sys, backend):
        return np.zeros(sys.npair, bool)
    return np.asarray(sys.pair_dim) > 1


_WRAP_GEOMS = (int(mujoco.mjtWrap.mjWRAP_SPHERE), int(mujoco.mjtWrap.mjWRAP_CYLINDER))
_RANGEFINDER = int(mujoco.mjtSensor.mjSENS_RANGEFINDER)


# Collisions never read these geoms' size: a plane is infinite, a mesh collides
# through its convex hull's vertices and a height field through hfield_size.
_SIZELESS = tuple(
    int(t)
    for t in (mujoco.mjtGeom.mjGEOM_PLANE, mujoco.mjtGeom.mjGEOM_MESH, mujoco.mjtGeom.mjGEOM_HFIELD)
)


def _sized(sys, backend) -> np.ndarray:
    """Geoms whose size the simulation reads: in a contact (not a plane, mesh or
    height field), wrapped by a spatial tendon, or any geom when a rangefinder
    casts rays."""
    if np.any(np.asarray(sys.sensor_type) == _RANGEFINDER):
        return np.ones(sys.ngeom, bool)
    live = _touching(sys, backend) & ~np.isin(np.asarray(sys.geom_type), _SIZELESS)
    wraps = np.isin(np.asarray(sys.wrap_type), _WRAP_GEOMS)
    live[np.asarray(sys.wrap_objid)[wraps]] = True
    return live


_MJ_TENDON = int(mujoco.mjtEq.mjEQ_TENDON)
_TRN_TENDON = int(mujoco.mjtTrn.mjTRN_TENDON)


def _wrapped_with_constants(sys, backend) -> dict[int, str]:
    """Geoms wrapped by a spatial tendon that MuJoCo derives constants of when it
    compiles the model, from the tendon's path at qpos0: its length (a limit's and an
    equality's reference, a spring's rest length), its inverse weight (the solver's
    regularisation of a limit, a friction loss, an equality) and a muscle's length
    range and peak force. metarl does not recompute those, so a size that moves the
    path would leave them stale. A tendon with none of these (a plain path that a
    motor pulls, damped) reads its length and Jacobian fresh at every step."""
    ntendon = np.asarray(sys.tendon_adr).shape[0]
    if not ntendon:
        return {}
    muscle = (np.asarray(sys.actuator_gaintype) == _MUSCLE_GAIN) | (
        np.asarray(sys.actuator_biastype) == _MUSCLE_BIAS
    )
    pulled = np.asarray(sys.actuator_trntype) == _TRN_TENDON
    eq = np.asarray(sys.eq_type) == _MJ_TENDON
    why = {
        "a limit": np.asarray(sys.tendon_limited, bool),
        "a friction loss": np.asarray(sys.tendon_frictionloss) > 0,
        "a spring": np.asarray(sys.tendon_stiffness) > 0,
        "an equality": np.isin(
            np.arange(ntendon),
            np.concatenate([np.asarray(sys.eq_obj1id)[eq], np.asarray(sys.eq_obj2id)[eq]]),
        ),
        "a muscle": np.isin(np.arange(ntendon), np.asarray(sys.actuator_trnid)[pulled & muscle, 0]),
    }
    labels = element_names.element_names(sys, "tendons")
    out = {}
    adr, num = np.asarray(sys.tendon_adr), np.asarray(sys.tendon_num)
    wrap_type, wrap_obj = np.asarray(sys.wrap_type), np.asarray(sys.wrap_objid)
    for t in range(ntendon):
        reasons = [k for k, v in why.items() if v[t]]
        if not reasons:
            continue
        for w in range(adr[t], adr[t] + num[t]):
            if wrap_type[w] in _WRAP_GEOMS:
                out.setdefault(
                    int(wrap_obj[w]),
                    f"it shapes the path of tendon {labels[t] or t}, which has "
                    f"{', '.join(reasons)}: MuJoCo derives the tendon's length and inverse "
                    "weight at qpos0 (and a muscle's length range and peak force) when it "
                    "compiles the model, and metarl does not recompute them, so a new size "
                    "or place would leave them stale",
                )
    return out


_NO_CONTACT = (
    "it can collide with no geom of another body by MuJoCo's contype/conaffinity rule "
    "((contype_i & conaffinity_j) or (contype_j & conaffinity_i)) other than its body's "
    "parent or child, a body a <contact><exclude> names, or a geom it is paired with by a "
    "<contact><pair> (whose contact reads the pair's parameters), or the model switches "
    'contacts off (<flag contact="disable"/>, or constraint="disable" on mjx)'
)
_HFIELD = int(mujoco.mjtGeom.mjGEOM_HFIELD)
_PLANE = int(mujoco.mjtGeom.mjGEOM_PLANE)


def _hfield_check(sys, backend):
    """MJX clips the terrain patch it tests a geom against to a bound computed from
    the loaded sizes (`Model._impl.geom_rbound_hfield`, a constant of the compiled
    program), so a geom grown past it would sink through a height field."""
    hfield = np.asarray(sys.geom_type) == _HFIELD
    if hfield.any() and (_can_collide(sys)[:, hfield].any() or _paired(sys)[hfield].any()):
        return (
            "'geom_size' is not supported on a model with a height field that geoms collide "
            "with: MJX sizes the terrain patch it tests from the loaded geom sizes (a constant "
            "of the compiled program), so a larger geom would sink through the terrain"
        )
    return None


def _gear_read_by(sys, backend):
    """Aligns the MuJoCo copy `actuator_gear` with the Brax copy `actuator.gear` on the
    backends that read the Brax copy (all but mjx): Brax's env constructors overwrite
    only that copy on positional and spring (reacher's gear becomes 25, not 200), so
    the default is the gear that backend simulates and the two copies agree."""
    if not _brax(sys) or backend == "mjx":
        return sys
    return sys.tree_replace({"actuator_gear": sys.actuator_gear.at[:, 0].set(sys.actuator.gear)})


def _geom_size_apply(sys, s):
    return sys.tree_replace(
        {
            "geom_size": sys.geom_size * s[:, None],
            "geom_rbound": sys.geom_rbound * s,
            "geom_aabb": sys.geom_aabb * s[:, None],
        }
    )


def _enable_fluid(sys, backend):
    """Switches the backend's fluid model on (a static switch, off where the model
    loads no viscosity and no density): MJX's, or Brax's own (`metarl.brax_fluid`)."""
    if backend != "mjx":
        return sys.replace(enable_fluid=True)
    impl = sys.opt._impl.replace(has_fluid_params=True)
    return sys.replace(opt=sys.opt.replace(_impl=impl))


def _off_on_mjx(name: str, flags: tuple[str, ...], what: str):
    """A `requires` check: on mjx, `name` does nothing where the model's <flag> switches
    off any of `flags` (`mjtDisableBit` names without the mjDSBL_ prefix). Brax's own
    backends ignore these flags."""

    def check(sys, backend):
        off = [f for f in flags if _disabled(sys, getattr(mujoco.mjtDisableBit, f"mjDSBL_{f}"))]
        if backend != "mjx" or not off:
            return None
        set_off = " or ".join(f'{f.lower()}="disable"' for f in off)
        return (
            f"'{name}' acts through {what}, which MJX skips when the model switches "
            f"{' or '.join(f.lower() for f in flags)} off (this model sets <flag {set_off}/>), "
            "so varying it would not vary that force; remove the flag from the model to vary it"
        )

    return check


_PASSIVE = ("SPRING", "DAMPER")  # MJX skips every passive force if either is off


def _fluid_check(sys, backend):
    if backend != "mjx":  # Brax's own fluid model reads no <flag> and no integrator
        return None
    if _disabled(sys, mujoco.mjtDisableBit.mjDSBL_SPRING) or _disabled(
        sys, mujoco.mjtDisableBit.mjDSBL_DAMPER
    ):
        return (
            "'viscosity' and 'density' act through MuJoCo's passive forces, which MJX skips "
            "entirely (fluid forces included) when the model switches springs or dampers off "
            '(<flag spring="disable"/> or damper="disable")'
        )
    if int(sys.opt.integrator) == int(mujoco.mjtIntegrator.mjINT_IMPLICITFAST):
        return (
            "'viscosity' and 'density' switch MuJoCo's fluid model on, which MJX does not "
            "simulate with this model's implicitfast integrator (its first step would raise); "
            'set <option integrator="Euler"/> or "RK4" in the model to vary them'
        )
    return None


def _fluid_field(name):
    def default(sys):
        return _f32(getattr(sys.opt, name))

    def apply(sys, v):
        return sys.tree_replace({f"opt.{name}": v, name: v} if _brax(sys) else {f"opt.{name}": v})

    return default, apply


_JOINT_HINT = (
    "the positional and spring backends ignore per-joint {name}; their global "
    "damping fields are available as raw paths 'vel_damping' and 'ang_damping'."
)

# ---- quantities MuJoCo Playground's randomizers vary (MJX backends) ----
_MJX = frozenset({"mjx"})
_MJX_HINT = "only MuJoCo's own solver (backend='mjx', Playground envs, MJCF envs) models it."
_AFFINE = 1  # mjtBias.mjBIAS_AFFINE


def _com_offset_apply(sys, offset):
    """Shifts each body's centre of mass by `offset` (n, 3) from where it is now
    (only this quantity moves it, so from where the model loaded it)."""
    pos = sys.body_ipos.at[1:].add(offset)
    fields = {"body_ipos": pos}
    if _brax(sys):
        fields["link.inertia.transform.pos"] = pos[1:]
    return sys.tree_replace(fields)


def _simple_bodies(sys, backend) -> dict[int, str]:
    """Bodies MuJoCo compiled as simple (`body_simple` 1: a free or single-joint body
    whose centre of mass is its frame's origin). The mass matrix's sparsity pattern,
    fixed when the model compiles, leaves out the coupling of their dofs, which a
    moved centre of mass makes nonzero: MJX would drop it (a spinning box's path 0.9
    off MuJoCo's; `mj_setConst` refuses the edit) and so would the inverse weights.
    Brax's positional and spring backends build no such matrix."""
    if backend not in _JOINT_BACKENDS:
        return {}
    why = (
        "MuJoCo compiled it as a simple body (its centre of mass at its frame's origin), "
        "so its mass matrix's fixed pattern leaves out the coupling a moved centre of "
        'mass makes; give it an <inertial pos="1e-6 0 0" .../> off its origin and '
        "MuJoCo compiles it as a general body"
    )
    return {int(b) - 1: why for b in np.flatnonzero(np.asarray(sys.body_simple) == 1) if b}


def _servo_mask(sys, xp):
    """Position servos: affine bias with biasprm[1] = -gainprm[0] != 0 (MuJoCo's
    <position>), the actuators whose kp is one number written in both places."""
    gain, bias = xp.asarray(sys.actuator_gainprm), xp.asarray(sys.actuator_biasprm)
    affine = xp.asarray(sys.actuator_biastype) == _AFFINE
    return affine & (bias[:, 1] != 0) & (bias[:, 1] == -gain[:, 0])


def _position_servos(sys, backend) -> np.ndarray:
    return _servo_mask(sys, np)


def _kp_apply(sys, kp):
    """kp into the position servos only: every other actuator keeps its biasprm (a
    velocity servo's biasprm[1] is 0, a muscle's holds its range), also where an
    entry selects some servos and the others get their current values back."""
    servo = _servo_mask(sys, jnp)
    return sys.tree_replace(
        {
            "actuator_gainprm": sys.actuator_gainprm.at[:, 0].set(
                jnp.where(servo, kp, sys.actuator_gainprm[:, 0])
            ),
            "actuator_biasprm": sys.actuator_biasprm.at[:, 1].set(
                jnp.where(servo, -kp, sys.actuator_biasprm[:, 1])
            ),
        }
    )


def _kd_apply(sys, kd):
    """kd into biasprm[2]; a velocity servo (MuJoCo's <velocity kv>: biasprm[1] = 0,
    biasprm[2] = -gainprm[0] = -kv) holds kv in gainprm[0] too."""
    gain, bias = sys.actuator_gainprm, sys.actuator_biasprm
    velocity = (bias[:, 1] == 0) & (bias[:, 2] != 0) & (bias[:, 2] == -gain[:, 0])
    return sys.tree_replace(
        {
            "actuator_biasprm": bias.at[:, 2].set(-kd),
            "actuator_gainprm": gain.at[:, 0].set(jnp.where(velocity, kd, gain[:, 0])),
        }
    )


def _pairs_check(sys, backend):
    if sys.npair == 0:
        return (
            "'pair_friction' needs explicit contact pairs (<contact><pair> in the MJCF); this "
            "model has none: vary 'friction' (per geom) instead"
        )
    return None


def _pair_friction_apply(sys, v):
    """Both tangential coefficients: MuJoCo reads pair_friction[:, 0] and [:, 1] for the
    contact frame's two tangent directions, so writing one alone would make sliding
    direction-dependent. The second follows the first in its loaded proportion
    (equal for an isotropic pair)."""
    f0, f1 = sys.pair_friction[:, 0], sys.pair_friction[:, 1]
    second = jnp.where(f0 > 0, f1 * (v / jnp.where(f0 > 0, f0, 1.0)), v)
    friction = sys.pair_friction.at[:, 0].set(v).at[:, 1].set(second)
    return sys.tree_replace({"pair_friction": friction})


_damping = _dof_field("dof.damping", "dof_damping")
_armature = _dof_field("dof.armature", "dof_armature")
_viscosity = _fluid_field("viscosity")
_density = _fluid_field("density")


def _moving(sys, backend) -> np.ndarray:
    """Bodies some joint moves: a body welded to the world or to a mocap body (which
    the user places, as the reacher's target) has no dof, and its mass, inertia and
    centre of mass enter no equation of motion."""
    weld = np.asarray(sys.body_weldid)
    return ((weld != 0) & (np.asarray(sys.body_mocapid)[weld] < 0))[1:]


def _rotating(sys, backend) -> np.ndarray:
    """Moving bodies that some joint turns (a hinge, ball or free joint of the body or
    of a body it hangs from): one that slide joints alone move only translates, and
    its rotational inertia and the place of its centre of mass enter no equation of
    motion (only its mass does)."""
    turning = np.asarray(sys.dof_bodyid)[_rotational_dofs(sys)]
    turns = _subtree_matrix(sys)[turning].any(axis=0)  # in the subtree of a turning dof
    return _moving(sys, backend) & turns[1:]


# The body quantities' live elements: an entry that names none covers the moving bodies
_WELDED_HINT = (
    "it is welded to the world or to a mocap body (no joint moves it, as the "
    "reacher's target), so nothing it carries enters the dynamics"
)
_MOVING = {"live": _moving, "dead_hint": _WELDED_HINT, "skip_dead": True}
_ROTATING = {
    "live": _rotating,
    "dead_hint": _WELDED_HINT + ", or slide joints alone move it (it only translates, so "
    "only its mass enters the dynamics)",
    "skip_dead": True,
}


QUANTITIES: dict[str, Quantity] = {
    "gravity": Quantity(
        units="m/s^2",
        elements="",
        default=_gravity_default,
        apply=_gravity_apply,
        requires=_gravity_check,
    ),
    "mass": Quantity(
        units="kg",
        elements="bodies",
        default=_mass_default,
        apply=_mass_apply,
        strict=True,
        requires=spring_scale_check("spring_mass_scale", "mass"),
        **_MOVING,
    ),
    "inertia": Quantity(
        units="x default",
        elements="bodies",
        default=lambda sys: jnp.ones(sys.nbody - 1, jnp.float32),
        apply=lambda sys, r: _scale_inertia(sys, r, translational=False),
        strict=True,
        absolute=False,
        requires=spring_scale_check("spring_inertia_scale", "inertia"),
        **_ROTATING,
    ),
    "friction": Quantity(
        units="coefficient",
        elements="geoms",
        default=lambda sys: _f32(sys.geom_friction[:, 0]),
        apply=lambda sys, v: sys.tree_replace({"geom_friction": sys.geom_friction.at[:, 0].set(v)}),
        live=_rubbing,
        dead_hint=f"{_NO_CONTACT}, or every contact it makes takes its partner's friction (a "
        "higher geom priority) or, on mjx, is frictionless (condim 1), so no contact reads its "
        "friction (a contact of an explicit <contact><pair> takes its friction from the pair: "
        "vary 'pair_friction' on mjx)",
        skip_dead=True,
        through_contacts=True,
    ),
    "damping": Quantity(
        units="N m s/rad",
        elements="dofs",
        default=_damping[0],
        apply=_damping[1],
        backends=_JOINT_BACKENDS,
        unsupported_hint=_JOINT_HINT.format(name="damping"),
        requires=_off_on_mjx("damping", _PASSIVE, "MuJoCo's passive forces"),
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
        requires=_off_on_mjx("stiffness", _PASSIVE, "MuJoCo's passive forces"),
        live=_springy_joints,
        dead_hint="it is a free or ball joint: MJX pulls such a joint back to its initial pose "
        "while Brax's generalized backend ignores its stiffness, so only hinge and slide joints "
        "take it",
        skip_dead=True,
    ),
    "actuator_gain": Quantity(
        units="gear",
        elements="actuators",
        default=_gain_default,
        apply=_gain_apply,
        lower=None,
        prepare=_gear_read_by,
        requires=_off_on_mjx("actuator_gain", ("ACTUATION",), "the actuator forces"),
    ),
    "geom_size": Quantity(
        units="x default",
        elements="geoms",
        default=lambda sys: jnp.ones(sys.ngeom, jnp.float32),
        apply=_geom_size_apply,
        strict=True,
        absolute=False,
        live=_sized,
        frozen=_wrapped_with_constants,
        requires=_hfield_check,
        dead_hint=f"it is a plane (infinite in collisions), a mesh or a height field (which "
        f"collide through their mesh or hfield data), or {_NO_CONTACT}, is in no explicit "
        "<contact><pair>, wraps no tendon and no rangefinder sees it: nothing in the "
        "simulation reads its size",
        skip_dead=True,
    ),
    "viscosity": Quantity(
        units="Pa s",
        elements="",
        default=_viscosity[0],
        apply=_viscosity[1],
        requires=_fluid_check,
        prepare=_enable_fluid,
    ),
    "density": Quantity(
        units="kg/m^3",
        elements="",
        default=_density[0],
        apply=_density[1],
        requires=_fluid_check,
        prepare=_enable_fluid,
    ),
    "timestep": Quantity(
        units="s",
        elements="",
        default=lambda sys: _f32(sys.opt.timestep),
        apply=lambda sys, v: sys.tree_replace({"opt.timestep": v}),
        strict=True,
    ),
    "frictionloss": Quantity(
        units="N m",
        elements="dofs",
        default=lambda sys: _f32(sys.dof_frictionloss),
        apply=lambda sys, v: sys.tree_replace({"dof_frictionloss": v}),
        backends=_MJX,
        unsupported_hint=_MJX_HINT,
        live=lambda sys, backend: (
            (np.asarray(sys.dof_frictionloss) > 0)
            & ~_disabled(sys, mujoco.mjtDisableBit.mjDSBL_FRICTIONLOSS)
            & ~_disabled(sys, mujoco.mjtDisableBit.mjDSBL_CONSTRAINT)
        ),
        dead_hint="MJX builds a dof's frictionloss constraint only where the model loads it "
        '> 0 and the model does not switch it off (<flag frictionloss="disable"/> or '
        'constraint="disable"), so any other value there would change nothing',
    ),
    "com_offset": Quantity(
        units="m, added to the loaded centre of mass (x, y, z)",
        elements="bodies",
        default=lambda sys: jnp.zeros((sys.nbody - 1, 3), jnp.float32),
        apply=_com_offset_apply,
        lower=None,
        frozen=_simple_bodies,
        **_ROTATING,
    ),
    "actuator_kp": Quantity(
        units="N/m or N m/rad",
        elements="actuators",
        default=lambda sys: _f32(sys.actuator_gainprm[:, 0]),
        apply=_kp_apply,
        backends=_MJX,
        unsupported_hint=_MJX_HINT,
        requires=_off_on_mjx("actuator_kp", ("ACTUATION",), "the actuator forces"),
        live=_position_servos,
        dead_hint="it is not a position servo (affine bias with biasprm[1] = -gainprm[0] = "
        "-kp): vary 'actuator_gain' for motors",
    ),
    "actuator_kd": Quantity(
        units="N s/m or N m s/rad",
        elements="actuators",
        default=lambda sys: -_f32(sys.actuator_biasprm[:, 2]),
        apply=_kd_apply,
        backends=_MJX,
        unsupported_hint=_MJX_HINT,
        requires=_off_on_mjx("actuator_kd", ("ACTUATION",), "the actuator forces"),
        live=lambda sys, backend: np.asarray(sys.actuator_biastype) == _AFFINE,
        dead_hint="its bias is not affine, so MuJoCo never reads a damping gain for it",
    ),
    "pair_friction": Quantity(
        units="coefficient",
        elements="pairs",
        default=lambda sys: _f32(sys.pair_friction[:, 0]),
        apply=_pair_friction_apply,
        backends=_MJX,
        unsupported_hint=_MJX_HINT,
        requires=_pairs_check,
        live=_pairs_read,
        dead_hint="it is frictionless (condim 1), or the model switches contacts off "
        '(<flag contact="disable"/> or constraint="disable"), so no contact reads its friction',
        through_contacts=True,
    ),
    "elasticity": Quantity(
        units="restitution",
        elements="geoms",
        default=lambda sys: _f32(sys.elasticity),
        apply=lambda sys, v: sys.tree_replace({"elasticity": v}),
        backends=frozenset({"positional", "spring"}),
        unsupported_hint="only the positional and spring backends model restitution.",
        live=_touching,
        dead_hint=f"{_NO_CONTACT} and is in no explicit <contact><pair>, so no contact reads "
        "its restitution",
        skip_dead=True,
        through_contacts=True,
    ),
}
