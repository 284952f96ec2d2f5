"""Env throughput: plain Brax vs Brax domain randomization vs make_contextual.

All three run in one process, compiled first, then timed in paired rounds
(each round runs every variant once, in turn), so that the ratios compare
runs made under the same machine load. Each variant rolls out random actions
for `steps` steps on `num_envs` envs inside one jitted `lax.scan`.

* plain: `brax.envs.training.wrap(env)` (vmap + episode + cached auto-reset).
* brax_dr: the same with `randomization_fn`: a static batch of Systems with
  gravity, per-body mass and per-geom friction drawn once, at build time.
* contextual: `make_contextual` with the same three quantities, drawn afresh
  at every episode inside jit, with exact resets.

    python benchmarks/env_throughput.py --envs hopper inverted_pendulum --num-envs 1024
"""

from __future__ import annotations

import dataclasses
import time

import jax
import numpy as np
import tyro
from brax import envs as brax_envs
from brax.envs.wrappers import training as brax_training

from metarl import contexts as C
from metarl.envs import make_contextual

GRAVITY = (0.7, 1.3)
MASS = (0.7, 1.3)
FRICTION = (0.5, 1.5)


@dataclasses.dataclass(frozen=True)
class Config:
    envs: tuple[str, ...] = ("hopper", "inverted_pendulum")
    num_envs: int = 1024
    steps: int = 200
    rounds: int = 7
    backend: str | None = None  # None: each env's default backend
    reset_chunk: float = 0.0625


def _space() -> C.ContextSpace:
    return C.ContextSpace(
        {
            "gravity": C.Scale(*GRAVITY),
            "mass": C.Scale(*MASS, per_element=True),
            "friction": C.Scale(*FRICTION, per_element=True),
        }
    )


def _brax_randomizer(num_envs: int):
    def randomize(sys):
        keys = jax.random.split(jax.random.PRNGKey(7), 3)
        g = jax.random.uniform(keys[0], (num_envs,), minval=GRAVITY[0], maxval=GRAVITY[1])
        m = jax.random.uniform(keys[1], (num_envs, sys.num_links()), minval=MASS[0], maxval=MASS[1])
        f = jax.random.uniform(
            keys[2], (num_envs, sys.ngeom), minval=FRICTION[0], maxval=FRICTION[1]
        )
        fields = {
            "gravity": sys.gravity * g[:, None],
            "opt.gravity": sys.opt.gravity * g[:, None],
            "link.inertia.mass": sys.link.inertia.mass * m,
            "body_mass": jax.vmap(lambda m: sys.body_mass.at[1:].multiply(m))(m),
            "geom_friction": jax.vmap(lambda f: sys.geom_friction.at[:, 0].multiply(f))(f),
        }
        batched = sys.tree_replace(fields)
        axes = jax.tree.map(lambda _: None, sys).tree_replace({k: 0 for k in fields})
        return batched, axes

    return randomize


def _rollout(reset, step, action_size: int, cfg: Config):
    def run(key):
        state = reset(key)

        def body(state, k):
            action = jax.random.uniform(k, (cfg.num_envs, action_size), minval=-1.0, maxval=1.0)
            state = step(state, action)
            return state, state.done.sum()

        state, dones = jax.lax.scan(body, state, jax.random.split(key, cfg.steps))
        return dones.sum()

    return jax.jit(run)


def _variants(name: str, cfg: Config):
    kwargs = {} if cfg.backend is None else {"backend": cfg.backend}
    n = cfg.num_envs
    raw_keys = lambda key: jax.random.split(jax.random.key_data(key), n)  # noqa: E731

    plain = brax_training.wrap(brax_envs.get_environment(name, **kwargs), episode_length=1000)
    dr = brax_training.wrap(
        brax_envs.get_environment(name, **kwargs),
        episode_length=1000,
        randomization_fn=_brax_randomizer(n),
    )
    ctx = make_contextual(
        name, _space(), episode_length=1000, reset_chunk=cfg.reset_chunk, **kwargs
    )
    return {
        "plain": _rollout(lambda k: plain.reset(raw_keys(k)), plain.step, plain.action_size, cfg),
        "brax_dr": _rollout(lambda k: dr.reset(raw_keys(k)), dr.step, dr.action_size, cfg),
        "contextual": _rollout(
            lambda k: jax.vmap(ctx.reset)(jax.random.split(k, n)),
            jax.vmap(ctx.step),
            ctx.action_size,
            cfg,
        ),
    }


def bench(name: str, cfg: Config) -> None:
    runs = _variants(name, cfg)
    key = jax.random.key(0)
    compile_s, dones = {}, {}
    for label, run in runs.items():
        t0 = time.perf_counter()
        compiled = run.lower(key).compile()
        compile_s[label] = time.perf_counter() - t0
        runs[label] = compiled
        dones[label] = int(compiled(key))
    times = {label: [] for label in runs}
    for r in range(cfg.rounds):
        k = jax.random.key(r + 1)
        for label, run in runs.items():
            t0 = time.perf_counter()
            jax.block_until_ready(run(k))
            times[label].append(time.perf_counter() - t0)
    base = np.asarray(times["plain"])
    print(
        f"\n{name} ({cfg.backend or 'default backend'}), {cfg.num_envs} envs, "
        f"{cfg.steps} steps x {cfg.rounds} paired rounds"
    )
    print(
        f"{'variant':<12}{'steps/s':>12}{'ratio (median, min-max)':>28}"
        f"{'compile s':>11}{'ratio':>7}{'dones/step':>12}"
    )
    for label, ts in times.items():
        ratios = base / np.asarray(ts)
        sps = cfg.num_envs * cfg.steps / np.median(ts)
        print(
            f"{label:<12}{sps:>12,.0f}{np.median(ratios):>12.3f} "
            f"({ratios.min():.3f}-{ratios.max():.3f})"
            f"{compile_s[label]:>11.1f}{compile_s[label] / compile_s['plain']:>7.2f}"
            f"{dones[label] / cfg.steps:>12.1f}"
        )


def main(cfg: Config) -> None:
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}")
    for name in cfg.envs:
        bench(name, cfg)


if __name__ == "__main__":
    main(tyro.cli(Config))
