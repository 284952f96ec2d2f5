"""Automatic Domain Randomization over body masses and friction on hopper:
the ranges widen where the agent copes at the boundary, shrink where it fails.

    python experiments/adr_hopper.py --logdir runs/adr_hopper
    tensorboard --logdir runs/adr_hopper     # curriculum/<name>/low|high charts

Hopper compiles slowly and runs at about 8k env steps/s on 2 CPU cores: the
default budget is meant for a GPU; shrink --steps-per-segment on a laptop.
"""

from __future__ import annotations

import dataclasses

import tyro

import curricula
from metarl import contexts as C
from metarl import experiment
from metarl.agents.ppo import PPOConfig
from metarl.envs import make_contextual


@dataclasses.dataclass(frozen=True)
class Config(experiment.RunArgs):
    logdir: str = "runs/adr_hopper"
    segments: int = 5
    steps_per_segment: int = 4_000_000
    """About four 1000-step episodes per env (4M steps / 1024 envs): ADR credits a
    boundary only with episodes that start and end inside a segment, and a run
    refuses fewer than two episodes' worth per env (`experiment.MIN_TRIALS_PER_SEGMENT`)."""
    seed: int = 0
    backend: str = "generalized"
    low_threshold: float = 300.0  # returns below this at a boundary shrink it
    high_threshold: float = 800.0  # returns above this widen it
    ppo: PPOConfig = PPOConfig(
        num_envs=1024,
        unroll_length=20,
        num_minibatches=32,
        learning_rate=3e-4,
        entropy_cost=1e-2,
        discounting=0.99,
        reward_scaling=0.1,
        policy_hidden=(128, 128),
        value_hidden=(256, 256),
    )
    eval: experiment.EvalConfig = experiment.EvalConfig(contexts=8, episodes=2)


def main(cfg: Config) -> list[dict]:
    target = C.ContextSpace(
        {
            "mass": C.Scale(0.5, 2.0),  # x default, one draw for all bodies
            "friction": C.Scale(0.3, 1.5),  # x default, the colliding geoms (floor, foot)
        }
    )
    env = make_contextual("hopper", target, backend=cfg.backend, episode_length=1000)
    exp = experiment.Experiment(
        env=env,
        target=target,
        curriculum=curricula.ADR(
            start=0.05,
            delta=0.1,
            low_threshold=cfg.low_threshold,
            high_threshold=cfg.high_threshold,
            buffer_size=8,
            boundary_prob=0.5,
        ),
        ppo=cfg.seeded(cfg.ppo),
        eval=cfg.eval,
    )
    return experiment.run(
        exp,
        **cfg.run_kwargs(),
        hparams=cfg,
    )


if __name__ == "__main__":
    main(tyro.cli(Config))
