"""experiments/playground_curriculum.py end to end: a MuJoCo Playground env with a
name-selected mass and a goal context trains, evaluates, logs and checkpoints
(tests/test_runner.py and test_experiments.py prove resumed runs exact)."""

import json
import pathlib
import subprocess
import sys

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from metarl import checkpoint

pytest.importorskip("mujoco_playground")

ROOT = pathlib.Path(__file__).resolve().parents[1]
TINY = ["--steps-per-segment", "1280", "--ppo.num-envs", "16", "--ppo.unroll-length", "10"]
TINY += ["--ppo.num-minibatches", "2", "--eval.contexts", "3", "--episode-length", "40"]


def _run(logdir, segments):
    cmd = [sys.executable, str(ROOT / "experiments" / "playground_curriculum.py")]
    cmd += ["--logdir", str(logdir), "--segments", str(segments)] + TINY
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return out.stdout


@pytest.mark.slow
def test_playground_curriculum_runs_logs_and_checkpoints(tmp_path):
    # One process (each costs ~40 s of tracing MJX and loading its programs): a
    # resumed run is proven exact by tests/test_runner.py and test_experiments.py.
    whole = tmp_path / "run"
    _run(whole, 2)
    history = json.loads((whole / "history.json").read_text())
    assert [row["segment"] for row in history] == [1, 2]
    assert checkpoint.latest_step(whole / "checkpoints") == 2

    acc = EventAccumulator(str(whole), size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    tags = acc.Tags()
    # TensorBoard keeps [A-Za-z0-9_.\-/] in tags: "mass[arm]" is logged as "mass_arm_"
    assert {"context/mass_arm_", "context/goal_distance"} <= set(tags["histograms"])
    assert {"eval/train/return", "curriculum/goal_distance/high"} <= set(tags["scalars"])
    highs = [e.value for e in acc.Scalars("curriculum/goal_distance/high")]
    assert highs[0] < highs[-1]  # the goal range widens
