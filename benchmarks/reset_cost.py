"""What exact resets cost a step on a CPU: a fixed cost per trip and a cost per env.

Plain Brax never resets inside a step: its auto-reset copies back a cached first state.
A contextual env gives every done env its own reset under a fresh context; on a CPU
(the "loop" strategy) it computes them in trips of ``ceil(reset_chunk * num_envs)``
envs, as many trips as the step's done envs need. This times, in paired rounds of one
process:

* plain Brax's step (`brax.envs.training.wrap`), `--steps` random steps in one jitted
  scan, which also counts the envs done at each step (their median: D);
* the loop's resets inside a program, as a step runs them: `--calls` selects in a scan
  over the whole batch, with 0 and with D envs done, for each `--chunks` (the trip size
  as a fraction of the batch; its env's `reset_chunk`). Their difference is what the
  resets of a step cost, as a share of plain Brax's step: the steps/s a contextual env
  loses to its resets alone;
* one env's exact reset (the draw, its derived constants and the env's own reset under
  that System) and Brax's own reset (default System), each vmapped at `--sizes`, as
  calls of their own: a line fitted to each (least squares) splits it into a fixed cost
  per call and a cost per env. A call of its own also pays its dispatch from Python,
  which a trip inside a step does not.

    python benchmarks/reset_cost.py --envs inverted_pendulum hopper --num-envs 1024

On 2 cores of an Intel Xeon (2026-12-03): benchmarks/results/README.md, "2026-12-03,
twelfth session".
"""

from __future__ import annotations

import dataclasses
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
import tyro
from _cli import check_counts, check_envs, per_env_results
from brax import envs as brax_envs
from brax.envs.wrappers import training as brax_training
from env_throughput import _space

from metarl.envs import make_contextual
from metarl.envs.autoreset import trip_size


@dataclasses.dataclass(frozen=True)
class Config:
    envs: tuple[str, ...] = ("inverted_pendulum", "hopper")
    num_envs: int = 1024
    backend: str | None = None  # None: each env's default backend
    chunks: tuple[float, ...] = (0.0625, 0.25)  # reset_chunk values timed (default first)
    sizes: tuple[int, ...] = (2, 64, 256, 1024)  # batch sizes of the resets' own calls
    steps: int = 100  # plain Brax's steps per timed call
    calls: int = 20  # selects (in one scan) or reset calls per timed round
    rounds: int = 7
    out: str | None = None  # a JSON file of the results

    def __post_init__(self):
        check_counts(self)
        check_envs(self)
        if not all(0 < c <= 1 for c in self.chunks) or not self.chunks:
            raise ValueError(f"--chunks must be fractions in (0, 1], got {self.chunks}")
        if any(s > self.num_envs for s in self.sizes) or len(set(self.sizes)) < 2:
            raise ValueError(
                f"--sizes: at least two sizes, each at most --num-envs ({self.num_envs}); "
                f"got {self.sizes}"
            )


def fit_line(sizes, ms) -> tuple[float, float]:
    """(intercept ms, slope ms per env) of the least-squares line through the points."""
    slope, intercept = np.polyfit(np.asarray(sizes, float), np.asarray(ms, float), 1)
    return float(intercept), float(slope)


def _plain(name: str, cfg: Config):
    env = brax_envs.get_environment(name, **_env_kwargs(cfg))
    env = brax_training.wrap(env, episode_length=1000)
    n = cfg.num_envs

    def rollout(state, key):
        def body(s, k):
            a = jax.random.uniform(k, (n, env.action_size), minval=-1, maxval=1)
            s = env.step(s, a)
            return s, s.done.sum()

        return jax.lax.scan(body, state, jax.random.split(key, cfg.steps))

    first = jax.jit(env.reset)(jax.random.split(jax.random.key_data(jax.random.key(0)), n))
    return jax.jit(rollout), first


def _selects(ctx, done: jax.Array, calls: int):
    """`calls` selects of the loop in a scan, `done` fixed; each select's operands are
    those of another reset number, so that XLA cannot hoist the resets out of the scan."""
    select = jax.vmap(ctx._select)  # noqa: SLF001

    def run(operand, current):
        def body(cur, i):
            key, resets, *rest = operand
            return select(done, (key, resets + i, *rest), cur), None

        return jax.lax.scan(body, current, jnp.arange(calls))[0]

    return jax.jit(run)


def _env_kwargs(cfg: Config) -> dict:
    return {} if cfg.backend is None else {"backend": cfg.backend}


def _programs(name: str, cfg: Config, dones: int) -> dict:
    """{label: (jitted program, its arguments)}."""
    kwargs = _env_kwargs(cfg)
    raw = brax_envs.get_environment(name, **kwargs)
    n = cfg.num_envs
    programs = {}
    for chunk in cfg.chunks:
        ctx = make_contextual(
            name,
            _space(raw.sys, kwargs.get("backend", "generalized")),
            episode_length=1000,
            reset_strategy="loop",
            reset_chunk=chunk,
            **kwargs,
        )
        state = jax.jit(jax.vmap(ctx.reset))(jax.random.split(jax.random.key(1), n))
        trial, drawn = state.info["trial"], (state.info["context"], state.info["derived"])
        operand = jax.vmap(functools.partial(ctx._operand, ahead=0))(trial, drawn)  # noqa: SLF001
        current = (state.pipeline_state, state.obs, ctx._reset_info(state.info), drawn)  # noqa: SLF001
        for d in (0, dones):
            done = jnp.arange(n) < d
            programs[f"loop {chunk} {d}"] = (_selects(ctx, done, cfg.calls), (operand, current))
    raw_keys = jax.random.split(jax.random.key_data(jax.random.key(2)), n)
    fresh = jax.jit(jax.vmap(ctx._fresh))  # noqa: SLF001 - the trip size plays no part
    reset = jax.jit(jax.vmap(raw.reset))
    for size in cfg.sizes:
        rows = jax.tree.map(lambda x, size=size: x[:size], operand)
        programs[f"exact {size}"] = (fresh, (rows,))
        programs[f"env {size}"] = (reset, (raw_keys[:size],))
    return programs


def bench(name: str, cfg: Config) -> dict:
    rollout, first = _plain(name, cfg)
    key = jax.random.key(3)
    dones = int(np.median(np.asarray(rollout(first, key)[1])))  # compiled and run, untimed
    keys = [jax.random.fold_in(key, r) for r in range(cfg.rounds)]  # made before the clock
    programs = {"plain": (lambda s, r: rollout(s, keys[r]), None)}
    programs |= _programs(name, cfg, dones)
    for label, (fn, args) in programs.items():  # compiled and run once, untimed
        if label != "plain":
            jax.block_until_ready(fn(*args))
    times, counts = {label: [] for label in programs}, []
    labels = list(programs)
    for r in range(cfg.rounds):  # paired rounds, each starting with another program
        for label in labels[r % len(labels) :] + labels[: r % len(labels)]:
            fn, args = programs[label]
            t = time.perf_counter()
            if label == "plain":
                done = jax.block_until_ready(fn(first, r))[1]
                times[label].append((time.perf_counter() - t) / cfg.steps)
                counts.append(np.asarray(done))  # its host copy outside the clock
                continue
            for _ in range(1 if label.startswith("loop") else cfg.calls):
                out = fn(*args)
            jax.block_until_ready(out)
            times[label].append((time.perf_counter() - t) / cfg.calls)
    ms = {label: float(np.median(t)) * 1e3 for label, t in times.items()}
    step_ms = ms["plain"]
    result = {
        "plain_step_ms": step_ms,
        "dones_per_step": float(np.concatenate(counts).mean()),
        "dones_timed": dones,
        "ms": ms,
        "loop": {},
    }
    print(
        f"\n{name}, {cfg.num_envs} envs, median of {cfg.rounds} paired rounds: plain Brax "
        f"{step_ms:.2f} ms a step; {result['dones_per_step']:.1f} envs done a step "
        f"(median {dones})"
    )
    for chunk in cfg.chunks:
        trip = trip_size(cfg.num_envs, chunk)
        trips = -(-dones // trip)
        cost = ms[f"loop {chunk} {dones}"] - ms[f"loop {chunk} 0"]
        result["loop"][str(chunk)] = {
            "trip": trip,
            "trips": trips,
            "resets_ms": cost,
            "share": cost / step_ms,
        }
        print(
            f"the loop, trips of {trip} envs ({trips} for {dones} done): "
            f"{cost:.3f} ms a step, {cost / step_ms:.1%} of plain's step "
            f"(a step with none done: {ms[f'loop {chunk} 0']:.3f} ms of selecting)"
        )
    head = " ".join(f"{s:>8d}" for s in cfg.sizes)
    print(f"{'own calls (ms)':32s} {head}   fixed ms  per env us")
    for part, what in (("exact", "exact (draw, derive, env reset)"), ("env", "Brax's reset alone")):
        fixed, per_env = fit_line(cfg.sizes, [ms[f"{part} {s}"] for s in cfg.sizes])
        result[part] = {"fixed_ms": fixed, "per_env_ms": per_env}
        row = " ".join(f"{ms[f'{part} {s}']:8.3f}" for s in cfg.sizes)
        print(f"{what:32s} {row}   {fixed:8.3f}  {per_env * 1e3:10.2f}")
    return result


def main(cfg: Config) -> dict:
    return per_env_results(cfg, bench)


if __name__ == "__main__":
    main(tyro.cli(Config))
