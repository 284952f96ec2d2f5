"""What every benchmark's command line checks, how it writes its `--out` file, and
the ratio of paired measurements (imported by the scripts here)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import numpy as np
from brax import envs as brax_envs

from metarl import provenance, stats
from metarl.contexts import BACKENDS


def check_counts(cfg, ids: tuple[str, ...] = (), zero_ok: tuple[str, ...] = ()) -> None:
    """Refuses a count below 1, naming its flag: every int field of the config
    dataclass `cfg`, and every int of a tuple field (``--num-envs 1024 0``). `ids`:
    fields that are not counts (a seed); `zero_ok`: counts that may be 0. A zero
    count otherwise ran every compilation and then failed on an empty median, or
    timed nothing."""
    for field in dataclasses.fields(cfg):
        if field.name in ids:
            continue
        value = getattr(cfg, field.name)
        least = 0 if field.name in zero_ok else 1
        values = value if isinstance(value, tuple) else (value,)
        if any(isinstance(v, int) and not isinstance(v, bool) and v < least for v in values):
            flag = "--" + field.name.replace("_", "-")
            raise ValueError(f"{flag} must be >= {least}, got {value!r}")


def check_envs(cfg) -> None:
    """Refuses an unknown Brax env in `cfg.envs` or an unknown `cfg.backend`, naming the
    valid choices, before anything is built."""
    known = sorted(brax_envs._envs)  # noqa: SLF001 - Brax has no public listing
    if unknown := [e for e in cfg.envs if e not in known]:
        raise ValueError(f"--envs: unknown Brax env {unknown}; valid names: {', '.join(known)}")
    if cfg.backend is not None and cfg.backend not in BACKENDS:
        raise ValueError(
            f"--backend {cfg.backend!r}: choose one of {', '.join(BACKENDS)} "
            "(or leave it out for each env's default)"
        )


def write_json(out: str, record) -> None:
    """Writes `record` as indented JSON to `out` (its folder made if missing) and says so."""
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(record, indent=1))
    print(f"wrote {out}")


def per_env_results(cfg, bench) -> dict:
    """Runs `bench(name, cfg)` for each of `cfg.envs` and returns them with the config,
    the software and the platform (`metarl.provenance`), written to `cfg.out` if set."""
    print(f"jax {jax.__version__} on {jax.default_backend()} ({jax.devices()[0].device_kind})")
    results = {
        "config": dataclasses.asdict(cfg),
        "software": provenance.software(),
        "platform": provenance.platform(),
        "envs": {name: bench(name, cfg) for name in cfg.envs},
    }
    if cfg.out:
        write_json(cfg.out, results)
    return results


def paired_ratio(numer, denom) -> tuple[float, float, float]:
    """(ratio, ci_low, ci_high) of paired positive measurements, numer[i] / denom[i]:
    their geometric mean and its 95% t interval, from the t interval of the log ratios
    (`metarl.stats.difference`, paired; NaN bounds below 2 pairs)."""
    d = stats.difference(
        np.log(np.asarray(numer, np.float64)), np.log(np.asarray(denom, np.float64)), paired=True
    )
    return float(np.exp(d.diff)), float(np.exp(d.ci_low)), float(np.exp(d.ci_high))
