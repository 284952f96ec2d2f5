"""Is a training run bit-reproducible on this device, and what does determinism cost?

Trains one short PPO run (a contextual env, the same seed) in `--processes`
fresh Python processes for each entry of `--settings`, and compares a
SHA-256 digest of everything the run produced: final parameters, optimizer
state, observation statistics, every segment's metrics and a held-out
evaluation. Each process compiles for itself (no persistent compilation
cache), as a new run or a resumed one does. Prints, per flag setting, whether
all processes gave the same digest, the median training steps/s and its ratio to the
first setting's (process k against process k, the order of the settings rotated with
k; geometric mean with a 95% t interval), so one call tells both whether runs repeat
and what the setting costs.

On a CPU every process gives the same digest. On a GPU, XLA's scatter-adds
(used by the physics) and its autotuned kernels may differ from run to run;
``--xla_gpu_deterministic_ops=true`` is XLA's switch against that:

    python benchmarks/reproducibility.py --env hopper --num-envs 2048 --processes 3 \
        --settings default xla_gpu_deterministic_ops=true --out repro.json

Each entry of `--settings` is a comma-separated list of XLA flags without their
leading ``--`` ("default": none), added to the XLA_FLAGS the script was started
with.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import tyro
from _cli import check_counts, paired_ratio, write_json

from metarl import provenance

MARKER = "reproducibility-result: "
# `run_train`'s metrics that are wall-clock times, not results: they differ between
# identical runs, so the digest leaves them out
TIMES = ("env_steps_per_sec", "compile_seconds")


@dataclasses.dataclass(frozen=True)
class Config:
    env: str = "inverted_pendulum"
    core: str = "gru"  # metarl.agents.networks.CORES
    num_envs: int = 256
    num_timesteps: int = 120_000
    segments: int = 3  # the first includes compilation; steps/s is the median of the others
    processes: int = 2  # fresh processes per flag setting
    settings: tuple[str, ...] = ("default",)  # XLA flags without "--", comma-separated
    # within one setting; "default": none
    seed: int = 0  # the run's seed (the same in every process)
    out: str | None = None  # a JSON file for every process's digest and speed
    child: bool = False  # internal: train once and print the result

    def __post_init__(self):
        check_counts(self, ids=("seed",))
        # one name twice collected both entries' processes under one key: the row
        # compared a merged list with itself (ratio 1.000), or refused only after
        # every process had trained; flags in another order are the same setting
        seen = {}
        for setting in self.settings:
            flags = tuple(sorted(xla_flags(setting).split()))
            if flags in seen:
                raise ValueError(
                    f"--settings names one setting twice: {seen[flags]!r} and {setting!r} "
                    f"(the same XLA flags); name each setting once"
                )
            seen[flags] = setting


def _digest(tree, metrics: list[dict], eval_mean) -> str:
    import jax

    from metarl.trees import to_numpy

    digest = hashlib.sha256()
    for leaf in jax.tree.leaves(to_numpy(tree)):
        digest.update(leaf.tobytes())
    for m in metrics:
        for key in sorted(m):
            if key not in TIMES:
                digest.update(f"{key}={np.asarray(m[key]).tobytes().hex()};".encode())
    digest.update(np.asarray(eval_mean).tobytes())
    return digest.hexdigest()


def train_once(cfg: Config) -> dict:
    """One run in this process: its digest, median steps/s and final eval return."""
    import jax

    from metarl import contexts as C
    from metarl import evaluation as E
    from metarl.agents import ppo
    from metarl.envs import make_contextual

    space = C.ContextSpace(
        {"gravity": C.Scale(0.7, 1.3), "mass": C.Scale(0.7, 1.3, per_element=True)}
    )
    env = make_contextual(cfg.env, space, episode_length=1000)
    config = ppo.PPOConfig(
        num_envs=cfg.num_envs,
        unroll_length=16,
        num_minibatches=8,
        core=cfg.core,
        hidden_size=32 if cfg.core != "mlp" else ppo.PPOConfig.hidden_size,  # mlp: none
        policy_hidden=(32, 32),
        rl2_inputs=cfg.core != "mlp",
        seed=cfg.seed,
    )
    train_space, ts, history = ppo.train(env, config, cfg.num_timesteps, segments=cfg.segments)
    result = E.Evaluator(env, episodes=2, max_contexts=4).evaluate(
        ppo.make_policy(train_space, ts), E.in_distribution(space, 4, 1, env), jax.random.key(2)
    )
    return {
        "digest": _digest(ts, history, result.mean),
        "steps_per_sec": float(np.median([m["env_steps_per_sec"] for m in history[1:]])),
        "eval_return": float(np.mean(result.mean)),
        "platform": jax.devices()[0].platform,
        "device": jax.devices()[0].device_kind,
        "provenance": provenance.platform(),  # XLA_FLAGS and JAX settings of this process
    }


def _child_command(cfg: Config) -> list[str]:
    args = [sys.executable, __file__, "--child"]
    for field in ("env", "core", "num_envs", "num_timesteps", "segments", "seed"):
        args += [f"--{field.replace('_', '-')}", str(getattr(cfg, field))]
    return args


def xla_flags(setting: str) -> str:
    """One `--settings` entry as XLA_FLAGS text: "a=1,b=2" -> "--a=1 --b=2"."""
    if setting == "default":
        return ""
    return " ".join(f"--{flag.strip().removeprefix('--')}" for flag in setting.split(","))


def run_process(cfg: Config, setting: str, k: int) -> dict:
    """Process k: a fresh process with `setting`'s flags added to XLA_FLAGS."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = " ".join(f for f in (env.get("XLA_FLAGS", ""), xla_flags(setting)) if f)
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # each process compiles for itself
    proc = subprocess.run(_child_command(cfg), env=env, capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARKER)]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(
            f"process {k} with XLA_FLAGS={env['XLA_FLAGS']!r} failed "
            f"(exit {proc.returncode}):\n{proc.stderr[-3000:]}"
        )
    result = json.loads(lines[-1][len(MARKER) :])
    print(f"  XLA_FLAGS={env['XLA_FLAGS']!r} process {k}: {result}", flush=True)
    return result


def main(cfg: Config) -> dict:
    if cfg.child:
        print(MARKER + json.dumps(train_once(cfg)), flush=True)
        return {}
    if cfg.processes < 2:
        raise ValueError(f"--processes must be at least 2 to compare runs, got {cfg.processes}")
    if cfg.segments < 2:
        raise ValueError(f"--segments must be at least 2 (the first compiles), got {cfg.segments}")
    # process k of every setting in turn (before 2026-12-05 one setting's processes all
    # ran, then the next's), the order rotated with k as the other benchmarks' rounds
    # (before 2026-12-07 the first setting always ran first: under a drift in the
    # machine's speed each later setting read slower, identical settings 1% apart)
    settings = list(cfg.settings)
    runs = {setting: [] for setting in settings}
    for k in range(cfg.processes):
        shift = k % len(settings)
        for setting in settings[shift:] + settings[:shift]:
            runs[setting].append(run_process(cfg, setting, k))
    print(
        f"\n{cfg.env}, {cfg.core}, {cfg.num_envs} envs, {cfg.num_timesteps} steps, seed {cfg.seed}"
    )
    first = settings[0]
    print(
        f"{'setting':<40}{'same digest':>12}{'steps/s':>10}{f'vs {first[:12]} [95% CI]':>28}"
        f"{'eval returns':>28}"
    )
    summary = {}
    for setting, results in runs.items():
        same = len({r["digest"] for r in results}) == 1
        speeds = [r["steps_per_sec"] for r in results]
        sps = float(np.median(speeds))
        # process k's steps/s against the first setting's process k: the geometric mean
        # of these ratios and its t interval, as env_throughput's rounds
        ratio, low, high = paired_ratio(speeds, [r["steps_per_sec"] for r in runs[first]])
        returns = ", ".join(f"{r['eval_return']:.1f}" for r in results)
        vs = f"{ratio:.3f} [{low:.3f}, {high:.3f}]"
        print(f"{setting:<40}{str(same):>12}{sps:>10,.0f}{vs:>28}{returns:>28}")
        summary[setting] = {
            "same_digest": same,
            "steps_per_sec": sps,
            "ratio": ratio,
            "ratio_ci_low": low,
            "ratio_ci_high": high,
        }
    if cfg.out:
        record = {
            "config": dataclasses.asdict(cfg),
            "software": provenance.software(),
            "runs": runs,
            "summary": summary,
        }
        write_json(cfg.out, record)
    return summary


if __name__ == "__main__":
    main(tyro.cli(Config))
