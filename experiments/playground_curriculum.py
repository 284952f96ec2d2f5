"""A MuJoCo Playground env with a name-selected mass and a task context: the
recurrent agent reaches for a goal whose distance from the shoulder widens
over the segments, while the mass of the arm's upper link ("mass[arm]", chosen
by its MJCF name) varies; then held-out evaluation (goals nearer and farther
than any trained on, lighter and heavier arms).

    pip install -e ".[playground]"
    python experiments/playground_curriculum.py --logdir runs/playground
    tensorboard --logdir runs/playground

The env is Playground's dm_control-suite reacher (`PlaygroundReacherGoal`),
simulated by MJX; its target sits at ``goal_distance`` metres in direction
``goal_direction``, drawn per episode inside jit like any physics context.
"""

from __future__ import annotations

import dataclasses

import tyro

import curricula
from metarl import contexts as C
from metarl import experiment
from metarl.agents.ppo import PPOConfig
from metarl.envs import make_contextual
from metarl.envs.playground_tasks import PlaygroundReacherGoal


@dataclasses.dataclass(frozen=True)
class Config(experiment.RunArgs):
    logdir: str = "runs/playground_curriculum"
    segments: int = 4
    steps_per_segment: int = 40_000
    seed: int = 0
    episode_length: int = 100  # 2 s of control at Playground's ctrl_dt = 0.02
    start_fraction: float = 0.25
    widening_segments: int = 3  # segments after which the ranges are the target
    ppo: PPOConfig = PPOConfig(
        num_envs=64,
        unroll_length=20,
        num_minibatches=4,
        learning_rate=1e-3,
        entropy_cost=1e-2,
        core="gru",
        hidden_size=32,
        policy_hidden=(64,),
        value_hidden=(64,),
    )
    eval: experiment.EvalConfig = experiment.EvalConfig(contexts=6, episodes=1)


def main(cfg: Config) -> list[dict]:
    target = C.ContextSpace(
        {
            "mass[arm]": C.Scale(0.5, 2.0),  # x the upper link's own mass
            "goal_distance": C.Uniform(0.05, 0.2),  # m from the shoulder (a task context)
            "goal_direction": C.Uniform(-3.14159, 3.14159),  # rad
        }
    )
    env = make_contextual(PlaygroundReacherGoal(), target, episode_length=cfg.episode_length)
    exp = experiment.Experiment(
        env=env,
        target=target,
        curriculum=curricula.LinearWidening(
            start=cfg.start_fraction, segments=cfg.widening_segments
        ),
        ppo=cfg.seeded(cfg.ppo),
        eval=cfg.eval,
    )
    return experiment.run(exp, **cfg.run_kwargs(), hparams=cfg)


if __name__ == "__main__":
    main(tyro.cli(Config))
