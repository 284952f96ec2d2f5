"""Counting XLA compilations, to prove that a loop does not recompile, and timing
them, to leave them out of a throughput; reading what a compiled program's loops carry."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
from collections.abc import Iterator

import jax

BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"
# JAX's events for the stages that turn a function into an executable: tracing to a
# jaxpr, lowering to MLIR and XLA's compilation (or its load from the persistent cache)
COMPILE_STAGES = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    BACKEND_COMPILE,
)


@dataclasses.dataclass
class CompileCount:
    """Number of XLA backend compilations seen so far inside the block, and the wall
    time spans of every compile stage (`seconds`: their union)."""

    count: int = 0
    spans: list[tuple[float, float]] = dataclasses.field(default_factory=list)

    @property
    def seconds(self) -> float:
        """Wall time spent compiling: a stage nested in another (a trace inside a
        trace, a compile inside a trace) counts once."""
        total, reach = 0.0, -math.inf
        for start, end in sorted(self.spans):
            start = max(start, reach)
            total += max(0.0, end - start)
            reach = max(reach, end)
        return total

    def __repr__(self) -> str:  # the spans are raw clock readings: their union reads better
        return f"CompileCount(count={self.count}, seconds={self.seconds:.2f})"


@contextlib.contextmanager
def count_compilations() -> Iterator[CompileCount]:
    """Counts backend compilations (JAX's `BACKEND_COMPILE` monitoring event) and
    times the compile stages.

    >>> with count_compilations() as c:
    ...     state = run_segment(state)
    >>> assert c.count == 0
    """
    counter = CompileCount()

    def listener(event: str, duration: float, **kwargs) -> None:
        if event == BACKEND_COMPILE:
            counter.count += 1

    def spans(event: str, start: float, end: float, **kwargs) -> None:
        if event in COMPILE_STAGES:
            counter.spans.append((start, end))

    jax.monitoring.register_event_duration_secs_listener(listener)
    jax.monitoring.register_event_time_span_listener(spans)
    try:
        yield counter
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
        jax.monitoring.unregister_event_time_span_listener(spans)


def loop_carries(hlo: str) -> list[int]:
    """How many numbers each while loop of a compiled program carries from one trip
    to the next, largest first. `hlo`: the program's text after XLA's optimisations
    (``jax.jit(f).lower(...).compile().as_text()``), after JAX and XLA dropped what
    no trip reads. A contextual step whose loops carry more than plain Brax's keeps
    state alive that nothing reads (tests/test_autoreset.py)."""
    bodies = set(re.findall(r"while\(.*?body=%?([\w.\-]+)", hlo))
    carries = []
    for comp in re.split(r"\n(?=\S)", hlo):  # a computation starts at column 0
        name = re.match(r"(?:ENTRY )?%?([\w.\-]+)", comp)
        param = re.search(r"= \((.*?)\) parameter\(0\)", comp)
        if name and param and name.group(1) in bodies:
            dims = re.findall(r"\w+\[([\d,]*)\]", param.group(1))
            carries.append(sum(math.prod(int(d) for d in shape.split(",") if d) for shape in dims))
    return sorted(carries, reverse=True)
