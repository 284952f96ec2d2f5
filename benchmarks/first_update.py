"""Time to PPO's first update: its programs compiled one after the other, or at once.

Each measurement is a fresh process (nothing cached in memory, JAX's persistent
cache off), the variants alternating round by round. A process builds the env,
starts the clock, builds the train space, compiles (variant "precompile":
`ppo.precompile`, the programs in threads; "sequential": each in its first call),
initialises both states and runs one PPO iteration (one update round), and stops
the clock when its result is on the host. The PPO settings are ppo_throughput.py's
(same networks and sizes), whose Brax PPO compile time is the figure to compare
with (measured there, in its own run).

    python benchmarks/first_update.py --env hopper --num-envs 2048 --unroll-length 16 \\
        --num-minibatches 16 --rounds 3

`--xla-flags` adds a variant per flag set: "precompile" with those XLA_FLAGS.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import tyro

VARIANTS = ("sequential", "precompile")


@dataclasses.dataclass(frozen=True)
class Config:
    env: str = "inverted_pendulum"
    num_envs: int = 512
    unroll_length: int = 16
    num_minibatches: int = 8
    rounds: int = 3
    core: str = "mlp"
    # extra variants: "precompile" under each of these XLA_FLAGS strings
    xla_flags: tuple[str, ...] = ()
    out: str | None = None  # a JSON file for every measurement
    worker: str | None = None  # internal: run one measurement of this variant


def _measure(cfg: Config, variant: str) -> dict:
    import jax

    from metarl import contexts as C
    from metarl.agents import ppo
    from metarl.envs import make_contextual

    env = make_contextual(cfg.env, C.ContextSpace({}), episode_length=1000)
    config = ppo.PPOConfig(
        num_envs=cfg.num_envs,
        unroll_length=cfg.unroll_length,
        num_minibatches=cfg.num_minibatches,
        core=cfg.core,
        hidden_size=32,
        policy_hidden=(32, 32),  # ppo_throughput.py's POLICY and VALUE
        value_hidden=(64, 64),
        rl2_inputs=cfg.core != "mlp",
    )
    start = time.perf_counter()
    space = ppo.make_train_space(env, config)
    compiled = ppo.precompile(space) if variant == "precompile" else None
    k_train, k_env = ppo.split_keys(ppo.seed_keys(0), 2)
    ts = ppo.init_training_state(space, k_train)
    es = ppo.init_env_state(space, k_env)
    ts, es, metrics = ppo.run_train(space, ts, es, config.batch_size)
    jax.block_until_ready(ts)
    return {
        "seconds": time.perf_counter() - start,
        "precompile_s": compiled,
        "loop_compile_s": metrics["compile_seconds"],
        "device": str(jax.devices()[0].device_kind),
    }


def main(cfg: Config) -> None:
    if cfg.worker is not None:
        print(json.dumps(_measure(cfg, cfg.worker)))
        return
    inherited = os.environ.get("XLA_FLAGS", "")
    variants = {v: (v, inherited) for v in VARIANTS}
    for flags in cfg.xla_flags:
        variants[f"precompile {flags}"] = ("precompile", f"{inherited} {flags}")
    args = [f"--env={cfg.env}", f"--num-envs={cfg.num_envs}", f"--core={cfg.core}"]
    args += [f"--unroll-length={cfg.unroll_length}", f"--num-minibatches={cfg.num_minibatches}"]
    runs = {name: [] for name in variants}
    for r in range(cfg.rounds):
        for name, (variant, flags) in variants.items():
            env = dict(os.environ, XLA_FLAGS=flags.strip(), JAX_ENABLE_COMPILATION_CACHE="false")
            done = subprocess.run(
                [sys.executable, __file__, *args, "--worker", variant],
                env=env,
                capture_output=True,
                text=True,
            )
            if done.returncode:
                raise RuntimeError(f"{name} failed:\n{done.stderr[-3000:]}")
            result = json.loads(done.stdout.strip().splitlines()[-1])
            runs[name].append(result)
            print(f"round {r} {name}: {result}", flush=True)
    base = np.median([x["seconds"] for x in runs["sequential"]])
    print(f"\ntime to the first update, median of {cfg.rounds} fresh processes (min-max)")
    for name, xs in runs.items():
        s = [x["seconds"] for x in xs]
        print(
            f"{name:<40}{np.median(s):>8.1f} s ({min(s):.1f}-{max(s):.1f})"
            f"{np.median(s) / base:>8.2f}x sequential"
        )
    if cfg.out:
        Path(cfg.out).parent.mkdir(parents=True, exist_ok=True)
        Path(cfg.out).write_text(json.dumps({"config": dataclasses.asdict(cfg), "runs": runs}))
        print(f"wrote {cfg.out}")


if __name__ == "__main__":
    main(tyro.cli(Config))
