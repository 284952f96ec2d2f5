"""What an exact reset adds to the compile of a contextual env's step.

Plain Brax's step never resets: its auto-reset copies back a cached first state, and
Brax compiles its reset only in `reset`. A contextual env's step computes each done
env's own reset, so every program that steps compiles a reset too. This compiles each
program `--repeats` times, each time in a process of its own (nothing compiled before
it, JAX's persistent cache off), with the env benchmark's contexts
(`env_throughput._space`) at `--num-envs` envs, returning every output (returning only
the observation lets XLA drop most of a reset: the physics state the observation does
not read):

* ``brax_reset``: Brax's own reset, `jax.vmap(env.reset)`;
* ``reset``: the contextual env's reset (the draw, its derived constants, Brax's reset
  under that System);
* ``step_noreset``: `jax.vmap(env.step)` with its resets switched off
  (`env_throughput`'s ``ablate_noreset``; not exact, a diagnostic);
* ``step_and_reset``: that step and an independent reset, in one program;
* ``step_dense``, ``step_loop``: the step with its resets, computed as "dense" does
  (for every env, kept where done) or as "loop" does (for the done envs alone; "auto"
  on a CPU).

It prints each program's compile seconds (XLA's compile, not tracing or lowering:
median and range over the repeats) and the lines of its compiled HLO. XLA's flags are
the environment's; the tests' are
``XLA_FLAGS="--xla_cpu_use_fusion_emitters=false --xla_backend_optimization_level=0"``
(tests/conftest.py, FAST_COMPILE).

    python benchmarks/reset_compile.py --envs hopper inverted_pendulum

On 2 cores of an Intel Xeon (2026-12-07): benchmarks/results/README.md, "2026-12-07,
thirty-fifth session".
"""

from __future__ import annotations

import collections
import dataclasses
import json
import re
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import tyro
from _cli import check_counts, check_envs, per_env_results
from brax import envs as brax_envs
from env_throughput import _ablated, _space

from metarl.envs import make_contextual

PROGRAMS = ("brax_reset", "reset", "step_noreset", "step_and_reset", "step_dense", "step_loop")


@dataclasses.dataclass(frozen=True)
class Config:
    envs: tuple[str, ...] = ("hopper", "inverted_pendulum")
    num_envs: int = 8
    backend: str | None = None  # None: each env's default backend
    programs: tuple[str, ...] = PROGRAMS
    repeats: int = 2  # fresh processes per program
    out: str | None = None  # a JSON file of the results
    only: str | None = None  # internal: compile this one program of envs[0] and print it

    def __post_init__(self):
        check_counts(self)
        if unknown := [p for p in self.programs if p not in PROGRAMS]:
            raise ValueError(f"--programs: unknown {unknown}; choose among {', '.join(PROGRAMS)}")
        if self.only is not None and self.only not in PROGRAMS:
            raise ValueError(f"--only: unknown {self.only!r}; choose among {', '.join(PROGRAMS)}")
        check_envs(self)


def _program(name: str, program: str, cfg: Config):
    """(function, the shapes and dtypes of its arguments): nothing is compiled before
    the program (a step's state is shaped by tracing the reset, so a step's trace_s
    leaves out the reset's trace, which JAX keeps)."""
    kwargs = {} if cfg.backend is None else {"backend": cfg.backend}
    raw = brax_envs.get_environment(name, **kwargs)
    n = cfg.num_envs
    keys = jax.eval_shape(lambda: jax.random.split(jax.random.key(0), n))
    if program == "brax_reset":
        return jax.vmap(raw.reset), (jax.eval_shape(jax.vmap(jax.random.key_data), keys),)
    strategy = "dense" if program == "step_dense" else "loop"
    space = _space(raw.sys, kwargs.get("backend", "generalized"))
    env = make_contextual(name, space, episode_length=1000, reset_strategy=strategy, **kwargs)
    reset = jax.vmap(env.reset)  # `_ablated` leaves the reset as it is
    if program == "reset":
        return reset, (keys,)
    state = jax.eval_shape(reset, keys)
    action = jax.ShapeDtypeStruct((n, env.action_size), jnp.float32)
    if program in ("step_noreset", "step_and_reset"):
        env = _ablated(env, "noreset")
    step = jax.vmap(env.step)
    if program == "step_and_reset":
        return lambda s, a, k: (step(s, a), reset(k)), (state, action, keys)
    return step, (state, action)


def compile_once(name: str, program: str, cfg: Config) -> dict:
    """This process's cold compile of `program`: seconds by stage, the compiled HLO's
    lines and its library calls."""
    fn, args = _program(name, program, cfg)
    t0 = time.perf_counter()
    traced = jax.jit(fn).trace(*args)
    t1 = time.perf_counter()
    lowered = traced.lower()
    t2 = time.perf_counter()
    compiled = lowered.compile()
    t3 = time.perf_counter()
    hlo = compiled.as_text()
    return {
        "trace_s": t1 - t0,
        "lower_s": t2 - t1,
        "compile_s": t3 - t2,
        "hlo_lines": hlo.count("\n"),
        # library calls by target (on a CPU, LAPACK's: a reset's factorizations)
        "custom_calls": dict(collections.Counter(re.findall(r'custom_call_target="([^"]+)"', hlo))),
    }


def _in_a_process(name: str, program: str, cfg: Config) -> dict:
    argv = [sys.executable, __file__, "--only", program, "--envs", name]
    argv += ["--num-envs", str(cfg.num_envs)]
    if cfg.backend is not None:
        argv += ["--backend", cfg.backend]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{name} {program}: the process failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def bench(name: str, cfg: Config) -> dict:
    results = {}
    print(f"\n{name}, {cfg.num_envs} envs, {cfg.repeats} processes a program")
    print(f"{'program':16s} {'compile s (min-max)':>22s} {'trace s':>8s} {'HLO lines':>10s}")
    for program in cfg.programs:
        runs = [_in_a_process(name, program, cfg) for _ in range(cfg.repeats)]
        compile_s = [r["compile_s"] for r in runs]
        results[program] = {"runs": runs, "compile_s": float(np.median(compile_s))}
        spread = f"({min(compile_s):.2f}-{max(compile_s):.2f})"
        trace_s = np.median([r["trace_s"] for r in runs])
        print(
            f"{program:16s} {np.median(compile_s):10.2f} {spread} {trace_s:8.2f}"
            f" {runs[0]['hlo_lines']:10,d}",
            flush=True,
        )
    return results


def main(cfg: Config) -> dict:
    if cfg.only is not None:  # a child process: one program, one line of JSON
        # cold, even where JAX_COMPILATION_CACHE_DIR is set (as the tests set it)
        jax.config.update("jax_enable_compilation_cache", False)
        print(json.dumps(compile_once(cfg.envs[0], cfg.only, cfg)))
        return {}
    return per_env_results(cfg, bench)


if __name__ == "__main__":
    main(tyro.cli(Config))
