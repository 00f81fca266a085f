"""Every attndistill claim function on the paper's own printed numbers (Table 10 of the supplement): each must
hold there, and contradicting numbers must not."""
import pytest

from attnrepro.attndistill import (CLAIM_TEXTS, claim_gain_across_shapes, claim_gain_over_feature_regression,
                                   claim_kl_beats_alternatives, claim_projector_design)
from attnrepro.report import load_reported
from attnrepro.verdicts import arm, reported


@pytest.fixture(scope="module")
def t10():
    "Table 10 top-1 linear-probe accuracy by the row's line in the seed file."
    return load_reported("attndistill", "table10_ablation_full").set_index("seed_line").top1_lp


def row(t10, line):
    return reported(t10[line], f"line {line}")


def test_every_claim_has_a_text():
    assert set(CLAIM_TEXTS) == {"1", "2", "3", "4"}


def test_claim_1_gain_over_feature_regression(t10):
    # Figure 6 plots the main paper's Table 2 (k-NN and probe), which the seed lacks: only the probe gain is in the
    # supplement (Table 10-a, teacher's heads: PA line 129, AttnDistill line 131), so the k-NN parts are not tested here.
    assert claim_gain_over_feature_regression(row(t10, 129), row(t10, 131)).verdict == "holds"
    assert claim_gain_over_feature_regression(row(t10, 131), row(t10, 129)).verdict == "does not hold"


def test_claim_1_knn_parts_need_a_larger_knn_gain():
    lp_pa, lp_ad = reported(70.0), reported(72.0)
    assert claim_gain_over_feature_regression(lp_pa, lp_ad, reported(60.0), reported(64.0)).verdict == "holds"
    # k-NN improves, but less than the probe: the LP-to-k-NN drop grows
    assert claim_gain_over_feature_regression(lp_pa, lp_ad, reported(60.0), reported(61.0)).verdict == "does not hold"
    with pytest.raises(ValueError, match="both k-NN arms"):
        claim_gain_over_feature_regression(lp_pa, lp_ad, reported(60.0))


def test_claim_2_gain_across_shapes(t10):
    pairs = {"fewer heads": (127, 128), "teacher's heads": (129, 131), "patch 28 (interp)": (132, 133),
             "half grid (interp)": (134, 135), "2/3 depth": (136, 137), "combo": (138, 139)}
    v = claim_gain_across_shapes({k: (row(t10, a), row(t10, b)) for k, (a, b) in pairs.items()})
    assert v.verdict == "holds", v
    # one shape where AttnDistill falls below PA sinks the claim
    bad = {**{k: (row(t10, a), row(t10, b)) for k, (a, b) in pairs.items()}, "combo": (row(t10, 139), row(t10, 138))}
    assert claim_gain_across_shapes(bad).verdict == "does not hold"


def test_claim_2_same_run_is_untestable():
    pa = arm([4.0, 4.2], "pa", n_test=10000)
    assert claim_gain_across_shapes({"base": (pa, pa)}).verdict == "untestable"


def test_claim_3_kl_beats_alternatives(t10):
    # KL = line 141 (the (b) AttnDistill row); line 172 is 'weight by V' (its attribution to V or to MSE is uncertain
    # in the extraction); the MSE row's number is lost in the extraction, so MSE is not tested on the paper's numbers.
    assert claim_kl_beats_alternatives(row(t10, 141), {"weight by V": row(t10, 172)}).verdict == "holds"
    assert claim_kl_beats_alternatives(row(t10, 172), {"weight by V": row(t10, 141)}).verdict == "does not hold"


def test_claim_4_projector_design(t10):
    # Table 10-d: P8 line 152 (layer 0 only), P1 lines 153-154, P2 lines 155-157, P4 lines 158-162 (layers 0..n)
    lp = {8: {0: row(t10, 152)}, 1: {j: row(t10, 153 + j) for j in range(2)},
          2: {j: row(t10, 155 + j) for j in range(3)}, 4: {j: row(t10, 158 + j) for j in range(5)}}
    assert claim_projector_design(lp).verdict == "holds"
    # the old claim ("layer 0 is the best in every projector") fails on the paper's own P2 (76.5 at layer 2 > 76.4)
    assert claim_projector_design(lp, margin=0.0).verdict == "does not hold"
    # a projector depth that beats P4 at layer 0 contradicts "4 layers is best"
    assert claim_projector_design({**lp, 8: {0: reported(78.5)}}).verdict == "does not hold"


def test_one_seed_noise_makes_small_differences_inconclusive():
    noise = dict(n_test=10000, sd_seed=0.2, sd_df=2)
    v = claim_kl_beats_alternatives(arm([3.66], "kl", **noise), {"MSE": arm([3.58], "mse", **noise)})
    assert v.verdict == "inconclusive" and v.ci_low < 0 < v.ci_high
