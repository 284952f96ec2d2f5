"""Where a stocked rollout's time goes: its steps, and the refill between blocks.

reset_strategy="stock" (`"auto"` off a CPU) gives every env its next `--depth` fresh
states, and its steps take their fresh state from the stock. This times, in paired
rounds of one process, a block of `--depth` random steps on a stocked batch, and the
refill of the entries those steps used (`jax.vmap(env.refill)` alone: every used
entry, each env's own), each its own jitted
program with its input donated, as PPO's carries the env state. Gravity and per-body
mass are varied. PPO itself refills otherwise since 2026-12-04: with
`refill_stocks`, before each unroll, in whole chunks of envs and only where an env's
stock could run short (default `PPOConfig.stock_depth` = 2 unrolls); this script
times the refill of a stock as deep as one block, where every used entry is refilled
each block. `env_throughput.py --variants contextual_stock` times PPO's way.

    python benchmarks/stock_refill.py --env hopper --num-envs 2048 --depth 16

On 2 CPU cores (2026-11-27), a stock of 16: the refill took 32.6 ms (hopper, 2048
envs) and 73.0 ms (ant on MJX, 1024 envs) when it shifted the stock into order, 16.2
and 27.2 ms as a ring (benchmarks/results/README.md, "2026-11-27 (ring)").
"""

from __future__ import annotations

import dataclasses
import time

import jax
import numpy as np
import tyro
from _cli import check_counts, write_json

import metarl.contexts as C
from metarl.envs import POOL, make_contextual


@dataclasses.dataclass(frozen=True)
class Config:
    env: str = "hopper"
    backend: str = "generalized"
    num_envs: int = 2048
    depth: int = 16  # steps between refills (PPO: unroll_length)
    rounds: int = 5
    out: str | None = None  # a JSON file of the times

    def __post_init__(self):
        check_counts(self)


def main(cfg: Config) -> dict:
    space = C.ContextSpace(
        {"gravity": C.Scale(0.5, 1.5), "mass": C.Scale(0.7, 1.3, per_element=True)}
    )
    env = make_contextual(cfg.env, space, backend=cfg.backend, reset_strategy="stock")
    n, depth = cfg.num_envs, cfg.depth

    def start(key):
        state = jax.vmap(env.reset)(jax.random.split(key, n))
        return jax.vmap(env.refill)(jax.vmap(lambda s: env.stock(s, depth))(state))

    def block(state, key):
        def body(state, k):
            a = jax.random.uniform(k, (n, env.action_size), minval=-1, maxval=1)
            state = jax.vmap(env.step)(state, a)
            return state, state.done.sum()  # the envs this step ended: resets taken

        state, dones = jax.lax.scan(body, state, jax.random.split(key, depth))
        return state, dones.sum()

    programs = {
        "steps": jax.jit(block, donate_argnums=0),
        "refill": jax.jit(lambda s, _: (jax.vmap(env.refill)(s), 0), donate_argnums=0),
    }
    state = jax.jit(start)(jax.random.key(0))
    for program in programs.values():  # compiled (and run once) before any timing
        state, _ = program(state, jax.random.key(1))
    jax.block_until_ready(state)
    times, dones = {name: [] for name in programs}, []
    for r in range(cfg.rounds):
        for name, program in programs.items():
            t = time.perf_counter()
            state, out = program(state, jax.random.key(2 + r))
            jax.block_until_ready(state)
            times[name].append(time.perf_counter() - t)
            if name == "steps":
                dones.append(int(out))
    if bool(np.asarray(state.info[POOL].overrun).any()):
        raise RuntimeError("a done env found its stock empty: the refill did not keep up")
    ms = {name: float(np.median(t)) * 1e3 for name, t in times.items()}
    result = {
        "config": dataclasses.asdict(cfg),
        "device": jax.devices()[0].device_kind,
        "jax": jax.__version__,
        "steps_ms": ms["steps"],
        "refill_ms": ms["refill"],
        "refill_share": ms["refill"] / (ms["steps"] + ms["refill"]),
        "dones_per_block": float(np.median(dones)),
        "times_s": times,
    }
    print(
        f"{cfg.env} ({cfg.backend}), {n} envs, stock of {depth}, median of {cfg.rounds} rounds: "
        f"{depth} steps {ms['steps']:.1f} ms, refill {ms['refill']:.1f} ms "
        f"({result['refill_share']:.1%} of a block; {result['dones_per_block']:.0f} resets)"
    )
    if cfg.out:
        write_json(cfg.out, result)
    return result


if __name__ == "__main__":
    main(tyro.cli(Config))
