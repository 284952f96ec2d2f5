"""How far apart the reset strategies' states are: the same random rollout under each.

Every strategy resets a done env to its own fresh reset, so they compute the same
states; XLA compiles each strategy's program differently (what it fuses, the batch
it computes a reset in), and rounds them differently in places. This rolls out
`steps` random actions on `num_envs` envs under each strategy, from the same keys,
and prints, per output (obs, reward, done, positions), the largest difference
from the first strategy and the first step at which they differ ("-": bit for bit).

    python benchmarks/strategy_agreement.py --env hopper --backend mjx --num-envs 32

Results: benchmarks/results/README.md, 2026-11-28 (strategies).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import tyro
from _cli import check_counts

from metarl import contexts as C
from metarl.envs import RESET_STRATEGIES, make_contextual


@dataclasses.dataclass(frozen=True)
class Config:
    env: str = "hopper"
    backend: str = "mjx"
    num_envs: int = 32
    steps: int = 40
    strategies: tuple[str, ...] = ("loop", "dense", "stock")
    """Compared with the first. The stock is stocked and refilled as PPO's rollout does."""
    reset_chunk: float = 0.0625
    stock_depth: int = 4
    seed: int = 5

    def __post_init__(self):
        check_counts(self, ids=("seed",))


OUTPUTS = ("obs", "reward", "done", "positions")


def rollout(cfg: Config, strategy: str) -> tuple[np.ndarray, ...]:
    """`cfg.steps` random steps under `strategy` -> OUTPUTS, each [steps, num_envs, ...]."""
    return tuple(np.asarray(x) for x in program(cfg, strategy)(jax.random.key(cfg.seed)))


def program(cfg: Config, strategy: str) -> jax.stages.Compiled:
    """`rollout`'s compiled program, of a key (its text shows what its loops carry)."""
    space = C.ContextSpace({"gravity": C.Scale(0.5, 1.5), "mass": C.Scale(0.7, 1.3)})
    env = make_contextual(
        cfg.env, space, backend=cfg.backend, reset_strategy=strategy, reset_chunk=cfg.reset_chunk
    )
    stocked = strategy == "stock"
    n, depth = cfg.num_envs, cfg.stock_depth

    def run(key):
        state = jax.vmap(env.reset)(jax.random.split(key, n))
        if stocked:
            state = jax.vmap(lambda s: env.stock(s, depth))(state)

        def body(state, xs):
            t, k = xs
            if stocked:
                state = jax.lax.cond(t % depth == 0, jax.vmap(env.refill), lambda s: s, state)
            action = jax.random.uniform(k, (n, env.action_size), minval=-1, maxval=1)
            state = jax.vmap(env.step)(state, action)
            physics = state.pipeline_state
            q = physics.qpos if hasattr(physics, "qpos") else physics.q
            return state, (state.obs, state.reward, state.done, q)

        steps = jnp.arange(cfg.steps)
        return jax.lax.scan(body, state, (steps, jax.random.split(key, cfg.steps)))[1]

    return jax.jit(run).lower(jax.random.key(cfg.seed)).compile()


def compare(a: tuple[np.ndarray, ...], b: tuple[np.ndarray, ...]) -> list[tuple[float, int | None]]:
    """Per output: (largest absolute difference, first step that differs or None)."""
    out = []
    for x, y in zip(a, b, strict=True):
        diff = np.abs(x.astype(np.float64) - y.astype(np.float64)).reshape(len(x), -1).max(1)
        differs = np.flatnonzero(diff > 0)
        out.append((float(diff.max()), int(differs[0]) if differs.size else None))
    return out


def main(cfg: Config) -> dict[str, list[tuple[float, int | None]]]:
    unknown = [s for s in cfg.strategies if s not in RESET_STRATEGIES]
    if unknown or len(cfg.strategies) < 2:
        raise ValueError(
            f"--strategies: two or more of {', '.join(RESET_STRATEGIES)}, got {cfg.strategies}"
        )
    first, *others = cfg.strategies
    reference = rollout(cfg, first)
    done = float(reference[2].sum())
    print(
        f"{cfg.env} ({cfg.backend}), {cfg.num_envs} envs, {cfg.steps} steps, "
        f"reset_chunk {cfg.reset_chunk}: {done:.0f} episodes ended; against {first}:"
    )
    print(f"{'strategy':10s}" + "".join(f"{name:>22s}" for name in OUTPUTS))
    results = {}
    for strategy in others:
        results[strategy] = compare(rollout(cfg, strategy), reference)
        cells = [f"{d:.2g} from step {s}" if s is not None else "-" for d, s in results[strategy]]
        print(f"{strategy:10s}" + "".join(f"{c:>22s}" for c in cells))
    return results


if __name__ == "__main__":
    main(tyro.cli(Config))
