"""metarl.tensorboard: a run written with RunLogger, read back with TensorBoard's reader."""

import dataclasses
import io
import re

import jax
import numpy as np
import pytest
from PIL import Image
from tensorboard.backend.event_processing import event_accumulator as ea
from tensorboard.plugins.custom_scalar import layout_pb2
from tensorboard.plugins.hparams import plugin_data_pb2

from metarl import contexts as C  # noqa: N812
from metarl import tensorboard as L  # noqa: N812

SPACE = C.ContextSpace(
    {"gravity": C.Uniform(5.0, 15.0), "mass": C.Scale(0.5, 1.5, per_element=True)}
)
WIDER = C.ContextSpace(  # per-element ranges: logged as min(low), max(high)
    {
        "gravity": C.Uniform(4.0, 16.0),
        "mass": C.Scale([0.4, 0.7, 0.3], [1.2, 1.9, 1.5], per_element=True),
    }
)
GRID_X, GRID_Y = np.linspace(5.0, 15.0, 5), np.linspace(0.5, 1.5, 4)


@dataclasses.dataclass
class PPOConfig:
    lr: float = 3e-4
    hidden: tuple = (64, 64)


@dataclasses.dataclass
class Config:
    seed: int = 0
    env: str = "ant"
    normalise: bool = True
    schedule: object = None
    ppo: PPOConfig = dataclasses.field(default_factory=PPOConfig)


def _accumulator(logdir):
    acc = ea.EventAccumulator(
        str(logdir),
        size_guidance={ea.SCALARS: 0, ea.HISTOGRAMS: 0, ea.IMAGES: 0, ea.TENSORS: 0},
    )
    acc.Reload()
    return acc


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    logdir = tmp_path_factory.mktemp("run")
    contexts = {"gravity": np.array([5.5, 9.8, 14.0, 7.25]), "mass": np.full((4, 3), 1.25)}
    returns_2d = np.add.outer(GRID_Y, GRID_X)
    figures = []

    def spy(*args):  # keeps the figure log_heatmap renders, to inspect its labels
        figures.append(real_heatmap_figure(*args))
        return figures[-1]

    real_heatmap_figure = L.heatmap_figure
    with (
        pytest.MonkeyPatch.context() as mp,
        L.RunLogger(logdir, ["gravity", "mass"], units={"gravity": "m/s^2"}) as log,
    ):
        mp.setattr(L, "heatmap_figure", spy)
        log.log_train(
            1000,
            {
                "episode_return": 12.5,
                "policy_loss": 0.25,
                "per_env": np.ones(4),
                "nan_loss": float("nan"),
                # run_train's timings of the whole program: perf/ takes this run's share
                "env_steps_per_sec": 4096.0,
                "compile_seconds": 3.0,
            },
            2048.0,
        )
        log.log_train(2000, {"episode_return": 20.0, "policy_loss": 0.125})
        log.log_ranges(1000, SPACE)
        log.log_ranges(2000, WIDER)
        log.log_contexts(2000, contexts)
        log.log_eval(
            2000,
            {"train": 30.0, "interpolation": 25.0, "extrapolation": 10.0},
            gap=5.0,
            interpolation_gap=5.5,
            stds={"train": 1.5, "interpolation": 2.5, "extrapolation": 3.5},
        )
        log.log_heatmap(2000, "gravity", GRID_X, "mass", GRID_Y, returns_2d)
        log.log_train(3000, {"episode_return": 22.0})
        log.log_hparams(Config(), {"eval/interpolation/return": 25.0, "zero": 0, "bad": np.nan})
        units = dict(log.units)
    return logdir, _accumulator(logdir), contexts, units, figures


def test_scalars_values_and_steps(run):
    logdir, *_ = run
    got = L.read_scalars(logdir)
    expected = {
        "train/return": [(1000, 12.5), (2000, 20.0), (3000, 22.0)],
        "train/policy_loss": [(1000, 0.25), (2000, 0.125)],
        "train/nan_loss": [(1000, float("nan"))],  # written: a diverged loss shows
        "perf/env_steps_per_sec": [(1000, 2048.0)],
        "curriculum/gravity/low": [(1000, 5.0), (2000, 4.0)],
        "curriculum/gravity/high": [(1000, 15.0), (2000, 16.0)],
        "curriculum/mass/low": [(1000, 0.5), (2000, 0.3)],
        "curriculum/mass/high": [(1000, 1.5), (2000, 1.9)],
        "eval/train/return": [(2000, 30.0)],
        "eval/interpolation/return": [(2000, 25.0)],
        "eval/extrapolation/return": [(2000, 10.0)],
        "eval/train/return_std": [(2000, 1.5)],
        "eval/interpolation/return_std": [(2000, 2.5)],
        "eval/extrapolation/return_std": [(2000, 3.5)],
        "eval/generalization_gap": [(2000, 5.0)],
        "eval/interpolation_gap": [(2000, 5.5)],
        "hparams/eval/interpolation/return": [(3000, 25.0)],  # at the last step
        "hparams/zero": [(3000, 0.0)],
        "hparams/bad": [(3000, float("nan"))],
    }
    assert set(got) == set(expected)  # arrays and the program's timings are not logged
    for tag, points in expected.items():
        assert [s for s, _ in got[tag]] == [s for s, _ in points], tag
        np.testing.assert_allclose([v for _, v in got[tag]], [v for _, v in points], rtol=1e-6)


def test_eval_and_custom_scalars_refuse_what_is_not_one_number(tmp_path):
    """log_eval and log_scalars skipped an array (even of shape [1]) or a non-number
    without a word, a gap in the chart that reads as a split never evaluated; they
    raise now, naming the tag and shape. Only log_train's metrics skip arrays, as
    documented (run_train's per-env sums)."""
    with L.RunLogger(tmp_path, ["gravity"]) as log:
        calls = {
            r"eval/custom: .*ndarray of shape \(1,\)": lambda: log.log_scalars(
                1, {"eval/custom": np.array([7.0])}
            ),
            r"eval/train/return: .*shape \(1,\)": lambda: log.log_eval(
                1, {"train": np.array([5.0])}
            ),
            r"eval/train/return_std: .*shape \(2,\)": lambda: log.log_eval(
                1, {}, stds={"train": np.ones(2)}
            ),
            r"eval/train/episode_1/return: .*shape \(1,\)": lambda: log.log_eval(
                1, {}, by_episode={"train": [[1.0], [2.0]]}
            ),
            r"eval/generalization_gap: .*shape \(1,\)": lambda: log.log_eval(
                1, {}, gap=np.array([1.0])
            ),
            r"eval/str: .*str": lambda: log.log_scalars(1, {"eval/str": "8"}),
        }
        for match, call in calls.items():
            with pytest.raises(TypeError, match=match):
                call()
        log.log_train(1, {"episode_return": 1.0, "per_env": np.ones(4)})
        log.log_scalars(1, {"eval/ok": np.float32(9.0), "eval/nan": float("nan")})
    assert set(L.read_scalars(tmp_path)) == {"train/return", "eval/ok", "eval/nan"}


def test_per_element_entries_of_their_own_intervals_are_logged_per_element(tmp_path):
    """The envelope of elements that train on intervals of their own is no element's:
    Scale([0.4, 0.7, 0.3], [1.2, 1.9, 1.5]) logged one range 0.3-1.9 and one histogram
    of every element's draws. Named in `apart`, each element also gets its own."""
    values = np.array([[0.5, 1.0, 0.4], [1.1, 1.8, 1.4], [0.9, 0.8, 0.35]])
    # per-env rows (ADR's): each element's envelope over the envs
    other = C.ContextSpace(
        {
            "gravity": C.Uniform(4.0, 16.0),
            "mass": C.Scale([0.2, 0.75, 0.35], [1.0, 2.0, 1.4], per_element=True),
        }
    )
    rows = jax.tree.map(lambda a, b: np.stack([a, b]), WIDER, other)
    with L.RunLogger(tmp_path, ["gravity", "mass"]) as log:
        log.log_ranges(1000, WIDER, {"mass": (3,)})
        log.log_ranges(2000, rows, {"mass": (3,)})
        log.log_contexts(1000, {"mass": values, "gravity": np.ones(3)}, {"mass": (3,)})
    scalars = L.read_scalars(tmp_path)
    first = ([0.4, 1.2], [0.7, 1.9], [0.3, 1.5])
    second = ([0.2, 1.2], [0.7, 2.0], [0.3, 1.5])
    for i in range(3):
        for side, j in (("low", 0), ("high", 1)):
            logged = scalars[f"curriculum/mass/{i}/{side}"]
            assert [s for s, _ in logged] == [1000, 2000]
            assert [v for _, v in logged] == pytest.approx([first[i][j], second[i][j]])
    assert [v for _, v in scalars["curriculum/mass/low"]] == pytest.approx([0.3, 0.2])
    acc = _accumulator(tmp_path)
    for i in range(3):
        (event,) = acc.Histograms(f"context/mass/{i}")
        h = event.histogram_value
        assert h.num == 3
        assert (h.min, h.max) == pytest.approx((values[:, i].min(), values[:, i].max()))
    assert acc.Histograms("context/mass")[0].histogram_value.num == 9  # the envelope kept
    assert not any(t.startswith("context/gravity/") for t in acc.Tags()[ea.HISTOGRAMS])


def test_tag_functions_match_scheme():
    assert L.train_tag("episode_return") == L.TRAIN_RETURN == "train/return"
    assert L.range_tags("mass") == ("curriculum/mass/low", "curriculum/mass/high")
    assert L.eval_return_tag("extrapolation") == "eval/extrapolation/return"
    assert L.context_tag("geom_friction[:, 0]") == "context/geom_friction____0_"


def test_context_histograms(run):
    _, acc, contexts, *_ = run
    assert {"context/gravity", "context/mass"} <= set(acc.Tags()[ea.HISTOGRAMS])
    for name, values in contexts.items():
        (event,) = acc.Histograms(f"context/{name}")
        h = event.histogram_value
        assert event.step == 2000
        assert h.num == values.size
        assert (h.min, h.max) == pytest.approx((values.min(), values.max()))
        assert h.sum == pytest.approx(values.sum())


def test_heatmap_image(run):
    _, acc, *_ = run
    (event,) = acc.Images(L.HEATMAP)
    assert event.step == 2000
    assert (event.width, event.height) == L.HEATMAP_SIZE
    img = np.asarray(Image.open(io.BytesIO(event.encoded_image_string)).convert("RGB"))
    assert img.shape == (L.HEATMAP_SIZE[1], L.HEATMAP_SIZE[0], 3)
    assert len(np.unique(img.reshape(-1, 3), axis=0)) > 50  # plot, not a blank canvas
    assert (img.std(axis=(0, 1)) > 10).all()


def test_heatmap_labels_ticks_colorbar(run):
    *_, units, figures = run
    assert units == {"gravity": "m/s^2", "mass": "x default"}  # mass from log_ranges
    (fig,) = figures
    ax, cbar = fig.axes
    assert ax.get_xlabel() == "gravity [m/s^2]" and ax.get_ylabel() == "mass [x default]"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["5", "7.5", "10", "12.5", "15"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["0.5", "0.833", "1.17", "1.5"]
    assert cbar.get_ylabel() == "mean return"
    with pytest.raises(ValueError, match="shape"):
        L.heatmap_figure("x", GRID_X, "y", GRID_Y, np.zeros((5, 4)))


def test_custom_scalars_layout(run):
    logdir, acc, *_ = run
    (event,) = acc.Tensors("custom_scalars__config__")
    layout = layout_pb2.Layout.FromString(event.tensor_proto.string_val[0])
    assert len(layout.category) == 1  # one dashboard
    charts = {c.title: list(c.multiline.tag) for c in layout.category[0].chart}
    tags = set(L.read_scalars(logdir))

    def shown(title):  # the custom-scalars plugin keeps the tags that re.match a regex
        return {t for t in tags if any(re.match(rx, t) for rx in charts[title])}

    assert list(charts) == [
        "return: train vs held-out",
        "generalization gap",
        "wall time per segment, by stage",
        "curriculum: gravity",
        "curriculum: mass",
    ]
    assert shown("return: train vs held-out") == {
        "train/return",
        "eval/train/return",  # not the return_std tags, nor hparams/eval/...
        "eval/interpolation/return",
        "eval/extrapolation/return",
    }
    assert shown("generalization gap") == {"eval/generalization_gap", "eval/interpolation_gap"}
    assert shown("curriculum: gravity") == {"curriculum/gravity/low", "curriculum/gravity/high"}
    assert shown("curriculum: mass") == {"curriculum/mass/low", "curriculum/mass/high"}
    # the runner's stage timings (this logger's run writes none), not the other perf/ tags
    stages = {L.stage_seconds_tag(s) for s in L.RUNNER_STAGES}
    perf = stages | {L.ENV_STEPS_PER_SEC, L.COMPILE_SECONDS}
    assert {t for t in perf if re.match(charts["wall time per segment, by stage"][0], t)} == stages


def test_hparams_plugin_data(run):
    _, acc, *_ = run
    content = acc.PluginTagToContent("hparams")
    exp = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    assert [m.name.tag for m in exp.metric_infos] == [
        "hparams/eval/interpolation/return",
        "hparams/zero",
        "hparams/bad",  # a NaN final metric is listed, not dropped
    ]
    ssi = plugin_data_pb2.HParamsPluginData.FromString(
        content["_hparams_/session_start_info"]
    ).session_start_info
    hp = {k: getattr(v, v.WhichOneof("kind")) for k, v in ssi.hparams.items()}
    assert hp == {
        "seed": 0.0,
        "env": "ant",
        "normalise": True,
        "schedule": "None",
        "ppo.lr": pytest.approx(3e-4),
        "ppo.hidden": "(64, 64)",
    }
    assert "_hparams_/session_end_info" in content


def test_flatten_hparams():
    flat = L.flatten_hparams({"a": {"b": np.float32(0.5), "c": np.arange(2)}, "d": PPOConfig()})
    assert flat == {"a.b": 0.5, "a.c": "[0 1]", "d.lr": 3e-4, "d.hidden": "(64, 64)"}
    with pytest.raises(TypeError):
        L.flatten_hparams([1, 2])


def test_a_logger_opened_in_the_same_second_keeps_the_earlier_file(tmp_path):
    """A resumed run may open its logger within the second the last one opened (a
    short run, a quick restart): both files stay, read in the order they were written,
    and the resumed file's purge marker hides only what the first left past it."""
    with L.RunLogger(tmp_path, ["gravity"]) as first:
        first.log_train(1, {"episode_return": 1.0})
        first.log_train(2, {"episode_return": 2.0})
        first.log_train(3, {"episode_return": 3.0})  # as if killed before its checkpoint
    with L.RunLogger(tmp_path, ["gravity"], purge_step=3) as resumed:
        resumed.log_train(3, {"episode_return": 30.0})
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 2
    assert L.read_scalars(tmp_path)["train/return"] == [(1, 1.0), (2, 2.0), (3, 30.0)]


def test_a_heatmap_labels_a_cell_that_blew_up_visibly():
    """A masked (non-finite) cell shows the axes' white: its label must not be white,
    and an infinite return reads "inf", not "nan"."""
    z = np.arange(20, dtype=float).reshape(4, 5)
    z[1, 2], z[3, 0] = np.nan, np.inf
    fig = L.heatmap_figure("x", GRID_X, "y", GRID_Y, z)
    labels = {t.get_text(): t.get_color() for t in fig.axes[0].texts}
    assert labels["nan"] == labels["inf"] == "red"
    assert labels["0"] == "white" and labels["19"] == "black"  # low / high on viridis


def test_nan_is_logged_without_tensorboardx_warning_each_time(tmp_path, caplog):
    """A CI below 4 seeds is NaN on purpose: logged as NaN, with no warning per scalar
    (2 seeds of a short run printed 176); a user's own writer still warns."""
    with caplog.at_level("WARNING"), L.RunLogger(tmp_path / "run", ["gravity"]) as logger:
        logger.log_scalars(1, {"ci_low": float("nan"), "mean": 2.0})
        logger.log_hparams({"lr": 1e-3}, {"final/return": float("nan")})  # warned here
    assert not [r for r in caplog.records if "NaN" in r.getMessage()]
    scalars = L.read_scalars(tmp_path / "run")
    assert np.isnan(scalars["ci_low"][0][1]) and scalars["mean"] == [(1, 2.0)]
    from tensorboardX import SummaryWriter

    with caplog.at_level("WARNING"), SummaryWriter(str(tmp_path / "own")) as writer:
        writer.add_scalar("x", float("nan"), 1)
    assert [r for r in caplog.records if "NaN" in r.getMessage()]
