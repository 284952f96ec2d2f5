"""Test-wide settings.

JAX's persistent compilation cache, shared by the pytest workers and the
experiment subprocesses the tests start: a program compiled once in a run
(a resumed experiment, the same rollout in two tests) is loaded, not
recompiled. Entries are keyed by the program, JAX version and flags, so the
cache never returns a stale executable. A cache load still fires JAX's
backend-compile event, so `metarl.compilation.count_compilations` counts it
and the no-recompile tests stay exact (tests/test_compilation.py).
Set METARL_TEST_JAX_CACHE=0 to switch it off.

Compiling faster (FAST_COMPILE, added to XLA_FLAGS for the workers and every
subprocess they start, unless XLA_FLAGS sets them already): the suite is mostly
tracing and compiling (METARL_TEST_PROFILE below). XLA's older CPU emitters
(`--xla_cpu_use_fusion_emitters=false`) compile a contextual env's programs about
35% faster (inverted_pendulum's rollout 6.9 -> 4.2 s, hopper's 14.6 -> 10.2 s), and
XLA's optimization level 0 (`--xla_backend_optimization_level=0`) takes a fifth
off the rest: the suite cold on 2 cores of an AVX-512 host 13:22 -> 10:41 on
2026-11-28 (on another host 19-20 minutes with the emitters alone). What the tests
check holds with any of these flags: a claim that compares two programs compiled
apart (the reset strategies, tests/test_autoreset.py) checks them to float
rounding, as the host's CPU already changes how XLA rounds them. The two claims
that compare two programs bit for bit (the default context against plain MJX,
tests/test_model_envs.py; PPO with the stock against the loop,
tests/test_autoreset.py) hold with XLA's current emitters, and run in a process of
their own with them (`with_xla_defaults`), at level 0 still: bit for bit there too,
and 20 s (MJX) and 12 s (PPO) sooner than with XLA's defaults on 2 cores of an AMD
EPYC on 2026-12-02. Level 0 runs a program slower, so in a test that
trains long PPO's training iteration compiles at XLA's default level 2
(`optimized_training`, through metarl/agents/ppo/training.py's
`_ITERATE_COMPILER_OPTIONS`): the pendulum
fixture's 7 segments of 40k steps took 6.5-8.0 s each at level 0 and 1.0-1.1 s at
level 2, its first (compile included) 21.4 -> 17.1 s (AMD EPYC without AVX-512,
2026-12-02); tests/test_ppo.py's hidden context, which trained in a process of its
own at level 2 throughout, 334 -> 132 s in the test process. A test that mostly
trains in a process of its own runs there without level 0 (`xla_flags_without(OPTIMIZED)`;
tests/test_ppo.py's two devices, 69 -> 46 s). Set METARL_TEST_XLA_DEFAULTS=1 to run
everything with XLA's defaults.

Tracing faster (GC_THRESHOLD): JAX's tracing and lowering allocate millions of
short-lived Python objects, and at Python's default threshold (700) the cyclic garbage
collector starts a collection every 700 of them, each walking the young objects and,
every hundredth, all of them (JAX's caches included). At 50,000 a young collection
runs 70 times less often, and a full one still runs every 5 million allocations.
Cold, on 2 cores of an AMD EPYC (2026-12-06): tests/test_contexts.py 70.9 and 72.8 s
-> 60.5 s (at 200,000: 63.0 and 60.5 s), tests/test_reads.py 62.4 -> 51.8 s, peak
memory the same (1.6 and 1.1 GB). It changes no number. The processes the tests start
(experiment scripts, a test's own process) collect at the same threshold, through
tests/subprocess_site/sitecustomize.py on their PYTHONPATH (METARL_TEST_GC_THRESHOLD
sets theirs apart): the quickstart killed and resumed and the Playground experiment,
cold, interleaved, 96.8 and 90.3 s -> 86.2 and 79.0 s (2026-12-06, second pair of
runs). Set METARL_TEST_GC_DEFAULTS=1 to keep Python's everywhere.

METARL_TEST_PROFILE=<folder>: where the suite's time goes. Each worker writes the
seconds JAX spent tracing, lowering and compiling for each test (JAX's own monitoring
events; subprocesses the tests start are left out) and for each jitted function
(`jax_log_compiles`), and the summary lists the totals, the tests that spent most,
the functions built most often and each test file's seconds (`FILE_SECONDS`). A cold
run (JAX_COMPILATION_CACHE_DIR=<empty folder>) shows what CI pays.
"""

import collections
import contextlib
import gc
import importlib.util
import json
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path

FAST_COMPILE = ("--xla_cpu_use_fusion_emitters=false", "--xla_backend_optimization_level=0")
GC_THRESHOLD = (50_000, 10, 10)  # Python's default: (700, 10, 10)

if os.environ.get("METARL_TEST_GC_DEFAULTS", "0") != "1":
    gc.set_threshold(*GC_THRESHOLD)
    # and in the processes the tests start (tests/subprocess_site/sitecustomize.py)
    os.environ.setdefault("METARL_TEST_GC_THRESHOLD", ",".join(map(str, GC_THRESHOLD)))
    _site = str(Path(__file__).resolve().parent / "subprocess_site")
    _path = os.environ.get("PYTHONPATH", "")  # as set: an empty entry is the working folder
    if _site not in _path.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join([_site, _path]) if _path else _site

OPTIMIZED = FAST_COMPILE[1:]  # `xla_flags_without(OPTIMIZED)`: the emitters kept
# The flags of FAST_COMPILE set here, not by the user. The pytest-xdist workers inherit
# XLA_FLAGS from the process that started them, which set them: they read which were
# added there from _ADDED_VAR. Until 2026-12-03 a worker took them for the user's, so
# `optimized_training` left PPO's iteration at level 0 in every worker: the hidden-sign
# test took 162 s in a worker, 61 s in a pytest process of its own (warm cache, Xeon).
_ADDED_VAR = "METARL_TEST_ADDED_XLA_FLAGS"
_ADDED: list[str] = []
# The flags of FAST_COMPILE the installed XLA does not know, found once by the process
# that starts the suite and passed on to its workers. XLA exits a process whose XLA_FLAGS
# holds a flag it does not know ("Unknown flag in XLA_FLAGS", exit status 1), and under
# pytest's output capture it exits without a word: JAX 0.11.2's XLA no longer knows
# --xla_cpu_use_fusion_emitters, and until 2026-12-04 every test died so on it (H200).
_UNKNOWN_VAR = "METARL_TEST_UNKNOWN_XLA_FLAGS"


def _unknown_to_xla(flags: tuple[str, ...]) -> list[str]:
    """The flags of `flags` that XLA refuses: all tried in one process (3 s), and where
    XLA refuses one of them, each in a process of its own."""

    def refused(*tried: str) -> bool:
        return (
            "Unknown flag in XLA_FLAGS"
            in subprocess.run(
                [sys.executable, "-c", "import jax; jax.devices()"],
                env=dict(os.environ, XLA_FLAGS=" ".join(tried), JAX_PLATFORMS="cpu"),
                capture_output=True,
                text=True,
                timeout=120,
            ).stderr
        )

    if _UNKNOWN_VAR not in os.environ:
        unknown = [flag for flag in flags if refused(flag)] if refused(*flags) else []
        os.environ[_UNKNOWN_VAR] = " ".join(unknown)
    return os.environ[_UNKNOWN_VAR].split()


if os.environ.get("METARL_TEST_XLA_DEFAULTS", "0") != "1":
    _ADDED += os.environ.get(_ADDED_VAR, "").split()
    _flags = os.environ.get("XLA_FLAGS", "")
    _unknown = _unknown_to_xla(FAST_COMPILE)
    for _flag in FAST_COMPILE:
        # a setting of the user's own wins
        if _flag.partition("=")[0] not in _flags and _flag not in _unknown:
            _flags = f"{_flags} {_flag}".strip()
            _ADDED.append(_flag)
    os.environ["XLA_FLAGS"] = _flags
    os.environ[_ADDED_VAR] = " ".join(_ADDED)

if os.environ.get("METARL_TEST_JAX_CACHE", "1") != "0":
    _dir = Path(__file__).resolve().parent.parent / ".pytest_cache" / "jax_compilation_cache"
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(_dir))
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "1")
    # A size limit makes JAX lock the cache (filelock), so that two processes
    # never read an entry while the other is still writing it.
    os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(8 << 30))

    import jax

    jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
    jax.config.update(
        "jax_persistent_cache_min_compile_time_secs",
        float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]),
    )
    jax.config.update(
        "jax_compilation_cache_max_size", int(os.environ["JAX_COMPILATION_CACHE_MAX_SIZE"])
    )


@contextlib.contextmanager
def optimized_training():
    """Inside: the PPO spaces built (`make_train_space`, `train`) compile their training
    iteration at XLA's level 2 where level 0 is the tests' own setting, not the user's:
    for a test that trains long, whose iteration level 0 runs 6x slower. A test that
    trains briefly keeps level 0: its iteration compiles faster there
    (tests/test_recurrent_ppo.py, cold: 139 s at level 0, 152 s at level 2)."""
    from metarl.agents.ppo import training

    before = training._ITERATE_COMPILER_OPTIONS  # noqa: SLF001
    if OPTIMIZED[0] in _ADDED:
        training._ITERATE_COMPILER_OPTIONS = {"xla_backend_optimization_level": 2}  # noqa: SLF001
    try:
        yield
    finally:
        training._ITERATE_COMPILER_OPTIONS = before  # noqa: SLF001


def xla_flags_without(drop: tuple[str, ...]) -> str:
    """XLA_FLAGS without the `drop` flags (for a process of a test's own)."""
    return " ".join(f for f in os.environ.get("XLA_FLAGS", "").split() if f not in drop)


def with_xla_defaults(module: str, call: str) -> str:
    """`repr` of ``module.call`` evaluated in a process of its own (the tests' folder
    importable) with XLA's current emitters (at level 0), for a claim that compares two
    programs bit for bit, which the older emitters fuse differently."""
    flags = xla_flags_without(FAST_COMPILE[:1])
    script = (
        f"import sys; sys.path.insert(0, sys.argv[1]); import {module} as t; print(repr(t.{call}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(Path(__file__).parent)],
        env=dict(os.environ, XLA_FLAGS=flags, METARL_TEST_XLA_DEFAULTS="1"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().split("\n")[-1]


BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def load_script(path: Path, name: str):
    """The script at `path` imported as module `name`."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def load_benchmark(name: str):
    """A script of benchmarks/, imported as a module (their shared `_cli` with them,
    as running a script puts its folder on the path)."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.append(str(BENCHMARKS))
    return load_script(BENCHMARKS / f"{name}.py", f"benchmarks_{name}")


PROFILE = os.environ.get("METARL_TEST_PROFILE")
_STAGES = {
    "/jax/core/compile/jaxpr_trace_duration": "trace",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
    "/jax/core/compile/backend_compile_duration": "compile",
}
_spent: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
_started = time.time()


_functions: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
_BUILT = re.compile(
    r"Finished (?:tracing (?P<trace>\S+) for \S+"
    r"|jaxpr to MLIR module conversion jit\((?P<lower>.+)\)"
    r"|XLA compilation of jit\((?P<compile>.+)\)) in (?P<seconds>[0-9.]+) sec"
)


def _test() -> str:
    return os.environ.get("PYTEST_CURRENT_TEST", "(outside a test)").split(" ")[0]


# Persistent cache hits by the compile time they stored (the threshold above decides
# which programs are stored): how many, and the seconds they saved.
_cache: collections.Counter = collections.Counter()
_saved: list[float] = []


def _listen(event: str, duration: float, **_) -> None:
    stage = _STAGES.get(event)
    if stage is not None:
        _spent[_test()][stage] += duration
    elif event == "/jax/compilation_cache/compile_time_saved_sec":
        _saved.append(duration)
    elif event == "/jax/compilation_cache/cache_retrieval_time_sec" and _saved:
        saved = _saved.pop()  # JAX records it just before the retrieval time
        band = "under 1 s" if saved + duration < 1 else "1 s or more"
        _cache.update({f"{band} hits": 1, f"{band} saved": saved})


class _Builds(logging.Handler):
    """Counts and times each jitted function's traces, lowerings and compiles."""

    def emit(self, record: logging.LogRecord) -> None:
        if m := _BUILT.search(record.getMessage()):
            stage = next(k for k in ("trace", "lower", "compile") if m[k])
            _functions[f"{stage} {m[stage]}"].update(
                {"count": 1, "seconds": float(m["seconds"]), _test(): 1}
            )


if PROFILE:
    import jax

    jax.monitoring.register_event_duration_secs_listener(_listen)
    jax.config.update("jax_log_compiles", True)
    _dispatch = logging.getLogger("jax._src.dispatch")
    _dispatch.addHandler(_Builds())
    _dispatch.propagate = False  # counted, not printed


# Seconds each test file took, cold, on 2 cores (`-n 2 --dist loadfile`; an Intel Xeon,
# 2026-12-07, at fb7cd65 with METARL_TEST_PROFILE, less the tests merged since then).
# pytest-xdist hands a worker a whole file at a time, by default the files with the most
# tests first; on 2026-12-03 it handed test_experiments.py (6 tests, 176 s) out last, and
# one worker finished 94 s after the other. Here the costliest files go first (a new
# file before all: its cost is unknown), which leaves at most a short file's time between
# the two. A cold run with METARL_TEST_PROFILE set prints this table measured anew, to
# paste here.
FILE_SECONDS = {
    "test_ppo.py": 304, "test_envs.py": 237, "test_autoreset.py": 210, "test_model_envs.py": 204,
    "test_experiments.py": 196, "test_runner.py": 195, "test_physics.py": 151,
    "test_benchmarks.py": 137, "test_contexts.py": 99, "test_reads.py": 98,
    "test_recurrent_ppo.py": 82, "test_probe.py": 62, "test_playground_experiment.py": 59,
    "test_task_contexts.py": 53, "test_evaluation.py": 52, "test_checkpoint.py": 37,
    "test_compilation.py": 23, "test_readme.py": 20, "test_live_elements.py": 19,
    "test_bad_inputs.py": 16, "test_names.py": 14, "test_stats.py": 8, "test_distributions.py": 5,
    "test_curricula.py": 4, "test_tensorboard.py": 1,
}  # fmt: skip


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):  # xdist: keep the order below
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: -FILE_SECONDS.get(item.path.name, float("inf")))


_file_seconds: collections.Counter = collections.Counter()


def pytest_runtest_logreport(report):
    """Each test's setup, call and teardown, summed per file (in the main process,
    which the workers send their reports to); printed with the profile."""
    if PROFILE:
        _file_seconds[Path(report.nodeid.split("::")[0]).name] += report.duration


def pytest_sessionfinish(session):
    if PROFILE and _spent:
        Path(PROFILE).mkdir(parents=True, exist_ok=True)
        (Path(PROFILE) / f"{os.getpid()}.json").write_text(json.dumps(_spent))
        (Path(PROFILE) / f"{os.getpid()}.functions").write_text(json.dumps(_functions))
        (Path(PROFILE) / f"{os.getpid()}.cache").write_text(json.dumps(_cache))


def _written(suffix: str) -> list[dict]:
    """What the workers wrote to PROFILE/<pid>.<suffix> since this run started."""
    paths = Path(PROFILE).glob(f"*.{suffix}")
    return [json.loads(p.read_text()) for p in paths if p.stat().st_mtime >= _started]


def pytest_terminal_summary(terminalreporter):
    """The profile of this run: the files the workers wrote since it started."""
    if not PROFILE or hasattr(terminalreporter.config, "workerinput"):
        return
    tests: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for written in _written("json"):
        for test, stages in written.items():
            tests[test].update(stages)
    total = sum(tests.values(), collections.Counter())
    write = terminalreporter.write_line
    write(f"JAX in the test processes: {', '.join(f'{k} {v:.0f} s' for k, v in total.items())}")
    cache = sum(map(collections.Counter, _written("cache")), collections.Counter())
    write(
        "Persistent cache hits, by the compile time they stored: "
        + "; ".join(
            f"{band}: {cache[f'{band} hits']} hits saved {cache[f'{band} saved']:.0f} s"
            for band in ("under 1 s", "1 s or more")
        )
    )
    for test, stages in sorted(tests.items(), key=lambda kv: -kv[1].total())[:25]:
        write(f"{stages.total():7.1f} s  {test}")
    functions: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for written in _written("functions"):
        for name, counts in written.items():
            functions[name].update(counts)
    files = ", ".join(f'"{f}": {round(t)}' for f, t in _file_seconds.most_common())
    write(f"Seconds per test file, for FILE_SECONDS: {{{files}}}")
    write("Functions JAX spent most on: seconds, times built, tests building them")
    for name, c in sorted(functions.items(), key=lambda kv: -kv[1]["seconds"])[:40]:
        write(f"{c['seconds']:7.1f} s {c['count']:5d} {len(c) - 2:4d}  {name}")
