"""TensorBoard logging for training runs, with one tag scheme that dashboards rely on.

Tags (``step`` is always the environment-step count):

* ``train/return``: mean training episode return of a segment; ``train/<name>``: any
  other scalar training metric (losses, ...); ``perf/env_steps_per_sec``: throughput
  (compilation left out), ``perf/compile_seconds``: time spent compiling in the segment;
  ``perf/<stage>_seconds``: the experiment runner's wall time in each stage of a
  segment (`RUNNER_STAGES`: train, eval, probe, log, checkpoint), all seeds together.
* ``curriculum/<context>/low`` and ``/high``: current range of each context dimension
  (the min of ``low`` and the max of ``high`` over elements and envs).
* ``context/<context>``: histogram of the sampled contexts.
* ``eval/<split>/return`` and ``eval/<split>/return_std`` (the spread over the
  split's contexts of their mean returns), splits ``train``,
  ``interpolation``, ``extrapolation``, ``extrapolation_low``, ``extrapolation_high``
  (others allowed); ``eval/generalization_gap`` (train minus the worse extrapolation
  side); ``eval/interpolation_gap`` (train minus interpolation);
  ``eval/<split>/episode_<i>/return``: mean return of the i-th episode of a
  trial (i = 1..k), the adaptation curve of an agent that learns within a trial;
  ``eval/<split>/nonfinite_episodes``: its episodes cut because the physics went
  NaN or inf (their returns count up to the cut; the aggregate sums the seeds).
* ``probe/<split>/r2`` and ``probe/<split>/rmse``, with ``probe/<split>/episode_<i>/r2``
  and ``.../rmse`` per episode of a trial: what a linear probe decodes of the hidden
  context from a recurrent agent's memory on a held-out split (`metarl.probe`;
  logged where ``EvalConfig.probe`` asks for it).
* ``eval/heatmap``: image of the mean return over a 2-D context grid, every cell
  labelled, the ranges trained on in that segment outlined; logged at every segment.
* With several seeds, ``<logdir>/seed_<s>`` holds each seed's run and
  ``<logdir>/aggregate`` the ``<tag>`` mean, ``<tag>/iqm``, the IQM's 95% CI
  ``<tag>/iqm_ci_low`` and ``<tag>/iqm_ci_high`` over the seeds with a finite score
  (NaN below `metarl.stats.MIN_SEEDS_FOR_CI` such seeds),
  and ``<tag>/nonfinite_seeds`` (the seeds left out), for every eval return, gap
  and adaptation-curve point (see `metarl.stats`); ``return_std``, a spread within
  one seed, is per seed only.
* ``hparams/<metric>``: final metrics shown with the hyperparameters (HParams dashboard),
  in an event file of their own that a later report replaces.

NaN and inf values are written as they are (TensorBoard marks such points), so a
diverged loss, or a segment in which no episode finished (its ``train/return`` is
NaN), shows where it happened instead of leaving a silent gap.

Characters TensorBoard does not allow in tags (all but letters, digits, ``_ - . /``)
become ``_`` as in tensorboardX (``geom_friction[:, 0]`` -> ``context/geom_friction____0_``);
the module-level functions return the exact stored tags. A custom-scalars layout (one
dashboard) shows train vs held-out returns in one chart, the generalization and
interpolation gaps in another, the runner's wall time by stage in a third, one
chart per curriculum range (low and high) and, for a run that probes its memory,
the probe's R^2 on every split in one chart.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import numbers
import os
import pathlib
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from tensorboardX import FileWriter, SummaryWriter
from tensorboardX.summary import hparams as _hparams_summaries
from tensorboardX.summary import scalar as _scalar_summary

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from metarl.contexts import ContextSpace

TRAIN_RETURN = "train/return"
ENV_STEPS_PER_SEC = "perf/env_steps_per_sec"
# run_train's timings of the whole compiled program (every seed): logged under perf/ only
PROGRAM_TIMINGS = ("env_steps_per_sec", "compile_seconds")
COMPILE_SECONDS = "perf/compile_seconds"
# The stages of a segment of the experiment runner, timed as `perf/<stage>_seconds`:
# run_train (compilation included), held-out evaluation (with the heatmap's grid),
# the memory probe, writing TensorBoard's events and history.json, the checkpoint
RUNNER_STAGES = ("train", "eval", "probe", "log", "checkpoint")
GENERALIZATION_GAP = "eval/generalization_gap"
INTERPOLATION_GAP = "eval/interpolation_gap"
HEATMAP = "eval/heatmap"
HEATMAP_SIZE = (640, 480)  # (width, height) of the heatmap image in pixels
HPARAMS_SUFFIX = ".hparams"  # the end of the name of the event file `log_hparams` writes
_INVALID = re.compile(r"[^-/\w\.]")


def clean_tag(tag: str) -> str:
    """The tag as TensorBoard stores it (invalid characters -> ``_``, no leading ``/``)."""
    return _INVALID.sub("_", tag).lstrip("/")


def train_tag(name: str) -> str:
    """Tag of a training metric; ``episode_return`` maps to ``train/return``."""
    return TRAIN_RETURN if name == "episode_return" else clean_tag(f"train/{name}")


def range_tags(name: str) -> tuple[str, str]:
    """(low, high) tags of a context dimension's curriculum range."""
    return clean_tag(f"curriculum/{name}/low"), clean_tag(f"curriculum/{name}/high")


def context_tag(name: str) -> str:
    """Histogram tag of a context dimension's sampled values."""
    return clean_tag(f"context/{name}")


def eval_return_tag(split: str, std: bool = False) -> str:
    """Mean evaluation return on a split (its standard deviation if `std`)."""
    return clean_tag(f"eval/{split}/return" + ("_std" if std else ""))


def nonfinite_tag(split: str) -> str:
    """Episodes of a split cut because the physics went non-finite (NaN or inf)."""
    return clean_tag(f"eval/{split}/nonfinite_episodes")


def episode_return_tag(split: str, episode: int) -> str:
    """Mean return of the `episode`-th episode (1-based) of a trial on a split."""
    return clean_tag(f"eval/{split}/episode_{episode}/return")


def probe_tag(split: str, what: str, episode: int | None = None) -> str:
    """A memory probe's `what` ("r2", "rmse") on a split, over a whole trial or on its
    `episode`-th episode (1-based)."""
    within = "" if episode is None else f"episode_{episode}/"
    return clean_tag(f"probe/{split}/{within}{what}")


def stage_seconds_tag(stage: str) -> str:
    """The experiment runner's wall time in one stage of a segment (`RUNNER_STAGES`)."""
    if stage not in RUNNER_STAGES:
        raise ValueError(f"unknown runner stage {stage!r}; valid: {', '.join(RUNNER_STAGES)}")
    return f"perf/{stage}_seconds"


def hparam_metric_tag(name: str) -> str:
    """Scalar tag under which a final metric of `log_hparams` is stored."""
    return clean_tag(f"hparams/{name}")


def _scalar(value: Any) -> float | None:
    """A float (NaN and inf included), or None for arrays and non-numbers."""
    if np.ndim(value) != 0:
        return None
    try:
        return float(np.asarray(value))
    except (TypeError, ValueError):
        return None


def _required_scalar(tag: str, value: Any) -> float:
    """`_scalar`, refusing what is not one number (an array, even of shape [1], a
    string, None) with a TypeError naming the tag, rather than leaving a gap in the
    chart that looks like a value nobody computed."""
    number = None if isinstance(value, str | bytes) else _scalar(value)
    if number is None:
        raise TypeError(
            f"{tag}: a scalar number is needed, got {type(value).__name__} of shape "
            f"{np.shape(value)}: {value!r}"
        )
    return number


def _by_element(values: np.ndarray, shape: tuple[int, ...]) -> np.ndarray | None:
    """`values` [..., *shape] as [rows, elements] (flat element index); None where they
    do not end in the element shape."""
    shape = tuple(shape)
    if not shape or values.shape[values.ndim - len(shape) :] != shape:
        return None
    return values.reshape(-1, math.prod(shape))


def _step(step: Any) -> int:
    """A step as an int; refuses a fraction or a non-number, which int() would cut."""
    if isinstance(step, bool) or not isinstance(step, numbers.Integral | np.integer):
        if not (isinstance(step, float | np.floating) and float(step).is_integer()):
            raise TypeError(f"a step must be a whole number, got {step!r}")
    if step < 0:
        raise ValueError(f"a step must be >= 0, got {step!r}")
    return int(step)


def context_units(space: ContextSpace) -> dict[str, str]:
    """Units of each name of `space`: "x default" if relative, a quantity's units (an
    element's, e.g. ``mass[torso]``, are its quantity's), or ""."""
    from metarl.contexts.quantities import QUANTITIES

    return {
        n: "x default" if d.relative else getattr(QUANTITIES.get(n.split("[")[0]), "units", "")
        for n, d in space.items()
    }


def _items(config: Any) -> list[tuple[str, Any]] | None:
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return [(f.name, getattr(config, f.name)) for f in dataclasses.fields(config)]
    return list(config.items()) if isinstance(config, Mapping) else None


def flatten_hparams(config: Any, prefix: str = "") -> dict[str, str | int | float | bool]:
    """Nested dataclasses/mappings -> {dotted key: bool|int|float|str}; other values -> str."""
    if (items := _items(config)) is None:
        raise TypeError(f"hparams must be a mapping or a dataclass instance, got {config!r}")
    out: dict[str, str | int | float | bool] = {}
    for key, value in items:
        if _items(value) is not None:
            out.update(flatten_hparams(value, f"{prefix}{key}."))
            continue
        if isinstance(value, (np.generic, np.ndarray)) and np.ndim(value) == 0:
            value = value.item()
        out[f"{prefix}{key}"] = value if isinstance(value, (bool, int, float, str)) else str(value)
    return out


def heatmap_figure(
    x_label: str,
    x_values,
    y_label: str,
    y_values,
    returns_2d,
    train_box: tuple[float, float, float, float] | None = None,
    log_axes: tuple[bool, bool] | None = None,
) -> Figure:
    """A figure of `returns_2d` [len(y), len(x)]: every cell labelled with its return,
    axes in the grid's values, a colorbar, and the training region
    ``train_box = (x_low, x_high, y_low, y_high)`` outlined in white. `log_axes`
    (x, y): whether an axis's grid is geometric (a LogUniform's), which places the
    box edges between grid points; None guesses it from the values (constant
    ratios over 3 points or more)."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    x, y = np.asarray(x_values, float).ravel(), np.asarray(y_values, float).ravel()
    if (z := np.asarray(returns_2d, float)).shape != (y.size, x.size):
        raise ValueError(
            f"returns_2d must have shape [len(y_values), len(x_values)] = "
            f"{(y.size, x.size)}, got {z.shape}"
        )
    fig = Figure(figsize=[n / 100 for n in HEATMAP_SIZE], dpi=100, layout="constrained")
    ax = fig.add_subplot()
    im = ax.imshow(np.ma.masked_invalid(z), origin="lower", aspect="auto", cmap="viridis")
    for axis, values in ((ax.xaxis, x), (ax.yaxis, y)):  # at most ~10 ticks, grid values
        idx = np.arange(0, values.size, max(1, math.ceil(values.size / 10)))
        axis.set_ticks(idx, [f"{v:.3g}" for v in values[idx]])
    finite = z[np.isfinite(z)]
    middle = (finite.min() + finite.max()) / 2 if finite.size else 0.0
    for (i, j), value in np.ndenumerate(z):
        # a non-finite cell is masked (the axes' white shows): its label in red, as it is
        text = f"{value:.0f}" if np.isfinite(value) else str(value)
        color = "red" if not np.isfinite(value) else "white" if value <= middle else "black"
        ax.text(j, i, text, ha="center", va="center", fontsize=9, color=color)
    if train_box is not None:
        log_x, log_y = (None, None) if log_axes is None else log_axes
        corners = [_grid_position(x, train_box[0], log_x), _grid_position(x, train_box[1], log_x)]
        rows = [_grid_position(y, train_box[2], log_y), _grid_position(y, train_box[3], log_y)]
        if y.size == 1:
            rows = [-0.5, 0.5]
        ax.add_patch(
            Rectangle(
                (corners[0], rows[0]),
                corners[1] - corners[0],
                rows[1] - rows[0],
                fill=False,
                edgecolor="white",
                linewidth=2.5,
                linestyle="--",
                label="training ranges",
            )
        )
        ax.legend(loc="upper right", fontsize=8, framealpha=0.6)
    ax.set(xlabel=x_label, ylabel=y_label)
    fig.colorbar(im, ax=ax, label="mean return")
    return fig


def _grid_position(values: np.ndarray, v: float, log: bool | None = None) -> float:
    """Where value `v` lies in image coordinates of a grid axis (cell i is centred at i);
    `log`: whether the grid is geometric (None: guessed from the values)."""
    if values.size == 1:
        return 0.0
    if log is None:  # geometric: constant ratios over at least 3 points (two fit both)
        ratios = values[1:] / values[:-1] if values.size > 2 and np.all(values > 0) else None
        log = bool(
            ratios is not None and np.allclose(ratios, ratios[0]) and not np.isclose(ratios[0], 1)
        )
    if log:
        values, v = np.log(values), math.log(v) if v > 0 else -math.inf
    return float(np.interp(v, values, np.arange(values.size), left=-0.5, right=values.size - 0.5))


class RunLogger:
    """Writes one run's TensorBoard events under `logdir` with the module's tag scheme.

    `context_names` fixes the curriculum charts of the custom-scalars layout, written once
    here. `units` maps context names to units for the heatmap's axis labels; names missing
    from it take their units from `log_ranges` (see `context_units`). A context manager."""

    def __init__(
        self,
        logdir: str | os.PathLike,
        context_names: Sequence[str],
        units: Mapping[str, str] | None = None,
        purge_step: int | None = None,
        probe: bool = False,
    ):
        """`purge_step`: when resuming a run, events at or after this step that an
        interrupted run left behind are hidden from TensorBoard. `probe`: the run logs
        a memory probe (``probe/`` tags), charted in the layout."""
        if isinstance(context_names, str):
            raise TypeError("context_names must be a sequence of names, not one string")
        self.logdir = os.fspath(logdir)
        self.context_names = tuple(context_names)
        self.units = dict(units or {})
        self.probe = probe
        # tensorboardX names a file by the second it opens (events.out.tfevents.<s>.<host>)
        # and truncates a file of that name: a resumed run opening within the same second
        # would erase the run's earlier events. The suffix makes the name unique and keeps
        # files of one second in the order they were opened, which is the order TensorBoard
        # reads them (so the resumed file's purge marker comes after the events it hides).
        suffix = f".{time.time_ns():020d}.{os.getpid()}"
        self._writer = SummaryWriter(
            logdir=self.logdir, purge_step=purge_step, filename_suffix=suffix
        )
        self._last_step = 0
        self._writer.add_custom_scalars(self.layout())

    def layout(self) -> dict[str, dict[str, list]]:
        """The custom-scalars layout; chart tags are regexes, anchored for TB's re.match."""
        return {
            "metarl": {
                "return: train vs held-out": [
                    "Multiline",
                    [TRAIN_RETURN + "$", r"eval/[^/]+/return$"],
                ],
                "generalization gap": [
                    "Multiline",
                    [GENERALIZATION_GAP + "$", INTERPOLATION_GAP + "$"],
                ],
                "wall time per segment, by stage": [
                    "Multiline",
                    [rf"perf/({'|'.join(RUNNER_STAGES)})_seconds$"],
                ],
                **(
                    {"memory probe: R^2 per split": ["Multiline", [r"probe/[^/]+/r2$"]]}
                    if self.probe
                    else {}
                ),
                **{
                    f"curriculum: {n}": ["Multiline", [re.escape(t) + "$" for t in range_tags(n)]]
                    for n in self.context_names
                },
            }
        }

    def _add(self, tag: str, value: Any, step: int) -> None:
        """Writes one scalar; a value that is not one number raises TypeError. NaN is
        written without tensorboardX's warning: metarl logs it on purpose (no CI below
        4 seeds, no return where no episode ended) and counts non-finite episodes
        itself; 2 seeds of a short run printed the warning 176 times."""
        value = _required_scalar(tag, value)
        self._last_step = max(self._last_step, _step(step))
        with _nan_quiet():
            self._writer.add_scalar(tag, value, int(step))

    def log_train(
        self,
        step: int,
        metrics: Mapping[str, Any],
        env_steps_per_sec: float | None = None,
        compile_seconds: float | None = None,
    ) -> None:
        """``metrics["episode_return"]`` -> train/return, scalar ``k`` -> train/k (arrays
        skipped; NaN and inf are written, TensorBoard marks them); throughput ->
        perf/env_steps_per_sec; time spent compiling in the segment -> perf/compile_seconds.
        `run_train`'s own timings in `metrics` are not written under train/: they are
        the whole program's (all seeds together), which the caller passes, per run, as
        the two arguments."""
        for name, value in metrics.items():
            if name not in PROGRAM_TIMINGS and _scalar(value) is not None:
                self._add(train_tag(name), value, step)
        if env_steps_per_sec is not None:
            self._add(ENV_STEPS_PER_SEC, env_steps_per_sec, step)
        if compile_seconds is not None:
            self._add(COMPILE_SECONDS, compile_seconds, step)

    def log_ranges(
        self, step: int, ranges: ContextSpace, apart: Mapping[str, tuple[int, ...]] | None = None
    ) -> None:
        """curriculum/<name>/low and /high for every name of `ranges` (min low, max high:
        the envelope over elements and per-env rows). `apart`: {name: element shape} of
        per-element entries whose elements train on intervals of their own (the envelope
        of Scale(0.5, [1, 4]) is no element's); each element i (flat index) also gets
        curriculum/<name>/<i>/low and /high."""
        self.units = {**context_units(ranges), **self.units}
        for name, (low, high) in ranges.intervals().items():
            low_tag, high_tag = range_tags(name)
            self._add(low_tag, np.min(low), step)  # intervals() are finite
            self._add(high_tag, np.max(high), step)
            low, high = np.broadcast_arrays(np.asarray(low, float), np.asarray(high, float))
            if name in (apart or {}) and (rows := _by_element(low, apart[name])) is not None:
                for i, (lo, hi) in enumerate(
                    zip(rows.min(0), _by_element(high, apart[name]).max(0))
                ):
                    low_tag, high_tag = range_tags(f"{name}/{i}")
                    self._add(low_tag, lo, step)
                    self._add(high_tag, hi, step)

    def log_contexts(
        self,
        step: int,
        contexts: Mapping[str, Any],
        apart: Mapping[str, tuple[int, ...]] | None = None,
    ) -> None:
        """A histogram context/<name> of each array of sampled values (any shape: all
        its elements in one). `apart` as in `log_ranges`: each element i of those names
        also gets its own histogram, context/<name>/<i>."""
        for name, values in contexts.items():
            values = np.asarray(values, float)
            rows = _by_element(values, apart[name]) if name in (apart or {}) else None
            columns = [] if rows is None else [(f"{name}/{i}", c) for i, c in enumerate(rows.T)]
            for tag, v in [(name, values.ravel()), *columns]:
                if (v := v[np.isfinite(v)]).size:
                    self._last_step = max(self._last_step, _step(step))
                    self._writer.add_histogram(context_tag(tag), v, int(step))

    def log_eval(
        self,
        step: int,
        returns: Mapping[str, float],
        gap: float | None = None,
        stds: Mapping[str, float] | None = None,
        by_episode: Mapping[str, Sequence[float]] | None = None,
        interpolation_gap: float | None = None,
        nonfinite: Mapping[str, int] | None = None,
    ) -> None:
        """eval/<split>/return (and return_std) per split, eval/generalization_gap
        (`gap`), eval/interpolation_gap, eval/<split>/episode_<i>/return for
        `by_episode[split][i - 1]` (trials of several episodes), and
        eval/<split>/nonfinite_episodes (`nonfinite`: episodes cut for NaN/inf physics).
        Every value is one number (NaN and inf are written); any other raises TypeError."""
        for split, value in returns.items():
            self._add(eval_return_tag(split), value, step)
        for split, value in (nonfinite or {}).items():
            self._add(nonfinite_tag(split), value, step)
        for split, value in (stds or {}).items():
            self._add(eval_return_tag(split, std=True), value, step)
        for split, values in (by_episode or {}).items():
            for i, value in enumerate(values, 1):
                self._add(episode_return_tag(split, i), value, step)
        if gap is not None:
            self._add(GENERALIZATION_GAP, gap, step)
        if interpolation_gap is not None:
            self._add(INTERPOLATION_GAP, interpolation_gap, step)

    def log_heatmap(
        self,
        step: int,
        x_name: str,
        x_values,
        y_name: str,
        y_values,
        returns_2d,
        train_box: tuple[float, float, float, float] | None = None,
        log_axes: tuple[bool, bool] | None = None,
    ) -> None:
        """eval/heatmap: mean return over a grid, `returns_2d` of shape [len(y), len(x)];
        axes labelled ``name [units]``, cells labelled, the training region
        `train_box` (x_low, x_high, y_low, y_high) outlined (`log_axes`: see
        `heatmap_figure`); rendered with the Agg backend (no pyplot state)."""
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        x_label, y_label = (
            f"{n} [{self.units[n]}]" if self.units.get(n) else n for n in (x_name, y_name)
        )
        figure = heatmap_figure(
            x_label, x_values, y_label, y_values, returns_2d, train_box, log_axes
        )
        canvas = FigureCanvasAgg(figure)
        canvas.draw()
        rgb = np.asarray(canvas.buffer_rgba())[..., :3]
        self._last_step = max(self._last_step, _step(step))
        self._writer.add_image(HEATMAP, rgb, int(step), dataformats="HWC")

    def log_hparams(
        self, hparams: Any, metrics: Mapping[str, float], step: int | None = None
    ) -> None:
        """The run's hyperparameters (mapping or dataclass, flattened) with final metrics,
        stored as hparams/<metric> at `step` (default: the last step logged), for the
        HParams dashboard.

        They go to an event file of their own (name ending in `HPARAMS_SUFFIX`) that
        replaces the one an earlier call wrote in this logdir: a run extended after
        it finished shows one HParams session, its last, as a run that never stopped
        does (a purge marker cannot hide the earlier one, which sits at a step the
        extended run keeps)."""
        step = self._last_step if step is None else _step(step)
        tags = {hparam_metric_tag(k): _required_scalar(k, v) for k, v in metrics.items()}
        earlier = sorted(pathlib.Path(self.logdir).glob(f"events.out.tfevents.*{HPARAMS_SUFFIX}"))
        suffix = f".{time.time_ns():020d}.{os.getpid()}{HPARAMS_SUFFIX}"
        writer = FileWriter(self.logdir, filename_suffix=suffix)
        with _nan_quiet():  # a final metric may be NaN on purpose, as in `_add`
            for summary in _hparams_summaries(flatten_hparams(hparams), tags):
                writer.add_summary(summary, step)
            for tag, value in tags.items():
                writer.add_summary(_scalar_summary(tag, value), step)
        writer.close()
        for f in pathlib.Path(self.logdir).glob(f"events.out.tfevents.*{suffix}"):
            with open(f, "rb") as written:  # durable before the earlier file goes
                os.fsync(written.fileno())
        for f in earlier:
            f.unlink()

    def log_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
        """Scalars under the given tags (cleaned); NaN and inf are written as they are,
        a value that is not one number (an array, even of shape [1]) raises TypeError."""
        for tag, value in scalars.items():
            self._add(clean_tag(tag), value, step)

    def flush(self) -> None:
        """Writes every pending event to disk before returning; the run keeps one
        event file (durable: a run killed right after keeps them)."""
        _drain(self._writer)

    def close(self) -> None:
        """Flushes and closes the event file."""
        self._writer.close()

    def __enter__(self) -> RunLogger:
        """The logger itself; it is closed on exit."""
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_X2NUM = logging.getLogger("tensorboardX.x2num")


def _quiet_nan(record: logging.LogRecord) -> bool:
    return "NaN or Inf found" not in record.getMessage()


@contextlib.contextmanager
def _nan_quiet() -> Iterator[None]:
    """Within it, tensorboardX does not warn of the NaN and inf values metarl writes
    on purpose."""
    _X2NUM.addFilter(_quiet_nan)
    try:
        yield
    finally:
        _X2NUM.removeFilter(_quiet_nan)


def _drain(writer: SummaryWriter) -> None:
    """Blocks until every event queued in `writer` is in its event file.

    tensorboardX writes from a background thread and its own flush only flushes
    what that thread has already written, and offers no public way to wait for
    the queue; closing would end the event file. So this stops the thread
    (it drains the queue first), flushes the file and starts a new thread on
    the same file: the one place metarl reaches into tensorboardX's internals.
    """
    from tensorboardX.event_file_writer import _EventLoggerThread

    events = writer.file_writer.event_writer
    if events._closed:
        return
    events._worker.stop()
    events._ev_writer.flush()
    events._worker = _EventLoggerThread(events._event_queue, events._ev_writer, events._flush_secs)
    events._worker.start()


def read_scalars(logdir: str | os.PathLike) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of the run in `logdir`, {tag: [(step, value), ...]} in write order,
    read with TensorBoard's own EventAccumulator keeping every event."""
    from tensorboard.backend.event_processing import event_accumulator as ea

    acc = ea.EventAccumulator(os.fspath(logdir), size_guidance={ea.SCALARS: 0}).Reload()
    return {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()[ea.SCALARS]}


def logged_steps(logdir: str | os.PathLike) -> set[int]:
    """The env steps other than 0 at which the event files directly in `logdir` hold a
    summary (a run logs one such step a segment; 0 holds the custom-scalar layout),
    read with TensorBoard's own loader, the points a purge dropped included."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    return {
        event.step
        for f in sorted(pathlib.Path(logdir).glob("events.out.tfevents.*"))
        for event in EventFileLoader(os.fspath(f)).Load()
        if event.step and event.HasField("summary")
    }
