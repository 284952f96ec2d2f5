"""The segment loop every experiment script shares (one loop, no forked copies).

``run(experiment, logdir=..., segments=..., steps_per_segment=..., seed=...)``
goes through four stages, each a method of `Run`:

1. **setup**: the compiled pieces (`Compiled`: the PPO train space and the
   held-out evaluator, built once and shared explicitly between runs of the
   same env and settings), the run's identity (`run.json`: its config and the
   software it runs on, `metarl.rundir`), fresh states, and the held-out
   context sets (train / interpolation / extrapolation low and high of the *target*
   space), fixed for the whole run, each seed's drawn from its own seed;
2. **resume**: from ``<logdir>/checkpoints`` when one is there (training,
   env and curriculum states and segment index, restored bit for bit). A
   rerun whose config differs refuses to resume (see `RESUME_MODES`);
3. **segment**: trains on the curriculum's ranges (no recompilation),
   evaluates on the current ranges and every held-out split, updates the
   curriculum, logs to TensorBoard (`metarl.tensorboard` tag scheme), probes a
   recurrent agent's memory where ``eval.probe`` asks (`metarl.probe`) and saves
   a checkpoint. Every key comes from ``fold_in`` of the seed, so a resumed
   run logs exactly what an uninterrupted one does; evaluation's keys come from
   streams apart from training's (`_stream`), so no evaluation key is a
   training key (one evaluation key serves every split of a segment: common
   random numbers, so the gaps between splits carry less noise);
4. **report**: hyperparameters with the final metrics (after the last
   segment's checkpoint, on every run that reaches it: a rerun of a finished
   run rewrites them) and the final table.

With ``num_seeds`` N > 1 the N seeds ``seed, seed+1, ...`` train in one
compiled program; each keeps its own curriculum state and TensorBoard run
(``<logdir>/seed_<s>``) and held-out sets (drawn from its own seed, the same
for every variant), and ``<logdir>/aggregate`` holds the mean, the IQM and
the IQM's 95% bootstrap CI over seeds of every eval return, one score per seed
(`metarl.stats`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
import os
import pathlib
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Literal, Protocol

import jax
import numpy as np
from tqdm import tqdm

from metarl import checkpoint, stats
from metarl import evaluation as E
from metarl import probe as P
from metarl.agents import ppo
from metarl.agents.ppo.config import check_seeds
from metarl.contexts import Choice, ContextSpace, LogUniform, PerEnv
from metarl.envs import CONTEXT, ContextualEnv, sources
from metarl.rundir import (
    CHECKPOINTS,
    HISTORY,
    RESUME_MODES,
    RUN_FILE,
    check_identity,
    check_recorded,
    describe_run,
    exclusive,
    run_logdirs,
    write_json,
)
from metarl.tensorboard import (
    RUNNER_STAGES,
    RunLogger,
    context_units,
    episode_return_tag,
    logged_steps,
    nonfinite_tag,
    probe_tag,
    stage_seconds_tag,
)

# The return on contexts drawn from the ranges a segment trained on: what a
# curriculum's update reads as results["eval_return"] (`PerformanceGated`'s gate).
CURRENT_TAG = "eval/current/return"
SPLITS = ("train", "interpolation", "extrapolation", "extrapolation_low", "extrapolation_high")
# The runner's own streams of a seed's key (held-out sets, evaluation episodes, the
# contexts drawn "now"). ``split(k, n)[i]`` is ``fold_in(k, i)``, so small stream ids
# of the seed's key itself would be training's keys (split_keys(k, 3): 1 is the env's,
# 2 the curriculum's): they hang off one tag that no split of that key reaches.
_STREAMS = 0x6D657461
_SETS, _EVAL, _NOW, _PROBE, _ANALYSIS = 1, 2, 3, 4, 5


def _stream(seed: int, stream: int) -> jax.Array:
    """The key of one of the runner's streams of `seed` (see `_STREAMS`)."""
    return jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), _STREAMS), stream)


def analysis_key(seed: int) -> jax.Array:
    """A key for analyses of seed `seed`'s trained policies after its run
    (experiments/probe_memory.py, steer_memory.py): on a stream of its own, apart from
    every key the run's training, evaluation and memory probe drew from. (Until
    2026-12-05 those scripts split ``key(seed)`` itself: training's own keys, so a
    scored trial reset with the key a training env had reset with.)"""
    return _stream(seed, _ANALYSIS)


class CurriculumLike(Protocol):
    """What the runner needs of a curriculum (`curricula.Curriculum` is one)."""

    init: Callable[..., Any]
    update: Callable[[Any, Mapping[str, Any]], Any]
    ranges: Callable[[Any], ContextSpace | PerEnv]


_CURRICULUM_API = ("init", "update", "ranges")


@dataclasses.dataclass(frozen=True)
class RunArgs:
    """The command-line fields every experiment script shares (subclass it)."""

    logdir: str = "runs/experiment"
    segments: int = 5
    steps_per_segment: int = 50_000
    seed: int = 0
    num_seeds: int = 1  # seeds seed, seed+1, ... trained in one compiled program
    resume: Literal["auto", "never", "force"] = "auto"
    keep_checkpoints: int = 2  # the latest segments' checkpoints kept (0: every segment's)
    # A subclass's fields that only choose what runs (which variants) and change no
    # number of a run: left out of run.json's identity, so a rerun may change them
    unrecorded: ClassVar[tuple[str, ...]] = ()

    def run_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of `run` these fields set."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(RunArgs)}

    def seeded(self, config: ppo.PPOConfig) -> ppo.PPOConfig:
        """`config` with the run's seed (`run` seeds from `seed`, and refuses a PPO
        config that says otherwise); a ``--ppo.seed`` other than the default that
        disagrees with ``--seed`` is refused."""
        default = ppo.PPOConfig.__dataclass_fields__["seed"].default
        if config.seed not in (default, self.seed):
            raise SystemExit(
                f"--ppo.seed {config.seed} and --seed {self.seed} disagree: the run's seed "
                "is --seed (leave --ppo.seed out)"
            )
        return dataclasses.replace(config, seed=self.seed)


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """Held-out evaluation settings."""

    contexts: int = 8  # contexts per split
    episodes: int = 2  # episodes per context
    extrapolation_factor: float = 1.5  # extrapolate within this x the training interval
    heatmap: tuple[str, ...] = ()  # one or two context names (default: the first two; one: a str)
    heatmap_points: int = 5  # grid points per axis (a Choice's axis: its own points)
    # A recurrent agent's memory probed after each segment (`metarl.probe`): a linear
    # probe fitted on this many sets of `contexts` contexts drawn from the target
    # (fixed for the run) and scored on each held-out split; 0: no probe
    probe: int = 0

    def __post_init__(self):
        for name in ("contexts", "episodes", "heatmap_points", "probe"):
            value, least = getattr(self, name), {"heatmap_points": 2, "probe": 0}.get(name, 1)
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ValueError(f"eval.{name} must be an integer >= {least}, got {value!r}")
        factor = self.extrapolation_factor
        if not isinstance(factor, int | float) or not math.isfinite(factor) or factor <= 1:
            raise ValueError(
                "eval.extrapolation_factor must be a number > 1 (extrapolate within this "
                f"x the training interval about its centre; 1.5 adds half an interval on "
                f"each side), got {factor!r}"
            )
        if isinstance(self.heatmap, str):  # one name, not its letters
            object.__setattr__(self, "heatmap", (self.heatmap,))
        names = tuple(self.heatmap)
        if any(not isinstance(n, str) for n in names) or len(names) > 2:
            raise ValueError(f"eval.heatmap takes one or two context names, got {names!r}")
        if len(set(names)) < len(names):
            raise ValueError(f"eval.heatmap names one context twice: {names!r}")


@dataclasses.dataclass(frozen=True)
class Experiment:
    """What to train: env, target ranges, curriculum, PPO and evaluation settings."""

    env: ContextualEnv
    target: ContextSpace
    curriculum: CurriculumLike
    ppo: ppo.PPOConfig
    eval: EvalConfig = EvalConfig()

    def __post_init__(self):
        for name, kind, made in (
            ("env", ContextualEnv, "metarl.envs.make_contextual"),
            ("target", ContextSpace, "metarl.contexts.ContextSpace"),
            ("ppo", ppo.PPOConfig, "metarl.agents.ppo.PPOConfig"),
            ("eval", EvalConfig, "metarl.experiment.EvalConfig"),
        ):
            if not isinstance(getattr(self, name), kind):
                raise TypeError(
                    f"Experiment.{name} must be a {kind.__name__} (from {made}), got "
                    f"{type(getattr(self, name)).__name__}"
                )
        if not all(callable(getattr(self.curriculum, f, None)) for f in _CURRICULUM_API):
            raise TypeError(
                f"Experiment.curriculum must have {', '.join(_CURRICULUM_API)} (a curricula "
                f"factory's result), got {type(self.curriculum).__name__}; for fixed ranges "
                "(plain domain randomization over the target) use "
                "curricula.LinearWidening(start=1.0, segments=1)"
            )
        if not len(self.target):
            raise ValueError(
                "Experiment.target names no context: an experiment trains over its target's "
                "ranges and evaluates on contexts held out of them. For training on the "
                "env's own physics alone use metarl.agents.ppo.train"
            )
        # at once, not when a widening curriculum first reaches a bad end segments later
        try:
            self.env.binding.check_ranges(self.target)
        except ValueError as e:
            raise ValueError(f"the experiment's target: {e}") from None
        sources.check_periodic(E.periods(self.env), self.target, "the experiment's target")
        _heatmap_axes(self)  # eval.heatmap's names, at once (not after training)
        if self.eval.probe and self.ppo.core == "mlp":
            raise ValueError(
                f"eval.probe={self.eval.probe} probes a recurrent agent's memory, but "
                "ppo.core is 'mlp', which keeps none: use core='gru' or 'lstm', or eval.probe=0"
            )
        if self.eval.probe and not any(
            np.any(hi > lo) for lo, hi in self.target.intervals().values()
        ):
            raise ValueError(
                f"eval.probe={self.eval.probe}: no context of the target varies, so the "
                "memory has nothing to decode; give the target a range, or eval.probe=0"
            )


@dataclasses.dataclass(frozen=True)
class Compiled:
    """The compiled pieces of an experiment: share one between runs of the same
    env, PPO config, seed count and evaluation sizes (`run_variants` does)."""

    space: ppo.TrainSpace
    evaluator: E.Evaluator
    grid_axes: dict[str, np.ndarray]

    def fits(self, exp: Experiment, num_seeds: int) -> bool:
        axes = _heatmap_axes(exp)
        return (
            self.space.env is exp.env
            and dataclasses.replace(self.space.config, seed=exp.ppo.seed) == exp.ppo
            and self.space.num_seeds == (num_seeds if num_seeds > 1 else None)
            and self.evaluator.episodes == exp.eval.episodes
            and self.evaluator.max_contexts == exp.eval.contexts
            and self.grid_axes.keys() == axes.keys()
            and all(np.array_equal(self.grid_axes[k], v) for k, v in axes.items())
        )


def compile_experiment(exp: Experiment, num_seeds: int = 1) -> Compiled:
    """Builds the train space (with a seed axis if `num_seeds` > 1), compiles its
    programs at once on an accelerator (`ppo.precompile`), and builds the evaluator."""
    axes = _heatmap_axes(exp)
    space = ppo.make_train_space(exp.env, exp.ppo, num_seeds if num_seeds > 1 else None)
    deepest = ppo.training.default_stock_depth(exp.ppo.unroll_length)
    if exp.ppo.stock_depth is None and space.stock_depth not in (None, deepest):
        print(
            f"The stock of fresh states holds {space.stock_depth} per env, not {deepest}: "
            f"{deepest} would take more than {ppo.training.STOCK_MEMORY_SHARE:.0%} of the "
            "device's memory (--ppo.stock-depth)",
            file=sys.stderr,
        )
    ppo.precompile(space, skip_cpu=True)
    return Compiled(
        space=space,
        # a split's size: the heatmap's larger grid runs in chunks of it (`evaluate`),
        # and no split is padded to the grid's size
        evaluator=E.Evaluator(exp.env, exp.eval.episodes, exp.eval.contexts),
        grid_axes=axes,
    )


def _apart(target: ContextSpace) -> dict[str, tuple[int, ...]]:
    """{name: element shape} of the per-element entries whose elements train on
    intervals of their own (Scale(0.5, [1, 4], per_element=True)), not on one shared."""
    return {
        n: np.shape(lo)
        for n, (lo, _) in E._element_bounds(target).items()
        if isinstance(lo, np.ndarray)
    }


def _heatmap_axes(exp: Experiment) -> dict[str, np.ndarray]:
    # A heatmap axis sets every element of a name to one value, and outlines the
    # interval trained on: a per-element entry whose elements train on intervals that
    # differ has no such interval (Scale([0.5, 2], [1, 4]): on its envelope 0.5-4 no
    # point had every element inside its own interval, until 2026-12-07).
    own = list(_apart(exp.target))
    shared = [n for n in exp.target if n not in own]
    names = exp.eval.heatmap or tuple(shared[:2])
    if unknown := [n for n in names if n not in exp.target]:
        raise ValueError(
            f"eval.heatmap: {unknown} not in the target; choose among {list(exp.target)}"
        )
    if not names or (differ := [n for n in names if n in own]):
        which = f"{differ} train" if names else f"every context of the target ({own}) trains"
        raise ValueError(
            f"eval.heatmap: {which} each element on an interval of its own (they differ), "
            "and a heatmap axis sets every element to one value inside one outlined "
            f"interval; choose among {shared}, or give the entry one interval for all "
            "its elements"
        )
    axes = {}
    for name in names:
        if exp.env.binding.discrete_kind(name) is not None:  # read as declared: no value between
            axes[name] = E.whole_axis(exp.target[name]).astype(np.float32)
            continue
        lo, hi = exp.target.intervals()[name]
        bounds = float(np.min(lo)), float(np.max(hi))
        # the coordinates the extrapolation splits use: log space for a LogUniform
        to, back = E._scale(exp.target[name])
        lo, hi = map(to, bounds)
        factor = exp.eval.extrapolation_factor
        # the same bounds as the extrapolation splits: physical, the side of zero, half a
        # turn for an angle; the points are spread over the clipped span (clipping the
        # points would pile those beyond a bound onto it: the same context in several cells)
        if name in exp.env.space:
            margin = 1e-3 * max((hi - lo) / 2 * factor, 1e-3)
            ends = E.outside(exp.env, name, exp.target[name], lo, hi, factor, margin)
        else:
            centre, half = (lo + hi) / 2, (hi - lo) / 2 * factor
            ends = (centre - half, centre + half)
        dist = exp.target[name]
        if isinstance(dist, Choice):
            axes[name] = _choice_axis(dist, ends)
        else:
            line = np.linspace(float(ends[0]), float(ends[1]), exp.eval.heatmap_points)
            axes[name] = E._kept(back(line), *bounds)
    return axes


def _choice_axis(dist: Choice, ends: tuple[float, float]) -> np.ndarray:
    """A `Choice`'s heatmap axis: its trained values, the midpoints between them that
    the interpolation split takes (none between scales of opposite sign: a scale near
    0, the quantity switched off, is another task) and the extrapolated ends that lie
    outside them (an end clipped to a physical limit inside them, damping 0-1's low
    end, is a value no split takes). Evenly spaced points would put cells where no
    split looks, a gain x0 among them."""
    trained = E._trained_values(dist)  # noqa: SLF001 - the splits' own values
    outer = [e for e in ends if not trained[0] <= e <= trained[-1]]
    points = [*outer, *trained, *E.choice_midpoints(dist)]
    return np.unique(np.asarray(points, np.float32))


def _int_seed(key: jax.Array) -> int:
    """A NumPy seed drawn from a JAX key (context sets are built with NumPy)."""
    return int(jax.random.randint(key, (), 0, 2**31 - 1))


def held_out_sets(exp: Experiment, seed: int) -> dict[str, E.ContextSet]:
    """The run's held-out context sets: one per split, from `fold_in` of the seed."""
    base = _stream(seed, _SETS)
    n, factor = exp.eval.contexts, exp.eval.extrapolation_factor
    builders = {
        "train": lambda s: E.in_distribution(exp.target, n, s, exp.env),
        "interpolation": lambda s: E.interpolation(exp.target, n, s, exp.env),
        "extrapolation": lambda s: E.extrapolation(exp.env, exp.target, n, factor, s),
        "extrapolation_low": lambda s: E.extrapolation(exp.env, exp.target, n, factor, s, "low"),
        "extrapolation_high": lambda s: E.extrapolation(exp.env, exp.target, n, factor, s, "high"),
    }
    sets = {}
    for i, (split, build) in enumerate(builders.items()):
        try:
            sets[split] = build(_int_seed(jax.random.fold_in(base, i)))
        except E.NoHeldOutValuesError as e:  # e.g. no physical value below a range near 0
            print(f"Held-out split {split!r} skipped: {e}", file=sys.stderr)
    return sets


def probe_fit_sets(exp: Experiment, seed: int) -> list[E.ContextSet]:
    """The `eval.probe` sets of `eval.contexts` contexts drawn from the target that
    the run's memory probe is fitted on (none without a probe)."""
    base = jax.random.fold_in(_stream(seed, _PROBE), 0)
    sets = [
        E.in_distribution(
            exp.target, exp.eval.contexts, _int_seed(jax.random.fold_in(base, j)), exp.env
        )
        for j in range(exp.eval.probe)
    ]
    drawn = [np.concatenate([s.values[n] for s in sets]) for n in (sets[0].values if sets else ())]
    if sets and not any(np.any(np.nanmax(v, 0) > np.nanmin(v, 0)) for v in drawn):
        raise ValueError(
            f"eval.probe: the {exp.eval.probe} x {exp.eval.contexts} contexts seed {seed} "
            "draws to fit the memory probe on are all one context: nothing to decode; "
            "draw more (a larger eval.probe or eval.contexts)"
        )
    return sets


def _probe_scalars(scores: Mapping[str, P.ProbeScore], episodes: int) -> dict[str, float]:
    """{tag: value} of a seed's probe scores: R^2 and the RMSE (the mean over the
    probed dimensions) per split, over the trial and per episode of it."""
    out = {}
    for split, score in scores.items():
        out[probe_tag(split, "r2")] = score.r2
        out[probe_tag(split, "rmse")] = float(np.mean(score.error))
        if episodes > 1:
            for i in range(episodes):
                out[probe_tag(split, "r2", i + 1)] = float(score.by_episode[i])
                out[probe_tag(split, "rmse", i + 1)] = float(np.mean(score.error_by_episode[i]))
    return out


def _current_set(
    env: ContextualEnv, ranges: ContextSpace | PerEnv, num: int, key: jax.Array
) -> E.ContextSet:
    """Contexts drawn as training draws them now (a random env's ranges if per env)."""
    if not isinstance(ranges, PerEnv):
        return E.in_distribution(ranges, num, _int_seed(key), env)
    k_rows, k_picks = jax.random.split(key)  # a key is drawn from or split, never both
    rows = np.random.default_rng(_int_seed(k_rows)).integers(0, ranges.num_envs, num)
    picks = [
        E.in_distribution(ranges.row(i), 1, _int_seed(jax.random.fold_in(k_picks, k)), env)
        for k, i in enumerate(rows)
    ]
    names = list(ranges.ranges)
    return E.ContextSet("train", {n: np.concatenate([p.values[n] for p in picks]) for n in names})


def _shared(ranges: ContextSpace | PerEnv) -> ContextSpace:
    """Ranges to log: per-env ranges keep their [num_envs] rows, which
    `RunLogger.log_ranges` reduces to their envelope (min low, max high over envs)."""
    return ranges.ranges if isinstance(ranges, PerEnv) else ranges


class _InterruptedError(Exception):
    """Raised inside a segment when SIGINT or SIGTERM arrived."""


@contextlib.contextmanager
def _interruptible():
    """SIGINT / SIGTERM set a flag; the segment loop stops at its next chunk."""
    flag = {"signal": None}

    def handler(signum, frame):
        flag["signal"] = signum

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield flag
    finally:
        for s, h in old.items():
            signal.signal(s, h)


# ---- the run ----
def _check_seed(exp: Experiment, seed: int, num_seeds: int) -> None:
    if not isinstance(num_seeds, int) or isinstance(num_seeds, bool) or num_seeds < 1:
        raise ValueError(f"num_seeds must be an integer >= 1, got {num_seeds!r}")
    check_seeds(seed, num_seeds)
    if exp.ppo.seed != seed:
        raise ValueError(
            f"the run's seed is {seed} but its PPO config says seed={exp.ppo.seed}: "
            "run seeds from its seed argument; set PPOConfig(seed=...) to the same "
            "value (RunArgs.seeded does) so that run.json records the seed used"
        )


def _check_run(
    exp: Experiment,
    logdir: pathlib.Path,
    hparams: Any,
    num_seeds: int,
    seed: int,
    steps_per_segment: int,
    segments: int,
    resume: str,
    quiet: bool = False,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The run's identity and the record its run.json is to hold, or SystemExit
    where `logdir` holds a run it may not continue (`rundir.check_identity`);
    writes nothing."""
    identity = describe_run(exp, hparams, num_seeds, seed, steps_per_segment, segments)
    ckpt, history = logdir / CHECKPOINTS, logdir / HISTORY
    done = checkpoint.latest_step(ckpt)
    # an attempt stopped before its first checkpoint saved nothing (its history and its
    # event files hold one segment at most: both are written just before the checkpoint)
    saved = (
        done is not None
        or bool(checkpoint.damaged_steps(ckpt))
        or (history.exists() and len(json.loads(history.read_text())) > 1)
        or _logged_segments(logdir) > 1
    )
    record = check_identity(
        logdir, identity, resume, segments_done=done or 0, write=False, saved=saved, quiet=quiet
    )
    return identity, record


class Run:
    """One experiment run in `logdir`; `run` drives its stages (see module docstring)."""

    def __init__(
        self,
        exp: Experiment,
        logdir: str | os.PathLike,
        seed: int,
        num_seeds: int,
        compiled: Compiled | None = None,
        keep_checkpoints: int = 2,
    ):
        _check_seed(exp, seed, num_seeds)
        seed = int(seed)  # a NumPy integer would reach run.json and history.json as text
        self.exp, self.seed, self.num_seeds = exp, seed, num_seeds
        self.keep_checkpoints = keep_checkpoints
        self.logdir = pathlib.Path(logdir)
        if compiled is not None and not compiled.fits(exp, num_seeds):
            raise ValueError("compiled: built for another env, PPO config, seed count or eval size")
        self.compiled = compiled or compile_experiment(exp, num_seeds)
        self.seeds = [seed + k for k in range(num_seeds)]
        self.rows: list[dict] = []
        self.start = 0
        # wall seconds per stage (RUNNER_STAGES) of each segment run in this process
        self.seconds: list[dict[str, float]] = []

    @property
    def space(self) -> ppo.TrainSpace:
        return self.compiled.space

    def _per_seed(self, values: list) -> Any:
        return values[0] if self.num_seeds == 1 else values

    def _logdirs(self) -> list[pathlib.Path]:
        if self.num_seeds == 1:
            return [self.logdir]
        return [self.logdir / f"seed_{s}" for s in self.seeds] + [self.logdir / "aggregate"]

    # stage 1
    def setup(self, hparams: Any, resume: str, steps_per_segment: int, segments: int) -> None:
        self.logdir.mkdir(parents=True, exist_ok=True)
        self.identity, self.record = _check_run(
            self.exp, self.logdir, hparams, self.num_seeds, self.seed, steps_per_segment,
            segments, resume,
        )  # fmt: skip
        self._init_states()
        exp = self.exp
        self.eval_keys = [_stream(s, _EVAL) for s in self.seeds]
        self.now_keys = [_stream(s, _NOW) for s in self.seeds]
        # each seed's own held-out contexts: the seeds' scores are then independent
        # draws of the training and of the evaluation contexts, and the CI over seeds
        # covers both (one shared set shifted every seed alike: reacher 47 [43, 50] on
        # one draw of 6 contexts, 36 [27, 42] on another, the policies unchanged)
        self.sets = [held_out_sets(exp, s) for s in self.seeds]
        self.grid = E.grid(exp.target, self.compiled.grid_axes)
        # their ranges and contexts are also logged per element (the envelope is no
        # element's interval)
        self.apart = _apart(exp.target)
        # the memory probe's fit sets, fixed for the run like the held-out ones, and
        # the keys of its trials
        self.probe_keys = [jax.random.fold_in(_stream(s, _PROBE), 1) for s in self.seeds]
        self.probe_sets = [probe_fit_sets(exp, s) for s in self.seeds]

    def _init_states(self) -> None:
        """The training, curriculum and env states the run starts from."""
        exp = self.exp
        keys = ppo.seed_keys(self.seed, self.num_seeds if self.num_seeds > 1 else None)
        k_train, k_env, k_cur = ppo.split_keys(keys, 3)
        self.ts = ppo.init_training_state(self.space, k_train)
        k_cur = [k_cur] if self.num_seeds == 1 else list(k_cur)
        self.cstates = [
            exp.curriculum.init(
                exp.target, defaults=exp.env.default_context(), num_envs=exp.ppo.num_envs, key=k
            )
            for k in k_cur
        ]
        self.es = ppo.init_env_state(self.space, k_env, self._ranges())

    def policies(self) -> list[ppo.Policy]:
        """Each seed's policy at the run's current training state."""
        return [
            ppo.make_policy(
                self.space, self.ts if self.num_seeds == 1 else ppo.select_seed(self.ts, i)
            )
            for i in range(self.num_seeds)
        ]

    def _ranges(self) -> Any:
        return self._per_seed([self.exp.curriculum.ranges(c) for c in self.cstates])

    def _state(self, segment: int) -> dict[str, Any]:
        return {
            "training": self.ts,
            "env": ppo.thin_env_state(self.es),  # a stock's entries are computed again
            "curriculum": self.cstates,
            "segment": np.int32(segment),
        }

    # stage 2
    def resume(self) -> None:
        ckpt, history = self.logdir / CHECKPOINTS, self.logdir / HISTORY

        # what starting this run over in its --logdir takes (a fresh start needs no
        # damaged checkpoint and at most one segment's history, which it removes)
        def over() -> str:  # after `restore` moved any damaged step aside
            damaged = f"{ckpt / 'damaged-*'} and " if checkpoint.damaged_steps(ckpt) else ""
            return f"remove {damaged}{history} to start this run over here"

        if checkpoint.latest_step(ckpt) is None:
            if damaged := checkpoint.damaged_steps(ckpt):  # never start over on top of them
                raise SystemExit(self._all_damaged(damaged, over()))
            if history.exists() and len(json.loads(history.read_text())) > 1:
                # more segments than a kill before the first checkpoint leaves
                raise SystemExit(
                    f"{self.logdir} holds the history of several segments but no checkpoint "
                    f"in {ckpt}: its checkpoints were removed. Nothing was deleted; put them "
                    f"back to resume, {over()}, or start a new run with another --logdir"
                )
            if (logged := _logged_segments(self.logdir)) > 1:
                # checkpoints and history removed: the logs of a run, not of an attempt
                # (deleted as stale until 2026-12-07, a finished run's included)
                raise SystemExit(
                    f"{self.logdir} holds TensorBoard logs of {logged} segments but no "
                    f"checkpoint in {ckpt} and no history: its checkpoints were removed. "
                    f"Nothing was deleted; put them back to resume, remove the event files "
                    f"(events.out.tfevents.*) in {self.logdir} and its seed folders to start "
                    f"this run over here, or start a new run with another --logdir"
                )
            # A fresh start: whatever an earlier attempt logged before its first
            # checkpoint is stale (it would duplicate points), so it goes, in the
            # folders of any seed count (an attempt of another config leaves no run).
            for d in run_logdirs(self.logdir):
                for f in d.glob("events.out.tfevents.*"):
                    f.unlink()
            history.unlink(missing_ok=True)
            write_json(self.logdir / RUN_FILE, self.record)
            return
        try:
            state = checkpoint.restore(ckpt, like=self._state(0))
        except checkpoint.CheckpointError as e:  # damaged (moved aside), or another structure
            if checkpoint.latest_step(ckpt) is None:  # every step was damaged: moved aside
                raise SystemExit(
                    f"cannot resume {self.logdir}: {e}\n"
                    + self._all_damaged(checkpoint.damaged_steps(ckpt), over())
                ) from None
            raise SystemExit(
                f"cannot resume {self.logdir}: {e}\nnothing was deleted (a checkpoint of "
                "another structure was made by another config: start a new run with "
                "another --logdir)"
            ) from None
        start = int(state["segment"])
        rows = json.loads(history.read_text()) if history.exists() else []
        if len(rows) < start:  # written before each checkpoint: only a user removes it
            raise SystemExit(
                f"{history} holds {len(rows)} of the {start} segments its checkpoints "
                "hold: it was removed or replaced. Nothing was deleted; put it back to "
                "resume, or start a new run with another --logdir"
            )
        write_json(self.logdir / RUN_FILE, self.record)  # restored: the record may change
        self.ts, self.cstates = state["training"], state["curriculum"]
        self.es = ppo.restock_env_state(self.space, state["env"])
        self.start, self.rows = start, rows[:start]
        if len(rows) > start:  # segments a kill left without a checkpoint: TensorBoard
            write_json(history, self.rows)  # purges them, and so does the history
        print(
            f"Resuming {self.logdir} after segment {self.start} "
            f"({self.space.env_steps(self.ts):,} env steps)"
        )

    def _all_damaged(self, damaged: list[str], over: str) -> str:
        return (
            f"{self.logdir / CHECKPOINTS} holds no intact checkpoint, only damaged ones moved "
            f"aside ({', '.join(damaged)}); nothing was deleted. Restore them from a backup to "
            f"resume, {over}, or start a new run with another --logdir"
        )

    # stage 3
    def segment(self, k: int, segments: int, steps: int, loggers, flag, progress: bool) -> None:
        exp = self.exp
        ranges = self._ranges()
        clock = time.perf_counter()
        with tqdm(
            total=_whole_steps(exp, steps),  # as run_train reports them
            desc=f"segment {k + 1}/{segments}",
            unit="step",
            disable=not progress,
            leave=False,
        ) as bar:

            def report(done, total):
                bar.total = total  # whole iterations: at least `steps`
                bar.update(done - bar.n)
                if flag["signal"] is not None:
                    raise _InterruptedError

            self.ts, self.es, metrics = ppo.run_train(
                self.space, self.ts, self.es, steps, context=ranges, progress=report, chunks=10
            )
        seconds = dict.fromkeys(RUNNER_STAGES, 0.0)
        seconds["train"] = time.perf_counter() - clock
        metrics = [metrics] if self.num_seeds == 1 else metrics
        ranges = [ranges] if self.num_seeds == 1 else ranges
        results = []
        for i in range(self.num_seeds):
            ts = self.ts if self.num_seeds == 1 else ppo.select_seed(self.ts, i)
            results.append(self._evaluate(i, k, ts, ranges[i]))
            for stage, spent in results[-1].pop("seconds").items():
                seconds[stage] += spent
            read = {**metrics[i], "eval_return": results[-1]["now"]}
            summary = getattr(exp.curriculum, "summary", None)  # before the update
            results[-1]["curriculum"] = (
                {} if summary is None else _summary(summary, self.cstates[i], read)
            )
            self.cstates[i] = exp.curriculum.update(self.cstates[i], read)
        step = self.space.env_steps(self.ts)
        clock = time.perf_counter()
        self._log_seconds(loggers, step, seconds, ("train", "eval", "probe"))
        contexts = jax.device_get(self.es.env.info[CONTEXT])
        for i, logger in enumerate(loggers[: self.num_seeds]):
            seed_contexts = contexts if self.num_seeds == 1 else ppo.select_seed(contexts, i)
            self._log(logger, step, metrics[i], ranges[i], seed_contexts, results[i])
        if self.num_seeds > 1:
            self._log_aggregate(loggers[-1], step, results, ranges, metrics[0])
        self.rows.append(self._row(k + 1, step, metrics, results))
        write_json(self.logdir / HISTORY, self.rows)
        seconds["log"], clock = time.perf_counter() - clock, time.perf_counter()
        keep = self.keep_checkpoints or segments  # 0: every segment's
        checkpoint.save(self.logdir / CHECKPOINTS, k + 1, self._state(k + 1), keep=keep)
        seconds["checkpoint"] = time.perf_counter() - clock
        # after the checkpoint, at the segment's step: a resume keeps these points
        self._log_seconds(loggers, step, seconds, ("log", "checkpoint"))
        for logger in loggers:  # the others went out with the segment's own flush
            logger.flush()
        self.seconds.append(seconds)

    def _log_seconds(self, loggers, step: int, seconds: dict, stages: tuple[str, ...]) -> None:
        """perf/<stage>_seconds, the segment's wall time in `stages` (all seeds
        together), in every run's events; the probe's only where it runs."""
        timed = {
            stage_seconds_tag(s): seconds[s] for s in stages if s != "probe" or self.exp.eval.probe
        }
        for logger in loggers:
            logger.log_scalars(step, timed)

    def _evaluate(self, i: int, k: int, ts, ranges) -> dict[str, Any]:
        """Seed i's evaluation after segment k, with its wall time under "seconds"."""
        clock = time.perf_counter()
        policy = ppo.make_policy(self.space, ts)
        evaluator = self.compiled.evaluator
        key = jax.random.fold_in(self.eval_keys[i], k)  # the evaluator splits it per env
        now_set = _current_set(
            self.exp.env, ranges, self.exp.eval.contexts, jax.random.fold_in(self.now_keys[i], k)
        )
        now = evaluator.evaluate(policy, now_set, key)
        held = {split: evaluator.evaluate(policy, s, key) for split, s in self.sets[i].items()}
        heat = evaluator.evaluate(policy, self.grid, key).mean
        result = {"now": float(np.nanmean(now.mean)), "held": held, "heat": heat}
        result["seconds"] = {"eval": time.perf_counter() - clock}
        if self.exp.eval.probe:
            clock = time.perf_counter()
            scores = P.fit_and_score(
                evaluator,
                policy,
                self.probe_sets[i],
                self.sets[i],
                jax.random.fold_in(self.probe_keys[i], k),
            )
            result["probe"] = _probe_scalars(scores, self.exp.env.episodes_per_trial)
            result["seconds"]["probe"] = time.perf_counter() - clock
        return result

    def _log(self, logger: RunLogger, step, metrics, ranges, contexts, result) -> None:
        held = result["held"]
        summary = E.summarize(held)
        scalars = {k: v for k, v in metrics.items() if np.ndim(v) == 0}
        logger.log_scalars(step, {CURRENT_TAG: result["now"]})
        logger.log_scalars(step, {f"curriculum/{k}": v for k, v in result["curriculum"].items()})
        # this run's env steps per second: the program's total over its seeds, which
        # advance together (the aggregate run logs the total)
        speed = metrics["env_steps_per_sec"] / self.num_seeds
        logger.log_train(step, scalars, speed, metrics["compile_seconds"])
        logger.log_ranges(step, _shared(ranges), self.apart)
        logger.log_contexts(step, contexts, self.apart)
        episodes = self.exp.env.episodes_per_trial
        logger.log_eval(
            step,
            {split: summary[split] for split in held},
            gap=summary.get("generalization_gap"),
            interpolation_gap=summary.get("interpolation_gap"),
            stds={split: float(np.nanstd(r.mean)) for split, r in held.items()},
            nonfinite={split: int(r.nonfinite.sum()) for split, r in held.items()},
            by_episode=(
                {split: np.nanmean(r.by_episode, 0) for split, r in held.items()}
                if episodes > 1
                else None
            ),
        )
        logger.log_scalars(step, result.get("probe", {}))
        self._log_heatmap(logger, step, result["heat"], [ranges])
        logger.flush()

    def _log_heatmap(self, logger: RunLogger, step: int, heat: np.ndarray, ranges: list) -> None:
        """The grid's mean returns, with the ranges trained on in this segment outlined
        (their envelope over envs and, for the aggregate, over seeds)."""
        (x, xs), *rest = self.compiled.grid_axes.items()
        y, ys = rest[0] if rest else ("(none)", np.zeros(1))
        spans = [_shared(r).intervals() for r in ranges]

        def envelope(name):
            return [
                float(min(np.min(s[name][0]) for s in spans)),
                float(max(np.max(s[name][1]) for s in spans)),
            ]

        box = envelope(x) + (envelope(y) if rest else [0, 0])
        target = self.exp.target  # E.grid spaces a LogUniform's points geometrically
        geometric = (
            isinstance(target[x], LogUniform),
            bool(rest) and isinstance(target[y], LogUniform),
        )
        # E.grid lists points x-major; the image wants rows over y.
        logger.log_heatmap(
            step, x, xs, y, ys, heat.reshape(len(xs), len(ys)).T, tuple(box), geometric
        )

    def _log_aggregate(
        self, logger: RunLogger, step: int, results: list[dict], ranges, metrics: dict
    ) -> None:
        summaries = [E.summarize(r["held"]) for r in results]
        scalars = _over_seeds(CURRENT_TAG, np.asarray([r["now"] for r in results]))
        for name in summaries[0]:
            # One score per seed (its mean over the contexts), as in the printed table:
            # every context is scored by the same policy of a seed, so the contexts are
            # not independent strata (see metarl.stats).
            scores = np.asarray([s[name] for s in summaries])
            tag = "eval/generalization_gap" if name.endswith("gap") else f"eval/{name}/return"
            if name == "interpolation_gap":
                tag = "eval/interpolation_gap"
            scalars.update(_over_seeds(tag, scores))
        for split in results[0]["held"]:  # episodes cut by non-finite physics, all seeds
            cut = sum(int(r["held"][split].nonfinite.sum()) for r in results)
            scalars[nonfinite_tag(split)] = float(cut)
        if self.exp.env.episodes_per_trial > 1:
            for split in results[0]["held"]:
                curves = np.stack([np.nanmean(r["held"][split].by_episode, 0) for r in results])
                for i, scores in enumerate(curves.T, start=1):  # [seeds] per episode
                    scalars.update(_over_seeds(episode_return_tag(split, i), scores))
        for tag in results[0].get("probe", {}):
            scalars.update(_over_seeds(tag, np.asarray([r["probe"][tag] for r in results])))
        logger.log_scalars(step, scalars)
        # the compiled program's throughput, all seeds together (the same in every row)
        logger.log_train(step, {}, metrics["env_steps_per_sec"], metrics["compile_seconds"])
        self._log_heatmap(logger, step, np.mean([r["heat"] for r in results], 0), ranges)
        logger.flush()

    def _row(self, segment: int, step: int, metrics: list, results: list) -> dict[str, Any]:
        summaries = [E.summarize(r["held"]) for r in results]
        row = {"segment": segment, "env_steps": step, "seeds": self.seeds}
        row["train_return"] = self._per_seed([m["episode_return"] for m in metrics])
        row["current"] = self._per_seed([r["now"] for r in results])
        if results[0]["curriculum"]:  # what each seed's curriculum read and decided
            row["curriculum"] = {
                tag: self._per_seed([r["curriculum"][tag] for r in results])
                for tag in results[0]["curriculum"]
            }
        for split in (*SPLITS, "generalization_gap", "interpolation_gap"):
            if split in summaries[0]:
                row[split] = self._per_seed([s[split] for s in summaries])
        row["nonfinite_episodes"] = {  # held-out episodes cut by non-finite physics
            split: self._per_seed([int(r["held"][split].nonfinite.sum()) for r in results])
            for split in results[0]["held"]
        }
        if self.exp.env.episodes_per_trial > 1 and "train" in results[0]["held"]:
            # the adaptation curve: mean return of the i-th episode of a trial, per seed
            curves = [np.nanmean(r["held"]["train"].by_episode, 0) for r in results]
            per_episode = np.asarray(curves, float).T  # [episodes, seeds]
            row["episodes"] = [self._per_seed(list(map(float, e))) for e in per_episode]
        if "probe" in results[0]:  # {tag: value per seed}, as logged
            row["probe"] = {
                t: self._per_seed([r["probe"][t] for r in results]) for t in results[0]["probe"]
            }
        return row

    # stage 4 (after the last segment, on every run that reaches it)
    def report(self, loggers: list[RunLogger]) -> None:
        """The hyperparameters with the final metrics, for TensorBoard's HParams tab;
        each call replaces what an earlier one wrote (`RunLogger.log_hparams`), so a
        rerun of a finished run, or one ended at fewer segments, reports its last."""
        final = self.rows[-1]
        for i, logger in enumerate(loggers[: self.num_seeds]):
            values = {
                k: v[i] if isinstance(v, list) else v
                for k, v in final.items()
                if k not in ("episodes", "nonfinite_episodes", "seeds", "curriculum", "probe")
            }
            for j, v in enumerate(final.get("episodes", []), 1):
                values[f"episode_{j}"] = v[i] if isinstance(v, list) else v
            # what ran (run.json's config: the PPO and eval settings of this experiment,
            # not the script's defaults a variant replaced), with this seed
            logger.log_hparams(
                {**self.identity, "seed": self.seeds[i], "ppo.seed": self.seeds[i]},
                values,
                step=final["env_steps"],
            )
            logger.flush()


def _logged_segments(logdir: pathlib.Path) -> int:
    """The segments whose points the run's event files hold (one env step each)."""
    return len(set().union(*(logged_steps(d) for d in run_logdirs(logdir))))


def _summary(summary: Callable, state: Any, results: Mapping[str, Any]) -> dict[str, float]:
    """A curriculum's `summary(state, results)` as {tag: float}, checked: a tag that
    is not a string or a value that is not one number is refused, naming it."""
    out = {}
    for tag, value in dict(summary(state, results)).items():
        if not isinstance(tag, str) or np.ndim(value) != 0 or isinstance(value, bool | str):
            raise TypeError(
                f"the curriculum's summary must map str tags to single numbers; got "
                f"{tag!r}: {value!r}"
            )
        out[tag] = float(value)
    return out


def _over_seeds(tag: str, scores: np.ndarray) -> dict[str, float]:
    """An aggregate scalar over seeds of one score per seed: the mean, the IQM and
    the IQM's 95% CI (the mean can lie outside it; NaN below
    `stats.MIN_SEEDS_FOR_CI`), over the seeds with a finite
    score, and how many seeds were left out for a non-finite one."""
    agg = stats.summarize(np.asarray(scores, float))
    return {
        tag: agg.mean,
        f"{tag}/iqm": agg.iqm,
        f"{tag}/iqm_ci_low": agg.ci_low,
        f"{tag}/iqm_ci_high": agg.ci_high,
        f"{tag}/nonfinite_seeds": float(agg.dropped),
    }


# A per-env curriculum (ADR) credits an env only with episodes of trials drawn under
# its current ranges (`TrialInfo.current_ranges`): where its assignment changed, the
# trial running when a segment starts ran under the earlier one. Two trials' worth of
# steps per env is the least that always fits one whole trial after it; fewer, and the
# trials that last longest, the successful ones, are never credited (compare_curricula
# once ran ADR at 400 steps per env per segment with 500-step episodes: it could not
# widen).
MIN_TRIALS_PER_SEGMENT = 2


def _whole_steps(exp: Experiment, steps_per_segment: int) -> int:
    """The env steps a segment trains: whole PPO iterations, at least `steps_per_segment`."""
    return math.ceil(steps_per_segment / exp.ppo.batch_size) * exp.ppo.batch_size


def _note_whole_iterations(exp: Experiment, steps_per_segment: int) -> int:
    """`_whole_steps`, said where that is more than asked (a run's record keeps what
    was asked)."""
    batch, steps = exp.ppo.batch_size, _whole_steps(exp, steps_per_segment)
    if steps != steps_per_segment:
        print(
            f"steps_per_segment={steps_per_segment} is not a whole number of PPO iterations "
            f"of {batch} env steps: each segment trains {steps // batch} iterations, "
            f"{steps} steps (the logged env_steps)",
            file=sys.stderr,
        )
    return steps


def check_segment_length(exp: Experiment, steps_per_segment: int) -> None:
    """Refuses a segment too short for what the curriculum reads: one that gives each
    env fewer than `MIN_TRIALS_PER_SEGMENT` trials' worth of steps where the curriculum
    reads the training episodes played on the segment's own ranges (ADR, per env; a gate
    on ``metric="episode_return"``): only trials that start within the segment count."""
    config, env = exp.ppo, exp.env
    per_env = math.ceil(steps_per_segment / config.batch_size) * config.unroll_length
    trial = env.episode_length * env.episodes_per_trial
    if per_env >= MIN_TRIALS_PER_SEGMENT * trial:
        return
    least = math.ceil(MIN_TRIALS_PER_SEGMENT * trial / config.unroll_length) * config.batch_size
    short = (
        f"steps_per_segment={steps_per_segment} gives each of the {config.num_envs} envs "
        f"{per_env} steps per segment, under {MIN_TRIALS_PER_SEGMENT} trials of {trial} steps"
    )
    params = getattr(exp.curriculum, "params", None)  # a curriculum of your own may have none
    metric = params.get("metric") if isinstance(params, Mapping) else None
    if metric == "episode_return":
        raise ValueError(
            f"{short}: the curriculum gates on 'episode_return', the mean return of the "
            "training episodes played on the segment's own ranges, and only trials that "
            "start within the segment count: a shorter segment gates on few (with trials "
            "of several episodes, none) of them, or on none once the agent keeps every "
            f"episode going. Use steps_per_segment >= {least}, or metric='eval_return'"
        )
    state = exp.curriculum.init(
        exp.target,
        defaults=exp.env.default_context(),
        num_envs=exp.ppo.num_envs,
        key=jax.random.key(0),
    )
    if isinstance(exp.curriculum.ranges(state), PerEnv):
        raise ValueError(
            f"{short}: a per-env curriculum (ADR) credits only trials that start and end "
            "within a segment, so its longest (most successful) trials would never count. "
            f"Use steps_per_segment >= {least}, or fewer envs or shorter episodes"
        )


def _check_keep(keep_checkpoints: int) -> None:
    if not isinstance(keep_checkpoints, int | np.integer) or isinstance(keep_checkpoints, bool):
        raise ValueError(f"keep_checkpoints must be an integer, got {keep_checkpoints!r}")
    if keep_checkpoints < 0:
        raise ValueError(
            f"keep_checkpoints must be >= 1 (the latest segments' kept) or 0 (every "
            f"segment's), got {keep_checkpoints}"
        )


def run(
    exp: Experiment,
    *,
    logdir: str | os.PathLike,
    segments: int,
    steps_per_segment: int,
    seed: int,
    num_seeds: int = 1,
    resume: str = "auto",
    hparams: Any = None,
    compiled: Compiled | None = None,
    progress: bool = True,
    table: bool = True,
    keep_checkpoints: int = 2,
) -> list[dict]:
    """Runs (or resumes) the experiment; returns one summary row per segment.

    `hparams`: the script's config (logged to TensorBoard's HParams tab and
    recorded in ``run.json``). `compiled`: pieces from `compile_experiment` to
    share. With `num_seeds` > 1 every row value is a list over seeds.
    `keep_checkpoints`: how many of the latest segments' checkpoints stay on disk
    (0: every segment's, for `load_run(segment=...)` after the run); it changes no
    number, so a resume may change it.
    Ctrl-C (SIGINT) or SIGTERM stops at the next chunk of the segment in
    progress (or, arriving after its last chunk, once the segment is saved),
    keeps the last checkpoint and exits with status 130.
    """
    for name, value in (
        ("segments", segments),
        ("steps_per_segment", steps_per_segment),
        ("num_seeds", num_seeds),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    check_seeds(seed, num_seeds)
    _check_keep(keep_checkpoints)
    if resume not in RESUME_MODES:
        raise ValueError(f"resume must be one of {RESUME_MODES}, got {resume!r}")
    if jax.process_count() > 1:
        raise ValueError(
            f"run drives one process, and this is process {jax.process_index()} of "
            f"{jax.process_count()}: its checkpoints and logs are not written for several "
            "hosts yet. On several hosts, train with metarl.agents.ppo (make_train_space, "
            "run_train) in your own loop"
        )
    check_segment_length(exp, steps_per_segment)
    _note_whole_iterations(exp, steps_per_segment)
    r = Run(exp, logdir, seed, num_seeds, compiled, keep_checkpoints)
    with contextlib.ExitStack() as stack, _interruptible() as flag:
        stack.enter_context(exclusive(r.logdir))
        _segments(r, stack, flag, segments, steps_per_segment, hparams, resume, progress)
    if table:
        print_table(r.rows, logdir)
    if progress and r.seconds:
        print(seconds_line(r.seconds, probe=bool(exp.eval.probe)))
    return r.rows


@dataclasses.dataclass(frozen=True)
class TrainedRun:
    """A run's agents read back from its checkpoint (`load_run`), one per seed."""

    compiled: Compiled  # the train space and evaluator of the run's experiment
    segments: int  # the segments the checkpoint holds
    env_steps: int
    seeds: list[int]
    policies: list[ppo.Policy]  # trained
    initial: list[ppo.Policy]  # at the parameters the run started from (a control)


def check_loadable(
    exp: Experiment,
    *,
    logdir: str | os.PathLike,
    seed: int,
    num_seeds: int = 1,
    segment: int | None = None,
    eval_as_run: bool = False,
    steps_per_segment: int | None = None,
) -> None:
    """What `load_run` checks before it builds anything (the run's run.json, its
    checkpoints, `segment`), raising what it raises: a script that reads several runs
    checks them all before it compiles the first (experiments/steer_memory.py)."""
    logdir = pathlib.Path(logdir)
    _check_seed(exp, seed, num_seeds)
    config = describe_run(exp, None, num_seeds, seed, steps_per_segment or 1, 1)
    also = ("eval.",) if eval_as_run else ()
    also += ("steps_per_segment",) if steps_per_segment is not None else ()
    check_recorded(logdir, config, "load_run", also=also)
    ckpt = logdir / CHECKPOINTS
    if checkpoint.latest_step(ckpt) is None:
        raise ValueError(f"load_run: {ckpt} holds no intact checkpoint: the run saved none yet")
    if segment is not None:
        checkpoint.require_step(ckpt, segment)


def load_run(
    exp: Experiment,
    *,
    logdir: str | os.PathLike,
    seed: int,
    num_seeds: int = 1,
    segment: int | None = None,
    compiled: Compiled | None = None,
    eval_as_run: bool = False,
    steps_per_segment: int | None = None,
) -> TrainedRun:
    """The policies of the run of `exp` in `logdir` after its latest checkpointed
    segment (or `segment`, while its checkpoint is kept), to analyse them, with the
    policies its seeds started from. The experiment, `seed` and `num_seeds` must be
    the run's (its run.json is checked; a checkpoint of another structure is refused
    by `checkpoint.restore`). A `segment` whose checkpoint is not kept raises
    FileNotFoundError naming the kept ones. `eval_as_run`: also refuse an `exp.eval`
    other than the run's, so that `held_out_sets` gives the contexts the run's
    evaluation scored (an analysis of them; other settings draw other contexts).
    `steps_per_segment`: also refuse a run that trained segments of another length
    (a script that takes the run's flags: segment N of another budget is another agent).
    Writes nothing (but moves a damaged newest checkpoint aside, as a resume does),
    so the run may go on afterwards. `check_loadable` makes its checks alone."""
    check_loadable(
        exp,
        logdir=logdir,
        seed=seed,
        num_seeds=num_seeds,
        segment=segment,
        eval_as_run=eval_as_run,
        steps_per_segment=steps_per_segment,
    )
    logdir = pathlib.Path(logdir)
    ckpt = logdir / CHECKPOINTS
    r = Run(exp, logdir, seed, num_seeds, compiled)
    r._init_states()  # noqa: SLF001 - the structure to restore into, and the initial agents
    initial = r.policies()
    try:
        state = checkpoint.restore(ckpt, like=r._state(0), step=segment)  # noqa: SLF001
    except checkpoint.CheckpointError as e:
        raise ValueError(f"load_run: cannot read {ckpt}: {e}") from None
    r.ts = state["training"]
    return TrainedRun(
        compiled=r.compiled,
        segments=int(state["segment"]),
        env_steps=int(r.space.env_steps(r.ts)),
        seeds=r.seeds,
        policies=r.policies(),
        initial=initial,
    )


def _segments(r: Run, stack, flag, segments, steps_per_segment, hparams, resume, progress):
    """`run`'s stages, inside its lock and signal handlers."""
    r.setup(hparams, resume, steps_per_segment, segments)
    r.resume()
    purge = r.space.env_steps(r.ts) + 1 if r.start else None
    if progress:
        print(_line(_columns(r.num_seeds).values(), r.num_seeds))
    names, units = list(r.exp.target), context_units(r.exp.target)
    loggers = [
        stack.enter_context(
            RunLogger(d, names, purge_step=purge, units=units, probe=bool(r.exp.eval.probe))
        )
        for d in r._logdirs()
    ]
    for k in range(r.start, segments):
        try:
            r.segment(k, segments, steps_per_segment, loggers, flag, progress)
        except _InterruptedError:
            done = checkpoint.latest_step(r.logdir / CHECKPOINTS)
            kept = (
                f"the checkpoint after segment {done} is kept. Resume by rerunning the same command"
                if done is not None
                else "no checkpoint was saved yet: a rerun starts afresh, with any config"
            )
            print(f"\nInterrupted during segment {k + 1}: {kept}.", file=sys.stderr)
            raise SystemExit(130) from None
        except ppo.TrainingDivergedError as e:
            raise _diverged(r, k, e) from None
        if progress:
            tqdm.write(_line(_cells(r.rows[-1], r.num_seeds), r.num_seeds))
        _stop_if_signalled(flag, f"after segment {k + 1}, which is saved")
    if r.rows:
        r.report(loggers)
    _stop_if_signalled(flag, "at the end of the run, which is saved")


def _diverged(r: Run, k: int, e: ppo.TrainingDivergedError) -> ppo.TrainingDivergedError:
    """`e` in the run's words: which segment and seeds, what was kept, what to do."""
    done = checkpoint.latest_step(r.logdir / CHECKPOINTS)
    seeds = ", ".join(str(r.seed + i) for i in e.seeds)
    kept = (
        f"Its checkpoint after segment {done} and history are kept, with nothing of "
        f"segment {k + 1}. A rerun of this config resumes to the same numbers and "
        "diverges again: change it, in a new log directory (a run's PPO config cannot "
        "change on resume)"
        if done is not None
        else "Nothing was saved: rerun with a changed config (this log directory may be reused)"
    )
    return ppo.TrainingDivergedError(
        f"{r.logdir}: segment {k + 1} diverged (seed {seeds}): {e}. {kept}.",
        e.training_state,
        e.env_state,
        e.seeds,
    )


def _stop_if_signalled(flag: dict, when: str) -> None:
    """Exits with status 130 when SIGINT or SIGTERM arrived after the last training
    chunk it could stop (during an evaluation, the logs, a checkpoint or the report):
    a signal is never dropped, so no caller (`run_variants`) goes on to other work."""
    if flag["signal"] is not None:
        print(
            f"\nInterrupted {when}. Resume by rerunning the same command.",
            file=sys.stderr,
        )
        raise SystemExit(130)


def run_variants(
    variants: dict[str, Experiment],
    *,
    logdir: str | os.PathLike,
    segments: int,
    steps_per_segment: int,
    seed: int,
    num_seeds: int = 1,
    resume: str = "auto",
    hparams: Any = None,
    keep_checkpoints: int = 2,
) -> dict[str, list[dict]]:
    """Runs each experiment under ``<logdir>/<name>`` (same budget, seeds and held-out
    sets), sharing compiled pieces between variants of the same env and settings,
    and prints one comparison line per variant (`keep_checkpoints`: as `run`'s)."""
    if not isinstance(variants, Mapping) or not variants:
        raise ValueError(
            f"run_variants takes a non-empty dict of name -> Experiment, got {variants!r}"
        )
    _check_keep(keep_checkpoints)
    for name, exp in variants.items():  # before any variant trains: a refused
        check_segment_length(exp, steps_per_segment)  # variant leaves the others as they were
        _check_seed(exp, seed, num_seeds)
        _check_run(
            exp, pathlib.Path(logdir) / name, hparams, num_seeds, seed, steps_per_segment,
            segments, resume, quiet=True,
        )  # fmt: skip
        for s in range(seed, seed + num_seeds):
            probe_fit_sets(exp, s)  # a probe with nothing to decode
    base = next(iter(variants.values()))
    seeds = [seed + k for k in range(num_seeds)]
    apart = [n for n, exp in variants.items() if not _same_held_out(exp, base, seeds)]
    results, shared = {}, []
    for name, exp in variants.items():
        print(f"\n== {name} ==")
        compiled = next((c for c in shared if c.fits(exp, num_seeds)), None)
        if compiled is None:
            compiled = compile_experiment(exp, num_seeds)
            shared.append(compiled)
        results[name] = run(
            exp,
            logdir=pathlib.Path(logdir) / name,
            segments=segments,
            steps_per_segment=steps_per_segment,
            seed=seed,
            num_seeds=num_seeds,
            resume=resume,
            hparams=hparams,
            compiled=compiled,
            table=False,
            keep_checkpoints=keep_checkpoints,
        )
    print_comparison(results, logdir, apart)
    return results


def _same_held_out(a: Experiment, b: Experiment, seeds: list[int]) -> bool:
    """Whether two variants' seeds draw the same held-out contexts (`held_out_sets`):
    the pairing of `difference(paired=True)` rests on it."""
    with contextlib.redirect_stderr(io.StringIO()):  # a skipped split is said by the run
        for seed in seeds:
            sa, sb = held_out_sets(a, seed), held_out_sets(b, seed)
            if sa.keys() != sb.keys():
                return False
            for split, x in sa.items():
                y = sb[split].values
                if x.values.keys() != y.keys() or not all(
                    np.array_equal(v, y[n]) for n, v in x.values.items()
                ):
                    return False
    return True


def _comparison(
    results: dict[str, list[dict]], apart: Sequence[str] = ()
) -> dict[str, dict[str, stats.Difference | list[stats.Difference]]] | None:
    """Each variant's last-segment scores minus the first variant's, per split and
    gap, paired by seed (`metarl.stats.difference`), and under "episodes" one per
    episode of a trial where both have an adaptation curve; None with one seed (no
    CI). Variants named in `apart` (held-out sets not the first one's) are left out."""
    (base, base_rows), *others = results.items()
    others = [(name, rows) for name, rows in others if name not in apart]
    last = base_rows[-1]
    if not isinstance(last.get("train_return"), list) or not others:
        return None
    cols = [c for c in list(_columns(1))[2:] if isinstance(last.get(c), list)]
    diffs = {
        name: {c: stats.difference(rows[-1][c], last[c], paired=True) for c in cols}
        for name, rows in others
    }
    for name, rows in others:  # the adaptation curve, episode by episode, where both have one
        mine, base_curve = rows[-1].get("episodes"), last.get("episodes")
        if mine is not None and base_curve is not None and len(mine) == len(base_curve):
            diffs[name]["episodes"] = [
                stats.difference(a, b, paired=True) for a, b in zip(mine, base_curve, strict=True)
            ]
    return diffs


# ---- tables ----
def _columns(num_seeds: int) -> dict[str, str]:
    cols = {"segment": "segment", "env_steps": "env steps", "train_return": "train return"}
    cols.update(
        {
            "train": "eval train",
            "interpolation": "eval interp",
            "extrapolation_low": "extrap low",
            "extrapolation_high": "extrap high",
            "generalization_gap": "gap",
        }
    )
    return cols


def _cell(value: Any) -> str:
    if isinstance(value, list):
        return stats.format_iqm(stats.summarize(np.asarray(value, float)))
    return f"{value:.1f}" if isinstance(value, float) else str(value)


def _cells(row: dict, num_seeds: int) -> list[str]:
    return [_cell(row.get(c, float("nan"))) for c in _columns(num_seeds)]


def _line(values, num_seeds: int = 1, width: int | None = None) -> str:
    # an IQM cell over seeds is as wide as "1234 [no CI: 3 seeds]" or "-123 [-456, 789]"
    width = width or (15 if num_seeds == 1 else 21)
    return " ".join(f"{v!s:>{width}}" for v in values)


def seconds_line(seconds: list[dict[str, float]], probe: bool = True) -> str:
    """Where the wall time of segments went: each stage's total (`RUNNER_STAGES`,
    the probe's only if `probe`) and its share of their sum."""
    totals = {s: sum(d[s] for d in seconds) for s in RUNNER_STAGES if probe or s != "probe"}
    whole = sum(totals.values())
    parts = ", ".join(
        f"{s} {t:.1f} s ({100 * t / whole if whole else 0:.0f}%)" for s, t in totals.items()
    )
    n = len(seconds)
    return f"Wall time of the {n} segment{'s' * (n != 1)} run here: {whole:.1f} s; {parts}"


def print_table(rows: list[dict], logdir: str | os.PathLike) -> None:
    """The per-segment table (IQM [95% CI] over seeds) and the dashboard command."""
    num_seeds = (
        len(rows[0]["train_return"]) if rows and isinstance(rows[0]["train_return"], list) else 1
    )
    print("\n" + _line(_columns(num_seeds).values(), num_seeds))
    for row in rows:
        print(_line(_cells(row, num_seeds), num_seeds))
    if "episodes" in rows[-1]:
        curve = _adaptation_curve(rows[-1]["episodes"])
        print(f"\n{curve[0].upper()}{curve[1:]}")
    if num_seeds > 1 and "train" in rows[-1]:
        finals = " ".join(f"{v:.1f}" for v in rows[-1]["train"])
        print(f"\nFinal eval train return per seed: {finals}")
    if cut := _nonfinite_note(rows[-1]):
        print(f"\n{cut}")
    for line in _probe_lines(rows):
        print(line)
    print(f"\nDashboard: tensorboard --logdir {logdir}")


def _probe_lines(rows: list[dict], name: str = "") -> list[str]:
    """A memory probe's history (`EvalConfig.probe`): R^2 and RMSE over a trial on
    each split by segment, then R^2 by episode of a trial in the last segment, IQM
    [95% CI] over seeds; nothing for a run without a probe."""
    if "probe" not in rows[-1]:
        return []
    probe = rows[-1]["probe"]
    num_seeds = len(rows[-1]["seeds"]) if isinstance(rows[-1].get("seeds"), list) else 1
    columns = _columns(1)
    splits = [s for s in columns if probe_tag(s, "r2") in probe]

    def cell(value):
        value = value if isinstance(value, list) else [value]
        return stats.format_iqm(stats.summarize(np.asarray(value, float)), 2)

    table = [["", "segment", "env steps", *(columns[s] for s in splits)]]
    for what in ("r2", "rmse"):
        for row in rows:
            cells = [cell(row["probe"][probe_tag(s, what)]) for s in splits]
            table.append(
                ["R^2" if what == "r2" else "RMSE", row["segment"], row["env_steps"], *cells]
            )
    # its cells have 2 decimals ("-1.15 [no CI: 2 seeds]"): the columns as wide as the
    # widest (the main table's 15 and 21 characters overflowed with 1 to 3 seeds)
    width = max(len(str(v)) for line in table for v in line)
    out = [
        f"\n{name + ' ' if name else ''}memory probe (out-of-sample R^2 over a trial and "
        "RMSE in the context's units, per held-out split; IQM [95% CI] over seeds):",
        *(_line(line, num_seeds, width) for line in table),
    ]
    episodes = [e for e in range(1, len(probe)) if probe_tag(splits[0], "r2", e) in probe]
    for s in splits if episodes else ():
        curve = "  ".join(f"{e}: {cell(probe[probe_tag(s, 'r2', e)])}" for e in episodes)
        out.append(f"R^2 on {columns[s]} by episode i of a trial, last segment: {curve}")
    return out


def _adaptation_curve(episodes: list) -> str:
    """The return of each episode of a trial (eval train) and, over several seeds,
    each later episode's paired difference from the first: what the trial's earlier
    episodes taught the agent (`stats.difference(paired=True)`: seed by seed)."""
    curve = "  ".join(f"{i}: {_cell(v)}" for i, v in enumerate(episodes, 1))
    text = f"adaptation curve (eval train, return of episode i of a trial): {curve}"
    if isinstance(episodes[0], list) and len(episodes) > 1:
        gains = [stats.difference(v, episodes[0], paired=True) for v in episodes[1:]]
        text += f"; episode i minus episode 1, paired by seed: {_numbered(gains, 2)}"
    return text


def _numbered(diffs: list[stats.Difference], first: int) -> str:
    """``"1: +3 [1, 5]  2: ..."``: differences per episode, numbered from `first`."""
    return "  ".join(f"{i}: {stats.format_difference(d)}" for i, d in enumerate(diffs, first))


def _nonfinite_note(row: dict) -> str:
    """A line naming the held-out episodes the last evaluation cut for non-finite
    physics (their returns count up to the cut), or "" if there were none."""
    counts = {split: int(np.sum(n)) for split, n in row.get("nonfinite_episodes", {}).items()}
    if not any(counts.values()):
        return ""
    listed = ", ".join(f"{split} {n}" for split, n in counts.items() if n)
    return (
        f"Held-out episodes cut by non-finite physics (NaN/inf; each returns what it "
        f"earned until the cut), over all seeds: {listed}"
    )


def print_comparison(
    results: dict[str, list[dict]], logdir: str | os.PathLike, apart: Sequence[str] = ()
) -> None:
    """One line per variant: its last segment's returns on every split; with
    several seeds, then each variant's difference from the first one, paired by
    seed (episode by episode too, for an adaptation curve), except for the
    variants in `apart`, whose held-out sets are not the first one's, those whose
    rows record other seeds than the first one's, and those whose last row is at
    another segment or env step."""
    cols = list(_columns(1))[2:]
    first = next(iter(results.values()))[-1].get("train_return")
    num_seeds = len(first) if isinstance(first, list) else 1
    print("\n" + _line(["variant", *[_columns(1)[c] for c in cols]], num_seeds))
    for name, rows in results.items():
        print(_line([name, *(_cell(rows[-1].get(c, float("nan"))) for c in cols)], num_seeds))
    base = next(iter(results))
    if apart:
        print(
            f"\nNot compared with {base}: {', '.join(apart)}: their held-out sets are not "
            f"{base}'s (another target, env or eval settings), so a seed's scores are not "
            "on the same contexts"
        )
    seeds = {name: rows[-1].get("seeds") for name, rows in results.items()}
    known = [n for n in results if n not in apart and None not in (seeds[n], seeds[base])]
    if other := [n for n in known if seeds[n] != seeds[base]]:
        print(
            f"\nNot compared with {base} (seeds {seeds[base]}): "
            + ", ".join(f"{n} (seeds {seeds[n]})" for n in other)
            + ": a difference pairs seed i of one variant with seed i of the other; run "
            "them with the same seeds (run_variants does)"
        )
    length = {
        name: (rows[-1].get("segment"), rows[-1].get("env_steps")) for name, rows in results.items()
    }
    if shorter := [n for n in results if n not in [*apart, *other] and length[n] != length[base]]:
        said = lambda n: f"segment {length[n][0]}, {length[n][1]} env steps"  # noqa: E731
        print(
            f"\nNot compared with {base} ({said(base)}): "
            + ", ".join(f"{n} ({said(n)})" for n in shorter)
            + ": their last rows come after other amounts of training; run every variant "
            "for the same segments and steps per segment"
        )
    apart = [*apart, *other, *shorter]
    if len(results) > 1 and not isinstance(results[base][-1].get("train_return"), list):
        print(
            "\nNo differences between variants: one seed each gives no interval (run 2 or "
            "more seeds: num_seeds, --num-seeds on the command line)"
        )
    if (diffs := _comparison(results, apart)) is not None:
        print(
            f"\nDifference from {base} (mean over seeds, paired by seed: seed i of every "
            "variant draws the same held-out sets and evaluation keys, and starts from the "
            "same parameters where the networks are alike; 95% t interval; an interval "
            "without 0 is a difference):"
        )
        shown = [c for c in cols if c in next(iter(diffs.values()))]
        print(_line(["variant", *[_columns(1)[c] for c in shown]], num_seeds))
        for name, cells in diffs.items():
            print(_line([name, *(stats.format_difference(cells[c]) for c in shown)], num_seeds))
        for name, cells in diffs.items():
            if "episodes" in cells:
                curve = _numbered(cells["episodes"], 1)
                print(f"{name} minus {base}, eval train by episode i of a trial: {curve}")
    for name, rows in results.items():
        if "episodes" in rows[-1]:
            print(f"{name} {_adaptation_curve(rows[-1]['episodes'])}")
        if cut := _nonfinite_note(rows[-1]):
            print(f"{name}: {cut}")
    for name, rows in results.items():
        for line in _probe_lines(rows, name):
            print(line)
    print(f"\nDashboard: tensorboard --logdir {logdir}")


__all__ = [
    "Compiled",
    "EvalConfig",
    "Experiment",
    "Run",
    "RunArgs",
    "analysis_key",
    "check_identity",
    "check_loadable",
    "compile_experiment",
    "held_out_sets",
    "print_comparison",
    "print_table",
    "probe_fit_sets",
    "run",
    "run_variants",
]
