"""The claim functions of attnrepro.bootstrapping, run on the paper's own printed numbers (each must hold there) and
on inputs that contradict them. The reported tables are single numbers without seeds or spreads, so `reported(...)`
takes them as exact: these tests check the claims' logic and margins, not the paper's noise."""
import numpy as np
import pandas as pd
import pytest

from attnrepro.papers.bootstrapping_vit import (CLAIM_TEXTS, NO_SPREAD, beats, claim_both_terms_help, claim_decay_helps,
                                                claim_feat_beats_kd, claim_gain_larger_when_scarce,
                                                claim_joint_beats_sam_sparse, claim_joint_lifts_vit,
                                                claim_reslike_beats_base, claim_sequence_beats_avgpool,
                                                claim_sharing_costs_little, claim_vit_above_agent)
from attnrepro.report import load_reported
from attnrepro.runner import output_dir
from attnrepro.verdicts import VERDICTS, arm, contrast, greater, pooled_sd, reported

PAPER = "bootstrapping_vit"


def table1(size: str = "S", mk=reported) -> dict:
    "Table 1 as {row: {dataset: Arm}} for one ViT size (rows: scratch, sam, sparse, joint, agent, shared)."
    t = load_reported(PAPER, "table1_cifar")
    rows = dict(scratch=("ViTs", f"ViT-{size}"), sam=("ViTs", f"ViT-{size}-SAM"), sparse=("ViTs", f"ViT-{size}-Sparse"),
                joint=("Ours Joint", f"ViT-{size}"), agent=("Ours Joint", f"Agent-{size}"),
                shared=("Ours Shared", f"ViT-{size}"))
    out = {}
    for k, (group, model) in rows.items():
        sel = t[(t["group"] == group) & (t["model"] == model) & (t["dagger"] == 0)]
        assert len(sel) == 2, (k, sel)
        out[k] = {r["dataset"]: mk(r["top1"], k) for _, r in sel.iterrows()}
    return out


def table4(mk=reported) -> dict:
    t = load_reported(PAPER, "table4_loss_ablation")
    return {(r["setting"], r["feat"]): mk(r["top1"], f"{r['setting']} {r['feat']}") for _, r in t.iterrows()}


def table3(method: str, mk=reported) -> dict:
    t = load_reported(PAPER, "table3_imagenet_subsets")
    return {int(r["fraction"]): mk(r["top1"], f"{method} {r['fraction']} %") for _, r in t[t["method"] == method].iterrows()}


def table5(mk=reported) -> dict:
    t = load_reported(PAPER, "table5_agent_arch").set_index(["agent_arch", "model"])["top1"]
    return {k: mk(v, " ".join(k)) for k, v in t.items()}


def claim_inputs(mk=reported) -> dict:
    """Every claim of CLAIM_TEXTS -> (its function, its arguments) built from the paper's printed rows (ViT-S where the
    claim names it; Table 3's ViT-B and Ours-Joint for claim 5), each row made by `mk(value, name)`."""
    t1, t4, t5 = table1("S", mk), table4(mk), table5(mk)
    return {
        "1a": (claim_joint_lifts_vit, (t1["scratch"], t1["joint"])),
        "1b": (claim_joint_beats_sam_sparse, (t1["joint"], t1["sam"], t1["sparse"])),
        "1c": (claim_vit_above_agent, (t1["joint"], t1["agent"])),
        "2": (claim_sharing_costs_little, (t1["shared"], t1["joint"], t1["scratch"])),
        "3a": (claim_both_terms_help, (t4[("Baseline", "none")], t4[("KD Only", "none")], t4[("Feat Only", "default")],
                                       t4[("Both", "default")])),
        "3b": (claim_feat_beats_kd, (t4[("Feat Only", "default")], t4[("KD Only", "none")])),
        "3c": (claim_decay_helps, (t4[("Both", "default")], t4[("Both", "No Decay")], t4[("Feat Only", "default")],
                                   t4[("Feat Only", "No Decay")])),
        "3d": (claim_sequence_beats_avgpool, (t4[("Feat Only", "default")], t4[("Feat Only", "AP-2D")])),
        "4": (claim_reslike_beats_base, (t5[("Res-like", "Agent-S")], t5[("Base", "Agent-S")],
                                         t5[("Res-like", "ViT-S-Joint")], t5[("Base", "ViT-S-Joint")])),
        "5": (claim_gain_larger_when_scarce, (table3("ViT-B", mk), table3("Ours-Joint", mk))),
    }


# Claims the paper's printed numbers cannot decide, id -> the reason. None at present: every claim compares rows the
# paper prints. A claim added to CLAIM_TEXTS must appear in claim_inputs or here.
UNTESTABLE_ON_REPORTED: dict[str, str] = {}


# ---------------------------------------------------------------- every claim holds on the paper's numbers
@pytest.mark.parametrize("cid", list(CLAIM_TEXTS))
def test_every_claim_holds_on_the_papers_own_numbers(cid):
    "A claim the paper's own tables contradict is a wrong check (the paper's numbers exactly, via reported)."
    inputs = claim_inputs()
    assert not set(inputs) & set(UNTESTABLE_ON_REPORTED)
    if cid in UNTESTABLE_ON_REPORTED:
        assert len(UNTESTABLE_ON_REPORTED[cid]) > 20, f"claim {cid}: say why the printed numbers cannot decide it"
        return
    assert cid in inputs, (f"claim {cid} ({CLAIM_TEXTS[cid]!r}) is not checked on the paper's numbers: add it to "
                           "claim_inputs, or to UNTESTABLE_ON_REPORTED with the reason")
    fn, args = inputs[cid]
    v = fn(*args)
    assert v.verdict == "holds", f"claim {cid} fails on the paper's own numbers: {v.statement}"
    assert "exact numbers" in v.n   # decided on the printed values, no noise model


def test_inputs_cover_exactly_the_claims():
    assert set(claim_inputs()) | set(UNTESTABLE_ON_REPORTED) == set(CLAIM_TEXTS)


def test_claims_1_2_hold_on_table1_vit_s():
    t = table1("S")
    assert claim_joint_lifts_vit(t["scratch"], t["joint"]).verdict == "holds"           # +7.82, +14.94 > 5
    assert claim_joint_beats_sam_sparse(t["joint"], t["sam"], t["sparse"]).verdict == "holds"
    assert claim_vit_above_agent(t["joint"], t["agent"]).verdict == "holds"             # 95.14 > 94.90, 76.19 > 74.06
    assert claim_sharing_costs_little(t["shared"], t["joint"], t["scratch"]).verdict == "holds"  # -1.42, -0.69


def test_claims_1a_1b_also_hold_for_vit_b():
    t = table1("B")
    assert claim_joint_lifts_vit(t["scratch"], t["joint"]).verdict == "holds"
    assert claim_joint_beats_sam_sparse(t["joint"], t["sam"], t["sparse"]).verdict == "holds"


def test_paper_vit_b_contradicts_1c_and_2_so_they_are_stated_for_vit_s():
    t = table1("B")
    v = claim_vit_above_agent(t["joint"], t["agent"])       # CIFAR-10: ViT-B 95.00 < its agent 95.06
    assert v.verdict == "does not hold" and abs(v.effect - (95.00 - 95.06)) < 1e-9
    v = claim_sharing_costs_little(t["shared"], t["joint"], t["scratch"])   # CIFAR-100: 75.71 - 77.83 = -2.12
    assert v.verdict == "does not hold" and abs(v.effect - (75.71 - 77.83)) < 1e-9
    assert "ViT-S" in CLAIM_TEXTS["1c"] and "ViT-S" in CLAIM_TEXTS["2"]


def test_claims_3_hold_on_table4():
    t = table4()
    base, kd = t[("Baseline", "none")], t[("KD Only", "none")]
    feat, feat_c, feat_ap = t[("Feat Only", "default")], t[("Feat Only", "No Decay")], t[("Feat Only", "AP-2D")]
    both, both_c = t[("Both", "default")], t[("Both", "No Decay")]
    assert claim_both_terms_help(base, kd, feat, both).verdict == "holds"
    assert claim_feat_beats_kd(feat, kd).verdict == "holds"                   # 74.94 > 67.16
    assert claim_decay_helps(both, both_c, feat, feat_c).verdict == "holds"   # 76.19 > 75.15, 74.94 > 73.59
    assert claim_sequence_beats_avgpool(feat, feat_ap).verdict == "holds"     # 74.94 > 71.06


def test_claim_4_holds_on_table5():
    t = load_reported(PAPER, "table5_agent_arch").set_index(["agent_arch", "model"])["top1"]
    r = lambda a, m: reported(t[(a, m)], f"{a} {m}")
    v = claim_reslike_beats_base(r("Res-like", "Agent-S"), r("Base", "Agent-S"), r("Res-like", "ViT-S-Joint"),
                                 r("Base", "ViT-S-Joint"))
    assert v.verdict == "holds"


def test_claim_5_restated_holds_on_table3_and_the_old_statement_does_not():
    scratch, joint = table3("ViT-B"), table3("Ours-Joint")
    assert sorted(scratch) == sorted(joint) == [5, 10, 50]
    assert claim_gain_larger_when_scarce(scratch, joint).verdict == "holds"   # +19.41, +21.62 > +7.96 > 0
    # Sec. 4.2 says "the improvement of our method is prominent when data is extremely scarce": Shared too
    assert claim_gain_larger_when_scarce(scratch, table3("Ours-Shared")).verdict == "holds"   # +16.46, +17.64 > +3.08
    # the old claim "largest gain at the smallest fraction": gain at 5 % - gain at 10 % > 0 fails (19.41 < 21.62)
    old = greater(contrast([(1, joint[5]), (-1, scratch[5]), (-1, joint[10]), (1, scratch[10])], "gain 5 % - gain 10 %"))
    assert old.verdict == "does not hold" and abs(old.effect - (19.41 - 21.62)) < 1e-6
    # the printed gains are the differences of the printed accuracies
    gains = load_reported(PAPER, "table3_imagenet_subsets").query("method == 'Ours-Joint'").set_index("fraction")["top1_gain"]
    for f, g in gains.items():
        assert abs(joint[f].mean - scratch[f].mean - g) < 0.011


# ---------------------------------------------------------------- contradicting inputs and margins
def test_contradicting_inputs_do_not_hold():
    t = table1("S")
    assert claim_joint_lifts_vit(t["joint"], t["scratch"]).verdict == "does not hold"   # roles swapped
    feat, kd = reported(67.16, "feat"), reported(74.94, "kd")
    assert claim_feat_beats_kd(feat, kd).verdict == "does not hold"
    # claim 5: the gain grows with data (the mini's proxy runs point this way)
    scratch = {5: reported(30.0), 10: reported(40.0), 50: reported(60.0)}
    joint = {5: reported(31.0), 10: reported(42.0), 50: reported(70.0)}
    assert claim_gain_larger_when_scarce(scratch, joint).verdict == "does not hold"


def test_margins_are_tested_as_magnitudes():
    one = lambda v, n: {"CIFAR-10": reported(v, n)}
    assert claim_joint_lifts_vit(one(60.0, "scratch"), one(64.0, "joint")).verdict == "does not hold"   # +4 < 5
    assert claim_joint_lifts_vit(one(60.0, "scratch"), one(65.5, "joint")).verdict == "holds"
    assert claim_joint_lifts_vit(one(60.0, "scratch"), one(64.0, "joint"), margin=3).verdict == "holds"
    # below the margin, the statement says whether Joint lifts the ViT at all: +4 is a gain, -2 is not, the mini's
    # -1.82 over 3 seeds (its interval reaches 0) is undecided
    assert "at all, > 0: holds" in claim_joint_lifts_vit(one(60.0, "scratch"), one(64.0, "joint")).statement
    assert "at all, > 0: does not hold" in claim_joint_lifts_vit(one(60.0, "scratch"), one(58.0, "joint")).statement
    mini = lambda vals, n: {"CIFAR-10": arm(vals, n, n_test=10000)}
    v = claim_joint_lifts_vit(mini([54.58, 55.47, 55.27], "scratch"), mini([53.16, 52.55, 54.16], "joint"))
    assert v.verdict == "does not hold" and v.ci_high < 5 and v.ci_low < 0 < v.ci_high
    assert "at all, > 0: inconclusive" in v.statement
    assert "at all" not in claim_joint_lifts_vit(one(60.0, "scratch"), one(65.5, "joint")).statement   # it holds
    # "little cost" is one-sided: 2.5 below Joint fails, 3 above Joint is no cost
    assert claim_sharing_costs_little(one(72.5, "s"), one(75.0, "j"), one(60.0, "v")).verdict == "does not hold"
    assert claim_sharing_costs_little(one(78.0, "s"), one(75.0, "j"), one(60.0, "v")).verdict == "holds"
    # and Shared must still beat scratch
    assert claim_sharing_costs_little(one(74.0, "s"), one(75.0, "j"), one(74.5, "v")).verdict == "does not hold"


# ---------------------------------------------------------------- noise: seeds, borrowed spread, same run
def test_one_seed_without_spread_is_untestable():
    a, b = arm([3.86], "Feat only", n_test=10000), arm([6.17], "KD only", n_test=10000)
    v = claim_feat_beats_kd(a, b)
    assert v.verdict == "untestable" and NO_SPREAD in v.statement
    v = claim_joint_lifts_vit({"c10": arm([38.96], "scratch"), "c100": arm([5.70], "scratch")},
                              {"c10": arm([29.79], "Joint"), "c100": arm([3.94], "Joint")})
    assert v.verdict == "untestable" and NO_SPREAD in v.statement


def test_borrowed_spread_decides_and_small_gaps_are_inconclusive():
    kw = dict(n_test=10000, sd_seed=0.4, sd_df=8)
    assert claim_feat_beats_kd(arm([3.86], "feat", **kw), arm([6.17], "kd", **kw)).verdict == "does not hold"
    v = claim_sequence_beats_avgpool(arm([3.86], "seq", **kw), arm([3.98], "ap", **kw))
    assert v.verdict == "inconclusive" and v.ci_low < 0 < v.ci_high and v.mde > abs(v.effect)
    # multi-seed headline rows against a one-seed row that borrows their spread
    joint = {"c10": arm([45.1, 46.0, 45.5], "Joint", n_test=10000)}
    sam = {"c10": arm([40.0], "SAM", n_test=10000, sd_seed=0.5, sd_df=8)}
    sparse = {"c10": arm([45.4], "Sparse", n_test=10000, sd_seed=0.5, sd_df=8)}
    v = claim_joint_beats_sam_sparse(joint, sam, sparse)
    assert v.verdict == "inconclusive" and "Joint - SAM" in v.statement and "holds" in v.statement


# Every claim on the paper's own point values with different noise: the verdict follows the interval, never the sign
# of a one-seed difference (all these inputs favour every claim by sign).
one_seed = lambda v, n: arm([v], n, n_test=10000)
@pytest.mark.parametrize("cid", list(CLAIM_TEXTS))
@pytest.mark.parametrize("mk, expected", [
    (one_seed, "untestable"),                                                # one seed, spread unknown
    (lambda v, n: arm([v], n, sd_seed=0.02, sd_df=4), "holds"),              # borrowed spread far below every gap
    (lambda v, n: arm([v], n, sd_seed=25.0, sd_df=4), "inconclusive"),       # borrowed spread above every gap
    (lambda v, n: arm([v - 0.01, v, v + 0.01], n), "holds"),                 # three seeds, tight
    (lambda v, n: arm([v - 10, v, v + 10], n), "inconclusive"),              # three seeds, sd 10 points
], ids=["one-seed", "borrowed-small", "borrowed-large", "3-seeds-tight", "3-seeds-noisy"])
def test_verdicts_follow_the_interval_not_the_sign(cid, mk, expected):
    fn, args = claim_inputs(mk)[cid]
    v = fn(*args)
    assert v.verdict == expected, v.statement
    if expected == "untestable": assert NO_SPREAD in v.statement
    else: assert v.ci_low <= v.effect <= v.ci_high and v.ci_high > v.ci_low


def test_one_seed_rows_borrow_the_pooled_sd_of_the_headline_rows():
    "As the notebook does: headline rows over 3 seeds, SAM / Sparse and Table 3's rows run once with their pooled sd."
    head = {"scratch": arm([60.1, 60.9, 60.5], "scratch", n_test=10000), "joint": arm([70.2, 69.4, 70.0], "Joint", n_test=10000),
            "agent": arm([66.0, 66.3, 65.5], "agent", n_test=10000), "shared": arm([69.0, 69.8, 69.1], "Shared", n_test=10000)}
    sd, df = pooled_sd(head.values())
    assert df == 8 and abs(sd - np.sqrt(np.mean([np.var(a.values, ddof=1) for a in head.values()]))) < 1e-12
    lone = lambda v, n: arm([v], n, n_test=10000, sd_seed=sd, sd_df=df)
    # 1b: Joint over 3 seeds against one-seed rows that borrow the spread: decided by the interval
    v = claim_joint_beats_sam_sparse({"c": head["joint"]}, {"c": lone(63.0, "SAM")}, {"c": lone(62.0, "Sparse")})
    assert v.verdict == "holds" and "borrowed (df 8)" in v.statement
    v = claim_joint_beats_sam_sparse({"c": head["joint"]}, {"c": lone(69.6, "SAM")}, {"c": lone(62.0, "Sparse")})
    assert v.verdict == "inconclusive"    # +0.27 over SAM by sign, within the noise
    # without the borrowed spread the same one-seed rows are untestable, not decided by sign
    v = claim_joint_beats_sam_sparse({"c": head["joint"]}, {"c": one_seed(63.0, "SAM")}, {"c": one_seed(62.0, "Sparse")})
    assert v.verdict == "untestable"
    # 5: four one-seed rows per contrast share the one borrowed sd (its df counted once)
    sc = {5: lone(20.0, "s5"), 10: lone(30.0, "s10"), 50: lone(60.0, "s50")}
    jo = {5: lone(35.0, "j5"), 10: lone(47.0, "j10"), 50: lone(62.0, "j50")}
    v = claim_gain_larger_when_scarce(sc, jo)
    assert v.verdict == "holds"
    est = contrast([(1, jo[5]), (-1, sc[5]), (-1, jo[50]), (1, sc[50])])
    seed_var = 4 * sd ** 2   # one shared estimate: Welch-Satterthwaite counts its df once, not 4 x 8
    test_var = sum(p * (100 - p) / 10000 for p in (35.0, 20.0, 62.0, 60.0))
    assert abs(est.se ** 2 - seed_var - test_var) < 1e-9
    assert abs(est.df - (seed_var + test_var) ** 2 / (seed_var ** 2 / df)) < 1e-6
    jo[50] = lone(74.0, "j50")   # gain at 50 % +14: the 5 % gain (+15) no longer clearly exceeds it
    assert claim_gain_larger_when_scarce(sc, jo).verdict == "inconclusive"


def test_a_run_compared_with_itself_is_untestable():
    a = arm([4.0, 4.2, 4.1], "Joint", n_test=10000)
    assert beats(a, a).verdict == "untestable"
    assert claim_vit_above_agent({"c10": a}, {"c10": a}).verdict == "untestable"


# ---------------------------------------------------------------- the committed outputs use these claims
def test_committed_claims_are_the_library_claims():
    path = output_dir(PAPER, "mini") / "claims.csv"
    if not path.is_file(): pytest.skip("no committed mini claims")
    cl = pd.read_csv(path, dtype={"id": str})
    assert list(cl["id"]) == list(CLAIM_TEXTS) and list(cl["claim"]) == list(CLAIM_TEXTS.values())
    assert set(cl["verdict"]) <= set(VERDICTS)
