"""MLP vs GRU (RL^2 inputs) on a task whose context is hidden: the puck's motor
sign and strength, drawn once per trial of 3 episodes. The agent observes the
ball's position only, so an MLP cannot tell which way its push moves the ball;
an agent that remembers its actions and rewards can, and keeps that knowledge
for the trial's later episodes. Same budget for both; evaluated in
distribution, between the training gains and beyond them, with the return of
each episode of a trial logged (eval/<split>/episode_<i>/return): the
adaptation curve. A third variant, the "oracle", is the MLP observing the
context (`visible_context=True`): what knowing the motor from the first step
is worth, the bound a memory that infers it can approach. After every segment a
linear probe reads the motor from the GRU's memory (`--eval.probe` sets of
contexts to fit it on; ``probe/<split>/...`` in TensorBoard): when the memory
comes to hold it, and how well beyond the training motors.

    python experiments/rl2_hidden_context.py --logdir runs/rl2
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
    logdir: str = "runs/rl2_hidden_context"
    segments: int = 4
    steps_per_segment: int = 100_000
    seed: int = 0
    episode_length: int = 30
    episodes_per_trial: int = 3
    # The gru variant's config; the mlp variant's is the same without memory (no
    # recurrent core, no RL2 inputs). --ppo.reset-every-episode: the gru's memory
    # reset at every episode instead of every trial (an ablation: no carry-over).
    ppo: PPOConfig = PPOConfig(
        core="gru",
        rl2_inputs=True,
        num_envs=256,
        unroll_length=25,
        num_minibatches=8,
        clipping_epsilon=0.2,
        learning_rate=1e-3,
        entropy_cost=1e-2,
        hidden_size=32,
        policy_hidden=(32,),
        value_hidden=(32,),
    )
    # eval.probe: the gru's memory probed for the motor after every segment (the
    # memoryless variants have none to probe)
    eval: experiment.EvalConfig = experiment.EvalConfig(contexts=8, episodes=6, probe=4)
    # the variants to run, of mlp, gru and oracle (--agents gru: the gru alone, to
    # probe its memory at more segments)
    agents: tuple[str, ...] = ("mlp", "gru", "oracle")
    unrecorded = ("agents",)  # a rerun may run other variants into the same logdir


def variants(cfg: Config) -> dict[str, experiment.Experiment]:
    """The agents on the same task and budget: "mlp" and "gru" observe the same
    (the context hidden), "oracle" is the mlp with the context observed."""
    if (cfg.ppo.core, cfg.ppo.rl2_inputs) != ("gru", True):
        raise SystemExit(
            "--ppo.core and --ppo.rl2-inputs are set by each variant of this script "
            "(mlp without RL2 inputs, gru with them): leave them out"
        )
    memoryless = dict(
        core="mlp", rl2_inputs=False, reset_every_episode=False, hidden_size=PPOConfig.hidden_size
    )
    # Relative motor gain: the sign flips the push, the magnitude scales it.
    target = C.ContextSpace({"actuator_gain": C.Choice([-1.0, -0.5, 0.5, 1.0], relative=True)})

    def env(visible: bool):
        return make_contextual(
            "puck",
            target,
            episode_length=cfg.episode_length,
            episodes_per_trial=cfg.episodes_per_trial,
            velocity_in_obs=False,
            visible_context=visible,
        )

    gru = cfg.seeded(cfg.ppo)
    mlp = dataclasses.replace(gru, **memoryless)
    hidden = env(False)
    agents = {"mlp": (hidden, mlp), "gru": (hidden, gru), "oracle": (env(True), mlp)}
    unknown = [a for a in cfg.agents if a not in agents]
    if unknown or not cfg.agents:
        raise SystemExit(f"--agents: {unknown or 'none given'}; choose among {list(agents)}")
    agents = {name: agents[name] for name in cfg.agents}
    if "gru" not in agents:  # the memoryless variants set these back: refused, not ignored
        default = Config()
        gru_only = [
            flag
            for flag, given, kept in (
                (
                    "--ppo.reset-every-episode",
                    gru.reset_every_episode,
                    default.ppo.reset_every_episode,
                ),
                ("--ppo.hidden-size", gru.hidden_size, default.ppo.hidden_size),
                ("--eval.probe", cfg.eval.probe, default.eval.probe),
            )
            if given != kept
        ]
        if gru_only:
            raise SystemExit(
                f"{', '.join(gru_only)} set the gru's config alone, and --agents "
                f"{' '.join(cfg.agents)} runs no gru: add gru to --agents, or leave them out"
            )
    return {
        name: experiment.Experiment(
            env=e,
            target=target,
            curriculum=curricula.LinearWidening(start=1.0, segments=1),  # fixed ranges
            ppo=ppo,
            eval=cfg.eval if ppo.core != "mlp" else dataclasses.replace(cfg.eval, probe=0),
        )
        for name, (e, ppo) in agents.items()
    }


def main(cfg: Config) -> dict[str, list[dict]]:
    results = experiment.run_variants(variants(cfg), **cfg.run_kwargs(), hparams=cfg)
    if {"oracle", "gru"} <= set(results) and next(iter(results)) not in ("oracle", "gru"):
        # How far the memory is from knowing the motor: the gru against the oracle (with
        # one of them first, run_variants has printed that comparison already).
        experiment.print_comparison({k: results[k] for k in ("oracle", "gru")}, cfg.logdir)
    return results


if __name__ == "__main__":
    main(tyro.cli(Config))
