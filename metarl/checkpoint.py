"""Atomic checkpoints of any JAX pytree (training state, context spaces, ...) with orbax.

```python
from metarl import checkpoint
checkpoint.save("runs/a/ckpt", step, state, keep=3)   # returns once fully written
state = checkpoint.restore("runs/a/ckpt", like=state)  # latest complete step
```

A state is saved as its flat list of leaves (plus each leaf's key path, shape and dtype,
and the tree structure with its static data) and restored into the treedef of `like`, so
custom nodes with static aux data (ContextSpace names, distribution flags) come back as
themselves; a `like` of another structure or other flags is refused. Orbax writes a step
to a temporary directory renamed when complete; old steps are renamed aside, then
deleted. A process killed at any point thus leaves every listed step complete.

Once orbax has written a step, `save` adds the SHA-256 of each of its files
(``metarl_files.json``). A step damaged on disk afterwards (a byte altered anywhere, a file
truncated, zeroed or missing) is reported by `restore` with a warning naming the files,
moved aside to ``damaged-<step>`` (``damaged-<step>-2``, ... if that step was damaged
before; kept, never deleted; see `damaged_steps`) and the newest intact step is restored
instead. Any error while reading a step whose files are all as saved (out of memory,
permissions, a network file system, an orbax incompatibility) is raised as it is, and
moves nothing. A step without the list (saved before 2026-12-06, or by a process killed
between orbax's rename and the list's) is judged damaged by the errors orbax raises
(`_is_damage`).
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import re
import shutil
import time
import warnings

import jax
import numpy as np
import orbax.checkpoint as ocp

from metarl.trees import ADDRESS, check_alive, is_key

__all__ = ["CheckpointError", "all_steps", "damaged_steps", "latest_step", "restore", "save"]

_TRASH = "_deleted"  # steps past `keep` are renamed in here (atomic), then removed
_DAMAGED = "damaged-"  # a damaged step is renamed to damaged-<step>[-<n>] and kept
_DAMAGED_NAME = re.compile(rf"{_DAMAGED}(\d+)(?:-(\d+))?")
_ITEM = "default"  # the step's subdirectory holding the arrays
_STEP_METADATA = "_CHECKPOINT_METADATA"  # orbax's file of a step's custom metadata
_FILES = "metarl_files.json"  # {"sha256": {path in the step: digest}}, written after orbax's


class CheckpointError(ValueError):
    """No checkpoint could be restored (damaged, or of another structure than `like`);
    the message says which step and why. A ValueError."""


def _manager(directory: pathlib.Path, keep: int | None = None) -> ocp.CheckpointManager:
    """A synchronous manager; it writes (and prunes to `keep` steps) only if keep is given."""
    handlers = ocp.handlers.DefaultCheckpointHandlerRegistry()
    for args in (ocp.args.StandardSave, ocp.args.StandardRestore):
        handlers.add(_ITEM, args, ocp.StandardCheckpointHandler)
    write = keep is not None
    options = ocp.CheckpointManagerOptions(
        preservation_policy=ocp.checkpoint_managers.LatestN(keep) if write else None,
        create=write,
        save_root_metadata=write,
        cleanup_tmp_directories=write,
        todelete_subdir=_TRASH,
        enable_async_checkpointing=False,
        # list the steps without reading each one's metadata (times and metrics, unused
        # here): a step whose metadata file is altered is found by `restore`, instead of
        # failing every listing, and with it every save
        lightweight_initialize=True,
    )
    return ocp.CheckpointManager(directory, options=options, handler_registry=handlers)


def _digest(leaves) -> str:
    """SHA-256 of the leaves' bytes: a step whose data changed on disk is caught."""
    h = hashlib.sha256()
    for x in leaves:
        h.update(np.ascontiguousarray(np.asarray(x)).tobytes())
    return h.hexdigest()


def write_json(path: pathlib.Path, data) -> None:
    """Replaces `path` atomically and durably: a crash, even a power cut, leaves the
    old file or the new one, never a truncated one (written, synced, renamed, and
    the rename synced)."""
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        f.write(json.dumps(data, indent=1, default=str))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def _sha256(path: pathlib.Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _file_digests(step_dir: pathlib.Path) -> dict[str, str]:
    """{path relative to `step_dir`: SHA-256} of the files orbax wrote there."""
    ours = (_FILES, pathlib.Path(_FILES).with_suffix(".tmp").name)
    return {
        str(p.relative_to(step_dir)): _sha256(p)
        for p in sorted(step_dir.rglob("*"))
        if p.is_file() and p.name not in ours
    }


def _check_files(step_dir: pathlib.Path) -> bool:
    """Whether `step_dir` has its list of file digests, every file being as saved (True)
    or the list missing (False). A file altered, missing or unreadable as data, or the list
    itself unreadable, raises _DamagedError naming them; an error of the operating system
    (permissions) is raised as it is."""
    listing = step_dir / _FILES
    try:
        saved = json.loads(listing.read_bytes())["sha256"]
        if not isinstance(saved, dict):
            raise TypeError(f"a {type(saved).__name__}")
    except FileNotFoundError:
        return False
    except (ValueError, KeyError, TypeError) as e:  # JSON and UTF-8 errors are ValueErrors
        raise _DamagedError(f"{listing} is unreadable ({type(e).__name__}: {e})") from None
    bad = []
    for name, digest in saved.items():
        path = step_dir / name
        try:
            if _sha256(path) != digest:
                bad.append(f"{name} (altered)")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            bad.append(f"{name} (missing)")
    if bad:
        raise _DamagedError(
            f"{step_dir}: files not as saved (SHA-256 in {_FILES}): {', '.join(bad)}"
        )
    return True


def _structure(treedef: jax.tree_util.PyTreeDef) -> str:
    """The tree structure with its static data (names, distribution flags) as text.

    Memory addresses are dropped: static data without a value-based repr (MJX's
    contact-layout wrappers in an mjx.Data) would otherwise differ on every run."""
    return ADDRESS.sub("", str(treedef))


def _flatten(tree) -> tuple[list[list], list, jax.tree_util.PyTreeDef]:
    """([key path, shape, dtype] per leaf, leaves (typed PRNG keys as raw data), treedef)."""
    with_paths, treedef = jax.tree_util.tree_flatten_with_path(tree)
    leaves = [jax.random.key_data(x) if is_key(x) else x for _, x in with_paths]
    described = [
        [jax.tree_util.keystr(p), list(np.shape(x)), np.dtype(getattr(x, "dtype", type(x))).name]
        for (p, _), x in zip(with_paths, leaves, strict=True)
    ]
    return described, leaves, treedef


def _empty_trash(directory: pathlib.Path) -> None:
    if jax.process_index() == 0:
        shutil.rmtree(directory / _TRASH, ignore_errors=True)


def all_steps(directory) -> list[int]:
    """Sorted steps of the complete checkpoints in `directory` ([] if there is none)."""
    directory = pathlib.Path(directory).absolute()
    if not directory.is_dir():
        return []
    # orbax stats every step it lists: a step that a saving process prunes meanwhile
    # raises FileNotFoundError here; list again, a few times
    for pause in (0.01, 0.02, 0.03, 0.04):
        try:
            return _listed_steps(directory)
        except FileNotFoundError:
            time.sleep(pause)
    return _listed_steps(directory)


def _listed_steps(directory: pathlib.Path) -> list[int]:
    with _manager(directory) as mngr:
        return sorted(int(s) for s in mngr.all_steps())


def require_step(directory, step: int | None = None) -> list[int]:
    """`all_steps(directory)`, which must hold `step` (any step if None): else
    FileNotFoundError naming the available steps, as `restore` raises it (check before
    building the state to restore into)."""
    if step is not None:
        _check_step(step)
    steps = all_steps(directory)
    if not steps or (step is not None and step not in steps):
        what = "checkpoint" if step is None else f"checkpoint step {step}"
        raise FileNotFoundError(f"no {what} in {directory}; available steps: {steps}")
    return steps


def latest_step(directory) -> int | None:
    """The highest complete step in `directory`, or None if there is no checkpoint."""
    return (all_steps(directory) or [None])[-1]


def damaged_steps(directory) -> list[str]:
    """Names of the damaged steps `restore` moved aside in `directory`, oldest step first.

    ``damaged-<step>``, then ``damaged-<step>-2``, ``-3``, ... for each later time the same
    step was found damaged; [] if there is none (or no `directory`). They are never deleted:
    a directory holding these but no intact step has lost its checkpoints to damage, and
    a run should not silently start over on top of them.
    """
    directory = pathlib.Path(directory)
    if not directory.is_dir():
        return []
    found = {
        p.name: (int(m[1]), int(m[2] or 1))
        for p in directory.iterdir()
        if p.is_dir() and (m := _DAMAGED_NAME.fullmatch(p.name))
    }
    return sorted(found, key=found.get)


def _check_step(step: object) -> None:
    if not isinstance(step, int | np.integer) or isinstance(step, bool) or step < 0:
        raise ValueError(f"checkpoint step must be an integer >= 0, got {step!r}")


def save(directory, step: int, state, *, keep: int = 3) -> pathlib.Path:
    """Writes `state` (any pytree of arrays) as checkpoint `step` under `directory`.

    Returns the step's directory once the checkpoint is complete on disk, after
    deleting all but the last `keep` steps. Raises ValueError if `step` exists or
    is below the newest step there: orbax keeps the `keep` steps saved last, so an
    older step saved after a newer one would delete a newer checkpoint.
    """
    directory = pathlib.Path(directory).absolute()
    _check_step(step)
    if not isinstance(keep, int | np.integer) or isinstance(keep, bool) or keep < 1:
        raise ValueError(f"keep must be an integer >= 1, got {keep!r}")
    check_alive(state, "the state", "checkpoint.save")
    steps = all_steps(directory)
    if step in steps:
        raise ValueError(f"checkpoint step {step} already exists in {directory}; not overwritten")
    if steps and step < max(steps):
        raise ValueError(
            f"checkpoint step {step} is below the newest step {max(steps)} in {directory}: "
            f"saving it would delete newer steps (keep={keep} keeps the steps saved last). "
            "Save steps in increasing order, or into another directory"
        )
    described, leaves, treedef = _flatten(state)
    for (path, _, dtype), x in zip(described, leaves, strict=True):
        if np.dtype(dtype).kind in "USOMm":  # orbax named the leaf by its index alone
            raise ValueError(
                f"checkpoint.save: leaf state{path} is a {type(x).__name__} of dtype {dtype}; "
                "a checkpoint holds arrays and numbers (bool, integer, float, complex) and "
                "PRNG keys: keep other values out of the state"
            )
    _one_process(leaves, "save")
    items = {str(i): x for i, x in enumerate(leaves) if np.size(x)}  # orbax refuses size 0
    if not items:
        raise ValueError("nothing to save: `state` has no leaf with at least one element")
    _empty_trash(directory)  # left by a process killed while deleting old steps
    with _manager(directory, keep) as mngr:  # synchronous: returns once renamed into place
        args = ocp.args.StandardSave(items)
        meta = {
            "leaves": described,
            "structure": _structure(treedef),
            "sha256": _digest(jax.device_get(leaves)),
        }
        saved = mngr.save(step, args=args, custom_metadata=meta, force=True)
        mngr.wait_until_finished()
    if not saved:
        raise RuntimeError(f"orbax declined to save step {step} in {directory}")
    step_dir = directory / str(step)
    if jax.process_index() == 0:
        write_json(step_dir / _FILES, {"sha256": _file_digests(step_dir)})
    _empty_trash(directory)
    return step_dir


def restore(directory, like, step: int | None = None):
    """Checkpoint `step` (the newest intact one if None) as a pytree shaped like `like`.

    `like` (e.g. a freshly initialised state; concrete values, not ShapeDtypeStructs)
    gives the structure, dtypes, shapes and the shardings of its jax arrays (numpy
    leaves come back as numpy). Raises FileNotFoundError if there is no checkpoint (or
    not that step), `CheckpointError` if it does not match `like`. With step=None a damaged
    newest step is reported with a warning, moved aside to ``damaged-<step>`` (or the
    next free ``damaged-<step>-<n>``), and the next older step is tried; `CheckpointError`
    if none is intact. An explicit `step` that is damaged raises `CheckpointError`. Any
    error that is not damage (see `_is_damage`) is raised as it is and moves nothing.
    """
    directory = pathlib.Path(directory).absolute()
    if any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree_util.tree_leaves(like)):
        raise ValueError(
            "checkpoint.restore: `like` holds jax.ShapeDtypeStructs (from jax.eval_shape); "
            "it takes concrete arrays, such as a freshly initialised state, whose shardings "
            "the restored arrays take"
        )
    _one_process(jax.tree_util.tree_leaves(like), "restore")
    steps = require_step(directory, step)
    if step is not None:
        try:
            return _restore_step(directory, like, step)
        except _DamagedError as e:
            raise CheckpointError(
                f"checkpoint step {step} in {directory} is damaged: {e}"
            ) from None
    failures = []
    for candidate in reversed(steps):
        try:
            return _restore_step(directory, like, candidate)
        except _DamagedError as e:
            failures.append(f"step {candidate}: {e}")
            if jax.process_index() == 0:
                try:
                    moved = f"moved aside to {_move_aside(directory, candidate).name}"
                except OSError as err:
                    err.add_note(f"checkpoint step {candidate} in {directory} is damaged ({e})")
                    raise
            else:
                moved = "process 0 moves it aside"
            warnings.warn(
                f"checkpoint step {candidate} in {directory} is damaged ({e}); {moved}, "
                "trying the next older step",
                RuntimeWarning,
                stacklevel=2,
            )
    raise CheckpointError(
        f"no intact checkpoint in {directory}:\n" + "\n".join(f"  {f}" for f in failures)
    )


def _move_aside(directory: pathlib.Path, step: int) -> pathlib.Path:
    """Renames step `step` to the first free damaged-<step>, damaged-<step>-2, ...; returns it."""
    name = f"{_DAMAGED}{step}"
    aside, n = directory / name, 1
    while aside.exists():
        n += 1
        aside = directory / f"{name}-{n}"
    (directory / str(step)).rename(aside)
    return aside


class _DamagedError(Exception):
    """A step whose files cannot be read back."""


# tensorstore raises ValueError("<absl status code>: ..."); these codes are what it gave for
# a missing (NOT_FOUND), truncated (OUT_OF_RANGE) or undecodable (DATA_LOSS,
# FAILED_PRECONDITION: "Invalid JSON", ZSTD errors) file of a step.
_TENSORSTORE_DAMAGE = re.compile(r"(NOT_FOUND|OUT_OF_RANGE|DATA_LOSS|FAILED_PRECONDITION): ")
# An OCDBT node whose compressed bytes zstd cannot decode: tensorstore reports it as
# INVALID_ARGUMENT, a ValueError without a code ("Error opening ...: Error decoding b-tree
# node: ZSTD_decompressStream() failed: Data corruption detected"). One byte flipped in a
# node does it; until 2026-12-06 such a step was raised, not set aside.
_UNDECODABLE = "Error decoding "


def _is_damage(error: BaseException, step_dir: pathlib.Path) -> bool:
    """Whether `error`, raised while reading `step_dir`, says that the step's files are damaged.

    Damage is, in `error` or the errors it was raised from (``__cause__``: orbax wraps
    tensorstore's errors in a bare Exception):

    - a metadata file that is no JSON (json.JSONDecodeError) or no UTF-8
      (UnicodeDecodeError): truncated, zeroed, garbled or empty;
    - a file of the step missing or of the wrong kind (FileNotFoundError,
      IsADirectoryError, NotADirectoryError naming a path in `step_dir`);
    - a tensorstore error NOT_FOUND (missing), OUT_OF_RANGE (truncated), DATA_LOSS or
      FAILED_PRECONDITION (undecodable), or one that says it could not decode what it read
      ("Error decoding ..."), unless it reports an error of the operating system
      (``[os_error_code=...]``: permissions, a dropped network mount);
    - the step's `_ITEM` directory missing (orbax then complains about its arguments).

    Nothing is damage while `step_dir` itself is gone (an unmounted file system). Anything
    else (out of memory, PermissionError and other OSErrors, an orbax API change) is not
    damage: the caller raises it unchanged and moves nothing.
    """
    if not step_dir.is_dir():
        return False
    if not (step_dir / _ITEM).is_dir():
        return True
    inside = f"{step_dir}{os.sep}"
    missing = FileNotFoundError | IsADirectoryError | NotADirectoryError
    while error is not None:
        text = str(error)
        if isinstance(error, json.JSONDecodeError | UnicodeDecodeError):
            return True
        if isinstance(error, missing) and inside in text:
            return True
        if (
            isinstance(error, ValueError)
            and (_TENSORSTORE_DAMAGE.match(text) or _UNDECODABLE in text)
            and "os_error_code" not in text
        ):
            return True
        error = error.__cause__
    return False


def _restore_step(directory: pathlib.Path, like, step: int):
    step_dir = directory / str(step)
    # every file as saved: whatever orbax raises next is no damage
    intact = _check_files(step_dir)
    described, flat, treedef = _flatten(like)
    try:
        with _manager(directory) as mngr:
            meta = mngr.metadata(step).custom_metadata or {}
            saved = meta.get("leaves")
            structure = meta.get("structure")
            digest = meta.get("sha256")
    except Exception as e:
        if intact or not _is_damage(e, step_dir):
            raise
        raise _DamagedError(f"{_files(step_dir)}: {type(e).__name__}: {e}") from e
    if saved is None:
        if intact:
            raise CheckpointError(
                f"step {step} in {directory} has no leaf description: not written by "
                "metarl.checkpoint.save"
            )
        try:  # orbax takes an unreadable file for an empty one: its OSError is no damage
            (step_dir / _STEP_METADATA).read_bytes()
        except FileNotFoundError:
            pass
        raise _DamagedError(
            f"{step_dir} has no leaf description (damaged, or not written by "
            "metarl.checkpoint.save)"
        )
    if saved != described:
        raise CheckpointError(
            f"step {step} in {directory} does not match `like`: {_diff(saved, described)}"
        )
    if structure is not None and ADDRESS.sub("", structure) != _structure(treedef):
        raise CheckpointError(
            f"step {step} in {directory} does not match `like`: its tree structure or static "
            f"data (names, distribution flags) differ:\n  saved: {structure}\n  like:  "
            f"{_structure(treedef)}"
        )
    target = {str(i): _abstract(x) for i, x in enumerate(flat) if np.size(x)}
    try:
        with _manager(directory) as mngr:
            restored = mngr.restore(step, args=ocp.args.StandardRestore(target))
    except Exception as e:
        if intact or not _is_damage(e, step_dir):
            raise
        raise _DamagedError(f"{_files(step_dir)}: {type(e).__name__}: {e}") from e
    raw = [restored[str(i)] if np.size(x) else x for i, x in enumerate(flat)]
    if digest is not None and _digest(jax.device_get(raw)) != digest:
        if intact:
            raise CheckpointError(
                f"step {step} in {directory}: the data read back does not match its checksum, "
                "though every file is as saved (read by another orbax or tensorstore than "
                "wrote it?)"
            )
        raise _DamagedError(f"{_files(step_dir)}: the data does not match its checksum")
    leaves = [_like(x, restored.get(str(i))) for i, x in enumerate(jax.tree_util.tree_leaves(like))]
    return jax.tree_util.tree_unflatten(treedef, leaves)


def _one_process(leaves, what: str) -> None:
    """Refuses arrays spread over several processes (multi-host): the checksum and the
    moves aside are written for the arrays one process holds whole."""
    if any(isinstance(x, jax.Array) and not x.is_fully_addressable for x in leaves):
        raise ValueError(
            f"checkpoint.{what}: the state holds arrays spread over {jax.process_count()} "
            "processes; metarl.checkpoint handles one process's arrays (multi-host "
            "checkpoints are not supported yet: use orbax directly)"
        )


def _files(step_dir: pathlib.Path) -> str:
    return f"files under {step_dir}"


def _abstract(x) -> jax.ShapeDtypeStruct:
    """What orbax restores a leaf as: a jax array with x's sharding, else numpy."""
    if isinstance(x, jax.Array):
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
    return jax.ShapeDtypeStruct(np.shape(x), np.dtype(getattr(x, "dtype", type(x))))


def _like(x, restored):
    """`restored` as the same kind of leaf as `x` (typed PRNG key, scalar, array)."""
    if restored is None:  # x has size 0, so it was not saved: x itself is the value
        return x
    if is_key(x):
        if isinstance(x, jax.Array) and not x.committed:
            # uncommitted as `x` was: eager ops on a committed key (a curriculum's
            # draws between segments) would compile again for it
            restored = np.asarray(restored)
        return jax.random.wrap_key_data(restored, impl=jax.random.key_impl(x))
    if isinstance(x, jax.Array | np.ndarray):
        return restored
    return type(x)(restored)  # a Python or numpy scalar


def _diff(saved: list | None, wanted: list) -> str:
    if saved is None:
        return "it has no leaf description (not written by metarl.checkpoint.save)"
    for s, w in zip(saved, wanted, strict=False):
        if s != w:
            return f"saved leaf {s[0]} {s[2]}{tuple(s[1])} vs like's {w[0]} {w[2]}{tuple(w[1])}"
    return f"it has {len(saved)} leaves, `like` has {len(wanted)}"
