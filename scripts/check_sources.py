"""`check_env` over many envs: does every common context reach the physics of every
env and backend it is accepted on? For each env, each context of `CONTEXTS` is bound
on its own (a refusal, with its reason, is recorded: gravity on a planar arm, friction
where nothing collides, ...); then the env with every accepted context at once runs
`check_env`. Prints one line per env and writes a JSON report.

    python scripts/check_sources.py --envs playground/CheetahRun hopper:spring
    python scripts/check_sources.py --envs all-playground --out sweep.json

An env is a Brax name with an optional ``:backend`` (``walker2d:spring``) or
``playground/<name>``; ``all-playground`` stands for every dm_control-suite env
Playground ships (its assets come with it). On 2 CPU cores an env takes 15-130 s;
pusher on mjx takes much longer (MJX's many contact pairs), so it is not in
``all-brax``; swimmer is, on generalized, the one backend Brax builds it on.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import time

import tyro

from metarl import contexts as C
from metarl.envs import check_env, make_contextual

CONTEXTS = {
    "gravity": C.Uniform(5.0, 15.0),
    "mass": C.Scale(0.5, 2.0),
    "inertia": C.Scale(0.5, 2.0),
    "friction": C.Scale(0.5, 1.5),
    "damping": C.Scale(0.5, 2.0),
    "armature": C.Scale(0.5, 2.0),
    "actuator_gain": C.Scale(0.5, 1.5),
    "elasticity": C.Uniform(0.0, 0.5),
    "viscosity": C.Uniform(0.0, 0.5),
}
BRAX = ("ant", "halfcheetah", "hopper", "humanoid", "humanoidstandup", "inverted_pendulum")
BRAX += ("inverted_double_pendulum", "pusher", "reacher", "walker2d")
GENERALIZED_ONLY = ("swimmer",)  # Brax builds it on no other backend


def _expand(envs: list[str]) -> list[str]:
    out = []
    for e in envs:
        if e == "all-playground":
            from mujoco_playground import registry

            out += [f"playground/{n}" for n in registry.dm_control_suite.ALL_ENVS]
        elif e == "all-brax":
            for backend in ("generalized", "mjx", "positional", "spring"):
                out += [f"{n}:{backend}" for n in BRAX if (n, backend) != ("pusher", "mjx")]
            out += [f"{n}:generalized" for n in GENERALIZED_ONLY]
        else:
            out.append(e)
    return out


def check(env: str, episode_length: int, num_envs: int, max_steps: int) -> dict:
    name, _, backend = env.partition(":")
    kwargs = {"episode_length": episode_length}
    if backend:
        kwargs["backend"] = backend
    accepted, refused = {}, {}
    for ctx, dist in CONTEXTS.items():
        try:
            make_contextual(name, C.ContextSpace({ctx: dist}), **kwargs)
            accepted[ctx] = dist
        except ValueError as e:
            refused[ctx] = str(e)
    start = time.perf_counter()
    try:
        report = check_env(
            make_contextual(name, C.ContextSpace(accepted), **kwargs), num_envs, max_steps
        )
        failure = None
    except AssertionError as e:  # ContractError
        report, failure = None, str(e)
    return {
        "env": env,
        "accepted": list(accepted),
        "refused": refused,
        "report": report,
        "failure": failure,
        "seconds": round(time.perf_counter() - start, 1),
    }


@dataclasses.dataclass(frozen=True)
class Args:
    envs: list[str] = dataclasses.field(default_factory=lambda: ["all-playground"])
    episode_length: int = 100  # short, so that random actions end trials
    num_envs: int = 4
    max_steps: int = 250
    out: pathlib.Path | None = None  # JSON report


def main(args: Args) -> int:
    rows = []
    for env in _expand(args.envs):
        row = check(env, args.episode_length, args.num_envs, args.max_steps)
        rows.append(row)
        verdict = f"FAIL {row['failure']}" if row["failure"] else "ok"
        print(
            f"{env}: {len(row['accepted'])} accepted, {len(row['refused'])} refused "
            f"({', '.join(row['refused'])}); check_env {verdict} ({row['seconds']} s)",
            flush=True,
        )
        if args.out:
            args.out.write_text(json.dumps(rows, indent=1))
    return int(any(r["failure"] for r in rows))


if __name__ == "__main__":
    raise SystemExit(main(tyro.cli(Args)))
