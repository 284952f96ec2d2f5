"""Counting XLA compilations, to prove that a loop does not recompile."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

import jax

BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"


@dataclasses.dataclass
class CompileCount:
    """Number of XLA backend compilations seen so far inside the block."""

    count: int = 0


@contextlib.contextmanager
def count_compilations() -> Iterator[CompileCount]:
    """Counts backend compilations (JAX's `BACKEND_COMPILE` monitoring event).

    >>> with count_compilations() as c:
    ...     state = run_segment(state)
    >>> assert c.count == 0
    """
    counter = CompileCount()

    def listener(event: str, duration: float, **kwargs) -> None:
        if event == BACKEND_COMPILE:
            counter.count += 1

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield counter
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
