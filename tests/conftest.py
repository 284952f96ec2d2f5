"""Test-wide settings.

JAX's persistent compilation cache, shared by the pytest workers and the
experiment subprocesses the tests start: a program compiled once in a run
(a resumed experiment, the same rollout in two tests) is loaded, not
recompiled. Entries are keyed by the program, JAX version and flags, so the
cache never returns a stale executable. A cache load still fires JAX's
backend-compile event, so `metarl.compilation.count_compilations` counts it
and the no-recompile tests stay exact (tests/test_compilation.py).
Set METARL_TEST_JAX_CACHE=0 to switch it off.
"""

import os
from pathlib import Path

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


# Seconds each file took on 2 CPU cores from a cold cache (2026-11-25, `--durations`),
# heaviest first. `pytest -n 2 --dist loadfile` gives whole files to the workers in
# collection order (`pytest_configure` turns off xdist's reordering by test count, which
# sent the one-test, two-minute playground file last and left a worker idle for
# minutes): the heaviest files go first, so the two workers end together. Only the
# order changes; files not listed follow in their usual order.
FILE_SECONDS = {
    "test_ppo.py": 330,
    "test_envs.py": 283,
    "test_autoreset.py": 257,
    "test_runner.py": 165,
    "test_model_envs.py": 155,
    "test_recurrent_ppo.py": 151,
    "test_physics.py": 149,
    "test_playground_experiment.py": 120,
    "test_experiments.py": 106,
    "test_reads.py": 103,
    "test_contexts.py": 69,
    "test_evaluation.py": 59,
    "test_task_contexts.py": 44,
}


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist's --no-loadscope-reorder
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: -FILE_SECONDS.get(item.path.name, 0))
