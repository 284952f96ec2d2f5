"""Does the GRU of rl2_hidden_context act on the motor its memory holds? Steer it.

Run after ``rl2_hidden_context.py`` (its gru and oracle variants) with the same
flags; it trains nothing. `probe_memory.py` found that beyond the training motors
the GRU's memory decodes the gain short of the true one, toward the training
range, and that the GRU trails the oracle there in every episode of a trial: a
correlation. Here, per seed, the probe is fitted as probe_memory fits it, and the
trained GRU runs the run's held-out sets (the contexts its evaluation scored)
with its memory edited at every step, after the core updates it and before the
action head reads it (`metarl.probe.steer`):

* ``plain``: no edit, the GRU as trained;
* ``steered``: the memory moved the way it moves with the gain (the probe's
  `encoding`) until the probe decodes the env's true gain, from a trial's first
  step on: the memory told what the oracle observes;
* ``control``: the steered run's edits replayed at their sizes, env by env and
  step by step, along one fixed direction the probe does not read
  (`metarl.probe.control_policy`): does a push of the steering's size move the
  return, whatever the memory decodes? (Until 2026-12-06 the control sized its
  edit from its own memory, never corrected the readout, and its edits grew from
  2 at the first step to 170 by the tenth: every env's memory left [-10, 10].)
* ``reversed``: steered to decode the opposite gain (the motor's sign flipped): a
  policy that acts on this code then pushes the ball away;
* ``readout``: steered to the true gain by the least change that moves the
  probe's readout (``along="readout"``): a probe can read the gain off small
  directions the policy does not act on.

The oracle (the MLP that observes the gain) runs the same contexts. If steering
closes the GRU's gap to the oracle beyond the training motors, the squeezed code
costs that return; if it does not, the policy acts poorly on motors it never trained
on, whatever its memory holds (the head never saw a code beyond the trained one: the
edit extrapolates it along the memory's encoding). Prints, per split, each
condition's return and its return per episode of a trial, IQM [95% CI] over seeds,
and their differences from ``plain`` (and oracle minus steered, steered minus
control), paired by seed (mean, 95% t interval), and for each of the GRU's
conditions the share of envs whose memory left [-10, 10] at some step (the GRU's own
state stays in [-1, 1]; an edit carried on from step to step can grow the memory
without bound while the probe still decodes its target, and a return scored on such
a memory says little about the code); writes the per-seed figures to
``<logdir>/steer_memory.json``.

    python experiments/rl2_hidden_context.py --logdir runs/rl2 --num-seeds 10 --agents gru oracle
    python experiments/steer_memory.py --logdir runs/rl2 --num-seeds 10
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib

import numpy as np
import probe_memory as pm
import rl2_hidden_context as rl2
import tyro

from metarl import evaluation as E
from metarl import experiment, stats
from metarl import probe as P

CONDITIONS = ("plain", "steered", "control", "reversed", "readout", "oracle")
EDITED = CONDITIONS[:-1]  # the GRU's conditions, whose memory is recorded
BOUND = 10.0  # a memory unit beyond this has left the GRU's own range ([-1, 1]) far behind


@dataclasses.dataclass(frozen=True)
class Config(pm.Config):
    """The run's flags (copy them from its command line) and the steering's own.
    --resume and --keep-checkpoints are the run's and change nothing here; --agents
    must hold the variants read."""

    strength: float = 1.0  # the share of each edit applied (1: the probe decodes the target)

    def __post_init__(self):
        super().__post_init__()
        # a negative share pushes "steered" away from its target and "reversed" toward
        # the true gain: the rows' labels would swap meaning (it ran, labelled as usual)
        if not (math.isfinite(self.strength) and self.strength > 0):
            raise ValueError(
                f"--strength must be a finite share > 0 of each edit, got {self.strength!r}"
            )


def _returns(result: E.EvalResult) -> np.ndarray:
    """[1 + k]: the mean return over the set's contexts, then per episode of a trial."""
    by_episode = np.nanmean(result.by_episode, axis=0)
    return np.concatenate([[np.nanmean(result.mean)], by_episode])


def _flipped(contexts: E.ContextSet) -> E.ContextSet:
    return E.ContextSet(contexts.split, {n: -v for n, v in contexts.values.items()})


def _geometry(probe: P.LinearProbe) -> dict[str, float]:
    """How far apart the probe's readout and the memory's encoding of the gain lie, and
    how far each moves the memory per unit of decoded gain."""
    readout = probe.weights[:, 0] / probe.feature_scale
    encoding = probe.encoding[0]
    return {
        "cosine": float(
            abs(readout @ encoding) / np.linalg.norm(readout) / np.linalg.norm(encoding)
        ),
        "encoding_move": float(np.linalg.norm(encoding) / abs(readout @ encoding)),
        "readout_move": float(1.0 / np.linalg.norm(readout)),
    }


def _escaped(evaluator, policy, contexts: E.ContextSet, key) -> float:
    """The share of the set's envs whose memory leaves [-BOUND, BOUND] (or turns
    non-finite) at some step of their trial: an edit carried on from step to step
    can grow the memory without bound while the probe still decodes its target."""
    memory = P.record_memory(evaluator, policy, contexts, key)
    features = memory.features  # [N, T, H]
    size = np.where(np.isfinite(features), np.abs(features), np.inf)
    size = np.where(memory.episode[..., None] >= 0, size, 0.0)  # after the trial: not its
    return float(np.mean(size.max(axis=(1, 2)) > BOUND))


def _seed(cfg, exps, loaded, fitter, i: int) -> dict[str, dict[str, np.ndarray]]:
    """{condition: {split: [1 + k] returns}} of the run's i-th seed, its probe's
    `_geometry` under "geometry" and, under "escaped", {condition: {split: the share of
    envs whose memory left [-BOUND, BOUND]}}."""
    seed = loaded["gru"].seeds[i]
    gru, oracle = loaded["gru"].policies[i], loaded["oracle"].policies[i]
    evaluator = loaded["gru"].compiled.evaluator
    probe = pm.fit(exps["gru"], fitter, gru, seed, cfg.ridge)
    key = pm.keys(seed)[1]
    sets = experiment.held_out_sets(exps["gru"], seed)
    oracle_sets = experiment.held_out_sets(exps["oracle"], seed)
    out = {c: {} for c in CONDITIONS} | {"geometry": _geometry(probe)}
    out["escaped"] = {c: {} for c in EDITED}
    for split, s in sets.items():
        if any(not np.array_equal(v, oracle_sets[split].values[n]) for n, v in s.values.items()):
            raise SystemExit(f"the oracle's {split!r} contexts are not the gru's: another run?")
        steered = P.steer_policy(evaluator, gru, probe, s, strength=cfg.strength)
        policies = {  # `P.steer`'s policies, each evaluated and its memory recorded
            "plain": gru,
            "steered": steered,
            "control": P.control_policy(evaluator, steered, s, key, seed=seed),
            "reversed": P.steer_policy(evaluator, gru, probe, _flipped(s), strength=cfg.strength),
            "readout": P.steer_policy(
                evaluator, gru, probe, s, along="readout", strength=cfg.strength
            ),
        }
        for condition, policy in policies.items():
            out[condition][split] = _returns(evaluator.evaluate(policy, s, key))
            out["escaped"][condition][split] = _escaped(evaluator, policy, s, key)
        oracle_run = loaded["oracle"].compiled.evaluator.evaluate(oracle, s, key)
        out["oracle"][split] = _returns(oracle_run)
    return out


def _print(per_seed: list[dict], k: int) -> None:
    columns = ["return"] + [f"episode {e + 1}" for e in range(k)]
    for split in per_seed[0]["plain"]:
        scores = {c: np.stack([s[c][split] for s in per_seed]) for c in CONDITIONS}  # [seeds, 1+k]
        print(f"\n  {split}: IQM [95% CI] over seeds")
        print("    " + f"{'':<18}" + "".join(f"{c:>22}" for c in columns))
        for c in CONDITIONS:
            cells = [stats.format_iqm(stats.summarize(scores[c][:, j])) for j in range(1 + k)]
            print("    " + f"{c:<18}" + "".join(f"{x:>22}" for x in cells))
        pairs = [(c, "plain") for c in CONDITIONS[1:]] + [("oracle", "steered")]
        for a, b in pairs + [("steered", "control")]:  # the code's effect, not the push's
            cells = [
                stats.format_difference(
                    stats.difference(scores[a][:, j], scores[b][:, j], paired=True)
                )
                for j in range(1 + k)
            ]
            print("    " + f"{a + ' - ' + b:<18}" + "".join(f"{x:>22}" for x in cells))


def main(cfg: Config) -> dict:
    pm.check_agents(cfg, ("gru", "oracle"), "steer_memory")
    exps = rl2.variants(dataclasses.replace(cfg, agents=("gru", "oracle")))
    logdir = pathlib.Path(cfg.logdir)
    # the segment `--segments` names (the run's last); both runs checked before either loads
    # (and of the run's --steps-per-segment: refused where the run trained another)
    run = {"seed": cfg.seed, "num_seeds": cfg.num_seeds, "segment": cfg.segments}
    run["steps_per_segment"] = cfg.steps_per_segment
    for name, exp in exps.items():
        experiment.check_loadable(exp, logdir=logdir / name, **run, eval_as_run=True)
    loaded = {
        name: experiment.load_run(exp, logdir=logdir / name, **run, eval_as_run=True)
        for name, exp in exps.items()
    }
    if loaded["gru"].segments != loaded["oracle"].segments:
        raise SystemExit(
            f"the gru ran {loaded['gru'].segments} segments and the oracle "
            f"{loaded['oracle'].segments}: compare them on one budget"
        )
    k = exps["gru"].env.episodes_per_trial
    fitter = E.Evaluator(
        exps["gru"].env, episodes=k * cfg.fit_trials, max_contexts=cfg.fit_contexts
    )
    per_seed = [_seed(cfg, exps, loaded, fitter, i) for i in range(len(loaded["gru"].seeds))]
    print(
        f"\nThe GRU with its memory steered (strength {cfg.strength}), {len(per_seed)} seeds, "
        f"after {loaded['gru'].segments} segments ({loaded['gru'].env_steps:,} env steps): "
        "mean return over each split's contexts and per episode of a trial; differences "
        "paired by seed, mean [95% t interval]"
    )
    _print(per_seed, k)
    geometry = {
        g: np.asarray([s["geometry"][g] for s in per_seed]) for g in per_seed[0]["geometry"]
    }
    print(
        "\n  the probe's readout against the memory's encoding of the gain, IQM [95% CI] over "
        f"seeds: |cosine| {stats.format_iqm(stats.summarize(geometry['cosine']), 2)}; the memory "
        "moves per unit of decoded gain by "
        f"{stats.format_iqm(stats.summarize(geometry['encoding_move']), 2)} along the encoding, "
        f"{stats.format_iqm(stats.summarize(geometry['readout_move']), 2)} along the readout "
        "(Euclidean norm, the memory's units)"
    )
    escaped = {
        c: {split: np.asarray([s["escaped"][c][split] for s in per_seed]) for split in sets}
        for c, sets in per_seed[0]["escaped"].items()
    }
    print(
        f"\n  envs whose memory left [-{BOUND:g}, {BOUND:g}] at some step of a trial (the GRU's "
        "own state stays in [-1, 1]): mean share over seeds, and the seeds with any"
    )
    print("    " + f"{'':<18}" + "".join(f"{x:>22}" for x in per_seed[0]["plain"]))
    for c, splits in escaped.items():
        cells = [f"{v.mean():.2f} ({int(np.sum(v > 0))} seeds)" for v in splits.values()]
        print("    " + f"{c:<18}" + "".join(f"{x:>22}" for x in cells))
    out = {
        "seeds": loaded["gru"].seeds,
        "env_steps": loaded["gru"].env_steps,
        "strength": cfg.strength,
        "returns": {  # condition -> split -> [seed][return, episode 1, ...]
            c: {split: [s[c][split].tolist() for s in per_seed] for split in per_seed[0][c]}
            for c in CONDITIONS
        },
        "geometry": {g: v.tolist() for g, v in geometry.items()},  # per seed
        "escaped": {  # condition -> split -> per seed
            c: {split: v.tolist() for split, v in splits.items()} for c, splits in escaped.items()
        },
    }
    (logdir / "steer_memory.json").write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main(tyro.cli(Config))
