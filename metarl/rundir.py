"""A run's directory: its layout, the identity ``run.json`` records (the config, the
env's settings and code, a digest of its physics model, the software and platform),
the check that a rerun matches that identity before it resumes (`check_identity`),
the lock one process holds on the directory, and atomic writes of its JSON files.
`metarl.experiment` drives the run itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import hashlib
import inspect
import json
import math
import os
import pathlib
import socket
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from metarl import provenance
from metarl.checkpoint import write_json
from metarl.envs import ContextualEnv
from metarl.tensorboard import flatten_hparams
from metarl.trees import stable_repr, to_numpy

if TYPE_CHECKING:
    from metarl.experiment import CurriculumLike, Experiment

HISTORY = "history.json"
RUN_FILE = "run.json"
CHECKPOINTS = "checkpoints"
LOCK_FILE = ".lock"  # held by the process running in a logdir
RESUME_MODES = ("auto", "never", "force")
# Fields a rerun may change under resume="auto": more (or fewer) segments, and how
# many fresh states a stock holds (speed and memory only: the states are the same).
EXTENDABLE = ("segments", "ppo.stock_depth")
# Fields not even resume="force" accepts: they would mix runs or fail to restore.
# (`env.model`, the physics model's digest, can be forced: a library upgrade may change it)
NEVER_FORCED = ("seed", "num_seeds", "ppo.", "experiment.")
# The env's reset strategy: "auto" records what it resolved to (`ContextualEnv`)
STRATEGY = "experiment.env.reset_strategy"
# Fields a run.json written by an older metarl lacks: not compared (with a note) then.
RECORDED_LATER = (
    STRATEGY,
    "experiment.env.reset_chunk",
    "experiment.env.space",
    "experiment.env.code",
    "experiment.env.data",
    "eval.probe",
)
# What a run ran on, recorded beside its config and compared like config fields
# "<section>.<name>" (forceable): provenance.software() (+ the script's hash), .platform()
ENVIRONMENT = ("software", "platform")


def describe_run(
    exp: Experiment, hparams: Any, num_seeds: int, seed: int, steps_per_segment: int, segments: int
) -> dict[str, Any]:
    config = flatten_hparams(hparams) if hparams is not None else {}
    config.update({f"ppo.{k}": v for k, v in flatten_hparams(exp.ppo).items()})
    config.update({f"eval.{k}": v for k, v in flatten_hparams(exp.eval).items()})
    config.update({f"experiment.env.{k}": v for k, v in describe_env(exp.env).items()})
    config.update(
        {
            "seed": int(seed),  # a NumPy integer (np.arange's) as run.json holds an int
            "num_seeds": num_seeds,
            "steps_per_segment": steps_per_segment,
            "segments": segments,
            "experiment.target": stable_repr(exp.target),
            "experiment.curriculum": _describe_curriculum(exp.curriculum),
            "env.model": model_digest(exp.env),
        }
    )
    # they decide no number: where the run is, how it resumes, what it keeps, and the
    # fields a script names in `RunArgs.unrecorded` (which of its variants run)
    for key in ("logdir", "resume", "keep_checkpoints", *getattr(hparams, "unrecorded", ())):
        config.pop(key, None)
    return json.loads(json.dumps(config, default=str))  # as run.json will hold it


def describe_env(env: ContextualEnv) -> dict[str, Any]:
    """The contextual wrapper's settings and the wrapped env's construction settings:
    its plain attributes (Brax envs keep their keyword arguments so, MjcfEnv its
    n_frames and noise), its config (Playground's ConfigDict) and the names of
    the functions it was given (MjcfEnv's observe, reward, terminated)."""
    inner = env.unwrapped
    described = {
        "class": f"{type(inner).__module__}.{type(inner).__qualname__}",
        "backend": env.binding.backend,
        "episode_length": env.episode_length,
        "episodes_per_trial": env.episodes_per_trial,
        "visible_context": env.visible_context,
        # strategies agree to float rounding, not bit for bit: a resume must use the same
        "reset_strategy": env.reset_strategy,
        "reset_chunk": env.reset_chunk,
        # the env's own space: its default ranges, and the scale of a visible context
        "space": stable_repr(env.space),
    }
    code, data = hashlib.sha256(), {}
    for name, value in sorted(vars(inner).items()):
        if hasattr(value, "to_dict"):  # ml_collections.ConfigDict
            value = value.to_dict()
        if inspect.isfunction(value):
            described[name] = f"{value.__module__}.{value.__qualname__}"
        elif _plain(value):
            described[name] = _portable(value)
        elif _data(value):  # MjcfEnv's task_params of arrays, a goal's default
            digest = hashlib.sha256()
            _digest_fields(digest, value)  # dtypes, shapes and bytes, as the model digest
            data[name] = digest.hexdigest()[:16]
        if callable(value) and not isinstance(value, type):
            code.update(f"{name}={_code_text(value)}\n".encode())
    # arrays and containers of them, by digest (until 2026-12-07 left out: a changed
    # default of an array task parameter resumed silently)
    described["data"] = data
    for cls in _own_classes(type(inner)):  # a user's env class: its edited step, reward
        code.update(f"class {cls.__module__}.{cls.__qualname__}={_source(cls)}\n".encode())
    # what the env's functions compute (an edited reward in an imported module, a
    # partial's arguments, captured arrays), which their names alone do not say
    described["code"] = code.hexdigest()[:16]
    return described


def _portable(value: Any) -> Any:
    """An absolute path (each Playground env keeps its XML's, in site-packages) as the
    file's name and a digest of its bytes: where a library is installed decides no
    number, and a run recorded it so could be neither resumed nor read from another
    venv, clone or machine (`experiment.` fields cannot be forced). Other values as
    they are."""
    if not (isinstance(value, str) and os.path.isabs(value)):
        return value
    path = pathlib.PurePath(value)
    digest = provenance.file_hash(value)
    return path.name if digest is None else f"{path.name} (sha256 {digest})"


def _same_place(old: Any, new: Any) -> bool:
    """Whether `old`, an absolute path an older metarl recorded, names the file `new`
    (`_portable`'s text) names."""
    return (
        isinstance(old, str)
        and os.path.isabs(old)
        and isinstance(new, str)
        and new.split(" (sha256 ")[0] == pathlib.PurePath(old).name
    )


def _data(value: Any) -> bool:
    """An array, or a non-empty tuple, list or mapping of arrays and plain values."""
    if isinstance(value, jax.Array | np.ndarray):
        return True
    items = value.values() if isinstance(value, Mapping) else value
    if not isinstance(value, tuple | list | Mapping) or not items:
        return False
    return all(_plain(v) or _data(v) for v in items)


def _own_classes(cls: type) -> list[type]:
    """The classes `cls` is built from that no other record covers: not those of an
    installed library (`software`'s versions), nor metarl's own (its source hash)."""
    covered = [root.resolve() for root in provenance.source_roots()]
    own = []
    for c in cls.__mro__:
        file = getattr(sys.modules.get(c.__module__), "__file__", None)
        if file is None:  # builtins, C extensions
            continue
        path = pathlib.Path(file).resolve()
        if {"site-packages", "dist-packages"} & set(path.parts) or any(
            path.is_relative_to(root) for root in covered
        ):
            continue
        own.append(c)
    return own


def _source(obj: Any) -> str:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return ""


def _code_text(fn: Any, _seen: frozenset = frozenset()) -> str:
    """Text that changes when what `fn` computes changes: a function's source (its
    bytecode where no source is found), defaults and plain captured values, and the
    functions it captures the same way (a schedule's start two closures deep); a
    partial's function and arguments; a bound method's function and its object's
    plain attributes; a jitted function's wrapped one; another callable's repr
    without addresses."""
    if id(fn) in _seen:  # a function that captures itself (recursion)
        return "(recursive)"
    seen = _seen | {id(fn)}
    if isinstance(fn, functools.partial):
        func = _code_text(fn.func, seen)
        return f"partial({func}, {stable_repr(fn.args)}, {stable_repr(fn.keywords)})"
    if inspect.ismethod(fn):
        state = {k: _value_text(v, seen) for k, v in sorted(vars(fn.__self__).items())}
        return f"method({_code_text(fn.__func__, seen)}, {state})"
    if inspect.isfunction(fn):
        try:
            source = inspect.getsource(fn)
        except (OSError, TypeError):
            source = f"{fn.__code__.co_code.hex()} {stable_repr(fn.__code__.co_consts)}"
        cells = [c.cell_contents for c in fn.__closure__ or () if _filled(c)]
        captured = [_value_text(v, seen) for v in cells]
        # the module's constants it reads (a target array, a weight): values, not names
        names = sorted(n for n in set(fn.__code__.co_names) if n in fn.__globals__)
        read = {n: _value_text(fn.__globals__[n]) for n in names if _is_data(fn.__globals__[n])}
        return (
            f"{fn.__module__}.{fn.__qualname__} {source} {stable_repr(fn.__defaults__)} "
            f"{stable_repr(fn.__kwdefaults__)} {captured} {read}"
        )
    if hasattr(fn, "__wrapped__"):  # jax.jit, functools.wraps
        return f"{type(fn).__qualname__}({_code_text(fn.__wrapped__, seen)})"
    return f"{type(fn).__qualname__} {stable_repr(fn)}"


def _is_data(value: Any) -> bool:
    return _plain(value) or isinstance(value, jax.Array | np.ndarray | np.generic)


def _value_text(value: Any, _seen: frozenset = frozenset()) -> str:
    """A captured value as text that changes with it: plain values exactly, arrays by
    dtype, shape and a digest of their bytes, functions by `_code_text`, anything
    else by its type."""
    if _plain(value):
        return stable_repr(value)
    if isinstance(value, jax.Array | np.ndarray | np.generic):
        digest = hashlib.sha256()
        _digest_fields(digest, value)  # dtype, shape and bytes, as the model digest
        return digest.hexdigest()[:16]
    if inspect.isfunction(value) or inspect.ismethod(value) or isinstance(value, functools.partial):
        return _code_text(value, _seen)
    return type(value).__qualname__


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018
    except ValueError:  # a cell not yet assigned
        return False
    return True


def _plain(value: Any) -> bool:
    """A value whose repr is the same in every process (numbers, strings, and
    tuples, lists and dicts of them)."""
    if isinstance(value, bool | int | float | str | np.integer | np.floating) or value is None:
        return True
    if isinstance(value, tuple | list):
        return all(_plain(v) for v in value)
    if isinstance(value, Mapping):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False


def model_digest(env: ContextualEnv) -> str:
    """sha256 (16 hex digits) of the default physics model (an edited MJCF, another
    asset or a constructor argument that changes the model): every field, the
    arrays and the static settings alike (integrator, solver, iterations, cone,
    disable flags, joint and geom types, ...), which a model's pytree leaves leave
    out."""
    digest = hashlib.sha256()
    _digest_fields(digest, env.binding.sys)
    return digest.hexdigest()[:16]


def _digest_fields(digest: Any, value: Any) -> None:
    """Feeds `value` into `digest`: dataclasses field by field, arrays as dtype, shape
    and bytes, containers item by item, scalars and enums by their text. Other
    objects (the MjModel a Brax System keeps beside its own fields) by type only."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        digest.update(type(value).__qualname__.encode())
        for field in dataclasses.fields(value):
            digest.update(f"|{field.name}=".encode())
            _digest_fields(digest, getattr(value, field.name))
    elif isinstance(value, jax.Array | np.ndarray | np.generic):
        leaf = to_numpy(value)
        digest.update(f"{leaf.dtype}{leaf.shape}".encode())
        digest.update(np.ascontiguousarray(leaf).tobytes())
    elif isinstance(value, tuple | list):
        digest.update(f"{type(value).__name__}{len(value)}".encode())
        for item in value:
            _digest_fields(digest, item)
    elif isinstance(value, Mapping):
        for key in sorted(value, key=str):
            digest.update(f"{key!r}:".encode())
            _digest_fields(digest, value[key])
    elif isinstance(value, bool | int | float | str | bytes) or value is None:
        digest.update(repr(value).encode())
    else:
        digest.update(type(value).__qualname__.encode())


def _describe_curriculum(curriculum: CurriculumLike) -> str:
    """The factory and arguments a curriculum was built with (`curricula.Curriculum.params`),
    or, for a curriculum that does not say, the name of its update function and a
    digest of its functions' code and captured values (`_code_text`)."""
    params = dict(getattr(curriculum, "params", None) or {})
    if params:
        args = ", ".join(f"{k}={stable_repr(v)}" for k, v in params.items() if k != "name")
        return f"{params['name']}({args})"
    update = curriculum.update
    if hasattr(update, "__qualname__"):
        name = f"{getattr(update, '__module__', '?')}.{update.__qualname__}"
    else:
        name = stable_repr(update)  # e.g. a functools.partial: its function and arguments
    # without params, what its functions compute decides the schedule: their code and
    # the values they capture (another start or threshold is another run)
    code = "\n".join(
        _code_text(getattr(curriculum, part))
        for part in ("init", "update", "ranges")
        if callable(getattr(curriculum, part, None))
    )
    return f"{name} (code {hashlib.sha256(code.encode()).hexdigest()[:16]})"


def _enumerate(items: list[str]) -> str:
    """ "a", "a and b", "a, b and c"."""
    return " and ".join(filter(None, [", ".join(items[:-1]), items[-1]]))


def run_logdirs(logdir: pathlib.Path) -> list[pathlib.Path]:
    """Where a run in `logdir` writes event files, for any number of seeds."""
    return [logdir, *sorted(logdir.glob("seed_*")), logdir / "aggregate"]


def _same(a: Any, b: Any) -> bool:
    """`a == b` for JSON values, with NaN equal to NaN (a NaN setting recorded in
    run.json is the same setting: ``nan != nan`` would refuse every resume)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def _differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    return {
        k: (old.get(k), new.get(k))
        for k in sorted(set(old) | set(new))
        if not _same(old.get(k), new.get(k))
    }


def _environment() -> dict[str, dict[str, Any]]:
    """The run's software (with a hash of the script that runs it) and platform."""
    script = getattr(sys.modules.get("__main__"), "__file__", None)
    return {
        "software": {**provenance.software(), "script": provenance.file_hash(script)},
        "platform": provenance.platform(),
    }


def _ran_strategy(record: dict[str, Any]) -> dict[str, Any]:
    """`record`'s config with the reset strategy its run ran: until 2026-11-27 (GPU,
    third session) an MJX env's "auto" stayed unresolved in the record, and ran the
    loop where JAX's default backend was a CPU and dense elsewhere (the strategy a
    resume must now pass: "auto" is the stock off a CPU)."""
    config, platform = record["config"], record.get("platform")
    backend = platform.get("backend") if isinstance(platform, dict) else None
    if config.get(STRATEGY) != "auto" or backend is None:
        return config
    return {**config, STRATEGY: "loop" if backend == "cpu" else "dense"}


def _config_differences(
    old: dict[str, Any], config: dict[str, Any]
) -> tuple[dict[str, tuple[Any, Any]], list[str]]:
    """(differences, unrecorded): `old` run.json's config (with the strategy it ran)
    against `config`, leaving out the fields an older metarl did not record."""
    unrecorded = [k for k in RECORDED_LATER if k in config and k not in old["config"]]
    config_now = {k: v for k, v in config.items() if k not in unrecorded}
    ran = _ran_strategy(old)
    # an env's file as an older metarl recorded it: its absolute path (`_portable`)
    ran = {k: config[k] if _same_place(v, config.get(k)) else v for k, v in ran.items()}
    return _differences(ran, json.loads(json.dumps(config_now))), unrecorded


def _lines(diff: Mapping[str, tuple[Any, Any]]) -> str:
    return "\n".join(f"  {k}: run has {a!r}, now {b!r}" for k, (a, b) in diff.items())


def check_recorded(
    logdir: pathlib.Path, config: dict[str, Any], who: str, also: tuple[str, ...] = ()
) -> None:
    """Refuses (ValueError naming the fields) to read `logdir`'s checkpoints as those of
    a run of `config` (`describe_run`'s) where its run.json records another value for
    a field that decides what they hold: the seeds, PPO, the env, target, curriculum
    (`NEVER_FORCED`; fields an older metarl did not record are not compared), and the
    fields that start with a prefix in `also` ("eval.": the run's held-out sets)."""
    path = logdir / RUN_FILE
    if not path.exists():
        raise ValueError(f"{who}: {logdir} holds no {RUN_FILE}: no run of metarl.experiment")
    changed, _ = _config_differences(json.loads(path.read_text()), config)
    compared = (*NEVER_FORCED, *also)
    diff = {k: v for k, v in changed.items() if k.startswith(compared) and k not in EXTENDABLE}
    if diff:
        raise ValueError(
            f"{who}: {logdir} holds a run of another experiment:\n{_lines(diff)}"
            + (f"; {_strategy_hint(diff[STRATEGY][0])}" if STRATEGY in diff else "")
        )


def _strategy_hint(ran: str) -> str:
    return (
        f"build the env with make_contextual(..., reset_strategy={ran!r}) to resume or read "
        'this run with the strategy it ran with ("auto" picks one for the kind of device '
        "JAX runs on)"
    )


def check_identity(
    logdir: pathlib.Path,
    config: dict[str, Any],
    resume: str,
    segments_done: int = 0,
    write: bool = True,
    saved: bool = True,
    quiet: bool = False,
) -> dict[str, Any]:
    """Refuses to continue a run whose recorded config differs (see `RESUME_MODES`);
    returns the record run.json is to hold, and writes it there if `write` (`Run`
    writes it only once the checkpoint is restored: a resume that fails changes
    nothing).

    resume="never": refuse any existing run. "auto": resume when the config is
    the same but for `EXTENDABLE` fields (more segments, a stock's depth). "force": also accept
    other differences, except `NEVER_FORCED` fields (seeds, PPO, the env's
    settings and space, target, curriculum), which would mix runs; accepted
    differences are recorded. The model digest `env.model` can be forced (a
    library upgrade may change it).
    The software a run ran on (`metarl.provenance.software`: library versions,
    a hash of metarl's source and of the script) and its platform
    (`metarl.provenance.platform`: device kind and count, XLA flags, JAX's
    numerical settings) count as config fields ``software.<name>`` and
    ``platform.<name>``: a rerun on other code, libraries or devices needs
    resume="force", and the earlier values are kept in ``<section>_before``
    (``config_before`` for forced config fields). `segments_done`: the segments
    the run's checkpoints hold; asking for fewer is refused. `saved=False`: the run
    saved nothing (an attempt interrupted before its first checkpoint), so any config
    starts it afresh, under resume="auto" or "force". `quiet`: print no notes (a
    check made ahead of the run, which checks again).
    """
    if resume not in RESUME_MODES:
        raise ValueError(f"resume must be one of {RESUME_MODES}, got {resume!r}")
    path = logdir / RUN_FILE
    now = _environment()
    record = {
        **now,
        **{f"{s}_before": [] for s in (*ENVIRONMENT, "config")},
        "config": config,
        "forced": [],
    }
    leftovers = [p.name for p in (logdir / CHECKPOINTS, logdir / HISTORY) if p.exists()]
    # event files where a run logs (a fresh start deletes its own stale ones)
    events = [f for d in run_logdirs(logdir) for f in d.glob("events.out.tfevents.*")]
    if not path.exists() and events:
        leftovers.append("TensorBoard event files")
    if not path.exists() and leftovers:
        raise SystemExit(
            f"{logdir} holds {_enumerate(leftovers)} but no {RUN_FILE}: the config they "
            f"were made with is unknown, so they are neither resumed nor replaced. Put the "
            f"run's {RUN_FILE} back, or start a new run with another --logdir"
        )

    def note(message: str) -> None:
        if not quiet:
            print(message, file=sys.stderr)

    old = json.loads(path.read_text()) if path.exists() else None
    if old is not None:
        if resume == "never":
            raise SystemExit(
                f"{logdir} already holds a run (resume='never'): choose another --logdir, "
                "or rerun with --resume auto to continue it"
            )
        if not saved:  # nothing to resume and nothing to mix: a fresh start
            note(f"{logdir} holds an attempt that saved no checkpoint: starting it afresh")
            old = None
    if old is not None:
        if config.get("segments", segments_done) < segments_done:
            raise SystemExit(
                f"{logdir} holds {segments_done} finished segments; --segments "
                f"{config['segments']} would end the run before them. Ask for at least "
                f"{segments_done} (more extends the run)"
            )
        diff, unrecorded = _config_differences(old, config)
        if unrecorded:
            note(f"{path} records no {unrecorded} (written by an older metarl): not compared")
        moved_on = set()  # the sections whose values changed (XLA_FLAGS in any order the same)
        for section in ENVIRONMENT:  # other code, libraries or devices: forceable
            if section in old:
                changed = _differences(
                    provenance.comparable(old[section]), provenance.comparable(now[section])
                )
                if changed:
                    moved_on.add(section)
                diff.update(
                    {f"{section}.{k}": (old[section].get(k), now[section].get(k)) for k in changed}
                )
            else:
                note(f"{path} records no {section} (written by an older metarl): not compared")
        blocking = {k: v for k, v in diff.items() if k not in EXTENDABLE}
        never = {k: v for k, v in blocking.items() if k.startswith(NEVER_FORCED)}
        if blocking and (resume == "auto" or never):
            lines = _lines(blocking)
            hint = (
                f"fields {sorted(never)} cannot be forced: start a new run with another --logdir"
                if never
                else "start a new run with another --logdir, or accept with --resume force"
            )
            if STRATEGY in never:  # "auto" resolves by device kind (and metarl version)
                hint += f"; or {_strategy_hint(never[STRATEGY][0])}"
            sections = {k.split(".")[0] for k in blocking}
            kinds = {s if s in ENVIRONMENT else "config" for s in sections}
            what = " and ".join(sorted(kinds))  # e.g. "config", "platform and software"
            raise SystemExit(f"{logdir} holds a run with another {what}:\n{lines}\n{hint}")
        if blocking and config.get("segments", segments_done) <= segments_done:
            # nothing would run: the finished run's logs would sit beside a config (and
            # software, platform) they were not made with, which eval_as_run then reads
            raise SystemExit(
                f"{logdir} holds a finished run of {segments_done} segments: no segment would "
                f"run with the forced fields, yet {RUN_FILE} would record them as the run's:"
                f"\n{_lines(blocking)}\nask for more --segments to go on with them, or start "
                "a new run with another --logdir"
            )
        record["forced"] = old.get("forced", []) + ([sorted(blocking)] if blocking else [])
        for section in ENVIRONMENT:  # the values of the segments before each change
            earlier = [old[section]] if section in moved_on else []
            record[f"{section}_before"] = old.get(f"{section}_before", []) + earlier
        earlier = {k: a for k, (a, _) in blocking.items() if k.split(".")[0] not in ENVIRONMENT}
        # a resume may change the stock's depth unforced, but the run goes on to float
        # rounding then, not bit for bit: its earlier depth is kept with the forced fields'
        moved = {k: v for k, v in diff.items() if k in EXTENDABLE and k != "segments"}
        earlier.update({k: a for k, (a, _) in moved.items()})
        if moved:
            note(f"Resuming with another stock depth, to float rounding:\n{_lines(moved)}")
        record["config_before"] = old.get("config_before", []) + ([earlier] if earlier else [])
        if blocking:
            note(f"Resuming with changed fields (forced): {sorted(blocking)}")
    if write:
        write_json(path, record)
    return record


@contextlib.contextmanager
def exclusive(logdir: pathlib.Path):
    """Holds ``<logdir>/.lock`` for the run: a second process started on the same
    logdir would delete or overwrite what the first one writes, so it is refused."""
    logdir.mkdir(parents=True, exist_ok=True)
    with open(logdir / LOCK_FILE, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            raise SystemExit(
                f"{logdir} is in use by {holder}: wait for it to finish, or choose another --logdir"
            ) from None
        f.seek(0)
        f.truncate()
        f.write(f"process {os.getpid()} on {socket.gethostname()}")
        f.flush()
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
