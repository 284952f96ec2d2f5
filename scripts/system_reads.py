"""Measures which Brax `System` float leaves each physics backend reads.

For every (env, backend) pair: one short rollout (reset with a fixed key, then
`--steps` fixed pseudo-random actions) is jitted once with the System as a
traced argument; then every float leaf of the System is perturbed in turn
(``x * 1.3 + 0.05``, the whole leaf) and the rollout rerun. A leaf is *read*
by the physics when some pipeline state of the trajectory changes (bit for
bit; NaN counts as a change). A leaf that changes only the observation or
reward, never the pipeline state, is *env-only*: the env's Python code looks at
it (humanoid's observed centre of mass reads `link.inertia.mass`) but the
simulation does not.

    python scripts/system_reads.py --out metarl/contexts/system_reads.json

writes the table `metarl.contexts.reads` loads: per backend, the fields that
at least one measured env reads, those that only env code reads and those
that none reads, plus, per env, the backend-read fields that env does not read
(so each env's own set can be rebuilt and re-measured by the tests).
"""

from __future__ import annotations

import dataclasses
import json
import sys as _sys
import time
import warnings
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import tyro

BACKENDS = ("generalized", "mjx", "positional", "spring")
ENVS = ("ant", "halfcheetah", "hopper", "humanoid", "inverted_pendulum")


def perturb(x: np.ndarray) -> np.ndarray:
    """The perturbation applied to one whole leaf."""
    return (np.asarray(x) * 1.3 + 0.05).astype(np.asarray(x).dtype)


def field_name(path) -> str:
    """A tree path rendered in metarl's raw-path syntax ("link.inertia.mass")."""
    return jax.tree_util.keystr(path).lstrip(".")


def float_leaves(sys) -> list[tuple[str, int]]:
    """(raw-path name, flat index) of every non-empty float leaf of `sys`."""
    out = []
    for i, (path, leaf) in enumerate(jax.tree_util.tree_flatten_with_path(sys)[0]):
        dtype = getattr(leaf, "dtype", None)
        if dtype is not None and np.issubdtype(dtype, np.floating) and np.size(leaf) > 0:
            out.append((field_name(path), i))
    return out


def make_rollout(env, steps: int, seed: int = 0):
    """sys -> (pipeline states [steps + 1, ...], observations and rewards [steps + 1, ...])."""
    key = jax.random.PRNGKey(seed)
    actions = jax.random.uniform(
        jax.random.PRNGKey(seed + 1), (steps, env.action_size), minval=-1.0, maxval=1.0
    )

    def rollout(sys):
        old = env.sys
        env.sys = sys
        try:
            state = env.reset(key)

            def step(s, a):
                s = env.step(s, a)
                return s, (s.pipeline_state, (s.obs, s.reward))

            _, (pipes, seen) = jax.lax.scan(step, state, actions)
        finally:
            env.sys = old
        first = (state.pipeline_state, (state.obs, state.reward))
        return jax.tree.map(lambda a, b: jnp.concatenate([a[None], b]), first, (pipes, seen))

    return rollout


def _differs(a, b) -> bool:
    return any(
        not np.array_equal(np.asarray(x), np.asarray(y), equal_nan=True)
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
    )


def measure_pair(env_name: str, backend: str, steps: int = 16) -> dict[str, str]:
    """{field: "read" | "env" | "unread"} for every float leaf, one env and backend.

    One rollout is compiled, vmapped over a batch of two Systems; each call
    puts the System under test in row 0 and compares row 0 with row 0 of the
    unperturbed call. Same program, same row: an unread leaf gives bit-equal
    results. (Comparing rows of one big batch does not work: XLA's CPU code
    computes some rows of a batch differently; and a plain jit of one System
    recompiled for some perturbed leaves.) A System or leaf that cannot be
    traced falls back to a System compiled in as a constant, one compile each.
    """
    from brax import envs

    env = envs.get_environment(env_name, backend=backend)
    leaves, treedef = jax.tree_util.tree_flatten(env.sys)
    rollout = make_rollout(env, steps)
    run = jax.jit(jax.vmap(rollout))

    def call(new_leaves):
        batch = [np.stack([np.asarray(a), np.asarray(b)]) for a, b in zip(new_leaves, leaves)]
        out = run(jax.tree_util.tree_unflatten(treedef, batch))
        return jax.device_get(jax.tree.map(lambda x: x[0], out))

    def call_constant(new_leaves):
        """Fallback: the System as a compile-time constant (one compile per call)."""
        sys = jax.tree_util.tree_unflatten(treedef, new_leaves)
        return jax.device_get(jax.jit(lambda: rollout(sys))())

    try:
        ref_pipes, ref_seen = call(leaves)
    except Exception as e:  # noqa: BLE001 - a System that cannot be traced as a whole
        print(f"  {env_name}/{backend}: System not traceable ({type(e).__name__}); slow path")
        call = call_constant
        ref_pipes, ref_seen = call(leaves)
    out = {}
    for name, i in float_leaves(env.sys):
        new = list(leaves)
        new[i] = perturb(leaves[i])
        try:
            pipes, seen = call(new)
        except Exception as e:  # noqa: BLE001 - e.g. a leaf used where a constant is needed
            if call is call_constant:
                print(f"  {name}: perturbed System fails ({type(e).__name__}); counted read")
                out[name] = "read"
                continue
            print(f"  {name}: not traceable ({type(e).__name__}); compared as constants")
            ref = call_constant(leaves)
            pipes, seen = call_constant(new)
        else:
            ref = (ref_pipes, ref_seen)
        if _differs(pipes, ref[0]):
            out[name] = "read"
        elif _differs(seen, ref[1]):
            out[name] = "env"
        else:
            out[name] = "unread"
    return out


def build_table(envs: Sequence[str], backends: Sequence[str], steps: int) -> dict:
    import brax
    import mujoco

    per_pair: dict[tuple[str, str], dict[str, str]] = {}
    for backend in backends:
        for env_name in envs:
            t = time.perf_counter()
            per_pair[env_name, backend] = measure_pair(env_name, backend, steps)
            n = sum(v == "read" for v in per_pair[env_name, backend].values())
            print(
                f"{backend:12s} {env_name:18s} {n:3d} read of "
                f"{len(per_pair[env_name, backend])} ({time.perf_counter() - t:.1f} s)",
                flush=True,
            )
    table = {
        "about": (
            "System float leaves each backend reads, measured by scripts/system_reads.py: "
            "a leaf is read when perturbing it (x*1.3+0.05) changes some pipeline state of a "
            f"{steps}-step rollout of at least one env; 'env_only' leaves change only the "
            "observation or reward; 'unread' leaves change nothing in any env. "
            "'not_read_by' lists, per env, the 'read' leaves that env does not read."
        ),
        "versions": {
            "jax": jax.__version__,
            "brax": brax.__version__,
            "mujoco": mujoco.__version__,
            "python": _sys.version.split()[0],
        },
        "envs": list(envs),
        "steps": steps,
        "backends": {},
    }
    for backend in backends:
        fields = sorted({f for e in envs for f in per_pair[e, backend]})
        read = [f for f in fields if any(per_pair[e, backend].get(f) == "read" for e in envs)]
        env_only = [
            f
            for f in fields
            if f not in read and any(per_pair[e, backend].get(f) == "env" for e in envs)
        ]
        unread = [f for f in fields if f not in read and f not in env_only]
        table["backends"][backend] = {
            "read": read,
            "env_only": env_only,
            "unread": unread,
            "not_read_by": {
                e: [f for f in read if per_pair[e, backend].get(f) != "read"] for e in envs
            },
        }
    return table


@dataclasses.dataclass(frozen=True)
class Args:
    out: str = "metarl/contexts/system_reads.json"
    envs: tuple[str, ...] = ENVS
    backends: tuple[str, ...] = BACKENDS
    steps: int = 16


def main(args: Args) -> dict:
    warnings.filterwarnings("ignore", category=UserWarning)
    table = build_table(args.envs, args.backends, args.steps)
    with open(args.out, "w") as f:
        json.dump(table, f, indent=1)
        f.write("\n")
    for backend, row in table["backends"].items():
        print(
            f"{backend}: {len(row['read'])} read, {len(row['env_only'])} env-only, "
            f"{len(row['unread'])} unread"
        )
    return table


if __name__ == "__main__":
    main(tyro.cli(Args))
