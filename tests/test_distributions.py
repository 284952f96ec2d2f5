"""Every context distribution samples what it says: means and quantiles against scipy."""

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from metarl import contexts as C

N = 20_000
_sample = jax.jit(lambda dist, key: dist.sample(key, (N,)))


def _draw(dist, seed=0):
    x = np.asarray(_sample(dist, jax.random.key(seed)), np.float64)
    assert x.shape == (N,) and np.isfinite(x).all()
    return x


def _close_to(x, ref, width):
    """Mean and 10/50/90% quantiles match the reference within a few standard errors."""
    tol = 5 * width / np.sqrt(N) + 1e-5 * (1 + abs(ref.mean()))
    np.testing.assert_allclose(x.mean(), ref.mean(), atol=tol)
    np.testing.assert_allclose(
        np.quantile(x, [0.1, 0.5, 0.9]), ref.ppf([0.1, 0.5, 0.9]), atol=3 * tol
    )


@pytest.mark.parametrize(
    "mean, std, low, high",
    [(2.0, 0.1, 0.0, 1.0), (0.0, 0.1, 0.6, 1.0), (1.5, 0.1, 0.0, 1.0), (0.0, 1.0, -50.0, -40.0)],
    ids=["interval-10-sigma-below", "interval-6-sigma-above", "5-sigma-below", "far-left-tail"],
)
def test_truncated_normal_far_from_its_mean_samples_the_right_end(mean, std, low, high):
    x = _draw(C.TruncatedNormal(mean, std, low, high))
    assert low <= x.min() and x.max() <= high
    ref = stats.truncnorm((low - mean) / std, (high - mean) / std, loc=mean, scale=std)
    _close_to(x, ref, min(std, high - low))


@pytest.mark.parametrize("mean", [2.0, 0.5, -1.0], ids=["beyond-high", "inside", "beyond-low"])
def test_a_truncated_normal_shrinks_and_normalises_where_its_draws_lie(mean):
    """TruncatedNormal(2, 0.1, 0, 1).scaled(0.1) shrank about its mean, beyond its
    bounds: its draws, 1.89-1.90, left the support it was shrunk from. Its visible
    context was normalised over its bounds: gravity TruncatedNormal(9.8, 0.5, 0.1, 30)
    used 8% of [-1, 1]."""
    dist = C.TruncatedNormal(mean, 0.1, 0.0, 1.0)
    x = _draw(dist)
    shrunk = _draw(dist.scaled(0.1))
    assert 0.0 <= shrunk.min() and shrunk.max() <= 1.0
    np.testing.assert_allclose(np.median(shrunk), dist.centre(), atol=0.02)
    offset, scale = dist.normaliser()
    low, high = np.quantile((x - offset) / scale, [0.02275, 0.97725])
    assert low == pytest.approx(-1.0, abs=0.05) and high == pytest.approx(1.0, abs=0.05)
    offset, scale = C.TruncatedNormal(9.8, 0.5, 0.1, 30.0).normaliser()
    assert (offset, scale) == (pytest.approx(9.8), pytest.approx(1.0, rel=1e-5))


@settings(max_examples=25, deadline=None)
@given(
    mean=st.floats(-5, 5),
    std=st.floats(0.05, 3),
    a=st.floats(-12, 12),
    width=st.floats(0.05, 6),
)
def test_truncated_normal_matches_scipy_for_any_interval(mean, std, a, width):
    low, high = mean + a * std, mean + (a + width) * std
    x = _draw(C.TruncatedNormal(mean, std, low, high))
    ref = stats.truncnorm(a, a + width, loc=mean, scale=std)
    _close_to(x, ref, min(std, high - low))


@pytest.mark.parametrize(
    "dist, ref, width",
    [
        (C.Uniform(-2.0, 3.0), stats.uniform(-2.0, 5.0), 5.0),
        (C.LogUniform(0.01, 10.0), stats.loguniform(0.01, 10.0), 10.0),
        (C.Normal(1.0, 0.5), stats.norm(1.0, 0.5), 0.5),
        (C.TruncatedNormal(0.0, 1.0, -1.0, 2.0), stats.truncnorm(-1.0, 2.0), 1.0),
        (C.Scale(0.5, 2.0), stats.uniform(0.5, 1.5), 1.5),
    ],
    ids=["uniform", "loguniform", "normal", "truncated-normal", "scale"],
)
def test_continuous_distributions_match_scipy(dist, ref, width):
    _close_to(_draw(dist), ref, width)


def test_choice_matches_its_probabilities():
    values, probs = [0.5, 1.0, 3.0], [0.2, 0.5, 0.3]
    x = _draw(C.Choice(values, probs))
    freq = [np.mean(x == v) for v in values]
    np.testing.assert_allclose(freq, probs, atol=5 * np.sqrt(0.25 / N))


def test_fixed_is_exactly_its_value():
    assert set(_draw(C.Fixed(4.0))) == {4.0}


@pytest.mark.parametrize(
    "dist",
    [
        C.Uniform(0.5, 2.0),
        C.LogUniform(0.1, 10.0),
        C.Normal(1.0, 0.5),
        C.TruncatedNormal(1.0, 0.5, 0.2, 3.0),
        C.Choice([0.5, 1.0, 3.0]),
        C.Fixed(4.0),
    ],
    ids=["uniform", "loguniform", "normal", "truncated-normal", "choice", "fixed"],
)
def test_sampling_outside_jit_compiles_once(dist):
    """Held-out sets and curricula draw outside jit, between segments: a distribution
    that compiled at every draw would cost a compile per segment."""
    from metarl.compilation import count_compilations

    dist.sample(jax.random.key(0), (4,))
    with count_compilations() as again:
        for seed in (1, 2, 3):
            dist.sample(jax.random.key(seed), (4,))
    assert again.count == 0


def test_a_truncated_normal_without_spread_has_one_value_as_its_support():
    """std 0 draws the mean (clipped to the bounds) and nothing else: its support is
    that point, element by element, which check_env and the bounds check read."""
    dist = C.TruncatedNormal([1.0, 3.0, 1.0], [0.0, 0.0, 0.2], 0.5, 2.0, per_element=True)
    low, high = dist.support()
    np.testing.assert_array_equal(low, [1.0, 2.0, 0.5])
    np.testing.assert_array_equal(high, [1.0, 2.0, 2.0])
    x = np.asarray(dist.sample(jax.random.key(0), (1000, 3)))
    assert (x[:, :2] == low[:2]).all() and x[:, 2].min() < x[:, 2].max()


@pytest.mark.parametrize(
    "mean, std, low, high",
    [(0.0, 1e6, 0.0, 1.0), (0.0, 1e3, 0.0, 1.0), (2.0, 1.0, 0.0, 0.005), (0.0, 1.0, -50.0, -49.99)],
    ids=["1e6-std-wide", "1e3-std-wide", "narrow-below-the-mean", "narrow-far-left-tail"],
)
def test_a_truncated_normal_far_narrower_than_its_std_is_not_coarse(mean, std, low, high):
    """Its inverse CDF in log space resolved 13 values at std 1e6 over [0, 1], their
    mean 0.5455."""
    x = _draw(C.TruncatedNormal(mean, std, low, high))
    assert low <= x.min() and x.max() <= high
    ref = stats.truncnorm((low - mean) / std, (high - mean) / std, loc=mean, scale=std)
    with np.errstate(invalid="ignore"):  # scipy's moments at a std of 1e6
        _close_to(x, ref, high - low)
    representable = (high - low) / np.spacing(np.float32(max(abs(low), abs(high))))
    assert len(np.unique(x)) > min(N, representable) // 2
