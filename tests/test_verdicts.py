"""Golden checks of attnrepro.verdicts against scipy and against simulation."""
import math

import numpy as np
import pytest
from scipy import stats

from attnrepro.verdicts import (arm, contrast, difference, gap_fraction, greater, pack_correct, paired_difference,
                                pooled_sd, provided, reported, unpack_correct, untestable, within)


@pytest.mark.parametrize("seed", range(5))
def test_difference_is_welch_t_interval(seed):
    rng = np.random.default_rng(seed)
    x, y = rng.normal(40, 1.5, size=3 + seed), rng.normal(38, 0.7, size=4)
    ci = stats.ttest_ind(x, y, equal_var=False).confidence_interval(0.95)
    d = difference(arm(x, "x"), arm(y, "y"))
    assert d.ci_low == pytest.approx(ci.low, abs=1e-9) and d.ci_high == pytest.approx(ci.high, abs=1e-9)


def test_test_set_noise_adds_binomial_variance():
    a, b = arm([40.0, 41.0, 42.0], "a", n_test=2000), arm([30.0, 31.0, 32.0], "b", n_test=2000)
    e = difference(a, b)
    seed_var = 1.0 / 3 + 1.0 / 3                                   # sample variance 1 over 3 seeds, each arm
    test_var = 1e4 * (0.41 * 0.59 + 0.31 * 0.69) / 2000           # not divided by the seeds: one test set
    assert e.se == pytest.approx(math.sqrt(seed_var + test_var), rel=1e-12)
    df = (seed_var + test_var) ** 2 / ((1 / 3) ** 2 / 2 * 2)      # Welch-Satterthwaite, test terms with infinite df
    assert e.df == pytest.approx(df, rel=1e-12)
    assert e.ci_high - e.effect == pytest.approx(stats.t.ppf(0.975, df) * e.se, rel=1e-12)


def test_gap_fraction_interval_is_the_inverted_contrast_test():
    base, method, target = (arm(v, n, n_test=10000) for v, n in
                            (([30.0, 31.2, 29.9], "scratch"), ([36.0, 37.1, 35.4], "copy"), ([40.2, 41.0, 39.6], "ft")))
    v = gap_fraction(base, method, target, 0.5)
    f = v.effect
    df = contrast([(1, method), (-1, base), (-f, target), (f, base)]).df
    t = stats.t.ppf(0.975, df)
    grid = np.linspace(-0.5, 1.5, 20001)
    inside = [r for r in grid if abs((e := contrast([(1, method), (-1, base), (-r, target), (r, base)])).effect) <= t * e.se]
    assert v.ci_low == pytest.approx(min(inside), abs=2e-4) and v.ci_high == pytest.approx(max(inside), abs=2e-4)


def test_smallest_detectable_effect_has_80_percent_power():
    """Simulate 3-seed arms whose true difference equals the design's mde: about 80 % of the intervals exclude 0."""
    rng = np.random.default_rng(0)
    sd, n = 1.0, 3
    design = difference(arm(rng.normal(0, sd, n)), arm(rng.normal(0, sd, n)))
    mde = (stats.t.ppf(0.975, 2 * n - 2) + stats.t.ppf(0.8, 2 * n - 2)) * sd * math.sqrt(2 / n)
    hits = 0
    for _ in range(3000):
        e = difference(arm(rng.normal(mde, sd, n)), arm(rng.normal(0, sd, n)))
        hits += e.ci_low > 0
    assert 0.70 < hits / 3000 < 0.85   # Welch's df is below 2n-2 on average, so power is a little under 80 %
    assert design.mde > 0


def test_verdict_words_follow_the_interval():
    assert greater(difference(reported(85.7), reported(83.0))).verdict == "holds"
    assert within(difference(arm([1.0, 1.1, 0.9]), arm([1.05, 0.95, 1.0])), 0.5).verdict == "holds"
    sd, df = pooled_sd([arm([1.0, 2.0]), arm([3.0, 5.0])])
    assert df == 2 and sd == pytest.approx(math.sqrt((0.5 + 2.0) / 2))


def test_paired_difference_against_a_paired_t_on_one_seed_each():
    """One seed per arm with no seed noise (sd 0): the interval is the paired t (normal) interval of the per-image
    difference, as scipy computes it; the unpaired binomial interval is much wider on correlated models."""
    rng = np.random.default_rng(3)
    both = rng.random(5000) < 0.5
    a_hits, b_hits = both | (rng.random(5000) < 0.04), both & (rng.random(5000) > 0.02)
    a = arm([100 * a_hits.mean()], "a", sd_seed=0.0)
    b = arm([100 * b_hits.mean()], "b", sd_seed=0.0)
    est = paired_difference(a, b, [pack_correct(a_hits)], [b_hits])
    d = 100 * (a_hits.astype(float) - b_hits)
    assert est.effect == pytest.approx(d.mean())
    assert est.se == pytest.approx(stats.sem(d))
    assert math.isinf(est.df) and est.ci_low == pytest.approx(d.mean() - 1.959964 * stats.sem(d), rel=1e-5)
    unpaired = difference(arm(a.values, n_test=5000, sd_seed=0.0), arm(b.values, n_test=5000, sd_seed=0.0))
    assert est.se < unpaired.se / 2


def test_paired_difference_errors_and_packing():
    h = np.array([True, False, True, True, False, False, True, False, True])
    assert (unpack_correct(pack_correct(h)) == h).all() and pack_correct(h).startswith("9:")
    assert (unpack_correct(pack_correct([1, 0, 1])) == [True, False, True]).all()
    with pytest.raises(ValueError, match="0/1"):
        pack_correct([0, 2])
    with pytest.raises(ValueError, match="not a pack_correct string"):
        unpack_correct("garbage")
    a, b = arm([100 * h.mean()], "a", sd_seed=0.0), arm([50.0], "b", sd_seed=0.0)
    with pytest.raises(ValueError, match="same test set"):
        paired_difference(a, b, [h], [np.ones(4, bool)])
    with pytest.raises(ValueError, match="do not match"):
        paired_difference(a, arm([10.0], "b", sd_seed=0.0), [h], [h])


def _correlated_hits(rng, n_img, rates, seeds=3):
    "Per-seed hit arrays of models that share most of their errors (a common easy set plus their own extra hits)."
    easy = rng.random(n_img) < 0.4
    return [[easy | (rng.random(n_img) < r) for _ in range(seeds)] for r in rates]


def test_arms_with_hits_pair_every_contrast():
    """Arms carrying per-image hits: `difference` equals `paired_difference`; a 4-term contrast's test variance is the
    variance of its per-image values over N (computed here by hand); an arm without hits falls back to binomial."""
    rng = np.random.default_rng(7)
    H = _correlated_hits(rng, 8000, (0.02, 0.06, 0.10))
    sc, cp, ft = (arm([100 * h.mean() for h in hs], n, hits=hs) for hs, n in zip(H, ("scratch", "copy", "ft")))
    d = difference(cp, sc)
    p = paired_difference(arm(cp.values, "copy"), arm(sc.values, "scratch"), H[1], H[0])
    assert d.effect == pytest.approx(p.effect) and d.se == pytest.approx(p.se, rel=1e-12) and d.df == pytest.approx(p.df)
    r = 0.4
    e = contrast([(1, cp), (-1, sc), (-r, ft), (r, sc)])
    per_img = 100 * (np.mean(H[1], 0) - np.mean(H[0], 0) - r * (np.mean(H[2], 0) - np.mean(H[0], 0)))
    seed_var = np.var(cp.values, ddof=1) / 3 + r * r * np.var(ft.values, ddof=1) / 3 + (1 - r) ** 2 * np.var(sc.values, ddof=1) / 3
    assert e.se ** 2 == pytest.approx(seed_var + np.var(per_img, ddof=1) / 8000, rel=1e-12)
    unpaired = difference(arm(cp.values, n_test=8000), arm(sc.values, n_test=8000))
    assert d.se < unpaired.se and difference(cp, arm(sc.values, n_test=8000)).se == pytest.approx(unpaired.se)
    assert "paired on test n=8000" in d.n and "paired" not in unpaired.n


def test_paired_gap_fraction_is_the_inverted_paired_contrast():
    "Fieller's interval with paired arms: at each end the paired contrast (copy - scratch) - r (ft - scratch) sits at t * se."
    rng = np.random.default_rng(11)
    H = _correlated_hits(rng, 10000, (0.02, 0.07, 0.10))
    sc, cp, ft = (arm([100 * h.mean() for h in hs], n, hits=[pack_correct(x) for x in hs])
                  for hs, n in zip(H, ("scratch", "copy", "ft")))
    v = gap_fraction(sc, cp, ft, 0.5)
    t = stats.t.ppf(0.975, contrast([(1, cp), (-1, sc), (-v.effect, ft), (v.effect, sc)]).df)
    for r in (v.ci_low, v.ci_high):
        e = contrast([(1, cp), (-1, sc), (-r, ft), (r, sc)])
        assert abs(e.effect) == pytest.approx(t * e.se, rel=1e-6)
    # pairing narrows the ratio's interval against the same arms scored as independent test sets
    u = gap_fraction(*(arm(a.values, a.name, n_test=10000) for a in (sc, cp, ft)), 0.5)
    assert v.ci_high - v.ci_low < u.ci_high - u.ci_low and "paired" in v.n


def test_arm_hits_are_validated():
    h = [np.array([1, 0, 1, 1], bool), np.array([0, 0, 1, 1], bool)]
    with pytest.raises(ValueError, match="do not match"):
        arm([50.0, 75.0], "x", hits=h)
    with pytest.raises(ValueError, match="n_test=5"):
        arm([75.0, 50.0], "x", n_test=5, hits=h)
    with pytest.raises(ValueError, match="one length"):
        arm([75.0, 50.0], "x", hits=[h[0], h[1][:3]])
    assert arm([75.0, 50.0], "x", hits=h).n_test == 4


def test_provided_makes_a_claim_untestable_when_its_premise_fails():
    ft_beats = greater(difference(arm([40.0, 41.0, 40.5]), arm([30.0, 30.5, 31.0])))
    premise_fails = greater(difference(arm([2.65, 2.70, 2.60]), arm([2.80, 2.75, 2.85])))   # fine-tune below scratch
    claim = greater(difference(arm([5.0, 5.2, 5.1]), arm([3.0, 3.1, 2.9])))
    assert provided([ft_beats], claim) is claim
    v = provided([ft_beats, premise_fails], claim)
    assert v.verdict == "untestable" and "precondition not met" in v.statement and claim.statement in v.statement
    assert provided([untestable("no runs")], claim).verdict == "untestable"


# --- issue #45: inert arms and preconditions, directly ------------------------------------------------------------

def _seed_runs(rng, base, flip, seeds=3):
    """Per-image hits of `seeds` runs: each the shared `base` (what every run of the task gets right) with a share
    `flip` of its images redrawn at random (what one seed changes)."""
    out = []
    for _ in range(seeds):
        h = base.copy()
        m = rng.random(base.size) < flip
        h[m] = rng.random(m.sum()) < base.mean()
        out.append(h)
    return out


def _hit_arm(runs, name):
    return arm([100 * h.mean() for h in runs], name, hits=[pack_correct(h) for h in runs])


def test_arms_differ_flags_an_inert_pair_and_passes_a_differing_one():
    from attnrepro.verdicts import INERT_FIX, arm_agreement, arms_differ
    rng = np.random.default_rng(45)
    base = rng.random(4000) < 0.6
    a = _hit_arm(_seed_runs(rng, base, 0.4), "baseline")
    # an inert arm: the same process as the baseline (its seeds agree with the baseline's as often as among themselves)
    b = _hit_arm(_seed_runs(rng, base, 0.4), "weak term")
    ag = arm_agreement(a, b)
    assert ag.between >= ag.within - ag.tolerance and ag.inert is True
    v = arms_differ(a, b)
    assert v.verdict == "untestable" and v.statement.startswith("inert: baseline vs weak term")
    assert f"{ag.within:.1f} % between two seeds of one arm" in v.statement and INERT_FIX in v.statement
    # an arm that agrees with the baseline MORE than one arm with itself is inert too
    c = _hit_arm([h.copy() for h in a.hits.astype(bool)], "copy")
    assert arms_differ(a, c).verdict == "untestable"
    # a differing arm: a different set of images right (its own base), agreeing far less across arms than within
    other = rng.random(4000) < 0.6
    d = _hit_arm(_seed_runs(rng, other, 0.4), "strong term")
    ag = arm_agreement(a, d)
    assert ag.between < ag.within - ag.tolerance and ag.inert is False
    v = arms_differ(a, d)
    assert v.verdict == "holds" and v.statement.startswith("arms differ: baseline vs strong term")
    # the fix named is the caller's
    assert "a longer schedule only" in arms_differ(a, b, fix="a longer schedule only").statement
    # without per-image hits only identical scores are caught
    assert arms_differ(arm([50.0, 51.0]), arm([50.0, 51.0])).verdict == "untestable"
    assert "not checked per image" in arms_differ(arm([50.0, 51.0]), arm([50.5, 51.0])).statement


def test_provided_turns_a_failed_precondition_into_untestable_naming_it():
    from attnrepro.verdicts import Verdict, at_least, floors, gate
    claim = greater(difference(arm([60.0, 61.0, 60.5]), arm([50.0, 50.5, 49.5])))
    assert claim.verdict == "holds"
    low = at_least(28.57, 40, "plain CE top-1 in the strong regime")
    assert low.verdict == "untestable" and low.statement == "plain CE top-1 in the strong regime 28.57 is below its floor 40"
    v = provided([at_least(55.0, 40, "scratch top-1"), low], claim)
    assert v.verdict == "untestable"
    assert v.statement.startswith("precondition not met (plain CE top-1 in the strong regime 28.57 is below its floor 40 "
                                  "-> untestable)")
    assert "scratch top-1" not in v.statement.split("; the comparison")[0]   # a met precondition is not blamed
    assert claim.statement in v.statement and math.isnan(v.effect)
    assert provided([at_least(55.0, 40, "scratch top-1"), gate(True, "teacher")], claim) is claim
    g = provided([gate(False, "teacher k-NN 7.01 < 10")], claim)
    assert g.verdict == "untestable" and "teacher k-NN 7.01 < 10: gate not passed" in g.statement
    # floors: one floor, or a floor per dataset label ('CIFAR-10 5 %' is CIFAR-10's; CIFAR-100 is not)
    arms_ = {"CIFAR-10 5 %": arm([48.65], "scratch"), "CIFAR-100 (proxy)": arm([9.0, 9.5], "scratch")}
    f = floors(arms_, {"CIFAR-10": 40})
    assert [p.statement for p in f] == ["scratch top-1 on CIFAR-10 5 % (1 seed) 48.65 meets its floor 40"]
    assert [p.verdict for p in floors(arms_, 40)] == ["holds", "untestable"] and floors(arms_, None) == []
    assert isinstance(f[0], Verdict)


def test_paper_run_claim_applies_preconditions(tmp_path):
    from attnrepro.report import PaperRun
    from attnrepro.verdicts import at_least
    pr = PaperRun("aal", "smoke", tmp_path)
    claim = greater(difference(arm([60.0, 61.0, 60.5]), arm([50.0, 50.5, 49.5])))
    pr.pre = [at_least(55.0, 40, "scratch top-1")]
    assert pr.claim("1", "A beats B", claim, "numbers").verdict == "holds"
    assert pr.claims[-1]["evidence"].endswith("; precondition met: scratch top-1 55.00 meets its floor 40; numbers")
    v = pr.claim("2", "A beats B", claim, "numbers", pre=[at_least(30.0, 40, "scratch top-1")])
    assert v.verdict == "untestable" and "scratch top-1 30.00 is below its floor 40" in pr.claims[-1]["evidence"]
    pr.pre = []
    assert pr.claim("3", "A beats B", claim).verdict == "holds" and "precondition" not in pr.claims[-1]["evidence"]


@pytest.mark.parametrize("seed", range(4))
def test_arms_of_the_same_seeds_are_blocked_by_seed_as_scipy_ttest_rel(seed):
    rng = np.random.default_rng(seed)
    shared = rng.normal(0, 3, size=3 + seed)           # what a seed's data and initialisation do to both arms
    x, y = 40 + shared + rng.normal(0, 0.3, shared.size), 38 + shared + rng.normal(0, 0.3, shared.size)
    seeds = list(range(10, 10 + shared.size))
    ci = stats.ttest_rel(x, y).confidence_interval(0.95)
    d = difference(arm(x, "x", seeds=seeds), arm(y, "y", seeds=seeds))
    assert d.ci_low == pytest.approx(ci.low, abs=1e-9) and d.ci_high == pytest.approx(ci.high, abs=1e-9)
    assert d.df == shared.size - 1 and "blocked by seed" in d.n
    # unblocked (no seeds named), the shared seed effect stays in both arms' spread: a wider interval
    assert difference(arm(x, "x"), arm(y, "y")).half_width > d.half_width


def test_blocking_needs_the_same_seeds_and_own_spread():
    a, b = arm([40.0, 42.0, 41.0], "a", seeds=[0, 1, 2]), arm([38.0, 40.5, 39.0], "b", seeds=[3, 4, 5])
    assert "blocked" not in difference(a, b).n                      # other seeds: independent arms (Welch)
    lone = arm([39.0], "lone", sd_seed=1.0, sd_df=4, seeds=[0])
    assert "blocked" not in difference(a, lone).n                  # a borrowed spread cannot be blocked
    # a three-arm contrast: the per-seed contrast's spread, scratch counted once
    s = arm([30.0, 31.0, 29.0], "s", seeds=[0, 1, 2])
    b0 = arm([38.0, 40.5, 39.0], "b", seeds=[0, 1, 2])
    e = contrast([(1, a), (-0.5, s), (-0.5, b0)], "a - mean(s, b)")
    per_seed = np.array([40 - 34, 42 - 35.75, 41 - 34.0])
    assert e.effect == pytest.approx(per_seed.mean()) and e.se == pytest.approx(per_seed.std(ddof=1) / math.sqrt(3))
    with pytest.raises(ValueError, match="seeds"):
        arm([1.0, 2.0], "twice", seeds=[0, 0])
    with pytest.raises(ValueError, match="seeds"):
        arm([1.0, 2.0], "short", seeds=[0])


def test_gap_fraction_of_arms_of_the_same_seeds_is_blocked_by_seed():
    # every seed moves all three arms alike: blocked, the fraction is exactly 0.5; unblocked, the seed spread hides it
    seeds = [0, 1, 2]
    base, method, target = ([v + s for s in (0.0, 10.0, 20.0)] for v in (10.0, 15.0, 20.0))
    v = gap_fraction(arm(base, "s", seeds=seeds), arm(method, "m", seeds=seeds), arm(target, "t", seeds=seeds), 0.4)
    assert v.verdict == "holds" and v.ci_low == pytest.approx(0.5) and v.ci_high == pytest.approx(0.5)
    assert "blocked by seed" in v.n
    u = gap_fraction(arm(base, "s"), arm(method, "m"), arm(target, "t"), 0.4)
    assert u.verdict == "inconclusive" and "blocked" not in u.n
