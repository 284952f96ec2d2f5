"""Samples physics contexts and rolls out a random policy in each.

A first look at a contextual env: every env draws its own gravity and cart
and pole masses, every episode draws anew, and the table shows, for each env's
first finished episodes, the context that episode ran in and its return.

    python experiments/random_contexts.py --num-envs 8 --steps 300
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import tyro

from metarl import contexts as C
from metarl.agents.ppo.config import check_seeds
from metarl.envs import CONTEXT, TRIAL, make_contextual


@dataclasses.dataclass(frozen=True)
class Config:
    env: str = "inverted_pendulum"
    num_envs: int = 8
    steps: int = 300
    seed: int = 0
    episodes_shown: int = 3  # finished episodes listed per env

    def __post_init__(self):
        check_seeds(self.seed, 1, "--seed")  # key(2**32) is key(0): another seed's draws
        for name, least in (("num_envs", 1), ("steps", 1), ("episodes_shown", 0)):
            if getattr(self, name) < least:
                raise ValueError(
                    f"--{name.replace('_', '-')} must be >= {least}, got {getattr(self, name)}"
                )


def main(cfg: Config) -> None:
    space = C.ContextSpace(
        {
            "gravity": C.Uniform(5.0, 15.0),  # m/s^2
            "mass": C.Scale(0.5, 2.0, per_element=True),  # x default, per body
        }
    )
    env = make_contextual(cfg.env, space, episode_length=200)
    k_reset, k_run = jax.random.split(jax.random.key(cfg.seed))
    keys = jax.random.split(k_reset, cfg.num_envs)
    state = jax.jit(jax.vmap(env.reset))(keys)

    @jax.jit
    def rollout(state, key):
        def body(s, k):
            a = jax.random.uniform(k, (cfg.num_envs, env.action_size), minval=-1, maxval=1)
            ran_in = s.info[CONTEXT]  # after the step, a done env holds its next context
            s = jax.vmap(env.step)(s, a)
            return s, (s.done, s.info[TRIAL].episode_return, ran_in)

        return jax.lax.scan(body, state, jax.random.split(key, cfg.steps))

    state, (done, returns, contexts) = rollout(state, k_run)
    done, returns = np.asarray(done), np.asarray(returns)
    contexts = {k: np.asarray(v) for k, v in contexts.items()}
    print(f"{'env':>4} {'episode':>8} {'gravity':>8} {'mass scale per body':>24} {'return':>8}")
    for i in range(cfg.num_envs):
        ends = np.flatnonzero(done[:, i] > 0)
        for j, t in enumerate(ends[: cfg.episodes_shown]):
            mass = " ".join(f"{m:.2f}" for m in contexts["mass"][t, i])
            print(
                f"{i:>4} {j + 1:>8} {contexts['gravity'][t, i]:8.2f} {mass:>24} "
                f"{returns[t, i]:8.1f}"
            )
        print(
            f"{i:>4} {len(ends):>8} episodes finished, mean return "
            + (f"{returns[ends, i].mean():.1f}" if len(ends) else "-")
            + " (each in its own context)"
        )


if __name__ == "__main__":
    main(tyro.cli(Config))
