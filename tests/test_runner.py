"""metarl.experiment: run identity, bit-exact resume of every logged scalar, seeds
as a batch axis, and a clean exit on Ctrl-C."""

import dataclasses
import functools
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace

import jax
import numpy as np
import pytest
from brax import envs as brax_envs
from tensorboardX import SummaryWriter

import curricula
from metarl import checkpoint, experiment, provenance, rundir, stats
from metarl import contexts as C
from metarl import probe as P
from metarl.agents import ppo
from metarl.compilation import count_compilations
from metarl.envs import make_contextual
from metarl.tensorboard import (
    HPARAMS_SUFFIX,
    RUNNER_STAGES,
    RunLogger,
    read_scalars,
    stage_seconds_tag,
)
from metarl.trees import to_numpy

ROOT = pathlib.Path(__file__).resolve().parents[1]
TARGET = C.ContextSpace({"gravity": C.Uniform(5.0, 15.0), "mass": C.Scale(0.5, 2.0)})
CONFIG = ppo.PPOConfig(
    num_envs=16,
    unroll_length=8,
    num_minibatches=2,
    core="gru",
    hidden_size=8,
    policy_hidden=(16,),
    value_hidden=(16,),
)
STEPS = 256
# Timing legitimately differs between two processes.
UNTIMED = ("perf/",)


@pytest.fixture(scope="module")
def exp():
    return _experiment()


def _experiment():
    # The stock: "auto" on a GPU, whose env state holds most (unroll_length fresh
    # states per env, thinned to one in a checkpoint); its states are the loop's.
    env = make_contextual("inverted_pendulum", TARGET, episode_length=50, reset_strategy="stock")
    return experiment.Experiment(
        env=env,
        target=TARGET,
        curriculum=curricula.LinearWidening(start=0.2, segments=2),
        ppo=CONFIG,
        eval=experiment.EvalConfig(contexts=2, episodes=1, heatmap_points=2),
    )


@pytest.fixture(scope="module")
def compiled(exp):
    return experiment.compile_experiment(exp)


@pytest.fixture(scope="module")
def trials(exp):
    """`exp` in trials of 2 episodes, and its programs compiled for 2 seeds: one
    compilation for the tests that run it."""
    env = make_contextual("inverted_pendulum", TARGET, episode_length=25, episodes_per_trial=2)
    plain = replace(exp, env=env, eval=replace(exp.eval, episodes=2))
    return plain, experiment.compile_experiment(plain, num_seeds=2)


def _run(exp, compiled, logdir, segments, **kw):
    kw = {"seed": 0, **kw}
    return experiment.run(
        exp,
        logdir=logdir,
        segments=segments,
        steps_per_segment=STEPS,
        compiled=compiled,
        progress=False,
        table=False,
        **kw,
    )


def _timed_free(scalars):
    return {k: v for k, v in scalars.items() if not k.startswith(UNTIMED)}


def _hparams_sessions(logdir) -> list[tuple[int, dict]]:
    """(step, hparams) of every HParams session in a run's event files, read with
    TensorBoard's own loader and plugin-data parser."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.plugins.hparams import metadata

    sessions = []
    for path in sorted(pathlib.Path(logdir).glob("events.out.tfevents.*")):
        for event in EventFileLoader(str(path)).Load():
            for value in event.summary.value:
                if value.tag == metadata.SESSION_START_INFO_TAG:
                    info = metadata.parse_session_start_info_plugin_data(
                        value.metadata.plugin_data.content
                    )
                    hparams = {
                        k: v.WhichOneof("kind") and getattr(v, v.WhichOneof("kind"))
                        for k, v in info.hparams.items()
                    }
                    sessions.append((event.step, hparams))
    return sessions


def test_resumed_run_logs_exactly_what_an_uninterrupted_run_logs(exp, compiled, tmp_path):
    """Also with the stock's entries checkpointed thinned, one per env, and computed
    again on resume (`ppo.thin_env_state`, `ppo.restock_env_state`), and the memory
    probe logged after each segment. How many checkpoints a run keeps changes no
    number, and a resume may change it: the whole run keeps every segment's."""
    exp = replace(exp, eval=replace(exp.eval, probe=1))
    whole = _run(exp, compiled, tmp_path / "whole", 3, keep_checkpoints=0)
    assert checkpoint.all_steps(tmp_path / "whole" / rundir.CHECKPOINTS) == [1, 2, 3]
    _run(exp, compiled, tmp_path / "parts", 2)  # then "killed" and rerun for 3 segments
    # the leaves on disk ([key path, shape, dtype], in orbax's metadata of the step)
    step = tmp_path / "parts" / rundir.CHECKPOINTS / "2" / "_CHECKPOINT_METADATA"
    leaves = json.loads(step.read_text())["custom_metadata"]["leaves"]
    entries = [shape for path, shape, _ in leaves if ".entries" in path]
    assert entries and {tuple(shape[:2]) for shape in entries} == {(CONFIG.num_envs, 1)}
    parts = _run(exp, compiled, tmp_path / "parts", 3, keep_checkpoints=1)
    assert parts == whole
    assert checkpoint.all_steps(tmp_path / "parts" / rundir.CHECKPOINTS) == [3]
    a = _timed_free(read_scalars(tmp_path / "whole"))
    b = _timed_free(read_scalars(tmp_path / "parts"))
    assert sorted(a) == sorted(b)
    for tag in a:
        assert a[tag] == b[tag], tag  # same steps, same values, no duplicates
    assert [s for s, _ in a["eval/extrapolation_low/return"]] == [256, 512, 768]
    assert [s for s, _ in a["probe/extrapolation_low/rmse"]] == [256, 512, 768]
    # the HParams too: the 2-segment run's report was replaced by the extended run's
    assert [s for s, _ in b["hparams/train"]] == [768]
    sessions = _hparams_sessions(tmp_path / "parts")
    assert [(step, h["segments"]) for step, h in sessions] == [(768, 3)]
    assert sessions == _hparams_sessions(tmp_path / "whole")
    # where each segment's wall time went, once per segment in every run's events,
    # the resumed run's included (its first two segments' from the first attempt)
    timed = read_scalars(tmp_path / "parts")
    for stage in RUNNER_STAGES:
        points = timed[stage_seconds_tag(stage)]
        assert [s for s, _ in points] == [256, 512, 768], stage
        assert all(np.isfinite(v) and v >= 0 for _, v in points), (stage, points)
        if stage != "log":  # what a segment cannot do in no time
            assert all(v > 0 for _, v in points), (stage, points)


def test_a_restart_before_the_first_checkpoint_leaves_no_duplicate_points(exp, compiled, tmp_path):
    """An attempt stopped before its first checkpoint saved nothing: a rerun starts
    afresh under any config (the commonest stop: a wrong flag seen at once)."""
    logdir = tmp_path / "run"
    _run(exp, compiled, logdir, 1, hparams={"lr": 1.0})
    shutil.rmtree(logdir / "checkpoints")  # as if killed during the first save
    with pytest.raises(SystemExit, match="resume='never'"):
        _run(exp, compiled, logdir, 2, hparams={"lr": 2.0}, resume="never")
    _run(exp, compiled, logdir, 2, hparams={"lr": 2.0})  # refused before: nothing to mix
    record = json.loads((logdir / rundir.RUN_FILE).read_text())
    assert record["config"]["lr"] == 2.0 and record["forced"] == record["config_before"] == []
    steps = [s for s, _ in read_scalars(logdir)["train/return"]]
    assert steps == [256, 512]
    # checkpoints removed after several segments: refused, the logs kept
    shutil.rmtree(logdir / "checkpoints")
    with pytest.raises(SystemExit, match="history of several segments but no checkpoint"):
        _run(exp, compiled, logdir, 3, hparams={"lr": 2.0})
    with pytest.raises(SystemExit, match=r"lr: run has 2.0, now 3.0"):
        _run(exp, compiled, logdir, 3, hparams={"lr": 3.0})  # saved: the config counts
    assert [s for s, _ in read_scalars(logdir)["train/return"]] == [256, 512]
    # and the history too: the event files still hold two segments (they were
    # deleted as an attempt's, a finished run's HParams included)
    (logdir / rundir.HISTORY).unlink()
    with pytest.raises(SystemExit, match="TensorBoard logs of 2 segments but no checkpoint"):
        _run(exp, compiled, logdir, 3, hparams={"lr": 2.0})
    with pytest.raises(SystemExit, match=r"lr: run has 2.0, now 3.0"):
        _run(exp, compiled, logdir, 3, hparams={"lr": 3.0})
    assert [s for s, _ in read_scalars(logdir)["train/return"]] == [256, 512]


def test_a_fresh_start_clears_an_earlier_attempts_logs_of_another_seed_count(
    exp, compiled, tmp_path
):
    """An attempt of 2 seeds stopped before its first checkpoint left seed_0, seed_1 and
    aggregate runs; a fresh 1-seed start in that logdir leaves none of them beside its own
    (TensorBoard listed them as runs of this run)."""
    logdir = tmp_path / "run"
    _run(exp, compiled, logdir, 1)
    shutil.rmtree(logdir / "checkpoints")  # as if killed during the first save
    for d in ("seed_0", "seed_1", "aggregate"):  # and the attempt had 2 seeds
        with SummaryWriter(str(logdir / d)) as w:
            w.add_scalar("train/return", 1.0, 256)
    _run(exp, compiled, logdir, 1)
    assert not list(logdir.glob("*/events.out.tfevents.*"))
    assert [s for s, _ in read_scalars(logdir)["train/return"]] == [256]


def test_a_rerun_with_another_config_refuses_and_names_the_fields(exp, compiled, tmp_path):
    logdir = tmp_path / "run"
    _run(exp, compiled, logdir, 1)
    other_seed = replace(exp, ppo=replace(CONFIG, seed=1))
    with pytest.raises(SystemExit, match=r"(?s)another config.*\bseed\b.*cannot be forced"):
        _run(other_seed, compiled, logdir, 1, seed=1)
    with pytest.raises(ValueError, match="run's seed is 1 but its PPO config says seed=0"):
        _run(exp, compiled, logdir, 1, seed=1)  # run.json would record a seed not used
    with pytest.raises(SystemExit, match="resume='never'"):
        _run(exp, compiled, logdir, 1, resume="never")
    changed = {"lr": 1.0}
    _run(exp, compiled, tmp_path / "h", 1, hparams=changed)
    with pytest.raises(SystemExit, match=r"(?s)lr: run has 1.0, now 2.0.*--resume force"):
        _run(exp, compiled, tmp_path / "h", 1, hparams={"lr": 2.0})
    # forced on a finished run, nothing would run with lr 2.0: refused, run.json kept
    # (it recorded lr 2.0 beside the logs of lr 1.0, which eval_as_run then read)
    before = (tmp_path / "h" / rundir.RUN_FILE).read_text()
    with pytest.raises(SystemExit, match=r"(?s)finished run of 1 segments: no segment.*lr"):
        _run(exp, compiled, tmp_path / "h", 1, hparams={"lr": 2.0}, resume="force")
    assert (tmp_path / "h" / rundir.RUN_FILE).read_text() == before
    rows = _run(exp, compiled, tmp_path / "h", 2, hparams={"lr": 2.0}, resume="force")
    assert [r["segment"] for r in rows] == [1, 2]
    record = json.loads((tmp_path / "h" / rundir.RUN_FILE).read_text())
    assert record["forced"] == [["lr"]] and record["config_before"] == [{"lr": 1.0}]
    rows = _run(exp, compiled, logdir, 2)  # more segments: the run is extended
    assert [r["segment"] for r in rows] == [1, 2]
    with pytest.raises(ValueError, match="resume must be one of"):
        _run(exp, compiled, logdir, 2, resume="sometimes")


def test_a_logdir_with_checkpoints_but_no_run_record_is_never_resumed(exp, compiled, tmp_path):
    """Without run.json the checkpoints' config is unknown: a rerun with another seed or
    config would continue them and record its own config as theirs."""
    logdir = tmp_path / "run"
    _run(exp, compiled, logdir, 1)
    (logdir / rundir.RUN_FILE).unlink()
    for resume in experiment.RESUME_MODES:
        with pytest.raises(
            SystemExit,
            match="holds checkpoints, history.json and TensorBoard event files but no run.json",
        ):
            _run(exp, compiled, logdir, 2, resume=resume)
    assert checkpoint.latest_step(logdir / rundir.CHECKPOINTS) == 1  # nothing touched
    # another program's TensorBoard events: never deleted by a fresh start
    foreign = tmp_path / "foreign"
    with SummaryWriter(str(foreign)) as writer:
        writer.add_scalar("my/loss", 1.0, 0)
    for resume in experiment.RESUME_MODES:
        with pytest.raises(SystemExit, match="holds TensorBoard event files but no run.json"):
            _run(exp, compiled, foreign, 1, resume=resume)
    assert read_scalars(foreign) == {"my/loss": [(0, 1.0)]}


def test_a_rerun_of_a_finished_run_reports_its_hparams(exp, compiled, tmp_path):
    """As after a kill between the last checkpoint and the report: the rerun trains
    nothing and writes the HParams, once."""
    logdir = tmp_path / "run"
    _run(exp, compiled, logdir, 2)
    for f in logdir.glob(f"events.out.tfevents.*{HPARAMS_SUFFIX}"):
        f.unlink()
    _run(exp, compiled, logdir, 2)
    assert [(step, h["segments"]) for step, h in _hparams_sessions(logdir)] == [(512, 2)]
    assert [s for s, _ in read_scalars(logdir)["hparams/train"]] == [512]


def test_fewer_segments_than_a_run_holds_are_refused(exp, compiled, tmp_path):
    logdir = tmp_path / "run"
    _run(exp, compiled, logdir, 2)
    with pytest.raises(SystemExit, match="holds 2 finished segments; --segments 1"):
        _run(exp, compiled, logdir, 1)
    record = json.loads((logdir / rundir.RUN_FILE).read_text())
    assert record["config"]["segments"] == 2  # not rewritten


def test_a_logdir_in_use_by_another_run_is_refused(exp, compiled, tmp_path):
    """A second process on a live logdir would delete the first one's event file and
    history on its fresh start, and interleave checkpoints."""
    logdir = tmp_path / "run"
    with rundir.exclusive(logdir):  # as a run in another process holds it
        with pytest.raises(SystemExit, match=f"in use by process {os.getpid()}"):
            _run(exp, compiled, logdir, 1)
    assert not (logdir / rundir.RUN_FILE).exists()
    assert [r["segment"] for r in _run(exp, compiled, logdir, 1)] == [1]  # released


def test_a_rerun_on_other_software_refuses_unless_forced(exp, compiled, tmp_path, capsys):
    logdir = tmp_path / "run"
    _run(exp, compiled, logdir, 1)
    path = logdir / rundir.RUN_FILE
    record = json.loads(path.read_text())
    script = provenance.file_hash(getattr(sys.modules["__main__"], "__file__", None))
    assert record["software"] == {**provenance.software(), "script": script}
    assert "scipy" in record["software"]  # its truncnorm sets the held-out sets' intervals
    record["software"]["jax"] = "0.0.1"  # as if the run started on another JAX
    path.write_text(json.dumps(record))
    refusal = r"(?s)another software:\n  software\.jax: run has '0\.0\.1'.*--resume force"
    with pytest.raises(SystemExit, match=refusal):
        _run(exp, compiled, logdir, 2)
    rows = _run(exp, compiled, logdir, 2, resume="force")
    assert [r["segment"] for r in rows] == [1, 2]
    record = json.loads(path.read_text())
    assert record["forced"] == [["software.jax"]]
    assert record["software"]["jax"] == jax.__version__
    assert [r["jax"] for r in record["software_before"]] == ["0.0.1"]  # what segment 1 ran on
    # a run.json from before software was recorded: resumed, with a note
    del record["software"]
    path.write_text(json.dumps(record))
    capsys.readouterr()
    _run(exp, compiled, logdir, 3)
    assert "records no software" in capsys.readouterr().err


def test_a_rerun_on_another_platform_refuses_unless_forced(exp, compiled, tmp_path):
    logdir = tmp_path / "run"
    _run(exp, compiled, logdir, 1)
    path = logdir / rundir.RUN_FILE
    record = json.loads(path.read_text())
    assert record["platform"] == provenance.platform()
    assert record["platform"]["devices"] == jax.device_count() == 1
    # as if it had started on 2 devices (the envs split two ways) with other XLA flags
    record["platform"].update(devices=2, XLA_FLAGS="--xla_gpu_deterministic_ops=true")
    path.write_text(json.dumps(record))
    now = re.escape(os.environ.get("XLA_FLAGS", ""))  # tests/conftest.py may set one
    refusal = (
        r"(?s)another platform:\n  platform\.XLA_FLAGS: run has '--xla_gpu_deterministic_ops"
        rf"=true', now '{now}'\n  platform\.devices: run has 2, now 1\n.*--resume force"
    )
    with pytest.raises(SystemExit, match=refusal):
        _run(exp, compiled, logdir, 2)
    _run(exp, compiled, logdir, 2, resume="force")
    record = json.loads(path.read_text())
    assert record["forced"] == [["platform.XLA_FLAGS", "platform.devices"]]
    assert [p["devices"] for p in record["platform_before"]] == [2]  # what segment 1 ran on


def test_the_platform_records_the_seed_offset_that_moves_every_key():
    """JAX_RANDOM_SEED_OFFSET adds to every seed: a resume under another offset drew
    other held-out sets and evaluation keys (quickstart's third segment evaluated 16.5
    against 22.5), accepted without a word. The platform records it, so it is refused
    unless forced like the other numerical settings."""
    before = jax.config.jax_random_seed_offset
    key = jax.random.key_data(jax.random.key(0))
    try:
        jax.config.update("jax_random_seed_offset", before + 5)
        assert not np.array_equal(jax.random.key_data(jax.random.key(0)), key)
        assert provenance.platform()["jax_random_seed_offset"] == str(before + 5)
    finally:
        jax.config.update("jax_random_seed_offset", before)
    assert provenance.platform()["jax_random_seed_offset"] == str(before)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux CPU affinity")
def test_the_platform_names_the_host_cpu_whose_cores_and_isa_change_cpu_numbers():
    """XLA compiles a CPU program for the host's instruction set and splits its work
    over the cores the process may use; each changes the numbers (provenance's
    docstring has the measurement), so the record names them and a resume on another
    CPU or core count is refused unless forced, like any other platform field."""
    here = provenance.platform()
    assert here["cpu_cores"] == len(os.sched_getaffinity(0))
    assert here["cpu_isa"] and here["cpu_model"]
    code = (
        "import json, os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
        "from metarl import provenance; print(json.dumps(provenance.platform()))"
    )
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    one_core = json.loads(out.stdout.splitlines()[-1])
    assert one_core == {**here, "cpu_cores": 1}


def test_the_run_identity_holds_what_changes_the_numbers(exp):
    def identity(e, steps=STEPS):
        return rundir.describe_run(e, None, 1, 0, steps, 3)

    def changed(other):
        a, b = identity(exp), other
        return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))

    base = identity(exp)
    assert base["experiment.curriculum"] == "LinearWidening(start=0.2, segments=2)"
    assert changed(identity(exp, 2 * STEPS)) == ["steps_per_segment"]  # without hparams too
    curriculum = curricula.LinearWidening(start=0.2, segments=3)
    assert changed(identity(replace(exp, curriculum=curriculum))) == ["experiment.curriculum"]
    # a constructor argument of the wrapped env, and an edited model
    slower = make_contextual(
        "inverted_pendulum", TARGET, episode_length=50, n_frames=3, reset_strategy="stock"
    )
    assert changed(identity(replace(exp, env=slower))) == ["experiment.env._n_frames"]
    pendulum = brax_envs.get_environment("inverted_pendulum")
    pendulum.sys = pendulum.sys.tree_replace({"geom_friction": pendulum.sys.geom_friction * 2})
    edited = make_contextual(pendulum, TARGET, episode_length=50, reset_strategy="stock")
    assert changed(identity(replace(exp, env=edited))) == ["env.model"]
    # the reset strategy: strategies agree only to float rounding on a GPU
    pooled = make_contextual("inverted_pendulum", TARGET, episode_length=50, reset_strategy="pool")
    assert changed(identity(replace(exp, env=pooled))) == ["experiment.env.reset_strategy"]
    chunked = make_contextual(
        "inverted_pendulum", TARGET, episode_length=50, reset_chunk=0.5, reset_strategy="stock"
    )
    assert changed(identity(replace(exp, env=chunked))) == ["experiment.env.reset_chunk"]
    # numbers exactly, whatever NumPy's print options: gravity 5 and 5.0000005 (the
    # next float32) differ, in the target and in the env's own space (which scales a
    # visible context)
    nudged = C.ContextSpace({"gravity": C.Uniform(5.0000005, 15.0), "mass": C.Scale(0.5, 2.0)})
    with np.printoptions(precision=3):
        assert changed(identity(replace(exp, target=nudged))) == ["experiment.target"]
        own = make_contextual(
            "inverted_pendulum", nudged, episode_length=50, reset_strategy="stock"
        )
        assert changed(identity(replace(exp, env=own))) == ["experiment.env.space"]
    # a curriculum without params, its update a partial: described without addresses
    update = functools.partial(lambda state, results, rate: state, rate=0.5)
    custom = exp.curriculum._replace(update=update, params=None)
    described = identity(replace(exp, curriculum=custom))["experiment.curriculum"]
    assert "rate=0.5" in described and " at 0x" not in described
    assert identity(exp) == base  # the same in every call

    # a curriculum of its own functions (no params): what they capture decides the
    # schedule, two closures deep here (the start a widening's update reads)
    def own(start):
        widening = curricula.LinearWidening(start=start, segments=2)
        return curricula.Curriculum(widening.init, widening.update, widening.ranges)

    def describe(curriculum):
        return identity(replace(exp, curriculum=curriculum))["experiment.curriculum"]

    assert describe(own(0.2)) == describe(own(0.2))
    assert describe(own(0.2)) != describe(own(0.5))


BALL = """<mujoco><option timestep="0.01" {option}/><worldbody>
<body name="b"><joint name="x" type="slide" axis="1 0 0"/><geom size="0.1" mass="1"/></body>
</worldbody><actuator><motor joint="x"/></actuator></mujoco>"""


def _weighted_speed(data, action, nxt, task, weight):
    return weight * nxt.qvel[0]


def test_the_run_identity_sees_static_model_settings_and_the_envs_code():
    """The model digest covers static settings, which a model's pytree leaves leave
    out (Euler and RK4 simulate differently); the env's functions are recorded by
    what they compute, not by name alone (a partial's arguments included)."""
    from metarl.envs import MjcfEnv

    def env(option="", weight=1.0):
        reward = functools.partial(_weighted_speed, weight=weight)
        mjcf = MjcfEnv(BALL.format(option=option), observe=lambda d, t: d.qpos, reward=reward)
        return make_contextual(mjcf, C.ContextSpace({"mass": C.Scale(0.5, 2.0)}))

    base = env()
    assert rundir.model_digest(env()) == rundir.model_digest(base)
    for option in ('integrator="RK4"', 'iterations="1"', 'cone="elliptic"'):
        assert rundir.model_digest(env(option)) != rundir.model_digest(base), option
    described = rundir.describe_env(base)
    assert rundir.describe_env(env()) == described
    flipped = rundir.describe_env(env(weight=-1.0))
    assert [k for k in described if described[k] != flipped[k]] == ["code"]


def test_the_run_identity_records_an_envs_arrays_and_its_files_wherever_installed(tmp_path):
    """An MjcfEnv's array task parameters (a goal's default) were left out of run.json:
    a changed default resumed silently. A Playground env keeps its XML's absolute path
    in site-packages, recorded as it was: a run could be neither resumed (`experiment.`
    fields cannot be forced) nor read from another venv, clone or machine. The file is
    recorded by name and content, and a run.json holding the path still resumes."""
    from metarl.envs import MjcfEnv

    space = C.ContextSpace({"mass": C.Scale(0.5, 2.0)})

    def env(goal, place):
        mjcf = MjcfEnv(
            BALL.format(option=""),
            observe=lambda d, t: d.qpos,
            reward=lambda d, a, n, t: -abs(n.qpos[0] - t["goal"][0]),
            task_params={"goal": np.asarray(goal, np.float32)},
        )
        path = tmp_path / place / "ball.xml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(BALL.format(option=""))
        mjcf._xml_path = str(path)  # as each Playground env keeps its model's file
        return make_contextual(mjcf, space)

    def config(goal=(0.0, 1.0), place="venv"):
        exp = experiment.Experiment(
            env(goal, place), space, curricula.LinearWidening(1.0, 1), ppo.PPOConfig()
        )
        return rundir.describe_run(exp, None, 1, 0, STEPS, 1)

    then = config()
    assert then["experiment.env._xml_path"].startswith("ball.xml (sha256 ")
    assert config(place="elsewhere") == then  # another install of the same file
    changed = config(goal=(5.0, 1.0))
    assert {k for k in then if then[k] != changed[k]} == {"experiment.env.data"}
    rundir.check_identity(tmp_path, then, "auto")
    with pytest.raises(SystemExit, match=r"(?s)experiment\.env\.data: run has .* cannot be forced"):
        rundir.check_identity(tmp_path, changed, "force", write=False)
    # a run.json of an older metarl: the file's absolute path, no arrays recorded
    path = tmp_path / rundir.RUN_FILE
    record = json.loads(path.read_text())
    record["config"]["experiment.env._xml_path"] = str(tmp_path / "venv" / "ball.xml")
    del record["config"]["experiment.env.data"]
    path.write_text(json.dumps(record))
    rundir.check_identity(tmp_path, config(place="elsewhere"), "auto", write=False)


_USER_ENV = """
import numpy as np
from brax.envs.inverted_pendulum import InvertedPendulum

SPEED = np.array([SPEED_VALUE])


class Pendulum(InvertedPendulum):
    def step(self, state, action):
        state = super().step(state, action)
        return state.replace(reward=state.reward * WEIGHT)


def speed_reward(data, action, nxt, task):
    return SPEED[0] * nxt.qvel[0]
"""


def test_the_envs_code_covers_a_user_class_and_the_arrays_its_functions_read(tmp_path, monkeypatch):
    """An edited reward in the step of a user's env class (in a module the script
    imports), an edited module-level array a reward reads, another array captured by a
    closure: each changes the record (before, all three resumed silently: the class
    was recorded by name, the arrays by type)."""
    import importlib

    from metarl.envs import MjcfEnv

    monkeypatch.syspath_prepend(str(tmp_path))
    source = tmp_path / "user_env_for_test.py"

    def module(weight="1.0", speed="1.0"):
        source.write_text(_USER_ENV.replace("WEIGHT", weight).replace("SPEED_VALUE", speed))
        importlib.invalidate_caches()
        if "user_env_for_test" in sys.modules:
            return importlib.reload(sys.modules["user_env_for_test"])
        return importlib.import_module("user_env_for_test")

    space = C.ContextSpace({"gravity": C.Uniform(5.0, 15.0)})

    def code(env):
        return rundir.describe_env(make_contextual(env, space))["code"]

    base = code(module().Pendulum())
    assert code(module().Pendulum()) == base
    assert code(module(weight="100.0").Pendulum()) != base

    def ball(reward):
        return make_contextual(
            MjcfEnv(BALL.format(option=""), observe=lambda d, t: d.qpos, reward=reward),
            C.ContextSpace({"mass": C.Scale(0.5, 2.0)}),
        )

    def speed_code(speed):
        return rundir.describe_env(ball(module(speed=speed).speed_reward))["code"]

    assert speed_code("1.0") == speed_code("1.0") != speed_code("2.0")

    def captured(weights):
        return rundir.describe_env(ball(lambda d, a, n, t: weights[0] * n.qvel[0]))["code"]

    assert captured(np.array([1.0])) == captured(np.array([1.0])) != captured(np.array([5.0]))


def test_a_rerun_with_another_curriculum_cannot_be_forced(exp, compiled, tmp_path):
    logdir = tmp_path / "run"
    _run(exp, compiled, logdir, 1)
    other = replace(exp, curriculum=curricula.LinearWidening(start=0.2, segments=5))
    refusal = (
        r"(?s)experiment\.curriculum: run has 'LinearWidening\(start=0\.2, segments=2\)', "
        r"now 'LinearWidening\(start=0\.2, segments=5\)'.*cannot be forced"
    )
    with pytest.raises(SystemExit, match=refusal):
        _run(other, compiled, logdir, 2, resume="force")


def test_a_run_made_with_another_reset_strategy_says_which_to_resume_with(exp, tmp_path):
    """The strategy decides what the env state holds (the pool's entries), so a resume
    with another one is refused even when forced. "auto" resolves by the kind of
    device (the loop on a CPU, the stock on a GPU; until 2026-11-27 the pool on both,
    then the pool on Brax's backends on a GPU and, on MJX, "auto" left unresolved):
    the refusal names the strategy to pass."""
    pooled = make_contextual("inverted_pendulum", TARGET, episode_length=50, reset_strategy="pool")
    then = rundir.describe_run(replace(exp, env=pooled), None, 1, 0, STEPS, 3)
    auto = make_contextual("inverted_pendulum", TARGET, episode_length=50)
    now = rundir.describe_run(replace(exp, env=auto), None, 1, 0, STEPS, 3)
    assert now["experiment.env.reset_strategy"] == "loop"  # "auto" on a CPU
    rundir.check_identity(tmp_path, then, "auto")
    refusal = (
        r"(?s)experiment\.env\.reset_strategy: run has 'pool', now 'loop'.*cannot be "
        r"forced.*make_contextual\(\.\.\., reset_strategy='pool'\) to resume or read this run"
    )
    with pytest.raises(SystemExit, match=refusal):
        rundir.check_identity(tmp_path, now, "force")
    # reading the run (load_run, the analysis scripts) says the same: on a GPU's run
    # read on a CPU it said only that the strategies differ
    with pytest.raises(ValueError, match=r"(?s)run has 'pool'.*reset_strategy='pool'\) to"):
        rundir.check_recorded(tmp_path, now, "load_run")
    assert rundir.check_identity(tmp_path, then, "auto")["config"] == then
    # An MJX run of an older metarl recorded "auto" unresolved: it ran the loop on a
    # CPU (a resume there goes on) and dense elsewhere (the refusal names dense)
    path = tmp_path / rundir.RUN_FILE
    record = json.loads(path.read_text())
    record["config"]["experiment.env.reset_strategy"] = "auto"
    path.write_text(json.dumps(record))
    assert rundir.check_identity(tmp_path, now, "auto", write=False)["config"] == now
    record["platform"]["backend"] = "gpu"
    path.write_text(json.dumps(record))
    refusal = r"(?s)run has 'dense', now 'loop'.*make_contextual\(\.\.\., reset_strategy='dense'\)"
    with pytest.raises(SystemExit, match=refusal):
        rundir.check_identity(tmp_path, now, "force")


def test_a_run_recorded_before_the_memory_probe_resumes_and_a_probe_changed_is_named(exp, tmp_path):
    now = rundir.describe_run(exp, None, 1, 0, STEPS, 3)
    assert now["eval.probe"] == 0
    rundir.check_identity(tmp_path, {k: v for k, v in now.items() if k != "eval.probe"}, "auto")
    assert rundir.check_identity(tmp_path, now, "auto")["config"] == now  # an older run.json
    probed = replace(exp, eval=replace(exp.eval, probe=2))
    with pytest.raises(SystemExit, match=r"eval\.probe: run has 0, now 2"):
        rundir.check_identity(tmp_path, rundir.describe_run(probed, None, 1, 0, STEPS, 3), "auto")


def test_rerunning_a_finished_run_logs_nothing_new(exp, compiled, tmp_path):
    logdir = tmp_path / "run"
    _run(exp, compiled, logdir, 2, hparams={"lr": 1.0})
    before = read_scalars(logdir)
    hparams = [tag for tag in before if tag.startswith("hparams/")]
    assert hparams and all(before[tag][0][0] == 2 * STEPS for tag in hparams)
    _run(exp, compiled, logdir, 2, hparams={"lr": 1.0})
    assert read_scalars(logdir) == before  # every tag once per step, the hparams too


def test_per_env_sums_credit_only_episodes_drawn_from_the_current_ranges(compiled):
    """ADR credits run_train's per-env sums to the boundary each env is assigned now:
    an episode begun under the ranges before run_train's `context` is not counted."""
    space = compiled.space
    k_train, k_env = ppo.split_keys(ppo.seed_keys(3), 2)
    ts, es = ppo.init_training_state(space, k_train), ppo.init_env_state(space, k_env)
    steps = 20 * CONFIG.batch_size  # 160 steps per env: every episode of 50 ends in it
    ts, es, kept = ppo.run_train(space, ts, es, steps)  # no new ranges: every episode counts
    assert kept["env_episodes"].sum() == kept["episodes"] > CONFIG.num_envs
    np.testing.assert_allclose(
        kept["env_return_sum"].sum(), kept["episode_return"] * kept["episodes"], rtol=1e-5
    )
    ts, es, same = ppo.run_train(space, ts, es, steps, context=TARGET)  # unchanged: counts
    assert same["env_episodes"].sum() == same["episodes"]
    moved = TARGET.scaled(0.5)
    ts, es, new = ppo.run_train(space, ts, es, steps, context=moved)
    # each env's episode running at the change ends in the segment, uncredited
    assert new["episodes"] - new["env_episodes"].sum() == CONFIG.num_envs
    assert np.all(new["env_episodes"] >= 1)


def test_per_env_ranges_are_logged_as_their_envelope(tmp_path):
    rows = [C.ContextSpace({"gravity": C.Uniform(lo, hi)}) for lo, hi in ((8, 10), (5, 9), (9, 12))]
    per_env = C.PerEnv(jax.tree.map(lambda *x: np.stack(x), *rows))  # ADR's kind of ranges
    with RunLogger(tmp_path, ["gravity"]) as logger:
        logger.log_ranges(7, experiment._shared(per_env))
    scalars = read_scalars(tmp_path)
    assert scalars["curriculum/gravity/low"] == [(7, 5.0)]
    assert scalars["curriculum/gravity/high"] == [(7, 12.0)]


def test_compiled_pieces_serve_only_runs_with_the_same_evaluation(exp, compiled):
    assert compiled.fits(exp, 1)
    for other in (
        replace(exp.eval, heatmap_points=3),  # another grid
        replace(exp.eval, extrapolation_factor=2.0),  # the grid spans more
        replace(exp.eval, contexts=5),  # more contexts per split than the evaluator takes
    ):
        assert not compiled.fits(replace(exp, eval=other), 1), other


def test_damaged_checkpoints_are_never_started_over(exp, compiled, tmp_path):
    logdir = tmp_path / "run"
    _run(exp, compiled, logdir, 1, hparams={"lr": 1.0})
    kept = sorted(logdir.glob("events.out.tfevents.*")) + [logdir / rundir.HISTORY]
    record = (logdir / rundir.RUN_FILE).read_text()
    for path in (logdir / rundir.CHECKPOINTS / "1").rglob("*"):
        if path.is_file() and path.stat().st_size:
            path.write_bytes(bytes(path.stat().st_size))  # every byte zeroed
    forced = {"hparams": {"lr": 2.0}, "resume": "force"}  # a change that could be forced
    # the same advice both times (the first blamed another config), which works
    advice = r"only damaged ones moved aside \(damaged-1\); nothing was deleted.*history.json"
    with pytest.warns(RuntimeWarning), pytest.raises(SystemExit, match=advice) as first:
        _run(exp, compiled, logdir, 2, **forced)
    assert "another structure" not in str(first.value)
    with pytest.raises(SystemExit, match=advice):
        _run(exp, compiled, logdir, 2, **forced)
    assert all(path.exists() for path in kept)  # neither the logs nor the history went
    assert (logdir / rundir.RUN_FILE).read_text() == record  # nor the record changed
    shutil.rmtree(logdir / rundir.CHECKPOINTS / "damaged-1")  # as advised: starts over
    (logdir / rundir.HISTORY).unlink()
    assert [r["segment"] for r in _run(exp, compiled, logdir, 1, hparams={"lr": 1.0})] == [1]


def test_a_signal_after_the_last_chunk_stops_once_the_segment_is_saved(
    exp, compiled, tmp_path, monkeypatch
):
    """A Ctrl-C during the last segment's evaluation (training over, nothing left to
    interrupt) is not dropped: the run exits with 130 once that segment is saved, so
    `run_variants` starts no further variant; a rerun completes the report."""
    evaluate = experiment.Run._evaluate

    def interrupted(self, i, k, ts, ranges):
        if k == 1:
            os.kill(os.getpid(), signal.SIGINT)
        return evaluate(self, i, k, ts, ranges)

    monkeypatch.setattr(experiment.Run, "_evaluate", interrupted)
    logdir = tmp_path / "run"
    with pytest.raises(SystemExit) as stop:
        _run(exp, compiled, logdir, 2)
    assert stop.value.code == 130
    assert checkpoint.latest_step(logdir / rundir.CHECKPOINTS) == 2
    assert len(json.loads((logdir / rundir.HISTORY).read_text())) == 2
    monkeypatch.setattr(experiment.Run, "_evaluate", evaluate)
    assert [r["segment"] for r in _run(exp, compiled, logdir, 2)] == [1, 2]
    assert [s for s, _ in read_scalars(logdir)["hparams/train"]] == [2 * STEPS]


def test_the_history_holds_the_checkpointed_segments_only(exp, compiled, tmp_path):
    logdir = tmp_path / "run"
    _run(exp, compiled, logdir, 3)
    # as if the third segment were killed after its logs but before its checkpoint
    shutil.rmtree(logdir / rundir.CHECKPOINTS / "3")
    assert len(json.loads((logdir / rundir.HISTORY).read_text())) == 3
    rows = _run(exp, compiled, logdir, 2)  # trains nothing: 2 segments are saved
    assert [r["segment"] for r in rows] == [1, 2]
    assert json.loads((logdir / rundir.HISTORY).read_text()) == rows
    (logdir / rundir.HISTORY).unlink()  # removed by hand: refused, not restarted
    record = (logdir / rundir.RUN_FILE).read_text()
    with pytest.raises(SystemExit, match=r"holds 0 of the 2 segments"):
        _run(exp, compiled, logdir, 3, hparams={"lr": 2.0}, resume="force")
    assert checkpoint.latest_step(logdir / rundir.CHECKPOINTS) == 2
    assert (logdir / rundir.RUN_FILE).read_text() == record  # a refused resume writes nothing


def test_a_config_whose_updates_blow_up_stops_before_saving_anything(exp, tmp_path):
    """A learning rate that overflows the first update: the run stops in its first
    segment, names it, and leaves nothing that a rerun would resume."""
    blown = replace(exp, ppo=replace(CONFIG, learning_rate=1e37, max_grad_norm=None))
    logdir = tmp_path / "run"
    with pytest.raises(ppo.TrainingDivergedError) as caught:
        _run(blown, None, logdir, 2)
    message = str(caught.value)
    assert f"{logdir}: segment 1 diverged (seed 0)" in message
    assert "learning_rate (now 1e+37)" in message and "Nothing was saved" in message
    assert checkpoint.latest_step(logdir / rundir.CHECKPOINTS) is None
    assert not (logdir / rundir.HISTORY).exists()


def test_a_diverged_segment_keeps_the_checkpoints_before_it(exp, compiled, tmp_path):
    """Segment 2 starts from a state holding a NaN (written into segment 1's
    checkpoint, as an update that overflowed at its end would leave it): the run
    stops in segment 2 and saves nothing of it, so segment 1 survives (with
    keep=2, two more saved segments of garbage would have deleted it)."""
    logdir = tmp_path / "run"
    _run(exp, compiled, logdir, 1)
    ckpt = logdir / rundir.CHECKPOINTS
    r = experiment.Run(exp, logdir, 0, 1, compiled)
    r.setup(None, "auto", STEPS, 2)
    state = checkpoint.restore(ckpt, like=r._state(0))
    ts = state["training"]
    value = ts.params["value"]
    leaves, tree = jax.tree.flatten(value)
    leaves[-1] = leaves[-1].at[(0,) * leaves[-1].ndim].set(np.inf)
    state["training"] = ts.replace(params={**ts.params, "value": jax.tree.unflatten(tree, leaves)})
    shutil.rmtree(ckpt / "1")
    checkpoint.save(ckpt, 1, state, keep=2)
    history = (logdir / rundir.HISTORY).read_text()
    with pytest.raises(ppo.TrainingDivergedError) as caught:
        _run(exp, compiled, logdir, 4)
    message = str(caught.value)
    assert "segment 2 diverged (seed 0)" in message
    assert re.search(r"params: \d+ of \d+ arrays", message), message
    assert "checkpoint after segment 1 and history are kept" in message
    assert checkpoint.all_steps(ckpt) == [1]
    assert (logdir / rundir.HISTORY).read_text() == history


def test_source_hash_follows_the_code_only(tmp_path):
    code = tmp_path / "metarl"
    shutil.copytree(ROOT / "metarl", code, ignore=shutil.ignore_patterns("__pycache__"))
    before = provenance.source_hash(code)
    assert before == provenance.source_hash(ROOT / "metarl")
    (code / "agents" / "__pycache__").mkdir()
    (code / "agents" / "__pycache__" / "x.pyc").write_bytes(b"compiled")
    assert provenance.source_hash(code) == before  # not source
    learner = code / "agents" / "ppo" / "learner.py"
    learner.write_text(learner.read_text() + "# edited\n")
    assert provenance.source_hash(code) != before


def test_seed_k_of_a_batched_run_equals_the_single_run_with_that_seed(exp, compiled):
    space1 = compiled.space  # the experiment's: ppo.make_train_space(exp.env, CONFIG)
    space3 = ppo.make_train_space(exp.env, CONFIG, num_seeds=3)
    k_train, k_env = ppo.split_keys(ppo.seed_keys(5, 3), 2)
    ts = ppo.init_training_state(space3, k_train)
    es = ppo.init_env_state(space3, k_env, [TARGET.scaled(0.1 * (k + 1)) for k in range(3)])
    ts, es, metrics = ppo.run_train(space3, ts, es, 2 * STEPS)
    assert len(metrics) == 3
    for k in range(3):
        t1, e1 = ppo.split_keys(jax.random.key(5 + k), 2)
        ts1 = ppo.init_training_state(space1, t1)
        es1 = ppo.init_env_state(space1, e1, TARGET.scaled(0.1 * (k + 1)))
        ts1, es1, m1 = ppo.run_train(space1, ts1, es1, 2 * STEPS)
        for a, b in zip(
            jax.tree.leaves(to_numpy(ppo.select_seed((ts, es), k))),
            jax.tree.leaves(to_numpy((ts1, es1))),
        ):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
        assert metrics[k]["episodes"] == m1["episodes"]
        np.testing.assert_allclose(metrics[k]["episode_return"], m1["episode_return"], rtol=1e-4)
    # The seeds really differ from one another.
    params = to_numpy(ts.params)
    assert not np.allclose(jax.tree.leaves(params)[0][0], jax.tree.leaves(params)[0][1])


def test_a_seeded_run_logs_each_seed_and_the_aggregate(exp, trials, tmp_path, monkeypatch):
    drawn = _heatmaps(monkeypatch)
    rows = _run(*trials, tmp_path, 1, num_seeds=2)
    # each seed's heatmap and the aggregate's outline the ranges trained on
    assert {d[0] for d in drawn} == {"seed_0", "seed_1", "aggregate"}
    _check_heatmap_boxes(exp, drawn)
    assert len(rows[0]["train"]) == 2
    agg = read_scalars(tmp_path / "aggregate")
    gaps = []
    for k, name in enumerate(("seed_0", "seed_1")):
        scalars = read_scalars(tmp_path / name)
        assert "eval/train/return" in scalars
        # Each seed logs its own gaps, and the history keeps them per seed.
        gap = rows[0]["train"][k] - rows[0]["interpolation"][k]
        assert rows[0]["interpolation_gap"][k] == pytest.approx(gap, abs=1e-4)
        assert scalars["eval/interpolation_gap"][0][1] == pytest.approx(gap, abs=1e-3)
        gaps.append(gap)
    assert agg["eval/interpolation_gap"][0][1] == pytest.approx(np.mean(gaps), abs=1e-3)
    # return_std: the spread over a split's contexts (one episode each here, so the
    # spread over episodes within a context would be 0)
    seed_0 = read_scalars(tmp_path / "seed_0")
    stds = {s: seed_0[f"eval/{s}/return_std"][0][1] for s in experiment.SPLITS}
    assert max(stds.values()) > 0, stds
    for suffix in ("", "/iqm", "/iqm_ci_low", "/iqm_ci_high", "/nonfinite_seeds"):
        assert f"eval/extrapolation_high/return{suffix}" in agg
    current = agg[experiment.CURRENT_TAG][0][1]  # the return each seed's curriculum read
    assert current == pytest.approx(np.mean(rows[0]["current"]), rel=1e-5)
    # episodes cut by non-finite physics: counted per seed and split (none here)
    assert rows[0]["nonfinite_episodes"]["extrapolation_low"] == [0, 0]
    assert agg["eval/extrapolation_low/nonfinite_episodes"][0][1] == 0
    assert read_scalars(tmp_path / "seed_1")["eval/train/nonfinite_episodes"][0][1] == 0
    # throughput: each seed's run its own env steps per second, the aggregate the
    # program's total (the seeds advance together)
    speeds = [
        read_scalars(tmp_path / n)["perf/env_steps_per_sec"][0][1] for n in ("seed_0", "seed_1")
    ]
    assert speeds[0] == speeds[1]
    assert agg["perf/env_steps_per_sec"][0][1] == pytest.approx(2 * speeds[0], rel=1e-6)
    assert "perf/compile_seconds" in agg
    # each seed's HParams session names that seed, in both places a seed is recorded
    for k in range(2):
        ((_, hparams),) = _hparams_sessions(tmp_path / f"seed_{k}")
        assert (hparams["seed"], hparams["ppo.seed"]) == (k, k), hparams
    # the adaptation curve over seeds, as every aggregate scalar: mean, IQM and 95% CI
    second = rows[0]["episodes"][1]  # episode 2 of a trial, per seed
    curve = stats.summarize(second)
    for suffix, value in (("", curve.mean), ("/iqm", curve.iqm)):
        got = agg[f"eval/train/episode_2/return{suffix}"][0][1]
        assert got == pytest.approx(value, rel=1e-5, abs=1e-3), suffix
    # 2 seeds are below stats.MIN_SEEDS_FOR_CI: the CI is logged as NaN, not as an
    # interval that would cover the truth half the time
    for tag in ("eval/train/episode_2/return", "eval/train/return"):
        assert all(np.isnan(agg[f"{tag}/iqm_ci_{s}"][0][1]) for s in ("low", "high")), tag
    # The same estimand as the printed table: one score per seed (its mean over the
    # contexts), not every (seed, context) score as if the contexts were independent runs.
    want = stats.summarize(rows[0]["train"])
    for suffix, value in (
        ("/iqm", want.iqm),
        ("/iqm_ci_low", want.ci_low),
        ("/iqm_ci_high", want.ci_high),
        ("/nonfinite_seeds", 0),
    ):
        got = agg[f"eval/train/return{suffix}"][0][1]
        assert got == pytest.approx(value, rel=1e-5, abs=1e-3, nan_ok=True), suffix


def test_the_memory_probe_is_the_trained_memorys_and_changes_no_other_number(
    trials, tmp_path, capsys
):
    """eval.probe: after each segment a probe of the GRU's memory, fitted on the run's
    fixed fit sets and scored on every held-out split (`metarl.probe`), is logged per
    seed, over seeds and in the history; the policy load_run reads back gives the
    same figures bit for bit, and every other number is the run's without a probe."""
    plain, compiled = trials  # one compilation for both runs
    probed = replace(plain, eval=replace(plain.eval, probe=2))
    without = _run(plain, compiled, tmp_path / "plain", 1, num_seeds=2)
    rows = _run(probed, compiled, tmp_path / "probed", 1, num_seeds=2)
    assert [{k: v for k, v in r.items() if k != "probe"} for r in rows] == without
    for run in ("seed_0", "seed_1", "aggregate"):
        a, b = (_timed_free(read_scalars(tmp_path / d / run)) for d in ("plain", "probed"))
        kept = {t: v for t, v in b.items() if not t.startswith("probe/")}
        np.testing.assert_equal(kept, a, err_msg=run)  # NaN (no CI at 2 seeds) equals NaN
        # the probe's wall time is logged where it runs, and only there
        probe_seconds = stage_seconds_tag("probe")
        assert probe_seconds not in read_scalars(tmp_path / "plain" / run)
        ((_, spent),) = read_scalars(tmp_path / "probed" / run)[probe_seconds]
        assert spent > 0
    splits = [s for s in experiment.SPLITS if s in rows[0]]
    tags = {
        f"probe/{s}/{e}{m}"
        for s in splits
        for e in ("", "episode_1/", "episode_2/")
        for m in ("r2", "rmse")
    }
    assert set(rows[0]["probe"]) == tags
    agg = read_scalars(tmp_path / "probed" / "aggregate")
    assert {t + "/iqm_ci_high" for t in tags} <= set(agg)
    loaded = experiment.load_run(
        probed, logdir=tmp_path / "probed", seed=0, num_seeds=2, compiled=compiled
    )
    for i, seed in enumerate(loaded.seeds):
        key = jax.random.fold_in(experiment._stream(seed, experiment._PROBE), 1)
        scores = P.fit_and_score(
            compiled.evaluator,
            loaded.policies[i],
            experiment.probe_fit_sets(probed, seed),
            experiment.held_out_sets(probed, seed),
            jax.random.fold_in(key, 0),  # the first segment's
        )
        logged = read_scalars(tmp_path / "probed" / f"seed_{seed}")
        for split in splits:
            score = scores[split]
            assert rows[0]["probe"][f"probe/{split}/r2"][i] == score.r2
            rmse = np.mean(score.error_by_episode[1])
            assert rows[0]["probe"][f"probe/{split}/episode_2/rmse"][i] == rmse
            assert logged[f"probe/{split}/episode_2/rmse"] == [
                (rows[0]["env_steps"], pytest.approx(rmse))
            ]
            assert np.isfinite(score.r2) and score.r2 <= 1
    # the two seeds' memories are probed apart: their scores differ
    assert len(set(rows[0]["probe"]["probe/train/r2"])) == 2
    # the table prints them by segment, with the last segment's curve over a trial
    experiment.print_table(rows, tmp_path)
    out = capsys.readouterr().out
    r2 = stats.format_iqm(stats.summarize(rows[0]["probe"]["probe/extrapolation_high/r2"]), 2)
    (line,) = [x for x in out.splitlines() if x.split()[:3] == ["R^2", "1", "256"]]
    assert line.split()[-5:] == r2.split()  # "0.12 [no CI: 2 seeds]"
    assert "R^2 on eval train by episode i of a trial, last segment: 1: " in out


def test_the_wall_time_line_sums_the_stages_and_gives_their_shares():
    seconds = [
        {"train": 6.0, "eval": 2.0, "probe": 1.0, "log": 0.5, "checkpoint": 0.5},
        {"train": 3.0, "eval": 1.0, "probe": 0.0, "log": 0.5, "checkpoint": 0.5},
    ]
    assert experiment.seconds_line(seconds) == (
        "Wall time of the 2 segments run here: 15.0 s; train 9.0 s (60%), eval 3.0 s "
        "(20%), probe 1.0 s (7%), log 1.0 s (7%), checkpoint 1.0 s (7%)"
    )
    line = experiment.seconds_line(seconds[1:], probe=False)
    assert line == (
        "Wall time of the 1 segment run here: 5.0 s; train 3.0 s (60%), eval 1.0 s (20%), "
        "log 0.5 s (10%), checkpoint 0.5 s (10%)"
    )
    with pytest.raises(ValueError, match="unknown runner stage 'compile'; valid: train, eval"):
        stage_seconds_tag("compile")


def test_the_return_a_curriculum_decides_on_is_logged_and_kept(exp, compiled, tmp_path):
    """`PerformanceGated` reads the return on the ranges just trained on, which no
    held-out split measures: the history and TensorBoard keep the very value it read."""
    gated = curricula.PerformanceGated(start=0.2, step=0.4, threshold=0.0)
    read = []

    def update(state, results):
        read.append(results["eval_return"])
        return gated.update(state, results)

    spy = curricula.Curriculum(gated.init, update, gated.ranges, gated.params, gated.summary)
    rows = _run(replace(exp, curriculum=spy), compiled, tmp_path, 2)
    assert [r["current"] for r in rows] == read
    scalars = read_scalars(tmp_path)
    logged = scalars[experiment.CURRENT_TAG]
    assert logged == [(256, pytest.approx(read[0])), (512, pytest.approx(read[1]))]
    # and the curriculum's own summary: what it read, its gate, the fraction trained on
    assert [r["curriculum"]["gate/return"] for r in rows] == pytest.approx(read)
    assert [v for _, v in scalars["curriculum/gate/return"]] == pytest.approx(read)
    fractions = [r["curriculum"]["fraction"] for r in rows]
    assert fractions == pytest.approx([0.2, 0.6])  # returns >= 0 always open the gate
    assert [v for _, v in scalars["curriculum/fraction"]] == pytest.approx(fractions)
    # the held-out "train" split is drawn from the whole target, not the ranges trained on
    assert rows[0]["current"] != rows[0]["train"]


def _heatmaps(monkeypatch) -> list[tuple]:
    """(run, step, x name, x units, training box) of every heatmap logged from now on."""
    drawn = []

    def log_heatmap(self, step, x_name, xs, y_name, ys, returns, train_box=None, log_axes=None):
        drawn.append(
            (pathlib.Path(self.logdir).name, step, x_name, self.units.get(x_name), train_box)
        )

    monkeypatch.setattr(RunLogger, "log_heatmap", log_heatmap)
    return drawn


def test_the_heatmap_outlines_the_ranges_trained_on_in_each_segment(
    exp, compiled, tmp_path, monkeypatch
):
    drawn = _heatmaps(monkeypatch)
    _run(exp, compiled, tmp_path / "one", 2)
    assert {d[0] for d in drawn} == {"one"}
    _check_heatmap_boxes(exp, drawn)  # with seeds: test_a_seeded_run_logs_each_seed_...


def _check_heatmap_boxes(exp, drawn) -> None:
    curriculum = exp.curriculum  # LinearWidening: the ranges widen at every segment
    state = curriculum.init(TARGET, defaults=exp.env.default_context())
    trained = {STEPS: curriculum.ranges(state)}
    state = curriculum.update(state, {"eval_return": 0.0, "episode_return": 0.0})
    trained[2 * STEPS] = curriculum.ranges(state)
    assert trained[STEPS].intervals()["gravity"] != trained[2 * STEPS].intervals()["gravity"]
    for run, step, x_name, units, box in drawn:
        spans = trained[step].intervals()
        (g_lo, g_hi), (m_lo, m_hi) = (spans[n] for n in ("gravity", "mass"))
        assert (x_name, units) == ("gravity", "m/s^2"), run  # the aggregate knows units too
        np.testing.assert_allclose(box, [g_lo, g_hi, m_lo, m_hi], rtol=1e-6, err_msg=run)


def test_ctrl_c_keeps_the_checkpoint_and_exits_without_a_traceback(exp, compiled, tmp_path):
    """A process running `experiment.run`, as every script does, stopped with Ctrl-C.
    It runs this module's experiment: the programs the `compiled` fixture built are
    in the suite's compilation cache, so the subprocess loads them."""
    logdir = tmp_path / "run"
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]); import test_runner as t; "
        "from metarl import experiment; "
        "experiment.run(t._experiment(), logdir=sys.argv[2], segments=1000, "
        "steps_per_segment=t.STEPS, seed=0)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(ROOT / "tests"), str(logdir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    deadline = time.time() + 600
    while checkpoint.latest_step(logdir / "checkpoints") is None:
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 130, out[-2000:]
    assert "Traceback" not in out and "KeyboardInterrupt" not in out
    assert "Resume by rerunning the same command" in out
    assert 1 <= checkpoint.latest_step(logdir / "checkpoints") < 1000


def test_the_table_names_held_out_episodes_cut_by_non_finite_physics(capsys):
    row = {"segment": 1, "env_steps": 10, "train_return": [1.0, 2.0], "train": [3.0, 4.0]}
    experiment.print_table([{**row, "nonfinite_episodes": {"train": [0, 0]}}], "logs")
    assert "non-finite" not in capsys.readouterr().out
    cut = {"train": [0, 0], "extrapolation_high": [2, 1]}
    experiment.print_table([{**row, "nonfinite_episodes": cut}], "logs")
    out = capsys.readouterr().out
    assert "cut by non-finite physics" in out and "extrapolation_high 3" in out
    assert "train 0" not in out


def test_evaluation_keys_are_none_of_trainings_keys():
    """``split(k, n)[i]`` is ``fold_in(k, i)``: the held-out sets' key was fold_in(seed
    key, 1), which is training's env key (split_keys(key, 3)[1]), and the evaluation
    key fold_in(seed key, 2) was the curriculum's. The runner's streams now share no
    key with training's, down to the per-env keys and the first segments' keys."""
    data = lambda k: np.asarray(jax.random.key_data(k)).tobytes()  # noqa: E731
    seed = 3
    k_train, k_env, k_cur = ppo.split_keys(ppo.seed_keys(seed), 3)
    training = {data(k) for k in (ppo.seed_keys(seed), k_train, k_env, k_cur)}
    for k in (k_train, k_env, k_cur):
        training |= {data(c) for c in jax.random.split(k, 65)}
        training |= {data(jax.random.fold_in(k, i)) for i in range(8)}  # per-segment keys
    runner = set()
    for stream in (experiment._SETS, experiment._EVAL, experiment._NOW, experiment._PROBE):
        root = experiment._stream(seed, stream)
        runner |= {data(root)} | {data(jax.random.fold_in(root, i)) for i in range(8)}
    probe = jax.random.fold_in(experiment._stream(seed, experiment._PROBE), 1)
    runner |= {data(jax.random.fold_in(probe, i)) for i in range(8)}  # per segment
    assert len(runner) == 44
    assert not runner & training


def test_a_comparison_of_variants_prints_paired_differences_from_the_first(tmp_path, capsys):
    """Seed i of every variant is paired with seed i of the first: their shared
    luck cancels, so a steady gain of 10 shows as an interval without 0 even where
    the variants' own intervals overlap widely."""
    luck = [100.0, 300.0, 200.0, 400.0, 250.0]

    def rows(gain):
        scores = [x + gain + 0.1 * k for k, x in enumerate(luck)]
        return [{"segment": 1, "env_steps": 8, "train_return": scores, "train": scores}]

    results = {"fixed": rows(0.0), "adr": rows(10.0), "same": rows(0.0)}
    experiment.print_comparison(results, tmp_path)
    out = capsys.readouterr().out
    assert "Difference from fixed (mean over seeds, paired by seed" in out
    line = next(x for x in out.splitlines() if x.split()[:2] == ["adr", "+10"])
    assert line.split()[1:] == ["+10", "[10,", "10]"] * 2  # train return, eval train
    same = next(x for x in out.splitlines() if x.split()[:2] == ["same", "+0"])
    assert same.split()[1:] == ["+0", "[0,", "0]"] * 2
    one_seed = {k: [{**r[0], "train_return": 1.0, "train": 1.0}] for k, r in results.items()}
    experiment.print_comparison(one_seed, tmp_path)
    out = capsys.readouterr().out
    assert "Difference from" not in out  # one seed: no interval, and it says so
    assert "No differences between variants: one seed each gives no interval" in out


def test_adaptation_curves_are_compared_episode_by_episode(tmp_path, capsys):
    """An agent that learns within a trial: its later episodes minus its first, and
    each episode against the first variant's, paired by seed. A memory that infers
    the context loses to an oracle in the first episode only, which the trial's
    mean hides (rl2_hidden_context: -11 [-16, -7], then -1 [-3, 2])."""
    luck = [100.0, 300.0, 200.0, 400.0, 250.0]

    def rows(first, later):
        curve = [[x + gain + 0.1 * k for k, x in enumerate(luck)] for gain in (first, later)]
        mean = list(np.mean(curve, axis=0))
        return [{"segment": 1, "env_steps": 8, "train_return": mean, "train": mean,
                 "episodes": curve}]  # fmt: skip

    experiment.print_comparison({"oracle": rows(40.0, 40.0), "gru": rows(30.0, 40.0)}, tmp_path)
    out = capsys.readouterr().out
    assert "gru minus oracle, eval train by episode i of a trial: 1: -10 [-10, -10]  " in out
    assert "2: +0 [0, 0]" in out.split("gru minus oracle")[1].splitlines()[0]
    gru = next(x for x in out.splitlines() if x.startswith("gru adaptation curve"))
    assert gru.endswith("episode i minus episode 1, paired by seed: 2: +10 [10, 10]")
    oracle = next(x for x in out.splitlines() if x.startswith("oracle adaptation curve"))
    assert oracle.endswith("paired by seed: 2: +0 [0, 0]")
    one = [{"segment": 1, "env_steps": 8, "train_return": 1.0, "episodes": [1.0, 2.0]}]
    experiment.print_table(one, tmp_path)  # one seed: the curve, no interval
    out = capsys.readouterr().out
    assert "Adaptation curve (eval train, return of episode i of a trial): 1: 1.0  2: 2.0\n" in out


def test_variants_of_other_seeds_are_not_paired(tmp_path, capsys):
    """Rows record their seeds: runs of seeds 0-4 and 10-14 printed as "paired by seed"
    differences whose pairing meant nothing (a Welch interval of -9 [-18, 0] showed as
    -9 [-14, -3])."""
    scores = [1.0, 2.0, 4.0, 3.0, 5.0]
    row = lambda seeds: [  # noqa: E731
        {"segment": 1, "env_steps": 8, "seeds": seeds, "train_return": scores, "train": scores}
    ]
    results = {"a": row([0, 1, 2, 3, 4]), "b": row([0, 1, 2, 3, 4]), "c": row([10, 11, 12, 13, 14])}
    experiment.print_comparison(results, tmp_path)
    out = capsys.readouterr().out
    assert "Not compared with a (seeds [0, 1, 2, 3, 4]): c (seeds [10, 11, 12, 13, 14])" in out
    diff_lines = [x.strip() for x in out.split("Difference from a")[1].splitlines()]
    assert any(x.startswith("b ") for x in diff_lines)
    assert not any(x.startswith("c ") for x in diff_lines)


def test_variants_trained_for_other_lengths_are_not_paired(tmp_path, capsys):
    """A variant extended to more segments was paired, last row with last row, with
    one that stopped earlier."""
    scores = [1.0, 2.0, 4.0, 3.0, 5.0]
    rows = lambda n: [  # noqa: E731
        {
            "segment": k,
            "env_steps": 8 * k,
            "seeds": [0, 1, 2, 3, 4],
            "train_return": scores,
            "train": scores,
        }
        for k in range(1, n + 1)
    ]
    experiment.print_comparison({"a": rows(2), "b": rows(2), "long": rows(5)}, tmp_path)
    out = capsys.readouterr().out
    said = "Not compared with a (segment 2, 16 env steps): long (segment 5, 40 env steps)"
    assert said in out
    diff_lines = [x.strip() for x in out.split("Difference from a")[1].splitlines()]
    assert any(x.startswith("b ") for x in diff_lines)
    assert not any(x.startswith("long ") for x in diff_lines)


def test_a_numpy_seed_is_recorded_as_the_int_it_is(exp):
    """`for seed in np.arange(n)`: run.json held the seed "1" as text, and a resume or
    load_run with seed=1 was refused as another run."""
    config = rundir.describe_run(exp, None, 1, np.int64(1), STEPS, 3)
    assert config == rundir.describe_run(exp, None, 1, 1, STEPS, 3)
    assert type(config["seed"]) is int


def test_a_field_that_only_chooses_variants_is_not_part_of_a_runs_identity(exp):
    """rl2_hidden_context's --agents: a rerun that added a variant to the logdir was
    refused for the variants already there ("agents: run has ('gru', 'oracle')")."""

    @dataclasses.dataclass(frozen=True)
    class Args(experiment.RunArgs):
        agents: tuple[str, ...] = ("gru",)
        lr: float = 1e-3
        unrecorded = ("agents",)

    one = rundir.describe_run(exp, Args(), 1, 0, STEPS, 3)
    assert "agents" not in one and one["lr"] == 1e-3
    assert one == rundir.describe_run(exp, Args(agents=("gru", "mlp")), 1, 0, STEPS, 3)
    assert one != rundir.describe_run(exp, Args(lr=1e-4), 1, 0, STEPS, 3)


def test_one_heatmap_name_may_be_given_as_a_string():
    """It was read letter by letter: "gm" as the two names 'g' and 'm'."""
    assert experiment.EvalConfig(heatmap="gravity").heatmap == ("gravity",)
    assert experiment.EvalConfig(heatmap="gm") == experiment.EvalConfig(heatmap=("gm",))


def test_a_heatmap_of_a_name_outside_the_target_is_refused_when_the_experiment_is_built(exp):
    """In a comparison, it was refused only once the variants before it had trained."""
    with pytest.raises(ValueError, match=r"eval.heatmap: \['gravty'\] not in the target"):
        replace(exp, eval=experiment.EvalConfig(heatmap=("gravty",)))
    with pytest.raises(ValueError, match="non-empty dict of name -> Experiment"):
        experiment.run_variants({}, logdir=".", segments=1, steps_per_segment=STEPS, seed=0)


def test_a_heatmap_axis_is_never_a_per_element_entry_whose_intervals_differ(exp):
    """An axis sets every element of a name to one value: with the cart's mass trained
    on x0.5-1 and the pole's on x2-4, no point of the envelope x0.5-4 had both inside
    their own interval, and the box outlined there held no trained context. By default
    the heatmap takes the first two names that share one interval; naming such an entry
    is refused, and so is a target of none."""
    mass = C.Scale([0.5, 2.0], [1.0, 4.0], per_element=True)
    target = C.ContextSpace({"mass": mass, "gravity": C.Scale(0.5, 1.5)})
    env = make_contextual("inverted_pendulum", target, episode_length=50)
    built = replace(exp, env=env, target=target)
    assert list(experiment._heatmap_axes(built)) == ["gravity"]
    assert experiment._apart(target) == {"mass": (2,)}  # also logged per element
    with pytest.raises(ValueError, match=r"\['mass'\] train each element on an interval"):
        replace(built, eval=experiment.EvalConfig(heatmap=("mass", "gravity")))
    alone = C.ContextSpace({"mass": mass})
    env = make_contextual("inverted_pendulum", alone, episode_length=50)
    with pytest.raises(ValueError, match=r"every context of the target \(\['mass'\]\)"):
        replace(exp, env=env, target=alone)


def test_variants_whose_held_out_sets_differ_are_not_paired(exp, tmp_path, capsys):
    """The paired difference rests on seed i of two variants scoring the same held-out
    contexts. A variant of another target draws other ones: it was paired all the
    same, its "+x [a, b]" a difference of scores on different contexts."""
    other_curriculum = replace(exp, curriculum=curricula.LinearWidening(0.5, 3))
    wider = C.ContextSpace({"gravity": C.Uniform(5.0, 20.0), "mass": C.Scale(0.5, 2.0)})
    other_target = replace(exp, target=wider)
    assert experiment._same_held_out(exp, other_curriculum, [0, 1])
    assert not experiment._same_held_out(exp, other_target, [0, 1])
    scores = [1.0, 2.0, 4.0, 3.0]
    row = [{"segment": 1, "env_steps": 8, "train_return": scores, "train": scores}]
    experiment.print_comparison({"a": row, "b": row, "wide": row}, tmp_path, ["wide"])
    out = capsys.readouterr().out
    assert "Not compared with a: wide: their held-out sets are not a's" in out
    diff_lines = [x.strip() for x in out.split("Difference from a")[1].splitlines()]
    assert any(x.startswith("b ") for x in diff_lines)
    assert not any(x.startswith("wide") for x in diff_lines)


def test_a_variant_that_may_not_run_stops_the_comparison_before_any_trains(exp, tmp_path):
    """Every variant's logdir is checked before the first trains: a refusal of the
    second once came after the first had trained (and rewritten its run.json)."""
    variants = {"a": exp, "b": exp}
    (tmp_path / "b").mkdir()
    rundir.check_identity(tmp_path / "b", {"seed": 0}, "auto")  # b holds a run
    with pytest.raises(SystemExit, match=r"b already holds a run \(resume='never'\)"):
        experiment.run_variants(
            variants, logdir=tmp_path, segments=1, steps_per_segment=STEPS, seed=0,
            resume="never",
        )  # fmt: skip
    assert not (tmp_path / "a").exists()


def test_a_nan_setting_is_the_same_setting_on_resume(tmp_path):
    # nan != nan: a script field defaulting to NaN once refused every resume as changed
    config = {"seed": 0, "script.min_return": float("nan"), "script.bounds": [1.0, float("nan")]}
    rundir.check_identity(tmp_path, config, "auto")
    rundir.check_identity(tmp_path, dict(config), "auto")  # the same run: accepted
    with pytest.raises(SystemExit, match="script.min_return: run has nan, now 3.0"):
        rundir.check_identity(tmp_path, {**config, "script.min_return": 3.0}, "auto")
    with pytest.raises(SystemExit, match="script.bounds"):
        rundir.check_identity(tmp_path, {**config, "script.bounds": [1.0, 2.0]}, "auto")


def test_the_same_xla_flags_in_another_order_are_the_same_platform(tmp_path, monkeypatch):
    """XLA reads XLA_FLAGS as a set of flags, the last of a repeated one winning: the
    runner compared the string, so the same flags in another order needed --resume
    force and were recorded as a change of platform. Another value still refuses."""
    flags = ["--xla_cpu_enable_fast_math=false", "--xla_backend_optimization_level=1"]
    monkeypatch.setenv("XLA_FLAGS", " ".join(flags))
    rundir.check_identity(tmp_path, {"seed": 0}, "auto")
    # reordered, and one flag given twice with the value that wins anyway
    monkeypatch.setenv("XLA_FLAGS", f"{flags[1]} --xla_cpu_enable_fast_math=true {flags[0]}")
    record = rundir.check_identity(tmp_path, {"seed": 0}, "auto")
    assert record["forced"] == [] and record["platform_before"] == []
    for other in (f"{flags[0]} {flags[1]} --xla_cpu_enable_fast_math=true", flags[0]):
        monkeypatch.setenv("XLA_FLAGS", other)
        with pytest.raises(SystemExit, match=rf"platform\.XLA_FLAGS: run has .*, now '{other}'"):
            rundir.check_identity(tmp_path, {"seed": 0}, "auto")
    assert provenance.xla_flags('--a --b="x y" --a=1') == {"--b": "x y", "--a": "1"}


def test_a_resume_may_change_the_stocks_depth_but_not_the_rest_of_ppo(tmp_path):
    """`ppo.stock_depth` changes speed and memory, not one number of the run (tests/
    test_ppo.py resumes a checkpoint into a shallower stock): a resume on a device
    with less memory may pick another. Any other PPO field would mix two runs."""
    config = {"seed": 0, "ppo.stock_depth": None, "ppo.unroll_length": 16}
    rundir.check_identity(tmp_path, config, "auto")
    record = rundir.check_identity(tmp_path, {**config, "ppo.stock_depth": 4}, "auto")
    assert record["forced"] == []
    assert record["config_before"] == [{"ppo.stock_depth": None}]  # to float rounding after
    refusal = r"(?s)ppo\.unroll_length: run has 16, now 8.*cannot be forced"
    with pytest.raises(SystemExit, match=refusal):
        rundir.check_identity(tmp_path, {**config, "ppo.unroll_length": 8}, "force")


@pytest.mark.parametrize("kind", ["truncated-normal target", "adr"])
def test_a_second_run_and_its_resume_compile_nothing(kind, tmp_path):
    """With the experiment compiled (and warmed by a first run), a run and its resume
    compile nothing between segments either: the curriculum's draws, the held-out sets
    and a restored state (once: a TruncatedNormal's draws outside jit compiled at every
    draw, and a restored ADR key, committed to its device, compiled ADR's draws again)."""
    if kind == "adr":
        target = TARGET
        curriculum = curricula.ADR(
            start=0.2, delta=0.1, low_threshold=2.0, high_threshold=8.0, buffer_size=1
        )
    else:
        target = C.ContextSpace(
            {"gravity": C.TruncatedNormal(9.8, 2.0, 5.0, 15.0), "mass": C.Scale(0.5, 2.0)}
        )
        curriculum = curricula.LinearWidening(start=0.2, segments=2)
    exp = experiment.Experiment(
        env=make_contextual("inverted_pendulum", target, episode_length=10),
        target=target,
        curriculum=curriculum,
        ppo=ppo.PPOConfig(
            num_envs=16, unroll_length=8, num_minibatches=2, policy_hidden=(16,), value_hidden=(16,)
        ),
        eval=experiment.EvalConfig(contexts=2, episodes=1, heatmap_points=2),
    )
    compiled = experiment.compile_experiment(exp)
    kw = dict(steps_per_segment=512, seed=0, compiled=compiled, progress=False, table=False)
    experiment.run(exp, logdir=tmp_path / "first", segments=3, **kw)
    with count_compilations() as again:
        experiment.run(exp, logdir=tmp_path / "second", segments=2, **kw)
    with count_compilations() as resumed:
        experiment.run(exp, logdir=tmp_path / "second", segments=3, **kw)
    assert (again.count, resumed.count) == (0, 0)


def test_a_table_over_seeds_keeps_its_columns_aligned(capsys):
    """A cell such as "1234 [no CI: 3 seeds]" overflowed the 15-character columns."""
    scores = [1234.0, 1235.0, 1236.0]
    row = {"segment": 1, "env_steps": 8, "train_return": scores, "train": scores}
    experiment.print_table([row], "logs")
    lines = capsys.readouterr().out.splitlines()
    header, cells = lines[1], lines[2]
    assert "1235 [no CI: 3 seeds]" in cells
    assert len(header) == len(cells)
    columns = len(experiment._columns(3))
    width = (len(header) + 1) // columns  # a column and its separating space
    for line in (header, cells):  # every column right-aligned, ending at its place
        assert len(line) == columns * width - 1, line
        assert all(line[k * width + width - 2] != " " for k in range(columns)), line
        assert all(line[k * width + width - 1] == " " for k in range(columns - 1)), line


@pytest.mark.parametrize("seeds", [1, 2, 4])
def test_the_probe_table_keeps_its_columns_aligned(seeds):
    """The probe's cells ("-1.15 [no CI: 2 seeds]") overflowed the main table's 15 and
    21-character columns with 1 to 3 seeds."""
    from metarl.tensorboard import probe_tag

    def v(x):
        return x if seeds == 1 else [x + 0.01 * i for i in range(seeds)]

    probe = {
        probe_tag(s, w): v(-1.15 if w == "r2" else 12.5)
        for s in ("train", "interpolation")
        for w in ("r2", "rmse")
    }
    row = {"segment": 1, "env_steps": 256, "seeds": list(range(seeds)), "probe": probe}
    header, *lines = experiment._probe_lines([row])[1:]
    assert len(lines) == 2 and "-1.15" in lines[0]
    width = (len(header) + 1) // 5  # label, segment, env steps and the two splits
    for line in (header, *lines):  # every column right-aligned, ending at its place
        assert len(line) == len(header), line
        assert all(line[k * width + width - 2] != " " for k in range(1, 5)), line
        assert all(line[k * width + width - 1] == " " for k in range(4)), line


def test_load_run_reads_back_the_policies_a_run_trained_and_started_from(exp, compiled, tmp_path):
    rows = _run(exp, compiled, tmp_path, 2)
    loaded = experiment.load_run(exp, logdir=tmp_path, seed=0, compiled=compiled)
    assert (loaded.segments, loaded.env_steps, loaded.seeds) == (2, rows[-1]["env_steps"], [0])
    # the loaded policy scores what the run logged for its last segment, bit for bit
    key = jax.random.fold_in(experiment._stream(0, experiment._EVAL), 1)
    held = experiment.held_out_sets(exp, 0)["train"]
    score = compiled.evaluator.evaluate(loaded.policies[0], held, key)
    assert float(np.nanmean(score.mean)) == rows[-1]["train"]
    # the initial policy holds the parameters the run started from
    k_train = ppo.split_keys(ppo.seed_keys(0), 3)[0]
    start = ppo.init_training_state(compiled.space, k_train).params
    same = jax.tree.map(np.array_equal, to_numpy(start), to_numpy(loaded.initial[0].params))
    assert all(jax.tree.leaves(same))
    moved = jax.tree.map(np.array_equal, to_numpy(start), to_numpy(loaded.policies[0].params))
    assert not all(jax.tree.leaves(moved))
    earlier = experiment.load_run(exp, logdir=tmp_path, seed=0, compiled=compiled, segment=1)
    assert (earlier.segments, earlier.env_steps) == (1, rows[0]["env_steps"])
    with count_compilations() as compiles:  # said before its programs are built
        with pytest.raises(FileNotFoundError, match=r"step 7 .*available steps: \[1, 2\]"):
            experiment.load_run(exp, logdir=tmp_path, seed=0, segment=7)
        with pytest.raises(ValueError, match=r"step must be an integer >= 0, got -1"):
            experiment.load_run(exp, logdir=tmp_path, seed=0, segment=-1)
    assert compiles.count == 0
    # another experiment's structure or config is refused, naming the field
    other = replace(exp, ppo=replace(CONFIG, learning_rate=1e-4))
    with pytest.raises(ValueError, match=r"(?s)another experiment.*ppo\.learning_rate"):
        experiment.load_run(other, logdir=tmp_path, seed=0)
    with pytest.raises(ValueError, match=r"(?s)another experiment.*seed: run has 0, now 1"):
        experiment.load_run(replace(exp, ppo=replace(CONFIG, seed=1)), logdir=tmp_path, seed=1)
    with pytest.raises(ValueError, match="holds no run.json"):
        experiment.load_run(exp, logdir=tmp_path / "nothing", seed=0, compiled=compiled)
    # other evaluation settings draw other held-out sets: refused where the analysis
    # needs the run's own (probe_memory, steer_memory)
    wider = replace(exp, eval=replace(exp.eval, extrapolation_factor=3.0))
    with pytest.raises(ValueError, match=r"(?s)another experiment.*eval\.extrapolation_factor"):
        experiment.load_run(wider, logdir=tmp_path, seed=0, eval_as_run=True)


def test_a_segment_trains_whole_iterations_and_says_so(exp, capsys):
    """A segment trains whole PPO iterations: `--steps-per-segment 100` with a batch
    of 128 trained 128 steps (quickstart's 60,000: 61,440) without a word."""
    assert experiment._note_whole_iterations(exp, STEPS) == STEPS  # 2 iterations of 128
    assert capsys.readouterr().err == ""
    assert experiment._note_whole_iterations(exp, STEPS - 28) == STEPS
    assert "each segment trains 2 iterations, 256 steps" in capsys.readouterr().err
