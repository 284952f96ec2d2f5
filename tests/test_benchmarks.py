"""The benchmark scripts' own logic (their timings run on demand, not here)."""

import dataclasses
import importlib.util
import inspect
import json
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats
from brax import envs as brax_envs
from conftest import BENCHMARKS
from conftest import load_benchmark as _load

from metarl.envs import make_contextual


def test_the_reproducibility_digest_reads_results_and_not_times():
    """Two identical runs differ only in their wall times: `compile_seconds`, added to
    the metrics after the digest was written, made every digest differ, so the script
    could never report a reproducible run."""
    repro = _load("reproducibility")
    tree = {"w": np.arange(4, dtype=np.float32)}

    def metrics(ret, speed, compile_s):
        return [{"episode_return": ret, "env_steps_per_sec": speed, "compile_seconds": compile_s}]

    digest = repro._digest(tree, metrics(1.0, 100.0, 3.0), np.float32(2.0))
    assert repro._digest(tree, metrics(1.0, 250.0, 0.4), np.float32(2.0)) == digest
    assert repro._digest(tree, metrics(1.5, 100.0, 3.0), np.float32(2.0)) != digest
    assert repro._digest(tree, metrics(1.0, 100.0, 3.0), np.float32(2.5)) != digest


def test_the_reproducibility_speeds_favour_no_setting_under_drift(monkeypatch):
    """The settings' processes ran in one order, the first setting always first: with
    the machine 1% slower at each process started, two identical settings read 1%
    apart. The order rotates with k, and each setting's steps/s is compared with the
    first's process by process (a geometric mean with its t interval)."""
    repro = _load("reproducibility")
    order = []

    def run(cfg, setting, k):
        order.append(setting)
        return {"digest": "d", "steps_per_sec": 1000.0 - 10 * len(order), "eval_return": 1.0}

    monkeypatch.setattr(repro, "run_process", run)
    summary = repro.main(repro.Config(processes=4, settings=("a", "b")))
    assert order == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert summary["a"]["steps_per_sec"] == summary["b"]["steps_per_sec"]
    assert summary["a"]["ratio"] == summary["a"]["ratio_ci_low"] == 1.0
    b = summary["b"]
    assert b["ratio_ci_low"] < 1.0 < b["ratio_ci_high"] and b["ratio"] == pytest.approx(1, abs=1e-3)


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            {"variants": ("ablate_nofence",)},
            r"unknown \['ablate_nofence'\]; choose among .*ablate_",
        ),
        ({"variants": ("bogus",)}, r"unknown \['bogus'\]; choose among plain, brax_dr, contextual"),
        (
            {"envs": ("hopper", "nosuchenv")},
            r"unknown Brax env \['nosuchenv'\]; valid names: .*ant",
        ),
        ({"backend": "nosuch"}, r"--backend 'nosuch': choose one of generalized, mjx"),
    ],
)
def test_unknown_names_are_refused_with_the_choices_before_anything_compiles(flags, message):
    """An unknown env name used to fail deep inside Brax with a bare KeyError."""
    bench = _load("env_throughput")
    with pytest.raises(ValueError, match=message):
        bench.Config(**flags)
    for variant in ("ablate_noreset:dense", "contextual_stock", "brax_dr_every", "contextual"):
        bench.Config(variants=(variant,))  # every documented variant is accepted


@pytest.mark.parametrize("script", ["reset_cost", "reset_compile"])
def test_the_reset_benchmarks_refuse_unknown_envs_and_backends_too(script):
    """They build Brax envs by name as env_throughput does, through one `_cli.check_envs`."""
    bench = _load(script)
    with pytest.raises(ValueError, match=r"unknown Brax env \['hoppr'\]; valid names: .*hopper"):
        bench.Config(envs=("hoppr",))
    with pytest.raises(ValueError, match=r"--backend 'mxj': choose one of generalized, mjx"):
        bench.Config(backend="mxj")
    bench.Config(envs=("hopper",), backend="mjx")


def test_the_profile_counts_the_operations_a_loop_runs_and_not_the_loop():
    """A loop is recorded as one span around its operations' spans: counting both
    counted the loop's work twice (MJX's solver loop, 140 ms of ant's 1,400)."""
    bench = _load("env_throughput")
    f = jax.jit(lambda x, n: jax.lax.fori_loop(0, n, lambda i, x: jnp.tanh(x @ x), x))
    x = jnp.ones((64, 64)) / 64
    ops = bench._op_times(f.lower(x, 7).compile(), x, 7)
    assert ops and not any(name.startswith(("while", "conditional")) for name in ops), ops
    # the body's operations ran 7 times, the loop's condition 8 (the loop itself not at all)
    runs = {n for _, n in ops.values()}
    assert 7 in runs and max(runs) <= 8, ops


def test_the_profile_counts_the_programs_operations_whatever_python_is_called(tmp_path):
    """Every operation the profile counts is an instruction of the program. Python's own
    thread was told apart by its name, "python": started as `python3` (as gpu_run.sh
    does), its calls, `stop_trace` among them (0.34 s), counted as operations run once."""
    python3 = tmp_path / "python3"
    python3.symlink_to(sys.executable)
    script = (
        "import json, sys, jax, jax.numpy as jnp; sys.path.insert(0, sys.argv[1]); "
        "import test_benchmarks as t; bench = t._load('env_throughput'); "
        "f = jax.jit(lambda x: jax.lax.fori_loop(0, 3, lambda i, x: jnp.tanh(x @ x), x)); "
        "c = f.lower(jnp.ones((64, 64))).compile(); "
        "print(json.dumps({'ops': list(bench._op_times(c, jnp.ones((64, 64)))), "
        "'hlo': c.as_text()}))"
    )
    out = subprocess.run(  # a link outside the virtual environment: its packages by path
        [str(python3), "-c", script, str(Path(__file__).parent)],
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    names = set(re.findall(r"%?([\w.-]+) = ", found["hlo"]))
    assert found["ops"] and set(found["ops"]) <= names, set(found["ops"]) - names


def test_the_profile_leaves_out_the_untimed_start(tmp_path):
    """A rollout's first state is made before the trace starts: dispatched
    asynchronously, a stock's first fill ran inside the trace and was counted as the
    rollout's own work."""
    bench = _load("env_throughput")
    spd = jnp.eye(256) * 256 + jnp.ones((256, 256))

    def start(key):  # slow, and made of operations the rollout never runs
        body = lambda i, a: jnp.linalg.cholesky(a + i) @ jnp.linalg.cholesky(a).T  # noqa: E731
        return jax.lax.fori_loop(0, 200, body, spd + jax.random.uniform(key))

    key = jax.random.key(0)
    run = jax.jit(lambda key, s: jax.lax.fori_loop(0, 3, lambda i, s: jnp.tanh(s @ s), s))
    run = run.lower(key, spd).compile()
    ops = bench._rollout_ops(bench._Rollout(jax.jit(start), run), key, keep=tmp_path / "t")
    assert any(n == 3 for _, n in ops.values()), ops  # the rollout's own operations
    assert not any("cholesky" in name for name in ops), ops
    # the raw trace is kept where asked, and reads back as the same operations
    (kept,) = (tmp_path / "t").rglob("*.xplane.pb")
    again = jax.profiler.ProfileData.from_file(str(kept))
    names = {e.name for p in again.planes for line in p.lines for e in line.events}
    assert set(ops) <= names, set(ops) - names
    with pytest.raises(ValueError, match="add --profile"):
        bench.main(bench.Config(trace_dir=str(tmp_path)))
    with pytest.raises(ValueError, match="--profile-rounds 2: .* with --profile only"):
        bench.main(bench.Config(profile_rounds=2))
    with pytest.raises(ValueError, match="--profile-rounds must be >= 1"):
        bench.Config(profile=True, profile_rounds=0)


def test_the_profile_splits_the_time_by_stage():
    """Each operation counts in the stage of the innermost named scope its instruction
    records: MJX's stages by their exact names (JAX's `jnp.linalg.solve`, recorded as
    "jit(solve)", is not MJX's solver), metarl's resets in any wrapper, even around
    MJX's stages; the rest, and an operation of no instruction, in `REST`."""
    bench = _load("env_throughput")
    text = "\n".join(
        [
            '  %fusion.1 = f32[2]{0} fusion(%p), metadata={op_name="jit(run)/forward/solve/mul"}',
            '  %dot.2 = f32[2]{0} dot(%a, %b), metadata={op_name="jit(run)/vmap(jit(_fresh))/'
            'forward/solve/dot_general"}',
            '  %lu.3 = f32[2]{0} custom-call(%a), metadata={op_name="jit(run)/jit(solve)/lu"}',
            "  ROOT %tuple.4 = (f32[2]{0}) tuple(%fusion.1)",
        ]
    )
    stages = bench._stages(text)
    assert stages == {
        "fusion.1": "solver",
        "dot.2": "resets",
        "lu.3": bench.REST,
        "tuple.4": bench.REST,
    }
    ops = {"fusion.1": (0.002, 4), "dot.2: gemm_kernel": (0.001, 1), "memcpy": (0.003, 2)}
    assert bench._by_stage(ops, stages, steps=2) == pytest.approx(
        {"solver": 1.0, "resets": 0.5, bench.REST: 1.5}
    )

    # a real program: its operations' time all lands in a stage, the scoped ones in theirs
    def _fresh(x):
        return jnp.tanh(x @ x.T)

    def program(x):
        with jax.named_scope("fwd_position"):
            y = jnp.cos(x @ x)
        return jax.vmap(jax.jit(_fresh))(y[None])[0].sum() + jnp.linalg.solve(y, x).sum()

    x = jnp.eye(128) + jnp.ones((128, 128)) / 128
    compiled = jax.jit(program).lower(x).compile()
    ops = bench._op_times(compiled, x)
    split = bench._by_stage(ops, bench._stages(compiled.as_text()), steps=1)
    assert split["position"] > 0 and split["resets"] > 0, split
    assert sum(split.values()) == pytest.approx(sum(t for t, _ in ops.values()) * 1e3)
    # traced in rounds: medians, the total's spread, every stage kept
    key = jax.random.key(0)
    run = jax.jit(lambda key, x: program(x)).lower(key, x).compile()
    runs = {"a": bench._Rollout(jax.jit(lambda key: x), run)}
    runs["b"] = runs["a"]
    result = {"a": {}, "b": {}}
    bench._print_profile(result, runs, steps=1, traces=None, rounds=3)
    for label in runs:
        ms = result[label]["op_ms_per_step"]
        assert ms["total_min"] <= ms["total"] <= ms["total_max"], ms
        # every operation's runs, per step (steps=1: each ran at least once)
        assert ms["launches_per_step"] >= ms["ops"] > 0, ms
        assert {"position", "resets", bench.REST} <= set(result[label]["op_ms_per_step_by_stage"])


def test_the_dr_diagnostics_batch_what_they_say():
    """brax_dr_same batches DR's fields at the env's own values (bit for bit), brax_dr
    draws them; brax_dr_every batches every array of the System, the drawn ones drawn."""
    bench = _load("env_throughput")
    from brax import envs as brax_envs

    sys_ = brax_envs.get_environment("ant", backend="mjx").sys
    n, out = 3, {}
    for label, kwargs in bench._DR.items():
        out[label] = bench._brax_randomizer(n, **kwargs)(sys_)
    leaves = jax.tree.leaves
    for label in ("brax_dr", "brax_dr_same"):  # the five drawn fields batched, no other
        assert leaves(out[label][1]) == [0] * 5, label
    same, drawn = out["brax_dr_same"][0], out["brax_dr"][0]
    np.testing.assert_array_equal(same.body_mass, np.broadcast_to(sys_.body_mass, (n, sys_.nbody)))
    assert not np.array_equal(drawn.body_mass, same.body_mass)
    for label, draws in (("brax_dr_every", True), ("brax_dr_every_same", False)):
        batched, axes = out[label]
        assert len(leaves(axes)) == len(leaves(sys_)) and set(leaves(axes)) == {0}
        assert all(np.shape(b) == (n, *np.shape(x)) for b, x in zip(leaves(batched), leaves(sys_)))
        np.testing.assert_array_equal(
            batched.dof_damping, np.broadcast_to(sys_.dof_damping, (n, sys_.nv))
        )
        assert np.array_equal(batched.body_mass, same.body_mass) != draws, label


def test_brax_dr_metarl_batches_the_systems_the_contextual_env_steps_with():
    """brax_dr_metarl: env k's System is the one metarl writes for a context drawn once
    (`Binding.apply` with its derived constants); the arrays the draws change are batched
    (brax_dr's five and the mass's inertia and inverse weights), every other one is the
    binding's own, unbatched."""
    bench = _load("env_throughput")
    from brax import envs as brax_envs

    from metarl.envs import make_contextual

    sys_ = brax_envs.get_environment("ant", backend="mjx").sys
    binding = make_contextual("ant", bench._space(sys_, "mjx"), backend="mjx").binding
    n = 3
    batched, axes = bench._metarl_randomizer(binding, n)(sys_)
    flat = jax.tree_util.tree_flatten_with_path(axes, is_leaf=lambda x: x is None)[0]
    varied = {jax.tree_util.keystr(path) for path, axis in flat if axis == 0}
    assert {
        ".opt.gravity",
        ".body_mass",
        ".geom_friction",
        ".body_inertia",
        ".body_invweight0",
        ".dof_invweight0",
    } <= varied, varied
    assert ".dof_damping" not in varied
    keys = jax.random.split(jax.random.PRNGKey(7), n)
    for k in range(n):
        context = binding.sample(keys[k])
        want = jax.tree.leaves(binding.apply(context, binding.derive(context)))
        got = jax.tree.leaves(batched)
        assert len(got) == len(want) == len(flat)
        for x, w, (path, axis) in zip(got, want, flat):
            np.testing.assert_allclose(
                x[k] if axis == 0 else x, w, rtol=1e-6, atol=1e-7, err_msg=str(path)
            )


def test_control_flow_counts_a_programs_loops_and_conditionals():
    """The loops and conditionals of a compiled program, as env_throughput records them
    per variant (each waits on the host on a GPU)."""
    bench = _load("env_throughput")

    def f(x):
        y = jax.lax.fori_loop(0, jnp.int32(x[0]), lambda i, c: c * 1.5, x)
        return jax.lax.cond(y[0] > 2, lambda v: v + 1, lambda v: v - 1, y)

    hlo = jax.jit(f).lower(jnp.ones(3)).compile().as_text()
    assert bench._control_flow(hlo) == {"while": 1, "conditional": 1}
    plain = jax.jit(lambda x: x * 2).lower(jnp.ones(3)).compile().as_text()
    assert bench._control_flow(plain) == {"while": 0, "conditional": 0}


def test_ppo_merge_refuses_another_platform(tmp_path, capsys):
    """A result file records `provenance.platform()`: a file run with other XLA_FLAGS
    (e.g. --xla_gpu_deterministic_ops=true, which changes the numbers) is refused, naming
    the field; a file from before the platform was recorded merges, with a note."""
    bench = _load("ppo_throughput")
    cfg = bench.Config(seeds=(1,))
    environment = bench._environment()
    result = {"steps_per_sec": 1.0, "compile_s": 1.0, "return": 1.0}
    record = bench._record(
        cfg, environment, {"brax_ppo": {"0": dict(result, evaluator_build_s=0.1)}}, {}, []
    )
    record["platform"]["XLA_FLAGS"] = "--xla_gpu_autotune_level=0 --xla_gpu_deterministic_ops=true"
    path = tmp_path / "other_flags.json"
    path.write_text(json.dumps(record))
    with pytest.raises(
        ValueError, match="another platform: XLA_FLAGS='--xla_gpu_autotune_level=0 --xla_gpu_determ"
    ):
        bench._merge({"brax_ppo": {}}, str(path), cfg, environment)
    # the same flags in another order are the same platform
    flags = "--xla_gpu_deterministic_ops=true --xla_gpu_autotune_level=0"
    here = bench._here()
    here = {**here, "platform": {**here["platform"], "XLA_FLAGS": flags}}
    runs = {"brax_ppo": {}}
    bench._merge(runs, str(path), cfg, environment, here)
    assert runs["brax_ppo"] == {"0": dict(result, evaluator_build_s=0.1)}

    record["platform"] = "cpu"  # an older file: the backend's name only
    path.write_text(json.dumps(record))
    runs = {"brax_ppo": {}}
    bench._merge(runs, str(path), cfg, environment)
    assert runs["brax_ppo"] == {"0": dict(result, evaluator_build_s=0.1)}
    assert "records no platform" in capsys.readouterr().out


def test_ppo_throughput_refuses_a_seed_twice_and_a_file_it_did_not_write(tmp_path):
    """--seeds 0 0 trained seed 0 twice, kept the warm rerun (its compile time 0.0 s)
    and said "1 seed(s)"; --merge of another JSON file raised a bare KeyError."""
    bench = _load("ppo_throughput")
    with pytest.raises(ValueError, match="--seeds names seed 0 more than once"):
        bench.Config(seeds=(0, 1, 0))
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"seeds": [0]}))
    cfg = bench.Config(seeds=(1,))
    with pytest.raises(ValueError, match="not a file this script wrote with --out"):
        bench._merge({"brax_ppo": {}}, str(path), cfg, bench._environment())


def test_ppo_merge_keeps_the_provenance_of_merged_seeds(tmp_path):
    """Seeds merged from a file of other software (--other-software) keep that file's
    record in the output's `merged`: merging the output again is refused without the
    flag, naming the first file, instead of passing as this software's seeds."""
    bench = _load("ppo_throughput")
    environment = bench._environment()
    result = {"steps_per_sec": 1.0, "compile_s": 1.0, "return": 1.0, "evaluator_build_s": 0.1}
    old = bench._record(bench.Config(seeds=(0,)), environment, {"brax_ppo": {"0": result}}, {}, [])
    old["software"]["metarl"] = "0" * 12  # another metarl source
    first = tmp_path / "old.json"
    first.write_text(json.dumps(old))
    cfg = bench.Config(seeds=(1,), other_software=True)
    runs = {"brax_ppo": {"1": result}}
    merged = bench._merge(runs, str(first), cfg, environment)
    assert merged == [
        {
            "path": str(first),
            "platform": old["platform"],
            "software": old["software"],
            "seeds": {"brax_ppo": ["0"]},
        }
    ]
    second = tmp_path / "new.json"
    second.write_text(json.dumps(bench._record(cfg, environment, runs, {}, merged)))
    with pytest.raises(ValueError, match=f"--merge {first} ran on other software: metarl="):
        bench._merge({"brax_ppo": {}}, str(second), bench.Config(seeds=(2,)), environment)
    again = bench._merge({"brax_ppo": {}}, str(second), cfg, environment)
    assert [m["seeds"] for m in again] == [{"brax_ppo": ["1"]}, {"brax_ppo": ["0"]}]


def test_ppo_summary_compares_the_files_with_the_first_not_this_machine(tmp_path):
    """`--seeds` with no value summarises GPU result files on a CPU: the files are
    compared with the first one (JAX, device, platform, software), and the summary
    records the first's; a file from another device is still refused."""
    bench = _load("ppo_throughput")
    cfg = bench.Config(seeds=(0,), gru=False)
    gpu = {"backend": "gpu", "device_kind": "NVIDIA H200", "devices": 1, "XLA_FLAGS": ""}
    paths = []
    for seed, device in ((0, "NVIDIA H200"), (1, "NVIDIA H200"), (2, "NVIDIA H100")):
        result = {"steps_per_sec": 10.0 + seed, "compile_s": 1.0, "return": 100.0 * seed}
        runs = {"brax_ppo": {str(seed): dict(result, evaluator_build_s=0.1)}}
        runs["metarl_mlp"] = {str(seed): result}
        trained = dataclasses.replace(cfg, seeds=(seed,))
        record = bench._record(trained, {"jax": "0.11.2", "device": device}, runs, {}, [])
        record["platform"] = dict(gpu, device_kind=device)
        paths.append(tmp_path / f"seed_{seed}.json")
        paths[-1].write_text(json.dumps(record))
    out = tmp_path / "summary.json"
    bench.main(dataclasses.replace(cfg, seeds=(), merge=tuple(map(str, paths[:2])), out=str(out)))
    summary = json.loads(out.read_text())
    assert summary["device"] == "NVIDIA H200" and summary["platform"] == gpu
    assert sorted(summary["runs"]["metarl_mlp"]) == ["0", "1"]
    with pytest.raises(ValueError, match="device='NVIDIA H100' \\(here 'NVIDIA H200'\\)"):
        bench.main(dataclasses.replace(cfg, seeds=(), merge=tuple(map(str, paths))))
    with pytest.raises(ValueError, match="--seeds with no value trains nothing"):
        dataclasses.replace(cfg, seeds=())  # and no --merge: nothing to summarise


def test_ppo_summary_claims_equal_returns_only_within_the_margin(tmp_path, capsys):
    """An interval of the difference that holds 0 shows no difference, not equality:
    "equal" needs the 90% interval inside --equal-margin of Brax PPO's mean return."""
    bench = _load("ppo_throughput")
    cfg = bench.Config(seeds=(0,), gru=False)
    close = [1000.0, 1010.0, 990.0, 1005.0], [1001.0, 1008.0, 995.0, 1000.0]
    wide = [0.0, 2000.0, 1000.0, 1000.0], [1000.0, 1000.0, 2000.0, 0.0]
    for (brax, mine), equal in ((close, True), (wide, False)):
        runs = {"brax_ppo": {}, "metarl_mlp": {}}
        for seed, (b, m) in enumerate(zip(brax, mine, strict=True)):
            result = {"steps_per_sec": 1.0, "compile_s": 1.0}
            runs["brax_ppo"][str(seed)] = dict(result, evaluator_build_s=0.1, **{"return": b})
            runs["metarl_mlp"][str(seed)] = dict(result, **{"return": m})
        trained = dataclasses.replace(cfg, seeds=(0, 1, 2, 3))
        path, out = tmp_path / "runs.json", tmp_path / "summary.json"
        path.write_text(json.dumps(bench._record(trained, bench._environment(), runs, {}, [])))
        bench.main(dataclasses.replace(cfg, seeds=(), merge=(str(path),), out=str(out)))
        claim = json.loads(out.read_text())["summary"]["metarl_mlp"]["return_equal_to_brax"]
        assert claim["equal"] is equal and claim["margin"] == pytest.approx(0.05 * np.mean(brax))
        low, high = claim["ci90"]
        assert (-50 < low and high < 50) is equal and low < 0 < high  # both hold 0
        row = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("metarl"))
        assert row.endswith("yes" if equal else "not shown")
    with pytest.raises(ValueError, match="--equal-margin must be a fraction"):
        bench.Config(equal_margin=0.0)


def test_ppo_speed_against_brax_is_paired_by_seed():
    """A metarl trainer's speed against Brax PPO's: the geometric mean of the per-seed
    ratios, over the seeds both ran, with the 95% t interval of their logs."""
    bench = _load("ppo_throughput")
    sps = lambda **seeds: {s.strip("s"): {"steps_per_sec": v} for s, v in seeds.items()}  # noqa: E731
    runs = {
        "brax_ppo": sps(s0=100.0, s1=200.0, s2=100.0),
        "metarl_mlp": sps(s0=110.0, s1=180.0, s2=120.0, s3=1.0),  # seed 3: Brax ran none
    }
    paired = bench._paired_speed(runs, "metarl_mlp")
    logs = np.log([1.1, 0.9, 1.2])
    half = scipy.stats.t.ppf(0.975, 2) * logs.std(ddof=1) / np.sqrt(3)
    assert paired["seeds"] == 3
    np.testing.assert_allclose(paired["ratio"], np.exp(logs.mean()))
    np.testing.assert_allclose(
        [paired["ci_low"], paired["ci_high"]], np.exp(logs.mean() + np.array([-half, half]))
    )
    assert bench._format_speed(paired).endswith("] over 3 seeds")
    one = bench._paired_speed({"brax_ppo": sps(s0=100.0), "metarl_mlp": sps(s0=50.0)}, "metarl_mlp")
    assert np.isclose(one["ratio"], 0.5)
    assert bench._format_speed(one) == "0.50x [no CI] over 1 seeds"


@pytest.mark.parametrize(
    "script, field, value",
    [
        ("env_throughput", "rounds", 0),
        ("env_throughput", "num_envs", (1024, 0)),
        ("ppo_throughput", "eval_episodes", 0),
        ("seeds_throughput", "seeds", 0),  # a count of seeds there
        ("first_update", "then", -1),
        ("stock_refill", "depth", 0),
        ("reset_cost", "calls", 0),
        ("reset_compile", "repeats", 0),
    ],
)
def test_a_benchmark_refuses_a_count_below_one_before_it_compiles(script, field, value):
    """A zero count once compiled every variant and then failed on an empty median
    (or timed nothing); seeds that are ids may be 0, and so may --then."""
    bench = _load(script)
    least = 0 if field == "then" else 1
    flag = "--" + field.replace("_", "-")
    with pytest.raises(ValueError, match=f"^{flag} must be >= {least}, got"):
        bench.Config(**{field: value})
    bench.Config(**{field: least if not isinstance(value, tuple) else (least,)})
    _load("reproducibility").Config(seed=0)


def test_reproducibility_refuses_a_setting_named_twice():
    """A repeated setting once merged both entries' processes under one row, which
    then read ratio 1.000 against itself (or failed only after every run trained)."""
    repro = _load("reproducibility")
    for twice in (("default", "default"), ("a=1,b=2", "default", "b=2, a=1")):
        with pytest.raises(ValueError, match="names one setting twice"):
            repro.Config(settings=twice)
    repro.Config(settings=("default", "a=1,b=2", "a=1"))


def test_stock_refill_times_steps_and_refill_and_keeps_the_stock_full(tmp_path):
    """stock_refill.py alternates a block of `depth` steps and the refill of what they
    used, on one donated state: with no refill, a done env would find its stock empty
    (the script refuses such a run)."""
    bench = _load("stock_refill")
    cfg = bench.Config(env="inverted_pendulum", num_envs=8, depth=4, rounds=2)
    result = bench.main(dataclasses.replace(cfg, out=str(tmp_path / "refill.json")))
    assert result["dones_per_block"] > 0  # the pendulum falls: entries were used
    assert result["steps_ms"] > 0 and result["refill_ms"] > 0
    assert json.loads((tmp_path / "refill.json").read_text())["config"]["depth"] == 4


def test_reset_cost_times_the_resets_a_step_makes_and_fits_a_line():
    """reset_cost.py's loop program resets the done envs at every select of its scan,
    each time under another reset number (XLA cannot hoist a reset computed once), and
    leaves the others as they are; its line fit recovers a known fixed and per-env cost;
    bad chunks and sizes are refused before anything compiles."""
    bench = _load("reset_cost")
    assert np.allclose(
        bench.fit_line([2, 64, 256], [0.1 + 0.002 * s for s in (2, 64, 256)]), (0.1, 0.002)
    )
    with pytest.raises(ValueError, match="--chunks must be fractions in \\(0, 1\\]"):
        bench.Config(chunks=(0.0,))
    with pytest.raises(ValueError, match="--sizes: at least two sizes"):
        bench.Config(num_envs=8, sizes=(2, 64))
    cfg = bench.Config(
        envs=("inverted_pendulum",), num_envs=8, chunks=(0.25,), sizes=(2, 4), calls=3
    )
    programs = bench._programs("inverted_pendulum", cfg, dones=3)
    assert sorted(programs) == sorted(
        ["loop 0.25 0", "loop 0.25 3", "exact 2", "exact 4", "env 2", "env 4"]
    )
    run, (operand, current) = programs["loop 0.25 3"]
    out = run(operand, current)
    assert np.array_equal(out[1][3:], current[1][3:])  # observations of the envs not done
    # the done envs hold the reset of the last select: reset number resets + calls - 1
    env = make_contextual(
        "inverted_pendulum",
        _load("env_throughput")._space(
            brax_envs.get_environment("inverted_pendulum").sys, "generalized"
        ),
        episode_length=1000,
        reset_strategy="loop",
        reset_chunk=0.25,
    )
    key, resets, *rest = jax.tree.map(lambda x: x[:3], operand)
    last = jax.vmap(env._fresh)((key, resets + 2, *rest))
    first = jax.vmap(env._fresh)((key, resets, *rest))
    np.testing.assert_allclose(out[1][:3], last[1], rtol=1e-5, atol=1e-6)
    assert not np.allclose(out[1][:3], first[1])  # not the first select's reset, kept


def test_reset_compile_builds_each_program_it_names():
    """reset_compile.py compiles the programs it says: a reset where it names one and
    none where it switches it off. On a CPU two LAPACK calls mark a reset: Brax's
    Cholesky factor of the mass matrix (potrf, which Brax's step does not call) and
    the LU factorization of the derived constants (getrf: inverted_pendulum's per-body
    mass sets the solver's inverse weights), which Brax's own reset has not. The loop's
    conditional is in the loop only. The child process it starts for a program reports
    what it compiled; unknown names are refused with the choices."""
    bench = _load("reset_compile")
    with pytest.raises(ValueError, match=r"--programs: unknown \['step'\]; choose among brax_r"):
        bench.Config(programs=("step",))
    with pytest.raises(ValueError, match=r"--only: unknown 'step'; choose among brax_reset"):
        bench.Config(only="step")
    cfg = bench.Config(envs=("inverted_pendulum",), num_envs=4, repeats=1)
    marks = {}
    for program in ("reset", "step_noreset", "step_and_reset", "step_dense", "step_loop"):
        fn, args = bench._program("inverted_pendulum", program, cfg)
        hlo = jax.jit(fn).trace(*args).lower().compile().as_text()
        conditionals = len(re.findall(r"\sconditional\(", hlo))
        marks[program] = hlo.count("potrf"), hlo.count("getrf"), conditionals
    assert marks == {
        "reset": (1, 1, 0),
        "step_noreset": (0, 0, 0),
        "step_and_reset": (1, 1, 0),
        "step_dense": (1, 1, 0),
        "step_loop": (1, 1, 1),
    }
    child = bench.bench("inverted_pendulum", dataclasses.replace(cfg, programs=("brax_reset",)))
    run = child["brax_reset"]["runs"][0]
    assert {k for k in run["custom_calls"] if "potrf" in k or "getrf" in k} == {"lapack_spotrf_ffi"}
    assert run["hlo_lines"] > 100 and run["compile_s"] > 0


def test_the_brax_timer_wraps_for_the_call_only():
    """`_timed` adds each call's wall time under its label, waits for an __init__'s
    arrays, and puts the original back, also when the call raises; brax_ppo wraps the
    objects that Brax PPO's train.py looks its callees up on."""
    bench = _load("ppo_throughput")

    class Built:
        def __init__(self, n):
            self.x = jnp.arange(n)

    original = Built.__init__
    seconds = {}
    with bench._timed(Built, "__init__", seconds, "build", wait_self=True):
        assert Built.__init__ is not original
        assert Built(3).x.tolist() == [0, 1, 2]
        Built(2)
    assert Built.__init__ is original and seconds["build"] > 0

    def fails():
        raise RuntimeError("inside")

    owner = types.SimpleNamespace(f=fails)
    with pytest.raises(RuntimeError, match="inside"):
        with bench._timed(owner, "f", seconds, "f"):
            owner.f()
    assert owner.f is fails and "f" not in seconds

    from brax.training import acting, pmap
    from brax.training.agents.ppo import train as brax_train

    assert brax_train.acting.Evaluator is acting.Evaluator and brax_train.pmap is pmap
    source = inspect.getsource(brax_train.train)
    assert "acting.Evaluator(" in source and "pmap.assert_is_replicated(" in source


def test_ppo_throughput_gives_both_trainers_the_same_hyperparameters(monkeypatch):
    """Every PPOConfig field Brax PPO's `train` takes by the same name is equal on both
    sides, whether the script sets it or the side's default does (metarl's GAE lambda,
    clipping and reward scaling are PPOConfig defaults: a changed default would have
    broken the comparison without a word)."""
    from brax.training.agents.ppo import train as brax_train

    bench = _load("ppo_throughput")
    cfg = bench.Config()
    brax = bench.brax_kwargs(cfg, seed=0)
    brax_defaults = {
        name: p.default
        for name, p in inspect.signature(brax_train.train).parameters.items()
        if p.default is not inspect.Parameter.empty
    }
    ours = dataclasses.asdict(bench.metarl_config(cfg, "mlp"))
    shared = sorted(set(ours) & (set(brax) | set(brax_defaults)))
    assert {"gae_lambda", "clipping_epsilon", "reward_scaling", "max_grad_norm"} <= set(shared)
    for name in shared:
        theirs = brax.get(name, brax_defaults.get(name))
        assert ours[name] == theirs, f"{name}: metarl {ours[name]!r}, Brax PPO {theirs!r}"


def test_first_update_times_one_update_round_on_both_sides(monkeypatch):
    """first_update.py's Brax PPO run trains exactly one of Brax's training steps before
    its first progress report, with the env steps of one metarl iteration, and the
    same PPO settings as ppo_throughput.py's trainers."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # first_update imports ppo_throughput
    first = _load("first_update")
    cfg = first.Config(env="hopper", num_envs=2048, unroll_length=16, num_minibatches=16)
    settings = first._settings(cfg)
    bench = sys.modules.get("ppo_throughput") or _load("ppo_throughput")
    brax = bench.brax_kwargs(settings, seed=0)
    per_training_step = brax["batch_size"] * brax["num_minibatches"] * brax["unroll_length"]
    metarl = bench.metarl_config(settings, "mlp")
    assert brax["num_timesteps"] == per_training_step == metarl.batch_size == 2048 * 16
    assert metarl.num_minibatches == brax["num_minibatches"] == 16
    assert metarl.num_updates_per_batch == brax["num_updates_per_batch"]
    assert metarl.learning_rate == brax["learning_rate"]


def test_first_update_runs_the_variants_asked_for_and_refuses_others(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    first = _load("first_update")
    assert first._variants(first.Config()) == first.VARIANTS
    assert "brax" not in first._variants(first.Config(core="gru"))
    assert first._variants(first.Config(variants=("brax", "precompile"))) == ("brax", "precompile")
    with pytest.raises(ValueError, match="choose among sequential, precompile, brax"):
        first._variants(first.Config(variants=("sequental",)))
    with pytest.raises(ValueError, match="--core mlp only"):
        first._variants(first.Config(variants=("brax",), core="gru"))


def test_the_stocks_first_fill_is_outside_the_timed_rollout():
    """A stock starts empty and its first refill computes `depth` resets per env, which
    PPO pays once a run (in init_env_state); timed inside every round, it made the
    stock's short rollouts look slower than its steps are. The untimed start fills it:
    its entries are the envs' next resets (base = resets), and the timed rollout
    refills as PPO's does (`refill_stocks` before each block), then computes every
    entry it used, in whole chunks. The "contextual" variant whose strategy is the stock
    ("auto" on a GPU) is stepped the same way: it times what PPO runs."""
    from metarl.envs.contextual import POOL, TRIAL

    bench = _load("env_throughput")
    n, cfg = 8, bench.Config(stock_depth=8, stock_block=4, steps=8)
    for label, strategy in (("contextual_stock", "auto"), ("contextual", "stock")):
        cfg = dataclasses.replace(cfg, strategy=strategy)
        rollout = bench._build(label, "inverted_pendulum", n, cfg)
        key = jax.random.key(0)
        state = rollout.start(key)
        stock = state.info[POOL]
        np.testing.assert_array_equal(stock.base, state.info[TRIAL].resets)
        assert stock.depth((n,)) == 8
        (dones, refills, fresh, _), last = rollout.run(key, state)
        # donated, as PPO's training loop takes it: the stock is not copied per call
        assert all(x.is_deleted() for x in jax.tree.leaves(state))
        assert int(dones) > 0  # inverted_pendulum falls within 8 random steps: the stock is used
        # every reset the timed steps used was computed in them, in whole chunks of n
        assert 1 <= int(refills) <= cfg.steps // cfg.stock_block + 1
        assert int(fresh) % n == 0 and int(dones) <= int(fresh) < int(dones) + n * int(refills)
        np.testing.assert_array_equal(last.info[POOL].base, last.info[TRIAL].resets)  # full
    with pytest.raises(ValueError, match=r"--stock-block 9: .* at most the stock's depth \(8\)"):
        bench.Config(stock_depth=8, stock_block=9)


def test_env_throughputs_ratio_is_that_of_its_steps_per_second(tmp_path):
    """One aggregate for both columns (the geometric mean over paired rounds): the
    median paired ratio of 3 rounds was the middle round's, and a stored H200 run
    read 0.980 there against 0.953 between its steps/s. The file keeps every
    setting, the stock's depth among them (it decides what "contextual" is on a GPU)."""
    bench = _load("env_throughput")
    out = tmp_path / "et"
    cfg = bench.Config(
        envs=("inverted_pendulum",),
        num_envs=(4,),
        steps=4,
        rounds=3,
        variants=("plain", "brax_dr"),  # the ratio is any variant's (brax_dr compiles least)
        stock_depth=12,
        stock_block=4,
        out=str(out),
    )
    bench.main(cfg)
    result = json.loads(out.with_suffix(".json").read_text())
    assert result["config"]["stock_depth"] == 12 and result["config"]["stock_block"] == 4
    runs = result["envs"]["inverted_pendulum"]["4"]
    plain, ctx = runs["plain"], runs["brax_dr"]
    assert plain["ratio"] == 1.0
    np.testing.assert_allclose(ctx["ratio"], ctx["steps_per_s"] / plain["steps_per_s"], rtol=1e-12)
    ratios = np.asarray(plain["times_s"]) / np.asarray(ctx["times_s"])
    np.testing.assert_allclose(ctx["ratio"], np.exp(np.log(ratios).mean()), rtol=1e-12)
    # its 95% CI: the t interval of the rounds' log ratios, around the ratio
    logs = np.log(ratios)
    half = scipy.stats.t.ppf(0.975, 2) * logs.std(ddof=1) / np.sqrt(3)
    np.testing.assert_allclose(
        [ctx["ratio_ci_low"], ctx["ratio_ci_high"]], np.exp(logs.mean() + [-half, half])
    )
    assert ctx["ratio_ci_low"] < ctx["ratio"] < ctx["ratio_ci_high"]
    assert plain["ratio_ci_low"] == plain["ratio_ci_high"] == 1.0
    # --summarize reads the file back to the same figures, its median beside them
    again = bench.summarize((str(out.with_suffix(".json")),))
    read = again[str(out.with_suffix(".json"))]["inverted_pendulum"]["4"]["brax_dr"]
    assert read == {k: v for k, v in ctx.items() if k in read} and len(read) == 6


def _gpu_program(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # it reads env_throughput's stages
    # what it sets where unset, set here so that they are undone after the test
    monkeypatch.setenv("JAX_PLATFORMS", os.environ.get("JAX_PLATFORMS", "cpu"))
    monkeypatch.setenv("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
    return _load("gpu_program")


def _loops_program(n: int):
    """A scan of n trips, holding a scan of 3 and a while loop of data-dependent trips."""

    def inner(c, _):
        with jax.named_scope("inner_body"):
            return jnp.sin(c) * 2 + 1, None

    def outer(c, _):
        c, _ = jax.lax.scan(inner, c, None, length=3)
        with jax.named_scope("unknown_body"):
            c = jax.lax.while_loop(lambda c: c.sum() < 1e6, lambda c: jnp.cos(c) * 3 + c, c)
        return c, c.sum()

    return jax.jit(lambda x: jax.lax.scan(outer, x, None, length=n))


def test_gpu_program_counts_each_launch_as_often_as_its_loops_run(monkeypatch):
    """An operation in a scan of 3 inside a scan of n launches 3n times a call; one in a
    while loop whose trip count the host reads is counted once each time that loop is
    entered, and the loop is reported as such; a loop's condition runs trips + 1 times."""
    gp = _gpu_program(monkeypatch)
    n = 7
    hlo = _loops_program(n).lower(jnp.ones(64)).compile().as_text()
    loops, counts = gp.launches(hlo)
    assert [(loop.trips, loop.runs, loop.depth) for loop in loops] == [
        (1, 1, 0),
        (n, n, 1),
        (3, 3 * n, 2),
        (None, None, 2),
    ]
    scopes = {}
    for line in hlo.splitlines():
        m = re.match(r'\s*(?:ROOT )?%?([\w.\-]+) = .*op_name="([^"]*)"', line)
        if m:
            scopes[m.group(1)] = m.group(2)
    runs = {name: k for name, k in counts.items() if name in scopes}
    inner_ops = [k for name, k in runs.items() if "inner_body" in scopes[name]]
    unknown_body = [k for name, k in runs.items() if "unknown_body/while/body" in scopes[name]]
    inner_cond = [
        k for name, k in runs.items() if scopes[name].endswith("closed_call/while/cond/lt")
    ]
    assert inner_ops and set(inner_ops) == {3 * n}
    assert unknown_body and set(unknown_body) == {n}
    assert inner_cond == [4 * n]
    step = gp.per_step(hlo, n)
    assert step["launches_per_step"] == pytest.approx(sum(counts.values()) / n)
    assert step["unknown_trip_loops"] == 1
    assert sum(step["by_stage"].values()) == pytest.approx(step["launches_per_step"])


def test_gpu_program_names_the_gpus_it_knows_and_the_plugin_it_needs(monkeypatch):
    gp = _gpu_program(monkeypatch)
    with pytest.raises(ValueError, match=r"unknown GPU 'a100'.*\['h100', 'h200'\]"):
        gp.target_config("a100")
    assert 'device_description_str: "NVIDIA H200"' in gp.target_config("h200")
    assert "core_count: 132" in gp.target_config("h100")
    try:
        plugin = importlib.util.find_spec("jax_plugins.xla_cuda13")
    except ModuleNotFoundError:  # no jax_plugins at all
        plugin = None
    if plugin is None:
        with pytest.raises(RuntimeError, match='pip install "jax-cuda13-plugin=='):
            gp.gpu_device("h100")
    else:  # compiles for the card without one
        assert gp.gpu_device("h100").device_kind == "NVIDIA H100 80GB HBM3"


# XLA's dump of a thunk sequence (`*.thunk_sequence_after_thunk_passes.txt`), in its
# layout less the kernels' launch sizes: a while loop of 7 trips whose body launches
# two command buffers, a sequence (its first thunk on its line) and a loop of unknown
# trips; then a conditional of two branches, whose thunks' ids have four digits
_THUNKS = """\
001: kCopy         [source       | next=002 (1)] kCopy
002: kWhile        [prev=001 (1) | next=014 (1)]   
condition:
    003: kCustomKernel [source | sink] loop_compare_fusion
  body:
    000: kCommandBuffer      [source       | next=008 (1)] 
        004: kCopy         [source | sink] kCopy
        005: kCustomKernel [source | sink] loop_add_fusion
    008: kSequential [prev=000 (1) | next=009 (1)]          006: kCopy [source | next=007 (1)] kCopy
      007: kTriangularSolve [prev=006 (1) | sink        ] (no description)
    009: kWhile              [prev=008 (1) | next=000 (1)]       
condition:
        010: kCustomKernel [source | sink] loop_compare_fusion_1
      body:
        011: kCustomKernel [source | sink] loop_add_fusion_1
    000: kCommandBuffer      [prev=009 (1) | sink        ] 
        012: kCustomKernel [source       | next=013 (1)] input_reduce_fusion
        013: kCustomKernel [prev=012 (1) | sink        ] loop_select_fusion
014: kCustomKernel [prev=002 (1) | next=999 (1)] input_reduce_fusion_1
999: kConditional  [prev=014 (1) | sink        ]   

false_branch:
    1000: kCustomKernel [source | sink] loop_add_fusion_2
true_branch:
    1001: kCopy [source | sink] kCopy
"""


def test_gpu_program_counts_what_the_host_does_from_the_thunk_sequence(monkeypatch):
    """Each trip of the 7 launches two graphs (four commands in them), a copy and a
    triangular solve, and enters the loop of unknown trips: the host waits for its
    predicate twice (one trip, then the stop), and launches its condition twice and its
    body once. The conditional makes the host wait once, and both its branches count.
    The loops' trip counts come from the program the metadata names."""
    gp = _gpu_program(monkeypatch)
    seq = gp.thunk_sequence(_THUNKS)
    assert [t.kind for t in seq] == ["kCopy", "kWhile", "kCustomKernel", "kConditional"]
    assert [t.id for t in seq[3].inner] == [1000, 1001]  # past 999: four digits
    assert [t.kind for t in seq[1].body] == [
        "kCommandBuffer",
        "kSequential",
        "kWhile",
        "kCommandBuffer",
    ]
    assert [t.id for t in seq[1].body[1].inner] == [6, 7]
    assert [t.id for t in seq[1].body[2].condition] == [10]
    assert [t.id for t in seq[1].body[2].body] == [11]

    n = 7
    hlo = _loops_program(n).lower(jnp.ones(64)).compile().as_text()
    loops, _ = gp.launches(hlo)
    known = next(loop.name for loop in loops if loop.trips == n)
    unknown = next(loop.name for loop in loops if loop.trips is None)
    metadata = "".join(
        f'thunk_metadata {{\n  thunk_info {{\n    profile_annotation: "{name}"\n'
        f'    thunk_id: {ident}\n  }}\n  thunk_kind: "{kind}"\n}}\n'
        for name, ident, kind in [
            ("copy.1", 1, "kCopy"),
            (known, 2, "kWhile"),
            (unknown, 9, "kWhile"),
        ]
    )
    trips = gp.while_trips(loops, metadata)
    assert trips == {2: n, 9: None}
    assert gp.host_work(seq, trips) == {
        "graphs": 2 * n,
        "in_graphs": 4 * n,
        "launches": 2 + (2 + 2 + 1) * n + 2,
        "syncs": 2 * n + 1,
        "unknown_loops": n,
    }


def test_gpu_program_reads_the_thunk_sequence_xla_compiles_for_a_gpu(monkeypatch):
    """Compiled for an H100 (with the CUDA plugin: not in CI), the loop of unknown trips
    makes the host wait for the GPU twice each time it is entered."""
    gp = _gpu_program(monkeypatch)
    try:
        device = gp.gpu_device("h100")
    except RuntimeError:
        pytest.skip("no CUDA plugin to compile for a GPU")
    n = 7
    x = jax.ShapeDtypeStruct((64,), jnp.float32, sharding=jax.sharding.SingleDeviceSharding(device))
    program = gp.compile_dumped(_loops_program(n).trace(x).lower())
    step = gp.per_step(program.hlo, n, program)
    assert step["host_per_step"]["syncs"] == 2
    assert step["host_per_step"]["unknown_loops"] == 1
    assert step["launches_per_step"] >= step["host_per_step"]["launches"] > 0


# a program in XLA's text: an update in place of one row, a select of rows gathered
# from a stack of 8, and a copy
_TRAFFIC_HLO = """\
HloModule m

%fused_update (b: f32[64,16], u: f32[1,16], i: s32[]) -> f32[64,16] {
  %b = f32[64,16]{1,0} parameter(0)
  %u = f32[1,16]{1,0} parameter(1)
  %i = s32[] parameter(2)
  %zero = s32[] constant(0)
  ROOT %dus = f32[64,16]{1,0} dynamic-update-slice(%b, %u, %i, %zero)
}

%fused_pick (x: f32[64,16], s: f32[8,64,16], i.1: s32[64,3], m: pred[64,16]) -> f32[64,16] {
  %s = f32[8,64,16]{2,1,0} parameter(1)
  %i.1 = s32[64,3]{1,0} parameter(2)
  %g = f32[64,16]{1,0} gather(%s, %i.1), index_vector_dim=1, slice_sizes={1,1,16}
  %m = pred[64,16]{1,0} parameter(3)
  %x = f32[64,16]{1,0} parameter(0)
  ROOT %select.1 = f32[64,16]{1,0} select(%m, %g, %x)
}

ENTRY %main (p0: f32[64,16], p1: f32[1,16], p2: s32[], p3: f32[8,64,16]) -> f32[64,16] {
  %p0 = f32[64,16]{1,0} parameter(0)
  %p1 = f32[1,16]{1,0} parameter(1)
  %p2 = s32[] parameter(2)
  %p3 = f32[8,64,16]{2,1,0} parameter(3)
  %p4 = s32[64,3]{1,0} parameter(4)
  %p5 = pred[64,16]{1,0} parameter(5)
  %update = f32[64,16]{1,0} fusion(%p0, %p1, %p2), kind=kLoop, calls=%fused_update
  %pick = f32[64,16]{1,0} fusion(%update, %p3, %p4, %p5), kind=kLoop, calls=%fused_pick
  ROOT %copy.1 = f32[64,16]{1,0} copy(%pick)
}
"""


def test_gpu_program_estimates_the_bytes_each_launch_moves(monkeypatch):
    """The update in place moves its row (read, written) and its index, not the buffer;
    the select reads its two sides, the gathered rows and not the stack of 8, its mask,
    and writes its result; the copy reads and writes its array."""
    gp = _gpu_program(monkeypatch)
    rows = 64 * 16 * 4
    assert gp.traffic(_TRAFFIC_HLO) == {
        "update": 16 * 4 + 4 + 16 * 4,
        "pick": rows + rows + 64 * 3 * 4 + 64 * 16 + rows,
        "copy.1": 2 * rows,
    }
    _, counts = gp.launches(_TRAFFIC_HLO)
    assert set(counts) == {"update", "pick", "copy.1"}


def test_gpu_program_reads_a_gathered_row_as_the_fields_sliced_from_it(monkeypatch):
    """A fusion that gathers a row of 24 numbers per env from a stock of 8 rows,
    views it and slices two fields of 4 out of it reads the fields, not the row."""
    gp = _gpu_program(monkeypatch)
    hlo = """\
HloModule m

%fused_pick (s: f32[64,8,24], i: s32[64,2], m: pred[64,4], x: f32[64,4]) -> f32[64,4] {
  %s = f32[64,8,24]{2,1,0} parameter(0)
  %i = s32[64,2]{1,0} parameter(1)
  %g = f32[64,1,24]{2,1,0} gather(%s, %i), index_vector_dim=1, slice_sizes={1,1,24}
  %b = f32[64,24]{1,0} bitcast(%g)
  %f1 = f32[64,4]{1,0} slice(%b), slice={[0:64], [0:4]}
  %f2 = f32[64,4]{1,0} slice(%b), slice={[0:64], [8:12]}
  %m = pred[64,4]{1,0} parameter(2)
  %x = f32[64,4]{1,0} parameter(3)
  %a = f32[64,4]{1,0} add(%f1, %f2)
  ROOT %select.1 = f32[64,4]{1,0} select(%m, %a, %x)
}

ENTRY %main (p0: f32[64,8,24], p1: s32[64,2], p2: pred[64,4], p3: f32[64,4]) -> f32[64,4] {
  %p0 = f32[64,8,24]{2,1,0} parameter(0)
  %p1 = s32[64,2]{1,0} parameter(1)
  %p2 = pred[64,4]{1,0} parameter(2)
  %p3 = f32[64,4]{1,0} parameter(3)
  ROOT %pick = f32[64,4]{1,0} fusion(%p0, %p1, %p2, %p3), kind=kLoop, calls=%fused_pick
}
"""
    field = 64 * 4 * 4
    assert gp.traffic(hlo) == {"pick": 2 * field + 64 * 2 * 4 + 64 * 4 + field + field}


def test_strategy_agreement_reports_the_largest_difference_and_the_first_step():
    agree = _load("strategy_agreement")
    same = np.arange(12, dtype=np.float32).reshape(3, 2, 2)
    later = same.copy()
    later[2, 1, 0] += 0.5  # step 2 only
    later[1, 1, 0] += 2.0**-20  # and step 1, by a rounding
    got = agree.compare((same, same[:, :, 0]), (same, later[:, :, 0]))
    assert got == [(0.0, None), (0.5, 1)]
    for strategies in (("loop",), ("loop", "sparse")):
        with pytest.raises(ValueError, match="two or more of auto, loop"):
            agree.main(agree.Config(strategies=strategies))


def test_metarl_ppo_trains_and_evaluates_a_seed():
    """ppo_throughput.py's metarl trainer end to end at a tiny size: its evaluation of
    the env's own physics (a space of no names) once failed after training, so the
    GPU stage that times it would have lost its call."""
    bench = _load("ppo_throughput")
    cfg = bench.Config(num_timesteps=4096, num_envs=32, num_minibatches=2, segments=2)
    cfg = dataclasses.replace(cfg, episode_length=50, eval_episodes=2)
    result = bench.metarl_ppo(cfg, "mlp")(0)
    assert result["steps_per_sec"] > 0 and np.isfinite(result["return"]) and result["return"] > 0
