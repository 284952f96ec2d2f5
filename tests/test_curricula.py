"""curricula: schedules, gating and ADR bookkeeping on synthetic results (no training)."""

import os

import jax
import numpy as np
import pytest

import curricula
from metarl import contexts as C  # noqa: N812
from metarl.trees import to_numpy

TARGET = C.ContextSpace(
    {
        "gravity": C.Uniform(5.0, 15.0),
        "mass": C.Scale(0.5, 1.5, per_element=True),
        "friction": C.Uniform([0.4, 0.5, 0.6], [1.2, 1.5, 1.8], per_element=True),
        "viscosity": C.LogUniform(0.1, 10.0),
    }
)
DEFAULTS = {
    "gravity": np.float32(9.81),
    "mass": np.ones(3, np.float32),
    "friction": np.array([0.8, 0.9, 1.0], np.float32),
    "viscosity": np.float32(1.0),
}
NAMES = list(TARGET)
G_LOW, G_HIGH = 0, 1  # ADR boundary indices of "gravity"


def _bounds(space):
    """{name: (low, high)} as float64 arrays."""
    return {n: tuple(np.asarray(x, np.float64) for x in space[n].support()) for n in space}


def _shapes(tree):
    return [np.shape(x) for x in jax.tree.leaves(tree)]


def _assert_same_leaves(a, b):
    """Same structure, and every leaf equal bit for bit (NaNs included)."""
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(to_numpy(a)), jax.tree.leaves(to_numpy(b)), strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert x.tobytes() == y.tobytes()


# -- fixed schedules --


@pytest.mark.parametrize(
    "make, start, segments, expected",
    [
        (curricula.LinearWidening, 0.2, 4, [0.2, 0.4, 0.6, 0.8, 1.0, 1.0, 1.0]),
        (curricula.GeometricWidening, 0.125, 3, [0.125, 0.25, 0.5, 1.0, 1.0, 1.0]),
        (curricula.LinearWidening, 1.0, 1, [1.0, 1.0, 1.0]),
    ],
)
def test_widening_fractions_are_exact_at_each_segment(make, start, segments, expected):
    cur = make(start, segments)
    formula = {
        curricula.LinearWidening: lambda k: start + (1.0 - start) * k / segments,
        curricula.GeometricWidening: lambda k: start * (1.0 / start) ** (k / segments),
    }[make]
    state = cur.init(TARGET, defaults=DEFAULTS)
    for k, value in enumerate(expected):
        assert int(state.segment) == k
        assert state.fraction.dtype == np.float32 and state.fraction.shape == ()
        want = np.float32(1.0) if k >= segments else np.float32(formula(k))
        assert state.fraction == want
        np.testing.assert_allclose(state.fraction, value, rtol=1e-6)
        state = cur.update(state, {})


@pytest.mark.parametrize("make", [curricula.LinearWidening, curricula.GeometricWidening])
@pytest.mark.parametrize("defaults", [DEFAULTS, None])
def test_widening_ranges_grow_monotonically_to_exactly_the_target(make, defaults):
    cur = make(0.1, 5)
    state = cur.init(TARGET, defaults=defaults)
    previous = None
    for _ in range(7):
        ranges = cur.ranges(state)
        bounds = _bounds(ranges)
        if previous is not None:
            for n in NAMES:
                assert np.all(bounds[n][0] <= previous[n][0]) and np.all(
                    bounds[n][1] >= previous[n][1]
                )
        for n in NAMES:  # nested in the target
            t_low, t_high = _bounds(TARGET)[n]
            assert np.all(bounds[n][0] >= t_low - 1e-6) and np.all(bounds[n][1] <= t_high + 1e-6)
        previous = bounds
        state = cur.update(state, {"episode_return": 0.0})
    _assert_same_leaves(cur.ranges(state), TARGET)


def test_widening_scales_about_the_defaults_or_each_centre():
    first = curricula.LinearWidening(0.2, 4).init(TARGET, defaults=DEFAULTS)
    r = curricula.LinearWidening(0.2, 4).ranges(first)
    np.testing.assert_allclose(r["gravity"].low, 9.81 + 0.2 * (5.0 - 9.81), rtol=1e-6)
    np.testing.assert_allclose(r["gravity"].high, 9.81 + 0.2 * (15.0 - 9.81), rtol=1e-6)
    np.testing.assert_allclose(r["mass"].low, 0.9, rtol=1e-6)  # relative: about 1
    np.testing.assert_allclose(
        r["friction"].low,
        DEFAULTS["friction"] + 0.2 * (np.array([0.4, 0.5, 0.6]) - DEFAULTS["friction"]),
        rtol=1e-6,
    )
    np.testing.assert_allclose(r["viscosity"].low, 10 ** (-0.2), rtol=1e-5)  # log space about 1
    own = curricula.LinearWidening(0.2, 4)
    r = own.ranges(own.init(TARGET))
    np.testing.assert_allclose([r["gravity"].low, r["gravity"].high], [9.0, 11.0], rtol=1e-6)


def test_widening_rejects_defaults_that_would_change_parameter_shapes():
    target = C.ContextSpace({"friction": C.Uniform(0.4, 1.2, per_element=True)})
    with pytest.raises(
        ValueError, match="another structure.*per-element parameters of shape \\(3,\\)"
    ):
        curricula.LinearWidening(0.5, 2).init(target, defaults={"friction": [0.8, 0.9, 1.0]})


@pytest.mark.parametrize("name", ["mass", "friction"])
def test_a_target_with_one_scalar_and_one_per_element_parameter_keeps_its_structure(name):
    """Parameters may mix one number and one per element (the README: scalars or arrays
    of one entry per element). Clipped against per-element intervals, the centre x1 of
    mass x0.5-1 and x0.5-4, and a std of 0.1 about means 1 and 2, came back one per
    element, and every curriculum refused the target as of another structure (until
    2026-12-07); they are still one number each."""
    target, defaults = {
        "mass": (C.Scale(0.5, [1.0, 4.0], per_element=True), {"mass": np.ones(2)}),
        "friction": (C.Normal([1.0, 2.0], 0.1, per_element=True), None),
    }[name]
    target = C.ContextSpace({name: target})
    for cur in _curricula()[:3]:  # ADR asks for bounds of one shape, and no Normal
        ranges = cur.ranges(cur.init(target, defaults=defaults))
        assert _shapes(ranges) == _shapes(target), cur
    widening = curricula.LinearWidening(0.5, 2)
    got = widening.ranges(widening.init(target, defaults=defaults))[name]
    if name == "mass":  # about x1 in both: x0.75-1 and x0.75-2.5
        np.testing.assert_allclose([got.low, *got.high], [0.75, 1.0, 2.5])
    else:
        np.testing.assert_allclose([*got.mean, got.std], [1.0, 2.0, 0.05])


# -- structure --


STARTS = (0.1, 0.1, 0.1, 0.2)  # each of `_curricula`'s start fraction


def _curricula():
    return [
        curricula.LinearWidening(0.1, 3),
        curricula.GeometricWidening(0.1, 3),
        curricula.PerformanceGated(0.1, 0.3, threshold=5.0),
        curricula.ADR(0.2, 0.25, 1.0, 5.0, buffer_size=2, boundary_prob=0.7),
    ]


def _results(num_envs, seed):
    rng = np.random.default_rng(seed)
    return {
        "eval_return": float(rng.uniform(0, 10)),
        "episode_return": float(rng.uniform(0, 10)),
        "env_return_sum": rng.uniform(-5, 20, num_envs),
        "env_episodes": rng.integers(0, 3, num_envs),
    }


@pytest.mark.parametrize("index", range(4))
def test_ranges_keep_the_targets_structure_and_leaf_shapes(index):
    cur, n = _curricula()[index], 6
    state = cur.init(TARGET, defaults=DEFAULTS, num_envs=n, key=jax.random.key(0))
    structure = jax.tree.structure(
        cur.init(TARGET, defaults=DEFAULTS, num_envs=n, key=jax.random.key(1))
    )
    per_env = isinstance(state, curricula.ADRState)
    want = [((n,) if per_env else ()) + s for s in _shapes(TARGET)]
    for seed in range(6):
        ranges = cur.ranges(state)
        if per_env:  # ADR says so explicitly: one row per env
            assert isinstance(ranges, C.PerEnv)
            ranges = ranges.ranges
        assert isinstance(ranges, C.ContextSpace)
        assert jax.tree.structure(ranges) == jax.tree.structure(TARGET)
        assert _shapes(ranges) == want
        assert all(np.asarray(x).dtype == np.float32 for x in jax.tree.leaves(ranges))
        state = cur.update(state, _results(n, seed))
        assert jax.tree.structure(state) == structure  # a fixed restore template
    if per_env:
        assert _shapes(curricula.adr_ranges(state)) == _shapes(TARGET)


@pytest.mark.parametrize("index", range(4))
def test_ranges_start_at_the_targets_nearest_edge_when_a_default_lies_outside_it(index):
    # mass x 1.5-3 (its default x1 is below it), gravity 5-15 with a default of 20:
    # every curriculum trains inside the target from its first segment on, its start
    # fraction of each range next to the edge nearest the default (grown about the
    # default itself, then clipped, gravity stayed the point 15 until a third of the
    # way: the curriculum advanced and its ranges did not).
    cur, n = _curricula()[index], 4
    start = STARTS[index]
    target = C.ContextSpace({"gravity": C.Uniform(5.0, 15.0), "mass": C.Scale(1.5, 3.0)})
    defaults = {"gravity": np.float32(20.0), "mass": np.float32(1.0)}
    state = cur.init(target, defaults=defaults, num_envs=n, key=jax.random.key(0))
    first = cur.ranges(state)
    first = curricula.adr_ranges(state) if isinstance(first, C.PerEnv) else first
    np.testing.assert_allclose(
        [first["gravity"].low, first["gravity"].high], [15 - 10 * start, 15], rtol=1e-6
    )
    np.testing.assert_allclose(
        [first["mass"].low, first["mass"].high], [1.5, 1.5 + 1.5 * start], rtol=1e-6
    )
    for seed in range(8):
        ranges = cur.ranges(state)
        ranges = ranges.ranges if isinstance(ranges, C.PerEnv) else ranges
        for name in target:
            low, high = (np.asarray(x) for x in ranges[name].support())
            assert np.all(low >= target[name].low) and np.all(high <= target[name].high)
            assert np.all(low <= high)
        state = cur.update(state, {**_results(n, seed), "eval_return": 100.0})


@pytest.mark.parametrize("index", range(3))  # ADR refuses normals
def test_normal_ranges_start_inside_the_targets_interval_when_a_default_lies_outside_it(index):
    # The held-out extrapolation sets begin where a target's interval ends (for a
    # TruncatedNormal mean +- 2 std within its bounds, for a Normal mean +- 2 std):
    # grown about a default of 1, mass would pile up on its bound 1.5, inside the
    # extrapolation set [1.4, 1.6), and friction would train around 1.4, far below 4.
    cur, n = _curricula()[index], 4
    target = C.ContextSpace(
        {"mass": C.TruncatedNormal(2.0, 0.2, 1.5, 2.5, relative=True), "friction": C.Normal(5, 0.5)}
    )
    defaults = {"mass": np.float32(1.0), "friction": np.float32(1.0)}
    (m_lo, m_hi), (f_lo, f_hi) = (np.float32(x) for x in target.intervals()["mass"]), (4.0, 6.0)
    state = cur.init(target, defaults=defaults, num_envs=n, key=jax.random.key(0))
    first = cur.ranges(state)
    assert float(first["mass"].low) == m_lo < float(first["mass"].high)
    # the friction starts at the interval's near edge: its own mean - 2 std on it
    friction = first["friction"]
    np.testing.assert_allclose(float(friction.mean - 2 * friction.std), f_lo, rtol=1e-6)
    for seed in range(8):
        ranges = cur.ranges(state)
        if ranges is target:
            break
        mass = np.asarray(ranges["mass"].sample(jax.random.key(seed), (1000,)))
        assert mass.min() >= m_lo and mass.max() <= m_hi
        friction = ranges["friction"]
        assert f_lo - 1e-5 <= float(friction.mean - 2 * friction.std)
        assert float(friction.mean + 2 * friction.std) <= f_hi + 1e-5
        # no more draws below the interval than the target's own 2.3% (mean clipped to
        # its edge alone had half of them there)
        draws = np.asarray(friction.sample(jax.random.key(seed), (20_000,)))
        assert np.mean(draws < f_lo) < 0.03, np.mean(draws < f_lo)
        state = cur.update(state, {**_results(n, seed), "eval_return": 100.0})
    else:
        pytest.fail("the curriculum never reached its target")


@pytest.mark.parametrize("index", range(4))
def test_a_shared_entry_whose_elements_defaults_differ_grows_about_their_mean(index):
    # hopper's floor and foot friction (1 and 2): one shared draw, no single default
    cur, n, start = _curricula()[index], 4, STARTS[index]
    defaults = {"friction": np.array([1.0, 2.0], np.float32).view(C.EnvDefaults)}
    for low, high in ((0.5, 2.5), (0.4, 1.2)):
        target = C.ContextSpace({"friction": C.Uniform(low, high)})
        state = cur.init(target, defaults=defaults, num_envs=n, key=jax.random.key(0))
        first = cur.ranges(state)
        first = curricula.adr_ranges(state) if isinstance(first, C.PerEnv) else first
        lo, hi = float(first["friction"].low), float(first["friction"].high)
        if high > 1.5:  # a fifth of the target or less, centred on 1.5
            assert lo < 1.5 < hi and hi - lo <= 0.4 + 1e-6
            assert abs((lo + hi) / 2 - 1.5) < 1e-6
        else:  # the mean lies above the target: its start fraction, by its nearest edge
            np.testing.assert_allclose([lo, hi], [1.2 - start * 0.8, 1.2], rtol=1e-6)


# -- performance gating --


def test_gated_holds_below_the_threshold_and_widens_above_it():
    cur = curricula.PerformanceGated(start=0.2, step=0.3, threshold=10.0)
    state = cur.init(TARGET, defaults=DEFAULTS)
    first = cur.ranges(state)
    for value in (9.99, float("nan"), -3.0):
        state = cur.update(state, {"eval_return": value})
        assert state.fraction == np.float32(0.2)
        _assert_same_leaves(cur.ranges(state), first)
    state = cur.update(state, {"eval_return": 10.0})
    np.testing.assert_allclose(state.fraction, 0.5, rtol=1e-6)
    assert cur.ranges(state)["gravity"].low < first["gravity"].low
    for _ in range(3):
        state = cur.update(state, {"eval_return": 50.0, "episode_return": 0.0})
    assert state.fraction == np.float32(1.0) and int(state.segment) == 7
    _assert_same_leaves(cur.ranges(state), TARGET)
    # a return equal to a threshold that float32 cannot hold opens the gate too
    odd = curricula.PerformanceGated(start=0.2, step=0.3, threshold=100.1)
    state = odd.update(odd.init(TARGET, defaults=DEFAULTS), {"eval_return": 100.1})
    np.testing.assert_allclose(state.fraction, 0.5, rtol=1e-6)


def _played(mean: float, stale: float = -1e6) -> dict:
    """run_train's results where the 4 envs' episodes on the segment's own ranges
    returned `mean` on average (none in the last env), and `episode_return` (which
    also averages the episodes of trials drawn before the ranges changed) `stale`."""
    return {
        "episode_return": stale,
        "env_return_sum": np.array([mean - 1, 2 * mean + 1, 3 * mean, 0.0]),
        "env_episodes": np.array([1, 2, 3, 0]),
    }


def test_gated_relative_threshold_is_a_fraction_of_the_first_return():
    cur = curricula.PerformanceGated(
        start=0.2, step=0.1, threshold=0.9, relative=True, metric="episode_return"
    )
    state = cur.init(TARGET, defaults=DEFAULTS)
    assert np.isnan(state.reference)
    nothing = {"env_return_sum": np.zeros(4), "env_episodes": np.zeros(4)}
    state = cur.update(state, nothing)  # no episode on these ranges yet: NaN, holds
    assert np.isnan(state.reference) and state.fraction == np.float32(0.2)
    state = cur.update(state, _played(100.0))  # reference; 100 >= 90 widens
    assert state.reference == np.float32(100.0)
    np.testing.assert_allclose(state.fraction, 0.3, rtol=1e-6)
    state = cur.update(state, _played(80.0))  # below 90: hold
    np.testing.assert_allclose(state.fraction, 0.3, rtol=1e-6)
    state = cur.update(state, _played(95.0))  # above 90: widen
    np.testing.assert_allclose(state.fraction, 0.4, rtol=1e-6)
    assert state.reference == np.float32(100.0)

    negative = cur.update(cur.init(TARGET), _played(-100.0))  # gate at -110
    f = float(negative.fraction)
    assert float(cur.update(negative, _played(-120.0)).fraction) == f
    assert float(cur.update(negative, _played(-105.0)).fraction) > f


def test_a_gate_on_the_training_return_reads_the_episodes_of_its_own_ranges():
    """The gate read run_train's `episode_return`, which also averages the episodes of
    trials drawn before the ranges last changed: with trials of 2 episodes and a
    segment of one episode per env, every episode it read was played on the narrower
    ranges before, and it widened again without a return measured on its own. It reads
    the per-env sums of the episodes played on the segment's ranges."""
    cur = curricula.PerformanceGated(0.2, 0.2, threshold=50.0, metric="episode_return")
    state = cur.init(TARGET, defaults=DEFAULTS)
    held = cur.update(state, _played(10.0, stale=100.0))
    assert held.fraction == np.float32(0.2)  # the stale 100 would have opened it
    assert cur.summary(state, _played(10.0, stale=100.0))["gate/return"] == 10.0
    opened = cur.update(state, _played(60.0, stale=0.0))
    np.testing.assert_allclose(opened.fraction, 0.4, rtol=1e-6)
    with pytest.raises(KeyError, match="env_return_sum"):
        cur.update(state, {"episode_return": 60.0})
    with pytest.raises(ValueError, match=r"one entry per env each, got shapes \(4,\) and \(3,\)"):
        cur.update(state, {"env_return_sum": np.zeros(4), "env_episodes": np.zeros(3)})


@pytest.mark.parametrize(
    "make",
    [lambda: curricula.LinearWidening(0.2, 4), lambda: curricula.PerformanceGated(0.2, 0.2, 0.0)],
)
def test_fixed_and_choice_entries_keep_the_targets_values_in_every_segment(make):
    """A Fixed friction or a Choice of motor signs has no range to widen: scaled about
    the defaults, Fixed(0.05) became 0.0095 and the signs -1 or 1 became 0.6 or 1
    (always positive) until the last widening segment."""
    target = C.ContextSpace(
        {
            "gravity": C.Uniform(5.0, 15.0),
            "friction": C.Fixed(0.05),
            "actuator_gain": C.Choice([-1.0, 1.0], relative=True),
            "mass": C.Choice([2.0, 3.0], relative=True),
            # absolute and per element, with defaults that differ per element: scaled
            # about them, Fixed changed shape and Choice hit a broadcast error at init
            "stiffness": C.Fixed(1.0, per_element=True),
            "damping": C.Choice([0.5, 1.0, 2.0], per_element=True),
        }
    )
    defaults = {
        "gravity": 9.81,
        "friction": 0.005,
        "actuator_gain": 1.0,
        "mass": 1.0,
        "stiffness": np.array([0.0, 3.0]),
        "damping": np.array([0.1, 0.2]),
    }
    cur = make()
    state = cur.init(target, defaults=defaults)
    for _ in range(5):
        ranges = cur.ranges(state)
        for name in ("friction", "actuator_gain", "mass", "stiffness", "damping"):
            _assert_same_leaves(ranges[name], target[name])
        state = cur.update(state, {"eval_return": 1.0})
    assert cur.ranges(state)["gravity"].low == np.float32(5.0)


@pytest.mark.parametrize("index", range(4))
def test_a_log_uniform_whose_default_is_zero_grows_from_its_low_edge(index):
    """A joint's armature or stiffness defaults to 0, which log space cannot scale
    about: every curriculum raised at init. It lies below the target, so the range
    grows from the target's low edge in log space, as a Uniform's from its nearest edge."""
    cur, n = _curricula()[index], 4
    target = C.ContextSpace({"armature": C.LogUniform(0.01, 1.0), "gravity": C.Uniform(5.0, 15.0)})
    defaults = {"armature": np.float32(0.0), "gravity": np.float32(9.81)}
    good = {  # returns that widen every curriculum's ranges
        "eval_return": 100.0,
        "env_return_sum": np.full(n, 100.0),
        "env_episodes": np.ones(n),
    }
    state = cur.init(target, defaults=defaults, num_envs=n, key=jax.random.key(0))

    def armature(state):
        ranges = cur.ranges(state)
        ranges = curricula.adr_ranges(state) if isinstance(ranges, C.PerEnv) else ranges
        return ranges["armature"]

    first = armature(state)
    assert first.low == np.float32(0.01) and 0.01 < float(first.high) < 1.0
    for _ in range(40):
        state = cur.update(state, good)
        grown = armature(state)
        assert grown.low == np.float32(0.01) and first.high <= grown.high <= np.float32(1.0)
        first = grown
    assert first.high == np.float32(1.0)  # the whole target


def test_gated_fractions_reach_exactly_one_and_a_relative_gate_of_one_opens_first():
    """start 0.1 + 6 steps of 0.15 is 1: a float32 running sum stopped at 0.99999994
    (ranges 5.0000005-15, one opening short); a float64 return just above its own
    float32 rounding missed the first widening that threshold 1 promises."""
    cur = curricula.PerformanceGated(start=0.1, step=0.15, threshold=0.0)
    state = cur.init(TARGET, defaults=DEFAULTS)
    for _ in range(6):
        state = cur.update(state, {"eval_return": 1.0})
    assert state.fraction == np.float32(1.0)
    _assert_same_leaves(cur.ranges(state), TARGET)
    gate = curricula.PerformanceGated(0.2, 0.2, threshold=1.0, relative=True)
    value = 0.1  # float32(0.1) = 0.10000000149 > 0.1
    first = gate.update(gate.init(TARGET, defaults=DEFAULTS), {"eval_return": value})
    np.testing.assert_allclose(first.fraction, 0.4, rtol=1e-6)


def test_gated_needs_its_metric():
    cur = curricula.PerformanceGated(0.2, 0.1, 1.0)
    with pytest.raises(KeyError, match="eval_return"):
        cur.update(cur.init(TARGET), {"episode_return": 3.0})
    for bad in (None, "12", np.array([12.0, 1.0])):  # not one number: not a held gate
        with pytest.raises(ValueError, match=r"results\['eval_return'\] must be one real number"):
            cur.update(cur.init(TARGET), {"eval_return": bad})
    assert float(cur.update(cur.init(TARGET), {"eval_return": np.nan}).fraction) == np.float32(0.2)


# -- ADR --


def _adr(**kw):
    args = dict(start=0.2, delta=0.1, low_threshold=2.0, high_threshold=8.0, buffer_size=5)
    args.update(kw)
    return curricula.ADR(**args)


def _assign(state, boundaries):
    return state.replace(assignment=np.asarray(boundaries, np.int32))


def _env_results(means, episodes):
    episodes = np.asarray(episodes, np.float64)
    return {"env_return_sum": np.asarray(means) * episodes, "env_episodes": episodes}


def test_adr_starts_at_a_fraction_of_the_target_around_the_defaults():
    cur = _adr()
    state = cur.init(TARGET, defaults=DEFAULTS, num_envs=4, key=jax.random.key(0))
    _assert_same_leaves(curricula.adr_ranges(state), TARGET.scaled(0.2, around=DEFAULTS))
    assert state.buffers.shape == (8, 5) and state.counts.shape == (8,)
    assert state.assignment.shape == (4,) and jax.dtypes.issubdtype(
        state.key.dtype, jax.dtypes.prng_key
    )
    outside = cur.init(TARGET, defaults={**DEFAULTS, "gravity": 20.0}, num_envs=4, key=state.key)
    g = curricula.adr_ranges(outside)["gravity"]  # a fifth of it, by its edge nearest 20
    np.testing.assert_allclose([g.low, g.high], [13.0, 15.0], rtol=1e-6)


@pytest.mark.parametrize("mean, direction", [(9.0, -1), (8.0, -1), (1.0, +1), (2.0, +1)])
def test_adr_moves_one_boundary_after_buffer_size_entries(mean, direction):
    """Returns at or above t_H (8) at gravity's low boundary widen it by delta * width; at
    or below t_L (2) shrink it, as the paper's Algorithm 1 compares (a mean equal to a
    threshold held the boundary). A shrink starts from the whole target: from the
    starting range it could not shrink (`test_adr_never_shrinks_past_its_start...`)."""
    cur = _adr()
    state = cur.init(TARGET, defaults=DEFAULTS, num_envs=5, key=jax.random.key(0))
    if direction > 0:
        state = state.replace(current=TARGET)
    start = curricula.adr_ranges(state)
    low0 = float(start["gravity"].low)
    # env 0, 1: gravity low; env 2: gravity low without a finished episode; env 3: gravity high
    # (returns between the thresholds: no move); env 4: no boundary.
    assignment = [G_LOW, G_LOW, G_LOW, G_HIGH, -1]
    results = _env_results([mean, mean, 100.0, 5.0, 100.0], [2, 1, 0, 1, 3])
    for expected_count in (2, 4):
        state = cur.update(_assign(state, assignment), results)
        assert int(state.counts[G_LOW]) == expected_count
        _assert_same_leaves(curricula.adr_ranges(state), start)
    state = cur.update(_assign(state, assignment), results)  # 5th entry: decide, clear
    assert int(state.counts[G_LOW]) == 0
    assert int(state.counts[G_HIGH]) == 3  # between the thresholds: still collecting
    moved = curricula.adr_ranges(state)
    np.testing.assert_allclose(moved["gravity"].low, low0 + direction * 0.1 * 10.0, rtol=1e-6)
    assert moved["gravity"].high == start["gravity"].high
    for n in NAMES[1:]:
        _assert_same_leaves(moved[n], start[n])


def test_adr_summary_gives_what_each_update_reads_and_decides():
    """The numbers behind ADR's moves, which the ranges alone do not show."""
    cur = _adr(buffer_size=3)
    state = cur.init(TARGET, defaults=DEFAULTS, num_envs=5, key=jax.random.key(0))
    state = _assign(state, [G_LOW, G_LOW, G_HIGH, G_HIGH, -1])
    first = _env_results([9.0, 10.0, 5.0, np.nan, 100.0], [2, 1, 1, 1, 3])
    summary = cur.summary(state, first)
    assert summary["gravity/low/return"] == 9.5 and summary["gravity/low/entries"] == 2
    assert summary["gravity/high/return"] == 5.0 and summary["gravity/high/entries"] == 1
    assert np.isnan(summary["mass/low/return"]) and summary["mass/low/entries"] == 0
    for tag in ("gravity/low/buffer_mean", "gravity/low/move", "gravity/high/move"):
        assert np.isnan(summary[tag]), tag  # no buffer filled: no decision
    state = cur.update(state, first)
    second = _env_results([12.0, 0.0, 6.0, 6.0, 0.0], [1, 0, 1, 1, 1])
    summary = cur.summary(_assign(state, [G_LOW, G_LOW, G_HIGH, G_HIGH, -1]), second)
    # gravity low: [9, 10] + [12] fills, mean 31/3 >= 8 widens; high: [5] + [6, 6] holds
    assert summary["gravity/low/buffer_mean"] == pytest.approx(31 / 3)
    assert summary["gravity/low/move"] == 1.0
    assert summary["gravity/high/buffer_mean"] == pytest.approx(17 / 3)
    assert summary["gravity/high/move"] == 0.0
    before = curricula.adr_ranges(state)["gravity"]
    after = curricula.adr_ranges(
        cur.update(_assign(state, [G_LOW, G_LOW, G_HIGH, G_HIGH, -1]), second)
    )
    assert after["gravity"].low < before.low and after["gravity"].high == before.high
    # summary reads the state and changes nothing (its buffers were copied)
    np.testing.assert_array_equal(state.counts[[G_LOW, G_HIGH]], [2, 1])
    # a shrink decided at the starting range moves nothing: the move says so
    fresh = _assign(cur.init(TARGET, defaults=DEFAULTS, num_envs=3, key=jax.random.key(1)), [0] * 3)
    failed = _env_results([1.0, 1.0, 1.0], [1, 1, 1])
    summary = cur.summary(fresh, failed)
    assert summary["gravity/low/buffer_mean"] == 1.0 and summary["gravity/low/move"] == 0.0
    _assert_same_leaves(
        curricula.adr_ranges(cur.update(fresh, failed)), curricula.adr_ranges(fresh)
    )


def test_the_schedules_summarize_the_fraction_they_train_on():
    gated = curricula.PerformanceGated(0.2, 0.3, threshold=0.5, relative=True)
    state = gated.init(TARGET, defaults=DEFAULTS)
    summary = gated.summary(state, {"eval_return": 10.0})  # the reference is this return
    assert summary == {"fraction": np.float32(0.2), "gate/return": 10.0, "gate/opens_at": 5.0}
    state = gated.update(state, {"eval_return": 10.0})
    assert gated.summary(state, {"eval_return": 4.0})["gate/opens_at"] == 5.0
    widening = curricula.LinearWidening(0.25, 3)
    state = widening.update(widening.init(TARGET, defaults=DEFAULTS), {})
    assert widening.summary(state, {}) == {"fraction": 0.5}


def test_adr_holds_a_boundary_whose_mean_is_between_the_thresholds():
    cur = _adr(buffer_size=4)
    state = cur.init(TARGET, defaults=DEFAULTS, num_envs=5, key=jax.random.key(0))
    start = curricula.adr_ranges(state)
    results = _env_results([7.9, 2.1, 5.0, 5.0, 9.0], np.ones(5))
    state = cur.update(_assign(state, [G_HIGH] * 4 + [-1]), results)
    assert int(state.counts[G_HIGH]) == 0  # decided (mean 5.0) and cleared
    _assert_same_leaves(curricula.adr_ranges(state), start)


def test_adr_moves_a_boundary_whose_mean_is_exactly_a_threshold():
    """At or above high_threshold widens, at or below low_threshold shrinks, for
    thresholds a float32 return cannot hold exactly (success rates: 7 of 10 is 0.7,
    0.699999988 in float32, which held against the float64 0.7)."""
    cur = _adr(low_threshold=0.1, high_threshold=0.7, buffer_size=1)
    state = cur.init(TARGET, defaults=DEFAULTS, num_envs=2, key=jax.random.key(0))
    start = curricula.adr_ranges(state)["gravity"].high
    rate = np.float32(7) / np.float32(10)  # as run_train's float32 sums give it
    state = cur.update(_assign(state, [G_HIGH, G_LOW]), _env_results([rate, rate], np.ones(2)))
    assert curricula.adr_ranges(state)["gravity"].high > start  # widened at 0.7
    low = curricula.adr_ranges(state)["gravity"].low
    state = cur.update(_assign(state, [G_LOW, -1]), _env_results([np.float32(0.1), 0.0], [1, 1]))
    assert curricula.adr_ranges(state)["gravity"].low > low  # shrunk at 0.1 (0.100000001)


def test_adr_steps_per_element_and_in_log_space_at_most_once_per_update():
    cur = _adr(buffer_size=1)
    state = cur.init(TARGET, defaults=DEFAULTS, num_envs=3, key=jax.random.key(0))
    start = curricula.adr_ranges(state)
    friction_low, viscosity_high = 2 * NAMES.index("friction"), 2 * NAMES.index("viscosity") + 1
    # two entries for friction's low boundary: it moves once, the stale second entry is dropped
    assignment = [friction_low, friction_low, viscosity_high]
    state = cur.update(_assign(state, assignment), _env_results([9.0, 9.0, 9.0], [1, 1, 1]))
    assert not state.counts.any()
    moved = curricula.adr_ranges(state)
    np.testing.assert_allclose(
        moved["friction"].low, start["friction"].low - 0.1 * np.array([0.8, 1.0, 1.2]), rtol=1e-6
    )
    np.testing.assert_allclose(
        moved["viscosity"].high, start["viscosity"].high * 100**0.1, rtol=1e-5
    )
    _assert_same_leaves(moved["gravity"], start["gravity"])


def test_adr_boundaries_never_leave_the_target_nor_cross():
    cur = _adr(delta=0.3, buffer_size=2, boundary_prob=0.8)
    n = 24
    state = cur.init(TARGET, defaults=DEFAULTS, num_envs=n, key=jax.random.key(3))
    target = _bounds(TARGET)
    rng = np.random.default_rng(0)

    def check(state):
        current = _bounds(curricula.adr_ranges(state))
        for name in NAMES:
            (lo, hi), (t_lo, t_hi) = current[name], target[name]
            assert np.all(t_lo <= lo) and np.all(lo <= hi) and np.all(hi <= t_hi), name

    for mean in (20.0, -20.0, None):  # all widen, all shrink, then a random walk
        for _ in range(25):
            means = rng.uniform(-20, 30, n) if mean is None else np.full(n, mean)
            state = cur.update(state, _env_results(means, rng.integers(0, 3, n)))
            check(state)
        if mean == 20.0:
            _assert_same_leaves(
                curricula.adr_ranges(state), TARGET
            )  # clipped exactly at the target
        if mean == -20.0:  # back to the starting range, never past it
            _assert_same_leaves(
                curricula.adr_ranges(state),
                curricula.adr_ranges(
                    cur.init(TARGET, defaults=DEFAULTS, num_envs=n, key=jax.random.key(3))
                ),
            )


@pytest.mark.parametrize("failing", [[G_LOW, G_HIGH], [G_HIGH], [G_LOW]])
def test_adr_never_shrinks_past_its_start_whichever_boundaries_fail(failing):
    """A range whose boundaries fail returns to where it started (about the default),
    not to the point the order of the boundaries picks (low first: its upper edge)."""
    cur = _adr(buffer_size=1)
    state = cur.init(TARGET, defaults=DEFAULTS, num_envs=4, key=jax.random.key(0))
    start = curricula.adr_ranges(state)
    widened = cur.update(_assign(state, [G_LOW, G_HIGH, -1, -1]), _env_results([9.0] * 4, [1] * 4))
    g = widened.current["gravity"]
    assert g.low == pytest.approx(float(start["gravity"].low) - 1.0, abs=1e-5)
    assert g.high == pytest.approx(float(start["gravity"].high) + 1.0, abs=1e-5)
    for first in (state, widened):
        current = first
        for _ in range(3):
            assignment = (failing * 4)[:4]
            current = cur.update(_assign(current, assignment), _env_results([1.0] * 4, [1] * 4))
        g = curricula.adr_ranges(current)["gravity"]
        for side, bound in ((G_LOW, g.low), (G_HIGH, g.high)):
            edge = start["gravity"].low if side == G_LOW else start["gravity"].high
            if side in failing:
                assert bound == edge
        assert g.low <= 9.81 <= g.high  # the default stays inside


def test_adr_per_env_ranges_pin_exactly_the_assigned_boundary():
    cur = _adr(boundary_prob=0.9)
    n = 40
    state = cur.init(TARGET, defaults=DEFAULTS, num_envs=n, key=jax.random.key(7))
    state = cur.update(state, _env_results(np.full(n, 9.0), np.ones(n)))  # move some boundaries
    current, ranges = curricula.adr_ranges(state), cur.ranges(state)
    assert set(state.assignment.tolist()) >= {-1, 0, 1, 7}
    for i, b in enumerate(state.assignment.tolist()):
        row = ranges.row(i)
        if b < 0:
            _assert_same_leaves(row, current)
            continue
        name, side = NAMES[b // 2], ("low", "high")[b % 2]
        value = getattr(current[name], side)
        _assert_same_leaves(row, current.pinned({name: value}))
        np.testing.assert_array_equal(row[name].low, value)
        np.testing.assert_array_equal(row[name].high, value)
        for other in NAMES:
            if other != name:
                _assert_same_leaves(row[other], current[other])


def test_adr_assigns_about_boundary_prob_of_the_envs_uniformly():
    cur = _adr(boundary_prob=0.3)
    n = 4000
    state = cur.init(TARGET, defaults=DEFAULTS, num_envs=n, key=jax.random.key(11))
    again = cur.init(TARGET, defaults=DEFAULTS, num_envs=n, key=jax.random.key(11))
    np.testing.assert_array_equal(state.assignment, again.assignment)  # the key decides
    nothing = _env_results(np.zeros(n), np.zeros(n))
    for _ in range(2):
        a = state.assignment
        assert abs((a >= 0).mean() - 0.3) < 0.03
        per_boundary = np.bincount(a[a >= 0], minlength=8)
        assert per_boundary.shape == (8,) and np.all(
            np.abs(per_boundary / (a >= 0).sum() - 1 / 8) < 0.04
        )
        previous = a
        state = cur.update(state, nothing)
        assert not np.array_equal(state.assignment, previous)  # a fresh draw each segment
    assert np.all(
        _adr(boundary_prob=1.0).init(TARGET, num_envs=50, key=jax.random.key(0)).assignment >= 0
    )


def test_adr_needs_per_env_results():
    cur = _adr()
    state = cur.init(TARGET, num_envs=4, key=jax.random.key(0))
    with pytest.raises(KeyError, match="env_episodes"):
        cur.update(state, {"env_return_sum": np.zeros(4)})
    with pytest.raises(KeyError, match="env_return_sum"):
        cur.update(state, {"episode_return": 1.0})


# -- state round trips --


def _states():
    """A state of every curriculum after a few synthetic updates, and a fresh template of each."""
    out, n = [], 6
    for cur in _curricula():
        state = cur.init(TARGET, defaults=DEFAULTS, num_envs=n, key=jax.random.key(5))
        for seed in range(4):
            state = cur.update(state, _results(n, seed))
        like = cur.init(TARGET, defaults=DEFAULTS, num_envs=n, key=jax.random.key(0))
        out.append((cur, state, like))
    return out


def test_state_round_trips_through_flatten_and_unflatten():
    for cur, state, _ in _states():
        leaves, treedef = jax.tree.flatten(state)
        back = jax.tree.unflatten(treedef, leaves)
        assert type(back) is type(state)
        _assert_same_leaves(back, state)
        _assert_same_leaves(cur.ranges(back), cur.ranges(state))
        _assert_same_leaves(cur.update(back, _results(6, 9)), cur.update(state, _results(6, 9)))


CHECKPOINT = os.path.join(os.path.dirname(os.path.dirname(__file__)), "metarl", "checkpoint.py")


@pytest.mark.skipif(not os.path.exists(CHECKPOINT), reason="metarl.checkpoint not available")
def test_state_round_trips_through_a_checkpoint_bit_for_bit(tmp_path):
    from metarl import checkpoint
    from metarl.compilation import count_compilations

    states = _states()
    saved = {type(s).__name__ + str(i): s for i, (_, s, _) in enumerate(states)}
    like = {type(s).__name__ + str(i): t for i, (_, s, t) in enumerate(states)}
    checkpoint.save(tmp_path / "ckpt", 3, saved)
    restored = checkpoint.restore(tmp_path / "ckpt", like)
    _assert_same_leaves(restored, saved)
    for i, (cur, state, _) in enumerate(states):  # it resumes exactly where it stopped
        back = restored[type(state).__name__ + str(i)]
        assert type(back) is type(state)
        want = cur.update(state, _results(6, 1))
        with count_compilations() as compiles:  # ADR's eager draws: restored keys as fresh
            got = cur.update(back, _results(6, 1))
        assert compiles.count == 0, type(cur).__name__
        _assert_same_leaves(got, want)


# -- bad input --


def _gated_relative():
    return curricula.PerformanceGated(0.2, 0.2, threshold=5.0, relative=True)


def _adr_state(n=4):
    return _adr().init(TARGET, num_envs=n, key=jax.random.key(0))


BAD = {
    "linear start 0": (lambda: curricula.LinearWidening(0.0, 3), "start"),
    "linear start > 1": (lambda: curricula.LinearWidening(1.5, 3), "start"),
    "geometric start nan": (lambda: curricula.GeometricWidening(float("nan"), 3), "start"),
    "gated start < 0": (lambda: curricula.PerformanceGated(-0.1, 0.1, 1.0), "start"),
    "adr start > 1": (lambda: _adr(start=2.0), "start"),
    "segments 0": (lambda: curricula.LinearWidening(0.5, 0), "segments"),
    "segments float": (lambda: curricula.GeometricWidening(0.5, 2.5), "segments"),
    "gated step 0": (lambda: curricula.PerformanceGated(0.5, 0.0, 1.0), "step"),
    "gated metric": (
        lambda: curricula.PerformanceGated(0.5, 0.1, 1.0, metric="reward"),
        "eval_return",
    ),
    "gated relative threshold": (
        lambda: curricula.PerformanceGated(0.5, 0.1, -0.5, relative=True),
        "threshold",
    ),
    "relative gate on a reference of 0": (
        lambda: _gated_relative().update(
            _gated_relative().init(TARGET, defaults=DEFAULTS), {"eval_return": 0.0}
        ),
        "reference, the first finite results\\['eval_return'\\], is 0",
    ),
    "thresholds in the wrong order": (lambda: _adr(low_threshold=8.0, high_threshold=2.0), "order"),
    "equal thresholds": (lambda: _adr(low_threshold=3.0, high_threshold=3.0), "order"),
    "buffer_size 0": (lambda: _adr(buffer_size=0), "buffer_size"),
    "boundary_prob < 0": (lambda: _adr(boundary_prob=-0.1), "boundary_prob"),
    "boundary_prob 0: no boundary ever evaluated": (
        lambda: _adr(boundary_prob=0.0),
        "at 0 no env evaluates a boundary",
    ),
    "adr start 1: no boundary can move": (lambda: _adr(start=1.0), "would never move"),
    "delta under float32's resolution": (
        lambda: _adr(delta=1e-9).init(TARGET, num_envs=2, key=jax.random.key(0)),
        "float32's resolution",
    ),
    "a log range at 0 cannot grow": (
        lambda: _adr().init(
            C.ContextSpace({"g": C.LogUniform(0.0, 0.0)}), num_envs=2, key=jax.random.key(0)
        ),
        "cannot be scaled: LogUniform.scaled needs a centre > 0",
    ),
    "boundary_prob > 1": (lambda: _adr(boundary_prob=1.5), "boundary_prob"),
    "delta 0": (lambda: _adr(delta=0.0), "delta"),
    "linear target dict": (
        lambda: curricula.LinearWidening(0.5, 2).init({"gravity": C.Uniform(5.0, 15.0)}),
        "ContextSpace",
    ),
    "gated target None": (
        lambda: curricula.PerformanceGated(0.5, 0.1, 1.0).init(None),
        "ContextSpace",
    ),
    "adr target dict": (
        lambda: _adr().init(dict(TARGET), num_envs=2, key=jax.random.key(0)),
        "ContextSpace",
    ),
    "adr normal dimension": (
        lambda: _adr().init(
            C.ContextSpace(
                {"gravity": C.Uniform(5.0, 15.0), "mass": C.Normal(1.0, 0.1, relative=True)}
            ),
            num_envs=2,
            key=jax.random.key(0),
        ),
        "'mass'",
    ),
    "adr no num_envs": (lambda: _adr().init(TARGET, key=jax.random.key(0)), "num_envs"),
    "adr no key": (lambda: _adr().init(TARGET, num_envs=2), "key"),
    "defaults not a mapping": (
        lambda: curricula.LinearWidening(0.5, 2).init(TARGET, defaults=9.81),
        "defaults",
    ),
    "per-env results of another length": (
        lambda: _adr().update(_adr_state(4), _env_results(np.zeros(3), np.ones(3))),
        "num_envs",
    ),
    "results not a mapping": (lambda: _adr().update(_adr_state(4), [1.0]), "mapping"),
    "state of another curriculum": (
        lambda: curricula.LinearWidening(0.5, 2).update(_adr_state(), {}),
        "WideningState",
    ),
    "space of other names": (
        lambda: curricula.check_compatible(
            _adr_state(), C.ContextSpace({"gravity": C.Uniform(5.0, 15.0)})
        ),
        "a target space of other names",
    ),
    "space of other shapes": (
        lambda: curricula.check_compatible(
            _adr_state(),
            C.ContextSpace({**TARGET, "friction": C.Uniform(0.4, 1.2, per_element=True)}),
        ),
        "shapes",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_raises_a_clear_value_error(case):
    make, message = BAD[case]
    with pytest.raises(ValueError, match=message):
        make()


def test_check_compatible_accepts_the_state_of_its_own_space():
    for cur in _curricula():
        curricula.check_compatible(
            cur.init(TARGET, defaults=DEFAULTS, num_envs=3, key=jax.random.key(0)), TARGET
        )


def test_fixed_ranges_take_a_target_that_cannot_be_scaled_about_its_defaults():
    # One absolute mass range for bodies whose defaults differ: it cannot be scaled
    # about them, but start=1 (the fixed-DR idiom) never scales it.
    target = C.ContextSpace({"mass": C.Uniform(0.5, 5.0, per_element=True)})
    defaults = {"mass": np.array([10.5, 5.0], np.float32)}
    fixed = [
        curricula.LinearWidening(1.0, 1),
        curricula.GeometricWidening(1.0, 3),
        curricula.PerformanceGated(1.0, 0.1, threshold=0.0),
    ]
    for cur in fixed:
        state = cur.init(target, defaults=defaults, num_envs=4, key=jax.random.key(0))
        assert cur.ranges(state) is target
    for cur in (curricula.LinearWidening(0.5, 2), curricula.PerformanceGated(0.5, 0.1, 0.0)):
        with pytest.raises(ValueError, match=r"per-element defaults.*or defaults=None"):
            cur.init(target, defaults=defaults, num_envs=4, key=jax.random.key(0))
