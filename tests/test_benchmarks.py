"""The benchmark scripts' own logic (their timings run on demand, not here)."""

import importlib.util
import sys
from pathlib import Path

import numpy as np

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[f"benchmarks_{name}"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


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
