"""What the GRU of rl2_hidden_context remembers: a linear probe of its memory.

Run after ``rl2_hidden_context.py`` with the same flags (it reads that run's gru
checkpoint, trains nothing): per seed, a ridge regression from the policy's
GRU state to the hidden motor gain is fitted on `--fit-contexts` contexts drawn
from the training ranges, then scored on the run's own held-out sets (the same
contexts evaluation used) as out-of-sample R^2 against predicting the training
mean, per episode of the trial (`metarl.probe`). The same probe on the GRU the
seed started from is the control: its initial parameters, fed the observations
the trained GRU is fed (the trained run's observation normalizer), since a random
recurrent network fed actions and rewards already carries part of the motor. The
network as it was initialised, normalizer too (which passes raw observations, 3-20
times smaller than normalized ones on the puck), is printed beside it: its gap to
the trained GRU also counts what normalizing alone gives.

Prints, over seeds and per episode of a trial: R^2 and the decoding error
(RMSE, in gain units) of each, the paired differences of the trained RMSE from
the controls', and the trained probe's bias (decoded minus true gain: positive
below the training range and negative above it where the memory's code squeezes
a motor beyond the trained ones back toward them) with its paired difference
from the control's. R^2's reference, the spread of the gains about the
training mean, widens beyond the training range: compare splits by RMSE.
Writes the same, with R^2 at each step of a trial per seed, to
``<logdir>/probe_memory.json``.

    python experiments/rl2_hidden_context.py --logdir runs/rl2 --num-seeds 10
    python experiments/probe_memory.py --logdir runs/rl2 --num-seeds 10
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib

import jax
import numpy as np
import rl2_hidden_context as rl2
import tyro

from metarl import evaluation as E
from metarl import experiment, stats
from metarl import probe as P


@dataclasses.dataclass(frozen=True)
class Config(rl2.Config):
    """The run's flags (copy them from its command line) and the probe's own. --resume
    and --keep-checkpoints are the run's and change nothing here; --agents must hold
    the variants read."""

    segments: int = 4  # the segment whose checkpoint is read (the run's last: its --segments)
    fit_contexts: int = 32  # contexts drawn from the training ranges to fit each probe on
    fit_trials: int = 2  # trials per fit context
    ridge: float = 1.0  # the probe's penalty on standardized memory units
    # the variants the run ran (this script runs none: it reads the gru's, and must
    # find it among them)
    agents: tuple[str, ...] = ("mlp", "gru", "oracle")

    def __post_init__(self):
        # before the run is loaded and compiled (--ridge -1 failed after the first seed's
        # memory was recorded, naming no flag)
        for name in ("fit_contexts", "fit_trials"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"--{name.replace('_', '-')} must be an integer >= 1, got {value!r}"
                )
        if not (math.isfinite(self.ridge) and self.ridge > 0):
            raise ValueError(f"--ridge must be a finite number > 0, got {self.ridge!r}")


def check_agents(cfg: rl2.Config, reads: tuple[str, ...], script: str) -> None:
    """Refuses an --agents without the variants `script` reads (it reads them whatever
    the flag says: a user's --agents mlp was silently ignored)."""
    if missing := [a for a in reads if a not in cfg.agents]:
        dirs = ", ".join(f"<logdir>/{a}/" for a in reads)
        raise SystemExit(
            f"{script} reads the run's {' and '.join(reads)} ({dirs}); "
            f"--agents {' '.join(cfg.agents)} leaves out {', '.join(missing)}: pass the "
            "run's --agents, or leave it out"
        )


def keys(seed: int) -> tuple[jax.Array, jax.Array]:
    """(the fit's reset key, the scored trials') of a seed: none a key its run used."""
    return tuple(jax.random.split(experiment.analysis_key(seed)))


def fit_seed(seed: int) -> int:
    """The seed `in_distribution` draws the fit's contexts with: from the analysis stream
    too (``seed`` itself drew them with the first split of ``key(seed)``, the key the
    run initialised its parameters with)."""
    return experiment._int_seed(jax.random.fold_in(experiment.analysis_key(seed), 2))  # noqa: SLF001


def fit(exp, fitter, policy, seed: int, ridge: float) -> P.LinearProbe:
    """The seed's probe, fitted on ``fitter.max_contexts`` fresh contexts of the
    training ranges (other reset keys than the scored trials')."""
    fit_set = E.in_distribution(exp.target, fitter.max_contexts, fit_seed(seed), exp.env)
    return P.fit_probe(P.record_memory(fitter, policy, fit_set, keys(seed)[0]), ridge)


def _probe(exp, evaluator, fitter, policy, sets, seed: int, ridge: float) -> dict:
    """{split: ProbeScore} of the seed's probe on its held-out sets."""
    fitted, key_score = fit(exp, fitter, policy, seed, ridge), keys(seed)[1]
    return {
        split: P.score_probe(fitted, P.record_memory(evaluator, policy, s, key_score))
        for split, s in sets.items()
    }


def _iqm(scores: np.ndarray) -> str:
    return stats.format_iqm(stats.summarize(scores), 2)


def main(cfg: Config) -> dict:
    check_agents(cfg, ("gru",), "probe_memory")
    gru = rl2.variants(dataclasses.replace(cfg, agents=("gru",)))["gru"]
    logdir = pathlib.Path(cfg.logdir)
    loaded = experiment.load_run(  # the segment `--segments` names (the run's last)
        gru,
        logdir=logdir / "gru",
        seed=cfg.seed,
        num_seeds=cfg.num_seeds,
        segment=cfg.segments,
        eval_as_run=True,
        steps_per_segment=cfg.steps_per_segment,  # the run's: another budget is refused
    )
    env, k = gru.env, gru.env.episodes_per_trial
    evaluator = loaded.compiled.evaluator
    fitter = E.Evaluator(env, episodes=k * cfg.fit_trials, max_contexts=cfg.fit_contexts)
    policies = {
        "trained": loaded.policies,
        # the control: initial parameters on the trained GRU's inputs
        "initial": [p.replace(params=q.params) for p, q in zip(loaded.policies, loaded.initial)],
        "as_initialised": loaded.initial,  # normalizer included
    }
    scores = {kind: [] for kind in policies}
    for i, seed in enumerate(loaded.seeds):
        sets = experiment.held_out_sets(gru, seed)  # the contexts evaluation scored
        for kind, per_seed in policies.items():
            scores[kind].append(_probe(gru, evaluator, fitter, per_seed[i], sets, seed, cfg.ridge))
    splits = list(scores["trained"][0])
    print(
        f"\nLinear probe of the GRU's memory for the hidden motor gain, {len(loaded.seeds)} "
        f"seeds, after {loaded.segments} segments ({loaded.env_steps:,} env steps): "
        "out-of-sample R^2 against the training mean and RMSE in gain units, IQM [95% CI] "
        "over seeds; the RMSE of the trained memory minus the initial one's, paired by seed; "
        "the trained probe's bias (mean decoded minus true gain) and its difference from the "
        "initial one's, paired by seed. Initial: the initial parameters with the trained "
        "observation normalizer; as initialised: normalizer too"
    )
    rows = {}
    for split in splits:
        row = {}
        for e in range(k):
            r2, rmse, bias = {}, {}, {}
            for kind, per_seed in scores.items():
                r2[kind] = np.asarray([s[split].by_episode[e] for s in per_seed])
                rmse[kind] = np.asarray([s[split].error_by_episode[e].mean() for s in per_seed])
                bias[kind] = np.asarray([s[split].bias_by_episode[e].mean() for s in per_seed])
            row[f"episode_{e + 1}"] = {
                f"{what}_{kind}": values[kind].tolist()
                for what, values in (("r2", r2), ("rmse", rmse), ("bias", bias))
                for kind in scores
            }
            change = {
                kind: stats.format_difference(
                    stats.difference(rmse["trained"], rmse[kind], paired=True), 2
                )
                for kind in ("initial", "as_initialised")
            }
            squeeze = stats.difference(bias["trained"], bias["initial"], paired=True)
            print(
                f"  {split:<19} episode {e + 1}: R^2 {_iqm(r2['trained'])} (initial "
                f"{_iqm(r2['initial'])}, as initialised {_iqm(r2['as_initialised'])}); RMSE "
                f"{_iqm(rmse['trained'])}, trained - initial {change['initial']} (- as "
                f"initialised {change['as_initialised']}); bias {_iqm(bias['trained'])}, "
                f"trained - initial {stats.format_difference(squeeze, 2)}"
            )
        for kind, per_seed in scores.items():  # R^2 at each step of a trial, per seed
            row[f"by_step_r2_{kind}"] = [s[split].by_step.tolist() for s in per_seed]
        rows[split] = row
    out = {"seeds": loaded.seeds, "env_steps": loaded.env_steps, "splits": rows}
    (logdir / "probe_memory.json").write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main(tyro.cli(Config))
