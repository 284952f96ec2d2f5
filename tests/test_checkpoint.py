"""metarl.checkpoint: bit-exact round trips, retention, atomicity under SIGKILL, errors."""

import contextlib
import os
import pathlib
import random
import re
import shutil
import subprocess
import sys
import time
import warnings

import flax
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from metarl import checkpoint as ckpt
from metarl import contexts as C  # noqa: N812
from metarl.parallel import AXIS, data_mesh
from metarl.trees import to_numpy

TESTS = str(pathlib.Path(__file__).parent)


@flax.struct.dataclass
class TrainState:
    params: dict
    counter: jax.Array
    keys: jax.Array
    done: jax.Array
    space: C.ContextSpace
    sharded: jax.Array
    history: np.ndarray
    typed_key: jax.Array
    no_memory: jax.Array  # size 0: orbax cannot save it, restore takes like's
    lr: float = flax.struct.field(pytree_node=False, default=3e-4)


def make_state(seed: int) -> TrainState:
    rng = np.random.default_rng(seed)
    return TrainState(
        params={
            "w": jnp.asarray(rng.standard_normal((3, 4)), jnp.float32),
            "odd": jnp.array([np.nan, -0.0, np.inf, 1e-45 * seed], jnp.float32),
            "b": {"bias": jnp.full((4,), seed, jnp.float32)},
        },
        counter=jnp.int32(1000 + seed),
        keys=jax.random.split(jax.random.PRNGKey(seed), 8),
        done=jnp.asarray(rng.random(6) > 0.5),
        space=C.ContextSpace(
            {"gravity": C.Uniform(5.0 + seed, 15.0), "mass": C.Scale(0.5, 1.5, per_element=True)}
        ),
        sharded=jax.device_put(
            jnp.arange(4 * jax.device_count(), dtype=jnp.float32) * seed,
            NamedSharding(data_mesh(), P(AXIS)),
        ),
        history=rng.integers(0, 2**31, 7).astype(np.int32),
        typed_key=jax.random.key(seed),
        no_memory=jnp.zeros((16, 0), jnp.float32),
    )


def assert_bit_equal(a, b):
    a, b = to_numpy(a), to_numpy(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    assert np.array_equal(a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8))


def test_round_trip_is_bit_exact_and_keeps_custom_nodes(tmp_path):
    state, like = make_state(1), make_state(0)
    assert not np.array_equal(state.history, like.history)
    path = ckpt.save(str(tmp_path), 1, state)
    assert path == tmp_path / "1" and path.is_dir()
    out = ckpt.restore(tmp_path, like)

    assert jax.tree_util.tree_structure(out) == jax.tree_util.tree_structure(state)
    leaves = (jax.tree_util.tree_leaves(t) for t in (out, state, like))
    for got, want, tmpl in zip(*leaves, strict=True):
        assert_bit_equal(got, want)
        assert type(got) is type(tmpl)  # jax arrays stay jax arrays, numpy stays numpy
    assert isinstance(out.space, C.ContextSpace) and list(out.space) == ["gravity", "mass"]
    assert out.space["mass"].per_element and out.space["mass"].relative
    assert float(out.space["gravity"].low) == 6.0
    assert out.sharded.sharding == like.sharded.sharding
    assert jax.random.key_impl(out.typed_key) == jax.random.key_impl(state.typed_key)


def test_keep_last_n_and_latest(tmp_path):
    assert ckpt.all_steps(tmp_path) == [] and ckpt.latest_step(tmp_path) is None
    assert ckpt.all_steps(tmp_path / "missing") == []
    for step in (1, 2, 5, 7, 10):
        ckpt.save(tmp_path, step, {"x": jnp.full((3,), step, jnp.int32)}, keep=3)
    assert ckpt.all_steps(tmp_path) == [5, 7, 10] and ckpt.latest_step(tmp_path) == 10
    assert sorted(int(p.name) for p in tmp_path.iterdir() if p.name.isdigit()) == [5, 7, 10]
    assert not (tmp_path / ckpt._TRASH).exists()
    like = {"x": jnp.zeros((3,), jnp.int32)}
    assert ckpt.restore(tmp_path, like)["x"].tolist() == [10] * 3
    assert ckpt.restore(tmp_path, like, step=5)["x"].tolist() == [5] * 3
    ckpt.save(tmp_path, 11, {"x": jnp.full((3,), 11, jnp.int32)}, keep=1)
    assert ckpt.all_steps(tmp_path) == [11]


# --- a save killed at a random point (SIGKILL) leaves only complete checkpoints ---

KEEP = 2
N_BIG = 12_500_000  # 50 MB of uint32 per step

CHILD = """
import sys
directory, progress, first, tests = sys.argv[1:]
sys.path.insert(0, tests)
from test_checkpoint import KEEP, big_state
from metarl import checkpoint as ckpt
for step in range(int(first), int(first) + 1000):
    ckpt.save(directory, step, big_state(step), keep=KEEP)
    with open(progress, "a") as f:
        f.write(f"{step}\\n")
"""


def big_state(step: int) -> dict:
    big = np.arange(N_BIG, dtype=np.uint32) * np.uint32(2654435761) + np.uint32(step)
    space = C.ContextSpace({"gravity": C.Uniform(float(step), step + 1.0)})
    return {"big": big, "step": np.int32(step), "space": space}


def _save_then_kill(directory: pathlib.Path, first: int, delay: float) -> list[int]:
    """Child saves steps first, first+1, ... until killed `delay` s after `first` is done;
    returns the steps whose save returned."""
    progress, log = directory.parent / f"progress-{first}", directory.parent / f"log-{first}"
    with open(log, "w") as err:
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(directory), str(progress), str(first), TESTS],
            env={**os.environ, "JAX_PLATFORMS": "cpu"},
            stdout=err,
            stderr=err,
        )
    try:
        deadline = time.monotonic() + 120
        while not (progress.exists() and progress.read_text().endswith("\n")):
            assert child.poll() is None, f"child died:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, "child never finished its first save"
            time.sleep(0.01)
        time.sleep(delay)
    finally:
        child.kill()  # SIGKILL: no cleanup, no atexit, no orbax finalisation
        child.wait()
    return [int(s) for s in progress.read_text().split("\n")[:-1]]


def _check_all_complete(directory: pathlib.Path, done: list[int]) -> list[int]:
    steps = ckpt.all_steps(directory)
    # the last save that returned survives; at most one newer step got finalised
    assert done[-1] in steps and steps[-1] <= done[-1] + 1 and len(steps) <= KEEP + 1, steps
    like = big_state(0)
    for step in steps:
        out = ckpt.restore(directory, like, step=step)
        leaves = (jax.tree_util.tree_leaves(t) for t in (out, big_state(step)))
        for got, want in zip(*leaves, strict=True):
            assert_bit_equal(got, want)
    return steps


def test_save_killed_mid_write_keeps_previous_checkpoints(tmp_path):
    directory, rng = tmp_path / "ckpt", random.Random()
    done = _save_then_kill(directory, 1, rng.uniform(0.0, 1.5))
    steps = _check_all_complete(directory, done)
    # a new run resumes in the same (possibly dirty) directory, and is killed again
    done = _save_then_kill(directory, steps[-1] + 1, rng.uniform(0.0, 1.5))
    steps = _check_all_complete(directory, done)
    # the next save clears orbax temporaries and half-deleted steps
    ckpt.save(directory, steps[-1] + 1, big_state(steps[-1] + 1), keep=KEEP)
    assert sorted(p.name for p in directory.iterdir() if not p.name.isdigit()) == []
    shutil.rmtree(directory)  # ~150 MB


# --- errors ---


def test_errors_are_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path))):
        ckpt.restore(tmp_path, {"x": np.zeros(3)})
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        ckpt.restore(tmp_path / "missing", {"x": np.zeros(3)})

    state = {"x": np.arange(3.0), "space": C.ContextSpace({"gravity": C.Uniform(1.0, 2.0)})}
    ckpt.save(tmp_path, 1, state)
    with pytest.raises(FileNotFoundError, match=re.escape("available steps: [1]")):
        ckpt.restore(tmp_path, state, step=2)
    with pytest.raises(ValueError, match="already exists"):
        ckpt.save(tmp_path, 1, {"x": np.zeros(3), "space": state["space"]})
    # orbax keeps the steps saved last: step 0 saved after step 1 would delete step 1
    with pytest.raises(ValueError, match="below the newest step 1"):
        ckpt.save(tmp_path, 0, state, keep=1)
    assert np.array_equal(ckpt.restore(tmp_path, state)["x"], np.arange(3.0))
    with pytest.raises(ValueError, match="keep"):
        ckpt.save(tmp_path, 2, state, keep=0)
    with pytest.raises(ValueError, match="nothing to save"):
        ckpt.save(tmp_path, 2, {"x": np.zeros((0, 3))})
    # orbax named such a leaf by its index alone ("for key: ('0',)")
    for leaf in ("abc", np.array([None, 1])):
        with pytest.raises(ValueError, match=r"leaf state\['name'\] is a .* arrays and numbers"):
            ckpt.save(tmp_path, 2, {"x": np.ones(2), "name": leaf})
    assert ckpt.all_steps(tmp_path) == [1]

    bad_likes = [
        {"x": np.zeros(4), "space": state["space"]},  # shape
        {"x": np.zeros(3, np.float32), "space": state["space"]},  # dtype
        {"y": np.zeros(3), "space": state["space"]},  # key
        {
            "x": np.zeros(3),
            "space": C.ContextSpace(  # one more leaf inside a custom node
                {"gravity": C.Uniform(1.0, 2.0), "mass": C.Scale(0.5, 1.5)}
            ),
        },
        np.zeros(3),  # structure
    ]
    for like in bad_likes:
        with pytest.raises(ValueError, match="does not match"):
            ckpt.restore(tmp_path, like)
    # shapes alone (jax.eval_shape) raised "unexpected PRNG key type" from orbax
    shapes = jax.eval_shape(lambda: {"x": jnp.zeros(3), "key": jax.random.key(0)})
    with pytest.raises(ValueError, match="holds jax.ShapeDtypeStructs .* concrete arrays"):
        ckpt.restore(tmp_path, shapes)


def test_restore_refuses_other_distribution_flags_and_bad_steps(tmp_path):
    state = {"space": C.ContextSpace({"gravity": C.Uniform(1.0, 2.0)})}
    ckpt.save(tmp_path, 1, state)
    for flags in ({"relative": True}, {"per_element": True}):
        like = {"space": C.ContextSpace({"gravity": C.Uniform(1.0, 2.0, **flags)})}
        with pytest.raises(ValueError, match="static data"):
            ckpt.restore(tmp_path, like)
    for step in (-1, 1.5, "2", True):
        with pytest.raises(ValueError, match="step must be an integer >= 0"):
            ckpt.save(tmp_path, step, state)


DAMAGE = ("truncate", "zero", "garble", "flip", "alter", "empty", "delete")


def _damage(path: pathlib.Path, how: str) -> None:
    if how == "delete":
        path.unlink()
        return
    data = path.read_bytes()
    at = len(data) * 3 // 4
    if how == "empty":
        path.write_bytes(b"")
    elif how == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif how == "zero":
        path.write_bytes(bytes(len(data)))
    elif how == "flip":  # one byte: where it is compressed, zstd finds the data corrupt
        path.write_bytes(data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :])
    elif how == "alter":  # one bit: JSON stays JSON (a key or value misspelt)
        path.write_bytes(data[:at] + bytes([data[at] ^ 0x10]) + data[at + 1 :])
    else:  # garble: flip bytes through the whole file
        garbled = bytearray(data)
        for i in range(0, len(garbled), max(1, len(garbled) // 64)):
            garbled[i] ^= 0xA5
        path.write_bytes(bytes(garbled))


def _saved_twice(directory: pathlib.Path, digests: bool = True) -> list[pathlib.Path]:
    """Steps 1 and 2 (make_state(1), make_state(2)) in `directory`, with the lists of their
    files' digests or (digests=False) without them, as saved before 2026-12-06; step 2's
    files."""
    ckpt.save(directory, 1, make_state(1))
    ckpt.save(directory, 2, make_state(2))
    if not digests:
        for step in ("1", "2"):
            (directory / step / ckpt._FILES).unlink()  # noqa: SLF001
    return sorted(
        p.relative_to(directory / "2") for p in (directory / "2").rglob("*") if p.is_file()
    )


def _damaged_copy(source: pathlib.Path, run: pathlib.Path, rel, how: str):
    """`source` copied to `run`, `rel` of its step 2 damaged `how`, and restored: the state
    and the warnings naming step 2."""
    shutil.copytree(source, run)
    _damage(run / "2" / rel, how)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = ckpt.restore(run, make_state(0))
    return out, [str(w.message) for w in caught if "step 2" in str(w.message)]


def _check_set_aside(run: pathlib.Path, rel, how: str, warned: list[str]) -> None:
    assert "is damaged" in warned[0]
    assert ckpt.all_steps(run) == [1]  # moved aside, not deleted
    assert (run / "damaged-2" / rel).exists() == (how != "delete")
    with pytest.raises(ckpt.CheckpointError, match="no intact checkpoint"):
        _damage_all_and_restore(run)


def test_a_damaged_latest_step_falls_back_to_the_newest_intact_one(tmp_path):
    """Any file of the step altered (by one bit) or missing: the digests of its files
    prove it, and step 1, the newest intact one, comes back. Only the list of digests
    deleted leaves a step orbax reads whole (its data's checksum proves it). Any other
    change of a file's bytes is caught as one bit is (the test below tries them all on
    steps without the list)."""
    source = tmp_path / "source"
    files = _saved_twice(source)
    assert pathlib.Path(ckpt._FILES) in files and len(files) >= 10  # noqa: SLF001
    for rel in files:
        for how in ("alter", "delete"):
            run = tmp_path / f"{how}-{rel}".replace("/", "_")
            out, warned = _damaged_copy(source, run, rel, how)
            intact = str(rel) == ckpt._FILES and how == "delete"  # noqa: SLF001
            assert bool(warned) != intact, (str(rel), how)
            expected = make_state(2 if intact else 1)
            for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(expected), strict=True):
                assert_bit_equal(a, b)
            if not intact:
                assert "not as saved" in warned[0] or ckpt._FILES in warned[0]  # noqa: SLF001
                _check_set_aside(run, rel, how, warned)


@contextlib.contextmanager
def _orbaxs_abandoned_reads_unreported():
    """Where one read of a damaged step raises, orbax abandons its other reads: each
    coroutine, and each callback onto its closed event loop, then raises where nothing
    catches it (40 in the test below), which Python hands to `sys.unraisablehook` and
    pytest printed as warnings after its summary. These two, and nothing else, are
    dropped here."""
    hook = sys.unraisablehook

    def report(unraisable):
        abandoned = "_read_array_index_and_device_put" in repr(unraisable.object) or (
            unraisable.object is None and "Event loop is closed" in str(unraisable.exc_value)
        )
        if not abandoned:
            hook(unraisable)

    sys.unraisablehook = report
    try:
        yield
    finally:
        sys.unraisablehook = hook


def test_a_step_saved_without_its_file_digests_is_judged_by_orbaxs_errors(tmp_path):
    with _orbaxs_abandoned_reads_unreported():
        _judged_by_orbaxs_errors(tmp_path)


def _judged_by_orbaxs_errors(tmp_path):
    source = tmp_path / "source"
    files = _saved_twice(source, digests=False)
    cases = 0
    for rel in files:
        for how in DAMAGE:
            if how == "alter" or (source / "2" / rel).stat().st_size == 0:
                continue  # altered JSON may read as another structure, refused as such
            run = tmp_path / f"{how}-{rel}".replace("/", "_")
            out, warned = _damaged_copy(source, run, rel, how)
            # Either the damage spared every byte of the data (a file restore does not
            # read; the data's checksum proves it) or the step is refused and step 1,
            # the newest intact one, comes back.
            expected = make_state(1 if warned else 2)
            for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(expected), strict=True):
                assert_bit_equal(a, b)
            if warned:
                _check_set_aside(run, rel, how, warned)
                cases += 1
    assert cases >= 30  # metadata, sharding, manifest and data files, six ways each
    shutil.rmtree(source / "2" / "default")  # the step's whole array directory is gone
    with pytest.warns(RuntimeWarning, match="step 2 .* is damaged"):
        out = ckpt.restore(source, make_state(0))
    for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(make_state(1)), strict=True):
        assert_bit_equal(a, b)
    assert ckpt.damaged_steps(source) == ["damaged-2"]


def _damage_all_and_restore(run: pathlib.Path):
    for path in (run / "1").rglob("*"):
        if path.is_file() and path.stat().st_size:
            _damage(path, "zero")
    with pytest.warns(RuntimeWarning):
        ckpt.restore(run, make_state(0))


def _zero_data(step_dir: pathlib.Path) -> None:
    for path in (step_dir / "default" / "d").iterdir():
        _damage(path, "zero")


def _restore_warnings(directory: pathlib.Path, like) -> tuple[object, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = ckpt.restore(directory, like)
    return out, [str(w.message) for w in caught if w.category is RuntimeWarning]


NOT_DAMAGE = [  # what a step cannot be blamed for: it must come up as is, moving nothing
    RuntimeError("RESOURCE_EXHAUSTED: out of memory while trying to allocate"),
    jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 4.0GiB"),
    ValueError(
        "PERMISSION_DENIED: Error reading local file: Permission denied [os_error_code='13']"
    ),
    ValueError(
        "FAILED_PRECONDITION: Failed to open: Transport endpoint is not connected "
        "[os_error_code='107']"
    ),
    ValueError("UNAVAILABLE: Error reading from GCS"),
    OSError(5, "Input/output error"),
    TypeError("restore() got an unexpected keyword argument 'args'"),  # an orbax API change
]


@pytest.mark.parametrize("method", ["metadata", "restore", "_sha256"])
@pytest.mark.parametrize("error", NOT_DAMAGE, ids=lambda e: f"{type(e).__name__}-{e}"[:40])
def test_an_error_that_is_not_damage_propagates_and_moves_nothing(
    tmp_path, monkeypatch, method, error
):
    """Raised by orbax, or while the step's files are checked against their digests."""
    for step in (1, 2):
        ckpt.save(tmp_path, step, {"x": jnp.full((3,), step, jnp.int32)})
    before = sorted(p.name for p in tmp_path.iterdir())

    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(ckpt if method == "_sha256" else ocp.CheckpointManager, method, fail)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no step is reported damaged
        for step in (None, 2):
            with pytest.raises(type(error)) as raised:
                ckpt.restore(tmp_path, {"x": jnp.zeros((3,), jnp.int32)}, step=step)
            assert raised.value is error
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    monkeypatch.undo()
    assert ckpt.all_steps(tmp_path) == [1, 2] and ckpt.damaged_steps(tmp_path) == []


def test_data_that_differ_from_intact_files_is_no_damage(tmp_path, monkeypatch):
    """Every file as saved, the data read back otherwise: another orbax or tensorstore
    read it, and moving the step aside would lose a good checkpoint."""
    for step in (1, 2):
        ckpt.save(tmp_path, step, {"x": jnp.full((3,), step, jnp.int32)})
    monkeypatch.setattr(ckpt, "_digest", lambda leaves: "0" * 64)
    with pytest.raises(ckpt.CheckpointError, match="though every file is as saved"):
        ckpt.restore(tmp_path, {"x": jnp.zeros((3,), jnp.int32)})
    assert ckpt.all_steps(tmp_path) == [1, 2] and ckpt.damaged_steps(tmp_path) == []


def test_a_step_damaged_twice_is_moved_aside_twice_and_can_be_saved_again(tmp_path):
    like = {"x": jnp.zeros((3,), jnp.int32)}
    for step in (1, 2):
        ckpt.save(tmp_path, step, {"x": jnp.full((3,), step, jnp.int32)})
    asides = []
    for attempt in (1, 2):
        _zero_data(tmp_path / "2")
        out, warned = _restore_warnings(tmp_path, like)
        assert out["x"].tolist() == [1] * 3 and ckpt.all_steps(tmp_path) == [1]
        assert len(warned) == 1 and "step 2" in warned[0] and "is damaged" in warned[0]
        asides.append(re.search(r"moved aside to (\S+),", warned[0])[1])
        assert (tmp_path / asides[-1] / "default").is_dir()  # kept whole
        ckpt.save(tmp_path, 2, {"x": jnp.full((3,), 20 + attempt, jnp.int32)})
        assert ckpt.restore(tmp_path, like)["x"].tolist() == [20 + attempt] * 3
    assert asides == ["damaged-2", "damaged-2-2"]
    assert ckpt.damaged_steps(tmp_path) == asides


def test_a_damaged_step_that_cannot_be_moved_aside_says_so(tmp_path, monkeypatch):
    for step in (1, 2):
        ckpt.save(tmp_path, step, {"x": jnp.full((3,), step, jnp.int32)})
    _zero_data(tmp_path / "2")

    def refuse(self, target):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(pathlib.Path, "rename", refuse)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(PermissionError) as raised:
            ckpt.restore(tmp_path, {"x": jnp.zeros((3,), jnp.int32)})
    assert not [w for w in caught if "moved aside" in str(w.message)]
    assert any("step 2" in n and "is damaged" in n for n in raised.value.__notes__)
    monkeypatch.undo()
    assert ckpt.all_steps(tmp_path) == [1, 2] and ckpt.damaged_steps(tmp_path) == []


def test_damaged_steps_lists_the_steps_moved_aside_in_order(tmp_path):
    assert ckpt.damaged_steps(tmp_path / "missing") == []
    assert ckpt.damaged_steps(tmp_path) == []
    for step in (2, 10):
        ckpt.save(tmp_path, step, {"x": jnp.full((3,), step, jnp.int32)})
    ckpt.save(tmp_path, 11, {"x": jnp.full((3,), 11, jnp.int32)})
    for step in (11, 10):
        _zero_data(tmp_path / str(step))
        with pytest.warns(RuntimeWarning, match=f"step {step} .*moved aside to damaged-{step},"):
            ckpt.restore(tmp_path, {"x": jnp.zeros((3,), jnp.int32)})
    for name in ("damaged-2-10", "damaged-2", "damaged-2-2", "damaged-x", "damaged-3-"):
        (tmp_path / name).mkdir()
    (tmp_path / "damaged-4").write_text("a file, not a step moved aside")
    assert ckpt.damaged_steps(tmp_path) == [
        "damaged-2",
        "damaged-2-2",
        "damaged-2-10",
        "damaged-10",
        "damaged-11",
    ]
    assert ckpt.all_steps(tmp_path) == [2]


def test_listing_steps_survives_a_step_pruned_while_it_lists(tmp_path, monkeypatch):
    """orbax stats every step directory it lists; a run saving beside a reader (a
    monitor, an evaluator) prunes old steps, and the reader met FileNotFoundError
    (56 of 12158 calls while 400 steps were saved with keep=2)."""
    ckpt.save(tmp_path, 1, {"x": np.arange(3.0)})
    real, calls = ckpt._manager, []

    def racing(directory, keep=None):
        calls.append(directory)
        if len(calls) == 1:
            raise FileNotFoundError(f"[Errno 2] No such file or directory: '{directory}/0'")
        return real(directory, keep)

    monkeypatch.setattr(ckpt, "_manager", racing)
    assert ckpt.latest_step(tmp_path) == 1 and len(calls) == 2
