"""What each `env_throughput` variant runs on a GPU, compiled here, on a machine without one.

XLA compiles a program for a GPU it is only told about (`jax.experimental.topologies`:
the CUDA plugin compiles for a description of the device; nothing runs). For every
variant this prints what one env step launches on the device: the operations the GPU
runs (each fusion, library call or copy is at least one kernel), loop by loop, and in
all per env step, split by stage as `env_throughput --profile` splits its time (MJX's
stages, metarl's resets, the rest). A loop whose trip count XLA cannot tell is a loop
whose predicate the host reads at every trip: it is listed, and its body counted
once each time the loop is entered.

Why: most sessions have no GPU, and the GPU's program is not the CPU's: XLA fuses
differently, and metarl picks the GPU's reset strategy (the stock) and leaves out
MJX's CPU fence when JAX's default backend is a GPU, which is what this compile
pretends (`jax.default_backend` reads "gpu" while the variants are built and traced;
MJX reads it too, only to pick sparse matrices on a TPU). A count is not a time: a
kernel that reads 8192 envs' contacts costs more than one that adds two numbers, and
the host's gaps between kernels are not in it. It tells where two variants' programs
differ, without a GPU; `env_throughput --profile` on a GPU tells what that costs.

Needs the CUDA plugin of the installed jaxlib (about 130 MB, no NVIDIA libraries)
and CUDA's `ptxas`, with which XLA assembles its kernels (a CUDA toolkit, or
`pip install nvidia-cuda-nvcc`):

    pip install "jax-cuda13-plugin==$(python -c 'import jaxlib; print(jaxlib.__version__)')"
    python benchmarks/gpu_program.py --envs ant --backend mjx --num-envs 8192 \\
        --variants plain brax_dr contextual

The GPU's description (`GPUS`) holds NVIDIA's published figures for the card: the
ones XLA's GPU compiler reads to choose its fusions and launch sizes.
"""

from __future__ import annotations

import collections
import dataclasses
import importlib.metadata
import json
import os
import re
import time
from pathlib import Path
from unittest import mock

# JAX's CPU backend alone: the CUDA plugin is loaded to compile, not to run (without a
# GPU its client cannot start), and without NVIDIA's libraries its version check fails
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")

import env_throughput as bench  # noqa: E402
import jax  # noqa: E402
import tyro  # noqa: E402

from metarl import provenance  # noqa: E402

# NVIDIA's published figures for each card (SXM, 132 SMs of compute capability 9.0),
# in the fields of XLA's GpuTargetConfigProto
_HOPPER = {
    "threads_per_block_limit": 1024,
    "threads_per_warp": 32,
    "shared_memory_per_block": 48 * 1024,
    "shared_memory_per_block_optin": 227 * 1024,
    "shared_memory_per_core": 228 * 1024,
    "threads_per_core_limit": 2048,
    "core_count": 132,
    "fpus_per_core": 128,
    "block_dim_limit_x": 2**31 - 1,
    "block_dim_limit_y": 65535,
    "block_dim_limit_z": 65535,
    "l2_cache_size": 50 * 2**20,
    "clock_rate_ghz": 1.98,
    "registers_per_core_limit": 65536,
    "registers_per_block_limit": 65536,
}
GPUS = {
    "h100": (
        "NVIDIA H100 80GB HBM3",
        {**_HOPPER, "memory_bandwidth": 3.35e12, "device_memory_size": 80 * 2**30},
    ),
    "h200": (
        "NVIDIA H200",
        {**_HOPPER, "memory_bandwidth": 4.8e12, "device_memory_size": 141 * 10**9},
    ),
}


def target_config(gpu: str) -> str:
    """The text of XLA's GpuTargetConfigProto for `gpu` (a key of `GPUS`)."""
    if gpu not in GPUS:
        raise ValueError(f"unknown GPU {gpu!r}: choose one of {sorted(GPUS)}")
    name, info = GPUS[gpu]
    fields = "\n".join(f"  {k}: {int(v) if float(v).is_integer() else v}" for k, v in info.items())
    return (
        f"gpu_device_info {{\n{fields}\n  cuda_compute_capability {{ major: 9 minor: 0 }}\n}}\n"
        f'platform_name: "CUDA"\ndnn_version_info {{ major: 9 minor: 10 }}\n'
        f'device_description_str: "{name}"\n'
    )


def gpu_device(gpu: str):
    """A compile-only device of the card `gpu`: jit a function onto it with input
    shardings on it, and compile."""
    from jax.experimental import topologies

    config = target_config(gpu)
    try:
        topology = topologies.get_topology_desc("", "cuda", target_config=config, topology="1x1x1")
    except NotImplementedError as e:
        raise RuntimeError(
            "no CUDA plugin to compile for a GPU: pip install "
            f'"jax-cuda13-plugin=={importlib.metadata.version("jaxlib")}" (jaxlib\'s version)'
        ) from e
    return topology.devices[0]


FREE = frozenset(  # instructions that launch nothing: views, tuples, constants
    "parameter constant get-tuple-element tuple bitcast after-all opt-barrier "
    "add-dependency partition-id replica-id domain".split()
)


@dataclasses.dataclass
class Loop:
    """One while loop of a program (or the program itself, `trips` 1): `name` is its
    instruction's, `scope` its op_name; `runs` how many times its body runs in one call
    of the program (None: its trip count is unknown, or it is nested in such a loop;
    its body is then counted once each time the loop is entered); `launches` what one
    trip launches outside the loops nested in it."""

    name: str
    scope: str
    trips: int | None
    runs: int | None
    launches: int
    depth: int


def _computations(hlo: str) -> tuple[dict[str, list[tuple[str, str, str]]], str]:
    """{computation: [(instruction, opcode, operands and attributes)]}, and the entry's name."""
    comps, current, entry = {}, None, None
    for line in hlo.splitlines():
        head = re.match(r"(ENTRY )?%?([\w.\-]+) .*\{\s*$", line)
        if head:
            current = comps.setdefault(head.group(2), [])
            entry = head.group(2) if head.group(1) else entry
        elif line.startswith("}"):
            current = None
        elif current is not None:
            m = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = .*? ([a-z][\w\-]*)\((.*)$", line)
            if m:
                current.append(m.groups())
    if entry is None:
        raise ValueError("no ENTRY computation: pass a compiled program (compiled.as_text())")
    return comps, entry


def launches(hlo: str) -> tuple[list[Loop], collections.Counter]:
    """The loops of a compiled program's text, outermost first, and {instruction: how many
    times one call of the program launches it} over every instruction that launches
    work (not `FREE`). A conditional counts every branch, as if each ran (an upper bound)."""
    comps, entry = _computations(hlo)
    loops: list[Loop] = []
    counts: collections.Counter = collections.Counter()

    def visit(comp: str, runs: int, depth: int, known: bool) -> int:
        own = 0
        for name, op, rest in comps[comp]:
            if op == "while":
                trip = re.search(r'"known_trip_count":\{"n":"(\d+)"', rest)
                trips = int(trip.group(1)) if trip else None
                scope = re.search(r'op_name="([^"]*)"', rest)
                each = runs * (trips or 1)
                known_here = known and trips is not None
                loop = Loop(
                    name,
                    scope.group(1) if scope else "",
                    trips,
                    each if known_here else None,
                    0,
                    depth + 1,
                )
                loops.append(loop)
                loop.launches = visit(_called(rest, "body"), each, depth + 1, known_here)
                visit(_called(rest, "condition"), runs * ((trips or 1) + 1), depth + 1, known_here)
            elif op == "call":
                own += visit(_called(rest, "to_apply"), runs, depth, known)
            elif op == "conditional":
                branches = re.search(r"branch_computations=\{([^}]*)\}", rest)
                names = re.findall(r"%?([\w.\-]+)", branches.group(1)) if branches else []
                names += [
                    _called(rest, k)
                    for k in ("true_computation", "false_computation")
                    if f"{k}=" in rest
                ]
                counts[name] += runs
                own += 1 + sum(visit(branch, runs, depth, known) for branch in names)
            elif op not in FREE:
                counts[name] += runs
                own += 1
        return own

    top = Loop("ENTRY", "", 1, 1, 0, 0)
    top.launches = visit(entry, 1, 0, True)
    return [top, *loops], counts


def _called(attributes: str, key: str) -> str:
    """The computation an instruction's attribute `key` (body=, to_apply=, ...) names."""
    return re.search(rf"{key}=%?([\w.\-]+)", attributes).group(1)


def per_step(hlo: str, steps: int) -> dict:
    """What one env step launches in a rollout of `steps` steps: in all, by stage
    (`bench.STAGES`), and every loop's launches per trip and trips per step."""
    loops, counts = launches(hlo)
    stages = bench._stages(hlo)  # noqa: SLF001
    by_stage: dict[str, float] = collections.Counter()
    for name, n in counts.items():
        by_stage[stages.get(name, bench.REST)] += n / steps
    return {
        "launches_per_step": sum(counts.values()) / steps,
        "by_stage": dict(sorted(by_stage.items(), key=lambda kv: -kv[1])),
        "loops": [
            {
                "scope": loop.scope[-80:],
                "depth": loop.depth,
                "trips": loop.trips,
                "launches_per_trip": loop.launches,
                "trips_per_step": None if loop.runs is None else loop.runs / steps,
            }
            for loop in loops
        ],
        "unknown_trip_loops": sum(loop.trips is None for loop in loops),
    }


@dataclasses.dataclass(frozen=True)
class Config:
    envs: tuple[str, ...] = ("ant",)
    num_envs: int = 8192
    steps: int = 32  # whole stock blocks (--stock-depth): a refill counted per block
    backend: str | None = None  # None: each env's default backend
    gpu: str = "h100"  # a key of GPUS
    variants: tuple[str, ...] = ("plain", "brax_dr", "contextual")
    strategy: str = "auto"  # the "contextual" variant's ("auto" as on a GPU: the stock)
    stock_depth: int = 16
    out: str | None = None  # a .json of every variant's counts
    dump_hlo: str | None = None  # a folder for each variant's GPU program (.hlo)


def compile_for(device, label: str, name: str, cfg: Config) -> str:
    """The text of variant `label`'s rollout (`env_throughput._build`), compiled for
    `device`, built and traced as on a GPU."""
    sharding = jax.sharding.SingleDeviceSharding(device)
    on_device = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)  # noqa: E731
    settings = bench.Config(
        envs=(name,),
        num_envs=(cfg.num_envs,),
        steps=cfg.steps,
        backend=cfg.backend,
        strategy=cfg.strategy,
        stock_depth=cfg.stock_depth,
        variants=(label,),
    )
    with mock.patch.object(jax, "default_backend", return_value="gpu"):
        rollout = bench._build(label, name, cfg.num_envs, settings)  # noqa: SLF001
        key = jax.random.key(0)
        state = jax.tree.map(on_device, jax.eval_shape(rollout.start, key))
        return rollout.run.trace(on_device(key), state).lower().compile().as_text()


def main(cfg: Config) -> None:
    device = gpu_device(cfg.gpu)
    print(f"jax {jax.__version__}: compiling for {device.device_kind} (no GPU runs)")
    results = {
        "gpu": device.device_kind,
        "jax": jax.__version__,
        "software": provenance.software(),
        "config": dataclasses.asdict(cfg),
        "envs": {},
    }
    for name in cfg.envs:
        rows = results["envs"][name] = {}
        for label in cfg.variants:
            t0 = time.perf_counter()
            hlo = compile_for(device, label, name, cfg)
            if cfg.dump_hlo:
                path = Path(cfg.dump_hlo) / f"{name}_{cfg.num_envs}_{label}_{cfg.gpu}.hlo"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(hlo)
            rows[label] = per_step(hlo, cfg.steps)
            rows[label]["compile_s"] = time.perf_counter() - t0
            if (name, label) in bench._STRATEGY:  # noqa: SLF001 (what "auto" resolved to)
                rows[label]["reset_strategy"] = bench._STRATEGY[name, label]  # noqa: SLF001
        _print(name, cfg, rows)
    if cfg.out:
        Path(cfg.out).with_suffix(".json").write_text(json.dumps(results, indent=1))
        print(f"wrote {Path(cfg.out).with_suffix('.json')}")


def _print(name: str, cfg: Config, rows: dict) -> None:
    base = rows.get("plain", next(iter(rows.values())))["launches_per_step"]
    stages = sorted({s for r in rows.values() for s in r["by_stage"]})
    print(f"\n{name}, {cfg.num_envs} envs, {cfg.steps} steps: launches per env step on {cfg.gpu}")
    print(
        f"| variant | all | vs {'plain' if 'plain' in rows else 'first'} | "
        + " | ".join(stages)
        + " |"
    )
    print("| --- | ---: | ---: | " + " | ".join("---:" for _ in stages) + " |")
    for label, r in rows.items():
        cells = " | ".join(f"{r['by_stage'].get(s, 0):.1f}" for s in stages)
        n = r["launches_per_step"]
        print(f"| {label} | {n:.1f} | {n / base:.3f} | {cells} |")
    for label, r in rows.items():
        print(f"  {label}: loops (launches per trip; trips per env step)")
        for loop in r["loops"]:
            if loop["trips"] is None:
                per = "a trip count the host reads"
            elif loop["trips_per_step"] is None:
                per = f"{loop['trips']} trips, in a loop of host-read trips"
            else:
                per = f"{loop['trips_per_step']:.3g} trips/step"
            where = loop["scope"] or "the program"
            indent = "  " * (loop["depth"] + 2)
            print(f"{indent}{loop['launches_per_trip']} per trip, {per}: {where}")


if __name__ == "__main__":
    main(tyro.cli(Config))
