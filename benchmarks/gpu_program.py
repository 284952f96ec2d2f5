"""What each `env_throughput` variant runs on a GPU, compiled here, on a machine without one.

XLA compiles a program for a GPU it is only told about (`jax.experimental.topologies`:
the CUDA plugin compiles for a description of the device; nothing runs). For every
variant this prints what one env step launches on the device: the operations the GPU
runs (each fusion, library call or copy is at least one kernel), loop by loop, and in
all per env step, split by stage as `env_throughput --profile` splits its time (MJX's
stages, metarl's resets, the rest). A loop whose trip count XLA cannot tell is a loop
whose predicate the host reads at every trip: it is listed, and its body counted
once each time the loop is entered.

It also reads what the GPU runtime does with the program (XLA's dump of its thunk
sequence): per env step, how many command buffers (CUDA graphs) the host launches, how
many kernels, copies and library calls it launches one by one outside them, and how
often it waits for the GPU (a loop of unknown trip count copies its predicate to the
host before every trip). A step on a GPU costs roughly the larger of the two: the
host's launches, or the device's kernels. For the kernels it estimates the bytes each
launch moves (`traffic`): over the card's bandwidth, a memory-bound kernel's time,
caches aside.

Why: most sessions have no GPU, and the GPU's program is not the CPU's: XLA fuses
differently, and metarl picks the GPU's reset strategy (the stock) when JAX's
default backend is a GPU, which is what this compile
pretends (`jax.default_backend` reads "gpu" while the variants are built and traced;
MJX reads it too, only to pick sparse matrices on a TPU). A count is not a time: a
kernel that reads 8192 envs' contacts costs more than one that adds two numbers, and
which of host or device bounds a step shows only on the GPU. It tells where two
variants' programs differ, without a GPU; `env_throughput --profile` on a GPU tells
what that costs.

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
import math
import os
import re
import tempfile
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
from _cli import check_counts

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


def _computations(hlo: str) -> tuple[dict[str, list[tuple[str, str, str]]], str, dict[str, str]]:
    """{computation: [(instruction, opcode, operands and attributes)]}, the entry's name,
    and {instruction: its shape}."""
    comps, current, entry, shapes = {}, None, None, {}
    for line in hlo.splitlines():
        head = re.match(r"(ENTRY )?%?([\w.\-]+) .*\{\s*$", line)
        if head:
            current = comps.setdefault(head.group(2), [])
            entry = head.group(2) if head.group(1) else entry
        elif line.startswith("}"):
            current = None
        elif current is not None:
            m = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = (.*?) ([a-z][\w\-]*)\((.*)$", line)
            if m:
                name, shape, op, rest = m.groups()
                current.append((name, op, rest))
                shapes[name] = shape
    if entry is None:
        raise ValueError("no ENTRY computation: pass a compiled program (compiled.as_text())")
    return comps, entry, shapes


_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2}
_SLICING = frozenset({"gather", "dynamic-slice", "slice"})
_VIEWS = frozenset({"bitcast", "reshape"})  # in a fusion: the same numbers, read as sliced
_IN_PLACE = {"scatter": 2, "dynamic-update-slice": 1}  # which operand is the update


def _size(shape: str) -> int:
    """The bytes of an HLO shape (of a tuple: of all its elements)."""
    return sum(
        _DTYPE_BYTES.get(dtype, 8 if dtype.endswith("64") else 4)
        * math.prod(int(d) for d in dims.split(",") if d)
        for dtype, dims in re.findall(r"\b([a-z]+\d*)\[([\d,]*)\]", shape)
    )


def _operands(rest: str) -> list[str]:
    return re.findall(r"%([\w.\-]+)", rest.split(")", 1)[0])


def traffic(hlo: str) -> dict[str, int]:
    """{instruction: the bytes of memory one launch of it reads and writes}, an estimate
    for each instruction `launches` counts: its operands read once and its result written
    once, except that an operand only sliced (gather, dynamic-slice, slice) is read as
    the slices, and an update in place (scatter, dynamic-update-slice: XLA aliases the
    buffer) reads and writes the update alone. Caches and fusions' recomputation aside."""
    comps, _, shapes = _computations(hlo)
    fused = {_called(rest, "calls") for c in comps.values() for _, op, rest in c if op == "fusion"}
    out = {}
    for comp_name, comp in comps.items():
        if comp_name in fused:  # a fusion's instructions: in its one launch
            continue
        for name, op, rest in comp:
            if op in FREE or op in ("while", "call", "conditional"):
                continue
            if op == "fusion":
                out[name] = _fusion_traffic(comps[_called(rest, "calls")], shapes)
            elif op in _IN_PLACE:
                out[name] = 2 * _size(shapes[_operands(rest)[_IN_PLACE[op]]])
            elif op in _SLICING or op == "copy":
                out[name] = 2 * _size(shapes[name])
            else:
                out[name] = _size(shapes[name]) + sum(_size(shapes[o]) for o in _operands(rest))
    return out


def _fusion_traffic(body: list[tuple[str, str, str]], shapes: dict[str, str]) -> int:
    """`traffic` of one launch of the fusion whose computation is `body`."""
    users = collections.defaultdict(list)
    ops = {name: (op, _operands(rest)) for name, op, rest in body}
    for name, (_, operands) in ops.items():
        for o in operands:
            users[o].append(name)
    root = body[-1][0]  # XLA prints a computation's root last
    results = ops[root][1] if ops[root][0] == "tuple" else [root]
    written, in_place = 0, set()
    for r in results:
        op, operands = ops.get(r, ("", []))
        if op in _IN_PLACE:
            written += _size(shapes[operands[_IN_PLACE[op]]])
            in_place.add(operands[0])
        else:
            written += _size(shapes[r])

    def sliced(name: str) -> int:  # the bytes of `name` its users read: the slices they
        # take, through views (a gather's row, bitcast, then sliced into each field: the
        # field, since 2026-12-05, not the row), else all of it
        size = _size(shapes[name])
        if not users[name] or not all(ops[u][0] in _SLICING | _VIEWS for u in users[name]):
            return size
        return min(size, sum(sliced(u) for u in users[name]))

    read = sum(
        sliced(name) for name, (op, _) in ops.items() if op == "parameter" and name not in in_place
    )
    return read + written


def launches(hlo: str) -> tuple[list[Loop], collections.Counter]:
    """The loops of a compiled program's text, outermost first, and {instruction: how many
    times one call of the program launches it} over every instruction that launches
    work (not `FREE`). A conditional counts every branch, as if each ran (an upper bound)."""
    comps, entry, _ = _computations(hlo)
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


def per_step(hlo: str, steps: int, program: Program | None = None) -> dict:
    """What one env step launches in a rollout of `steps` steps: in all, by stage
    (`bench.STAGES`), and every loop's launches per trip and trips per step; the bytes
    its launches move (`traffic`), in all and by stage; with `program` (whose text is
    `hlo`), also what the host does per step (`host_work`)."""
    loops, counts = launches(hlo)
    stages = bench._stages(hlo)  # noqa: SLF001
    moved = traffic(hlo)
    by_stage: dict[str, float] = collections.Counter()
    bytes_by_stage: dict[str, float] = collections.Counter()
    for name, n in counts.items():
        by_stage[stages.get(name, bench.REST)] += n / steps
        bytes_by_stage[stages.get(name, bench.REST)] += moved.get(name, 0) * n / steps
    return {
        "launches_per_step": sum(counts.values()) / steps,
        "by_stage": dict(sorted(by_stage.items(), key=lambda kv: -kv[1])),
        "bytes_per_step": sum(bytes_by_stage.values()),
        "bytes_by_stage": dict(sorted(bytes_by_stage.items(), key=lambda kv: -kv[1])),
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
        "host_per_step": None
        if program is None
        else {
            k: v / steps
            for k, v in host_work(
                thunk_sequence(program.thunks), while_trips(loops, program.metadata)
            ).items()
        },
    }


@dataclasses.dataclass
class Thunk:
    """One step of XLA's GPU runtime (its thunk sequence): `kind` as XLA names it
    (kCommandBuffer, kWhile, kCustomKernel, kCopy, ...), `id` its thunk id; `inner`
    a command buffer's commands or a sequence's thunks, `condition` and `body` a while
    loop's."""

    kind: str
    id: int
    inner: list[Thunk] = dataclasses.field(default_factory=list)
    condition: list[Thunk] = dataclasses.field(default_factory=list)
    body: list[Thunk] = dataclasses.field(default_factory=list)


def thunk_sequence(text: str) -> list[Thunk]:
    """The thunks of XLA's dump of a program's thunk sequence (the file
    `*.thunk_sequence_after_thunk_passes.txt`, or `*.thunk_sequence.txt` where the
    passes changed nothing), nested as the dump indents them."""
    items = []  # (indent, kind or label, id)
    for line in text.splitlines():
        label = re.match(r"\s*(condition|body):\s*$", line)
        if label:
            items.append((len(line) - len(line.lstrip()), label.group(1), -1))
            continue
        # a sequence's first thunk shares its line, further right: nested in it
        for m in re.finditer(r"\b(\d{3,}): (k\w+)", line):
            items.append((m.start(), m.group(2), int(m.group(1))))
    top = Thunk("program", -1)
    stack: list[tuple[int, Thunk]] = []
    section: dict[int, str] = {}  # a while's id: which of its lists takes its next thunk
    for indent, kind, ident in items:
        if kind in ("condition", "body"):
            if kind == "body":  # "condition:" starts its line; "body:" is indented
                while stack and stack[-1][0] >= indent:
                    stack.pop()
            owner = next(t for _, t in reversed(stack) if t.kind == "kWhile")
            section[id(owner)] = kind
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1] if stack else top
        thunk = Thunk(kind, ident)
        getattr(parent, section.get(id(parent), "inner")).append(thunk)
        stack.append((indent, thunk))
    return top.inner


def while_trips(loops: list[Loop], metadata: str) -> dict[int, int | None]:
    """{a while thunk's id: its trip count}, None where XLA cannot tell it: read from
    the dump's thunk metadata (which instruction each thunk runs) and the program's
    `loops` (`launches`)."""
    known = {loop.name: loop.trips for loop in loops[1:]}
    trips = {}
    for block in re.findall(r"thunk_metadata \{(.*?)\n\}", metadata, re.S):
        kind = re.search(r'thunk_kind: "(\w+)"', block)
        ident = re.search(r"thunk_id: (\d+)", block)
        name = re.search(r'profile_annotation: "([^"]+)"', block)
        if kind and kind.group(1) == "kWhile" and ident and name:
            trips[int(ident.group(1))] = known.get(name.group(1))
    return trips


def host_work(sequence: list[Thunk], trips: dict[int, int | None]) -> collections.Counter:
    """What the host does in one call of a program, from its thunk sequence: `graphs`,
    the command buffers it launches (each a CUDA graph of kernels); `launches`, the
    thunks it launches one by one (kernels, copies, library calls outside a graph);
    `syncs`, the times it waits for the GPU to read a loop's predicate (a while loop of
    unknown trip count waits before each trip and once more to stop, a conditional
    before it branches); `in_graphs`, the commands in the graphs it launches. A loop of
    unknown trips is counted as one trip each time it is entered (`unknown_loops` counts
    those entries); a conditional counts every branch, as if each ran."""
    work: collections.Counter = collections.Counter()

    def visit(seq: list[Thunk], runs: int) -> None:
        for t in seq:
            if t.kind == "kCommandBuffer":
                work["graphs"] += runs
                work["in_graphs"] += runs * len(t.inner)
            elif t.kind == "kWhile":
                n = trips.get(t.id)
                if n is None:
                    work["unknown_loops"] += runs
                    work["syncs"] += 2 * runs
                    visit(t.condition, 2 * runs)
                visit(t.body, runs * (n or 1))
            elif t.kind == "kConditional":  # reads its branch index on the host
                work["syncs"] += runs
                visit(t.inner, runs)
            elif t.inner:
                visit(t.inner, runs)
            else:
                work["launches"] += runs

    visit(sequence, 1)
    return work


@dataclasses.dataclass(frozen=True)
class Config:
    envs: tuple[str, ...] = ("ant",)
    num_envs: int = 8192
    steps: int = 32  # whole stock blocks (--stock-depth): a refill counted per block
    backend: str | None = None  # None: each env's default backend
    gpu: str = "h100"  # a key of GPUS
    variants: tuple[str, ...] = ("plain", "brax_dr", "contextual")
    strategy: str = "auto"  # the "contextual" variant's ("auto" as on a GPU: the stock)
    # as env_throughput's and PPO's (a stock of 32 refilled every 16 steps at
    # unroll_length 16; until 2026-12-07 a depth of 16, a program the GPU timings
    # never ran unless a variant named contextual_stock:32)
    stock_depth: int = 32
    stock_block: int = 16  # the steps between two chances to refill (PPO: unroll_length)
    out: str | None = None  # a .json of every variant's counts
    dump_hlo: str | None = None  # a folder for each variant's GPU program (.hlo)

    def __post_init__(self):
        check_counts(self)


@dataclasses.dataclass(frozen=True)
class Program:
    """A variant's program compiled for a GPU: `hlo` its text after XLA's passes;
    `thunks` and `metadata` XLA's dump of the thunk sequence the GPU runtime runs (with
    its command buffers: CUDA graphs) and of which instruction each thunk runs."""

    hlo: str
    thunks: str
    metadata: str


def compile_for(device, label: str, name: str, cfg: Config) -> Program:
    """Variant `label`'s rollout (`env_throughput._build`), compiled for `device`,
    built and traced as on a GPU."""
    sharding = jax.sharding.SingleDeviceSharding(device)
    on_device = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)  # noqa: E731
    settings = bench.Config(
        envs=(name,),
        num_envs=(cfg.num_envs,),
        steps=cfg.steps,
        backend=cfg.backend,
        strategy=cfg.strategy,
        stock_depth=cfg.stock_depth,
        stock_block=cfg.stock_block,
        variants=(label,),
    )
    with mock.patch.object(jax, "default_backend", return_value="gpu"):
        rollout = bench._build(label, name, cfg.num_envs, settings)  # noqa: SLF001
        key = jax.random.key(0)
        state = jax.tree.map(on_device, jax.eval_shape(rollout.start, key))
        return compile_dumped(rollout.run.trace(on_device(key), state).lower())


def compile_dumped(lowered) -> Program:
    """Compile `lowered` (a `jax.stages.Lowered` for a GPU) with XLA's dumps on, and
    read back its program and its thunk sequence."""
    with tempfile.TemporaryDirectory() as folder:
        compiled = lowered.compile(compiler_options={"xla_dump_to": folder})

        def dumped(suffix: str) -> str | None:
            found = sorted(Path(folder).glob(f"*{suffix}"))
            return found[-1].read_text() if found else None

        thunks = dumped(".thunk_sequence_after_thunk_passes.txt")
        thunks = thunks if thunks is not None else dumped(".thunk_sequence.txt")
        metadata = dumped(".thunk_metadata.txt")
        if thunks is None or metadata is None:
            raise RuntimeError(f"XLA dumped no thunk sequence: is {lowered} for a GPU?")
        return Program(compiled.as_text(), thunks, metadata)


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
            program = compile_for(device, label, name, cfg)
            if cfg.dump_hlo:
                stem = Path(cfg.dump_hlo) / f"{name}_{cfg.num_envs}_{label}_{cfg.gpu}"
                stem.parent.mkdir(parents=True, exist_ok=True)
                stem.with_suffix(".hlo").write_text(program.hlo)
                stem.with_suffix(".thunks").write_text(program.thunks)
            rows[label] = per_step(program.hlo, cfg.steps, program)
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
    print(f"\nper env step on {cfg.gpu}: what the host does (XLA's thunk sequence), MB moved")
    print(
        "| variant | graphs | launches outside graphs | host syncs | in graphs | MB | "
        + " | ".join(f"MB {s}" for s in stages)
        + " |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | " + " | ".join("---:" for _ in stages) + " |")
    for label, r in rows.items():
        h = collections.Counter(r["host_per_step"])
        mb = " | ".join(f"{r['bytes_by_stage'].get(s, 0) / 1e6:.1f}" for s in stages)
        print(
            f"| {label} | {h['graphs']:.2f} | {h['launches']:.2f} | {h['syncs']:.3f} |"
            f" {h['in_graphs']:.1f} | {r['bytes_per_step'] / 1e6:.1f} | {mb} |"
        )


if __name__ == "__main__":
    main(tyro.cli(Config))
