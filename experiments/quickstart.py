"""Quickstart: a recurrent agent on an inverted pendulum whose gravity and the
cart and pole masses widen from narrow to wide over the segments, then held-out evaluation.

    python experiments/quickstart.py --logdir runs/quickstart
    tensorboard --logdir runs/quickstart

Rerun the same command after an interruption: it resumes from the last
checkpoint in the log directory.
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
    logdir: str = "runs/quickstart"
    segments: int = 5
    steps_per_segment: int = 60_000
    seed: int = 0
    start_fraction: float = 0.2  # the first segment trains on 20% of the target ranges
    widening_segments: int = 4
    """Segments after which the ranges are the target: a run extended with more
    --segments goes on at the target, the schedule so far unchanged."""
    ppo: PPOConfig = PPOConfig(
        num_envs=128,
        unroll_length=16,
        num_minibatches=4,
        learning_rate=3e-4,
        entropy_cost=1e-2,
        reward_scaling=0.1,  # value targets ~3: value loss no longer swamps the clipped gradient
        core="gru",
        hidden_size=32,
        policy_hidden=(32,),
        value_hidden=(64,),
    )
    eval: experiment.EvalConfig = experiment.EvalConfig(contexts=8, episodes=2)


def main(cfg: Config) -> list[dict]:
    target = C.ContextSpace(
        {
            "gravity": C.Uniform(5.0, 15.0),  # m/s^2 (default 9.81)
            "mass": C.Scale(0.5, 2.0, per_element=True),  # x default, cart and pole
        }
    )
    env = make_contextual("inverted_pendulum", target, episode_length=500)
    exp = experiment.Experiment(
        env=env,
        target=target,
        curriculum=curricula.LinearWidening(
            start=cfg.start_fraction, segments=cfg.widening_segments
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
