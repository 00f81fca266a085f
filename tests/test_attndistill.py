"""AttnDistill: clamp/renormalise, head aggregation, interpolation, KL/MSE attention loss, projector, CompRess,
patch alignment, the composed Method (terms, gradients, resume-safe extra modules) and per-layer evaluation."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from attnrepro.attention import attention_maps
from attnrepro.attndistill import (AGGREGATIONS, CompRessQueue, Projector, aggregate_heads, attndistill_method,
                                   clamp_renorm, cls_attention_loss, compress_loss, interpolate_cls_attention,
                                   layer_pairs, patch_alignment_loss, projector_dims, projector_layer_features,
                                   teacher_targets, value_weighted)
from attnrepro.papers.attndistill import loss_shares
from attnrepro.models import create_student, describe_model
from attnrepro.train import TrainConfig, fit
from attnrepro.protocol import StepContext


def vit(embed=32, depth=2, heads=2, patch=8, seed=0):
    torch.manual_seed(seed)
    return create_student("vit", img_size=32, patch_size=patch, embed_dim=embed, depth=depth, num_heads=heads,
                          num_classes=0)


def data(n=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 4, (n,), generator=g))


def np_clamp(x):
    x = np.clip(np.asarray(x, dtype=np.float64), 1e-5, 0.996)
    return x / x.sum(-1, keepdims=True)


def np_kl(s, t, batch):
    return float((t * np.log(t / s)).sum() / batch)


# --- pieces -------------------------------------------------------------------------------------------------

def test_clamp_renorm_golden():
    p = torch.tensor([[0.999, 0.001, 0.0]])
    np.testing.assert_allclose(clamp_renorm(p).numpy(), np_clamp(p.numpy()), rtol=1e-6)
    with pytest.raises(ValueError, match="lo < hi"):
        clamp_renorm(p, 0.5, 0.4)


@pytest.mark.parametrize("how", AGGREGATIONS)
@pytest.mark.parametrize("T", [1.0, 10.0])
def test_aggregate_heads_golden(how, T):
    a = torch.tensor([[[0.6, 0.3, 0.1], [0.2, 0.2, 0.6], [0.1, 0.8, 0.1]]])
    x = a[0].numpy().astype(np.float64)
    z = {"logsum": np.log(x).sum(0), "mean": np.log(x.mean(0)), "max": np.log(x.max(0)), "min": np.log(x.min(0))}[how]
    ref = np.exp(z / T - (z / T).max()); ref /= ref.sum()
    np.testing.assert_allclose(aggregate_heads(a, how, T)[0].numpy(), ref, rtol=1e-5)


def test_aggregate_heads_errors():
    with pytest.raises(ValueError, match="valid"):
        aggregate_heads(torch.rand(1, 2, 3), "median")
    with pytest.raises(ValueError, match="T must be > 0"):
        aggregate_heads(torch.rand(1, 2, 3), "logsum", 0.0)


def test_interpolation_keeps_cls_mass_and_matches_bicubic():
    torch.manual_seed(0)
    t = torch.rand(2, 3, 1 + 64).softmax(-1)
    r = interpolate_cls_attention(t, (8, 8), (4, 4))
    torch.testing.assert_close(r[..., 0], t[..., 0])
    torch.testing.assert_close(r.sum(-1), torch.ones(2, 3))
    ref = F.interpolate(t[..., 1:].reshape(2, 3, 8, 8), size=(4, 4), mode="bicubic", align_corners=False).reshape(2, 3, 16)
    ref = ref * (1 - t[..., :1]) / ref.sum(-1, keepdim=True)
    torch.testing.assert_close(r[..., 1:], ref)


def test_value_weighted_golden():
    a = torch.tensor([[[0.2, 0.5, 0.3]]])
    v = torch.tensor([[[[3.0, 4.0], [1.0, 0.0], [0.0, 2.0]]]])
    np.testing.assert_allclose(value_weighted(a, v)[0, 0].numpy(), np.array([1.0, 0.5, 0.6]) / 2.1, rtol=1e-6)


# --- the attention loss ------------------------------------------------------------------------------------------

def test_kl_and_mse_golden_same_heads():
    torch.manual_seed(3)
    s, t = torch.rand(3, 2, 10).softmax(-1), torch.rand(3, 2, 10).softmax(-1)
    sn, tn = np_clamp(s.numpy()), np_clamp(t.numpy())
    np.testing.assert_allclose(cls_attention_loss(s, t).item(), np_kl(sn, tn, 3), rtol=1e-5)
    np.testing.assert_allclose(cls_attention_loss(s, t, loss="mse").item(), ((sn - tn) ** 2).sum() / 3, rtol=1e-5)
    # equal heads with "auto" do not aggregate: T plays no role
    assert cls_attention_loss(s, t, T=1.0) == cls_attention_loss(s, t, T=50.0)


def test_kl_golden_with_aggregation_and_interpolation():
    torch.manual_seed(4)
    s, t = torch.rand(2, 3, 1 + 4).softmax(-1), torch.rand(2, 6, 1 + 16).softmax(-1)
    ti = interpolate_cls_attention(t, (4, 4), (2, 2)).numpy().astype(np.float64)
    def agg(x, T):
        z = np.log(np.clip(x, 1e-12, None)).sum(1) / T
        z = np.exp(z - z.max(-1, keepdims=True))
        return z / z.sum(-1, keepdims=True)
    sn, tn = np_clamp(agg(s.numpy().astype(np.float64), 10.0)), np_clamp(agg(ti, 10.0))
    np.testing.assert_allclose(cls_attention_loss(s, t, T=10.0).item(), np_kl(sn, tn, 2), rtol=1e-4)


def test_aggregated_kl_scales_as_one_over_T_squared():
    """Log-sum aggregation at temperature T: KL(softmax(z_t / T) || softmax(z_s / T)) -> Var_keys(z_t - z_s) / (2 T^2)
    (second-order expansion around the uniform map), so at T = 10 the aggregated term is ~100x smaller than the
    logits' spread suggests. Golden: that limit, computed by hand, at 3 heads x 65 keys (our mini maps)."""
    torch.manual_seed(5)
    s, t = (torch.randn(4, 3, 65) * 2).softmax(-1), (torch.randn(4, 3, 65) * 2).softmax(-1)
    d = (t.double().log().sum(1) - s.double().log().sum(1)).numpy()          # z_t - z_s per image, over keys
    limit = float((d.var(-1) / 2).mean())                                     # batchmean of Var_uniform / 2
    kl = {T: cls_attention_loss(s, t, T=T, aggregate="logsum").item() for T in (10.0, 20.0, 100.0)}
    np.testing.assert_allclose(kl[100.0] * 100.0 ** 2, limit, rtol=0.01)
    np.testing.assert_allclose(kl[10.0] * 10.0 ** 2, limit, rtol=0.03)        # already in the 1/T^2 regime at T = 10
    assert 3.9 < kl[10.0] / kl[20.0] < 4.1
    # the per-head KL of the same maps (no aggregation, same head count) is orders of magnitude larger
    assert cls_attention_loss(s, t, aggregate=None).item() > 50 * kl[10.0]


def test_loss_shares_golden():
    "From the committed mini runs (last epoch's per-term means; loss = feat + lambda attn, lambda = 0.1)."
    base_ad = {"loss": [0.133519], "loss_attn": [0.585768], "loss_feat": [0.074942]}
    heads_ad = {"loss": [0.074114], "loss_attn": [0.008856], "loss_feat": [0.073228]}
    s = loss_shares(base_ad, 0.1)
    np.testing.assert_allclose([s["attn_raw"], s["attn_weighted"], s["feat"]], [0.585768, 0.0585768, 0.074942])
    np.testing.assert_allclose(s["attn_share"], 0.0585768 / 0.133519)            # 43.9 %
    np.testing.assert_allclose(s["feat"] + s["attn_weighted"], base_ad["loss"][0], atol=1e-6)
    np.testing.assert_allclose(loss_shares(heads_ad, 0.1)["attn_share"], 0.0008856 / 0.074114)   # 1.2 %
    pa = loss_shares({"loss": [0.3, 0.073226], "loss_feat": [0.3, 0.073226]}, 0.0)
    assert pa["attn_share"] == 0 and pa["attn_raw"] == 0 and pa["feat"] == 0.073226
    assert loss_shares({"loss": [1.0, 0.5], "loss_attn": [2.0, 1.0]}, 0.5, epoch=0)["attn_share"] == 1.0
    with pytest.raises(KeyError, match="total"):
        loss_shares({"loss_feat": [1.0]}, 0.1)


def test_attention_loss_errors():
    s, t = torch.rand(2, 3, 5).softmax(-1), torch.rand(2, 6, 5).softmax(-1)
    with pytest.raises(ValueError, match="head counts differ"):
        cls_attention_loss(s, t, aggregate=None)
    with pytest.raises(ValueError, match="interpolate=True"):
        cls_attention_loss(s, torch.rand(2, 3, 17).softmax(-1), interpolate=False)
    with pytest.raises(ValueError, match="valid"):
        cls_attention_loss(s, s, loss="l1")


def test_attention_loss_gradients_reach_student_only():
    s_logits = torch.randn(2, 2, 17, requires_grad=True)
    t_logits = torch.randn(2, 4, 65, requires_grad=True)
    loss = cls_attention_loss(s_logits.softmax(-1), t_logits.softmax(-1))
    loss.backward()
    assert torch.isfinite(loss) and s_logits.grad.abs().sum() > 0 and t_logits.grad is None


# --- projector, CompRess, patch alignment -------------------------------------------------------------------

@pytest.mark.parametrize("n,dims", [(1, [8, 16]), (2, [8, 16, 16]), (4, [8, 16, 8, 16, 16]),
                                    (8, [8, 16, 8, 16, 8, 16, 8, 16, 16])])
def test_projector_dims_and_layers(n, dims):
    assert projector_dims(8, 16, n) == dims
    p = Projector(8, 16, n)
    outs = p.forward_layers(torch.randn(3, 8))
    assert len(outs) == n and [o.shape[-1] for o in outs] == dims[1:]
    out = outs[-1]  # after the output LayerNorm (no affine change at init): zero mean, unit variance
    torch.testing.assert_close(out.mean(-1), torch.zeros(3), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="n_layers"):
        projector_dims(8, 16, 0)


def test_compress_loss_golden_and_queue():
    q = CompRessQueue(3, size=2)
    q.push(torch.tensor([[2.0, 0, 0], [0, 0, 5.0], [0, 1.0, 0]]))     # more than the size: the last 2 are kept
    assert int(q.filled) == 2 and torch.allclose(q.anchors(), torch.tensor([[0, 0, 1.0], [0, 1.0, 0]]))
    torch.manual_seed(0)
    s, t = torch.randn(2, 3), torch.randn(2, 3)
    sn = s.numpy() / np.linalg.norm(s.numpy(), axis=1, keepdims=True)
    tn = t.numpy() / np.linalg.norm(t.numpy(), axis=1, keepdims=True)
    A = np.concatenate([q.anchors().numpy(), tn])
    def sm(z): z = np.exp(z - z.max(1, keepdims=True)); return z / z.sum(1, keepdims=True)
    ps, pt = sm(sn @ A.T / 0.1), sm(tn @ A.T / 0.1)
    np.testing.assert_allclose(compress_loss(s, t, q.anchors(), tau=0.1).item(), np_kl(ps, pt, 2), rtol=1e-4)


def test_patch_alignment_interpolates_teacher():
    t = torch.randn(2, 16, 5)
    s = torch.randn(2, 4, 5)
    ref = F.interpolate(t.transpose(1, 2).reshape(2, 5, 4, 4), size=(2, 2), mode="bicubic",
                        align_corners=False).flatten(2).transpose(1, 2)
    torch.testing.assert_close(patch_alignment_loss(s, t, (2, 2), (4, 4)), F.mse_loss(s, ref))


def test_layer_pairs():
    assert layer_pairs(6, 6) == [(5, 5)]
    assert layer_pairs(4, 6, "all") == [(0, 1), (1, 2), (2, 4), (3, 5)]   # ceil((i+1) * 6 / 4) - 1
    assert layer_pairs(3, 2, "all") == [(0, 0), (1, 1), (2, 1)]
    with pytest.raises(ValueError, match="valid"):
        layer_pairs(4, 6, "first")


# --- the method ------------------------------------------------------------------------------------------

def test_method_terms_equal_independent_computation():
    teacher, student = vit(32, 2, 4, 8), vit(16, 2, 2, 16, seed=1)
    m = attndistill_method(student, teacher)
    assert [t.name for t in m.terms] == ["feat", "attn"] and m.terms[1].weight == 0.1
    x = data().tensors[0][:4]
    ctx = StepContext(x=x, model=student, train_model=student, modules=m.extra_modules, device=torch.device("cpu"))
    m.before_forward(ctx); m.forward(ctx)
    ref_attn = cls_attention_loss(attention_maps(student, x, [-1], cls_only=True)[0],
                                  attention_maps(teacher, x, [-1], cls_only=True)[0], 10.0, "logsum")
    torch.testing.assert_close(m.terms[1].fn(ctx), ref_attn)
    tok = student.blocks(student.norm_pre(student._pos_embed(student.patch_embed(x))))
    with torch.no_grad():
        t_cls = teacher.forward_features(x)[:, 0]
    torch.testing.assert_close(m.terms[0].fn(ctx), F.mse_loss(m.extra_modules["projector"](tok[:, 0]), t_cls))


def test_teacher_targets_value_capture():
    teacher = vit(32, 2, 4, 8)
    out = teacher_targets(teacher, torch.randn(2, 3, 32, 32), [1], with_v=True)
    assert out["cls"].shape == (2, 32) and out["patches"].shape == (2, 16, 32)
    assert out["maps"][0].shape == (2, 4, 17) and out["v"][0].shape == (2, 4, 17, 8)
    assert not out["cls"].requires_grad


@pytest.mark.parametrize("opts", [dict(), dict(attn_weight=0.0), dict(aggregate="max", attn_loss="mse"),
                                  dict(value_weight=True, attn_layers="all"),
                                  dict(feature_weight=0.0, compress_weight=1.0, compress_queue=8),
                                  dict(patch_align_weight=1.0, proj_layers=1)])
def test_method_trains_one_epoch(opts):
    teacher, student = vit(32, 2, 4, 8), vit(16, 3, 2, 16, seed=1)
    m = attndistill_method(student, teacher, **opts)
    t_before = {k: v.clone() for k, v in teacher.state_dict().items()}
    w0 = student.blocks[0].attn.qkv.weight.detach().clone()
    res = fit(student, data(), None, TrainConfig(epochs=1, batch_size=4, lr=1e-3, warmup_epochs=0), method=m,
              progress=False)
    h = res["history"][0]
    assert all(math.isfinite(h[f"loss_{t.name}"]) for t in m.terms)
    assert not torch.equal(student.blocks[0].attn.qkv.weight, w0)
    assert all(torch.equal(v, teacher.state_dict()[k]) for k, v in t_before.items())   # frozen teacher
    assert torch.equal(student.norm.weight, torch.ones_like(student.norm.weight))        # layer-0 norm untrained


def test_compress_queue_takes_every_micro_batch_once_per_step():
    "Under gradient accumulation every micro-batch's keys enter the bank, after the optimiser step, as one batch's."
    def train(batch, accum):
        teacher, student = vit(32, 2, 4, 8), vit(16, 3, 2, 16, seed=1)
        m = attndistill_method(student, teacher, feature_weight=0.0, compress_weight=1.0, compress_queue=64)
        fit(student, data(), None, TrainConfig(epochs=1, batch_size=batch, accum_steps=accum, lr=1e-3, warmup_epochs=0,
                                               seed=0), method=m, progress=False)
        return m.extra_modules["compress_queue"]
    one, acc = train(8, 1), train(4, 2)
    assert int(one.filled) == int(acc.filled) == 16 and not acc._staged      # 2 steps x 8 keys, nothing left over
    # same images in the same order: same keys, up to the rounding of a student trained on half batches (none here:
    # the teacher is frozen and the keys are its features)
    torch.testing.assert_close(acc.bank, one.bank)
    q = CompRessQueue(2, size=8)
    q.stage(torch.tensor([[1.0, 0.0]])); q.stage(torch.tensor([[0.0, 3.0]]))
    assert int(q.filled) == 0                                                   # staged keys wait for the step
    q.push_staged(); q.push_staged()                                            # the second: nothing staged
    assert int(q.filled) == 2 and torch.equal(q.anchors(), torch.tensor([[1.0, 0.0], [0.0, 1.0]]))


def test_method_argument_errors():
    teacher = vit(32, 2, 4, 8)
    with pytest.raises(ValueError, match="choose aggregate"):
        attndistill_method(vit(16, 2, 2, 8), teacher, aggregate=None)
    with pytest.raises(ValueError, match="interpolate=True"):
        attndistill_method(vit(16, 2, 4, 16), teacher, interpolate=False)
    with pytest.raises(ValueError, match="every weight is 0"):
        attndistill_method(vit(16, 2, 4, 8), teacher, feature_weight=0.0, attn_weight=0.0)
    with pytest.raises(TypeError, match="VisionTransformer"):
        attndistill_method(torch.nn.Linear(2, 2), teacher)


def test_projector_layer_features():
    student, proj = vit(16, 2, 2, 8), Projector(16, 24, 4)
    feats, y = projector_layer_features(student, proj, DataLoader(data(10), batch_size=4))
    assert [tuple(f.shape) for f in feats] == [(10, 16), (10, 32), (10, 16), (10, 32), (10, 24)] and y.shape == (10,)
    with torch.no_grad():
        torch.testing.assert_close(feats[0], student.forward_features(data(10).tensors[0])[:, 0])
    assert all(torch.isfinite(f).all() for f in feats)


# --- the paper profile as configuration --------------------------------------------------------------------------

def test_paper_profile_students_match_table_7_and_probe_table_9():
    from attnrepro.report import load_profile, load_reported
    P = load_profile("attndistill", "paper")
    t7 = load_reported("attndistill", "table7_network_configs")
    t7 = t7[(t7.setting == "ImageNet-Subset") & (t7.role == "student")]
    printed = {(int(r.layers), int(r.dim), int(r.heads), int(r.patch_size)) for r in t7.itertuples()}
    assert set(t7.pe) == {"sin-cos"}
    ours = {k: s for k, s in P["students"].items() if k != "patch28"}   # patch 28 is Table 10-a only
    assert {(s["depth"], s["embed_dim"], s["num_heads"], s["patch_size"]) for s in ours.values()} == printed
    assert all(s["pos_embed"] == "sincos" for s in P["students"].values())
    s = create_student("vit", img_size=P["img_size"], num_classes=0, **P["students"]["combo"])
    assert not s.pos_embed.requires_grad and describe_model(s)["grid"] == (7, 7)
    t9 = load_reported("attndistill", "table9_linear_probe_settings").set_index("config").value
    E = P["eval"]
    assert (E["probe_warmup_epochs"], E["probe_epochs"], E["probe_batch"], E["probe_lr"]) == (
        int(t9["warmup epochs"]), int(t9["training epochs"]), int(t9["batch size"]), float(t9["base learning rate"]))
    assert E["probe_optimizer"] == t9["optimizer"].split()[0].lower() and E["probe_lr_scale_batch"] == 256   # MAE's blr
    # the run is real: a registered dataset, a teacher name (the user saves it) whose shape is Table 7's teacher row
    from attnrepro.data import list_datasets
    assert {P["data"]["train"], P["data"]["val"]} <= set(list_datasets())
    teacher_row = load_reported("attndistill", "table7_network_configs").query("setting == 'ImageNet-Subset' and role == 'teacher'")
    r = teacher_row.iloc[0]
    assert isinstance(P["teacher"], str) and P["teacher_arch"] == dict(
        embed_dim=int(r.dim), depth=int(r.layers), num_heads=int(r.heads), patch_size=int(r.patch_size), pos_embed="sincos")
    # the runnable profiles keep timm's learnable embedding (their cached runs stay valid)
    for prof in ("smoke", "mini"):
        assert all("pos_embed" not in s for s in load_profile("attndistill", prof)["students"].values())


def test_paper_figures_and_table7_rows():
    "Table 7's rows and Figures 6-11 from result-shaped data."
    import numpy as np
    import pandas as pd
    from attnrepro.attndistill import cls_attention_loss
    from attnrepro.papers.attndistill import (config_row, plot_cls_attention, plot_mae_curves, plot_sweeps,
                                              plot_teacher_vs_students, position_embedding_kind)
    from attnrepro.models import create_student
    assert config_row(dict(embed_dim=192, depth=12, num_heads=3, patch_size=16), 224) == dict(
        layers=12, dim=192, heads=3, patch_size=16, num_tokens=197, params_m=5.52)
    v = create_student("vit", img_size=32, patch_size=8, embed_dim=24, depth=1, num_heads=3, num_classes=0)
    assert position_embedding_kind(v, {}) == "learnable" and position_embedding_kind(v, {"pos_embed": "sincos"}) == "sin-cos"
    summ = pd.DataFrame({"lp_top1 mean": [3.0, 1.0, 2.0], "lp_top1 std": [np.nan, 0.1, 0.2],
                         "knn20_top1 mean": [2.0, 1.0, 1.5], "knn20_top1 std": [np.nan, 0.1, 0.1]})
    assert len(plot_teacher_vs_students(summ).axes[0].patches) == 6
    curve = dict(curve=[dict(epoch=1, lp_top1=1.0, knn20_top1=2.0), dict(epoch=2, lp_top1=2.0, knn20_top1=3.0)])
    assert len(plot_mae_curves({"student": curve}, {"student": {"embed_dim": 192}}).axes[0].lines) == 2
    d = pd.DataFrame(dict(value=[0.1, 1.0], lp_top1=[1.0, 2.0], paper=[70.0, 71.0]))
    fig = plot_sweeps([("lambda", d, 1.5), ("T", d, 1.0)], 0.3, "smoke")
    assert [a.get_title() for a in fig.axes[:2]] == ["lambda (PA baseline: 1.5)", "T (PA baseline: 1.0)"]
    g = torch.Generator().manual_seed(0)
    t = torch.rand(3, 17, generator=g).softmax(-1)
    s = torch.rand(2, 17, generator=g).softmax(-1)
    fig, kls = plot_cls_attention(torch.zeros(3, 8, 8), t, (4, 4), {"AD": (s.tolist(), [4, 4])}, "9")
    assert kls["AD"] == pytest.approx(cls_attention_loss(s[None], t[None], 10.0, "logsum", student_grid=(4, 4),
                                                         teacher_grid=(4, 4)).item())
    assert fig.axes[0].get_title() == "IMG" and fig.axes[1].get_title() == "AGGR"


def test_figure_images_named_classes_then_spread_and_absent_classes():
    "The named classes' first val images, then classes spread over the list; a named class with no image is skipped."
    from types import SimpleNamespace
    from attnrepro.papers.attndistill import figure_images
    classes = ["golden retriever", "German shepherd dog", "school bus", "tabby", "lemon"]
    v = SimpleNamespace(classes=classes, targets=[3, 1, 0, 4, 0, 1])
    assert figure_images(v) == [2, 1, 0]
    few = SimpleNamespace(classes=classes, targets=[3, 4, 4])   # a dry run's subset: no retriever, shepherd or bus
    assert figure_images(few) == [0, 1]


# --- the paper notebook's tables, from result-shaped runs ---------------------------------------------------------

def _fake_run(lp, knn=None, layers=9, attn=0.5):
    ev = {str(j): dict(lp_top1=lp + j, lp_top5=lp + 10, knn20_top1=lp - 1 if knn is None else knn) for j in range(layers)}
    return dict(eval=ev, losses=dict(loss=[2.0, 1.0], loss_feat=[1.5, 0.8], loss_attn=[4.0, attn]))


def test_figure_6_table_and_runs_arm():
    "Figure 6's numbers are mean / std / count per method; `runs_arm` pairs runs only when all stored their hits."
    from attnrepro.papers.attndistill import HitArm, runs_arm, table_figure_6
    from attnrepro.report import load_profile
    P = load_profile("attndistill", "smoke")
    P["headline"]["train"] = P["pilot"]["train"]   # as the notebook does for `schedule: pilot`
    head = {("pa", 0): _fake_run(10.0), ("ad", 0): _fake_run(14.0), ("pa", 1): _fake_run(12.0), ("ad", 1): _fake_run(16.0)}
    summ, caption = table_figure_6(P, head, dict(lp_top1=30.0, knn20_top1=20.0), n_train=100)
    assert list(summ.method) == ["-", "PA (no AttnDistill)", "AttnDistill"]
    assert list(summ["lp_top1 mean"]) == [30.0, 11.0, 15.0] and list(summ["lp_top1 count"]) == [1, 2, 2]
    assert summ["knn20_top1 std"][1] == pytest.approx(np.std([9.0, 11.0], ddof=1)) and "over 100 images" in caption
    runs = [head["pa", 0], head["pa", 1]]
    a = runs_arm(runs, "lp_top1", 2, "pa", n_test=4)
    assert not isinstance(a, HitArm) and a.values == (12.0, 14.0) and a.n_test == 4
    for r in runs: r["eval"]["2"].update(lp_top1=75.0, lp_correct=[True, False, True, True])   # hits match the value
    assert isinstance(runs_arm(runs, "lp_top1", 2, "pa", n_test=4), HitArm)


def test_short_rows_and_table_10_on_fake_runs():
    "Table 10's rows: the reference pair's mean over its seeds, seed 0 elsewhere, the pooled sd, the loss shares."
    from attnrepro.papers.attndistill import REF_VARS, ShortRows, row_variant, table10_in_profile, table_10
    from attnrepro.report import load_profile
    P = load_profile("attndistill", "mini")
    T10 = table10_in_profile(P)
    assert set(T10[T10.study == "lambda"].param.astype(float)) == {float(v) for v in P["lambdas"]}
    seeds = P["short"]["ref_seeds"]
    assert len(seeds) > 1
    short = {v: _fake_run(20.0) for v in dict.fromkeys(row_variant(P, r) for r in T10.itertuples()) if v}
    ref = {(v, s): _fake_run(10.0 + 2 * s + (5 if v == "base_ad" else 0)) for v in REF_VARS for s in seeds}
    S = ShortRows(P, T10, short, ref, n_val=1000)
    assert S.val("base_ad") == pytest.approx(15.0 + 2 * np.mean(seeds)) and S.val("heads_pa") == 20.0
    assert S.spread["lp_top1"][0] == pytest.approx(np.std([2 * s for s in seeds], ddof=1))
    assert S.arm("heads_pa").sd_seed == S.spread["lp_top1"][0] and S.arm("heads_pa") is S.arm("heads_pa")
    assert S.attn_share("base_ad") == pytest.approx(0.1 * 0.5 / 1.0) and S.attn_share("base_pa") == 0.0   # PA: lambda 0
    t10, caption = table_10(S, "mini")
    assert len(t10) == len(T10) and S.spread_note in caption
    ad = t10[t10.variant == "base_ad"].iloc[0]
    assert ad["seeds"] == len(seeds) and ad["top1_lp (ours, mini)"] == pytest.approx(S.val("base_ad"))
    assert t10["top1_lp (ours, mini)"].astype(str).str.startswith("not reproducible offline").any()
    assert sorted(S.sweep("lambda").value) == sorted(float(v) for v in P["lambdas"])


# --- a fair test before a verdict (issue #45) ---------------------------------------------------------------------

def test_teacher_gates_from_the_teachers_table():
    "The gates the teachers notebook recorded: our MAE teacher passes the probe gate and misses the k-NN gate."
    from attnrepro.papers.attndistill import teacher_gate, teacher_gates
    g = teacher_gates("mae_tiny_imagenet_mini", "mini")
    assert g["knn"][0] is False and g["linear"][0] is True and "2.89x" in g["knn"][1]
    assert teacher_gate(g, "knn", "t").verdict == "untestable" and teacher_gate(g, "linear", "t").holds
    assert teacher_gates({"algorithm": "mae"}, "smoke") == {} and teacher_gates("no_such_teacher", "mini") == {}
    v = teacher_gate({}, "knn", "a user's teacher")
    assert v.holds and "no k-NN gate on record" in v.statement


def test_hit_arm_hits_are_the_arm_hits():
    from attnrepro.papers.attndistill import hit_arm
    from attnrepro.verdicts import pack_correct
    h = np.array([True, False, False, True])
    a = hit_arm([50.0], [pack_correct(h)], "a")
    assert a.hits is not None and a.n_test == 4 and a.correct == (pack_correct(h),)
    with pytest.raises(ValueError, match="do not match its values"):
        hit_arm([25.0], [h], "wrong")


def _hit_run(hits: np.ndarray, layers: int = 9, attn: float = 0.0):
    "A result-shaped run whose every eval layer scores `hits` (LP and 20-NN), with its loss history."
    from attnrepro.verdicts import pack_correct
    acc, packed = round(100 * hits.mean(), 6), pack_correct(hits)
    ev = {str(j): dict(lp_top1=acc, lp_top5=acc, lp_correct=packed, knn20_top1=acc, knn20_correct=packed)
          for j in range(layers)}
    return dict(eval=ev, losses=dict(loss=[2.0, 1.0], loss_feat=[1.5, 1.0 - attn * 0.1], loss_attn=[4.0, attn]))


def test_fair_test_on_fake_runs():
    """FairTest as the paper notebook uses it: the k-NN parts fail the teacher's gate, a one-seed arm that moves almost
    no answer (>= 99 % seed for seed) is inert (with the lambda that would fix it), a row below the floor is not
    compared, and the table reports same-seed, across-seed and within agreement."""
    from attnrepro.papers.attndistill import (REF_VARS, FairTest, ShortRows, attndistill_claims, claim_evidence,
                                              claim_getter, regime, row_variant, runs_arm, table10_in_profile, table_10,
                                              table_agreement)
    from attnrepro.report import load_profile
    P = load_profile("attndistill", "mini")
    P["headline"]["train"] = P["pilot"]["train"]
    T10 = table10_in_profile(P)
    rng = np.random.default_rng(0)
    truth = rng.random(3000) < 0.2
    flip = lambda h, p: h ^ (rng.random(h.size) < p)
    seeds = P["short"]["ref_seeds"]
    ref = {(v, s): _hit_run(flip(truth, 0.05), attn=0.0 if v == "base_pa" else 3.0) for v in REF_VARS for s in seeds}
    short = {v: _hit_run(flip(truth, 0.05), attn=3.0 if "_ad" in v else 0.0)
             for v in dict.fromkeys(row_variant(P, r) for r in T10.itertuples()) if v}
    short.update({v: ref[v, 0] for v in REF_VARS})
    short["heads_ad"] = _hit_run(flip(_unpack(short["heads_pa"]), 0.002), attn=0.05)   # inert: 0.2 % of answers moved
    short["proj8_pa"] = _hit_run(rng.random(3000) < 0.02)                                          # collapsed: 2 %
    S = ShortRows(P, T10, short, ref, n_val=3000)
    head_runs = {(m, s): _hit_run(flip(truth, 0.05)) for m in ("pa", "ad") for s in P["headline"]["seeds"]}
    head = {(m, k): runs_arm([head_runs[m, s] for s in P["headline"]["seeds"]], k, 0, f"{m} {k}", n_test=3000)
            for m in ("pa", "ad") for k in ("lp_top1", "knn20_top1")}
    gates = {"knn": (False, "knn top-1 / random init >= 3: 2.9x"), "linear": (True, "linear: 3.4x")}
    tq = dict(lp_top1=40.0, knn20_top1=30.0)
    ft = FairTest(S, tq, gates, P["pilot"]["floor"], "t")
    v = attndistill_claims(claim_getter(S, head, P["headline"]["seeds"]), T10, margin=0.5, pre=ft)
    assert v["1"].verdict == "untestable" and "t's k-NN gate (knn top-1" in v["1"].statement
    assert "inert: heads_ad@0 vs heads_pa@0" in v["2"].statement and "about lambda" in v["2"].statement
    assert "proj8_pa@0 linear-probe (8-layer projector, beyond the official code's 4)" in v["4"].statement
    t, caption = table_agreement(ft)
    assert {"same-seed %", "across-seed %", "within %", "tolerance", "test", "inert"} <= set(t.columns)
    assert t[t.inert & (t.test != "across seeds")].a.tolist() == ["heads_ad@0"]   # near-identity: 99.8 % seed for seed
    lp = t[t.part.str.startswith("LP")].iloc[0]   # 4 seeds each, drawn alike: inert across seeds
    assert lp.test == "across seeds" and lp.inert and lp["across-seed %"] >= lp["within %"] - lp.tolerance
    assert "seed j != i of b" in caption and "scaled to this regime's seed noise" in caption
    ev = claim_evidence(S, head, P["headline"]["seeds"], tq, ft)
    assert "fewer heads" in ev["2"] and "(inert)" in ev["2"] and "(collapsed; below the 5 % floor" in ev["4"]
    assert "across seeds vs" in ev["1"] and "same seed (one seed: near-identity only)" in ev["2"]
    t10, _ = table_10(S, "mini")
    assert t10[t10.variant == "proj8_pa"].note.str.contains("beyond the official code's 4 layers").all()
    assert (t10[t10.variant != "proj8_pa"].note == "").all()
    r = regime(P, "short", 10000, "ViT 192/6/3, patch 8", gates)
    assert r.startswith("4 epochs over 10,000 images") and "k-NN gate NOT met" in r and "3200 epochs" in r
    assert regime(P, "headline", 10000).startswith("8 epochs") and "4 seeds per arm" in regime(P, "headline", 10000)


def _unpack(run, key="lp_correct"):
    from attnrepro.verdicts import unpack_correct
    return unpack_correct(run["eval"]["0"][key])


# --- the paper profile as published (issue #47) ----------------------------------------------------------------

def test_compress_queue_reaches_the_compress_runs_configs():
    "The profile's CompRess bank size enters a CompRess run's config (hashed); mini's, the default, is left out."
    from attnrepro.attndistill import COMPRESS_QUEUE
    from attnrepro.papers.attndistill import variant_config
    from attnrepro.report import load_profile
    for profile in ("smoke", "mini", "paper"):
        P = load_profile("attndistill", profile)
        q = P["compress_queue"]
        for name in ("compress_pa", "compress_only", "base_pa", "base_ad"):
            m = variant_config(P, name)["method"]
            if m["compress_weight"] and q != COMPRESS_QUEUE: assert m["compress_queue"] == q
            else: assert "compress_queue" not in m
        assert "compress_queue" not in P.unread()
    assert load_profile("attndistill", "mini")["compress_queue"] == COMPRESS_QUEUE   # the committed mini runs' hashes
    assert variant_config(load_profile("attndistill", "paper"), "compress_pa")["method"]["compress_queue"] == 128000


def test_dry_run_times_float32_on_the_cpu_and_probes_briefly(monkeypatch):
    "A CPU dry run: the probe trains a couple of epochs (warm-up scaled alike); `fit` times bf16 steps in float32."
    from attnrepro.papers import attndistill
    from attnrepro.papers.attndistill import DRY_PROBE_EPOCHS, quality, train_config
    tr = dict(epochs=3, batch_size=4, lr=1e-3, warmup_epochs=0, betas=[0.9, 0.95], amp=True)
    monkeypatch.delenv("ATTNREPRO_DRY_RUN", raising=False)
    cfg = train_config(tr, 3)
    assert cfg.amp and cfg.seed == 3 and cfg.betas == (0.9, 0.95)
    monkeypatch.setenv("ATTNREPRO_DRY_RUN", "1")
    monkeypatch.setenv("ATTNREPRO_DEVICE", "cpu")
    assert train_config(tr, 3).epochs == 3
    seen = {}
    def probe(*a, **kw):
        seen.update(kw)
        return dict(top1=0.0, top5=0.0, correct=np.zeros(len(a[2]), bool))
    monkeypatch.setattr(attndistill, "linear_probe", probe)
    E = dict(ks=[10, 20, 100, 200], probe_epochs=90, probe_lr=0.1, probe_batch=16384, probe_warmup_epochs=10)
    q = quality(torch.randn(20, 8), torch.randn(8, 8), torch.arange(20) % 5, torch.arange(8) % 5, E, 5)
    assert {"knn10_top1", "knn20_top1", "lp_top1"} <= set(q) and "knn100_top1" not in q
    assert seen["epochs"] == DRY_PROBE_EPOCHS and seen["warmup_epochs"] == pytest.approx(10 * DRY_PROBE_EPOCHS / 90)
