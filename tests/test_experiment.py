"""The experiment layer: one validated config, one result schema, deterministic and resumable runs, cached by PaperRun."""
import json

import pytest

from attnrepro.experiment import RUN_FIELDS, Experiment, run_experiment
from attnrepro.report import PaperRun

SHAPE = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2)
COMMON = dict(dataset="cifar10-sample", student=dict(arch="vit", **SHAPE), per_class=10,
              train=dict(epochs=2, batch_size=20, lr=1e-3, warmup_epochs=0))


def strip(r):
    return {k: v for k, v in r.items() if k not in ("wall_time_s", "images_per_s", "peak_mem_mb")}


def test_schema_and_determinism(tmp_path):
    exp = Experiment(**COMMON, method="attn_distill", teacher={"algorithm": "supervised", "arch": SHAPE},
                     options=dict(weight=1.0))
    a = run_experiment(exp, tmp_path / "a")
    b = run_experiment(Experiment.from_config(json.loads(json.dumps(exp.to_config()))), tmp_path / "b")
    assert tuple(a) == RUN_FIELDS and strip(a) == strip(b)
    assert a["n_train"] == 100 and a["num_classes"] == 10 and a["epochs"] == 2 and a["steps"] == 10
    assert set(a["losses"]) == {"ce", "attn_distill"} and 0 <= a["top1"] <= 100 and a["device"] == "cpu"
    # a finished checkpoint is reloaded, not retrained: same result, and no memory measured (nothing trained)
    again = run_experiment(exp, tmp_path / "a")
    assert strip(again) == strip(a) and again["peak_mem_mb"] is None and a["peak_mem_mb"] is not None


def test_feature_method_has_no_top1_but_knn():
    exp = Experiment(**COMMON, method="attndistill", teacher={"algorithm": "mae", "arch": SHAPE},
                     options=dict(compress_queue=16), extras=("knn",))
    r = run_experiment(exp)
    assert r["top1"] is None and 0 <= r["extras"]["knn"]["knn20_top1"] <= 100 and {"feat", "attn"} <= set(r["losses"])


def test_paperrun_caches_an_experiment(tmp_path):
    pr = PaperRun("gta", "smoke", tmp_path / "out", tmp_path / "runs")
    exp = Experiment(**COMMON)
    calls = []
    def fn(config, ckpt_dir):
        calls.append(1)
        return run_experiment(config, ckpt_dir)
    first = pr.run(exp.to_config(), fn, name="scratch")
    second = pr.run(exp.to_config(), fn, name="scratch")
    assert calls == [1] and first == second and first["top1"] is not None


@pytest.mark.parametrize("bad, message", [
    (dict(method="deit_hard", teacher="resnet20_cifar10"), "trains arch 'deit'"),
    (dict(student=dict(arch="vit", num_classes=10, **SHAPE)), "num_classes comes from the dataset"),
    (dict(per_class=10, fraction=0.5), "not both"),
    (dict(train=dict(epochs=1, seed=3)), "the seed is Experiment.seed"),
    (dict(extras=("cka",)), "unknown ['cka']"),
    (dict(augment="heavy"), "Experiment.augment='heavy'"),
])
def test_bad_experiments_are_refused_by_name(bad, message):
    with pytest.raises(ValueError, match=None) as e:
        Experiment(**{**COMMON, **bad})
    assert message in str(e.value)


# hashes of these configs computed before record_correct existed (commit 82cf8f4): cached runs must keep their keys
HASH_BEFORE_RECORD_CORRECT = {"default": "1b415261cd91d794", "attn_distill_knn": "84ee7fa2a639007e"}


def test_record_correct_leaves_existing_config_hashes_unchanged():
    from attnrepro.core import config_hash
    default = Experiment(**COMMON)
    other = Experiment(**COMMON, method="attn_distill", teacher={"algorithm": "supervised", "arch": SHAPE},
                       options=dict(weight=1.0), extras=("knn",))
    assert config_hash(default.to_config()) == HASH_BEFORE_RECORD_CORRECT["default"]
    assert config_hash(other.to_config()) == HASH_BEFORE_RECORD_CORRECT["attn_distill_knn"]
    assert "record_correct" not in default.to_config()
    assert config_hash(Experiment(**COMMON, record_correct=False).to_config()) == HASH_BEFORE_RECORD_CORRECT["default"]
    rec = Experiment(**COMMON, record_correct=True)
    assert rec.to_config()["record_correct"] is True and config_hash(rec.to_config()) != HASH_BEFORE_RECORD_CORRECT["default"]
    assert Experiment.from_config(json.loads(json.dumps(rec.to_config()))) == rec


def test_record_correct_returns_the_final_hits():
    from attnrepro.verdicts import unpack_correct
    r = run_experiment(Experiment(**COMMON, record_correct=True))
    hits = unpack_correct(r["correct"])
    assert tuple(r) == RUN_FIELDS and len(hits) == r["n_val"] == 100   # the cifar10-sample test split, in its order
    assert abs(100 * hits.mean() - r["top1"]) < 1e-9
    json.dumps(r, allow_nan=False)


def test_record_correct_refused_without_a_head():
    with pytest.raises(ValueError, match="no classification head"):
        Experiment(**COMMON, method="attndistill", teacher={"algorithm": "mae", "arch": SHAPE}, record_correct=True)
    with pytest.raises(ValueError, match="give True or False"):
        Experiment(**COMMON, record_correct="yes")
