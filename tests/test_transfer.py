"""attnrepro.transfer: copy / distill methods of Li et al. 2024, against formulas written out in numpy."""
import copy
from functools import partial

import numpy as np
import pytest
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from attnrepro.attention import AttentionCapture
from attnrepro.core import seed_everything
from attnrepro.losses import attention_distillation_loss
from attnrepro.models import create_student
from attnrepro.papers.attention_transfer import build_transfer
from attnrepro.train import TrainConfig, fit
from attnrepro.protocol import StepContext
from attnrepro.transfer import (CopyModel, block_features, Distill, TeacherDistillMethod, attention_info_counts,
                                effective_attention_maps, ensemble_top1, first_layers, last_layers, layer_cka,
                                model_info_counts, predict_logits, pretrained_student, teacher_forward, vit_shape)

KW = dict(img_size=32, patch_size=8, embed_dim=32, depth=3, num_heads=2)


def _models(drop_path_rate=0.0, seed=0):
    seed_everything(seed)
    t = create_student(**KW, num_classes=0).eval()
    s = create_student(**KW, num_classes=5, drop_path_rate=drop_path_rate)
    return t, s


def _softmax(a):
    e = np.exp(a - a.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.fixture
def x():
    return torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def test_info_counts_golden():
    # Appendix Table 10, ViT-L/16 at 224 px: 24 x 16 x 197 x 64 x 2 ~ 9.7M, 24 x 16 x 197 x 197 ~ 15M
    c = attention_info_counts(24, 16, 197, 64)
    assert c == {"qk": 24 * 16 * 197 * 64 * 2, "map": 24 * 16 * 197 * 197}
    assert f"{c['qk'] / 1e6:.1f}" == "9.7" and f"{c['map'] / 1e6:.0f}" == "15"
    t, _ = _models()
    assert model_info_counts(t) == attention_info_counts(3, 2, 17, 16)
    with pytest.raises(ValueError, match="depth"):
        attention_info_counts(0, 16, 197, 64)


def test_layer_helpers():
    assert first_layers(3, 6) == [0, 1, 2] and last_layers(3, 6) == [3, 4, 5]
    with pytest.raises(ValueError, match="1..6"):
        first_layers(0, 6)


def test_attn_and_q_distill_golden(x):
    t, s = _models()
    s.train()
    m = TeacherDistillMethod(t, [Distill("attn", (0, 2), 3.0), Distill("q", (1,), 0.5), Distill("feature", (0,))])
    ctx = StepContext(model=s, train_model=s, x=x)
    m.forward(ctx)
    got = {tm.name: float(tm.fn(ctx).detach()) for tm in m.terms if tm.name != "ce"}
    with torch.no_grad():
        with AttentionCapture(t, what=("logits", "q")) as ct:
            t(x)
        with AttentionCapture(s, what=("logits", "q")) as cs:
            s(x)
    # official CE: mean over batch, heads and every query row (CLS included), summed over the distilled blocks
    ce = 0.0
    for i in (0, 2):
        p = _softmax(ct.logits[i].double().numpy())
        ls = cs.logits[i].double().numpy()
        logq = ls - ls.max(-1, keepdims=True) - np.log(np.exp(ls - ls.max(-1, keepdims=True)).sum(-1, keepdims=True))
        ce += -(p * logq).sum(-1).mean()
    assert got["attn_distill"] == pytest.approx(ce, rel=1e-5)
    mse = ((cs.q[1].double().numpy() - ct.q[1].double().numpy()) ** 2).mean()
    assert got["q_distill"] == pytest.approx(mse, rel=1e-5)
    assert got["feature_distill"] > 0
    assert [(tm.name, tm.weight) for tm in m.terms] == [("ce", 1.0), ("attn_distill", 3.0), ("q_distill", 0.5),
                                                         ("feature_distill", 1.0)]
    # the teacher's side carries no graph, the student's does
    assert not ctx.teacher["attn_distill"][0].requires_grad and ctx.student["attn_distill"][0].q.requires_grad


def test_attn_distill_from_qk_gives_the_logits_paths_gradients(x):
    "The q/k path (issue #19: no N x N tensor kept) gives the student the gradients of the logits path, up to rounding."
    t, s = _models()
    s.eval()   # no dropout / drop path: both passes see the same network
    m = TeacherDistillMethod(t, [Distill("attn", (0, 2), 3.0)], ce_weight=0.0)
    ctx = StepContext(model=s, train_model=s, x=x)
    m.forward(ctx)
    assert all(type(a).__name__ == "_StudentQK" for a in ctx.student["attn_distill"])
    fast = torch.autograd.grad(3.0 * m.terms[0].fn(ctx), list(s.parameters()), allow_unused=True)
    with torch.no_grad(), AttentionCapture(t, (0, 2)) as ct:
        t(x)
    with AttentionCapture(s, (0, 2)) as cs:
        s(x)
    ref_loss = 3.0 * sum(attention_distillation_loss(a, b) for a, b in zip(cs.logits, ct.logits))
    ref = torch.autograd.grad(ref_loss, list(s.parameters()), allow_unused=True)
    assert float(m.terms[0].fn(ctx).detach()) * 3.0 == pytest.approx(float(ref_loss.detach()), rel=1e-6)
    n = 0
    for (name, _), a, b in zip(s.named_parameters(), fast, ref):
        assert (a is None) == (b is None), name
        if a is not None:
            n += 1
            assert torch.allclose(a, b, rtol=1e-4, atol=1e-6), f"{name}: max diff {(a - b).abs().max():.3g}"
    assert n > 0


def test_shared_drop_path_replays_the_students_masks(x):
    _, s = _models(drop_path_rate=0.6)
    t = copy.deepcopy(s).eval().requires_grad_(False)
    for b in t.blocks:
        b.drop_path1 = b.drop_path2 = nn.Identity()
    s.train()
    tt = teacher_forward(t, x, what=("logits",), student=s)
    with AttentionCapture(s, what=("logits",)) as cs:
        s(x)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(tt["logits"], cs.logits))
    # without sharing, the (eval) teacher differs from the stochastic student somewhere past block 0
    plain = teacher_forward(t, x, what=("logits",))
    with AttentionCapture(s, what=("logits",)) as cs2:
        s(x)
    assert any(not torch.allclose(a, b, atol=1e-4) for a, b in zip(plain["logits"], cs2.logits))
    assert not t.training and all(isinstance(b.drop_path1, nn.Identity) for b in t.blocks)


@pytest.mark.parametrize("source", ["maps", "q", "k"])
def test_copy_applies_the_formula(source, x):
    t, s = _models()
    cm = CopyModel(s, t, source=source).eval()
    maps = effective_attention_maps(cm, x)
    with torch.no_grad(), AttentionCapture(t, what=("logits", "q", "k")) as ct:
        t(x)
    with torch.no_grad(), AttentionCapture(s, what=("q", "k", "maps")) as cs:
        cm(x)    # the student's own q/k are recorded before the override mixes the teacher's in
    scale = s.blocks[0].attn.scale
    for i in range(3):
        if source == "maps":
            want = _softmax(ct.logits[i].double().numpy())
        elif source == "q":
            want = _softmax(scale * ct.q[i].double().numpy() @ cs.k[i].double().numpy().swapaxes(-1, -2))
        else:
            want = _softmax(scale * cs.q[i].double().numpy() @ ct.k[i].double().numpy().swapaxes(-1, -2))
        assert np.allclose(maps[i].double().numpy(), want, atol=1e-5)


def test_copy_heads_subset_keeps_own_heads(x):
    t, s = _models()
    cm = CopyModel(s, t, layers=[1], heads=[0]).eval()
    maps = effective_attention_maps(cm, x)
    with torch.no_grad(), AttentionCapture(t, what=("maps",)) as ct:
        t(x)
    with torch.no_grad(), AttentionCapture(s, what=("maps",)) as cs:
        s(x)
    assert torch.allclose(maps[1][:, 0], ct.maps[1][:, 0], atol=1e-6)          # copied head
    assert not torch.allclose(maps[1][:, 1], ct.maps[1][:, 1], atol=1e-3)      # own head
    assert torch.allclose(maps[0], cs.maps[0], atol=1e-6)                      # block 0 not copied: own map


@pytest.mark.parametrize("aggregate", ["examples", "layers", "heads", "queries"])
def test_aggregated_copy_runs(aggregate, x):
    t, s = _models()
    out = CopyModel(s, t, aggregate=aggregate).eval()(x)
    assert out.shape == (4, 5) and torch.isfinite(out).all()


def test_copy_model_runs_teacher_at_evaluation():
    t, s = _models()
    calls = []
    t.blocks[0].register_forward_hook(lambda *a: calls.append(1))
    ds = TensorDataset(torch.randn(16, 3, 32, 32), torch.randint(0, 5, (16,)))
    cm = CopyModel(s, t)
    fit(cm, ds, ds, TrainConfig(epochs=1, batch_size=8, lr=1e-3, warmup_epochs=0), progress=False)
    assert len(calls) == 2 + 2      # 2 training steps + 2 evaluation batches, each with a teacher forward
    assert all(not p.requires_grad for p in cm.teacher.parameters())
    before = copy.deepcopy(t.state_dict())
    assert all(torch.equal(before[k], v) for k, v in cm.teacher.state_dict().items())


def test_pretrained_student_and_errors():
    t, s = _models()
    ft = pretrained_student(t, 7)
    assert vit_shape(ft) == dict(KW) and ft.head.out_features == 7
    assert all(torch.equal(a, b) for (k, a), (_, b) in zip(t.state_dict().items(), ft.state_dict().items())
               if not k.startswith("head"))
    no_bias = create_student(**KW, num_classes=0, qkv_bias=False)   # same shape, other keys: refused, not half-loaded
    with pytest.raises(ValueError, match="do not fit the student"):
        pretrained_student(no_bias, 7)
    with pytest.raises(ValueError, match="choose one of"):
        build_transfer("tune", t, 5)
    with pytest.raises(ValueError, match="needs a teacher"):
        build_transfer("copy", None, 5, shape=dict(KW))
    with pytest.raises(ValueError, match="kind"):
        Distill("qk")


def test_every_method_fits_and_ensembles():
    t, _ = _models()
    ds = TensorDataset(torch.randn(16, 3, 32, 32), torch.randint(0, 5, (16,)))
    cfg = TrainConfig(epochs=1, batch_size=8, lr=1e-3, warmup_epochs=0)
    logits = []
    for meth, kw in [("scratch", {}), ("finetune", {}), ("copy", dict(layers=[-1])), ("distill", dict(weight=3.0)),
                     ("q_distill", {}), ("feature_distill", {})]:
        model, method = build_transfer(meth, t, 5, **kw)
        r = fit(model, ds, ds, cfg, method, progress=False)
        assert np.isfinite(r["history"][0]["loss"])
        lg, y = predict_logits(model, DataLoader(ds, batch_size=8))
        logits.append(lg)
    acc = ensemble_top1(logits[:2], y)
    assert 0 <= acc <= 100
    ck = layer_cka(build_transfer("scratch", t, 5)[0], t, DataLoader(ds, batch_size=8), max_images=12)
    assert len(ck) == 3 and all(0 <= c <= 1 + 1e-9 for c in ck)
    x = ds.tensors[0][:4]
    assert block_features(t, x)[0].shape == (4 * 17, 32) and block_features(t, x, "cls")[0].shape == (4, 32)
    # a CopyModel's features are its student's under the copied attention: neither the teacher's nor the
    # student's own forward
    cm = CopyModel(build_transfer("scratch", t, 5)[0], t).eval()
    fc = block_features(cm, x)
    assert len(fc) == 3 and fc[0].shape == (4 * 17, 32)
    assert not torch.allclose(fc[0], block_features(t, x)[0]) and not torch.allclose(fc[0], block_features(cm.student, x)[0])
    with pytest.raises(ValueError, match="tokens"):
        block_features(t, x, "max")


# 'meta' stands in for a GPU below: a meta model fed CPU tensors raises exactly like a CUDA model fed CPU tensors,
# so passing CPU inputs shows that a helper moves them to the model's device (outputs then stay on 'meta').

def test_analysis_helpers_move_inputs_to_the_models_device(x):
    t, s = _models()
    cm = CopyModel(s.to("meta"), t, heads=[0], source="maps").eval()   # teacher left on the CPU
    maps = effective_attention_maps(cm, x)                             # CPU images, as from a dataset
    assert next(t.parameters()).device.type == "meta"                  # the teacher followed its student
    assert [m.device.type for m in maps] == ["meta"] * 3 and maps[0].shape == (4, 2, 17, 17)
    f = block_features(cm, x, "cls")
    assert [b.device.type for b in f] == ["meta"] * 3 and f[0].shape == (4, 32)


def test_distill_teacher_is_a_frozen_module(x):
    # fit moves a method's frozen modules with the student; the teacher must be one, or a GPU run breaks on step 1
    t, s = _models()
    s = s.to("meta").train()
    m = TeacherDistillMethod(t, [Distill("attn", (0,)), Distill("feature")])
    assert m.frozen_modules == {"teacher": t} and not m.extra_modules
    t.to("meta")   # what fit does on the student's device
    ctx = StepContext(model=s, train_model=s, x=x.to("meta"))
    m.forward(ctx)
    assert ctx.teacher["attn_distill"][0].shape == (4, 2, 17, 17)
    assert all(v[0].device.type == "meta" for v in ctx.teacher.values())


@pytest.mark.parametrize("build", ["distill_first_2", "copy_block_0", "q_and_feature"])
def test_teacher_stops_after_the_last_needed_block(build, x):
    "The training paths run the frozen teacher without grad through the last block a term needs: no later block, norm or head."
    t, s = _models()
    t.head = nn.Linear(32, 5)   # a head that would run in a full forward (the teacher is built headless)
    s.train()
    ran, grad = [], []
    def record(k, *a):   # returns None: the block's output stays as it is
        ran.append(k); grad.append(torch.is_grad_enabled())
    hooks = [b.register_forward_hook(partial(record, k)) for k, b in enumerate(t.blocks)]
    hooks += [m.register_forward_hook(lambda *a, n=n: ran.append(n)) for n, m in (("norm", t.norm), ("head", t.head))]
    if build == "copy_block_0":
        CopyModel(s, t, layers=[0])(x)
        want = [0]
    else:
        distill = ([Distill("attn", (0, 1))] if build == "distill_first_2"
                   else [Distill("q", (0,)), Distill("feature", (1,))])
        TeacherDistillMethod(t, distill).forward(StepContext(model=s, train_model=s, x=x))
        want = [0, 1]
    for h in hooks: h.remove()
    assert ran == want and not any(grad)


def test_paper_figures_and_corruptions():
    "Figures 1 and 3-7 from result-shaped data; each corruption keeps the batch's shape; a dry run scores a few images."
    import numpy as np
    from attnrepro.papers import attention_transfer as tr
    x = torch.randn(2, 3, 8, 8)
    for name, f in tr.CORRUPTIONS.items():
        assert f(x, torch.Generator().manual_seed(0)).shape == x.shape, name
    assert torch.equal(tr.CORRUPTIONS["clean"](x, None), x)
    ds = list(range(100))
    assert tr.analysis_set(ds) is ds
    fig = tr.plot_teaser([80.0, 85.0, 85.1, 85.7], [40, 50, 45, 48], [1, 1, 1, 1], "CIFAR-10")
    assert [a.get_title() for a in fig.axes] == ["paper (ViT-L, ImageNet-1K)", "ours (CIFAR-10; 95 % CI over seeds)"]
    fig = tr.plot_partial_copy({"first": {0: 1.0, 2: 2.0}, "last": {0: 1.0, 2: 3.0}}, {0: 1.0, 3: 2.0}, 4, 3, "3")
    assert len(fig.axes[0].lines) == 2 and len(fig.axes[1].lines) == 1
    fig = tr.plot_cka_ensembles({"scratch": [0.5, 0.4]}, 2, {"copy": 40.0}, {"copy": 45.0}, 44.0)
    assert [t.get_text() for t in fig.axes[1].get_xticklabels()] == ["copy"]
    jsd = {r: {"distill": {"direct": [0.1, 0.2]}} for r in ("pre-trained", "fine-tuned")}
    fig = tr.plot_head_jsd(jsd, ["direct"], 2, "6")
    assert [a.get_title() for a in fig.axes] == ["direct, vs pre-trained", "direct, vs fine-tuned"]
    vis = dict(images=[np.zeros((4, 4, 3))] * 2, maps={"init": {"0": [np.ones((2, 2))] * 2, "1": [np.ones((2, 2))] * 2}})
    fig = tr.plot_attention_maps(vis, [0, 1], [0, 1], "7")
    assert len(fig.axes) == 2 * 3 and fig.axes[1].get_title() == "init\nblock 1"


# --- the paper notebook's tables (issue #17: table assembly in the library) -------------------------------------------

def _fake_runs(p, seeds=2, n=2000, seed=0):
    "Per-seed run results as the notebook's cache returns them: top-1 and the packed per-image hits on n test images."
    from attnrepro.verdicts import pack_correct
    rng = np.random.default_rng(seed)
    hs = [rng.random(n) < p for _ in range(seeds)]
    return [dict(acc1=100 * h.mean(), correct=pack_correct(h)) for h in hs]


def test_run_grid_is_seed_major_and_keeps_each_rows_seeds():
    from attnrepro.papers.attention_transfer import TransferRuns
    tr = TransferRuns.__new__(TransferRuns)   # only run_grid's own logic: run_all answers with the configs it got
    tr.run_all = lambda cfgs: [dict(c) for c in cfgs]
    got = tr.run_grid(lambda row, s: {"row": row, "seed": s}, ["a", "b"], [2, 0])
    assert got == {"a": [{"row": "a", "seed": 2}, {"row": "a", "seed": 0}], "b": [{"row": "b", "seed": 2}, {"row": "b", "seed": 0}]}
    order = []
    tr.run_all = lambda cfgs: order.extend((c["row"], c["seed"]) for c in cfgs) or [dict(c) for c in cfgs]
    got = tr.run_grid(lambda row, s: {"row": row, "seed": s}, ["a", "b", "c"], {"a": [1, 0], "b": [0], "c": []})
    assert order == [("a", 0), ("b", 0), ("a", 1)]   # union of the seeds, sorted; each seed across the rows first
    assert [r["seed"] for r in got["a"]] == [0, 1] and got["c"] == []


def test_sweep_borrows_table_1s_spread_with_one_seed_and_builds_tables():
    from attnrepro.papers.attention_transfer import Sweep, hits_arm, table_12_aggregated, table_3_partial
    P = dict(sweeps=dict(schedule="sw", claim_seeds=[0]), recipes=dict(sw=dict(train=dict(epochs=3))), proxy_short="toy")
    res = {k: _fake_runs(p, 1, seed=i) for i, (k, p) in enumerate(dict(scratch=.3, **{"fine-tune": .6}, copy=.5, distill=.55,
                                                                      **{"average over examples": .35}).items())}
    table1 = {"scratch": hits_arm(_fake_runs(.3, 3, seed=9), "scratch")}
    sw = Sweep(res, ["scratch", "fine-tune", "copy", "distill"], table1, P)
    assert sw.df == 2 and "borrowed from Table 1" in sw.note and sw.arms["copy"].sd_seed == sw.sd
    t12, c12 = table_12_aggregated(sw, ["examples"], "mini")
    assert "vs copy (ours, mini)" in t12 and c12.endswith(sw.note + ".")
    ours = t12.set_index("average_over")["vs copy (ours, mini)"]
    assert ours["none (plain copy, reference)"] == "" and ours["examples"].startswith("-")   # 35 % < 50 %: below copy
    tp, _ = table_3_partial(sw, {"first": {0: sw.arms["scratch"], 6: sw.arms["copy"]}}, {0: sw.arms["scratch"]}, "mini")
    assert tp.transfer.tolist() == ["first 0 layers", "first 6 layers", "first 0 heads"] and tp["vs scratch"][0] == ""


def test_table_1_keeps_the_row_order_and_pairs_each_row_with_scratch():
    from attnrepro.papers.attention_transfer import hits_arm, table_1
    labels = ["scratch", "fine-tune", "attn. copy", "attn. copy from fine-tuned", "attn. distill"]
    A = {k: hits_arm(_fake_runs(p, 2, seed=i), k) for i, (k, p) in enumerate(zip(labels, (.3, .6, .5, .5, .55)))}
    P = dict(main=dict(schedule="s", teacher_key="t"), recipes=dict(s=dict(train=dict(epochs=10))), teachers=dict(t="mae_x"),
             proxy="toy task", seeds=[0, 1])
    t1, cap = table_1(A, A["fine-tune"], P, "mini", n_reused=4)
    assert t1.method.tolist() == labels + ["ensemble attn. distill + fine-tune"]
    assert t1["top1 (paper)"].tolist() == [83.0, 85.7, 85.1, 85.6, 85.7, 86.3]
    vs = t1["vs_scratch (ours, mini)"].tolist()
    assert vs[0] == "" and all(v.startswith("+") for v in vs[1:])
    assert "4 of these runs are the pilot's" in cap and "paired on the 2000 test images" in cap


# --- the paper profile as published (issue #47) -------------------------------------------------------------------

def test_global_pool_avg_is_maes_fine_tuning_and_absent_keeps_the_cls_student():
    from attnrepro.transfer import scratch_student
    t, _ = _models()
    ft = pretrained_student(t, 7, global_pool="avg")   # MAE's global_pool=True: the final norm goes, fc_norm is new
    assert ft.global_pool == "avg" and isinstance(ft.norm, nn.Identity) and isinstance(ft.fc_norm, nn.LayerNorm)
    assert torch.equal(ft.blocks[2].mlp.fc2.weight, t.blocks[2].mlp.fc2.weight)
    assert torch.equal(ft.fc_norm.weight, torch.ones_like(ft.fc_norm.weight))   # fresh, not the teacher's norm
    x = torch.randn(2, 3, 32, 32)
    tok = ft.forward_features(x)
    assert torch.allclose(ft.forward_head(tok, pre_logits=True), ft.fc_norm(tok[:, 1:].mean(1)), atol=1e-6)
    # None: create_student's call as before (same init, the CLS token), so smoke / mini run configs stay what they were
    a, b = (scratch_student(dict(KW), 5, seed=3, global_pool=g) for g in (None, "token"))
    assert a.global_pool == "token" and all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    with pytest.raises(ValueError, match="global_pool"):
        scratch_student(dict(KW), 5, global_pool="max")
    model, _ = build_transfer("copy", t, 5, global_pool="avg")
    assert model.student.global_pool == "avg" and model(x).shape == (2, 5)


def test_a_row_whose_recipe_trains_an_ema_reports_the_ema_weights(tmp_path):
    from attnrepro.train import load_checkpoint
    from attnrepro.papers.attention_transfer import TransferRuns, ema_weights, reports_ema
    from attnrepro.verdicts import unpack_correct
    seed_everything(0)
    ds = TensorDataset(torch.randn(24, 3, 32, 32), torch.randint(0, 5, (24,)))
    model = create_student(**KW, num_classes=5)
    tc = TrainConfig(epochs=2, batch_size=8, lr=1e-3, warmup_epochs=0, ema_decay=0.5)
    res = fit(model, ds, ds, tc, ckpt_dir=tmp_path, progress=False)
    raw = dict(acc1=res["final"]["acc1"], acc5=res["final"]["acc5"])
    out = TransferRuns._ema_result(model, ds, tc, tmp_path, True, raw)
    assert out["weights"] == "EMA (decay 0.5)" and out["acc1_raw"] == raw["acc1"] and out["n_val"] == 24
    assert out["acc1"] == pytest.approx(res["history"][-1]["val_ema_acc1"])   # fit's own EMA score of the same weights
    assert 100 * unpack_correct(out["correct"]).mean() == pytest.approx(out["acc1"])
    ema = ema_weights(load_checkpoint(tmp_path / "checkpoint.pth")["ema"])
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in ema.items())   # the model now holds the EMA weights
    assert reports_ema({"train": {"ema_decay": 0.9999}}) and not reports_ema({"train": {"epochs": 1}})


def test_paper_profile_rows_weights_sizes_and_lambda():
    from attnrepro.core import config_hash
    from attnrepro.report import load_profile
    from attnrepro.papers.attention_transfer import TransferRuns, weights_note
    P = load_profile("attention_transfer", "paper")
    tr = TransferRuns(P, None)
    note = weights_note(P, tr)
    assert "EMA model (decay 0.9999) for scratch, copy, partial copies, distill" in note and "raw weights for fine-tune" in note
    # the DINO dagger: a ViT-B student for the ViT-B teacher, distilling the headline's share of its blocks (9 of 12)
    vitb = dict(P["model_sizes"]["ViT-B"]["shape"])
    c = tr.spec("distill", teacher="dino", shape=vitb, weight=P["distill"]["other_weight"])
    assert c["shape"] == vitb and c["layers"] == list(range(9)) and c["weight"] == 1.0
    assert tr.spec("distill")["layers"] == list(range(18)) and tr.spec("distill")["weight"] == 3.0
    assert tr.spec("copy", layers=[0])["schedule"]["global_pool"] == "avg"
    for prof in ("smoke", "mini"):   # no EMA, no pooling key: their captions and run configs as before
        Q = load_profile("attention_transfer", prof)
        t = TransferRuns(Q, None)
        assert weights_note(Q, t) == "" and "global_pool" not in t.spec("copy")["schedule"]
        assert config_hash(t.spec("distill", shape=dict(Q["shape"]))) == config_hash(t.spec("distill"))


def test_sweep_with_one_seed_everywhere_has_no_interval_and_says_so():
    from attnrepro.papers.attention_transfer import ONE_SEED, Sweep, hits_arm, table_12_aggregated
    P = dict(sweeps=dict(schedule="sw", claim_seeds=[0]), recipes=dict(sw=dict(train=dict(epochs=3))), proxy_short="toy")
    res = {k: _fake_runs(p, 1, seed=i) for i, (k, p) in enumerate(dict(scratch=.3, **{"fine-tune": .6}, copy=.5, distill=.55,
                                                                      **{"average over examples": .35}).items())}
    sw = Sweep(res, ["scratch", "fine-tune", "copy", "distill"], {"scratch": hits_arm(_fake_runs(.3, 1), "scratch")}, P)
    assert sw.sd is None and "no interval (one seed everywhere" in sw.note
    assert [p.verdict for p in sw.premise] == ["untestable", "untestable"]
    t12, _ = table_12_aggregated(sw, ["examples"], "paper")
    assert t12.set_index("average_over")["vs copy (ours, paper)"]["examples"] == ONE_SEED
