"""Seeds as a batch axis: PPO env steps/s of 8 seeds x 128 envs against 1 seed x 1024 envs.

Both train the same env with the same PPO settings and the same total number of
envs; they are timed side by side in alternating rounds after a warm-up that
compiles both. Target: the seeded program at least 0.9x the single one.

    python benchmarks/seeds_throughput.py [--env inverted_pendulum] [--rounds 3]
"""

from __future__ import annotations

import dataclasses
import time

import jax
import numpy as np
import tyro
from _cli import check_counts, paired_ratio

from metarl import contexts as C
from metarl.agents import ppo
from metarl.envs import make_contextual


@dataclasses.dataclass(frozen=True)
class Config:
    env: str = "inverted_pendulum"
    seeds: int = 8
    envs_per_seed: int = 128
    core: str = "mlp"
    unroll_length: int = 16
    iterations: int = 20  # PPO iterations per timed round
    rounds: int = 3

    def __post_init__(self):
        check_counts(self)


def _setup(env, cfg: Config, num_seeds: int | None, num_envs: int):
    config = ppo.PPOConfig(
        num_envs=num_envs, unroll_length=cfg.unroll_length, num_minibatches=4, core=cfg.core
    )
    space = ppo.make_train_space(env, config, num_seeds)
    k_train, k_env = ppo.split_keys(ppo.seed_keys(0, num_seeds), 2)
    ts = ppo.init_training_state(space, k_train)
    es = ppo.init_env_state(space, k_env)
    steps = cfg.iterations * config.batch_size
    return space, ts, es, steps * (num_seeds or 1), steps


def main(cfg: Config) -> dict[str, float]:
    space = C.ContextSpace({"gravity": C.Uniform(5.0, 15.0), "mass": C.Scale(0.5, 2.0)})
    env = make_contextual(cfg.env, space, episode_length=500)
    runs = {
        f"{cfg.seeds} seeds x {cfg.envs_per_seed} envs": _setup(
            env, cfg, cfg.seeds, cfg.envs_per_seed
        ),
        f"1 seed x {cfg.seeds * cfg.envs_per_seed} envs": _setup(
            env, cfg, None, cfg.seeds * cfg.envs_per_seed
        ),
    }
    states = {name: (ts, es) for name, (_, ts, es, _, _) in runs.items()}
    rates: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for round_ in range(cfg.rounds + 1):  # round 0 compiles
        # each round's order rotated, as env_throughput's: neither goes first every time
        for name in names[round_ % 2 :] + names[: round_ % 2]:
            space, _, _, total, per_run = runs[name]
            ts, es = states[name]
            start = time.perf_counter()
            ts, es, _ = ppo.run_train(space, ts, es, per_run)
            jax.block_until_ready(ts)
            states[name] = (ts, es)
            if round_:
                rates[name].append(total / (time.perf_counter() - start))
    medians = {name: float(np.median(r)) for name, r in rates.items()}
    seeded, single = medians.values()
    # the geometric mean of the rounds' paired ratios and its 95% t interval, as
    # env_throughput's (until 2026-12-07 the median of the rounds' ratios, with no
    # interval: it could read 0.80 beside two medians of 100)
    ratio, low, high = paired_ratio(*rates.values())
    print(f"device: {jax.devices()[0].device_kind}, env {cfg.env}, core {cfg.core}")
    for name, rate in medians.items():
        print(f"{name:>24}: {rate:12,.0f} env steps/s (median of {cfg.rounds} rounds)")
    print(
        f"{'ratio seeded / single':>24}: {ratio:12.3f}x [{low:.3f}, {high:.3f}] (geometric "
        f"mean of the {cfg.rounds} rounds' ratios, 95% CI; target >= 0.9x)"
    )
    return {"seeded": seeded, "single": single, "ratio": ratio, "ci_low": low, "ci_high": high}


if __name__ == "__main__":
    main(tyro.cli(Config))
