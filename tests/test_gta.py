"""GTA and the transfer-learning baselines: golden values from the papers' formulas (numpy), shapes, errors."""
import math

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from attnrepro.gta import (METHODS, StepContext, TransferMethod, bss_loss, cls_attention, frozen_copy, guidance_loss,
                           guidance_term, l2sp_penalties, mixed_targets, patch_box_mask, set_finetune_part,
                           target_from_source, transfer_method, transmix_lambda)
from attnrepro.models import create_student
from attnrepro.train import TrainConfig, fit


@pytest.fixture(scope="module")
def source():
    torch.manual_seed(0)
    return frozen_copy(create_student("vit", img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2,
                                      num_classes=0))


def _cls_logits_numpy(model, x):
    "Eq. 2 by hand: per block, q k^T / sqrt(d) of the CLS query, from the block's own weights (numpy)."
    out, z = [], model.patch_embed(x)
    z = model._pos_embed(z)
    z = model.norm_pre(z)
    for blk in model.blocks:
        h = blk.norm1(z).detach().numpy()
        W, b = blk.attn.qkv.weight.detach().numpy(), blk.attn.qkv.bias.detach().numpy()
        qkv = h @ W.T + b                                         # (B, N, 3D)
        B, N, _ = qkv.shape
        H = blk.attn.num_heads
        qkv = qkv.reshape(B, N, 3, H, -1).transpose(2, 0, 3, 1, 4)
        q, k = qkv[0], qkv[1]
        out.append(np.einsum("bhd,bhnd->bhn", q[:, :, 0], k) / math.sqrt(q.shape[-1]))
        z = blk(z)
    return out


def test_gta_term_matches_eq5_by_hand(source):
    torch.manual_seed(1)
    tgt = target_from_source(source, 4)
    with torch.no_grad():                       # move the target away from the source
        for p in tgt.parameters():
            p.add_(0.05 * torch.randn_like(p))
    tgt.eval()
    x = torch.randn(3, 3, 32, 32)
    a_s, a_t = _cls_logits_numpy(source, x), _cls_logits_numpy(tgt, x)
    want = sum(((t[..., 1:] - s[..., 1:]) ** 2).sum(axis=(1, 2)).mean() for s, t in zip(a_s, a_t))
    meth = TransferMethod(tgt, source, [guidance_term("attn_logits", 1.0)])
    ctx = StepContext(x=x, y=torch.zeros(3, dtype=torch.long), target=None, model=tgt, train_model=tgt,
                      device=torch.device("cpu"), step=0, cfg=TrainConfig(epochs=1, warmup_epochs=0))
    meth.before_forward(ctx)
    meth.forward(ctx)
    got = meth.terms[1].fn(ctx).item()
    assert got == pytest.approx(want, rel=1e-4)
    assert got > 0


def test_guidance_variants_golden():
    s = {0: torch.zeros(2, 3, 4), 1: torch.zeros(2, 3, 4)}
    t = {0: torch.full((2, 3, 4), 2.0), 1: torch.ones(2, 3, 4)}
    assert guidance_loss(t, s, "msa").item() == 12 * 4 + 12 * 1
    with pytest.raises(ValueError, match="valid"):
        guidance_loss(t, s, "mlp")
    with pytest.raises(ValueError, match="differ"):
        guidance_loss({0: t[0]}, s, "block")


def test_l2sp_golden():
    torch.manual_seed(0)
    m = create_student("vit", img_size=16, patch_size=8, embed_dim=8, depth=1, num_heads=2, num_classes=3)
    start = {n: torch.zeros_like(p) for n, p in m.named_parameters() if not n.startswith("head.")}
    back, head = l2sp_penalties(m, start)
    want_b = 0.5 * sum(float((p.detach() ** 2).sum()) for n, p in m.named_parameters() if not n.startswith("head."))
    want_h = 0.5 * float((m.head.weight.detach() ** 2).sum() + (m.head.bias.detach() ** 2).sum())
    assert back.item() == pytest.approx(want_b, rel=1e-5) and head.item() == pytest.approx(want_h, rel=1e-5)


def test_bss_matches_numpy_svd():
    g = torch.randn(16, 6, generator=torch.Generator().manual_seed(0))
    s = np.linalg.svd(g.numpy(), compute_uv=False)
    assert bss_loss(g, 1).item() == pytest.approx(s[-1] ** 2, rel=1e-5)
    assert bss_loss(g, 3).item() == pytest.approx((s[-3:] ** 2).sum(), rel=1e-5)
    with pytest.raises(ValueError, match="k must be"):
        bss_loss(g, 7)


def test_finetune_parts(source):
    t = target_from_source(source, 4)
    info = set_finetune_part(t, "attention")
    names = {n for n, p in t.named_parameters() if p.requires_grad}
    assert all(".attn." in n or n.startswith("head.") for n in names) and "blocks.1.attn.proj.weight" in names
    set_finetune_part(t, "ffn")
    names = {n for n, p in t.named_parameters() if p.requires_grad}
    assert all(".mlp." in n or n.startswith("head.") for n in names)
    assert info["n_trainable"] < info["n_total"]
    with pytest.raises(ValueError, match="valid"):
        set_finetune_part(t, "norms")


def test_transmix_golden():
    a = torch.tensor([[[1., 3., 0., 0.], [3., 1., 0., 0.]]])   # B=1, H=2: head mean [2, 2, 0, 0] -> 0.5 / 0.5
    assert transmix_lambda(a / 4, torch.tensor([1., 0., 0., 0.])).item() == pytest.approx(0.5)
    assert torch.equal(patch_box_mask((16, 32, 16, 32), (32, 32), (4, 4)).reshape(4, 4)[2:, 2:], torch.ones(2, 2))
    t = mixed_targets(torch.tensor([1, 0]), torch.tensor([0.25, 0.25]), 2, smoothing=0.1)
    assert torch.allclose(t.sum(1), torch.ones(2)) and t[0, 0].item() == pytest.approx(0.75 * 0.05 + 0.25 * 0.95)


def test_errors(source):
    t = target_from_source(source, 4)
    with pytest.raises(ValueError, match="frozen source"):
        TransferMethod(t, None, [guidance_term()])
    with pytest.raises(ValueError, match="unknown kind"):
        transfer_method("lora", t, source)
    data = TensorDataset(torch.randn(8, 3, 32, 32), torch.randint(0, 4, (8,)))
    meth = transfer_method("transmix", t, source)
    with pytest.raises(ValueError, match="own CutMix"):
        fit(t, data, None, TrainConfig(epochs=1, batch_size=4, warmup_epochs=0, cutmix=1.0, num_classes=4),
            method=meth, progress=False)


@pytest.mark.parametrize("kind", METHODS)
def test_every_method_trains_finite(source, kind):
    torch.manual_seed(0)
    t = target_from_source(source, 4)
    data = TensorDataset(torch.randn(8, 3, 32, 32), torch.randint(0, 4, (8,)))
    meth = transfer_method(kind, t, source)
    cfg = TrainConfig(epochs=1, batch_size=4, lr=1e-3, warmup_epochs=0, **meth.train_overrides)
    res = fit(t, data, data, cfg, method=meth, progress=False)
    assert all(math.isfinite(v) for v in res["history"][0].values())
    assert res["steps"] == 2


def test_cls_attention_is_distribution(source):
    x = torch.randn(2, 3, 32, 32)
    a = cls_attention(source, x, head_reduce=None)
    assert a.shape == (2, 2, 4, 4) and torch.allclose(a.sum((-2, -1)), torch.ones(2, 2), atol=1e-5)
    assert torch.allclose(cls_attention(source, x, head_reduce="max"), a.max(1).values)


def test_class_group_on_embedded_sample():
    from attnrepro.data import get_dataset
    from attnrepro.gta import ClassGroup
    ds = get_dataset("tiny-imagenet-sample", "val")
    g = ClassGroup(ds, ["bullfrog", "goldfish"])
    assert g.classes == ["bullfrog", "goldfish"] and sorted(set(g.targets)) == [0, 1]
    assert len(g) == sum(ds.classes[t].split(",")[0] in ("bullfrog", "goldfish") for t in ds.targets)
    assert len(g.boxes) == len(g) and g.boxes[0].shape == (1, 4)
    with pytest.raises(ValueError, match="not found"):
        ClassGroup(ds, ["Chihuahua"])


def test_feature_tap_cleans_up_on_error(source):
    from attnrepro.gta import gta_taps
    t = target_from_source(source, 3)
    with pytest.raises(KeyError):
        with gta_taps(t, {"attn_logits": None, "block": None, "pre_logits": None}):
            raise KeyError("boom")
    assert not t.blocks[0]._forward_hooks and not t.head._forward_pre_hooks
    assert not t.blocks[0].attn.k_norm._forward_hooks and not t.blocks[0].attn._forward_pre_hooks


def test_cls_attention_moves_inputs_to_the_models_device(source):
    # 'meta' stands in for a GPU (a meta model fed CPU tensors raises like a CUDA one): CPU images are moved
    m = frozen_copy(source).to("meta")
    a = cls_attention(m, torch.randn(2, 3, 32, 32), head_reduce="mean")
    assert a.device.type == "meta" and a.shape == (2, 4, 4)


def test_gta_at_lambda_zero_trains_exactly_like_fine_tuning():
    """GTA's path (source forward, logit capture, extra term) changes nothing but its loss: at lambda 0 the target's
    weights equal plain fine-tuning's bit for bit, with drop-path on. (At any lambda > 0 AdamW moves the key bias,
    which CE's softmax cannot see, by a full step: see papers/gta/profiles.yaml, pilot.)"""
    from attnrepro.gta import frozen_copy, target_from_source, transfer_method
    from attnrepro.models import create_student
    from attnrepro.train import TrainConfig, fit
    torch.manual_seed(0)
    src = frozen_copy(create_student("vit", img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=0))
    g = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.rand(32, 3, 32, 32, generator=g), torch.randint(0, 10, (32,), generator=g))
    def train(kind, coef=None):
        torch.manual_seed(0)
        tgt = target_from_source(src, 10, drop_path_rate=0.1)
        fit(tgt, data, None, TrainConfig(epochs=2, batch_size=16, lr=1e-3, warmup_epochs=0, seed=3),
            method=transfer_method(kind, tgt, src, coef), progress=False)
        return tgt.state_dict()
    base, gta0, gta = train("baseline"), train("gta", 0.0), train("gta", 1e-6)
    assert all(torch.equal(base[k], gta0[k]) for k in base)
    kb = slice(32, 64)   # qkv.bias = [q | k | v]: the key bias gets no CE gradient (softmax is shift-invariant)
    # lambda 1e-6 still moves the key bias by a sizeable share of the 4 Adam steps' reach (4 x lr = 4e-3)
    assert max((base[f"blocks.{i}.attn.qkv.bias"][kb] - gta[f"blocks.{i}.attn.qkv.bias"][kb]).abs().max() for i in range(2)) > 1e-4


def test_centred_gta_ignores_what_the_softmax_cannot_see():
    """center=True: a constant added to a query row (what the key bias adds) leaves the loss unchanged, the loss equals
    Eq. 5 on row-centred logits (by hand), and the key bias gets no gradient from it, while the raw loss gives it one."""
    from attnrepro.losses import gta_loss
    g = torch.Generator().manual_seed(0)
    s, t = torch.randn(2, 3, 9, generator=g), torch.randn(2, 3, 9, generator=g)
    shift = torch.randn(2, 3, 1, generator=g)
    raw, cen = gta_loss(s, t, cls_row=True), gta_loss(s, t, cls_row=True, center=True)
    assert torch.allclose(gta_loss(s + shift, t, cls_row=True, center=True), cen, atol=1e-5)
    assert not torch.allclose(gta_loss(s + shift, t, cls_row=True), raw, atol=1e-3)
    sn, tn = s[..., 1:].numpy(), t[..., 1:].numpy()           # CLS key excluded, then centred over the 8 patch keys
    d = (sn - sn.mean(-1, keepdims=True)) - (tn - tn.mean(-1, keepdims=True))
    assert cen.item() == pytest.approx(float((d ** 2).sum(axis=(1, 2)).mean()), rel=1e-5)
    assert cen.item() < raw.item()   # centring removes the mean offset: never more than the raw distance here

    torch.manual_seed(0)
    src = frozen_copy(create_student("vit", img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=0))
    x = torch.rand(4, 3, 32, 32, generator=g)
    kb = slice(32, 64)   # qkv.bias = [q | k | v]
    def guidance_grads(center):
        torch.manual_seed(1)
        tgt = target_from_source(src, 10)
        with torch.no_grad():   # move the target off the source so the guidance has something to pull
            for p in tgt.parameters():
                p.add_(0.05 * torch.randn_like(p))
        meth = TransferMethod(tgt, src, [guidance_term("attn_logits", 1.0, center=center)])
        ctx = StepContext(x=x, y=torch.zeros(4, dtype=torch.long), target=None, model=tgt, train_model=tgt,
                          device=torch.device("cpu"), step=0, cfg=TrainConfig(epochs=1, warmup_epochs=0))
        meth.before_forward(ctx)
        meth.forward(ctx)
        meth.terms[1].fn(ctx).backward()
        return [(b.attn.qkv.bias.grad[kb].norm().item(), b.attn.qkv.weight.grad.norm().item()) for b in tgt.blocks]
    raw_g, cen_g = guidance_grads(False), guidance_grads(True)
    assert all(kbias > 1e-2 for kbias, _ in raw_g)
    assert all(kbias < 1e-5 * w for kbias, w in cen_g) and all(w > 1e-2 for _, w in cen_g)
    with pytest.raises(ValueError, match="center=True applies"):
        transfer_method("l2sp", target_from_source(src, 10), src, center=True)


# --- issue #23 -----------------------------------------------------------------------------------------------------

def _step_ctx(meth, tgt, x, y):
    "One training step's context as the trainer builds it: hooks run, every term evaluated and weighted."
    ctx = StepContext(x=x, y=y, target=y, model=tgt, train_model=tgt, device=torch.device("cpu"), step=0,
                      cfg=TrainConfig(epochs=1, warmup_epochs=0))
    meth.before_forward(ctx)
    meth.forward(ctx)
    ctx.losses = {t.name: t.fn(ctx) for t in meth.terms}
    ctx.weighted = {t.name: t.weight * ctx.losses[t.name] for t in meth.terms}
    ctx.loss = sum(ctx.weighted.values())
    return ctx


def test_bss_term_reaches_the_targets_gradient_at_the_default_eta(source):
    """The BSS rows of the first mini round equal fine-tuning's top-1: not a wiring bug. At the default eta 0.001 the
    gradient on the target's parameters differs from plain fine-tuning's by exactly eta x the back-propagation of
    d sigma_min^2 / dF = 2 sigma_min u v^T (numpy's SVD of the pre-logit features, B=6 < D=32): tiny, not zero."""
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(6, 3, 32, 32, generator=g), torch.tensor([0, 1, 2, 3, 0, 1])
    def grads(kind):
        torch.manual_seed(0)
        tgt = target_from_source(source, 4)
        ctx = _step_ctx(transfer_method(kind, tgt, source), tgt, x, y)
        ps = [p for p in tgt.parameters() if p.requires_grad]
        return tgt, ps, torch.autograd.grad(ctx.loss, ps)
    _, _, g_ft = grads("baseline")
    tgt, ps, g_bss = grads("bss")
    f = tgt.forward_head(tgt.forward_features(x), pre_logits=True)
    assert f.shape == (6, 32)
    u, s, vt = np.linalg.svd(f.detach().double().numpy(), full_matrices=False)
    dF = torch.tensor(0.001 * 2 * s[-1] * np.outer(u[:, -1], vt[-1]), dtype=f.dtype)
    golden = torch.autograd.grad(f, ps, grad_outputs=dF, allow_unused=True)   # the head does not feed F
    diff = torch.cat([(b - a).flatten() for a, b in zip(g_ft, g_bss)])
    want = torch.cat([(torch.zeros_like(p) if w is None else w).flatten() for w, p in zip(golden, ps)])
    assert want.norm() > 0 and diff.norm() > 0
    assert (diff - want).norm() < 5e-3 * want.norm()   # float32 cancellation: the difference is ~1e-3 of each gradient


def test_term_grad_norms_match_a_plain_backward_per_term(source):
    from attnrepro.gta import term_grad_norms
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(4, 3, 32, 32, generator=g), torch.tensor([0, 1, 2, 3])
    torch.manual_seed(1)
    tgt = target_from_source(source, 4)
    with torch.no_grad():   # move the target off the source, so the guidance has a gradient
        for p in tgt.parameters():
            p.add_(0.05 * torch.randn_like(p))
    ctx = _step_ctx(transfer_method("gta", tgt, source, 2.0), tgt, x, y)
    norms = term_grad_norms(ctx)
    assert set(norms) == {"ce", "ce_backbone", "gta", "gta_backbone"}
    for name in ("ce", "gta"):   # golden: the .grad a plain backward of that weighted term leaves
        tgt.zero_grad(set_to_none=True)
        ctx.weighted[name].backward(retain_graph=True)
        sq = {n: float(p.grad.pow(2).sum()) if p.grad is not None else 0.0 for n, p in tgt.named_parameters()}
        body = sum(v for n, v in sq.items() if not n.startswith("head."))
        assert norms[name] == pytest.approx(math.sqrt(sum(sq.values())), rel=1e-5)
        assert norms[f"{name}_backbone"] == pytest.approx(math.sqrt(body), rel=1e-5)
    assert norms["gta"] == pytest.approx(norms["gta_backbone"], rel=1e-6)   # no guidance gradient reaches the head
    assert norms["ce"] > norms["ce_backbone"] > 0
    torch.manual_seed(1)   # the same target and batch at lambda 20: the weighted guidance norm x 10, CE's unchanged
    tgt10 = target_from_source(source, 4)
    with torch.no_grad():
        for p in tgt10.parameters():
            p.add_(0.05 * torch.randn_like(p))
    norms10 = term_grad_norms(_step_ctx(transfer_method("gta", tgt10, source, 20.0), tgt10, x, y))
    assert norms10["gta"] == pytest.approx(10 * norms["gta"], rel=1e-5)
    assert norms10["ce"] == pytest.approx(norms["ce"], rel=1e-6)


def test_grad_norm_log_leaves_training_unchanged_and_scales_with_lambda(source):
    from attnrepro.gta import grad_norm_summary
    g = torch.Generator().manual_seed(4)
    data = TensorDataset(torch.rand(32, 3, 32, 32, generator=g), torch.randint(0, 4, (32,), generator=g))
    def train(every, coef=1.0):
        torch.manual_seed(0)
        tgt = target_from_source(source, 4, drop_path_rate=0.1)
        meth = transfer_method("gta", tgt, source, coef, grad_norm_every=every)
        fit(tgt, data, None, TrainConfig(epochs=2, batch_size=8, lr=1e-3, warmup_epochs=0, seed=3), method=meth,
            progress=False)
        return tgt.state_dict(), meth.state.get("grad_norms", [])
    (plain, none), (logged, log) = train(None), train(3)
    assert none == [] and all(torch.equal(plain[k], logged[k]) for k in plain)   # the log changes no update
    assert [r["step"] for r in log] == [0, 3, 6]   # 2 epochs x 4 steps
    # step 0: the target is the source (block 0 has no drop-path, and a block's drop-path acts after its logits)
    assert log[0]["gta"] == 0.0 and log[0]["ce"] > 0 and log[1]["gta"] > 0
    s = grad_norm_summary(log)
    assert s["n_steps"] == 2 and s["gta"] == pytest.approx(float(np.median([log[1]["gta"], log[2]["gta"]])))
    assert grad_norm_summary([]) == {}
    assert grad_norm_summary([{"step": 0, "ce": 1.0}]) == {"ce": 1.0, "n_steps": 1}   # only step 0: kept
    with pytest.raises(ValueError, match="grad_norm_every must be a positive int"):
        transfer_method("gta", target_from_source(source, 4), source, grad_norm_every=0)


def test_best_coef_reports_ties_instead_of_hiding_them():
    from attnrepro.gta import best_coef, tie_text
    chosen, tied = best_coef({100.0: 41.2, 1.0: 41.2, 10.0: 41.2})   # three identical runs (AdamW, issue #23)
    assert chosen == 1.0 and tied == (1.0, 10.0, 100.0) and tie_text(tied) == "1=10=100"
    assert best_coef({0.1: 50.0, 1.0: 52.5, 10.0: 52.0}) == (1.0, (1.0,))
    assert tie_text(best_coef({0.1: 50.0, 1.0: 52.5})[1]) == "1"
    with pytest.raises(ValueError, match="no scores"):
        best_coef({})
    with pytest.raises(ValueError, match="non-finite"):
        best_coef({1.0: float("nan"), 10.0: 3.0})


class _Tagged(torch.utils.data.Dataset):
    def __init__(self, targets, tag):
        self.targets, self.classes, self.tag = list(targets), ["a", "b", "c"], tag
    def __len__(self): return len(self.targets)
    def __getitem__(self, i): return self.tag, self.targets[i]


def test_heldout_split_is_class_balanced_seeded_and_disjoint():
    from attnrepro.gta import heldout_split
    ys = [0] * 20 + [1] * 10 + [2] * 3 + [0] * 5
    fit_part, held = heldout_split(_Tagged(ys, "aug"), 0.2, seed=0, eval_dataset=_Tagged(ys, "eval"))
    # round(n_c x 0.2) held out per class: 25 -> 5, 10 -> 2, 3 -> 1 (0.6 rounds up; never all of a class)
    assert np.bincount(held.targets).tolist() == [5, 2, 1] and np.bincount(fit_part.targets).tolist() == [20, 8, 2]
    assert sorted(fit_part.indices + held.indices) == list(range(len(ys)))
    assert held[0][0] == "eval" and fit_part[0][0] == "aug"   # held out under the evaluation transform
    again = heldout_split(_Tagged(ys, "aug"), 0.2, seed=0)[1]
    other = heldout_split(_Tagged(ys, "aug"), 0.2, seed=1)[1]
    assert again.indices == held.indices and other.indices != held.indices
    assert np.bincount(heldout_split(_Tagged([0, 0, 1, 1], "x"), 0.1)[1].targets).tolist() == [1, 1]   # at least 1
    with pytest.raises(ValueError, match="at least 2 per class"):
        heldout_split(_Tagged([0, 0, 1], "x"), 0.5)
    with pytest.raises(ValueError, match=r"fraction must be in \(0, 1\)"):
        heldout_split(_Tagged(ys, "x"), 1.0)
    with pytest.raises(ValueError, match="targets differ"):
        heldout_split(_Tagged(ys, "x"), 0.2, eval_dataset=_Tagged(ys[::-1], "y"))


def test_paper_profile_names_registered_datasets_splits_and_states_its_assumptions():
    from attnrepro.data import DATASETS
    from attnrepro.report import load_profile
    P = load_profile("gta", "paper")
    assert {d["name"] for d in P["datasets"].values()} == {"cub200", "stanford_cars", "fgvc_aircraft",
                                                            "stanford_dogs", "oxford_pet"}
    for key, d in P["datasets"].items():
        assert d["name"] in DATASETS, key
        assert {d["train"], d["test"]} <= set(DATASETS[d["name"]].splits), (key, DATASETS[d["name"]].splits)
    assert {"drop_path", "warmup_epochs", "min_lr"} <= set(P["train"])   # the unstated choices, stated as data
    assert "in21k" not in P["sources"]["sl"]   # the paper's SL and SSL sources both saw ImageNet-1k only


@pytest.mark.parametrize("name, where", [("cub200", "vision.caltech.edu"), ("stanford_dogs", "vision.stanford.edu")])
def test_datasets_torchvision_lacks_say_where_to_get_them(name, where, tmp_path, monkeypatch):
    from attnrepro import data
    monkeypatch.setattr(data, "data_roots", lambda root=None: [tmp_path])
    monkeypatch.delenv("ATTNREPRO_DOWNLOAD", raising=False)
    with pytest.raises(data.DataNotFoundError, match=where):
        data.get_dataset(name, "train")


@pytest.mark.parametrize("feature,layers", [("attn_logits", None), ("attn_logits", [0]), ("block", [1]),
                                            ("msa", [0, 1])])
def test_source_stops_after_the_last_guided_block_and_gives_the_full_forwards_loss(feature, layers):
    "The source runs blocks 0..last guided one only (no later block, norm or head); the loss equals a full forward's."
    from attnrepro.gta import gta_features, gta_taps
    torch.manual_seed(0)
    src = frozen_copy(create_student("vit", img_size=32, patch_size=8, embed_dim=32, depth=3, num_heads=2,
                                     num_classes=5))
    tgt = target_from_source(src, 4)
    with torch.no_grad():                       # move the target away from the source: a non-zero loss
        for p in tgt.parameters():
            p.add_(0.05 * torch.randn_like(p))
    x = torch.randn(3, 3, 32, 32)
    meth = TransferMethod(tgt, src, [guidance_term(feature, 1.0, layers)])
    ran = []
    hooks = [b.register_forward_hook(lambda *a, k=k: ran.append(k)) for k, b in enumerate(src.blocks)]
    hooks += [m.register_forward_hook(lambda *a, n=n: ran.append(n)) for n, m in (("norm", src.norm), ("head", src.head))]
    ctx = StepContext(x=x, y=torch.zeros(3, dtype=torch.long), target=None, model=tgt, train_model=tgt,
                      device=torch.device("cpu"), step=0, cfg=TrainConfig(epochs=1, warmup_epochs=0))
    meth.before_forward(ctx)
    last = max(layers or [2])
    assert ran == list(range(last + 1))
    meth.forward(ctx)
    got = meth.terms[1].fn(ctx)
    ran.clear()
    keep = layers or [0, 1, 2]
    with torch.no_grad(), gta_taps(src, {feature: keep}) as tap:   # the full forward, as before the early stop
        src(x)
    full = gta_features(tap)
    assert ran == [0, 1, 2, "norm", "head"]
    for h in hooks: h.remove()
    want = guidance_loss({i: ctx.student[feature][i] for i in keep}, {i: full[feature][i] for i in keep}, feature)
    assert got.item() > 0 and torch.equal(got, want)   # bit for bit: the same operations on the same blocks
    for i in keep:
        assert torch.equal(ctx.teacher[feature][i], full[feature][i])


def test_source_runs_in_full_when_a_term_reads_its_head_input(source):
    "A term that declares the source's pre-logits (the head's input) gets the whole forward."
    from attnrepro.gta import TapTerm
    tgt = target_from_source(source, 4)
    term = TapTerm("src_feat", lambda ctx: ctx.teacher["pre_logits"].pow(2).mean(), 1.0,
                   source_needs={"pre_logits": None})
    meth = TransferMethod(tgt, source, [term])
    x = torch.randn(2, 3, 32, 32)
    ctx = StepContext(x=x, y=torch.zeros(2, dtype=torch.long), target=None, model=tgt, train_model=tgt,
                      device=torch.device("cpu"), step=0, cfg=TrainConfig(epochs=1, warmup_epochs=0))
    meth.before_forward(ctx)
    with torch.no_grad():
        torch.testing.assert_close(ctx.teacher["pre_logits"], source.forward_head(source.forward_features(x),
                                                                                         pre_logits=True))


def test_table2c_rows_and_paper_figures():
    "Table 2c's rows from a run's gradient-norm log; Figures 1, 3 and 4 from result-shaped data."
    import numpy as np
    import pandas as pd
    from attnrepro.gta import grad_norm_summary
    from attnrepro.papers.gta import grad_norm_rows, plot_attention_masks, plot_attention_overlays, plot_lambda_sweep
    log = [dict(step=s, ce=1.0, ce_backbone=0.5, gta=0.01, gta_backbone=0.005) for s in range(3)]
    runs = pd.DataFrame([dict(dataset="cub", method="gta", rate=0.15, coef=0.1, grad_norms=log),
                         dict(dataset="cub", method="baseline", rate=0.15, coef=None, grad_norms=None)])
    rows = grad_norm_rows(runs, {"cub": "CUB"})
    s = grad_norm_summary(log)
    assert len(rows) == 1 and rows[0]["fraction"] == "15%" and rows[0]["coef"] == "lambda=0.1"
    assert rows[0]["log10 term/CE (backbone)"] == pytest.approx(np.log10(s["gta_backbone"] / s["ce_backbone"]))
    ims = [np.zeros((16, 16, 3), np.uint8)] * 2
    maps = np.random.default_rng(0).random((2, 4, 4))
    fig = plot_attention_overlays(ims, [("GTA", maps)], "1")
    assert [a.get_title() for a in fig.axes[:2]] == ["image", "GTA"]
    fig = plot_attention_masks(ims, [np.array([[0, 0, 8, 8]])] * 2, [("GTA", maps)], 0.6, "3")
    assert fig.axes[1].get_title().startswith("GTA: J=") and fig.axes[3].get_title().startswith("J=")
    fig = plot_lambda_sweep({"CUB": {"15%": ([0.1, 1.0], [40.0, 38.0], 41.0)}}, "4")
    assert fig.axes[0].get_title() == "CUB" and len(fig.axes[0].lines) == 2


def test_batch_and_epochs_fixes_steps_and_handles_a_subset_smaller_than_the_batch():
    from attnrepro.papers.gta import batch_and_epochs
    assert batch_and_epochs(750, dict(steps=400, batch_size=32)) == (32, 18)   # 23 steps an epoch: 18 epochs >= 400 steps
    with pytest.raises(ValueError, match="555 training images give no batch of 768.*small_subset: whole"):
        batch_and_epochs(555, dict(steps=3000, batch_size=768))
    # the paper's Pet at 15 %: one even batch of the whole subset per step, so 3000 steps are 3000 epochs
    assert batch_and_epochs(555, dict(steps=3000, batch_size=768, small_subset="whole")) == (554, 3000)
    with pytest.raises(ValueError, match="small_subset='all'"):
        batch_and_epochs(555, dict(steps=3, batch_size=768, small_subset="all"))
    with pytest.raises(ValueError, match="1 training images"):
        batch_and_epochs(1, dict(steps=3, batch_size=8, small_subset="whole"))


def test_paper_profile_trains_pet_at_15_percent():
    "The paper's Oxford-IIIT Pet at 15 % (555 images) is smaller than its batch of 768: the profile must allow it."
    from attnrepro.papers.gta import batch_and_epochs
    from attnrepro.report import load_profile
    P = load_profile("gta", "paper")
    assert batch_and_epochs(555, P["train"])[0] == 554 and P["train"]["amp"] is True


def test_every_train_key_takes_effect_in_a_fine_tuning_run():
    "Issue #47: `finetune_run` used to copy a fixed list of train keys, dropping betas, label smoothing and clipping."
    from attnrepro.papers.gta import FINETUNE_DEFAULTS, finetune_train_config
    from attnrepro.report import load_profile
    t = dict(steps=10, batch_size=8, lr=1e-4, weight_decay=0.05, drop_path=0.1, randaugment=None, small_subset="whole",
             betas=[0.9, 0.95], label_smoothing=0.1, grad_clip=1.0, amp=True, warmup_epochs=1, min_lr=1e-6)
    cfg = finetune_train_config(t, batch=6, epochs=4, seed=3)
    assert (cfg.betas, cfg.label_smoothing, cfg.grad_clip, cfg.amp, cfg.warmup_epochs, cfg.min_lr) == ((0.9, 0.95), 0.1, 1.0,
                                                                                                      True, 1, 1e-6)
    assert (cfg.batch_size, cfg.epochs, cfg.seed, cfg.eval_every, cfg.lr, cfg.weight_decay) == (6, 4, 3, 4, 1e-4, 0.05)
    assert finetune_train_config(t, 6, 4, 3, {"weight_decay": 0.0}).weight_decay == 0.0   # L2-SP's own override
    # where the recipe is silent: finetune_run's long-standing defaults (the committed mini runs trained so)
    bare = {k: t[k] for k in ("steps", "batch_size", "lr", "weight_decay", "drop_path", "randaugment")}
    cfg = finetune_train_config(bare, 8, 5, 0)
    assert {k: getattr(cfg, k) for k in FINETUNE_DEFAULTS} == FINETUNE_DEFAULTS and cfg.label_smoothing == 0.0
    for bad, match in ((dict(epochs=3), "'epochs' cannot be set here"), (dict(ema_decay=0.999), "'ema_decay'"),
                       (dict(betass=[0.9, 0.9]), "'betass' is no setting")):
        with pytest.raises(ValueError, match=match):
            finetune_train_config({**bare, **bad}, 8, 5, 0)
    with pytest.raises(ValueError, match="missing"):
        finetune_train_config({k: v for k, v in bare.items() if k != "lr"}, 8, 5, 0)
    P = load_profile("gta", "paper")   # the published recipe: AdamW (0.9, 0.999), no smoothing, no clipping, bf16
    cfg = finetune_train_config(P["train"], 768, 4, 0)
    assert (cfg.betas, cfg.label_smoothing, cfg.grad_clip, cfg.amp, cfg.optimizer) == ((0.9, 0.999), 0.0, None, True, "adamw")


def test_a_dry_run_analyses_a_handful_of_images(monkeypatch):
    "A dry run times training: its analyses (CLS entropy, mask Jaccard, held-out top-1) take `DRY_RUN_IMAGES` images."
    from attnrepro.papers.gta import DRY_RUN_IMAGES, dry_run_head
    data = TensorDataset(torch.zeros(50, 1))
    monkeypatch.delenv("ATTNREPRO_DRY_RUN", raising=False)
    assert dry_run_head(data) is data
    monkeypatch.setenv("ATTNREPRO_DRY_RUN", "1")
    assert len(dry_run_head(data)) == DRY_RUN_IMAGES < 50 and len(dry_run_head(data, 100)) == 50


def test_a_dry_run_draws_every_figure_image_of_a_box_target(monkeypatch):
    "Fig. 1 takes `figure_images` maps in a dry run too, although the mask Jaccard reads only `DRY_RUN_IMAGES` images."
    from attnrepro.data import eval_transform
    from attnrepro.papers.gta import DRY_RUN_IMAGES, attention_outputs, target_dataset
    spec = {"name": "tiny-imagenet-sample", "train": "train", "test": "val", "classes": None}
    test = target_dataset(spec, "test", eval_transform(32))
    assert test.boxes is not None and len(test) > 2 * DRY_RUN_IMAGES
    model = create_student("vit", img_size=32, patch_size=8, embed_dim=16, depth=1, num_heads=2, num_classes=5)
    monkeypatch.setenv("ATTNREPRO_DRY_RUN", "1")
    out = attention_outputs(model, test, dict(dataset=spec, img_size=32, keep_mass=0.6,
                                              figure_images=DRY_RUN_IMAGES + 2))
    assert len(out["maps"]) == DRY_RUN_IMAGES + 2 and "jaccard" in out


# --- the paper notebook's runs and tables (issue #17: table assembly in the library) ----------------------------------

class _FakePaperRun:
    "`PaperRun.run_many` without training: each config's result is a function of its method, rate and coef."
    def __init__(self):
        self.items = []

    def run_many(self, items, fn):
        items = list(items)
        self.items += items
        c = lambda cfg: cfg["coef"] or 0.0
        # test-set top-1 rises with the coefficient, held-out top-1 falls with it: the selection column decides
        return [dict(acc1=40.0 + 10 * cfg["rate"] + c(cfg) + (2.0 if cfg["method"] == "gta" else 0.0),
                     heldout_acc1=40.0 - c(cfg), n_test=100, n_train=10) for _, cfg in items]


def test_gta_runs_record_the_notebooks_configs_and_select_on_the_heldout_part():
    from attnrepro.papers.gta import GtaRuns, run_config
    from attnrepro.report import load_profile
    P = load_profile("gta", "smoke")   # heldout: 0.2
    pr = _FakePaperRun()
    G = GtaRuns(P, pr)
    G.record_many([("gta", "out", 0.15, 0, 1.0), ("gta", "out", 0.15, 0, 10.0), ("baseline", "out", 0.15, 0)])
    assert [n for n, _ in pr.items] == ["gta-out-0.15-s0-1.0-ssl", "gta-out-0.15-s0-10.0-ssl", "baseline-out-0.15-s0-None-ssl"]
    assert pr.items[0][1] == run_config(P, "gta", "out", 0.15, 0, 1.0, "ssl")   # the configs (and cache keys) of the grid
    G.record("baseline", "out", 0.15, 0)   # recorded twice: one row
    assert len(G.df) == 3 and G.df.source.tolist() == ["ssl"] * 3
    assert G.best_lambda("out", 0.15) == 1.0 and "held-out 20%" in G.select_on   # the test set would pick 10
    assert G.select("gta", "out", 0.15, coef=10.0).acc1.tolist() == [53.5]


def test_tables_3_5_6_run_every_seed_at_the_paper_profile():
    "Issue #47: the paper repeats each experiment three times (Sec. 4); smoke and mini keep their committed grids."
    from attnrepro.papers.gta import GtaRuns
    from attnrepro.report import load_profile
    seeds = {}
    for profile in ("smoke", "mini", "paper"):
        P, pr = load_profile("gta", profile), _FakePaperRun()
        pr.profile = profile
        G = GtaRuns(P, pr)
        seeds[profile] = {(t, r): G.table_seeds(t, r) for t, rates in ((3, "table3_rates"), (5, "table5_rates"),
                                                                        (6, "table6_rates")) for r in P[rates]}
    assert all(v == [0, 1, 2] for v in seeds["paper"].values()) and len(seeds["paper"]) == 10
    assert all(v == [0] for v in seeds["smoke"].values())
    assert seeds["mini"] == {(3, 0.15): [0], (5, 0.15): [0], (5, 1.0): [0], (6, 0.15): [0, 1, 2], (6, 1.0): [0]}
    P = load_profile("gta", "paper")   # Fig. 1's columns: 15 % and 100 % (its caption)
    assert (min(P["table4_rates"]), max(P["table4_rates"])) == (0.15, 1.0)


def test_gta_table_2b_sets_our_gaps_beside_the_papers():
    from attnrepro.papers.gta import GtaRuns, table_2b
    from attnrepro.report import load_profile
    P = load_profile("gta", "smoke")
    G = GtaRuns(P, _FakePaperRun())
    G.record_many([(m, d, r, 0) + ((1.0,) if m == "gta" else ()) for d in P["datasets"] for r in P["rates"]
                   for m in ("gta", "baseline")])
    G.choose_lambdas()
    t, cap = table_2b(G, "smoke")
    assert t.fraction.tolist()[:2] == ["15%", "100%"] and t.fraction.tolist()[2].startswith("15% range: ")
    assert t["CUB GTA − baseline (paper)"].tolist()[:2] == [10.149, 1.099]
    ours = [c for c in t.columns if c.endswith("(ours, smoke)")]
    assert len(ours) == 2 and t[ours[0]].tolist()[:2] == [3.0, 3.0]   # gta: +2 points and lambda 1 over the baseline
    assert t["paper range"].tolist()[2:] == ["2.52 to 10.15", "2.35 to 8.89"] and "Sec. 4.1" in cap
    assert G.spread_note.startswith("No row has several seeds")   # smoke: one seed everywhere
