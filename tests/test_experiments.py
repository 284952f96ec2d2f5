"""The experiment scripts: the quickstart end to end, killed mid-run and resumed,
with every tag of the TensorBoard naming scheme in its event files."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time
import types
from dataclasses import replace

import jax
import numpy as np
import pytest
import tyro
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from metarl import checkpoint, experiment
from metarl.compilation import count_compilations

ROOT = pathlib.Path(__file__).resolve().parents[1]
TINY = ["--segments", "3", "--widening-segments", "2", "--steps-per-segment", "2048", "--seed", "1"]
TINY_PPO = ["--ppo.num-envs", "32", "--eval.contexts", "4", "--eval.episodes", "1"]


def _quickstart(logdir, *extra):
    cmd = [sys.executable, str(ROOT / "experiments" / "quickstart.py"), "--logdir", str(logdir)]
    return subprocess.Popen(
        cmd + TINY + TINY_PPO + list(extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )


def test_quickstart_resumes_after_a_kill_and_logs_every_tag(tmp_path):
    logdir = tmp_path / "run"
    first = _quickstart(logdir)
    deadline = time.time() + 600
    while checkpoint.latest_step(logdir / "checkpoints") is None:
        assert first.poll() is None, first.stdout.read()[-3000:]
        assert time.time() < deadline, "no checkpoint within 10 minutes"
        time.sleep(0.5)
    first.send_signal(signal.SIGKILL)
    first.wait()
    killed_at = checkpoint.latest_step(logdir / "checkpoints")
    assert killed_at < 3  # killed mid-run

    second = _quickstart(logdir)
    out, _ = second.communicate(timeout=900)
    assert second.returncode == 0, out[-3000:]
    assert f"Resuming {logdir} after segment {killed_at}" in out
    assert "tensorboard --logdir" in out
    assert checkpoint.latest_step(logdir / "checkpoints") == 3

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "histograms": 0, "images": 0})
    acc.Reload()
    tags = acc.Tags()
    scalars = set(tags["scalars"])
    for tag in [
        "train/return",
        "perf/env_steps_per_sec",
        "eval/train/return",
        "eval/interpolation/return",
        "eval/extrapolation/return",
        "eval/generalization_gap",
        "eval/interpolation_gap",
        "curriculum/gravity/low",
        "curriculum/gravity/high",
        "curriculum/mass/low",
        "curriculum/mass/high",
    ]:
        assert tag in scalars, (tag, sorted(scalars))
    assert {"context/gravity", "context/mass"} <= set(tags["histograms"])
    assert "eval/heatmap" in tags["images"]
    # One value per segment, none lost or duplicated by the kill: steps strictly increase.
    steps = [e.step for e in acc.Scalars("eval/extrapolation/return")]
    assert len(steps) == 3 and steps == sorted(set(steps))
    # The curriculum widens gravity's range segment after segment.
    lows = [e.value for e in acc.Scalars("curriculum/gravity/low")]
    assert lows[0] > lows[-1] == 5.0


TEN_SEEDS = """
import sys, jax, numpy as np
sys.path.insert(0, sys.argv[1])
import quickstart
from metarl import contexts as C
from metarl.agents import ppo
from metarl.envs import make_contextual
env = make_contextual("inverted_pendulum", C.ContextSpace({"gravity": C.Uniform(5.0, 15.0)}))
space = ppo.make_train_space(env, quickstart.Config().ppo, num_seeds=10)
k_train, k_env, _ = ppo.split_keys(ppo.seed_keys(0, 10), 3)
ts = ppo.init_training_state(space, k_train)
flat = np.concatenate([np.asarray(x).reshape(10, -1) for x in jax.tree.leaves(ts.params)], 1)
print(len({row.tobytes() for row in flat}), bool(np.isfinite(flat).all()))
"""


def test_ten_seeds_of_the_quickstart_agent_initialise_without_hanging():
    # `quickstart.py --num-seeds 10` once hung for good: a vmapped (batched) QR in
    # the recurrent cores' initialiser deadlocked XLA's CPU thread pool. The
    # initialiser of its agent, batched over 10 seeds, in a process of its own
    # (a hang fails on the timeout); test_runner.py runs seeded experiments whole.
    out = subprocess.run(
        [sys.executable, "-c", TEN_SEEDS, str(ROOT / "experiments")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["10", "True"]  # ten distinct, finite initialisations


def _script(name: str):
    sys.path.insert(0, str(ROOT / "experiments"))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(ROOT / "experiments"))


def test_rl2_hidden_context_takes_its_flags_for_the_variant_they_fit():
    """--ppo.reset-every-episode was refused while parsing (the config it set was
    the mlp's, which has nothing to reset): it is the gru's ablation, and the mlp
    variant keeps no memory whatever the flags. The oracle is the mlp observing
    the context."""
    rl2 = _script("rl2_hidden_context")
    cfg = tyro.cli(rl2.Config, args=["--ppo.reset-every-episode", "--ppo.hidden-size", "16"])
    variants = rl2.variants(cfg)
    mlp, gru = (variants[k].ppo for k in ("mlp", "gru"))
    assert (gru.core, gru.rl2_inputs, gru.reset_every_episode, gru.hidden_size) == (
        "gru", True, True, 16
    )  # fmt: skip
    assert (mlp.core, mlp.rl2_inputs, mlp.reset_every_episode) == ("mlp", False, False)
    assert {f: getattr(mlp, f) for f in ("num_envs", "learning_rate", "seed")} == {
        f: getattr(gru, f) for f in ("num_envs", "learning_rate", "seed")
    }
    with pytest.raises(SystemExit, match="set by each variant"):
        rl2.variants(tyro.cli(rl2.Config, args=["--ppo.no-rl2-inputs"]))
    # the memory probe runs on the gru alone, the memoryless variants having none
    assert [variants[k].eval.probe for k in ("gru", "mlp", "oracle")] == [4, 0, 0]
    assert variants["mlp"].eval == replace(variants["gru"].eval, probe=0)
    # --agents runs a subset, each variant as in the whole comparison
    (alone,) = rl2.variants(replace(cfg, agents=("gru",))).values()
    assert (alone.ppo, alone.eval) == (variants["gru"].ppo, variants["gru"].eval)
    with pytest.raises(SystemExit, match=r"--agents: \['lstm'\]; choose among"):
        rl2.variants(tyro.cli(rl2.Config, args=["--agents", "gru", "lstm"]))
    # the gru's own flags without a gru to run: refused (the memoryless variants set
    # them back, and the run was the same, silently)
    for flag in (["--ppo.hidden-size", "16"], ["--ppo.reset-every-episode"], ["--eval.probe", "8"]):
        with pytest.raises(SystemExit, match=f"{flag[0]} set the gru's config alone"):
            rl2.variants(tyro.cli(rl2.Config, args=["--agents", "mlp", "oracle", *flag]))
    # the analysis scripts read the gru (and the oracle) whatever --agents says: refused
    probe_memory, steer_memory = _script("probe_memory"), _script("steer_memory")
    with pytest.raises(SystemExit, match=r"--agents mlp leaves out gru"):
        probe_memory.main(tyro.cli(probe_memory.Config, args=["--agents", "mlp"]))
    with pytest.raises(SystemExit, match=r"reads the run's gru and oracle .* leaves out oracle"):
        steer_memory.main(tyro.cli(steer_memory.Config, args=["--agents", "gru"]))
    # their own flags, refused before the run is loaded (--ridge -1 failed after the
    # first seed's memory was recorded; --strength -3 ran, its rows' labels swapped)
    for script, field, value in (
        (probe_memory, "fit_contexts", 0),
        (probe_memory, "fit_trials", 0),
        (probe_memory, "ridge", -1.0),
        (steer_memory, "ridge", float("nan")),
        (steer_memory, "strength", -3.0),
        (steer_memory, "strength", 0.0),
    ):
        with pytest.raises(ValueError, match=f"^--{field.replace('_', '-')} must be"):
            script.Config(**{field: value})
    # The oracle: the mlp's config on the same task, observing the motor gain it is
    # drawn with (the last observation entry), which the other two never see.
    oracle = variants["oracle"]
    assert oracle.ppo == mlp and oracle.target == variants["mlp"].target
    hidden, seen = variants["mlp"].env, oracle.env
    assert (hidden.visible_context, seen.visible_context) == (False, True)
    state = jax.jit(jax.vmap(seen.reset))(jax.random.split(jax.random.key(0), 64))
    gain = np.asarray(state.info["context"]["actuator_gain"]).reshape(64)
    obs = np.asarray(state.obs)
    assert obs.shape[-1] == hidden.observation_size + 1
    assert len(np.unique(gain)) == 4  # every sign and strength drawn
    for g in np.unique(gain):  # one observed value per drawn gain, a different one each
        assert len(np.unique(obs[gain == g, -1])) == 1
    assert len(np.unique(obs[:, -1])) == 4


def test_random_contexts_lists_each_episode_with_the_context_it_ran_in(capsys):
    # Every episode draws a new context: the rows of one env must show the gravity
    # each of its episodes ran in (distinct draws, within the space), not the first
    # reset's gravity next to every episode's return.
    random_contexts = _script("random_contexts")
    random_contexts.main(random_contexts.Config(num_envs=2, steps=60, episodes_shown=3))
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    episodes = [r for r in rows if r[0] == "0" and r[2] != "episodes"]
    gravities = [float(r[2]) for r in episodes]
    assert len(gravities) == 3 and len(set(gravities)) == 3, rows
    assert all(5.0 <= g <= 15.0 for g in gravities)
    # a negative count listed all but the last episodes; no env divided by zero
    for field, value in (("episodes_shown", -1), ("num_envs", 0), ("steps", 0)):
        with pytest.raises(ValueError, match=f"--{field.replace('_', '-')} must be >="):
            random_contexts.Config(**{field: value})
    # seed 2**32 printed seed 0's table (jax.random.key keeps 32 bits)
    with pytest.raises(ValueError, match=r"--seed: seed 4294967296 outside 0\.\.4294967295"):
        random_contexts.Config(seed=2**32)


def test_steer_memorys_escaped_share_reads_the_steps_of_the_trial_alone(monkeypatch):
    """The share of envs whose memory left [-10, 10] at some step of their trial: a step
    after the trial ended (the next trial's, after an auto-reset) is not the trial's.
    Until 2026-12-07 it counted."""
    steer_memory = _script("steer_memory")
    features = np.full((3, 4, 2), 0.5)
    episode = np.array([[0, 0, 1, -1], [0, 0, 1, 1], [0, 1, -1, -1]])
    features[0, 3] = 50.0  # env 0: only after its trial
    features[1, 2, 1] = -50.0  # env 1: in its trial
    features[2, 2:] = np.nan  # env 2: non-finite only after its trial
    memory = types.SimpleNamespace(features=features, episode=episode)
    monkeypatch.setattr(steer_memory.P, "record_memory", lambda *args: memory)
    assert steer_memory._escaped(None, None, None, None) == pytest.approx(1 / 3)
    features[2, 1, 0] = np.inf  # in its trial: escaped
    assert steer_memory._escaped(None, None, None, None) == pytest.approx(2 / 3)


def test_probe_memory_and_steer_memory_read_the_rl2_runs_gru(tmp_path):
    """probe_memory trains nothing: it probes the GRU rl2_hidden_context trained (here
    its gru variant alone, tiny), for each seed, trained and at its initial parameters
    (on the trained observation normalizer, and with the initial one too), at the
    segment `--segments` names. steer_memory, with the oracle run too, evaluates the
    GRU with its memory steered."""
    probe_memory = _script("probe_memory")
    rl2 = sys.modules["rl2_hidden_context"]
    args = ["--logdir", str(tmp_path), "--num-seeds", "2", "--segments", "1"]
    args += ["--steps-per-segment", "160", "--ppo.num-envs", "16", "--ppo.unroll-length", "5"]
    args += ["--ppo.num-minibatches", "2", "--eval.contexts", "2", "--eval.episodes", "3"]
    args += ["--eval.probe", "0"]  # the scripts probe; the run's own probe: test_runner.py
    # the fit's recordings the size of the evaluation's (2 envs): one program for both
    fit = ["--fit-contexts", "2", "--fit-trials", "1"]
    cfg = tyro.cli(probe_memory.Config, args=[*args, *fit])
    with pytest.raises(ValueError, match="holds no run.json"):
        probe_memory.main(cfg)
    run_cfg = tyro.cli(rl2.Config, args=args)
    gru = rl2.variants(run_cfg)["gru"]
    experiment.run(
        gru, **run_cfg.run_kwargs() | {"logdir": tmp_path / "gru"}, hparams=run_cfg,
        progress=False, table=False,
    )  # fmt: skip
    # its keys are none its run drew from: the run's split of key(seed), its streams
    run_keys = [*jax.random.split(jax.random.key(0), 3), jax.random.key(0)]
    run_keys += [experiment._stream(0, s) for s in range(1, experiment._ANALYSIS)]
    run_keys += [jax.random.fold_in(experiment._stream(0, experiment._PROBE), i) for i in (0, 1)]
    data = {jax.random.key_data(k).tobytes() for k in run_keys}
    assert len(data) == len(run_keys)
    assert not data & {jax.random.key_data(k).tobytes() for k in probe_memory.keys(0)}
    fit_keys = jax.random.split(jax.random.key(probe_memory.fit_seed(0)), 2)  # its contexts'
    assert not data & {jax.random.key_data(k).tobytes() for k in fit_keys}
    with pytest.raises(ValueError, match=r"(?s)another experiment.*eval\.contexts: run has 2"):
        probe_memory.main(tyro.cli(probe_memory.Config, args=[*args, "--eval.contexts", "3"]))
    longer = ["--steps-per-segment", "320"]  # segment 1 of another budget: another agent
    with pytest.raises(ValueError, match=r"(?s)another experiment.*steps_per_segment: run has 160"):
        probe_memory.main(tyro.cli(probe_memory.Config, args=[*args, *longer]))
    with pytest.raises(FileNotFoundError, match=r"step 2 .*available steps: \[1\]"):
        probe_memory.main(tyro.cli(probe_memory.Config, args=[*args, "--segments", "2"]))
    out = probe_memory.main(cfg)
    written = json.loads((tmp_path / "probe_memory.json").read_text())
    assert written == json.loads(json.dumps(out))
    assert written["seeds"] == [0, 1]
    assert set(written["splits"]) >= {"train", "interpolation", "extrapolation_low"}
    episodes = written["splits"]["train"]
    kinds = ("trained", "initial", "as_initialised")
    steps = [episodes.pop(f"by_step_r2_{k}") for k in kinds]
    assert [np.shape(s) for s in steps] == [(2, 90)] * 3  # seeds, 3 episodes of 30
    assert list(episodes) == ["episode_1", "episode_2", "episode_3"]
    for values in episodes.values():
        assert set(values) == {f"{m}_{k}" for m in ("r2", "rmse", "bias") for k in kinds}
        assert all(len(v) == 2 and np.all(np.isfinite(v)) for v in values.values())
        assert values["rmse_trained"] != values["rmse_initial"]  # two different memories
        # the same initial parameters on other inputs: the trained normalizer reaches them
        assert values["rmse_initial"] != values["rmse_as_initialised"]

    steer_memory = _script("steer_memory")
    steer_cfg = tyro.cli(steer_memory.Config, args=[*args, *fit])
    with count_compilations() as compiles, pytest.raises(ValueError, match="holds no run.json"):
        steer_memory.main(steer_cfg)  # no oracle run yet: refused before the gru's loads
    assert compiles.count == 0
    experiment.run(
        rl2.variants(run_cfg)["oracle"], **run_cfg.run_kwargs() | {"logdir": tmp_path / "oracle"},
        hparams=run_cfg, progress=False, table=False,
    )  # fmt: skip
    steered = steer_memory.main(steer_cfg)
    assert json.loads((tmp_path / "steer_memory.json").read_text()) == json.loads(
        json.dumps(steered)
    )
    returns = steered["returns"]
    assert list(returns) == ["plain", "steered", "control", "reversed", "readout", "oracle"]
    assert np.shape(returns["plain"]["train"]) == (2, 4)  # seeds, (return, 3 episodes)
    assert returns["reversed"] != returns["plain"]  # the edits reach the actions
    for condition, splits in returns.items():
        assert all(np.all(np.isfinite(v)) for v in splits.values()), condition
    escaped = steered["escaped"]  # the share of envs whose memory left [-10, 10]
    assert list(escaped) == ["plain", "steered", "control", "reversed", "readout"]
    assert all(v == [0.0, 0.0] for v in escaped["plain"].values())  # a GRU's state: [-1, 1]
    assert all(0 <= x <= 1 for splits in escaped.values() for v in splits.values() for x in v)
    geometry = steered["geometry"]
    assert all(0 <= c <= 1 for c in geometry["cosine"])
    assert all(e >= r > 0 for e, r in zip(geometry["encoding_move"], geometry["readout_move"]))
