"Hub teachers from local files (timm's pretrained-config overlay) and other projects' checkpoints (key maps), offline."
import json

import pytest
import timm
import torch
from safetensors.torch import save_file

from attnrepro import models as M

NAME = "vit_tiny_patch16_224"
SMALL = dict(img_size=32, patch_size=8, depth=2)  # a tiny ViT with timm's vit_tiny key names


def tiny_vit(seed=0, **kw):
    torch.manual_seed(seed)
    return timm.create_model(NAME, **{**SMALL, **kw})


def same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("suffix", [".safetensors", ".pth"])
def test_timm_name_with_local_file(tmp_path, suffix):
    src = tiny_vit(num_classes=10)
    f = tmp_path / f"{NAME}{suffix}"
    save_file(src.state_dict(), str(f)) if suffix == ".safetensors" else torch.save({"model": src.state_dict()}, f)
    t = M.load_teacher(f"timm:{NAME}", checkpoint=f, timm_kwargs=dict(SMALL, num_classes=10))
    assert same_weights(t.state_dict(), src.state_dict())  # the classifier too, not re-initialised by timm
    assert not t.training and t.teacher_cfg["name"] == f"timm:{NAME}" and t.teacher_cfg["source"] == str(f)
    assert M.teacher_record(t) == {"name": f"timm:{NAME}", "source": str(f), "sha256": M.sha256_file(f),
                                   "key_map": None, "timm_kwargs": dict(SMALL, num_classes=10)}
    x = torch.randn(2, 3, 32, 32)
    assert torch.allclose(t(x), src.eval()(x))


def test_timm_file_for_another_class_count_drops_only_the_classifier(tmp_path):
    src = tiny_vit(num_classes=10)
    f = tmp_path / "w.safetensors"
    save_file(src.state_dict(), str(f))
    t = M.load_teacher(f"timm:{NAME}", checkpoint=f, timm_kwargs=dict(SMALL, num_classes=0))
    assert same_weights(t.state_dict(), {k: v for k, v in src.state_dict().items() if not k.startswith("head.")})
    headless = tmp_path / "headless.safetensors"
    save_file(t.state_dict(), str(headless))
    with pytest.raises(M.CheckpointError, match=r"missing keys \(2\): head.weight, head.bias.*num_classes=0"):
        M.load_teacher(f"timm:{NAME}", checkpoint=headless, timm_kwargs=dict(SMALL, num_classes=10))


@pytest.mark.parametrize("num_classes", [10, 0])  # timm checks strictly only when the class count matches
def test_timm_file_key_mismatch_names_the_keys(tmp_path, num_classes):
    sd = tiny_vit(num_classes=10).state_dict()
    sd.pop("blocks.1.mlp.fc2.bias")
    sd["blocks.2.attn.qkv.weight"] = torch.zeros(3)
    f = tmp_path / "bad.safetensors"
    save_file(sd, str(f))
    with pytest.raises(M.CheckpointError) as e:
        M.load_teacher(f"timm:{NAME}", checkpoint=f, timm_kwargs=dict(SMALL, num_classes=num_classes))
    msg = str(e.value)
    assert "blocks.1.mlp.fc2.bias" in msg and "blocks.2.attn.qkv.weight" in msg and str(f) in msg


def test_timm_file_of_another_architecture(tmp_path):
    f = tmp_path / "deeper.safetensors"
    save_file(tiny_vit(depth=3).state_dict(), str(f))
    with pytest.raises(M.CheckpointError, match=r"unexpected keys.*blocks\.2\.norm1\.weight"):
        M.load_teacher(f"timm:{NAME}", checkpoint=f, timm_kwargs=SMALL)


def test_timm_file_arguments_checked(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.safetensors"):
        M.load_teacher(f"timm:{NAME}", checkpoint=tmp_path / "nope.safetensors", timm_kwargs=SMALL)
    with pytest.raises(ValueError, match="only apply to 'timm:<name>'"):
        M.load_teacher("resnet20_cifar10", checkpoint=tmp_path / "x.pth")
    with pytest.raises(ValueError, match="key_map= only applies to checkpoint files"):
        M.load_teacher(f"timm:{NAME}", key_map="mocov3")
    with pytest.raises(ValueError, match="Unknown key_map"):
        M.map_checkpoint({}, "mocov2")


def moco_checkpoint(base: dict, momentum: dict) -> dict:
    "The layout of facebookresearch/moco-v3's vit-*-300ep.pth.tar (DDP-wrapped MoCo_ViT in 'state_dict')."
    mlp = {"head.0.weight": torch.randn(16, 192), "head.1.weight": torch.ones(16), "head.1.bias": torch.zeros(16),
           "head.1.running_mean": torch.zeros(16), "head.3.weight": torch.randn(8, 16)}
    sd = {**{f"module.base_encoder.{k}": v for k, v in {**base, **mlp}.items()},
          **{f"module.momentum_encoder.{k}": v for k, v in {**momentum, **mlp}.items()},
          "module.predictor.0.weight": torch.randn(16, 8), "module.predictor.3.weight": torch.randn(8, 16)}
    return {"epoch": 300, "arch": "vit_tiny", "state_dict": sd,
            "optimizer": {"state": {}, "param_groups": [{"lr": 1.5e-4, "params": [0, 1]}]}}


def test_mocov3_key_map_round_trip(tmp_path):
    base, momentum = tiny_vit(0, num_classes=0), tiny_vit(1, num_classes=0)
    f = tmp_path / "vit-t-300ep.pth.tar"
    torch.save(moco_checkpoint(base.state_dict(), momentum.state_dict()), f)
    cfg = {"timm": {"model_name": NAME, **SMALL, "num_classes": 0}}
    t = M.load_teacher(f, config=cfg, key_map="mocov3")
    assert same_weights(t.state_dict(), base.state_dict()) and not t.training
    assert t.teacher_cfg["key_map"] == "mocov3" and t.teacher_cfg["sha256"] == M.sha256_file(f)
    tm = M.load_teacher(f, config=cfg, key_map="mocov3_momentum")
    assert same_weights(tm.state_dict(), momentum.state_dict())
    # without the key map the file does not fit, and the error names the keys
    with pytest.raises(M.CheckpointError, match="base_encoder.cls_token"):
        M.load_teacher(f, config=cfg)
    # a timm model with a classifier reports the head the MoCo file does not have
    with pytest.raises(M.CheckpointError, match=r"missing keys.*head.weight"):
        M.load_teacher(f, config={"timm": {"model_name": NAME, **SMALL}}, key_map="mocov3")
    # the key map can sit in the sidecar with the architecture
    (tmp_path / "vit-t-300ep.pth.tar.json").write_text(json.dumps({**cfg, "key_map": "mocov3"}))
    assert same_weights(M.load_teacher(f).state_dict(), base.state_dict())


def test_mugs_key_map_full_and_backbone_only(tmp_path):
    teacher, student = tiny_vit(2, num_classes=0), tiny_vit(3, num_classes=0)
    rel = {"relation_blocks.0.norm1.weight": torch.ones(192)}
    ckpt = {"teacher": {**{f"backbone.{k}": v for k, v in {**teacher.state_dict(), **rel}.items()},
                        "head.mlp.0.weight": torch.randn(8, 192)},
            "student": {f"module.backbone.{k}": v for k, v in student.state_dict().items()}, "epoch": 100}
    f = tmp_path / "mugs_full.pth"
    torch.save(ckpt, f)
    cfg = {"timm": {"model_name": NAME, **SMALL, "num_classes": 0}}
    assert same_weights(M.load_teacher(f, config=cfg, key_map="mugs").state_dict(), teacher.state_dict())
    assert same_weights(M.load_teacher(f, config=cfg, key_map="mugs_student").state_dict(), student.state_dict())
    g = tmp_path / "mugs_backbone.pth"                          # the released backbone-only weights
    torch.save({**teacher.state_dict(), **rel}, g)
    assert same_weights(M.load_teacher(g, config=cfg, key_map="mugs").state_dict(), teacher.state_dict())


def test_file_teachers_record_their_sha256(tmp_path):
    f = tmp_path / "r20.safetensors"
    save_file(M.cifar_resnet(20).state_dict(), str(f))
    t = M.load_teacher(f, config={"cifar_resnet": {"depth": 20}})
    assert M.teacher_record(t)["sha256"] == M.sha256_file(f)
