"""Data parallelism over every device: one mesh axis that splits the envs.

Single host: all local devices (on the CPU, simulate several with
``JAX_PLATFORMS=cpu JAX_NUM_CPU_DEVICES=2``). Several hosts: call
`initialize_distributed()` (a thin wrapper of `jax.distributed.initialize`)
first in every process; `jax.devices()` then lists every host's devices and
the same mesh spans them all.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh

AXIS = "data"


def data_mesh() -> Mesh:
    """A 1-D mesh over all devices (of all hosts), axis name `AXIS`."""
    return Mesh(np.asarray(jax.devices()), (AXIS,))


def initialize_distributed(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
) -> None:
    """Joins a multi-host run; arguments default to the cluster's environment
    (SLURM, TPU pods, ...) as in `jax.distributed.initialize`."""
    jax.distributed.initialize(
        coordinator_address=coordinator_address,
        num_processes=num_processes,
        process_id=process_id,
    )
