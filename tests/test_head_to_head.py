"""The head-to-head benchmark (issue 27): every profile row becomes a valid Experiment (one task, student and recipe),
the new experiment-layer pieces it needs (per-part teachers, the cls_attention extra, peak memory) work, and the
registry's supervised AttnDistill term trains."""
import pytest
import torch

from attnrepro import head_to_head as h2h
from attnrepro.experiment import RUN_FIELDS, Experiment, _spread_images, run_experiment
from attnrepro.methods import create_method, method_info
from attnrepro.models import create_student
from attnrepro.report import load_profile

SHAPE = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2)
COMMON = dict(dataset="cifar10-sample", per_class=5, train=dict(epochs=1, batch_size=25, lr=1e-3, warmup_epochs=0))
VIT = {"algorithm": "mae", "data": "cifar10-sample", "arch": SHAPE}


@pytest.mark.parametrize("profile", ["smoke", "mini", "paper"])
def test_every_row_is_one_experiment_of_one_recipe(profile):
    P = load_profile("head_to_head", profile)
    exps = [h2h.experiment(P, r, 0) for r in P["rows"]]
    assert len({str(e.to_config()) for e in exps}) == len(exps) == len(P["rows"])   # no two rows train the same run
    for e in exps:   # only the method, its teacher, options and (DeiT) the distillation token differ
        assert (e.dataset, e.per_class, e.train, e.augment) == (P["data"]["name"], P["data"]["per_class"],
                                                                P["recipe"]["train"], P["recipe"]["augment"])
        assert {k: v for k, v in e.student.items() if k != "arch"} == P["student"] and e.student["arch"] in ("vit", "deit")
        assert e.record_correct and "cls_attention" in e.extras and "$" not in str(e.options)
    assert {r["group"] for r in P["rows"]} == set(h2h.GROUPS)
    assert P["data"]["per_class"] in P["fractions"]["per_class"]   # the headline runs are the sweep's largest size
    if profile != "smoke": assert len(P["seeds"]) >= 3 and len(P["fractions"]["per_class"]) >= 3
    three_quarters = {r["name"]: e.options.get("layers") for r, e in zip(P["rows"], exps) if r["method"] == "attn_distill"}
    assert three_quarters["Attention Distillation (first 3/4)"] == list(range(max(1, 3 * P["student"]["depth"] // 4)))
    assert three_quarters["Attention Distillation (all blocks)"] == "all"   # the registry's default is the paper's 3/4


def test_per_part_teachers_are_checked_and_used():
    ok = Experiment(**COMMON, student=dict(arch="vit", **SHAPE), method="attn_distill+kd",
                    teacher={"attn_distill": VIT, "kd": "resnet20_cifar10"}, options={"kd__teacher_size": 32})
    with pytest.raises(ValueError, match="names exactly the parts"):
        Experiment(**COMMON, student=dict(arch="vit", **SHAPE), method="attn_distill+kd", teacher={"kd": "resnet20_cifar10"})
    r = run_experiment(ok)
    assert tuple(r) == RUN_FIELDS and set(r["losses"]) == {"ce", "attn_distill", "kd"} and r["peak_mem_mb"] >= 0


def test_cls_attention_extra_on_copy_and_deit():
    for method, arch, teacher in (("attn_copy", "vit", VIT), ("deit_hard", "deit", "resnet20_cifar10")):
        exp = Experiment(**COMMON, student=dict(arch=arch, **SHAPE), method=method, teacher=teacher,
                         extras=("cls_attention",))
        ex = run_experiment(exp)["extras"]["cls_attention"]
        maps = torch.tensor(ex["maps"])
        assert ex["images"] == [0, 20, 50, 80] and maps.shape == (4, 4, 4)   # 4 classes spread over 10; 4x4 patch grid
        # GTA's CLS map: the CLS row's softmax over the patch keys, renormalised, mean over heads
        assert (maps >= 0).all() and torch.allclose(maps.sum((1, 2)), torch.ones(4), atol=1e-4)


def test_spread_images_without_targets():
    assert _spread_images(list(range(7)), 4) == [0, 1, 2, 3]


def test_attndistill_kl_is_ce_plus_the_cls_kl():
    info = method_info("attndistill_kl")
    assert info.head and info.teacher == "vit" and info.defaults == {"attn_weight": 0.1, "T": 10.0}
    s = create_student("vit", **SHAPE, num_classes=10)
    t = create_student("vit", **SHAPE, num_classes=0)
    _, m = create_method("attndistill_kl", s, t)
    assert [term.name for term in m.terms] == ["attn", "ce"]
    assert "teacher_size" in method_info("aal").options and "teacher_size" in method_info("deit_hard").options


# ---------------------------------------------------------------- a fair test before a verdict (issue #45)
def _committed(P):
    "The committed mini runs: (R at the headline size, F by images per class), or None when they are not here."
    import json
    from attnrepro.core import config_hash
    from attnrepro.runner import output_dir
    runs = output_dir("head_to_head", "mini") / "runs"
    def coll(rows, pc=None):
        out = {}
        for r in rows:
            paths = [runs / f"{config_hash(c)}.json" for _, c in h2h.grid(P, [r], pc)]
            if not all(p.is_file() for p in paths): return None
            out[r["name"]] = [json.loads(p.read_text())["result"] for p in paths]
        return out
    R = coll(P["rows"])
    if R is None: return None
    best = h2h.best_of_groups(P, R)
    arms = [r for r in P["rows"] if r["name"] == "scratch" or r["name"] in best.values()]
    F = {pc: R if pc == P["data"]["per_class"] else coll(arms, pc) for pc in P["fractions"]["per_class"]}
    return (R, F, best) if all(v is not None for v in F.values()) else None


def test_rows_that_follow_their_paper_and_rows_that_read_the_cls_row():
    P = load_profile("head_to_head", "mini")
    rows, left_out = h2h.paper_rows(P, "ViT")
    assert set(left_out) == {"Attention Distillation (all blocks)", "AttnDistill CLS-KL"}
    assert rows == ["fine-tune", "fine-tune + GTA", "Attention Copy", "Attention Distillation (first 3/4)"]
    reads = {r["name"] for r in P["rows"] if h2h.reads_cls_row(r)}
    assert reads == {"fine-tune + GTA", "AttnDistill CLS-KL", "fine-tune + GTA + attn. distill"}
    assert h2h.composition_fix(P, "fine-tune + GTA + attn. distill", "fine-tune + GTA").startswith("a stronger weight of attn_distill")
    for e in (h2h.experiment(P, r, 0) for r in P["rows"]):   # `deviation` is read by the claims, never a config key
        assert "deviation" not in str(e.to_config())


def test_a_random_vit_fails_the_cls_row_gate():
    "A random-init ViT's CLS row is near-uniform: the source gate fails, naming the entropy and the gate."
    from attnrepro.attention import CLS_ENTROPY_GATE
    torch.manual_seed(0)
    m = create_student("vit", **SHAPE, num_classes=10)
    val = [(torch.randn(3, 32, 32), 0) for _ in range(8)]
    e, g = h2h.source_cls_gate(m, val, n_images=8, name="a random ViT")
    assert e["ratio"] > CLS_ENTROPY_GATE and e["n_images"] == 8 and g.verdict == "untestable"
    assert "a random ViT" in g.statement and f"at most {CLS_ENTROPY_GATE:g}" in g.statement


def test_committed_composition_1_is_inert_and_the_size_claim_needs_equal_steps():
    """On the committed mini runs: fine-tune + GTA + attn. distill agrees with fine-tune + GTA on more test images than two
    seeds of one row (inert: untestable with a fix, not inconclusive); the data sizes train unequal steps, so the gain's
    change with the data size is untestable; the paper-following ViT rows are tested with the source gate."""
    from attnrepro.verdicts import arm_agreement, gate
    P = load_profile("head_to_head", "mini")
    got = _committed(P)
    if got is None: pytest.skip("the committed head_to_head mini runs are not here")
    R, F, best = got
    comp, part = "fine-tune + GTA + attn. distill", "fine-tune + GTA"
    ag = arm_agreement(h2h.row_arm(R[comp], comp), h2h.row_arm(R[part], part))
    assert ag.inert and ag.same_seed > 99.5 and ag.within < 96   # 10-35 images of 10k differ seed for seed
    v = h2h.claim_composition(R, comp, h2h.COMPOSITION_PARTS[comp])
    assert v.verdict == "untestable" and "inert" in v.statement and "fix:" in v.statement
    assert h2h.steps_by_size(F) == {50: [30], 125: [90], 500: [390]} and not h2h.equal_steps(F).holds
    out = {c[0]: c for c in h2h.claims(P, R, F, best, source_gate=gate(False, "CLS-row gate"))}
    assert out["vit_gain_shrinks_with_data"][2].verdict == "untestable" and "30 / 90 / 390" in out["vit_gain_shrinks_with_data"][4]
    vit = out["vit_rows_beat_scratch"]
    assert vit[2].verdict == "untestable" and "CLS-row gate" in vit[2].statement and "left out: AttnDistill CLS-KL" in vit[3]
    assert "Attention Distillation (all blocks) -" not in vit[2].statement   # not the paper's recipe: left out
    passed = {c[0]: c for c in h2h.claims(P, R, F, best, source_gate=gate(True, "CLS-row gate"))}
    assert passed["vit_rows_beat_scratch"][2].verdict == "does not hold"   # with a passed gate GTA's -3 points decide it
    assert out["composition_1"][2].verdict == "untestable" and out["composition_3"][2].verdict == "holds"


@pytest.mark.parametrize("profile", ["smoke", "mini", "paper"])
def test_progress_is_read_and_reaches_the_runs(profile):
    "The profile's `progress` (a recipe key, issue #47) reaches every run `collect` trains, outside the config's hash."
    P = load_profile("head_to_head", profile)

    class FakeRun:   # PaperRun.run_many's shape: records the run function, returns one result per item
        def run_many(self, items, fn):
            self.fn, self.items = fn, list(items)
            return [{} for _ in self.items]

    pr = FakeRun()
    h2h.collect(pr, P)
    assert "progress" not in P.unread()   # collect read it (before this test's own look below)
    assert pr.fn.func is h2h.run_fn and pr.fn.keywords == {"progress": P["progress"]}
    assert all("progress" not in c for _, c in pr.items)


def test_source_cls_gate_uses_a_handful_of_images_in_a_dry_run(monkeypatch):
    m = create_student("vit", **SHAPE, num_classes=10)
    val = [(torch.randn(3, 32, 32), 0) for _ in range(64)]
    monkeypatch.setenv("ATTNREPRO_DRY_RUN", "1")
    assert h2h.source_cls_gate(m, val)[0]["n_images"] == h2h.DRY_IMAGES
    monkeypatch.delenv("ATTNREPRO_DRY_RUN")
    assert h2h.source_cls_gate(m, val)[0]["n_images"] == 64


def test_step_time_of_a_run_that_took_no_step_is_nan():
    "A --dry-run-quick run is built but not stepped (steps 0): no step time, not a ZeroDivisionError in table_main."
    import math
    assert math.isnan(h2h.step_s(dict(n_train=100, epochs=1, images_per_s=50.0, steps=0)))
    assert h2h.step_s(dict(n_train=100, epochs=1, images_per_s=50.0, steps=4)) == 0.5
