"""Data parallelism over every device: one mesh axis that splits the envs.

Single host: all local devices (on the CPU, simulate several with
``JAX_PLATFORMS=cpu JAX_NUM_CPU_DEVICES=2``). Several hosts: call
`initialize_distributed()` (a thin wrapper of `jax.distributed.initialize`)
first in every process; `jax.devices()` then lists every host's devices and
the same mesh spans them all. An env that a process builds itself (an instance
passed to `make_contextual`) must be built inside `process_local_devices()`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

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


@contextlib.contextmanager
def process_local_devices() -> Iterator[None]:
    """Within it, ``jax.devices()`` lists only this process's devices.

    MJX's ``put_model``, which Brax and Playground envs call when they are built,
    places the model on ``jax.devices()[0]``. In a multi-host run that device
    belongs to process 0: on every other process the model's arrays are then held
    by no local device, and nothing can read them. `make_contextual` builds envs
    given by name inside this; build an env instance inside it too. A no-op in a
    single process. Not thread-safe: it swaps ``jax.devices`` for the duration.
    """
    if jax.process_count() == 1:
        yield
        return
    every = jax.devices
    jax.devices = jax.local_devices
    try:
        yield
    finally:
        jax.devices = every


def check_local(tree, what: str) -> None:
    """Refuses a pytree with arrays that this process cannot read (see
    `process_local_devices`)."""
    remote = [
        x for x in jax.tree.leaves(tree) if isinstance(x, jax.Array) and not x.is_fully_addressable
    ]
    if remote:
        raise ValueError(
            f"{what} lives on {remote[0].sharding.device_set} of another process (process "
            f"{jax.process_index()} of {jax.process_count()} cannot read it): MJX's put_model "
            "puts a model on jax.devices()[0]. Build the env inside "
            "metarl.parallel.process_local_devices()"
        )


def fetch(tree):
    """`jax.device_get`, also of arrays spread over several processes: those are
    gathered from every process (`multihost_utils.process_allgather`), so each
    process reads the whole value. Only those are gathered: the gather concatenates
    every leaf it is given across processes, a host value or an array this process
    holds whole included (a scalar 7 would come back as [7, 7])."""
    leaves, treedef = jax.tree.flatten(tree)
    remote = [isinstance(x, jax.Array) and not x.is_fully_addressable for x in leaves]
    local = iter(jax.device_get([x for x, r in zip(leaves, remote, strict=True) if not r]))
    gathered = iter(())
    if any(remote):
        from jax.experimental import multihost_utils

        mine = [x for x, r in zip(leaves, remote, strict=True) if r]
        gathered = iter(multihost_utils.process_allgather(mine, tiled=True))
    return jax.tree.unflatten(treedef, [next(gathered if r else local) for r in remote])
