"""What software and platform a run ran on, recorded in its run.json and
compared on resume.

`software()` names the versions of the libraries that produce a run's numbers
(JAX, Brax, MuJoCo, Flax, Optax, ...) and a hash of metarl's own source
(the `metarl` and `curricula` packages, file by file), so that a run resumed
on other code or libraries does not mix two runs silently
(`metarl.rundir.check_identity`). The hash, not a git commit, because it
changes exactly when the code that runs changes, and works for installed
wheels too. `platform()` names what else changes the numbers of the same
code: the device kind and count (the envs are split over the devices), the
XLA flags and JAX's numerical settings, and on the CPU backend the host CPU:
XLA compiles for its instruction set and splits work over the cores it may
use, and both change the results (measured: quickstart's final extrapolation-low
return, same code and seed, was 152.2 on 2 cores with AVX-512, 203.9 with
``--xla_cpu_max_isa=AVX2`` and 350.7 on 1 core of the same machine).
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import platform as host
import shlex
from importlib.metadata import PackageNotFoundError, version

import jax

import curricula
import metarl

LIBRARIES = (
    "jax",
    "jaxlib",
    "brax",
    "mujoco",
    "mujoco-mjx",
    "flax",
    "optax",
    "distrax",
    "numpy",
    "scipy",  # the truncated normal's intervals: held-out sets, heatmap axes, ranges
    "playground",
)
SOURCE_SUFFIXES = (".py", ".json")
# JAX settings that change a program's numbers (random streams, precision, dtypes)
JAX_SETTINGS = (
    "jax_enable_x64",
    "jax_default_matmul_precision",
    "jax_threefry_partitionable",
    "jax_default_prng_impl",
    "jax_random_seed_offset",  # added to every seed: jax.random.key(0) is another key
)


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


def source_roots() -> list[pathlib.Path]:
    """The folders of metarl's own source (`source_hash`): metarl and curricula."""
    return [pathlib.Path(m.__file__).parent for m in (metarl, curricula)]


def software() -> dict[str, str | None]:
    """{name: version} of metarl, its source hash and the libraries it runs on
    (None for a library that is not installed)."""

    def installed(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    return {
        "metarl": metarl.__version__,
        "metarl_source": source_hash(*source_roots()),
        **{name: installed(name) for name in LIBRARIES},
    }


def platform() -> dict[str, str | int | None]:
    """What runs the programs, besides the software: JAX's backend ("cpu",
    "gpu", ...), the first device's kind ("NVIDIA H100 80GB HBM3"), the number
    of devices and processes, the XLA_FLAGS environment variable and the
    `JAX_SETTINGS`; on the CPU backend also `host_cpu()`. The same code and
    seed give other numbers when any of them changes."""
    backend = jax.default_backend()
    return {
        "backend": backend,
        "device_kind": jax.devices()[0].device_kind,
        "devices": jax.device_count(),
        "processes": jax.process_count(),
        "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
        **{name: str(getattr(jax.config, name)) for name in JAX_SETTINGS},
        **(host_cpu() if backend == "cpu" else {}),
    }


def xla_flags(flags: str) -> dict[str, str | None]:
    """`XLA_FLAGS` as XLA reads it: {name: value} (None for a bare ``--name``), the
    last of a repeated flag winning, in no order. Two strings that differ only in the
    order of their flags, or in a flag repeated with the value that wins anyway, set
    the same flags."""
    try:
        words = shlex.split(flags)  # XLA takes a value in double quotes as one word
    except ValueError:  # an unmatched quote: XLA's own parser refuses it anyway
        words = flags.split()
    parsed: dict[str, str | None] = {}
    for word in words:
        name, equals, value = word.partition("=")
        parsed.pop(name, None)
        parsed[name] = value if equals else None
    return parsed


def comparable(platform: dict) -> dict:
    """`platform` (a `platform()` record) with its XLA_FLAGS as the flags they set
    (`xla_flags`), so that the same flags in another order compare equal."""
    if isinstance(platform.get("XLA_FLAGS"), str):
        return {**platform, "XLA_FLAGS": xla_flags(platform["XLA_FLAGS"])}
    return platform


# /proc/cpuinfo flags of the vector instruction sets XLA's CPU compiler may target
_ISA_PREFIXES = ("sse", "ssse", "avx", "fma", "f16c", "amx", "asimd", "sve", "neon")


def host_cpu() -> dict[str, str | int]:
    """The host CPU as XLA's CPU backend uses it: ``cpu_model`` (the model name),
    ``cpu_isa`` (its vector instruction sets, which XLA compiles for, up to
    ``--xla_cpu_max_isa``) and ``cpu_cores`` (the cores this process may run on,
    over which XLA splits its work)."""
    info = {}
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    except OSError:  # not Linux
        pass
    model = info.get("model name") or host.processor() or host.machine()
    flags = (info.get("flags") or info.get("Features") or "").split()
    isa = sorted({f for f in flags if f.startswith(_ISA_PREFIXES)})
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu_model": model, "cpu_isa": " ".join(isa), "cpu_cores": cores}


def file_hash(path: str | os.PathLike | None) -> str | None:
    """sha256 (first 16 hex digits) of one file's bytes; None for no file."""
    if path is None or not pathlib.Path(path).is_file():
        return None
    return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()[:16]
