"""No silent no-ops: every canonical quantity and every accepted raw path reaches
the physics, every measured no-op raw path is refused, and the checked-in table
of System reads (`metarl/contexts/system_reads.json`) still matches Brax.

One rollout is compiled per backend (hopper, the ranges passed as an argument);
each quantity is then pinned away from its default in turn and the trajectory
compared with the default one.
"""

import pathlib

import jax
import numpy as np
import pytest
from brax import envs as brax_envs
from conftest import load_script

from metarl import contexts as C
from metarl.contexts import paths, reads
from metarl.contexts.quantities import BRAX_POSE_UNTWINNED, QUANTITIES
from metarl.contexts.space import _written
from metarl.envs import make_contextual

ENV = "hopper"
STEPS = 12
RAW_PER_BACKEND = 4
ROOT = pathlib.Path(__file__).resolve().parents[1]
# scale factors away from the default; friction must drop far for hopper's foot
# to slip within a few steps (at 1.5x it sticks and nothing changes)
_OTHER = {"timestep": 0.8, "friction": 0.05}


def _canonical_entries(backend, env_sys):
    """{name: (distribution, default pin, other pin)} for the quantities `backend`
    simulates on hopper, and {name: reason} for those it cannot take."""
    take, skip = {}, {}
    for name in C.CANONICAL_NAMES:
        q = QUANTITIES[name]
        if backend not in q.backends:
            skip[name] = f"not simulated by {backend}"
            continue
        problem = q.requires(env_sys, backend)
        if problem:  # hopper's spring_mass_scale / spring_inertia_scale are 1; no contact pairs
            skip[name] = problem
            continue
        live = np.asarray(q.live(env_sys, backend)) if q.live is not None else np.ones(1, bool)
        if not live.any() or (not q.skip_dead and not live.all()):
            # hopper loads no frictionloss and no position servos: tests/test_model_envs.py
            # perturbs these on an MJCF that has them (friction, geom_size, stiffness: the
            # live elements, here the floor and the foot, or the hinges)
            skip[name] = "hopper has no element that takes it"
            continue
        default = np.asarray(q.default(env_sys))
        if np.all(default == 0):  # a relative scale of 0 is refused: use absolute values
            take[name] = (C.Uniform(0.0, 2.0), 0.0, 0.5)
        else:
            take[name] = (C.Scale(0.05, 2.0), 1.0, _OTHER.get(name, 1.5))
    return take, skip


def _raw_sample(backend, env_sys, canonical):
    """A few raw paths the table marks read by hopper on `backend`, none of which
    writes a field a canonical entry writes (the binding refuses such overlaps), nor,
    on generalized, a copy of the pose whose inverse weights it cannot derive
    (`BRAX_POSE_UNTWINNED`, refused)."""
    row = reads.table()["backends"][backend]
    hopper_reads = [f for f in row["read"] if f not in row["not_read_by"].get(ENV, [])]
    written = set()
    for entry in canonical.entries:
        written |= {f.lstrip(".") for f in _written(entry, canonical.sys)}
    out = []
    for field in hopper_reads:
        if "[" in field or field in written:
            continue
        if backend == "generalized" and field in BRAX_POSE_UNTWINNED:
            continue
        leaf = np.asarray(paths.parse(field).read(env_sys))
        if leaf.size and np.any(leaf != 0):
            out.append(field)
    step = max(1, len(out) // RAW_PER_BACKEND)
    return out[::step][:RAW_PER_BACKEND]


def _rollout(env):
    actions = jax.random.uniform(jax.random.key(1), (STEPS, env.action_size), minval=-1, maxval=1)

    @jax.jit
    def run(ranges):
        state = env.reset(jax.random.key(0), ranges)

        def step(s, a):
            s = env.step(s, a)
            return s, (s.pipeline_state, s.obs)

        return jax.lax.scan(step, state, actions)[1]

    return lambda ranges: jax.device_get(run(ranges))


def _differs(a, b):
    return any(
        not np.array_equal(x, y, equal_nan=True)
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
    )


@pytest.mark.parametrize("backend", C.BACKENDS)
def test_every_quantity_and_read_raw_path_changes_the_trajectory(backend):
    env_sys = brax_envs.get_environment(ENV, backend=backend).sys
    take, skip = _canonical_entries(backend, env_sys)
    canonical = C.bind(C.ContextSpace({n: d for n, (d, _, _) in take.items()}), env_sys, backend)
    raw = _raw_sample(backend, env_sys, canonical)
    assert raw, f"no raw path to check on {backend}"
    dists = {n: d for n, (d, _, _) in take.items()}
    dists.update({f: C.Scale(0.5, 2.0) for f in raw})
    pins = {n: (d0, d1) for n, (_, d0, d1) in take.items()}
    pins.update({f: (1.0, 1.5) for f in raw})
    env = make_contextual(ENV, C.ContextSpace(dists), backend=backend, episode_length=1000)
    run = _rollout(env)
    default = {n: p[0] for n, p in pins.items()}
    reference = run(env.space.pinned(default))
    unchanged = [
        n
        for n, (_, other) in pins.items()
        if not _differs(run(env.space.pinned({**default, n: other})), reference)
    ]
    assert not unchanged, f"{backend}: these contexts change nothing: {unchanged}"
    assert set(take) | set(skip) == set(C.CANONICAL_NAMES)


NO_OPS = [
    ("generalized", "link.constraint_stiffness"),
    ("generalized", "link.constraint_ang_damping"),
    ("mjx", "link.constraint_stiffness"),
    ("mjx", "link.constraint_ang_damping"),
    ("mjx", "link.inertia.mass"),
    ("spring", "link.inertia.mass"),  # hopper's spring_mass_scale is 1
    ("spring", "link.inertia.i"),
    ("positional", "link.inertia.mass"),
]


@pytest.mark.parametrize("backend,path", NO_OPS, ids=[f"{b}-{p}" for b, p in NO_OPS])
def test_measured_no_op_raw_paths_are_refused(backend, path):
    env_sys = brax_envs.get_environment(ENV, backend=backend).sys
    with pytest.raises(ValueError, match=f"{backend!r}"):
        C.bind(C.ContextSpace({path: C.Scale(0.5, 2.0)}), env_sys, backend)


def test_old_hand_written_refusals_still_hold():
    """What the hand-written list refused before the table replaced it."""
    for backend, field in [
        ("generalized", "body_mass"),
        ("generalized", "opt.gravity"),
        ("generalized", "dof_damping"),
        ("generalized", "vel_damping"),
        ("mjx", "gravity"),
        ("mjx", "dof.damping"),
        ("mjx", "actuator.gear"),
        ("positional", "dof_damping"),
        ("positional", "opt.gravity"),
    ]:
        assert reads.unread(backend, field), (backend, field)


def _script():
    return load_script(ROOT / "scripts/system_reads.py", "system_reads")


def test_checked_in_table_matches_a_fresh_measurement():
    """Re-measures one cheap pair: a Brax upgrade that changes reads fails here
    (rerun scripts/system_reads.py and commit the new table)."""
    table = reads.table()
    env_name, backend = "inverted_pendulum", "generalized"
    measured = _script().measure_pair(env_name, backend, table["steps"])
    row = table["backends"][backend]
    expected = set(row["read"]) - set(row["not_read_by"][env_name])
    got = {f for f, v in measured.items() if v == "read"}
    assert got == expected, (
        f"{env_name}/{backend}: newly read {sorted(got - expected)}, "
        f"no longer read {sorted(expected - got)}"
    )
