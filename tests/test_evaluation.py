"""Held-out context sets lie where their split says: interpolation inside every
element's own training interval, extrapolation outside it and physical."""

import numpy as np
import pytest

from metarl import contexts as C
from metarl import evaluation as E
from metarl.envs import make_contextual

# Per-element intervals that differ: cart x0.5-1, pole x2-4 (no single value fits both).
MASS = C.Scale(np.array([0.5, 2.0]), np.array([1.0, 4.0]), per_element=True)
LOW, HIGH = np.array([0.5, 2.0]), np.array([1.0, 4.0])


def test_interpolation_puts_every_element_inside_its_own_interval():
    values = E.interpolation(C.ContextSpace({"mass": MASS}), 200).values["mass"]
    assert values.shape == (200, 2)
    assert np.all((values >= LOW) & (values <= HIGH))


@pytest.mark.parametrize("side", ["low", "high", "both"])
def test_extrapolation_puts_every_element_outside_its_own_interval(side):
    space = C.ContextSpace({"mass": MASS})
    env = make_contextual("inverted_pendulum", space)
    values = E.extrapolation(env, space, 200, factor=1.5, side=side).values["mass"]
    centre, half = (LOW + HIGH) / 2, (HIGH - LOW) / 2
    below, above = values < LOW, values > HIGH
    assert values.shape == (200, 2)
    assert np.all(below | above)  # outside, element by element
    assert np.all(np.abs(values - centre) <= 1.5 * half + 1e-6)  # within 1.5x its own interval
    assert np.all(below.all(1) | above.all(1))  # a context takes one side for all elements
    if side != "both":
        assert np.all(below if side == "low" else above)
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
