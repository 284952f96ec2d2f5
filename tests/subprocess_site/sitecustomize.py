"""Python imports this module at the start of every process the tests start
(tests/conftest.py puts this folder first on their PYTHONPATH): their processes
collect garbage at the tests' threshold too (conftest's GC_THRESHOLD, passed on as
METARL_TEST_GC_THRESHOLD). A `sitecustomize` this folder hides is run after it."""

import gc
import importlib.machinery
import importlib.util
import os
import sys

if threshold := os.environ.get("METARL_TEST_GC_THRESHOLD"):
    gc.set_threshold(*map(int, threshold.split(",")))


def _run_the_hidden_one() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


_run_the_hidden_one()
