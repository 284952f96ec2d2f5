"""Test-wide settings.

JAX's persistent compilation cache, shared by the pytest workers and the
experiment subprocesses the tests start: a program compiled once in a run
(a resumed experiment, the same rollout in two tests) is loaded, not
recompiled. Entries are keyed by the program, JAX version and flags, so the
cache never returns a stale executable. A cache load still fires JAX's
backend-compile event, so `metarl.compilation.count_compilations` counts it
and the no-recompile tests stay exact (tests/test_compilation.py).
Set METARL_TEST_JAX_CACHE=0 to switch it off.

XLA's older CPU emitters (`--xla_cpu_use_fusion_emitters=false`, added to XLA_FLAGS
for the workers and every subprocess they start): the suite is mostly compilation
(about two thirds of its time), and a contextual env's programs compile about 35%
faster with them (inverted_pendulum's rollout 6.9 -> 4.2 s, hopper's 14.6 -> 10.2 s;
the suite cold on 2 cores 20-21 -> 13 minutes). What the tests check holds with either
emitters: the strategies agree bit for bit, MJX's drift without the fence still shows.
The one claim that compares two different programs bit for bit (tests/test_model_envs.py:
the default context against plain MJX) holds with XLA's defaults only, and runs in a
process of its own with them. Set METARL_TEST_XLA_DEFAULTS=1 to run everything with
XLA's defaults.
"""

import os
import subprocess
import sys
from pathlib import Path

FAST_COMPILE = "--xla_cpu_use_fusion_emitters=false"
if os.environ.get("METARL_TEST_XLA_DEFAULTS", "0") != "1":
    _flags = os.environ.get("XLA_FLAGS", "")
    if "xla_cpu_use_fusion_emitters" not in _flags:
        os.environ["XLA_FLAGS"] = f"{_flags} {FAST_COMPILE}".strip()

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


def with_xla_defaults(module: str, call: str) -> str:
    """`repr` of ``module.call`` evaluated in a process of its own with XLA's default
    flags (the tests' folder importable): for a claim that compares two programs bit
    for bit, which the older emitters fuse differently."""
    flags = os.environ.get("XLA_FLAGS", "").replace(FAST_COMPILE, "").strip()
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
