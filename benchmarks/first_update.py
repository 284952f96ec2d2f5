"""Time to PPO's first update: its programs compiled one after the other, or at once.

Each measurement is a fresh process (nothing cached in memory, JAX's persistent
cache off), the variants alternating round by round. A process builds the env,
starts the clock, builds the train space, compiles (variant "precompile":
`ppo.precompile`, the programs in threads; "sequential": each in its first call),
initialises both states and runs one PPO iteration (one update round), and stops
the clock when its result is on the host. The PPO settings are ppo_throughput.py's
(same networks, sizes and constants). Variant "brax" is Brax PPO with the same
settings, in a process of its own alike: the env built before the clock, then its
`train` until its first progress report, which comes once its first update round is
on the host (evaluations off; the build of its evaluator timed apart and left out,
`with_evaluator_s` keeps it). It runs with `--core mlp` only (Brax has no GRU).

    python benchmarks/first_update.py --env hopper --num-envs 2048 --unroll-length 16 \\
        --num-minibatches 16 --rounds 3

`--variants brax precompile` runs only those, in that order. `--xla-flags` adds a
variant per flag set: "precompile" with those XLA_FLAGS.
`--strategies dense loop noreset` adds "sequential" with the env's reset strategy
forced, or with done envs never reset ("noreset", not exact): what the exact reset
compiled into the training program costs. `--then N` also times N more iterations
in each of metarl's processes (what a faster-compiling strategy gives up in speed).
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
from _cli import check_counts

from metarl import provenance

VARIANTS = ("sequential", "precompile", "brax")


@dataclasses.dataclass(frozen=True)
class Config:
    env: str = "inverted_pendulum"
    num_envs: int = 512
    unroll_length: int = 16
    num_minibatches: int = 8
    rounds: int = 3
    core: str = "mlp"
    # which of VARIANTS to run (None: all; "brax" with --core mlp only)
    variants: tuple[str, ...] | None = None
    # extra variants: "precompile" under each of these XLA_FLAGS strings
    xla_flags: tuple[str, ...] = ()
    # extra variants "sequential:<strategy>": the env's reset strategy forced (dense,
    # loop, pool, ...), or "noreset": dense with done envs never reset (not exact; what
    # the exact resets cost, as env_throughput.py's ablate_noreset)
    strategies: tuple[str, ...] = ()
    # then time this many more iterations (metarl's variants): the steady speed that a
    # faster-compiling strategy may give up
    then: int = 0
    out: str | None = None  # a JSON file for every measurement
    worker: str | None = None  # internal: run one measurement of this variant

    def __post_init__(self):
        check_counts(self, zero_ok=("then",))


def _settings(cfg: Config):
    """ppo_throughput.py's settings (networks, sizes, PPO constants) for one update."""
    import ppo_throughput

    return ppo_throughput.Config(
        env=cfg.env,
        num_envs=cfg.num_envs,
        unroll_length=cfg.unroll_length,
        num_minibatches=cfg.num_minibatches,
        num_timesteps=cfg.num_envs * cfg.unroll_length,  # one update round
        segments=1,
    )


def _measure(cfg: Config, variant: str) -> dict:
    import jax

    if variant == "brax":
        return _measure_brax(cfg)
    import ppo_throughput

    from metarl import contexts as C
    from metarl.agents import ppo
    from metarl.envs import make_contextual

    variant, _, strategy = variant.partition(":")
    forced = {"reset_strategy": "dense" if strategy == "noreset" else strategy} if strategy else {}
    env = make_contextual(cfg.env, C.ContextSpace({}), episode_length=1000, **forced)
    if strategy == "noreset":
        import env_throughput

        env = env_throughput._ablated(env, "noreset")
    config = ppo_throughput.metarl_config(_settings(cfg), cfg.core)
    start = time.perf_counter()
    space = ppo.make_train_space(env, config)
    compiled = ppo.precompile(space) if variant == "precompile" else None
    k_train, k_env = ppo.split_keys(ppo.seed_keys(0), 2)
    ts = ppo.init_training_state(space, k_train)
    es = ppo.init_env_state(space, k_env)
    ts, es, metrics = ppo.run_train(space, ts, es, config.batch_size)
    jax.block_until_ready(ts)
    seconds = time.perf_counter() - start
    then = None
    if cfg.then:
        start = time.perf_counter()
        ts, es, _ = ppo.run_train(space, ts, es, cfg.then * config.batch_size)
        jax.block_until_ready(ts)
        then = time.perf_counter() - start
    return {
        "seconds": seconds,
        "precompile_s": compiled,
        "loop_compile_s": metrics["compile_seconds"],
        "then_s": then,  # the --then iterations after the first
        "platform": provenance.platform(),  # the worker's: device, XLA_FLAGS, JAX settings
    }


def _measure_brax(cfg: Config) -> dict:
    """Brax PPO's `train`, from its call to its first progress report, which it makes
    once its first training epoch (here one update round, evaluations off) is on the
    host. Its evaluator's build (compiling and running the eval env's reset) is timed
    apart, as ppo_throughput.py does, and left out of `seconds` (metarl's has no
    evaluator); `with_evaluator_s` keeps it in."""
    import ppo_throughput as bench
    from brax import envs as brax_envs
    from brax.training.agents.ppo import train as brax_train

    if cfg.core != "mlp":
        raise ValueError(f"Brax PPO has no {cfg.core!r} core: run the brax variant with mlp")
    environment = brax_envs.get_environment(cfg.env)  # built before the clock, as metarl's
    reported, outside = [], {}
    kwargs = bench.brax_kwargs(_settings(cfg), seed=0) | {"num_evals": 2, "run_evals": False}
    with bench._timed(brax_train.acting.Evaluator, "__init__", outside, "evaluator_build_s", True):
        start = time.perf_counter()
        brax_train.train(
            environment=environment,
            progress_fn=lambda step, metrics: reported.append(time.perf_counter()),
            **kwargs,
        )
    if len(reported) != 1 or "evaluator_build_s" not in outside:
        raise RuntimeError(
            f"Brax PPO reported {len(reported)} times (expected once, after its first "
            f"epoch) and timed {sorted(outside)}: its train.py changed, update _measure_brax"
        )
    with_evaluator = reported[0] - start
    return {
        "seconds": with_evaluator - outside["evaluator_build_s"],
        "with_evaluator_s": with_evaluator,
        **outside,
        "platform": provenance.platform(),  # the worker's: device, XLA_FLAGS, JAX settings
    }


def _variants(cfg: Config) -> tuple[str, ...]:
    if cfg.variants is None:
        return tuple(v for v in VARIANTS if v != "brax" or cfg.core == "mlp")
    unknown = [v for v in cfg.variants if v not in VARIANTS]
    if unknown or not cfg.variants:
        raise ValueError(f"unknown variants {unknown}: choose among {', '.join(VARIANTS)}")
    if "brax" in cfg.variants and cfg.core != "mlp":
        raise ValueError(f"variant brax runs with --core mlp only (Brax has no {cfg.core})")
    return tuple(dict.fromkeys(cfg.variants))


def main(cfg: Config) -> None:
    if cfg.worker is not None:
        print(json.dumps(_measure(cfg, cfg.worker)))
        return
    inherited = os.environ.get("XLA_FLAGS", "")
    variants = {v: (v, inherited) for v in _variants(cfg)}
    for flags in cfg.xla_flags:
        variants[f"precompile {flags}"] = ("precompile", f"{inherited} {flags}")
    for strategy in cfg.strategies:
        variants[f"sequential:{strategy}"] = (f"sequential:{strategy}", inherited)
    args = [f"--env={cfg.env}", f"--num-envs={cfg.num_envs}", f"--core={cfg.core}"]
    args += [f"--unroll-length={cfg.unroll_length}", f"--num-minibatches={cfg.num_minibatches}"]
    args += [f"--then={cfg.then}"]
    runs = {name: [] for name in variants}
    names = list(variants)
    for r in range(cfg.rounds):
        # each round starts with another variant, as env_throughput's rounds do
        for name in names[r % len(names) :] + names[: r % len(names)]:
            variant, flags = variants[name]
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
    median = lambda name: np.median([x["seconds"] for x in runs[name]]) if name in runs else np.nan  # noqa: E731
    ratios = (("sequential", median("sequential")), ("brax", median("brax")))
    print(f"\ntime to the first update, median of {cfg.rounds} fresh processes (min-max)")
    for name, xs in runs.items():
        s = [x["seconds"] for x in xs]
        loop = [x["loop_compile_s"] for x in xs if x.get("loop_compile_s")]
        then = [x["then_s"] for x in xs if x.get("then_s")]
        print(
            f"{name:<40}{np.median(s):>8.1f} s ({min(s):.1f}-{max(s):.1f})"
            + "".join(f"{np.median(s) / b:>8.2f}x {n}" for n, b in ratios if not np.isnan(b))
            + (f"   (training loop's compile {np.median(loop):.1f} s)" if loop else "")
            + (f"   ({cfg.then} more iterations {np.median(then):.2f} s)" if then else "")
        )
    if cfg.out:
        Path(cfg.out).parent.mkdir(parents=True, exist_ok=True)
        software = provenance.software()
        record = {"config": dataclasses.asdict(cfg), "software": software, "runs": runs}
        Path(cfg.out).write_text(json.dumps(record))
        print(f"wrote {cfg.out}")


if __name__ == "__main__":
    main(tyro.cli(Config))
