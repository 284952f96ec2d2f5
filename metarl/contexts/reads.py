"""Which raw System fields each backend reads: a measured table, not a hand list.

`system_reads.json`, next to this module, is written by
``scripts/system_reads.py``: for each backend and each measured Brax env, every
float leaf of the env's System was perturbed and a short rollout rerun. A field
is *read* on a backend when the pipeline state changed in at least one env;
*env-only* when only the observation or reward changed (the env's own code
looks at it, the simulation does not: writing it would desynchronise the
observation from the physics); *unread* when nothing changed in any env.

`unread(backend, field)` is True for env-only and unread fields: a raw context
path naming one would be a silent no-op, so `ContextSpace` binding refuses it.
`tests/test_reads.py` re-measures one (env, backend) pair against the table,
so a Brax or MuJoCo upgrade that changes what is read fails a test.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

SCRIPT = "scripts/system_reads.py"
TABLE = "system_reads.json"


@functools.cache
def table() -> dict[str, Any]:
    """The measured table (see module docstring), loaded once."""
    text = resources.files(__package__).joinpath(TABLE).read_text()
    return json.loads(text)


def measured_envs() -> tuple[str, ...]:
    """The Brax envs the table was measured on."""
    return tuple(table()["envs"])


def read_fields(backend: str) -> frozenset[str]:
    """Fields that at least one measured env's physics reads on `backend`."""
    return frozenset(table()["backends"].get(backend, {}).get("read", ()))


def unread(backend: str, field: str) -> bool:
    """True if no measured env's physics reads System field `field` on `backend`.

    `field` is a dotted leaf path (``"link.inertia.mass"``). A field the table
    does not list (not a float leaf, or a backend never measured) is not
    called unread: other checks decide about it.
    """
    row = table()["backends"].get(backend)
    if row is None:
        return False
    return field in row["unread"] or field in row["env_only"]


def explain(backend: str, field: str) -> str:
    """Why `field` counts as unread on `backend`, for error messages."""
    row = table()["backends"][backend]
    versions = ", ".join(f"{k} {v}" for k, v in table()["versions"].items() if k != "python")
    what = (
        "only the env's own observation code reads it, the simulation does not"
        if field in row["env_only"]
        else "changing it changed nothing"
    )
    return (
        f"the {backend!r} backend never reads {field!r}: {what} (measured by {SCRIPT} "
        f"on {', '.join(measured_envs())}; {versions})"
    )
