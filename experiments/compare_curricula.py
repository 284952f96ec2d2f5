"""Fixed domain randomization vs linear widening vs ADR on one task, same
budget, each seed's three runs evaluated on the same held-out sets (the
extrapolation sets above all): does a curriculum buy generalization?

    python experiments/compare_curricula.py --logdir runs/compare
"""

from __future__ import annotations

import dataclasses

import tyro

import curricula
from metarl import contexts as C
from metarl import experiment
from metarl.agents.ppo import PPOConfig
from metarl.envs import make_contextual

# ADR credits a boundary only with episodes that start and end inside one segment
# (metarl.experiment.MIN_TRIALS_PER_SEGMENT): each env plays several per segment
EPISODE_LENGTH = 200


@dataclasses.dataclass(frozen=True)
class Config(experiment.RunArgs):
    logdir: str = "runs/compare_curricula"
    segments: int = 6
    steps_per_segment: int = 50_000
    seed: int = 0
    widening_segments: int = 4  # linear widening: segments after which the ranges are the target
    ppo: PPOConfig = PPOConfig(
        num_envs=64,  # 50k steps per segment: about 780 steps, 3.9 episodes, per env
        unroll_length=16,
        num_minibatches=4,
        learning_rate=3e-4,
        entropy_cost=1e-2,
        reward_scaling=0.1,
        policy_hidden=(32, 32),
        value_hidden=(64, 64),
    )
    eval: experiment.EvalConfig = experiment.EvalConfig(contexts=8, episodes=2)


def curricula_to_compare(widening_segments: int) -> dict[str, curricula.Curriculum]:
    return {
        "fixed_dr": curricula.LinearWidening(start=1.0, segments=1),
        "linear": curricula.LinearWidening(start=0.1, segments=widening_segments),
        # returns out of EPISODE_LENGTH (reward 1 per step upright): widen a boundary at
        # 90% of it, shrink at 40%
        "adr": curricula.ADR(
            start=0.1,
            delta=0.2,
            low_threshold=0.4 * EPISODE_LENGTH,
            high_threshold=0.9 * EPISODE_LENGTH,
            buffer_size=4,
        ),
    }


def main(cfg: Config) -> dict[str, list[dict]]:
    target = C.ContextSpace(
        {
            "gravity": C.Uniform(4.0, 20.0),  # m/s^2
            "mass": C.Scale(0.3, 3.0, per_element=True),  # x default
        }
    )
    env = make_contextual("inverted_pendulum", target, episode_length=EPISODE_LENGTH)
    variants = {
        name: experiment.Experiment(
            env=env,
            target=target,
            curriculum=curriculum,
            ppo=cfg.seeded(cfg.ppo),
            eval=cfg.eval,
        )
        for name, curriculum in curricula_to_compare(cfg.widening_segments).items()
    }
    return experiment.run_variants(
        variants,
        **cfg.run_kwargs(),
        hparams=cfg,
    )


if __name__ == "__main__":
    main(tyro.cli(Config))
