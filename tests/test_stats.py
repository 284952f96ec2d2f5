"""metarl.stats: IQM and stratified-bootstrap CIs against known cases and scipy."""

import numpy as np
import pytest
from scipy import stats as scipy_stats

from metarl import stats


def test_iqm_of_known_cases():
    assert stats.iqm([1, 2, 3, 4, 100, 200, 300, 400]) == pytest.approx((3 + 4 + 100 + 200) / 4)
    # n = 5: [1.25, 3.75) keeps 3/4 of x2, x3, 3/4 of x4 (sorted 1..5)
    assert stats.iqm([5, 1, 4, 2, 3]) == pytest.approx((0.75 * 2 + 3 + 0.75 * 4) / 2.5)
    assert stats.iqm([7.0]) == 7.0


@pytest.mark.parametrize("n", [4, 8, 12, 40])
def test_iqm_equals_scipy_trimmed_mean_for_multiples_of_four(n):
    x = np.random.default_rng(n).standard_normal(n) * 10
    assert stats.iqm(x) == pytest.approx(scipy_stats.trim_mean(x, 0.25))


def test_ci_covers_the_true_centre_about_95_percent_of_the_time():
    rng = np.random.default_rng(0)
    hits = 0
    for trial in range(200):
        s = stats.summarize(rng.normal(3.0, 1.0, 20), reps=500, seed=trial)
        hits += s.ci_low <= 3.0 <= s.ci_high
    assert 0.85 <= hits / 200 <= 0.995


def test_bootstrap_is_stratified_over_tasks_and_deterministic():
    # Task 0 scores are all 0, task 1 all 100: resampling within tasks keeps every
    # resample's IQM at 50; pooling the tasks would not.
    scores = np.stack([np.zeros(6), np.full(6, 100.0)], axis=1)
    s = stats.summarize(scores)
    assert (s.iqm, s.ci_low, s.ci_high) == (50.0, 50.0, 50.0)
    x = np.random.default_rng(1).normal(size=(10, 3))
    assert stats.summarize(x, seed=4) == stats.summarize(x, seed=4)
    assert stats.summarize(x, seed=4) != stats.summarize(x, seed=5)


def test_edge_cases():
    one = stats.summarize([42.0])
    assert (one.iqm, one.n) == (42.0, 1) and np.isnan(one.ci_low) and np.isnan(one.ci_high)
    assert stats.format_iqm(one) == "42 [no CI: 1 seed]"
    # Below MIN_SEEDS_FOR_CI finite seeds, no interval: a diverged seed can take a run
    # below it, and the bootstrap of 2 or 3 seeds covers 50-74% (test below).
    dropped = stats.summarize([1.0, np.nan, 3.0, 2.0])
    assert dropped.n == 3 and dropped.dropped == 1 and dropped.mean == 2.0
    assert np.isnan(dropped.ci_low) and np.isnan(dropped.ci_high)
    assert stats.format_iqm(dropped) == "2 [no CI: 3 seeds] (1 of 4 non-finite)"
    assert stats.format_iqm(stats.summarize([1.0, 3.0, 2.0])) == "2 [no CI: 3 seeds]"
    four = stats.summarize([1.0, 2.0, 3.0, 4.0])
    assert stats.MIN_SEEDS_FOR_CI == 4 and four.ci_low < 2.5 < four.ci_high
    assert stats.format_iqm(four).startswith("2 [") and "no CI" not in stats.format_iqm(four)
    with pytest.raises(ValueError, match="num_seeds"):
        stats.summarize(np.zeros((2, 2, 2)))
    # reps=2 gave 3 [1.05, 2.95] (missing its own point), reps=1 a zero-width "CI"
    for reps, least in ((0, 400), (2, 400), (399, 400), (2.5, 400), (True, 400)):
        with pytest.raises(ValueError, match=f"reps must be an integer >= {least} for a 0.95"):
            stats.summarize([1.0, 2.0, 3.0, 4.0, 5.0], reps=reps)
    with pytest.raises(ValueError, match="reps must be an integer >= 200 for a 0.9 "):
        stats.summarize([1.0, 2.0, 3.0, 4.0, 5.0], reps=199, confidence=0.9)
    for empty in ([], np.zeros((0, 3))):  # no seeds at all: nothing to summarize, said so
        none = stats.summarize(empty)
        assert none.n == 0 and np.isnan(none.iqm) and np.isnan(none.mean)
    # an infinite score in the trimmed quarters is trimmed, not 0 * inf = NaN
    assert stats.iqm([1.0, 2.0, 3.0, np.inf]) == 2.5
    assert stats.iqm([-np.inf, 1.0, 2.0, 3.0]) == 1.5
    # a NaN has no rank: not trimmed as the largest score (that gave 2.5 here)
    assert np.isnan(stats.iqm([1.0, 2.0, 3.0, np.nan]))
    assert stats.summarize([1.0, 2.0, 3.0, np.nan]).iqm == 2.0


def test_few_seeds_bootstrap_would_undercover_which_is_why_it_is_withheld():
    # What MIN_SEEDS_FOR_CI rests on: the percentile bootstrap of the IQM, computed
    # as summarize does at 4+ seeds, covers the true centre (0) of normal scores
    # about half the time at 2 seeds and about 3 times in 4 at 3.
    rng = np.random.default_rng(0)
    for n, most in ((2, 0.65), (3, 0.85)):
        hits = 0
        for _ in range(200):
            x = rng.normal(0.0, 1.0, n)
            boots = [stats.iqm(x[rng.integers(0, n, n)]) for _ in range(400)]
            low, high = np.quantile(boots, [0.025, 0.975])
            hits += low <= 0.0 <= high
        assert hits / 200 < most, (n, hits)


def test_difference_ci_covers_the_true_gap_and_says_which_is_better():
    rng = np.random.default_rng(0)
    hits = 0
    for _ in range(400):
        d = stats.difference(rng.normal(5.0, 2.0, 12), rng.normal(3.0, 1.0, 8))
        hits += d.ci_low <= 2.0 <= d.ci_high
    assert 0.92 <= hits / 400 <= 0.98
    far = stats.difference([10.0, 11.0, 12.0, 13.0], [1.0, 2.0, 3.0])
    assert (far.diff, far.n_a, far.n_b) == (9.5, 4, 3) and far.ci_low > 0
    assert stats.format_difference(far).startswith("+10 [")
    same = stats.difference([1.0, 5.0, 3.0, 7.0], [2.0, 6.0, 4.0, 4.0])
    assert same.ci_low < 0 < same.ci_high
    assert stats.format_difference(stats.difference([1.0, 2.0], [4.0, 5.0])).startswith("-3 [")


def test_a_bound_next_to_zero_says_on_which_side_of_zero_it_lies():
    """Rounded to whole numbers, a paired ADR-minus-fixed interval of -12.1 to -0.3 read
    "[-12, -0]", and one of -9 to +0.4 read "[-9, 0]": the one thing an interval tells
    (does it hold 0?) was lost. Such a bound keeps its first significant digit."""

    def text(diff, low, high, digits=0):
        return stats.format_difference(stats.Difference(diff, low, high, 10, 10), digits)

    assert text(-6.2, -12.1, -0.3) == "-6 [-12, -0.3]"
    assert text(-4.6, -9.0, 0.4) == "-5 [-9, 0.4]"
    assert text(0.2, -0.4, 0.04) == "+0.2 [-0.4, 0.04]"
    assert text(-5.0, -9.0, 0.0) == "-5 [-9, 0]" == text(-5.0, -9.0, -0.0)  # 0 itself
    assert text(1.0, 0.001, 2.0, digits=2) == "+1.00 [0.001, 2.00]"
    assert text(0.6, -1.2, 2.4) == "+1 [-1, 2]"  # nothing near 0: as before
    # an IQM too ("-0 [-1, -0]" for a puck's returns over seeds)
    small = stats.Summary(-0.3, -0.3, -0.6, -0.1, 5, 0)
    assert stats.format_iqm(small) == "-0.3 [-1, -0.1]"


def test_difference_is_welchs_t_interval_and_holds_its_level_at_three_seeds():
    a, b = [1.0, 4.0, 2.0, 8.0], [3.0, 3.5, 2.0]
    welch = scipy_stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    d = stats.difference(a, b)
    assert (d.ci_low, d.ci_high) == pytest.approx((welch.low, welch.high))
    paired = scipy_stats.ttest_rel(a[:3], b).confidence_interval(0.9)
    d = stats.difference(a[:3], b, paired=True, confidence=0.9)
    assert (d.ci_low, d.ci_high) == pytest.approx((paired.low, paired.high))
    # 3 vs 3 seeds with no true difference: a percentile bootstrap covered ~80%
    rng = np.random.default_rng(1)
    covered = [stats.difference(rng.normal(0, 1, 3), rng.normal(0, 2, 3)) for _ in range(400)]
    hits = sum(d.ci_low <= 0 <= d.ci_high for d in covered)
    assert 0.92 <= hits / 400 <= 0.995
    # no spread on either side (every seed at a capped return): the point itself
    capped = stats.difference([500.0, 500.0, 500.0], [500.0, 500.0])
    assert (capped.diff, capped.ci_low, capped.ci_high) == (0.0, 0.0, 0.0)
    one_sided = stats.difference([500.0, 500.0, 500.0], [400.0, 460.0, 490.0])
    assert one_sided.ci_low < 50 < one_sided.ci_high


def test_difference_edge_cases():
    # one seed says nothing about the spread: no interval, so no "A beats B"
    one = stats.difference([4.0], [1.0, 2.0, 3.0])
    assert one.diff == 2.0 and np.isnan(one.ci_low) and np.isnan(one.ci_high)
    assert stats.format_difference(one) == "+2 [no CI: 1 vs 3 seeds]"
    dropped = stats.difference([1.0, np.nan, 3.0], [0.0, 0.0])
    assert (dropped.diff, dropped.n_a) == (2.0, 2)
    assert np.isnan(stats.difference([np.nan], [1.0]).diff)
    with pytest.raises(ValueError, match="num_seeds"):
        stats.difference(np.zeros((2, 2)), [1.0])
    with pytest.raises(ValueError, match="confidence"):
        stats.difference([1.0], [1.0], confidence=1.5)


def test_paired_difference_cancels_the_seed_effect_both_share():
    # Each seed's two variants share its luck (sd 50); B adds 5 with noise sd 2.
    # Paired, the interval is about the noise and excludes 0; unpaired, the seed
    # effect swamps it. Paired coverage of the true +5 stays near 95%.
    rng = np.random.default_rng(3)
    hits, paired_widths, unpaired_widths = 0, [], []
    for _ in range(200):
        luck = rng.normal(0, 50, 10)
        a, b = luck + 5 + rng.normal(0, 2, 10), luck + rng.normal(0, 2, 10)
        d = stats.difference(a, b, paired=True)
        u = stats.difference(a, b)
        hits += d.ci_low <= 5.0 <= d.ci_high
        paired_widths.append(d.ci_high - d.ci_low)
        unpaired_widths.append(u.ci_high - u.ci_low)
        assert d.paired and not u.paired and d.diff == pytest.approx(u.diff)
    assert 0.85 <= hits / 200 <= 0.995
    assert np.median(paired_widths) < 0.1 * np.median(unpaired_widths)


def test_paired_difference_drops_pairs_and_says_so():
    d = stats.difference([1.0, np.nan, 3.0, 5.0], [0.0, 0.0, np.inf, 1.0], paired=True)
    assert (d.diff, d.n_a, d.n_b, d.dropped) == (2.5, 2, 2, 2)
    assert stats.format_difference(d).endswith("(2 non-finite left out)")
    unpaired = stats.difference([1.0, np.nan, 3.0], [0.0, 0.0])
    assert unpaired.dropped == 1 and stats.format_difference(unpaired).endswith(
        "(1 non-finite left out)"
    )
    assert "NaN" not in stats.format_difference(stats.difference([1.0, 2.0], [0.0, 1.0]))
    with pytest.raises(ValueError, match="seed i of a with seed i of b: a has 3 seeds, b 2"):
        stats.difference([1.0, 2.0, 3.0], [1.0, 2.0], paired=True)


def test_equivalence_is_two_one_sided_tests_at_their_level():
    """`equivalent` claims equal means within a margin only when the 90% interval lies
    inside it: for truly equal normal scores it holds at about the rate TOST promises,
    and for a true gap at the margin it claims equality at most about 5% of the time."""
    rng = np.random.default_rng(0)
    claims = {0.0: 0, 1.5: 0}
    for gap in claims:
        for _ in range(400):
            a, b = rng.normal(gap, 1.0, 10), rng.normal(0.0, 1.0, 10)
            verdict, d = stats.equivalent(a, b, margin=1.5)
            low, high = scipy_stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.9)
            assert np.isclose(d.ci_low, low) and np.isclose(d.ci_high, high)
            claims[gap] += verdict
    assert claims[1.5] / 400 <= 0.08  # a gap at the margin: TOST's 5% error (at most)
    # equal scores, 10 seeds a side, a margin of 3.4 sd of the difference
    assert claims[0.0] / 400 > 0.7
    # a wide interval holding 0 is "not shown", not "equal"; fewer than 2 seeds: None
    wide = [0.0, 600.0, -600.0]
    assert stats.difference(wide, wide).ci_low < 0 < stats.difference(wide, wide).ci_high
    assert stats.equivalent(wide, wide, margin=50.0)[0] is False
    assert stats.equivalent([1.0], [1.0, 2.0], margin=50.0)[0] is None
    assert stats.equivalent([1.0, 1.1, 0.9], [1.0, 0.95, 1.05], margin=0.5, paired=True)[0]
    for margin in (0.0, -1.0, float("nan"), "1"):
        with pytest.raises(ValueError, match="margin must be a finite number > 0"):
            stats.equivalent([1.0, 2.0], [1.0, 2.0], margin=margin)
    with pytest.raises(ValueError, match="confidence must be above 0.5"):
        stats.equivalent([1.0, 2.0], [1.0, 2.0], margin=1.0, confidence=0.4)
