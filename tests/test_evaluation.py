"""Held-out context sets lie where their split says: interpolation inside every
element's own training interval, extrapolation outside it and physical."""

import types
import warnings

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import curricula
from metarl import contexts as C
from metarl import evaluation as E
from metarl import tensorboard as L
from metarl.agents import ppo
from metarl.compilation import count_compilations
from metarl.envs import TRIAL, make_contextual
from metarl.envs.toy import Puck

# Per-element intervals that differ: cart x0.5-1, pole x2-4 (no single value fits both).
MASS = C.Scale(np.array([0.5, 2.0]), np.array([1.0, 4.0]), per_element=True)
LOW, HIGH = np.array([0.5, 2.0]), np.array([1.0, 4.0])
# One bound one number, the other one per element: still an interval per element (a
# scalar low was taken for one shared interval, the union 0.5-4, until 2026-12-07: 88%
# of the cart's "interpolation" values lay outside its own x0.5-1).
BOUNDS = {
    "both per element": (MASS, LOW, HIGH),
    "scalar low": (C.Scale(0.5, HIGH, per_element=True), np.array([0.5, 0.5]), HIGH),
    "scalar high": (C.Scale(LOW, 4.0, per_element=True), LOW, np.array([4.0, 4.0])),
}


@pytest.mark.parametrize("bounds", BOUNDS)
def test_interpolation_puts_every_element_inside_its_own_interval(bounds):
    mass, low, high = BOUNDS[bounds]
    values = E.interpolation(C.ContextSpace({"mass": mass}), 200).values["mass"]
    assert values.shape == (200, 2)
    assert np.all((values >= low) & (values <= high))
    assert np.all(values.max(0) - values.min(0) > 0.9 * (high - low))  # each its whole own


@pytest.mark.parametrize("bounds", BOUNDS)
@pytest.mark.parametrize("side", ["low", "high", "both"])
def test_extrapolation_puts_every_element_outside_its_own_interval(side, bounds):
    MASS, LOW, HIGH = BOUNDS[bounds]  # noqa: N806
    space = C.ContextSpace({"mass": MASS})
    env = make_contextual("inverted_pendulum", space)
    values = E.extrapolation(env, space, 200, factor=1.5, side=side).values["mass"]
    centre, half = (LOW + HIGH) / 2, (HIGH - LOW) / 2
    below, above = values < LOW, values > HIGH
    assert values.shape == (200, 2)
    assert np.all(below | above)  # outside, element by element
    assert np.all(np.abs(values - centre) <= 1.5 * half + 1e-6)  # within 1.5x its own interval
    if side != "both":
        assert np.all(below if side == "low" else above)
    else:  # every element is a dimension of its own, as training draws it
        assert 0.3 < np.mean(below[:, 0] != below[:, 1]) < 0.7
    assert np.all(values > 0)  # a mass scale stays physical


def test_extrapolation_keeps_raw_paths_physical():
    """Raw System paths have physical limits too: below a mass of 0.05-2 kg lies
    nothing valid at 0 or under, and a damping range starting at 0 has no low side."""
    space = C.ContextSpace({"link.inertia.mass": C.Uniform(0.05, 2.0)})
    env = make_contextual("inverted_pendulum", space, backend="generalized")
    assert env.binding.lower_limit("link.inertia.mass") == 0.0
    low = E.extrapolation(env, space, 50, factor=1.5, side="low").values["link.inertia.mass"]
    assert np.all((low > 0) & (low < 0.05))
    damping = C.ContextSpace({"dof.damping": C.Uniform(0.0, 1.0)})
    env = make_contextual("inverted_pendulum", damping, backend="generalized")
    with pytest.raises(ValueError, match="no valid values low of the training range"):
        E.extrapolation(env, damping, 4, side="low")


def test_an_element_at_a_physical_limit_leaves_the_other_elements_both_sides():
    """Damping 0-1 on the cart has no side below (damping >= 0), 0.5-1.5 on the pole
    has both: the cart's values go above its interval, the pole's on either side.
    Until 2026-12-07 the cart's missing side was taken from the pole too, and the
    low split refused the name without saying which element had no room."""
    low, high = np.array([0.0, 0.5]), np.array([1.0, 1.5])
    space = C.ContextSpace({"damping": C.Uniform(low, high, per_element=True)})
    env = make_contextual("inverted_pendulum", space)
    values = E.extrapolation(env, space, 400, side="both").values["damping"]
    assert np.all(values[:, 0] > high[0])
    assert 0.3 < np.mean(values[:, 1] < low[1]) < 0.7
    assert np.all((values[:, 1] < low[1]) | (values[:, 1] > high[1]))
    with pytest.raises(E.NoHeldOutValuesError, match=r"low of .*'damping' \(elements \[\[0\]\]"):
        E.extrapolation(env, space, 4, side="low")
    high_side = E.extrapolation(env, space, 50, side="high").values["damping"]
    assert np.all(high_side > high)


def test_log_uniform_sets_are_placed_in_log_space():
    """A LogUniform trains uniformly in log space, so its held-out sets live there: mass
    x0.25-4 extrapolates to x0.125-0.25 and x4-8 (in linear space the low side reached
    x0.002 and the high side stopped at x4.9), and its interpolation is centred on x1."""
    space = C.ContextSpace({"mass": C.LogUniform(0.25, 4.0, relative=True)})
    env = make_contextual("inverted_pendulum", space)
    low = E.extrapolation(env, space, 200, factor=1.5, side="low").values["mass"]
    high = E.extrapolation(env, space, 200, factor=1.5, side="high").values["mass"]
    assert np.all((low >= 0.125 * (1 - 1e-5)) & (low < 0.25)) and low.min() < 0.14
    assert np.all((high > 4.0) & (high <= 8.0 * (1 + 1e-5))) and high.max() > 7.0
    inside = E.interpolation(space, 400).values["mass"]
    assert np.all((inside >= 0.25) & (inside <= 4.0))
    assert 0.4 < np.mean(inside < 1.0) < 0.6  # half below the geometric centre
    assert E.grid(space, {"mass": [1.0]}).values["mass"].tolist() == [1.0]
    # A quantity of either sign (a motor's gear): log space keeps it positive, where a
    # linear low side reached below 0, which LogUniform cannot even be pinned to.
    gain = C.ContextSpace({"actuator_gain": C.LogUniform(0.2, 2.0, relative=True)})
    env = make_contextual("inverted_pendulum", gain)
    values = E.extrapolation(env, gain, 100, side="low").values["actuator_gain"]
    assert np.all((values > 0) & (values < 0.2))


def _heatmap_axes(
    target: C.ContextSpace, points: int = 5, env: str = "inverted_pendulum"
) -> dict[str, np.ndarray]:
    """The heatmap axes an experiment on `env` would plot for `target`."""
    from metarl import experiment

    exp = experiment.Experiment(
        env=make_contextual(env, target),
        target=target,
        curriculum=curricula.LinearWidening(1.0, 1),
        ppo=ppo.PPOConfig(),
        eval=experiment.EvalConfig(heatmap_points=points, extrapolation_factor=1.5),
    )
    return experiment._heatmap_axes(exp)


def test_the_heatmap_of_a_log_uniform_range_spans_its_extrapolation_in_log_space():
    """The heatmap's grid covers what the extrapolation splits cover: for mass x0.25-4,
    x0.125-8 geometrically (x1 in the middle cell). The linear grid it replaces ran
    x0.003 (-0.69, clipped), 0.72, 2.13, 3.53, 4.94: nothing of the high side's x4.94-8."""
    from metarl.tensorboard import _grid_position

    target = C.ContextSpace({"mass": C.LogUniform(0.25, 4.0, relative=True)})
    axis = _heatmap_axes(target)["mass"]
    np.testing.assert_allclose(axis, [0.125, 0.35355, 1.0, 2.8284, 8.0], rtol=1e-4)
    # the training box sits where its bounds lie on that axis: x0.25 and x4, in log steps
    assert _grid_position(axis, 0.25) == pytest.approx(2 / 3)
    assert _grid_position(axis, 4.0) == pytest.approx(4 - 2 / 3)
    assert _grid_position(np.array([0.0, 1.0, 2.0]), 0.5) == pytest.approx(0.5)  # linear


def test_a_two_point_log_uniform_heatmap_outlines_its_training_box_in_log_space():
    """Two grid points fit a linear and a geometric axis alike: the runner tells the
    figure which, so x0.25-4 between grid points x0.125 and x8 sits 1/6 and 5/6 of
    the way in log steps (read linearly, 0.016 and 0.49)."""
    import types

    from metarl import experiment

    target = C.ContextSpace({"mass": C.LogUniform(0.25, 4.0, relative=True)})
    two = _heatmap_axes(target, points=2)["mass"]
    np.testing.assert_allclose(two, [0.125, 8.0], rtol=1e-5)
    drawn = []

    class Logger:
        def log_heatmap(self, step, x, xs, y, ys, returns, box, log_axes):
            drawn.append(L.heatmap_figure(x, xs, y, ys, returns, box, log_axes))

    run = types.SimpleNamespace(
        compiled=types.SimpleNamespace(grid_axes={"mass": two}),
        exp=types.SimpleNamespace(target=target),
    )
    experiment.Run._log_heatmap(run, Logger(), 0, np.zeros(2), [target])
    (box,) = drawn[0].axes[0].patches
    # image coordinates, with the grid's two cells centred at 0 and 1
    assert (box.get_x(), box.get_x() + box.get_width()) == pytest.approx((1 / 6, 5 / 6))


@pytest.mark.parametrize("kind", [C.Scale, C.Uniform])
def test_a_signed_quantity_keeps_the_side_of_zero_of_its_interval(kind):
    """actuator_gain may be negative (a reversed motor), but x0.2-2 extrapolates to weaker
    motors of the same sign, not through 0 (the motor off) to reversed ones; so does an
    absolute gear of 2-20 (its low side reached -2.5, 54% of it reversed motors)."""
    f = 1.0 if kind is C.Scale else 10.0
    for lo, hi, side in ((0.2, 2.0, "low"), (-2.0, -0.2, "high")):
        space = C.ContextSpace({"actuator_gain": kind(f * lo, f * hi)})
        env = make_contextual("inverted_pendulum", space)
        values = E.extrapolation(env, space, 200, side=side).values["actuator_gain"]
        assert np.all(np.sign(values) == np.sign(lo)), (lo, hi, values.min(), values.max())
        assert np.all((values < f * lo) if side == "low" else (values > f * hi))


def test_a_dimension_that_does_not_vary_keeps_its_value_in_every_split():
    """A Fixed timestep is not a dimension of variation: extrapolation moved it by
    +-37% (an absolute floor of 1e-3 on its half-width), now it stays at 4 ms."""
    space = C.ContextSpace({"gravity": C.Uniform(5.0, 15.0), "timestep": C.Fixed(0.004)})
    env = make_contextual("inverted_pendulum", space)
    for side in ("low", "high", "both"):
        values = E.extrapolation(env, space, 50, side=side).values
        assert np.all(values["timestep"] == np.float32(0.004)), side
        assert np.all((values["gravity"] < 5.0) | (values["gravity"] > 15.0))
    assert np.all(E.interpolation(space, 20).values["timestep"] == np.float32(0.004))


def test_a_log_uniform_point_at_zero_keeps_its_value_in_every_split_and_the_heatmap():
    """`space.pinned(env.default_context())` makes a LogUniform viscosity with default
    0 the point LogUniform(0, 0), which it accepts: the held-out sets took its log,
    -inf, and every interpolated and extrapolated viscosity was NaN, which the
    evaluator refused after the run's first segment. A point keeps its value exactly,
    a positive one too (exp(log x) can be a float32 step off x)."""
    wide = C.ContextSpace({"gravity": C.Uniform(5.0, 15.0), "viscosity": C.LogUniform(0.1, 1.0)})
    pinned = wide.pinned({"viscosity": np.float32(0.0)})
    assert pinned["viscosity"] == C.LogUniform(0.0, 0.0)
    space = C.ContextSpace({**pinned, "mass": C.LogUniform(0.3, 0.3, relative=True)})
    env = make_contextual("inverted_pendulum", space)
    sets = [E.interpolation(space, 20, env=env), E.grid(space, {"gravity": [5.0, 15.0]})]
    sets += [E.extrapolation(env, space, 20, side=side) for side in ("low", "high", "both")]
    for held_out in sets:
        assert np.all(held_out.values["viscosity"] == 0.0), held_out.split
        assert np.all(held_out.values["mass"] == np.float32(0.3)), held_out.split
        E.Evaluator(env, episodes=1, max_contexts=20).ranges(held_out)  # all finite: taken
    axes = _heatmap_axes(space)
    assert np.all(axes["viscosity"] == 0.0)
    assert axes["gravity"][0] < 5.0 < 15.0 < axes["gravity"][-1]


def test_a_one_value_choice_keeps_its_value_and_the_interpolation_split():
    """Choice([1.0]) does not vary, as Fixed(1.0): interpolation keeps it at 1.0 (it
    raised NoHeldOutValuesError, and the run dropped the whole split)."""
    space = C.ContextSpace({"gravity": C.Uniform(5.0, 15.0), "mass": C.Choice([1.0])})
    values = E.interpolation(space, 20).values
    assert np.all(values["mass"] == 1.0)
    assert np.all((values["gravity"] >= 5.0) & (values["gravity"] <= 15.0))


def test_a_choice_value_of_probability_zero_is_not_trained_on():
    """Choice([0.5, 1, 2], probs=[.5, .5, 0]) trains on x0.5 and x1 only: its interval
    is [0.5, 1], interpolation is x0.75 (not 1.5, beyond every trained value), and
    extrapolation_high begins at x1 (it began at x2, and x1-2 went unevaluated)."""
    dist = C.Choice([0.5, 1.0, 2.0], probs=[0.5, 0.5, 0.0], relative=True)
    space = C.ContextSpace({"mass": dist})
    lo, hi = space.intervals()["mass"]
    assert (float(lo), float(hi)) == (0.5, 1.0)
    assert set(E.interpolation(space, 50).values["mass"].tolist()) == {0.75}
    env = make_contextual("inverted_pendulum", space)
    high = E.extrapolation(env, space, 200, side="high").values["mass"]
    assert high.min() > 1.0 and high.max() <= 1.125 + 1e-6  # factor 1.5 about 0.75


def test_a_truncated_normal_is_held_out_where_its_draws_lie():
    """TruncatedNormal(1, 0.1, 0.05, 5) draws within 1 +- 0.45; its interval was its
    bounds 0.05-5, so 72% of "interpolation" lay beyond any training draw. It is where
    the central 95.45% of its draws lie, as a Normal's mean +- 2 std: with bounds that
    cut into that, the truncated draws' own quantiles (mean +- 2 std clipped put 67%
    of a TruncatedNormal(2, 0.1, 0, 1)'s interval below every draw but 0.1%)."""
    space = C.ContextSpace(
        {
            "mass": C.TruncatedNormal(1.0, 0.1, 0.05, 5.0, relative=True),
            "inertia": C.TruncatedNormal(1.0, 0.1, 0.9, 5.0, relative=True),  # cut low
            "gravity": C.TruncatedNormal(2.0, 0.1, 0.0, 1.0),  # its mean beyond its bounds
        }
    )
    iv = {n: tuple(map(float, v)) for n, v in space.intervals().items()}
    assert iv["mass"] == pytest.approx((0.8, 1.2))
    for name in ("inertia", "gravity"):
        draws = np.asarray(space[name].sample(jax.random.key(0), (200_000,)))
        want = np.quantile(draws, [0.02275, 0.97725])
        np.testing.assert_allclose(iv[name], want, atol=2e-3, err_msg=name)
    assert iv["gravity"][0] > 0.96  # not 0.8
    inside = E.interpolation(space, 200).values["mass"]
    assert np.all((inside >= 0.8 - 1e-6) & (inside <= 1.2 + 1e-6))
    env = make_contextual("inverted_pendulum", space)
    high = E.extrapolation(env, space, 100, side="high").values["mass"]
    assert np.all((high > 1.2) & (high <= 1.3 + 1e-6))  # 2-3 std out, as for a Normal


def test_the_grid_holds_other_names_at_a_trained_centre():
    """Names off the heatmap's axes sit at their centre: each element at its own
    interval's (cart x0.75, pole x3; both were pinned to x2.25, outside the cart's
    x0.5-1), and a relative Choice of motor signs at a trained value (its middle, a
    gear of 0, switched the motor off in every cell)."""
    space = C.ContextSpace(
        {
            "gravity": C.Uniform(5.0, 15.0),
            "mass": MASS,
            "actuator_gain": C.Choice([-1.0, -0.5, 0.5, 1.0], relative=True),
            "inertia": C.LogUniform(0.25, 4.0, relative=True),
        }
    )
    values = E.grid(space, {"gravity": [5.0, 10.0, 15.0]}).values
    assert values["mass"].shape == (3, 2)
    np.testing.assert_allclose(values["mass"], [[0.75, 3.0]] * 3)
    np.testing.assert_array_equal(values["actuator_gain"], [0.5] * 3)  # a tie: the larger
    np.testing.assert_allclose(values["inertia"], [1.0] * 3, rtol=1e-6)  # geometric centre
    np.testing.assert_array_equal(values["gravity"], [5.0, 10.0, 15.0])


def test_the_heatmap_keeps_a_scales_sign_as_the_extrapolation_splits_do():
    """actuator_gain x0.1-2, widened by 1.5 about its centre, would reach x-0.375 (a
    reversed motor) on the heatmap while extrapolation_low stays above 0."""
    target = C.ContextSpace({"actuator_gain": C.Scale(0.1, 2.0)})
    axis = _heatmap_axes(target)["actuator_gain"]
    assert np.all(axis > 0), axis
    assert axis.max() == pytest.approx(2.475)  # the high side is unchanged: 1.05 + 1.425


def test_a_choice_heatmap_axis_holds_the_splits_points_and_never_a_motor_off():
    """A motor sign Choice(-1, -0.5, 0.5, 1) of scales: evenly spaced points put a cell
    at gain x0 (the motor switched off, another task) inside the training box. The axis
    is now the trained values, the interpolation split's midpoints (none across 0)
    and the extrapolated ends."""
    target = C.ContextSpace({"actuator_gain": C.Choice([-1.0, -0.5, 0.5, 1.0], relative=True)})
    axis = _heatmap_axes(target)["actuator_gain"]
    np.testing.assert_allclose(axis, [-1.5, -1.0, -0.75, -0.5, 0.5, 0.75, 1.0, 1.5])
    absolute = C.ContextSpace({"gravity": C.Choice([5.0, 10.0])})
    np.testing.assert_allclose(_heatmap_axes(absolute)["gravity"], [3.75, 5.0, 7.5, 10.0, 11.25])
    # damping 0 or 1: nothing physical lies below 0, so the axis has no low end (it
    # had one clipped to 0.00075, a cell beside the trained 0 that no split takes)
    damping = C.ContextSpace({"damping": C.Choice([0.0, 1.0])})
    np.testing.assert_allclose(_heatmap_axes(damping)["damping"], [0.0, 0.5, 1.0, 1.25])


def test_heatmap_points_are_spread_over_the_physical_span_all_distinct():
    """mass x0.05-1.95 widened by 1.5 reaches x-0.425: its points below 0 were each
    clipped to x0.0014, one context in several cells (72 distinct of 9 x 9). The points
    now span x0.0014-2.425 evenly; an absolute gear of 2-20 stays above 0 too."""
    target = C.ContextSpace({"mass": C.Scale(0.05, 1.95), "actuator_gain": C.Uniform(2.0, 20.0)})
    axes = _heatmap_axes(target, points=9)
    for name, top in (("mass", 2.425), ("actuator_gain", 24.5)):
        axis = axes[name]
        assert len(np.unique(axis)) == 9 and 0 < axis[0] < 0.02 * top, (name, axis)
        np.testing.assert_allclose(np.diff(axis), (top - axis[0]) / 8, rtol=1e-6)
    grid = E.grid(target, axes).values
    assert len(set(zip(grid["mass"].tolist(), grid["actuator_gain"].tolist()))) == 81


def test_interpolating_a_relative_choice_never_switches_the_quantity_off():
    """Motor signs x-1, -0.5, 0.5, 1: the midpoint of -0.5 and 0.5 is a gear of 0 (no
    motor, a return of 0 whatever the policy does); an absolute choice keeps it."""
    signs = C.ContextSpace({"actuator_gain": C.Choice([-1.0, -0.5, 0.5, 1.0], relative=True)})
    values = E.interpolation(signs, 200).values["actuator_gain"]
    assert set(values.tolist()) == {-0.75, 0.75}
    goals = C.ContextSpace({"goal": C.Choice([-1.0, 1.0])})
    assert set(E.interpolation(goals, 10).values["goal"].tolist()) == {0.0}
    with pytest.raises(ValueError, match="without crossing a scale of 0"):
        E.interpolation(C.ContextSpace({"g": C.Choice([-1.0, 1.0], relative=True)}), 4)


def test_an_angle_is_extrapolated_modulo_a_turn():
    """goal_direction trained over -pi..pi has no outside: "extrapolating" it to
    -1.5pi..-pi put every goal back in a trained direction. A narrower arc is left
    by at most half of the untrained rest of the turn on each side."""
    dist = C.Uniform(0.1, 0.2)
    whole = C.ContextSpace({"goal_distance": dist, "goal_direction": C.Uniform(-np.pi, np.pi)})
    env = make_contextual("reacher_goal", whole)
    assert env.unwrapped.task_periods == {"goal_direction": 2 * np.pi}
    for side in ("low", "high"):
        values = E.extrapolation(env, whole, 200, side=side).values
        assert np.all(np.abs(values["goal_direction"]) <= np.pi + 1e-6), side
        assert np.ptp(values["goal_direction"]) > np.pi  # drawn over the whole turn
        distance = values["goal_distance"]
        assert np.all((distance < 0.1) if side == "low" else (distance > 0.2))
    arc = C.ContextSpace({"goal_direction": C.Uniform(-2.5, 2.5)})  # 1.28 rad untrained
    env = make_contextual("reacher_goal", arc)
    for side in ("low", "high"):
        angle = E.extrapolation(env, arc, 200, factor=1.5, side=side).values["goal_direction"]
        wrapped = (angle + np.pi) % (2 * np.pi) - np.pi
        assert np.all(np.abs(wrapped) > 2.5 - 1e-6), side  # outside the arc, modulo a turn
        assert np.all(np.abs(angle) <= np.pi + 1e-6)  # not halfway round into the other side


def test_an_angle_is_extrapolated_across_zero_and_its_heatmap_stays_within_half_a_turn():
    """Zero is just another angle: the side-of-zero rule for a motor's gear cut the low
    side of an arc 0.3-3 to 0.0014-0.3 (it reaches -0.375 at factor 1.5), and the
    heatmap of an arc -2.5..2.5 ran to +-3.75, past +-pi: the same goal in two cells."""
    arc = C.ContextSpace({"goal_direction": C.Uniform(0.3, 3.0)})
    env = make_contextual("reacher_goal", arc)
    low = E.extrapolation(env, arc, 400, factor=1.5, side="low").values["goal_direction"]
    assert np.all(low < 0.3) and np.all(low >= -0.375 - 1e-6) and low.min() < -0.3
    wide = C.ContextSpace({"goal_direction": C.Uniform(-2.5, 2.5)})
    axis = _heatmap_axes(wide, points=9, env="reacher_goal")["goal_direction"]
    np.testing.assert_allclose(axis[[0, -1]], [-np.pi, np.pi], atol=1e-5)


@flax.struct.dataclass
class _Push:
    """A fixed policy (always push +1), as the evaluator calls one."""

    def init_carry(self, n):
        return jnp.zeros((n,))

    def __call__(self, obs, carry):
        return jnp.ones((obs.shape[0], 1)), carry

    def observe(self, carry, action, state):
        return carry


def test_the_evaluator_counts_episodes_cut_by_non_finite_physics():
    """A stiff spring with a long timestep blows up: its episodes end at the cut and are
    counted, context by context (before, the evaluator averaged their partial returns
    with no sign that the simulator, not the policy, had ended them)."""
    space = C.ContextSpace({"stiffness": C.Uniform(1.0, 1e4), "timestep": C.Uniform(0.01, 0.2)})
    env = make_contextual(Puck(), space, episode_length=60)
    contexts = E.ContextSet(
        "extrapolation",
        {
            "stiffness": np.array([1.0, 1e4, 1.0], np.float32),
            "timestep": np.array([0.01, 0.2, 0.01], np.float32),
        },
    )
    result = E.Evaluator(env, episodes=3, max_contexts=4).evaluate(
        _Push(), contexts, jax.random.key(0)
    )
    assert result.nonfinite.shape == (3, 3)
    np.testing.assert_array_equal(result.nonfinite.sum(1), [0, 3, 0])
    assert np.all(np.isfinite(result.returns))  # cut, not NaN


@flax.struct.dataclass
class _PushFirst:
    """Pushes +1 in a trial's first episode and -1 in its later ones: a policy whose
    episodes of a trial differ, as an adapting agent's do."""

    def init_carry(self, n):
        return jnp.zeros((n,), jnp.int32)

    def __call__(self, obs, carry):
        return jnp.where(carry[:, None] == 0, 1.0, -1.0), carry

    def observe(self, carry, action, state):
        return state.info[TRIAL].episode


def test_the_evaluator_runs_whole_trials_and_counts_every_episode_alike():
    """Trials of 3 episodes: episodes=4 ran two trials and averaged 4 of their 6
    episodes, the first of a trial twice (a mean of -0.05 where a trial's is -10.4).
    A number of episodes that is not whole trials is refused, by the evaluator and
    so by an experiment's eval config; 6 counts both trials whole."""
    from metarl import experiment

    space = C.ContextSpace({"mass": C.Scale(0.9, 1.1)})
    env = make_contextual(Puck(), space, episode_length=20, episodes_per_trial=3)
    for episodes in (1, 2, 4, 5):
        with pytest.raises(
            ValueError, match=f"episodes={episodes} .*episodes_per_trial=3.*3, 6, 9"
        ):
            E.Evaluator(env, episodes=episodes)
    config = ppo.PPOConfig(num_envs=8, num_minibatches=1, unroll_length=4)
    exp = experiment.Experiment(
        env, space, curricula.LinearWidening(1.0, 1), config, experiment.EvalConfig(episodes=2)
    )
    with pytest.raises(ValueError, match=r"episodes=2 \(eval.episodes.*3, 6, 9"):
        experiment.compile_experiment(exp)
    contexts = E.ContextSet("train", {"mass": np.ones(1, np.float32)})
    result = E.Evaluator(env, episodes=6, max_contexts=1).evaluate(
        _PushFirst(), contexts, jax.random.key(0)
    )
    assert result.returns.shape == (1, 6)
    assert result.returns[0, 0] > 0 > result.returns[0, 1]  # the episodes of a trial differ
    np.testing.assert_allclose(result.mean, result.by_episode.mean(1), rtol=1e-5)


def test_an_env_with_no_contexts_evaluates_its_one_empty_context():
    """An env of an empty space (a plain baseline; the PPO benchmark's) evaluates the
    context set of no names: one context, the env's own physics."""
    env = make_contextual(Puck(), C.ContextSpace({}), episode_length=20)
    result = E.Evaluator(env, episodes=2, max_contexts=1).evaluate(
        _Push(), E.ContextSet("train", {}), jax.random.key(0)
    )
    assert result.returns.shape == (1, 2) and np.all(result.returns != 0)


def test_a_set_larger_than_the_evaluator_runs_in_chunks_of_its_size():
    """The runner's evaluator takes a split's contexts; the heatmap's larger grid runs
    through the same program in chunks, chunk i > 0 with a key of its own, and gives
    what those chunks give alone (before, every split was padded to the grid's size).
    No chunk's key is the reset key of an env of the first chunk (`fold_in(key, i)`
    was: env i's key of ``split(key, n)``)."""
    space = C.ContextSpace({"mass": C.Scale(0.5, 2.0)})
    env = make_contextual(Puck(), space, episode_length=15)
    evaluator = E.Evaluator(env, episodes=2, max_contexts=2)
    masses = np.linspace(0.5, 2.0, 5, dtype=np.float32)
    key = jax.random.key(4)
    keys = [E._chunk_key(key, j) for j in range(3)]
    assert keys[0] is key
    firsts = jax.random.key_data(jax.random.split(key, evaluator.max_contexts * evaluator.trials))
    for k in keys[1:]:
        assert not (firsts == jax.random.key_data(k)).all(-1).any()
    chunks = [
        evaluator.evaluate(_Push(), E.ContextSet("grid", {"mass": masses[i : i + 2]}), k)
        for k, i in zip(keys, range(0, 5, 2), strict=True)
    ]
    with count_compilations() as compiles:
        whole = evaluator.evaluate(_Push(), E.ContextSet("grid", {"mass": masses}), key)
    assert compiles.count == 0
    assert whole.contexts.values["mass"] is masses and whole.returns.shape == (5, 2)
    for field in ("returns", "mean", "std", "by_episode", "nonfinite"):
        want = np.concatenate([getattr(c, field) for c in chunks])
        np.testing.assert_array_equal(getattr(whole, field), want, err_msg=field)
    assert len(set(whole.mean.tolist())) == 5  # each mass its own return


def test_a_context_set_gives_every_name_one_value_per_context():
    """A set that left out a name of the env's space ran it drawn from its training
    range (not held out), and values of unequal lengths were cut to the first's:
    both raise, naming the names and the lengths."""
    with pytest.raises(ValueError, match=r"lengths \{'mass': 3, 'actuator_gain': 2\}"):
        E.ContextSet("train", {"mass": np.ones(3), "actuator_gain": np.ones(2)})
    space = C.ContextSpace({"mass": C.Scale(0.5, 2.0), "actuator_gain": C.Scale(0.5, 2.0)})
    evaluator = E.Evaluator(make_contextual(Puck(), space, episode_length=20), 1, 2)
    ones = np.ones(2, np.float32)
    for values, match in (
        ({"mass": ones}, r"missing \['actuator_gain'\], unknown \[\]"),
        (
            {"mass": ones, "actuator_gain": ones, "gravity": ones},
            r"missing \[\], unknown \['gravity'\]",
        ),
    ):
        with pytest.raises(ValueError, match=match):
            evaluator.evaluate(_Push(), E.ContextSet("x", values), jax.random.key(0))


def test_per_element_held_out_sets_draw_every_element_on_its_own():
    """Training draws each mass of Scale(0.5, 2, per_element=True) on its own, so do
    the held-out sets: cart and pole differ within a context, in every split (before,
    one range for all elements gave one value for both, the diagonal of what
    training sees). `grid` moves them together. Without the env a set cannot know
    how many elements share the range."""
    space = C.ContextSpace({"mass": C.Scale(0.5, 2.0, per_element=True)})
    env = make_contextual("inverted_pendulum", space)
    sets = {
        "train": E.in_distribution(space, 100, env=env),
        "interpolation": E.interpolation(space, 100, env=env),
        **{s: E.extrapolation(env, space, 100, side=s) for s in ("low", "high", "both")},
    }
    for split, contexts in sets.items():
        values = contexts.values["mass"]
        assert values.shape == (100, 2), split
        assert np.mean(values[:, 0] != values[:, 1]) > 0.99, split
        assert abs(np.corrcoef(values.T)[0, 1]) < 0.5, split  # drawn independently
    assert np.all((sets["train"].values["mass"] >= 0.5) & (sets["train"].values["mass"] <= 2))
    assert np.all(sets["low"].values["mass"] < 0.5) and np.all(sets["high"].values["mass"] > 2)
    with pytest.raises(ValueError, match="pass env="):  # it would pin cart and pole alike
        E.in_distribution(space, 7)
    assert E.grid(space, {"mass": [1.0, 2.0]}).values["mass"].shape == (2,)


def _push_return(env, key, steps):
    """The return of one episode of `_Push` from ``env.reset(key)``, stepped by hand."""
    state, total = env.reset(key), 0.0
    step = jax.jit(env.step)
    for _ in range(steps):
        state = step(state, jnp.ones((1,)))
        total += float(state.reward)
        if state.done:
            break
    return total


def test_the_evaluator_runs_each_element_at_its_own_value():
    """A context set with cart x0.5, pole x2 on a range shared by the masses runs
    exactly the physics of an env whose masses are set to x0.5 and x2 (stepped here
    by hand, without the evaluator); the swapped masses run another. Before, a range
    shared by the elements could only be pinned to one number, and this set raised."""
    shared = C.ContextSpace({"mass": C.Scale(0.25, 4.0, per_element=True)})
    env = make_contextual("inverted_pendulum", shared, episode_length=40)
    contexts = E.ContextSet("train", {"mass": np.array([[0.5, 2.0], [2.0, 0.5]], np.float32)})
    key = jax.random.key(3)
    result = E.Evaluator(env, episodes=1, max_contexts=2).evaluate(_Push(), contexts, key)
    keys = jax.random.split(key, 2)
    for i, masses in enumerate(contexts.values["mass"]):
        point = C.ContextSpace({"mass": C.Scale(masses, masses, per_element=True)})
        alone = make_contextual("inverted_pendulum", point, episode_length=40)
        np.testing.assert_allclose(result.mean[i], _push_return(alone, keys[i], 40), rtol=1e-5)
    assert result.mean[0] != result.mean[1]
    with pytest.raises(ValueError, match="one number or one per element, shape \\(2,\\)"):
        E.Evaluator(env, episodes=1).evaluate(
            _Push(), E.ContextSet("train", {"mass": np.ones((1, 3), np.float32)}), key
        )


def test_the_generalization_gap_takes_the_worse_side_and_a_nan_side_makes_it_nan():
    """train - the worse extrapolation side; a side whose mean is NaN (no episode
    ended there) made the gap NaN or not by the order of the two sides."""

    def gap(low, high):
        results = {
            s: types.SimpleNamespace(mean=np.array([v]))
            for s, v in (("train", 100.0), ("extrapolation_low", low), ("extrapolation_high", high))
        }
        return E.summarize(results)["generalization_gap"]

    assert gap(40.0, 70.0) == gap(70.0, 40.0) == 60.0
    with warnings.catch_warnings():  # NaN is the answer, not numpy's "Mean of empty slice"
        warnings.simplefilter("error")
        assert np.isnan(gap(np.nan, 50.0)) and np.isnan(gap(50.0, np.nan))
