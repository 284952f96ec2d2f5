"""What software a run ran on, recorded in its run.json and compared on resume.

`software()` names the versions of the libraries that produce a run's numbers
(JAX, Brax, MuJoCo, Flax, Optax, ...) and a hash of metarl's own source
(the `metarl` and `curricula` packages, file by file), so that a run resumed
on other code or libraries does not mix two runs silently
(`metarl.experiment.check_identity`). The hash, not a git commit, because it
changes exactly when the code that runs changes, and works for installed
wheels too.
"""

from __future__ import annotations

import hashlib
import pathlib
from importlib.metadata import PackageNotFoundError, version

import curricula
import metarl

LIBRARIES = ("jax", "jaxlib", "brax", "mujoco", "mujoco-mjx", "flax", "optax", "playground")
SOURCE_SUFFIXES = (".py", ".json")


def source_hash(*roots: pathlib.Path) -> str:
    """sha256 (first 16 hex digits) over the relative paths and bytes of the
    .py and .json files under `roots`."""
    digest = hashlib.sha256()
    for root in roots:
        files = sorted(p for p in root.rglob("*") if p.suffix in SOURCE_SUFFIXES)
        for path in files:
            digest.update(f"{root.name}/{path.relative_to(root).as_posix()}\0".encode())
            digest.update(path.read_bytes())
            digest.update(b"\0")
    return digest.hexdigest()[:16]


def software() -> dict[str, str | None]:
    """{name: version} of metarl, its source hash and the libraries it runs on
    (None for a library that is not installed)."""

    def installed(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    roots = [pathlib.Path(m.__file__).parent for m in (metarl, curricula)]
    return {
        "metarl": metarl.__version__,
        "metarl_source": source_hash(*roots),
        **{name: installed(name) for name in LIBRARIES},
    }
