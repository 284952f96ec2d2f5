"""Samples physics contexts and rolls out a random policy in each.

A first look at a contextual env: every env draws its own gravity and cart
and pole masses, every episode draws anew, and the table shows what each env got.

    python experiments/random_contexts.py --num-envs 8 --steps 300
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import tyro

from metarl import contexts as C
from metarl.envs import CONTEXT, TRIAL, make_contextual


@dataclasses.dataclass(frozen=True)
class Config:
    env: str = "inverted_pendulum"
    num_envs: int = 8
    steps: int = 300
    seed: int = 0


def main(cfg: Config) -> None:
    space = C.ContextSpace(
        {
            "gravity": C.Uniform(5.0, 15.0),  # m/s^2
            "mass": C.Scale(0.5, 2.0, per_element=True),  # x default, per body
        }
    )
    env = make_contextual(cfg.env, space, episode_length=200)
    keys = jax.random.split(jax.random.key(cfg.seed), cfg.num_envs)
    state = jax.jit(jax.vmap(env.reset))(keys)
    first = {k: np.asarray(v) for k, v in state.info[CONTEXT].items()}

    @jax.jit
    def rollout(state, key):
        def body(s, k):
            a = jax.random.uniform(k, (cfg.num_envs, env.action_size), minval=-1, maxval=1)
            s = jax.vmap(env.step)(s, a)
            t = s.info[TRIAL]
            return s, (s.done, t.episode_return)

        return jax.lax.scan(body, state, jax.random.split(key, cfg.steps))

    state, (done, returns) = rollout(state, jax.random.key(cfg.seed + 1))
    done, returns = np.asarray(done), np.asarray(returns)
    print(
        f"{'env':>4} {'gravity':>8} {'mass scale per body':>24} {'episodes':>9} {'mean return':>12}"
    )
    for i in range(cfg.num_envs):
        ended = returns[done[:, i] > 0, i]
        mass = " ".join(f"{m:.2f}" for m in first["mass"][i])
        mean = f"{ended.mean():12.1f}" if len(ended) else f"{'-':>12}"
        print(f"{i:>4} {first['gravity'][i]:8.2f} {mass:>24} {len(ended):>9} {mean}")
    print(
        "contexts now (after resampling): gravity",
        np.round(np.asarray(state.info[CONTEXT]["gravity"]), 2),
    )


if __name__ == "__main__":
    main(tyro.cli(Config))
