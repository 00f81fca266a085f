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
    assert three_quarters["Attention Distillation (all blocks)"] is None   # the registry's default: every block


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
