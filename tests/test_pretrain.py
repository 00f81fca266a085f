"Tests for attnrepro.pretrain: MAE / DINO pieces against hand formulas, short pre-trains, resume, save/load."
import json, math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attnrepro.data import class_balanced_subset, eval_transform, get_dataset, train_transform
from attnrepro.models import create_student, load_teacher, save_teacher
from attnrepro.pretrain import (MAE, DINOHead, DINOLoss, DINOMethod, MultiCropTransform, MultiCropWrapper,
                                clean_encoder, clip_gradients_per_param, ema_momentum_at, ema_update,
                                feature_quality, mae_transform, patch_targets, patchify, pretrain_dino, pretrain_mae,
                                pretrain_supervised, random_init_quality, random_masking, sincos_pos_embed,
                                teacher_quality, teacher_temp_at, unpatchify)
from attnrepro.train import CKPT_NAME, TrainConfig, fit, load_checkpoint, to_device

ARCH = dict(img_size=64, patch_size=8, embed_dim=16, depth=1, num_heads=2)
CFG = dict(epochs=2, batch_size=50, lr=1e-3, warmup_epochs=0, weight_decay=0.05)


def tiny_encoder(seed=0, **kw):
    torch.manual_seed(seed)
    return create_student(**{**ARCH, "num_classes": 0, **kw})


# --------------------------------------------------------------------------- MAE pieces

def test_patchify_order_and_roundtrip():
    imgs = torch.randn(2, 3, 16, 16)
    p = patchify(imgs, 8)
    assert p.shape == (2, 4, 192)
    # patch (row 1, col 0) = index 2; its value at in-patch pixel (r, c), channel ch is at (r * 8 + c) * 3 + ch
    for r, c, ch in [(0, 0, 0), (3, 5, 2), (7, 7, 1)]:
        assert p[1, 2, (r * 8 + c) * 3 + ch] == imgs[1, ch, 8 + r, c]
    assert torch.equal(unpatchify(p, 8), imgs)


def test_norm_pix_target_by_hand():
    imgs = torch.randn(2, 3, 16, 16, dtype=torch.float64)
    t = patch_targets(imgs, 8, norm_pix=True).numpy()
    raw = patchify(imgs, 8).numpy()
    mean = raw.mean(-1, keepdims=True)
    var = ((raw - mean) ** 2).sum(-1, keepdims=True) / (raw.shape[-1] - 1)  # unbiased, as torch.var / MAE
    np.testing.assert_allclose(t, (raw - mean) / np.sqrt(var + 1e-6), rtol=1e-10)
    assert torch.equal(patch_targets(imgs, 8, norm_pix=False), patchify(imgs, 8))


def test_random_masking_keeps_exactly_a_quarter():
    torch.manual_seed(0)
    x = torch.randn(5, 64, 4)
    kept, mask, ids_restore = random_masking(x, 0.75)
    assert kept.shape == (5, 16, 4)
    assert mask.sum(1).tolist() == [48.0] * 5 and set(mask.unique().tolist()) == {0.0, 1.0}
    for b in range(5):  # the kept tokens are exactly the unmasked ones
        vis = x[b][mask[b] == 0]
        assert sorted(map(tuple, vis.tolist())) == sorted(map(tuple, kept[b].tolist()))
    # ids_restore is the inverse permutation of the shuffle that put the kept tokens first
    shuffle = torch.argsort(ids_restore, dim=1)
    assert torch.equal(torch.gather(x, 1, shuffle[:, :16, None].expand(-1, -1, 4)), kept)


def test_sincos_pos_embed_by_hand():
    e = sincos_pos_embed(4, 2, cls_token=True)
    assert e.shape == (5, 4) and torch.equal(e[0], torch.zeros(4))
    # dim 4 -> one frequency (1.0) per axis: token (row i, col j) = [sin j, cos j, sin i, cos i] (MAE: w first)
    for k, (i, j) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)], start=1):
        torch.testing.assert_close(e[k], torch.tensor([math.sin(j), math.cos(j), math.sin(i), math.cos(i)]))
    with pytest.raises(ValueError, match="divisible by 4"):
        sincos_pos_embed(6, 2)


def test_mae_loss_counts_only_masked_patches():
    mae = MAE(tiny_encoder(), decoder_dim=8, decoder_depth=1, decoder_heads=2)
    imgs = torch.randn(2, 3, 64, 64)
    target = patch_targets(imgs, 8)
    mask = torch.zeros(2, 64)
    mask[:, :48] = 1
    # perfect on masked patches, garbage on visible ones: zero loss
    pred = target.clone(); pred[:, 48:] += 5.0
    assert mae.forward_loss(imgs, pred, mask) == 0
    # an error of c on every value of the masked patches only: loss c^2
    pred = target.clone(); pred[:, :48] += 0.5
    torch.testing.assert_close(mae.forward_loss(imgs, pred, mask), torch.tensor(0.25))
    # golden: the full forward's loss = mean over masked patches of the per-patch MSE
    torch.manual_seed(1)
    loss, pred, m = mae(imgs)
    per_patch = ((pred - target) ** 2).mean(-1)
    torch.testing.assert_close(loss, per_patch[m == 1].mean())
    assert m.sum(1).tolist() == [48.0, 48.0] and loss.isfinite()


def test_mae_encoder_is_plain_vit_with_fixed_sincos():
    enc = tiny_encoder()
    mae = MAE(enc, decoder_dim=8, decoder_depth=1, decoder_heads=2)
    assert not enc.pos_embed.requires_grad and not mae.decoder_pos_embed.requires_grad
    torch.testing.assert_close(enc.pos_embed[0], sincos_pos_embed(16, 8))
    with torch.no_grad():  # the encoder on all tokens (ratio 0) equals the timm forward
        lat, mask, _ = mae.forward_encoder(torch.ones(1, 3, 64, 64), 0.0)
        torch.testing.assert_close(lat[:, 0], enc(torch.ones(1, 3, 64, 64)))
    assert mask.sum() == 0
    with pytest.raises(ValueError, match="dynamic_img_size"):
        MAE(tiny_encoder(dynamic_img_size=True))


# --------------------------------------------------------------------------- DINO pieces

def _np_dino_loss(s, t, center, tt, st, n_crops):
    "DINO's loss written out in numpy, from the paper's pseudo-code."
    def softmax(z): z = z - z.max(-1, keepdims=True); e = np.exp(z); return e / e.sum(-1, keepdims=True)
    B = s.shape[0] // n_crops
    ps = [np.log(softmax(s[i * B:(i + 1) * B] / st)) for i in range(n_crops)]
    pt = [softmax((t[i * B:(i + 1) * B] - center) / tt) for i in range(t.shape[0] // B)]
    terms = [(-pt[i] * ps[v]).sum(-1).mean() for i in range(len(pt)) for v in range(n_crops) if v != i]
    return sum(terms) / len(terms)


def test_dino_loss_and_center_by_hand():
    g = torch.Generator().manual_seed(0)
    B, K, n_crops = 3, 5, 4
    s, t = torch.randn(n_crops * B, K, generator=g, dtype=torch.float64), torch.randn(2 * B, K, generator=g, dtype=torch.float64)
    loss_fn = DINOLoss(K, student_temp=0.1, center_momentum=0.9).double()
    c0 = torch.randn(1, K, generator=g, dtype=torch.float64)
    loss_fn.center.copy_(c0)
    loss = loss_fn(s, t, 0.04, n_crops)
    expect = _np_dino_loss(s.numpy(), t.numpy(), c0.numpy(), 0.04, 0.1, n_crops)
    assert abs(float(loss) - expect) < 1e-10
    # the center moved after the loss: 0.9 * old + 0.1 * batch mean of the teacher outputs
    torch.testing.assert_close(loss_fn.center, 0.9 * c0 + 0.1 * t.mean(0, keepdim=True))
    with pytest.raises(ValueError, match="n_crops"):
        loss_fn(s[:-1], t, 0.04, n_crops)


def test_dino_center_staged_over_micro_batches_moves_once():
    "defer_center: two staged halves move the center once, exactly as their concatenation does."
    g = torch.Generator().manual_seed(1)
    B, K, n_crops = 4, 5, 3
    s, t = torch.randn(n_crops * B, K, generator=g, dtype=torch.float64), torch.randn(2 * B, K, generator=g, dtype=torch.float64)
    whole, split = DINOLoss(K).double(), DINOLoss(K, defer_center=True).double()
    c0 = torch.randn(1, K, generator=g, dtype=torch.float64)
    whole.center.copy_(c0); split.center.copy_(c0)
    full = whole(s, t, 0.04, n_crops)
    halves = [split(torch.cat([c[i::2] for c in s.chunk(n_crops)]), torch.cat([c[i::2] for c in t.chunk(2)]), 0.04, n_crops)
              for i in (0, 1)]
    assert torch.equal(split.center, c0)                                   # staged, not moved
    torch.testing.assert_close((halves[0] + halves[1]) / 2, full)         # both halves saw the old center
    split.apply_staged_center(); split.apply_staged_center()              # the second: nothing staged
    torch.testing.assert_close(split.center, whole.center)


def test_dino_under_accumulation_matches_one_large_batch(tmp_path):
    "batch 50 = 2 micro-batches of 25: same momentum schedule (fit's optimiser steps), same center, same teacher."
    ds = _sample(MultiCropTransform(64, n_local=2), 10)
    def run(batch, accum, d):
        cfg = TrainConfig(**{**CFG, "batch_size": batch, "accum_steps": accum, "seed": 0})
        enc, res = pretrain_dino(ds, ARCH, cfg, d, out_dim=64, hidden_dim=32, bottleneck_dim=16,
                                 warmup_teacher_temp_epochs=2, log_every=2, progress=False)
        return enc, res, load_checkpoint(d / CKPT_NAME)["extra"]["dino_loss"]["center"]
    (e1, r1, c1), (e2, r2, c2) = run(50, 1, tmp_path / "a"), run(25, 2, tmp_path / "b")
    total = 2 * 2                                                          # 2 epochs x 2 optimiser steps
    assert r1["history"][-1]["momentum"] == r2["history"][-1]["momentum"] == ema_momentum_at(total - 1, total)
    torch.testing.assert_close(c2, c1, atol=1e-5, rtol=1e-4)
    for (k, a), b in zip(e1.state_dict().items(), e2.state_dict().values()):
        torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-3, msg=k)


def test_teacher_temp_and_momentum_schedules():
    lin = np.linspace(0.04, 0.07, 30)
    for e in [0, 1, 15, 29]:
        assert abs(teacher_temp_at(e, 0.04, 0.07, 30) - lin[e]) < 1e-12
    assert teacher_temp_at(30) == teacher_temp_at(99) == 0.07
    assert teacher_temp_at(0, warmup_epochs=1) == 0.04 and teacher_temp_at(1, warmup_epochs=1) == 0.07
    total = 40
    sched = 1 + 0.5 * (0.996 - 1) * (1 + np.cos(np.pi * np.arange(total) / total))  # DINO's cosine_scheduler
    for i in [0, 7, 20, 39]:
        assert abs(ema_momentum_at(i, total) - sched[i]) < 1e-12


def test_ema_update_and_per_param_clip():
    torch.manual_seed(0)
    s, t = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    t0 = [p.detach().clone() for p in t.parameters()]
    ema_update(t, s, 0.9)
    for a, b, c in zip(t.parameters(), t0, s.parameters()):
        torch.testing.assert_close(a, 0.9 * b + 0.1 * c)
    s.weight.grad, s.bias.grad = torch.full((2, 3), 10.0), torch.tensor([0.1, 0.0])
    clip_gradients_per_param(s, 3.0)
    assert abs(float(s.weight.grad.norm()) - 3.0) < 1e-4 and torch.equal(s.bias.grad, torch.tensor([0.1, 0.0]))


def test_dino_head_and_multicrop_wrapper():
    head = DINOHead(16, out_dim=32, hidden_dim=24, bottleneck_dim=8)
    w = head.last_layer.weight
    torch.testing.assert_close(w.norm(dim=1), torch.ones(32))  # weight-normed prototypes of norm 1
    assert not head.last_layer.parametrizations.weight.original0.requires_grad
    assert [m.out_features for m in head.mlp if isinstance(m, torch.nn.Linear)] == [24, 24, 8]
    wrap = MultiCropWrapper(tiny_encoder(dynamic_img_size=True), head).eval()
    crops = [torch.randn(2, 3, 64, 64) for _ in range(2)] + [torch.randn(2, 3, 32, 32) for _ in range(3)]
    out = wrap(crops)
    assert out.shape == (10, 32) and out.isfinite().all()
    one_by_one = torch.cat([head(wrap.backbone(c)) for c in crops])
    torch.testing.assert_close(out, one_by_one, rtol=1e-5, atol=1e-5)
    bn = DINOHead(16, out_dim=32, hidden_dim=24, bottleneck_dim=8, use_bn=True)
    assert sum(isinstance(m, torch.nn.BatchNorm1d) for m in bn.mlp) == 2 and bn(torch.randn(4, 16)).shape == (4, 32)


def test_multicrop_transform_shapes_and_collate():
    ds = get_dataset("tiny-imagenet-sample", "train", transform=MultiCropTransform(64, n_local=3))
    crops, y = ds[0]
    assert [tuple(c.shape) for c in crops] == [(3, 64, 64)] * 2 + [(3, 32, 32)] * 3
    batch = next(iter(torch.utils.data.DataLoader(ds, batch_size=4)))
    assert isinstance(batch[0], list) and [tuple(c.shape) for c in batch[0]] == [(4, 3, 64, 64)] * 2 + [(4, 3, 32, 32)] * 3
    moved = to_device(batch[0], torch.device("cpu"))
    assert isinstance(moved, list) and len(moved) == 5
    t = MultiCropTransform(64, n_local=2)
    assert 0.1 * 64 / 224 == pytest.approx(t.global1.transforms[-3].radius[0])  # blur scaled like DINO's 224 px


def test_mixup_refuses_multicrop_batches():
    ds = get_dataset("tiny-imagenet-sample", "train", transform=MultiCropTransform(64, n_local=2))
    with pytest.raises(ValueError, match="mixup"):
        pretrain_dino(ds, ARCH, TrainConfig(**CFG, mixup=0.8, num_classes=10), out_dim=32, hidden_dim=16,
                      bottleneck_dim=8, progress=False)


# --------------------------------------------------------------------------- short pre-trains

@pytest.fixture(scope="module")
def quality_sets():
    return (get_dataset("tiny-imagenet-sample", "train", transform=eval_transform(64)),
            get_dataset("tiny-imagenet-sample", "val", transform=eval_transform(64)))


def _sample(tf, per_class=None):
    ds = get_dataset("tiny-imagenet-sample", "train", transform=tf)
    return class_balanced_subset(ds, per_class=per_class) if per_class else ds


def _run(algo, ckpt_dir, epochs=2, per_class=None, **kw):
    "2 epochs of 4 steps (200 images, batch 50; 2 steps with per_class=10)."
    cfg = TrainConfig(**{**CFG, "epochs": epochs})
    if algo == "mae":
        ds = _sample(mae_transform(64), per_class)
        return pretrain_mae(ds, ARCH, cfg, ckpt_dir, decoder_dim=16, decoder_depth=1, decoder_heads=2, log_every=2,
                            progress=False, **kw)
    if algo == "dino":
        ds = _sample(MultiCropTransform(64, n_local=2), per_class)
        return pretrain_dino(ds, ARCH, cfg, ckpt_dir, out_dim=64, hidden_dim=32, bottleneck_dim=16,
                             warmup_teacher_temp_epochs=2, log_every=2, progress=False, **kw)
    ds = _sample(train_transform("weak", 64), per_class)
    return pretrain_supervised(ds, ARCH, cfg, ckpt_dir, log_every=2, progress=False, **kw)


@pytest.mark.parametrize("algo", ["mae", "dino", "supervised"])
def test_short_pretrain_checkpoints_resumes_saves_loads(algo, tmp_path, quality_sets):
    enc, res = _run(algo, tmp_path / "ck")
    losses = res["epoch_loss"]
    assert len(losses) == 2 and all(map(math.isfinite, losses)) and res["algorithm"] == algo
    assert len(res["loss_curve"]["loss"]) == 4 and res["loss_curve"]["step"] == [2, 4, 6, 8]
    if algo != "dino":  # DINO's loss rises while its teacher temperature warms up; finite is the check there
        assert losses[1] < losses[0] * 1.05
    ck = load_checkpoint(tmp_path / "ck" / CKPT_NAME)
    assert ck["epoch"] == 2
    if algo == "dino":
        assert set(ck["extra"]) == {"teacher", "dino_loss"} and ck["extra"]["dino_loss"]["center"].abs().sum() > 0
    json.dumps(res, allow_nan=False)
    # a finished run reloads from its checkpoint without training
    enc2, res2 = _run(algo, tmp_path / "ck")
    assert res2["resumed_from_epoch"] == 2 and res2["epoch_loss"] == losses
    for a, b in zip(enc.state_dict().values(), enc2.state_dict().values()): assert torch.equal(a, b)
    # a clean encoder, saved small and loaded back by name
    assert not enc.training and "dynamic_img_size" not in enc.student_cfg and enc.student_cfg["drop_path_rate"] == 0
    w = save_teacher(enc, f"{algo}_test", meta={"algorithm": algo, "epoch_loss": losses}, dir=tmp_path / "teachers")
    t = load_teacher(f"{algo}_test", teacher_dir=tmp_path / "teachers")
    assert t.teacher_cfg["algorithm"] == algo and w.stat().st_size < 100_000
    x = quality_sets[1][0][0][None]
    torch.testing.assert_close(t.forward_features(x), enc.forward_features(x), atol=2e-2, rtol=1e-2)


def test_dino_resume_after_interruption_is_exact(tmp_path, monkeypatch):
    full, _ = _run("dino", tmp_path / "a", per_class=10)
    real = DINOMethod.on_epoch_end
    def stop_after_first(self, ctx):
        if ctx.epoch == 1: raise KeyboardInterrupt("simulated kill")
        return real(self, ctx)
    monkeypatch.setattr(DINOMethod, "on_epoch_end", stop_after_first)
    with pytest.raises(KeyboardInterrupt):
        _run("dino", tmp_path / "b", per_class=10)
    assert load_checkpoint(tmp_path / "b" / CKPT_NAME)["epoch"] == 1
    monkeypatch.setattr(DINOMethod, "on_epoch_end", real)
    resumed, res = _run("dino", tmp_path / "b", per_class=10)
    assert res["resumed_from_epoch"] == 1
    for (k, a), b in zip(full.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), k


def test_monitor_and_quality(quality_sets):
    tr, va = quality_sets
    enc, res = _run("mae", None, epochs=1, per_class=10, val_data=va, knn_bank=tr)
    assert 0 <= res["history"][-1]["val_knn_top1"] <= 100
    with pytest.raises(ValueError, match="knn_bank"):
        _run("mae", None, epochs=1, per_class=10, val_data=va)
    q = teacher_quality(enc, tr, va, probe_epochs=2)
    assert {"knn_top1", "linear_top1", "random_knn_top1", "random_linear_top1", "better_than_random"} <= set(q)
    assert q["n_train"] == 200 and q["n_val"] == 100
    rq = random_init_quality(ARCH, tr, va, probe_epochs=2)
    assert rq == random_init_quality(ARCH, tr, va, probe_epochs=2)  # seeded
    assert q["random_knn_top1"] == rq["knn_top1"]  # the baseline is the same seeded random ViT
    assert teacher_quality(enc, tr, va, baseline=rq, probe_epochs=2) == q


def test_quality_sets_are_a_handful_of_images_in_a_dry_run(monkeypatch):
    "A dry run costs training: its quality measurements (random-init baseline, k-NN, probe, CLS maps) see a few images."
    from attnrepro.pretrain import DRY_QUALITY, quality_sets
    q = {"data": "tiny-imagenet-sample"}
    full = quality_sets(q, 64)
    monkeypatch.setenv("ATTNREPRO_DRY_RUN", "1")
    tr, va = quality_sets(q, 64)
    assert len(tr) == len(va) == DRY_QUALITY < min(map(len, full))
    assert len(set(tr.targets)) > 1 and tr.indices[0] == 0 and tr.indices[-1] == len(full[0]) - 1   # spread over the set
    bank, val = quality_sets(q, 64, 1, 1)   # the monitor's per-class subsets stay within the cut
    assert len(bank) <= DRY_QUALITY and len(val) <= DRY_QUALITY


def test_feature_quality_separable():
    g = torch.Generator().manual_seed(0)
    centres = torch.randn(5, 8, generator=g) * 4
    ytr, yva = torch.arange(200) % 5, torch.arange(50) % 5
    tr = (centres[ytr] + torch.randn(200, 8, generator=g), ytr)
    va = (centres[yva] + torch.randn(50, 8, generator=g), yva)
    q = feature_quality(tr, va, probe_epochs=10, probe_batch=32)
    assert q["knn_top1"] == 100.0 and q["linear_top1"] == 100.0


def test_clean_encoder_drops_training_only_options():
    enc = tiny_encoder(dynamic_img_size=True, drop_path_rate=0.1)
    c = clean_encoder(enc)
    assert "dynamic_img_size" not in c.student_cfg and c.student_cfg["drop_path_rate"] == 0.0 and not c.training
    for a, b in zip(enc.state_dict().values(), c.state_dict().values()): assert torch.equal(a, b)


def test_teachers_cls_attention_figure():
    "One image row, then one row per model of last-block CLS attention maps on the patch grid."
    from attnrepro.models import create_student
    from attnrepro.pretrain import plot_cls_attention
    torch.manual_seed(0)
    m = create_student(img_size=16, patch_size=4, embed_dim=24, depth=2, num_heads=3, num_classes=0).eval()
    fig = plot_cls_attention({"random_init": m}, torch.randn(3, 3, 16, 16), 4)
    assert len(fig.axes) == 2 * 3 and fig.axes[3].get_ylabel() == "random\ninit"
    assert fig.axes[3].images[0].get_array().shape == (4, 4)


def _fake_teacher_result(knn, linear, algorithm="mae", sha="ab" * 32):
    "A result-shaped dict of one teacher run (what `train_teacher_run` returns, the fields the tables read)."
    return dict(algorithm=algorithm, n_images=100, epochs=2, wall_time_s=120.0, steps=10, images_per_s=50.0,
                weights="t.safetensors", sha256=sha, size_bytes=2**20, teacher_params=1000,
                quality=dict(knn_top1=knn, linear_top1=linear, random_knn_top1=5.0, random_linear_top1=4.0,
                             better_than_random=knn > 5.0 and linear > 4.0))


def test_teachers_tables_and_gates_from_results():
    "Quality, manifest and gates tables from fake results: the columns and verdicts the teachers notebook reports."
    from attnrepro.pretrain import check_beats_random, gates_table, manifest_table, quality_table, teacher_names
    from attnrepro.report import load_profile
    P = load_profile("teachers", "smoke")
    t, t2 = list(P["teachers"])[:2]
    results = {t: _fake_teacher_result(20.0, 16.0), t2: _fake_teacher_result(6.0, 4.5)}
    q, cap = quality_table(P, results)
    assert list(q["teacher"]) == [t, t2] and list(q["better than random"]) == ["yes", "yes"]
    assert q["wall time (min)"].tolist() == [2.0, 2.0] and P["quality"]["data"] in cap
    m, _ = manifest_table(results, "smoke")
    assert m["sha256"].tolist() == ["ab" * 8] * 2 and m["size (MB)"].tolist() == [1.0, 1.0]
    text, v = check_beats_random(t, results[t]["quality"], n_quality=10_000)
    assert t in text and v.verdict == "holds"
    gates, _, claims = gates_table(P, results, {})   # no gate runs: only the SSL ratio gates, no claims
    ratio = P["gates"]["ssl_ratio"]
    assert claims == [] and gates["verdict"].tolist() == ["met" if 20 / 5 >= ratio else "not met",
                                                          "met" if 16 / 4 >= ratio else "not met", "not met", "not met"]
    # a gate task: fine-tuning gains about 2 points on 10k images, below a 5-point margin, yet clearly a gain
    G = dict(P["gates"], finetune_margin=5.0, seeds=[0, 1, 2], tasks={"cifar": {"teachers": [t]}})
    runs = {("cifar", who, s): dict(acc1=a + d, n_val=10_000) for s, d in enumerate((0.0, 0.3, -0.2))
            for who, a in ((None, 45.0), (t, 47.0))}
    _, _, claims = gates_table(dict(P, gates=G), {t: results[t]}, runs)
    (cid, _, v, evidence, regime), = claims
    assert cid == f"gate_cifar_{t}" and v.verdict == "does not hold"
    assert evidence.endswith("whether it helps at all (gain > 0): holds") and "test images" in regime
    assert teacher_names(P, [], "smoke") == list(P["teachers"])
    with pytest.raises(ValueError, match="unknown teachers"):
        teacher_names(P, ["nope"], "smoke")


def test_a_planned_teacher_not_trained_yet_is_pending_and_a_dry_run_gets_its_architecture(monkeypatch):
    """The gpu profile's teachers exist only once a GPU window trained them: until then `get_teacher` says so
    (TeacherPending, naming the profile to run), and a dry run builds random weights of the architecture the
    teachers' profile gives them, so that a paper's gpu grid can be costed before any teacher exists."""
    from attnrepro.pretrain import TeacherPending, get_teacher, planned_teachers
    plan = planned_teachers()
    assert plan["mae_cifar10_gpu"] == dict(profile="gpu", arch=dict(img_size=32, patch_size=4, embed_dim=192, depth=6,
                                                                      num_heads=3))
    assert plan["mae_cifar10_mini"]["profile"] == "mini"
    monkeypatch.setenv("ATTNREPRO_TEACHERS", "")
    monkeypatch.delenv("ATTNREPRO_TEACHER_URL", raising=False)
    with pytest.raises(TeacherPending, match=r"'mae_cifar10_gpu'.*profile 'gpu'.*not trained yet.*--paper teachers --profile gpu"):
        get_teacher("mae_cifar10_gpu")
    with pytest.raises(ValueError, match="Unknown teacher 'no_such_teacher'"):   # a typo is still an error
        get_teacher("no_such_teacher")
    monkeypatch.setenv("ATTNREPRO_DRY_RUN", "1")
    t = get_teacher("mae_cifar10_gpu")
    assert (t.patch_embed.img_size, t.embed_dim, len(t.blocks), t.num_classes) == ((32, 32), 192, 6, 0)
    assert t.teacher_cfg["sha256"] is None and "not trained yet" in t.teacher_cfg["source"]
