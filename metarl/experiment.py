"""The segment loop every experiment script shares (one loop, no forked copies).

`run(experiment, logdir=..., segments=..., steps_per_segment=..., seed=...)`:

1. builds the PPO train space once, the curriculum state, and the held-out
   context sets (train / interpolation / extrapolation of the *target* space,
   fixed for the whole run so that segments compare);
2. resumes from ``<logdir>/checkpoints`` when a checkpoint is there (training
   state, env state, curriculum state and segment index, restored bit for bit);
3. per segment: trains on ``curriculum.ranges(state)`` (no recompilation),
   evaluates on the current ranges and on every held-out split, updates the
   curriculum with ``{**train_metrics, "eval_return": ...}``, logs everything
   to TensorBoard (`metarl.tensorboard` tag scheme) and saves a checkpoint;
4. at the end logs a heatmap of return over a context grid and the run's
   hyperparameters, and prints a table.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Any

import jax
import numpy as np
from tqdm import tqdm

from curricula import Curriculum
from metarl import checkpoint
from metarl import evaluation as E
from metarl.agents import ppo
from metarl.contexts import ContextSpace
from metarl.envs import CONTEXT, ContextualEnv
from metarl.tensorboard import RunLogger

HISTORY = "history.json"
# Compiled pieces shared by runs of one process on the same env and settings
# (compare_curricula trains three curricula with one compilation).
_SPACES: dict[tuple[int, ppo.PPOConfig], ppo.TrainSpace] = {}
_EVALUATORS: dict[tuple[int, int, int], E.Evaluator] = {}


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """Held-out evaluation settings."""

    contexts: int = 8  # contexts per split
    episodes: int = 2  # episodes per context
    extrapolation_factor: float = 1.5  # extrapolate within this x the training interval
    heatmap: tuple[str, ...] = ()  # one or two context names (default: the first two)
    heatmap_points: int = 5  # grid points per axis


@dataclasses.dataclass(frozen=True)
class Experiment:
    """What to train: env, target ranges, curriculum, PPO and evaluation settings."""

    env: ContextualEnv
    target: ContextSpace
    curriculum: Curriculum
    ppo: ppo.PPOConfig
    eval: EvalConfig = EvalConfig()


def _per_env(ranges: ContextSpace, target: ContextSpace) -> bool:
    return [np.shape(x) for x in jax.tree.leaves(ranges)] != [
        np.shape(x) for x in jax.tree.leaves(target)
    ]


def _current_set(ranges: ContextSpace, target: ContextSpace, num: int, seed: int) -> E.ContextSet:
    """Contexts drawn as training draws them now (a random env's ranges if per env)."""
    if not _per_env(ranges, target):
        return E.in_distribution(ranges, num, seed)
    n = len(jax.tree.leaves(ranges)[0])
    rows = np.random.default_rng(seed).integers(0, n, num)
    picks = [
        E.in_distribution(jax.tree.map(lambda x, i=i: np.asarray(x)[i], ranges), 1, seed + k)
        for k, i in enumerate(rows)
    ]
    return E.ContextSet(
        "train", {name: np.concatenate([p.values[name] for p in picks]) for name in target}
    )


def _held_out(exp: Experiment, seed: int) -> dict[str, E.ContextSet]:
    n = exp.eval.contexts
    return {
        "train": E.in_distribution(exp.target, n, seed),
        "interpolation": E.interpolation(exp.target, n, seed + 1),
        "extrapolation": E.extrapolation(
            exp.env, exp.target, n, exp.eval.extrapolation_factor, seed + 2
        ),
    }


def _heatmap_axes(exp: Experiment) -> dict[str, np.ndarray]:
    names = exp.eval.heatmap or tuple(exp.target)[:2]
    axes = {}
    for name in names:
        lo, hi = exp.target.intervals()[name]
        lo, hi = float(np.min(lo)), float(np.max(hi))
        centre, half = (lo + hi) / 2, (hi - lo) / 2 * exp.eval.extrapolation_factor
        axes[name] = np.linspace(centre - half, centre + half, exp.eval.heatmap_points)
        axes[name] = np.maximum(axes[name], 1e-3) if lo > 0 else axes[name]
    return axes


def _write_history(logdir: pathlib.Path, rows: list[dict]) -> None:
    tmp = logdir / (HISTORY + ".tmp")
    tmp.write_text(json.dumps(rows, indent=1))
    os.replace(tmp, logdir / HISTORY)


def _scalars(metrics: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if np.ndim(v) == 0}


_COLUMNS = {
    "segment": "segment",
    "env_steps": "env steps",
    "train_return": "train return",
    "train": "eval train",
    "interpolation": "eval interp",
    "extrapolation": "eval extrap",
    "gap": "gap",
}


def _line(values) -> str:
    return " ".join(f"{v:>13.1f}" if isinstance(v, float) else f"{v!s:>13}" for v in values)


def print_table(rows: list[dict], logdir: str | os.PathLike) -> None:
    """The per-segment table and the command that opens the dashboard."""
    print("\n" + _line(_COLUMNS.values()))
    for row in rows:
        print(_line(row[c] for c in _COLUMNS))
    print(f"\nDashboard: tensorboard --logdir {logdir}")


def print_comparison(results: dict[str, list[dict]], logdir: str | os.PathLike) -> None:
    """One line per variant: its last segment's returns on every split."""
    print("\n" + _line(["variant", *list(_COLUMNS.values())[2:]]))
    for name, rows in results.items():
        print(_line([name, *(rows[-1][c] for c in list(_COLUMNS)[2:])]))
    print(f"\nDashboard: tensorboard --logdir {logdir}")


def run(
    exp: Experiment,
    *,
    logdir: str | os.PathLike,
    segments: int,
    steps_per_segment: int,
    seed: int,
    hparams: Any = None,
    progress: bool = True,
    table: bool = True,
) -> list[dict]:
    """Runs (or resumes) the experiment; returns one summary row per segment.

    `hparams`: the script's config (logged to TensorBoard's HParams tab).
    """
    if segments < 1 or steps_per_segment < 1:
        raise ValueError(
            f"segments and steps_per_segment must be >= 1, got {segments}, {steps_per_segment}"
        )
    logdir = pathlib.Path(logdir)
    logdir.mkdir(parents=True, exist_ok=True)
    ckpt_dir = logdir / "checkpoints"
    cache = (id(exp.env), exp.ppo)
    space = _SPACES[cache] = _SPACES.get(cache) or ppo.make_train_space(exp.env, exp.ppo)
    k_train, k_env, k_cur, k_eval = jax.random.split(jax.random.key(seed), 4)
    ts = ppo.init_training_state(space, k_train)
    cstate = exp.curriculum.init(
        exp.target, defaults=exp.env.default_context(), num_envs=exp.ppo.num_envs, key=k_cur
    )
    es = ppo.init_env_state(space, k_env, exp.curriculum.ranges(cstate))
    start, rows = 0, []
    if checkpoint.latest_step(ckpt_dir) is not None:
        like = {"training": ts, "env": es, "curriculum": cstate, "segment": np.int32(0)}
        state = checkpoint.restore(ckpt_dir, like=like)
        ts, es, cstate = state["training"], state["env"], state["curriculum"]
        start = int(state["segment"])
        rows = (
            json.loads((logdir / HISTORY).read_text())[:start]
            if (logdir / HISTORY).exists()
            else []
        )
        print(f"Resuming {logdir} after segment {start} ({space.env_steps(ts):,} env steps)")

    sets = _held_out(exp, seed + 100)
    axes = _heatmap_axes(exp)
    grid = E.grid(exp.target, axes)
    size = (id(exp.env), exp.eval.episodes, max(exp.eval.contexts, len(grid)))
    evaluator = _EVALUATORS[size] = _EVALUATORS.get(size) or E.Evaluator(exp.env, *size[1:])
    names = list(exp.target)
    purge = space.env_steps(ts) + 1 if start else None
    if progress:
        print(_line(_COLUMNS.values()))
    with RunLogger(logdir, names, purge_step=purge) as logger:
        for segment in range(start, segments):
            ranges = exp.curriculum.ranges(cstate)
            with tqdm(
                total=steps_per_segment,
                desc=f"segment {segment + 1}/{segments}",
                unit="step",
                disable=not progress,
                leave=False,
            ) as bar:
                report = lambda done, total: bar.update(done - bar.n)  # noqa: E731
                ts, es, metrics = ppo.run_train(
                    space, ts, es, steps_per_segment, context=ranges, progress=report, chunks=10
                )
            policy = ppo.make_policy(space, ts)
            k_eval, k_now, k_held = jax.random.split(k_eval, 3)
            now = evaluator.evaluate(
                policy, _current_set(ranges, exp.target, exp.eval.contexts, seed + segment), k_now
            )
            held = {split: evaluator.evaluate(policy, s, k_held) for split, s in sets.items()}
            summary = E.summarize(held)
            cstate = exp.curriculum.update(
                cstate, {**metrics, "eval_return": float(np.nanmean(now.mean))}
            )

            step = metrics["env_steps"]
            logger.log_train(step, _scalars(metrics), metrics["env_steps_per_sec"])
            logger.log_ranges(step, ranges)
            logger.log_contexts(step, jax.device_get(es.env.info[CONTEXT]))
            logger.log_eval(
                step,
                {split: summary[split] for split in held},
                gap=summary["generalization_gap"],
                stds={split: float(np.nanmean(r.std)) for split, r in held.items()},
            )
            logger.flush()
            rows.append(
                {
                    "segment": segment + 1,
                    "env_steps": step,
                    "train_return": metrics["episode_return"],
                    **{split: summary[split] for split in held},
                    "gap": summary["generalization_gap"],
                }
            )
            _write_history(logdir, rows)
            if progress:
                tqdm.write(_line(rows[-1][c] for c in _COLUMNS))
            state = {
                "training": ts,
                "env": es,
                "curriculum": cstate,
                "segment": np.int32(segment + 1),
            }
            checkpoint.save(ckpt_dir, segment + 1, state, keep=2)

        heat = evaluator.evaluate(ppo.make_policy(space, ts), grid, k_eval).mean
        (x, xs), *rest = axes.items()
        y, ys = rest[0] if rest else ("(none)", np.zeros(1))
        # E.grid lists points x-major; the image wants rows over y.
        logger.log_heatmap(space.env_steps(ts), x, xs, y, ys, heat.reshape(len(xs), len(ys)).T)
        logger.log_hparams(hparams if hparams is not None else exp.ppo, rows[-1] if rows else {})
    if table:
        print_table(rows, logdir)
    return rows


def run_variants(
    variants: dict[str, Experiment],
    *,
    logdir: str | os.PathLike,
    segments: int,
    steps_per_segment: int,
    seed: int,
    hparams: Any = None,
) -> dict[str, list[dict]]:
    """Runs each experiment under ``<logdir>/<name>`` (same budget and seed) and
    prints one comparison line per variant."""
    results = {}
    for name, exp in variants.items():
        print(f"\n== {name} ==")
        results[name] = run(
            exp,
            logdir=pathlib.Path(logdir) / name,
            segments=segments,
            steps_per_segment=steps_per_segment,
            seed=seed,
            hparams=hparams,
            table=False,
        )
    print_comparison(results, logdir)
    return results
