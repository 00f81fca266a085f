"Tests for attnrepro.train: learning, determinism, exact resume, NaN handling, schedules, extra modules, DDP."
import json, math, os, subprocess, sys, textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from attnrepro.core import config_hash, fit_notes
from attnrepro.losses import constant
from attnrepro.train import (CKPT_NAME, LARS, NonFiniteLossError, TrainConfig, cosine_lr, evaluate, fit, load_checkpoint,
                             max_device_batch, topk_correct)
from attnrepro.protocol import LossTerm, Method, assign_grads, ce_term, project_conflicting, term_grads
from attnrepro.verdicts import unpack_correct

ROOT = Path(__file__).resolve().parents[1]

# shared by the in-process tests and the subprocess scripts (the scripts exec this text)
TOY = '''
import torch
from torch.utils.data import TensorDataset
from timm.models.vision_transformer import VisionTransformer

def toy_data(n, seed=0, classes=4, noise=0.5):
    "Linearly separable 16x16 images: one fixed random template per class plus Gaussian noise."
    g = torch.Generator().manual_seed(seed)
    templates = torch.randn(classes, 3, 16, 16, generator=torch.Generator().manual_seed(123))
    y = torch.randint(0, classes, (n,), generator=g)
    return TensorDataset(templates[y] + noise * torch.randn(n, 3, 16, 16, generator=g), y)

def tiny_vit(seed=0, **kw):
    torch.manual_seed(seed)
    return VisionTransformer(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=4, **kw)
'''
exec(TOY)

FAST = dict(epochs=2, batch_size=16, lr=1e-3, warmup_epochs=0)


def _state(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _assert_same(a: dict, b: dict):
    assert a.keys() == b.keys()
    for k in a: assert torch.equal(a[k], b[k]), k


# --------------------------------------------------------------------------- pieces

def test_project_conflicting_golden():
    g_a, g_b = torch.tensor([2., 0., 1.]), torch.tensor([-1., 1., 0.])
    dot = -2.0  # by hand: g_a.g_b
    expect = g_a.numpy() - dot / 2.0 * g_b.numpy()
    out = project_conflicting(g_a, g_b)
    np.testing.assert_allclose(out.numpy(), expect, rtol=1e-6)
    assert abs(float(out @ g_b)) < 1e-6            # conflict removed
    assert torch.equal(project_conflicting(g_a, -g_b), g_a)  # no conflict: untouched


def test_cosine_lr_formula():
    lr, mn, E, W, S = 0.1, 1e-3, 10, 2, 5
    for step in [0, 3, 10, 25, 49]:
        t = step / S
        exp = lr * t / W if t < W else mn + (lr - mn) * 0.5 * (1 + math.cos(math.pi * (t - W) / (E - W)))
        assert math.isclose(cosine_lr(step, S, E, W, lr, mn), exp)


def test_lars_matches_mae_formula():
    torch.manual_seed(0)
    w = nn.Parameter(torch.randn(3, 4)); b = nn.Parameter(torch.randn(4))
    gw, gb = torch.randn(3, 4), torch.randn(4)
    w0, b0 = w.detach().clone(), b.detach().clone()
    w.grad, b.grad = gw.clone(), gb.clone()
    LARS([w, b], lr=0.5, weight_decay=0.1, momentum=0.9).step()
    dp = gw + 0.1 * w0
    q = 0.001 * w0.norm() / dp.norm()
    assert torch.allclose(w.detach(), w0 - 0.5 * q * dp)
    assert torch.allclose(b.detach(), b0 - 0.5 * gb)  # 1-D: no decay, no trust ratio


def test_topk_and_evaluate():
    logits = torch.tensor([[5., 1., 0.], [0., 1., 5.], [1., 5., 0.]])
    y = torch.tensor([0, 1, 1])
    assert topk_correct(logits, y, (1, 2, 5)) == [2, 3, 3]
    model = nn.Sequential(nn.Flatten(), nn.Identity())
    dl = DataLoader(TensorDataset(logits, y), batch_size=2)
    m = evaluate(model, dl)
    assert math.isclose(m["acc1"], 200 / 3) and m["acc5"] == 100 and m["n"] == 3
    assert math.isclose(m["loss"], F.cross_entropy(logits, y).item(), rel_tol=1e-6)


def test_evaluate_return_correct_in_loader_order():
    # argmax per row: 0, 2, 1, 3 against labels 0, 1, 1, 3 -> hits T, F, T, T
    logits = torch.tensor([[5., 1., 0., 0.], [0., 1., 5., 0.], [1., 5., 0., 0.], [0., 0., 1., 2.]])
    y = torch.tensor([0, 1, 1, 3])
    model = nn.Identity()
    m = evaluate(model, DataLoader(TensorDataset(logits, y), batch_size=3), return_correct=True)
    assert m["correct"].dtype == bool and m["correct"].tolist() == [True, False, True, True]
    assert m["acc1"] == 100 * m["correct"].mean() == 75 and m["n"] == 4
    assert "correct" not in evaluate(model, DataLoader(TensorDataset(logits, y), batch_size=3))   # default: metrics only
    shuffled = DataLoader(TensorDataset(logits, y), batch_size=2, shuffle=True)
    with pytest.raises(ValueError, match="RandomSampler shuffles.*shuffle=False"):
        evaluate(model, shuffled, return_correct=True)
    evaluate(model, shuffled)   # without hits the order does not matter
    with pytest.raises(ValueError, match="under DDP needs a loader over a ShardSampler"):
        evaluate(model, DataLoader(TensorDataset(logits, y), batch_size=2), distributed=True, return_correct=True)


def test_evaluate_sends_batches_to_the_models_device(monkeypatch):
    # 'meta' stands in for a GPU: by default the batches go where the model's parameters are
    # (torch.autocast refuses device_type 'meta' even when disabled; amp is off here, so stub it out)
    import contextlib
    monkeypatch.setattr(torch, "autocast", lambda *a, **k: contextlib.nullcontext())
    class _Stop(Exception): pass
    class Probe(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.zeros(1, device="meta"))
            self.seen = []
        def forward(self, x):
            self.seen.append(x.device.type)
            raise _Stop
    model = Probe()
    with pytest.raises(_Stop):
        evaluate(model, DataLoader(TensorDataset(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long)), batch_size=2))
    assert model.seen == ["meta"]


@pytest.mark.parametrize("kw,match", [
    (dict(optimizer="adam"), "valid: adamw, sgd, lars"),
    (dict(epochs=0), "epochs"),
    (dict(batch_size=2.5), "batch_size"),
    (dict(lr=0), "lr"),
    (dict(lr_scale_batch=0), "lr_scale_batch"),
    (dict(epochs=3, warmup_epochs=3), "warmup_epochs"),
    (dict(label_smoothing=1.0), "label_smoothing"),
    (dict(mixup=-1), "mixup"),
    (dict(mixup_prob=1.5), "mixup_prob"),
    (dict(ema_decay=1.0), "ema_decay"),
    (dict(grad_clip=0), "grad_clip"),
    (dict(betas=(0.9, 1.0)), "betas"),
    (dict(mixup=0.8, batch_size=15), "even"),
    (dict(accum_steps=0), r"TrainConfig\.accum_steps=0: must be an integer >= 1"),
    (dict(accum_steps=2.0), r"accum_steps=2\.0"),
    (dict(accum_steps=True), r"accum_steps=True"),
    (dict(layer_decay=0), r"TrainConfig\.layer_decay=0: must be None \(off\) or a number in \(0, 1\]"),
    (dict(layer_decay=1.5), r"layer_decay=1\.5"),
])
def test_bad_config(kw, match):
    with pytest.raises(ValueError, match=match): TrainConfig(**kw)


def test_bad_method():
    with pytest.raises(ValueError, match="duplicate"): Method([ce_term(), ce_term()])
    with pytest.raises(TypeError, match="valid hooks"): Method(befor_forward=lambda c: None)
    with pytest.raises(ValueError, match="identifier"): LossTerm("bad name", lambda c: 0)
    t = LossTerm("x", lambda c: 0, weight=lambda e: float("nan"))
    with pytest.raises(ValueError, match="non-finite weight"): t.weight_at(0)


def test_config_hash_stable():
    assert config_hash(TrainConfig(**FAST)) == config_hash(TrainConfig(**FAST))
    assert config_hash(TrainConfig(**FAST)) != config_hash(TrainConfig(**{**FAST, "seed": 1}))


# --------------------------------------------------------------------------- training

def test_learns_separable_data():
    res = fit(tiny_vit(), toy_data(96), toy_data(64, seed=1),
              TrainConfig(epochs=3, batch_size=16, lr=2e-3, warmup_epochs=1), progress=False)
    assert res["final"]["acc1"] > 70, res["history"]  # chance is 25
    assert res["best"]["acc1"] >= res["final"]["acc1"]
    assert res["steps"] == 3 * 6 and res["epochs"] == 3
    h = res["history"]
    assert h[-1]["loss"] < h[0]["loss"]
    assert res["n_params"] == sum(p.numel() for p in tiny_vit().parameters())
    assert res["cfg_hash"] == config_hash(TrainConfig(epochs=3, batch_size=16, lr=2e-3, warmup_epochs=1))
    json.dumps(res, allow_nan=False)
    # lr of the last step follows the cosine schedule
    assert math.isclose(h[-1]["lr"], cosine_lr(17, 6, 3, 1, 2e-3, 1e-6))


def test_progress_output(capsys):
    fit(tiny_vit(), toy_data(32), toy_data(16, seed=1), TrainConfig(**FAST), progress=True)
    err = capsys.readouterr()
    text = err.out + err.err
    assert "loss=" in text and "acc=" in text and "epoch 2/2" in text and "val_acc1=" in text
    fit(tiny_vit(), toy_data(32), toy_data(16, seed=1), TrainConfig(**FAST), progress=False)
    err = capsys.readouterr()
    assert err.out == "" and err.err == ""


def test_deterministic_same_seed():
    cfg = TrainConfig(**FAST, mixup=0.8, cutmix=1.0, label_smoothing=0.1, seed=3)
    states = []
    for _ in range(2):
        m = tiny_vit(drop_path_rate=0.1)
        np.random.seed(len(states)); torch.manual_seed(99 + len(states))  # global RNG before fit must not matter
        fit(m, toy_data(64), None, cfg, progress=False)
        states.append(_state(m))
    _assert_same(*states)
    m = tiny_vit(drop_path_rate=0.1)
    fit(m, toy_data(64), None, TrainConfig(**FAST, mixup=0.8, cutmix=1.0, label_smoothing=0.1, seed=4), progress=False)
    assert not torch.equal(_state(m)["head.weight"], states[0]["head.weight"])


def test_mixup_label_smoothing_ema_path():
    cfg = TrainConfig(epochs=2, batch_size=16, lr=1e-3, warmup_epochs=0.5, mixup=0.8, cutmix=1.0, mixup_prob=0.9,
                      label_smoothing=0.1, ema_decay=0.9, grad_clip=1.0)
    seen = []
    res = fit(tiny_vit(), toy_data(64), toy_data(32, seed=1), cfg, progress=False,
              method=Method(after_backward=lambda ctx: seen.append(ctx.target.is_floating_point())))
    assert all(seen) and len(seen) == 8  # soft targets every step
    for row in res["history"]:
        for k in ("loss", "loss_ce", "val_acc1", "val_ema_acc1", "val_ema_loss"):
            assert math.isfinite(row[k]), (k, row)
    # label smoothing alone goes to F.cross_entropy
    captured = []
    def ce_check(ctx):
        v = F.cross_entropy(ctx.logits, ctx.target, label_smoothing=0.2)
        captured.append(bool(ctx.target.dtype == torch.long))
        return v
    fit(tiny_vit(), toy_data(32), None, TrainConfig(**FAST, label_smoothing=0.2),
        method=Method([LossTerm("ce", ce_check)]), progress=False)
    assert all(captured)


@pytest.mark.parametrize("opt", ["sgd", "lars"])
def test_other_optimizers(opt):
    res = fit(tiny_vit(), toy_data(32), toy_data(16, seed=1), TrainConfig(**FAST, optimizer=opt), progress=False)
    assert math.isfinite(res["history"][-1]["loss"])


def test_dataloaders_and_custom_evaluate_fn():
    calls = []
    def evaluate_fn(model, loader, device):
        calls.append(len(loader.dataset))
        return {"acc1": 10.0 * len(calls), "custom": torch.tensor(3.0)}
    g = torch.Generator().manual_seed(0)
    train = DataLoader(toy_data(32), batch_size=8, shuffle=True, generator=g, drop_last=True)
    val = DataLoader(toy_data(16, seed=1), batch_size=8)
    res = fit(tiny_vit(), train, val, TrainConfig(epochs=3, batch_size=8, warmup_epochs=0, eval_every=2),
              evaluate_fn=evaluate_fn, progress=False)
    assert calls == [16, 16]                                   # epochs 2 and 3 (the last is always evaluated)
    assert "val_acc1" not in res["history"][0] and res["history"][1]["val_custom"] == 3.0
    assert res["best"] == {"acc1": 20.0, "custom": 3.0, "epoch": 2} and res["final"]["acc1"] == 20.0
    assert res["steps"] == 3 * 4


class Always0(nn.Module):
    "Predicts class 0 for every image (a trainable bias that gets no gradient keeps fit's optimiser happy)."
    num_classes = 4
    def __init__(self):
        super().__init__()
        self.b = nn.Parameter(torch.zeros(4))
    def forward(self, x):
        return torch.tensor([10., 0., 0., 0.]).expand(len(x), 4) + 0 * self.b


def test_fit_record_correct_follows_dataset_order(tmp_path):
    labels = torch.tensor([0, 1, 0, 0, 2, 3, 0, 1, 1, 0, 3, 2, 0])   # 6 of 13 are class 0; not a multiple of the batch
    val = TensorDataset(torch.zeros(len(labels), 3, 16, 16), labels)
    cfg = TrainConfig(epochs=2, batch_size=4, lr=1e-3, warmup_epochs=0)
    res = fit(Always0(), toy_data(16), val, cfg, ckpt_dir=tmp_path, progress=False, record_correct=True)
    hits = unpack_correct(res["final"]["correct"])
    assert hits.tolist() == (labels == 0).tolist()                   # hit i is image i of the dataset
    assert math.isclose(100 * hits.mean(), res["final"]["acc1"]) and math.isclose(res["final"]["acc1"], 600 / 13)
    json.loads(json.dumps(res, allow_nan=False))
    assert "correct" not in res["history"][-1] and "correct" not in load_checkpoint(tmp_path / CKPT_NAME)["history"][-1]
    # a finished run read back from its checkpoint is scored again: the same hits
    again = fit(Always0(), toy_data(16), val, cfg, ckpt_dir=tmp_path, progress=False, record_correct=True)
    assert again["resumed_from_epoch"] == 2 and again["final"]["correct"] == res["final"]["correct"]


def test_fit_record_correct_changes_nothing_else():
    """Recording the hits trains and scores the same run: the result equals the default one plus final['correct'];
    the default leaves the result as it was (no 'correct' key)."""
    strip = lambda r: {k: v for k, v in r.items() if k != "wall_time_s"} | {
        "history": [{k: v for k, v in row.items() if k != "epoch_time_s"} for row in r["history"]]}
    cfg = TrainConfig(**FAST, seed=2)
    plain = fit(tiny_vit(), toy_data(32), toy_data(24, seed=1), cfg, progress=False)
    rec = fit(tiny_vit(), toy_data(32), toy_data(24, seed=1), cfg, progress=False, record_correct=True)
    assert "correct" not in plain["final"] and "correct" not in plain["best"]
    hits = unpack_correct(rec["final"].pop("correct"))
    assert strip(rec) == strip(plain) and len(hits) == 24
    assert math.isclose(100 * hits.mean(), plain["final"]["acc1"])


def test_fit_record_correct_refusals():
    cfg = TrainConfig(**FAST)
    with pytest.raises(ValueError, match="needs val_data and the built-in evaluation"):
        fit(tiny_vit(), toy_data(32), None, cfg, progress=False, record_correct=True)
    with pytest.raises(ValueError, match="needs val_data and the built-in evaluation"):
        fit(tiny_vit(), toy_data(32), toy_data(16, seed=1), cfg, progress=False, record_correct=True,
            evaluate_fn=lambda m, dl, d: {"acc1": 1.0})
    shuffled = DataLoader(toy_data(16, seed=1), batch_size=8, shuffle=True)
    with pytest.raises(ValueError, match="shuffles"):
        fit(tiny_vit(), toy_data(32), shuffled, cfg, progress=False, record_correct=True)


def test_nan_stops_naming_term():
    def bad(ctx):  # NaN at global step 5 = epoch 1, step 1 (4 steps per epoch)
        return ctx.logits.sum() * 0 + (float("nan") if ctx.step == 5 else 0.0)
    m = Method([ce_term(), LossTerm("bad_term", bad, 0.3)])
    with pytest.raises(NonFiniteLossError, match=r"epoch 1 .*step 1 .*'bad_term' = nan \(weight 0.3\)"):
        fit(tiny_vit(), toy_data(64), None, TrainConfig(epochs=3, batch_size=16, warmup_epochs=0),
            method=m, progress=False)


def test_schedule_applied_per_epoch():
    sched = lambda e: 2.0 * 0.5 ** e
    vals = []
    def aux(ctx):
        vals.append((ctx.epoch, ctx.weights["aux"]))
        return ctx.logits.pow(2).mean()
    m = Method([ce_term(constant(1.0)), LossTerm("aux", aux, sched)])
    res = fit(tiny_vit(), toy_data(32), None, TrainConfig(epochs=3, batch_size=16, warmup_epochs=0),
              method=m, progress=False)
    h = res["history"]
    assert [r["weight_aux"] for r in h] == [2.0, 1.0, 0.5]
    assert [r["weight_ce"] for r in h] == [1.0, 1.0, 1.0]
    assert all(w == sched(e) for e, w in vals)
    for r in h:  # the logged total is the weighted sum of the logged terms
        assert math.isclose(r["loss"], r["weight_ce"] * r["loss_ce"] + r["weight_aux"] * r["loss_aux"], rel_tol=1e-9)


class _Projector(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 8)
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))
    def forward(self, x):
        if self.training: self.calls += 1
        return self.fc(x)


def test_extra_module_trained_and_checkpointed(tmp_path):
    proj = _Projector()
    w0 = proj.fc.weight.detach().clone()
    grads = []
    def term(ctx): return ctx.modules["proj"](ctx.logits).pow(2).mean()
    def after_backward(ctx): grads.append(proj.fc.weight.grad.abs().sum().item())
    m = Method([ce_term(), LossTerm("proj", term, 0.5)], name="with_proj", extra_modules={"proj": proj},
               after_backward=after_backward,
               on_epoch_end=lambda ctx: {"proj_norm": ctx.modules["proj"].fc.weight.norm().item()})
    res = fit(tiny_vit(), toy_data(32), None, TrainConfig(**FAST), method=m, ckpt_dir=tmp_path, progress=False)
    assert len(grads) == 4 and all(g > 0 for g in grads)
    assert not torch.equal(proj.fc.weight, w0)
    assert res["n_params_extra"] == 4 * 8 + 8
    ck = load_checkpoint(tmp_path / CKPT_NAME)
    _assert_same(ck["extra"]["proj"], proj.state_dict())
    assert int(ck["extra"]["proj"]["calls"]) == 4 and ck["epoch"] == 2
    assert "proj_norm" in res["history"][-1]
    assert len(ck["optimizer"]["state"]) == sum(1 for _ in tiny_vit().parameters()) + 2  # adam state for all


def test_frozen_module_moved_with_the_model_never_optimised_nor_checkpointed(tmp_path):
    class Teacher(nn.Linear):   # records where fit sends it (a GPU run sends it to the student's device)
        def to(self, *a, **k):
            self.sent_to = a
            return super().to(*a, **k)
    teacher = Teacher(3 * 16 * 16, 4).requires_grad_(False)
    w0 = teacher.weight.detach().clone()
    def before_forward(ctx):
        with torch.no_grad(): ctx.teacher_logits = teacher(ctx.x.flatten(1))
    kd = LossTerm("kd", lambda ctx: F.mse_loss(ctx.logits, ctx.teacher_logits))
    m = Method([ce_term(), kd], name="kd", frozen_modules={"teacher": teacher}, before_forward=before_forward)
    res = fit(tiny_vit(), toy_data(32), None, TrainConfig(**FAST), method=m, ckpt_dir=tmp_path, progress=False,
              device="cpu")
    assert teacher.sent_to == (torch.device("cpu"),) and torch.equal(teacher.weight, w0)
    assert res["n_params_extra"] == 0 and load_checkpoint(tmp_path / CKPT_NAME)["extra"] == {}
    with pytest.raises(TypeError, match="frozen module 'teacher' is not an nn.Module"):
        Method(frozen_modules={"teacher": lambda x: x})


def test_shared_params_optimised_once():
    model = tiny_vit()
    agent = nn.Sequential(model.patch_embed.proj, nn.Flatten(), nn.LazyLinear(4))  # shares the patch conv
    agent(torch.zeros(1, 3, 16, 16))
    m = Method([ce_term(), LossTerm("agent", lambda ctx: F.cross_entropy(ctx.modules["agent"](ctx.x), ctx.y))],
               extra_modules={"agent": agent})
    res = fit(model, toy_data(32), None, TrainConfig(**FAST), method=m, progress=False)
    assert res["n_params_extra"] == agent[2].weight.numel() + 4


def test_gradient_surgery_hook():
    seen = []
    def backward(ctx):
        shared = list(ctx.model.blocks.parameters())
        g_a, g_b = term_grads(ctx, ["ce"], shared), term_grads(ctx, ["aux"], shared)
        ctx.loss.backward()
        assign_grads(shared, g_a + project_conflicting(g_b, g_a))
        flat = torch.cat([p.grad.reshape(-1) for p in shared])
        seen.append((torch.dot(g_a, g_b).item(), torch.allclose(flat, g_a + project_conflicting(g_b, g_a))))
    m = Method([ce_term(), LossTerm("aux", lambda ctx: -0.5 * F.cross_entropy(ctx.logits, ctx.y))], backward=backward)
    fit(tiny_vit(), toy_data(32), None, TrainConfig(**FAST), method=m, progress=False)
    assert len(seen) == 4 and all(ok for _, ok in seen) and any(d < 0 for d, _ in seen)


def test_corrupt_checkpoint_error(tmp_path):
    (tmp_path / CKPT_NAME).write_bytes(b"not a checkpoint")
    with pytest.raises(RuntimeError, match=rf"(?s){CKPT_NAME} is corrupt.*rm "):
        fit(tiny_vit(), toy_data(32), None, TrainConfig(**FAST), ckpt_dir=tmp_path, progress=False)


def test_completed_run_reloads_and_other_config_refused(tmp_path):
    m1 = tiny_vit()
    r1 = fit(m1, toy_data(32), toy_data(16, seed=1), TrainConfig(**FAST), ckpt_dir=tmp_path, progress=False)
    m2 = tiny_vit(seed=5)
    with fit_notes() as notes:   # the reloaded run tells a surrounding PaperRun the time it had taken
        r2 = fit(m2, toy_data(32), toy_data(16, seed=1), TrainConfig(**FAST), ckpt_dir=tmp_path, progress=False)
    assert [n["resumed_s"] for n in notes if "resumed_s" in n] == [r1["wall_time_s"]]
    assert r2["wall_time_s"] == r1["wall_time_s"]
    _assert_same(_state(m1), _state(m2))   # finished run: final weights loaded, nothing retrained
    assert r2["history"] == r1["history"] and r2["steps"] == r1["steps"] and r2["resumed_from_epoch"] == 2
    with pytest.raises(RuntimeError, match="another run"):
        fit(tiny_vit(), toy_data(32), None, TrainConfig(**{**FAST, "lr": 2e-3}), ckpt_dir=tmp_path, progress=False)


# --------------------------------------------------------------------------- gradient accumulation, amp, hashes

def _sgd_fit(model, train, batch_size, accum_steps, ckpt_dir=None, method=None, **kw):
    "One epoch of plain SGD (the update is lr x gradient, so a wrongly scaled gradient shows in the weights)."
    cfg = TrainConfig(epochs=1, batch_size=batch_size, accum_steps=accum_steps, lr=0.1, warmup_epochs=0,
                      optimizer="sgd", momentum=0.9, weight_decay=0.05, **kw)
    return fit(model, train, None, cfg, method=method, ckpt_dir=ckpt_dir, progress=False)


def _identity_surgery(ctx):
    "A custom backward that overwrites the blocks' grads (as gradient surgery does) with their own CE gradient."
    shared = list(ctx.model.blocks.parameters())
    g = term_grads(ctx, ["ce"], shared)
    ctx.loss.backward()
    assign_grads(shared, g)


@pytest.mark.parametrize("backward", [None, _identity_surgery], ids=["plain", "custom_backward"])
def test_accumulation_equals_one_big_batch(tmp_path, backward):
    """4 accumulated batches of 8 give the optimiser steps (and the EMA) of batches of 32 on the same images, for a
    model without batch-dependent layers; a custom backward that overwrites `.grad` still accumulates."""
    hooks = {} if backward is None else {"backward": backward}
    # the same 96 images in the same (seeded) order either way; 3 steps, as timm's EMA copies the model at step 1
    data = toy_data(96)
    init = _state(tiny_vit())
    big, acc = tiny_vit(), tiny_vit()
    r_big = _sgd_fit(big, data, 32, 1, tmp_path / "big", Method(**hooks), ema_decay=0.5)
    r_acc = _sgd_fit(acc, data, 8, 4, tmp_path / "acc", Method(**hooks), ema_decay=0.5)
    assert r_big["steps"] == r_acc["steps"] == 3 and r_big["history"][0]["lr"] == r_acc["history"][0]["lr"]
    moved = max((big.state_dict()[k] - init[k]).abs().max().item() for k in init)
    assert moved > 1e-3   # the step is large against the tolerance below (a 4x gradient would not pass)
    for k, v in big.state_dict().items(): assert torch.allclose(acc.state_dict()[k], v, rtol=1e-5, atol=1e-6), k
    e_big, e_acc = (load_checkpoint(tmp_path / d / CKPT_NAME)["ema"] for d in ("big", "acc"))
    for k, v in e_big.items(): assert torch.allclose(e_acc[k], v, rtol=1e-5, atol=1e-6), k   # an update per step


def test_accumulation_short_last_group_and_schedule():
    """6 batches with accum_steps=4: groups of 4 and 2, each stepped as the mean over its own images (= batches of 32
    and 16), two optimiser steps per epoch for the lr schedule; hooks see the group position, after_step runs per step."""
    data = toy_data(48)
    seen, stepped = [], []
    m = Method(before_forward=lambda ctx: seen.append((ctx.micro, ctx.n_micro, ctx.step)),
               after_step=lambda ctx: stepped.append(ctx.step))
    acc, ref = tiny_vit(), tiny_vit()
    r_acc = _sgd_fit(acc, DataLoader(data, batch_size=8), 8, 4, method=m)
    r_ref = _sgd_fit(ref, DataLoader(data, batch_sampler=[list(range(32)), list(range(32, 48))]), 32, 1)
    assert seen == [(0, 4, 0), (1, 4, 0), (2, 4, 0), (3, 4, 0), (0, 2, 1), (1, 2, 1)] and stepped == [0, 1]
    assert r_acc["steps"] == r_ref["steps"] == 2
    # the lr of the last step: the schedule counts 2 optimiser steps per epoch, not 6 batches
    assert r_acc["history"][0]["lr"] == r_ref["history"][0]["lr"] == cosine_lr(1, 2, 1, 0.0, 0.1, 1e-6)
    for k, v in ref.state_dict().items(): assert torch.allclose(acc.state_dict()[k], v, rtol=1e-5, atol=1e-6), k


def test_max_device_batch_splits_the_step_into_micro_batches(monkeypatch, tmp_path):
    "A cap on images per process at once: the fewest micro-batches that fit, even under Mixup; same images per step and lr."
    g = TrainConfig(global_batch_size=64, lr=1e-3, lr_scale_batch=256)
    assert (g.per_process(1, 16).batch_size, g.per_process(1, 16).accum_steps) == (16, 4)
    assert (g.per_process(2, 16).batch_size, g.per_process(2, 16).accum_steps) == (16, 2)
    assert g.per_process(1, 64) == g.per_process(1) and g.per_process(1, 16).effective_lr() == g.per_process(1).effective_lr()
    assert (lambda c: (c.batch_size, c.accum_steps))(TrainConfig(batch_size=24).per_process(1, 10)) == (8, 3)
    assert (lambda c: (c.batch_size, c.accum_steps))(TrainConfig(batch_size=6, mixup=0.8).per_process(1, 4)) == (2, 3)
    assert (lambda c: (c.batch_size, c.accum_steps))(TrainConfig(batch_size=12, accum_steps=2).per_process(1, 5)) == (4, 6)
    with pytest.raises(ValueError, match="max_batch=1 must be an integer >= 2"):
        TrainConfig(batch_size=6, mixup=0.8).per_process(1, 1)
    assert (lambda c: (c.batch_size, c.accum_steps))(TrainConfig(batch_size=10, mixup=0.8).per_process(1, 3)) == (2, 5)
    monkeypatch.setenv("ATTNREPRO_MAX_DEVICE_BATCH", "lots")
    with pytest.raises(ValueError, match="ATTNREPRO_MAX_DEVICE_BATCH='lots' must be an integer >= 1"):
        max_device_batch()
    # fit under the cap trains exactly as the recipe written with those micro-batches
    monkeypatch.setenv("ATTNREPRO_MAX_DEVICE_BATCH", "8")
    a, b = tiny_vit(), tiny_vit()
    capped = _sgd_fit(a, toy_data(96), 32, 1, tmp_path / "capped")
    monkeypatch.delenv("ATTNREPRO_MAX_DEVICE_BATCH")
    explicit = _sgd_fit(b, toy_data(96), 8, 4, tmp_path / "explicit")
    assert (capped["accum_steps"], capped["global_batch"], capped["steps"]) == (4, 32, 3)
    assert capped["history"][0]["loss"] == explicit["history"][0]["loss"]
    for k, v in a.state_dict().items(): assert torch.equal(b.state_dict()[k], v), k


def test_accumulation_result_fields_and_lr_scaling():
    "The run records how its batch was made; lr_scale_batch scales by the global batch, accumulation included."
    cfg = TrainConfig(epochs=1, batch_size=8, accum_steps=3, lr=1e-3, lr_scale_batch=64, warmup_epochs=0, amp=True)
    res = fit(tiny_vit(), toy_data(48), toy_data(16, seed=1), cfg, progress=False)   # amp on the CPU: bf16 autocast
    assert (res["global_batch"], res["accum_steps"], res["world_size"]) == (24, 3, 1)
    assert res["lr_effective"] == cfg.effective_lr() == 1e-3 * 24 / 64 and res["amp_dtype"] == "bfloat16"
    assert res["steps"] == 2 and res["cfg"]["accum_steps"] == 3 and math.isfinite(res["final"]["acc1"])
    json.dumps(res, allow_nan=False)
    plain = fit(tiny_vit(), toy_data(32), None, TrainConfig(**FAST), progress=False)
    assert (plain["global_batch"], plain["accum_steps"], plain["amp_dtype"]) == (16, 1, None)
    assert plain["lr_effective"] == FAST["lr"] and "accum_steps" not in plain["cfg"]   # default: not in the hashed cfg
    assert TrainConfig(batch_size=8, accum_steps=3, lr=1e-3, lr_scale_batch=64).effective_lr(world_size=2) == \
        1e-3 * 8 * 2 * 3 / 64


# the `train` dict of a committed run (outputs/aal/runs/010adbc0a9f507e0.json) and the hash its TrainConfig had
# before accum_steps existed (commit 6bb20ac): what fit stored in checkpoints and results as cfg_hash
GOLDEN_TRAIN = {"batch_size": 64, "epochs": 10, "eval_every": 10, "lr": 0.001, "min_lr": 1e-05, "seed": 3,
                "warmup_epochs": 1.0, "weight_decay": 0.05}
GOLDEN_TRAIN_HASH = "199d66ab7255f6c3"


def test_accum_steps_at_default_leaves_hashes_alone():
    import dataclasses
    cfg = TrainConfig(**GOLDEN_TRAIN)
    assert config_hash(cfg) == GOLDEN_TRAIN_HASH
    assert config_hash(cfg) == config_hash({k: v for k, v in dataclasses.asdict(cfg).items()
                                              if k not in ("accum_steps", "layer_decay", "global_batch_size")})   # hash-neutral at default
    assert config_hash(dataclasses.replace(cfg, accum_steps=2)) != GOLDEN_TRAIN_HASH   # a real change still counts
    run = ROOT / "outputs" / "aal" / "runs" / "010adbc0a9f507e0.json"
    if run.exists():   # the committed record itself: its config still hashes to its name
        rec = json.loads(run.read_text())
        assert rec["config"]["train"] == GOLDEN_TRAIN and config_hash(rec["config"]) == rec["hash"] == run.stem


def test_global_batch_size_splits_over_processes():
    import dataclasses
    cfg = TrainConfig(**FAST, global_batch_size=32, accum_steps=2)
    assert cfg.per_process(1).batch_size == 16 and cfg.per_process(2).batch_size == 8 and cfg.per_process(4).batch_size == 4
    assert cfg.per_process(2).global_batch(2) == 32 and TrainConfig(**FAST).per_process(8) == TrainConfig(**FAST)
    with pytest.raises(ValueError, match=r"global_batch_size=32 does not split over 3 process\(es\) x accum_steps=2"):
        cfg.per_process(3)
    with pytest.raises(ValueError, match="divisible by accum_steps=2"):
        TrainConfig(**FAST, global_batch_size=33, accum_steps=2)
    base = TrainConfig(**GOLDEN_TRAIN)
    assert config_hash(base) == GOLDEN_TRAIN_HASH != config_hash(dataclasses.replace(base, global_batch_size=64))
    # fit trains with the derived per-process batch: 64 images at a global batch of 32 = 2 steps per epoch
    res = fit(tiny_vit(), toy_data(64), None, TrainConfig(epochs=1, batch_size=7, global_batch_size=32, lr=1e-3,
                                                          warmup_epochs=0), progress=False)
    assert res["steps"] == 2 and res["global_batch"] == 32


def test_layer_decay_at_default_leaves_hashes_alone():
    import dataclasses
    cfg = TrainConfig(**GOLDEN_TRAIN)
    assert cfg.layer_decay is None and config_hash(cfg) == GOLDEN_TRAIN_HASH
    assert config_hash(dataclasses.replace(cfg, layer_decay=0.75)) != GOLDEN_TRAIN_HASH


def test_layer_decay_scales_lr_per_block_as_mae():
    "MAE / BEiT layer-wise decay: block i of L at d ** (L - i), embeddings at d ** (L + 1), head at 1; fit applies it."
    from attnrepro.train import build_optimizer
    d, model, head = 0.5, tiny_vit(), nn.Linear(4, 4)   # head: a method's extra module (no group_matcher)
    opt = build_optimizer(TrainConfig(**FAST, layer_decay=d), {"model": model, "extra": head})
    scale = {id(p): g.get("lr_scale", 1.0) for g in opt.param_groups for p in g["params"]}
    names = dict(model.named_parameters())
    assert len(scale) == sum(1 for _ in model.parameters()) + 2   # every trainable param once
    L = len(model.blocks)
    for n, p in names.items():
        want = (d ** (L + 1) if n in ("cls_token", "pos_embed") or n.startswith("patch_embed")
                else d ** (L - int(n.split(".")[1])) if n.startswith("blocks.")
                else d ** 1 if n.startswith("norm.")   # timm groups the final norm with the last block
                else 1.0)
        assert scale[id(p)] == pytest.approx(want), n
    assert all(scale[id(p)] == 1.0 for p in head.parameters())
    wd = {id(p): g["weight_decay"] for g in opt.param_groups for p in g["params"]}
    assert wd[id(names["pos_embed"])] == 0 and wd[id(names["blocks.0.norm1.weight"])] == 0
    assert wd[id(names["blocks.0.attn.qkv.weight"])] == FAST.get("weight_decay", 0.05)
    # fit multiplies the scheduled lr by each group's scale: one plain SGD step (constant lr) moves each param by
    # lr x its scale x its gradient
    import copy
    data = toy_data(16)
    x, y = data.tensors
    ref = copy.deepcopy(model)
    F.cross_entropy(ref(x), y).backward()
    fit(model, data, toy_data(16, seed=1), TrainConfig(epochs=1, batch_size=16, lr=0.1, min_lr=0.1, warmup_epochs=0,
        optimizer="sgd", momentum=0.0, weight_decay=0.0, layer_decay=d), progress=False)
    for n, p in dict(ref.named_parameters()).items():
        step = (p.detach() - names[n].detach())
        torch.testing.assert_close(step, 0.1 * scale[id(names[n])] * p.grad, rtol=1e-3, atol=1e-7, msg=n)


def test_layer_decay_reaches_attention_copy_student():
    "Attention Copy's CopyModel has no group_matcher of its own: its student's blocks still get MAE's per-block scales."
    from attnrepro.train import build_optimizer
    from attnrepro.transfer import CopyModel
    d, student, teacher = 0.75, tiny_vit(), tiny_vit()
    copy_model = CopyModel(student, teacher)
    opt = build_optimizer(TrainConfig(**FAST, layer_decay=d), {"model": copy_model})
    scale = {id(p): g.get("lr_scale", 1.0) for g in opt.param_groups for p in g["params"]}
    L = len(student.blocks)
    assert len(scale) == sum(p.requires_grad for p in copy_model.parameters())   # the frozen teacher: no group
    for i in range(L):
        assert scale[id(student.blocks[i].attn.qkv.weight)] == pytest.approx(d ** (L - i)), i
    assert scale[id(student.patch_embed.proj.weight)] == pytest.approx(d ** (L + 1))
    assert scale[id(student.head.weight)] == 1.0
    assert len({round(s, 6) for s in scale.values()}) == L + 2   # the blocks, the embeddings and the head differ


# --------------------------------------------------------------------------- subprocesses

RESUME_SCRIPT = TOY + '''
import os, sys, json
import torch, torch.nn as nn, torch.nn.functional as F
torch.set_num_threads(1)
from attnrepro.train import fit, TrainConfig
from attnrepro.protocol import Method, LossTerm, ce_term

ckpt_dir, out, stop_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
model = tiny_vit(drop_path_rate=0.1)
torch.manual_seed(1); proj = nn.Linear(4, 4)
def on_epoch_end(ctx):
    ctx.state["seen"] = ctx.state.get("seen", 0) + 1
    if ctx.epoch == stop_at: os._exit(3)   # a hard kill: this epoch's checkpoint is never written
    return {"seen": ctx.state["seen"]}
method = Method([ce_term(), LossTerm("proj", lambda c: F.cross_entropy(c.modules["proj"](c.logits), c.y),
                                     lambda e: 0.5 ** e)], name="resume_test", extra_modules={"proj": proj},
                on_epoch_end=on_epoch_end)
cfg = TrainConfig(epochs=4, batch_size=16, lr=1e-3, warmup_epochs=1, mixup=0.8, cutmix=1.0, label_smoothing=0.1,
                  ema_decay=0.9, seed=7)
res = fit(model, toy_data(64), toy_data(32, seed=1), cfg, method=method, ckpt_dir=ckpt_dir, progress=False)
torch.save({"model": model.state_dict(), "proj": proj.state_dict()}, out + ".pt")
json.dump(res, open(out + ".json", "w"))
'''


def _run(args, timeout=120, **kw):
    "Run in a new process group, killed whole on timeout (torchrun's workers must not outlive the test)."
    import signal
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env,
                          start_new_session=True, **kw) as p:
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, err = p.communicate()
            raise AssertionError(f"{args[0]} timed out after {timeout} s:\n{out[-2000:]}\n{err[-2000:]}")
    return subprocess.CompletedProcess(args, p.returncode, out, err)


@pytest.mark.slow
def test_resume_after_kill_is_exact(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(RESUME_SCRIPT)
    py = sys.executable
    # uninterrupted reference and a run killed after 2 epochs, in one fresh process each
    a = _run([py, str(script), str(tmp_path / "a"), str(tmp_path / "a_out"), "-1"])
    assert a.returncode == 0, a.stderr
    k = _run([py, str(script), str(tmp_path / "b"), str(tmp_path / "b_out"), "2"])
    assert k.returncode == 3, k.stderr
    assert load_checkpoint(tmp_path / "b" / CKPT_NAME)["epoch"] == 2
    r = _run([py, str(script), str(tmp_path / "b"), str(tmp_path / "b_out"), "-1"])  # resume in a new process
    assert r.returncode == 0, r.stderr
    sa, sb = torch.load(tmp_path / "a_out.pt"), torch.load(tmp_path / "b_out.pt")
    _assert_same(sa["model"], sb["model"]); _assert_same(sa["proj"], sb["proj"])
    ea, eb = load_checkpoint(tmp_path / "a" / CKPT_NAME), load_checkpoint(tmp_path / "b" / CKPT_NAME)
    _assert_same(ea["ema"], eb["ema"])
    ra, rb = json.loads((tmp_path / "a_out.json").read_text()), json.loads((tmp_path / "b_out.json").read_text())
    assert rb["resumed_from_epoch"] == 2 and ra["resumed_from_epoch"] is None
    strip = lambda h: [{k: v for k, v in row.items() if k != "epoch_time_s"} for row in h]
    assert strip(ra["history"]) == strip(rb["history"])   # same losses, lr, accuracies, method state
    assert [row["seen"] for row in rb["history"]] == [1, 2, 3, 4]
    assert ra["final"] == rb["final"] and ra["steps"] == rb["steps"] == 4 * 4


MID_EPOCH_SCRIPT = TOY + '''
import os, sys, json
import torch, torch.nn.functional as F
torch.set_num_threads(1)
from attnrepro.train import fit, TrainConfig
from attnrepro.protocol import Method, ce_term

ckpt_dir, out, kill_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
accum, n = (int(a) for a in sys.argv[4:6]) if len(sys.argv) > 4 else (1, 64)
model = tiny_vit(drop_path_rate=0.1)
batches = [0]
def before_forward(ctx):
    batches[0] += 1
    if batches[0] == kill_at: os._exit(3)   # a hard kill inside an epoch, before this batch's forward
method = Method([ce_term()], name="mid_epoch", before_forward=before_forward)
cfg = TrainConfig(epochs=3, batch_size=16, lr=1e-3, warmup_epochs=1, mixup=0.8, cutmix=1.0, label_smoothing=0.1, seed=3,
                  accum_steps=accum)
train = toy_data(n)
if os.environ.get("TOY_AS_ARRAY"):   # uint8 images + the 'weak' preset: fit's batched augmentation path
    from attnrepro.data import ArrayImageDataset, train_transform
    u8 = ((train.tensors[0].clamp(-2, 2) + 2) / 4 * 255).round().byte().permute(0, 2, 3, 1).numpy()
    train = ArrayImageDataset(u8, train.tensors[1].tolist(), list(range(4)), train_transform("weak", 16))
res = fit(model, train, toy_data(32, seed=1), cfg, method=method, ckpt_dir=ckpt_dir, progress=False,
          ckpt_interval_s=0)   # checkpoint after every optimiser step
torch.save(model.state_dict(), out + ".pt")
json.dump(res, open(out + ".json", "w"))
'''


@pytest.mark.slow
def test_mid_epoch_checkpoint_resumes_exactly(tmp_path):
    """Killed inside an epoch, a run resumes from the last step's checkpoint (not the epoch start) and ends with the
    same weights, history and accuracy as an uninterrupted run."""
    script = tmp_path / "run.py"
    script.write_text(MID_EPOCH_SCRIPT)
    py = sys.executable
    a = _run([py, str(script), str(tmp_path / "a"), str(tmp_path / "a_out"), "-1"])
    assert a.returncode == 0, a.stderr
    k = _run([py, str(script), str(tmp_path / "b"), str(tmp_path / "b_out"), "7"])   # batch 7 = epoch 1, batch 3 of 4
    assert k.returncode == 3, k.stderr
    ck = load_checkpoint(tmp_path / "b" / CKPT_NAME)
    assert (ck["epoch"], ck["it"], ck["step"]) == (1, 2, 6)   # written inside epoch 1, after its second batch
    r = _run([py, str(script), str(tmp_path / "b"), str(tmp_path / "b_out"), "-1"])
    assert r.returncode == 0, r.stderr
    _assert_same(torch.load(tmp_path / "a_out.pt"), torch.load(tmp_path / "b_out.pt"))
    ra, rb = json.loads((tmp_path / "a_out.json").read_text()), json.loads((tmp_path / "b_out.json").read_text())
    strip = lambda h: [{k: v for k, v in row.items() if k != "epoch_time_s"} for row in h]
    assert strip(ra["history"]) == strip(rb["history"]) and ra["final"] == rb["final"] and rb["steps"] == 12


@pytest.mark.slow
def test_mid_epoch_resume_with_batched_augmentation_is_exact(tmp_path, monkeypatch):
    "The batched augmentation path (BatchAugmentLoader) resumes inside an epoch as exactly as the per-image one."
    monkeypatch.setenv("TOY_AS_ARRAY", "1")
    monkeypatch.setenv("ATTNREPRO_BATCH_AUGMENT", "1")
    script = tmp_path / "run.py"
    script.write_text(MID_EPOCH_SCRIPT)
    py = sys.executable
    a = _run([py, str(script), str(tmp_path / "a"), str(tmp_path / "a_out"), "-1"])
    assert a.returncode == 0, a.stderr
    assert _run([py, str(script), str(tmp_path / "b"), str(tmp_path / "b_out"), "7"]).returncode == 3
    r = _run([py, str(script), str(tmp_path / "b"), str(tmp_path / "b_out"), "-1"])
    assert r.returncode == 0, r.stderr
    _assert_same(torch.load(tmp_path / "a_out.pt"), torch.load(tmp_path / "b_out.pt"))
    ra, rb = json.loads((tmp_path / "a_out.json").read_text()), json.loads((tmp_path / "b_out.json").read_text())
    strip = lambda h: [{k: v for k, v in row.items() if k != "epoch_time_s"} for row in h]
    assert ra["augment_batched"] and strip(ra["history"]) == strip(rb["history"]) and ra["final"] == rb["final"]


def test_batch_augment_equals_torchvision_per_image():
    "Each image of a batched 'weak' augmentation is torchvision's reflect-padded crop (+ flip) of it, normalised."
    import torchvision.transforms.functional as TF
    from PIL import Image
    from attnrepro.data import IMAGENET_MEAN, IMAGENET_STD, ArrayImageDataset, train_transform
    from attnrepro.train import BatchAugmentLoader
    rng = np.random.default_rng(0)
    u8 = rng.integers(0, 256, (6, 32, 32, 3), dtype=np.uint8)
    ds = ArrayImageDataset(u8, [0, 1, 2, 3, 4, 5], list(range(6)), train_transform("weak", 32))
    sub = torch.utils.data.Subset(torch.utils.data.Subset(ds, [5, 4, 3, 2, 1]), [0, 2, 4])   # images 5, 3, 1
    loader = BatchAugmentLoader(sub, 3, torch.utils.data.SequentialSampler(sub), False, torch.device("cpu"))
    offsets, flips = torch.tensor([[0, 8], [3, 1], [8, 0]]), torch.tensor([True, False, True])
    out = loader.augment(loader.images, offsets, flips)
    for k, (i, (top, left), flip) in enumerate(zip([5, 3, 1], offsets.tolist(), flips.tolist())):
        img = TF.crop(TF.pad(Image.fromarray(u8[i]), 4, padding_mode="reflect"), top, left, 32, 32)
        ref = TF.normalize(TF.to_tensor(TF.hflip(img) if flip else img), IMAGENET_MEAN, IMAGENET_STD)
        assert torch.allclose(out[k], ref, atol=1e-5), k
    assert loader.targets.tolist() == [5, 3, 1] and len(loader) == 1
    torch.manual_seed(0)
    x, y = next(iter(loader))
    assert x.shape == (3, 3, 32, 32) and x.dtype == torch.float32 and y.tolist() == [5, 3, 1]
    with pytest.raises(ValueError, match="train_transform"):   # 'strong' (RandAugment) has no batched form
        BatchAugmentLoader(ArrayImageDataset(u8, [0] * 6, [0], train_transform("strong", 32)), 2,
                           torch.utils.data.SequentialSampler(range(6)), False, torch.device("cpu"))


def test_fit_uses_batched_augmentation_where_asked(monkeypatch, tmp_path):
    "ATTNREPRO_BATCH_AUGMENT: off by default on the CPU, on when asked (if the data allows), a bad value named."
    from attnrepro.data import ArrayImageDataset, train_transform
    from attnrepro.train import batch_augment_mode
    u8 = np.random.default_rng(0).integers(0, 256, (32, 16, 16, 3), dtype=np.uint8)
    ds = ArrayImageDataset(u8, [i % 4 for i in range(32)], list(range(4)), train_transform("weak", 16))
    cfg = TrainConfig(epochs=1, batch_size=8, lr=1e-3, warmup_epochs=0)
    run = lambda data: fit(tiny_vit(), data, None, cfg, progress=False)
    assert not run(ds)["augment_batched"]
    monkeypatch.setenv("ATTNREPRO_BATCH_AUGMENT", "1")
    res = run(torch.utils.data.Subset(ds, range(24)))
    assert res["augment_batched"] and res["steps"] == 3 and math.isfinite(res["history"][-1]["loss"])
    from attnrepro.report import train_record   # the run's record says so, whatever its function returns
    record = lambda data, case: train_record(tmp_path, "demo", "smoke", {"case": case},
                                             lambda c, k: {"n": run(data)["steps"]}, write=False)
    assert record(ds, "batched")["host"]["augment_batched_fits"] == 1
    big = ArrayImageDataset(np.repeat(np.repeat(u8, 2, 1), 2, 2), ds.targets, ds.classes, train_transform("weak", 16))
    assert not run(big)["augment_batched"]   # 32 px images resized to 16: the per-image path
    assert "augment_batched_fits" not in record(big, "per image")["host"]
    monkeypatch.setenv("ATTNREPRO_BATCH_AUGMENT", "maybe")
    with pytest.raises(ValueError, match="ATTNREPRO_BATCH_AUGMENT"):
        batch_augment_mode(torch.device("cpu"))
    monkeypatch.delenv("ATTNREPRO_BATCH_AUGMENT")
    assert batch_augment_mode(torch.device("cuda")) and not batch_augment_mode(torch.device("cpu"))


@pytest.mark.slow
def test_mid_epoch_resume_with_accumulation_is_exact(tmp_path):
    """accum_steps=3 over 5 batches per epoch (groups of 3 and 2): killed in the middle of a group, the run resumes
    from the checkpoint of the last optimiser step, trains the lost group again and ends bit for bit as an
    uninterrupted run."""
    script = tmp_path / "run.py"
    script.write_text(MID_EPOCH_SCRIPT)
    py, args = sys.executable, ["3", "80"]
    a = _run([py, str(script), str(tmp_path / "a"), str(tmp_path / "a_out"), "-1", *args])
    assert a.returncode == 0, a.stderr
    # batch 10 = epoch 1, batch 5 of 5: the second of its short group, whose first batch's gradient is lost
    k = _run([py, str(script), str(tmp_path / "b"), str(tmp_path / "b_out"), "10", *args])
    assert k.returncode == 3, k.stderr
    ck = load_checkpoint(tmp_path / "b" / CKPT_NAME)
    assert (ck["epoch"], ck["it"], ck["step"]) == (1, 3, 3)   # after epoch 1's first group of 3 (global step 3)
    r = _run([py, str(script), str(tmp_path / "b"), str(tmp_path / "b_out"), "-1", *args])
    assert r.returncode == 0, r.stderr
    _assert_same(torch.load(tmp_path / "a_out.pt"), torch.load(tmp_path / "b_out.pt"))
    ra, rb = json.loads((tmp_path / "a_out.json").read_text()), json.loads((tmp_path / "b_out.json").read_text())
    strip = lambda h: [{k: v for k, v in row.items() if k != "epoch_time_s"} for row in h]
    assert strip(ra["history"]) == strip(rb["history"]) and ra["final"] == rb["final"]
    assert rb["steps"] == 3 * 2 and rb["accum_steps"] == 3 and rb["global_batch"] == 48


DDP_SCRIPT = TOY + '''
import hashlib, json, os, sys
import torch, torch.nn as nn, torch.nn.functional as F
torch.set_num_threads(1)
from attnrepro.train import fit, TrainConfig
from attnrepro.protocol import Method, LossTerm, ce_term, term_grads, assign_grads, project_conflicting
import torch.distributed as dist

out, ckpt = sys.argv[1], sys.argv[2]
rank = int(os.environ["RANK"])
def digest(*modules):
    h = hashlib.sha256()
    for m in modules:
        for k, v in m.state_dict().items(): h.update(k.encode()); h.update(v.detach().cpu().numpy().tobytes())
    return h.hexdigest()

res = {}
cfg = TrainConfig(epochs=2, batch_size=8, lr=1e-3, warmup_epochs=0, seed=1, mixup=0.5)
# 1) plain DDP path + an extra module whose grads the trainer all-reduces
model = tiny_vit(seed=rank)  # different init per rank: DDP must broadcast rank 0's
torch.manual_seed(10 + rank); proj = nn.Linear(4, 4)
m = Method([ce_term(), LossTerm("proj", lambda c: F.cross_entropy(c.modules["proj"](c.logits), c.y), 0.5)],
           name="ddp_proj", extra_modules={"proj": proj})
r = fit(model, toy_data(64), toy_data(30, seed=1), cfg, method=m, ckpt_dir=ckpt, progress=False, record_correct=True)
res["plain"] = dict(result=r, digest=digest(model, proj))
from torch.utils.data import DataLoader
from attnrepro.train import evaluate
from attnrepro.verdicts import unpack_correct
one = evaluate(model, DataLoader(toy_data(30, seed=1), batch_size=7), return_correct=True)   # this rank alone
res["hits_one_process"] = one["correct"].tolist()
res["hits_ddp"] = unpack_correct(r["final"]["correct"]).tolist()
try:
    evaluate(model, DataLoader(toy_data(30, seed=1), batch_size=8), distributed=True, return_correct=True)
except ValueError as e:
    res["refused"] = str(e)
# 2) a custom (gradient-surgery) backward runs unsynced, then every grad is averaged
def backward(ctx):
    shared = list(ctx.model.blocks.parameters())
    g_a, g_b = term_grads(ctx, ["ce"], shared), term_grads(ctx, ["aux"], shared)
    ctx.loss.backward()
    assign_grads(shared, g_a + project_conflicting(g_b, g_a))
model2 = tiny_vit(seed=0)
m2 = Method([ce_term(), LossTerm("aux", lambda c: -0.3 * F.cross_entropy(c.logits, c.y))], name="ddp_surgery",
            backward=backward)
r2 = fit(model2, toy_data(64), toy_data(30, seed=1), cfg, method=m2, progress=False)
res["surgery"] = dict(result=r2, digest=digest(model2))
# 3) accumulation: 2 ranks x 2 accumulated batches of 8 (no_sync on the first) = 2 ranks x 1 batch of 16, same shards
sgd = dict(epochs=1, lr=0.1, warmup_epochs=0, seed=1, optimizer="sgd", weight_decay=0.0)
model3, model4 = tiny_vit(seed=0), tiny_vit(seed=0)
r3 = fit(model3, toy_data(64), None, TrainConfig(batch_size=8, accum_steps=2, **sgd), progress=False)
r4 = fit(model4, toy_data(64), None, TrainConfig(batch_size=16, **sgd), progress=False)
diff = max((a - b).abs().max().item() for a, b in zip(model3.state_dict().values(), model4.state_dict().values()))
res["accum"] = dict(result=r3, digest=digest(model3), max_diff=diff, steps_big=r4["steps"])
json.dump(res, open(f"{out}.rank{rank}.json", "w"))
'''


@pytest.mark.slow
def test_torchrun_two_processes(tmp_path):
    torchrun = Path(sys.executable).parent / "torchrun"
    assert torchrun.exists(), f"torchrun not found next to {sys.executable}"
    script = tmp_path / "ddp.py"
    script.write_text(DDP_SCRIPT)
    p = _run([str(torchrun), "--standalone", "--nproc_per_node", "2", str(script), str(tmp_path / "res"),
              str(tmp_path / "ckpt")], timeout=180)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    r0, r1 = (json.loads((tmp_path / f"res.rank{i}.json").read_text()) for i in (0, 1))
    strip = lambda h: [{k: v for k, v in row.items() if k != "epoch_time_s"} for row in h]
    for key in ("plain", "surgery"):
        a, b = r0[key], r1[key]
        assert a["digest"] == b["digest"], key          # replicas stayed identical (model and extra module)
        assert strip(a["result"]["history"]) == strip(b["result"]["history"]) and a["result"]["final"] == b["result"]["final"]
        res = a["result"]
        assert res["world_size"] == 2 and res["steps"] == 2 * 4   # 64 samples / 2 ranks / batch 8
        assert res["final"]["n"] == 30                              # exact val count (no sampler padding)
        assert all(math.isfinite(v) for row in res["history"] for v in row.values() if isinstance(v, float))
        assert 0 <= res["final"]["acc1"] <= 100
    a, b = r0["accum"], r1["accum"]
    assert a["digest"] == b["digest"] and a["max_diff"] < 1e-6 and a["steps_big"] == a["result"]["steps"] == 2
    assert (a["result"]["world_size"], a["result"]["accum_steps"], a["result"]["global_batch"]) == (2, 2, 32)
    assert (tmp_path / "ckpt" / CKPT_NAME).exists()
    assert not [f for f in (tmp_path / "ckpt").iterdir() if f.name != CKPT_NAME]
    # per-image hits under DDP: each rank scored every other image; gathered back, they are the dataset's order
    for r in (r0, r1):
        assert r["hits_ddp"] == r0["hits_one_process"] and len(r["hits_ddp"]) == 30
        assert 0 < sum(r["hits_ddp"]) < 30                     # mixed hits, so the order is actually tested
        assert math.isclose(100 * sum(r["hits_ddp"]) / 30, r["plain"]["result"]["final"]["acc1"])
        assert "under DDP needs a loader over a ShardSampler" in r["refused"]


def test_device_from_environment(monkeypatch):
    """`attnrepro reproduce --device` reaches fit through ATTNREPRO_DEVICE; a bad or absent device is a clear error."""
    import torch
    from attnrepro.train import _resolve_device
    monkeypatch.setenv("ATTNREPRO_DEVICE", "cpu")
    assert _resolve_device(None) == torch.device("cpu")
    monkeypatch.setenv("ATTNREPRO_DEVICE", "gpu0")
    with pytest.raises(ValueError, match="'gpu0' is not a torch device"):
        _resolve_device(None)
    if not torch.cuda.is_available():
        monkeypatch.setenv("ATTNREPRO_DEVICE", "cuda")
        with pytest.raises(ValueError, match="CUDA is not available"):
            _resolve_device(None)


def test_put_taps_one_scheme_and_refuses_a_key_set_twice():
    "Terms read ctx.student / ctx.teacher; a second writer of one key in a step is an error naming both, not an overwrite."
    from attnrepro.protocol import StepContext, put_taps
    ctx = StepContext()
    put_taps(ctx, "student", {"block": 1}, "GTA")
    put_taps(ctx, "student", {"attn_distill": 2}, "distillation")
    put_taps(ctx, "teacher", {"block": 3}, "GTA")
    assert ctx.student == {"block": 1, "attn_distill": 2} and ctx.teacher == {"block": 3}
    with pytest.raises(KeyError, match=r"AAL sets ctx.student\['block'\], which another part"):
        put_taps(ctx, "student", {"block": 4}, "AAL")
    assert ctx.student["block"] == 1
    with pytest.raises(ValueError, match="side='students'"):
        put_taps(ctx, "students", {}, "x")


def test_checkpoint_method_names_from_before_the_registry_still_match():
    "A checkpoint written under a paper's own method name resumes under its registry name; other methods are refused."
    from attnrepro.train import same_method
    assert same_method("ce", "ce") and same_method("scratch", "ce") and same_method("supervised", "ce")
    assert same_method("copy", "attn_copy") and same_method("distill", "attn_distill") and same_method("aal", "aal+deit_hard")
    assert not same_method("gta", "ce") and not same_method("ce", "gta") and not same_method(None, "ce")


def test_checkpoint_of_aal_before_it_was_a_composition_resumes(tmp_path):
    """AAL + hard distillation was one method named 'aal' before the registry composed it ('aal+deit_hard'): its
    checkpoint's method state is flat (the step's shared state). It resumes as the composition's shared state; a flat
    state under the composition's own name is still refused."""
    from attnrepro.data import IMAGENET_MEAN, IMAGENET_STD
    from attnrepro.methods import create_method
    from attnrepro.models import cifar_resnet, create_student
    torch.manual_seed(0)
    teacher = cifar_resnet(20).eval()
    def build():
        torch.manual_seed(0)
        student = create_student("deit", img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=10)
        student.set_distilled_training(True)
        return create_method("aal+deit_hard", student, teacher, teacher_mean=IMAGENET_MEAN, teacher_std=IMAGENET_STD,
                             epochs=1, ce_weight=0.5, dist_weight=0.5)
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(8, 3, 32, 32, generator=g), torch.randint(0, 10, (8,), generator=g))
    cfg = TrainConfig(epochs=1, batch_size=4, warmup_epochs=0)
    model, method = build()
    first = fit(model, data, data, cfg, method=method, ckpt_dir=tmp_path, progress=False)
    ck = load_checkpoint(tmp_path / CKPT_NAME)
    assert set(ck["method_state"]) == {"shared", "parts"} and "link_magnitudes" in ck["method_state"]["shared"]
    old = dict(ck, method="aal", method_state=ck["method_state"]["shared"])   # as the code before the registry wrote it
    torch.save(old, tmp_path / CKPT_NAME)
    model, method = build()
    again = fit(model, data, data, cfg, method=method, ckpt_dir=tmp_path, progress=False)
    assert again["final"]["acc1"] == first["final"]["acc1"] and method.state == ck["method_state"]["shared"]
    torch.save(dict(old, method="aal+deit_hard"), tmp_path / CKPT_NAME)   # flat, under today's name: not a former one
    model, method = build()
    with pytest.raises(RuntimeError, match="checkpointed method state has parts"):
        fit(model, data, data, cfg, method=method, ckpt_dir=tmp_path, progress=False)
