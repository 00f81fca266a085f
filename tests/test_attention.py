"Tests of attnrepro.attention: capture equals timm's own maps, gradients flow, hooks go away, overrides are exact."
import copy

import pytest
import timm
import torch
from torch import nn
from timm.layers import Attention
from timm.utils import AttentionExtract

from attnrepro.attention import (AttentionCapture, AttentionOverride, attention_blocks, attention_logits,
                                 attention_maps)

B = 2


def _vit(**kw):
    kw = dict(img_size=32, patch_size=4, depth=2, embed_dim=48, num_heads=3, num_classes=10) | kw
    return timm.create_model("vit_tiny_patch16_224", **kw)


FACTORIES = {
    "vit": _vit,
    "vit_qknorm": lambda: _vit(qk_norm=True, scale_attn_norm=True, qkv_bias=True),
    "deit_distilled": lambda: timm.create_model("deit_tiny_distilled_patch16_224", img_size=32, patch_size=4,
                                                depth=2, embed_dim=48, num_heads=3, num_classes=10),
    "pit": lambda: timm.create_model("pit_ti_224", img_size=32, patch_size=4, stride=4, base_dims=[16, 16],
                                     depth=[1, 1], heads=[2, 4], num_classes=10),
    "convit": lambda: timm.create_model("convit_tiny", img_size=32, patch_size=4, depth=3, local_up_to_layer=2,
                                        embed_dim=16, num_heads=4, num_classes=10),
}
TIMM_ATTN = ["vit", "vit_qknorm", "deit_distilled", "pit"]   # timm.layers.Attention everywhere (fused switchable)


def set_fused(model, fused: bool):
    for m in model.modules():
        if hasattr(m, "fused_attn"):
            m.fused_attn = fused
    return model


def make(name, fused=True, seed=0):
    torch.manual_seed(seed)
    m = FACTORIES[name]()
    # randomise LayerNorm affine params so qk_norm / scale_norm are not identities in disguise
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, nn.LayerNorm) and mod.weight is not None:
                mod.weight.add_(0.2 * torch.randn_like(mod.weight))
                mod.bias.add_(0.2 * torch.randn_like(mod.bias))
    return set_fused(m, fused).eval()


def inputs(seed=1):
    return torch.randn(B, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def no_hooks(model):
    return not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def reference_maps(model, x):
    "timm's own post-softmax maps from a non-fused copy of `model`."
    ref = set_fused(copy.deepcopy(model), False)
    if type(model).__name__ == "ConVit":   # GPSA is not FX traceable: read the maps at attn_drop's input (eval)
        return list(AttentionExtract(ref, names=["*attn.attn_drop"], method="hook")(x).values())
    return list(AttentionExtract(ref)(x).values())


PARAMS = [(n, f) for n in FACTORIES for f in ((True, False) if n in TIMM_ATTN else (False,))]


# ---------------------------------------------------------------------------------------------- blocks
def test_attention_blocks():
    assert [a.num_heads for a in attention_blocks(make("pit"))] == [2, 4]
    vit = make("vit")
    assert attention_blocks(vit) == [vit.blocks[0].attn, vit.blocks[1].attn]
    assert attention_blocks(nn.DataParallel(vit))[1] is vit.blocks[1].attn
    assert [type(a).__name__ for a in attention_blocks(make("convit"))] == ["GPSA", "GPSA", "MHSA"]
    with pytest.raises(TypeError, match="Linear"):
        attention_blocks(nn.Linear(2, 2))
    odd = nn.Module()
    odd.blocks = nn.ModuleList([nn.Module()])
    odd.blocks[0].attn = nn.MultiheadAttention(8, 2)
    with pytest.raises(TypeError, match="MultiheadAttention"):
        attention_blocks(odd)


# ---------------------------------------------------------------------------------------------- capture
@pytest.mark.parametrize("name,fused", PARAMS)
def test_maps_match_attention_extract(name, fused):
    model, x = make(name, fused), inputs()
    ref = reference_maps(model, x)
    maps = attention_maps(model, x)
    assert len(maps) == len(ref) == len(attention_blocks(model))
    for m, r in zip(maps, ref):
        assert m.shape == r.shape
        torch.testing.assert_close(m, r, rtol=1e-5, atol=1e-6)
    assert no_hooks(model)


@pytest.mark.parametrize("name,fused", PARAMS)
def test_logits_softmax_is_maps_and_cls_rows(name, fused):
    model, x = make(name, fused), inputs()
    layers = [-1, 0] if name != "convit" else [2]            # GPSA blocks have no logits
    with AttentionCapture(model, layers, what=("logits", "maps")) as full:
        y = model(x)
    assert full.layers == ([len(attention_blocks(model)) - 1, 0] if name != "convit" else [2])
    with AttentionCapture(model, layers, what=("maps", "logits"), cls_only=True) as cls:
        y2 = model(x)
    torch.testing.assert_close(y, y2)                          # capture does not change the output
    for lg, mp, lc, mc in zip(full.logits, full.maps, cls.logits, cls.maps):
        Bx, H, N, N2 = lg.shape
        assert Bx == B and N == N2 and torch.isfinite(lg).all()
        torch.testing.assert_close(lg.softmax(-1), mp)
        assert lc.shape == mc.shape == (B, H, N)
        torch.testing.assert_close(lc, lg[:, :, 0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(mc, mp[:, :, 0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", TIMM_ATTN)
def test_logits_scaled_like_model(name):
    "Logits are timm's pre-softmax `(q * scale) @ k^T`, from the q/k after q_norm/k_norm."
    model, x = make(name), inputs()
    with AttentionCapture(model, what=("q", "k", "v", "logits")) as cap:
        model(x)
    for a, q, k, v, lg in zip(attention_blocks(model), cap.q, cap.k, cap.v, cap.logits):
        assert q.shape == k.shape == v.shape == (B, a.num_heads, lg.shape[-1], a.head_dim)
        torch.testing.assert_close(lg, (q * a.scale) @ k.transpose(-2, -1))
    # q, k are taken after q_norm / k_norm (real LayerNorms in vit_qknorm), v straight from qkv
    a = attention_blocks(model)[0]
    h = _attn_input(model, 0, x)
    q, k, v = a.qkv(h).reshape(*h.shape[:2], 3, a.num_heads, a.head_dim).permute(2, 0, 3, 1, 4)
    torch.testing.assert_close(cap.q[0], a.q_norm(q))
    torch.testing.assert_close(cap.k[0], a.k_norm(k))
    torch.testing.assert_close(cap.v[0], v)


def test_convit_parts():
    model, x = make("convit"), inputs()
    with AttentionCapture(model, [0, 2], what=("maps", "q", "k", "v")) as cap:
        model(x)
    assert cap.maps[0].shape == (B, 4, 64, 64) and cap.maps[1].shape == (B, 4, 65, 65)
    assert cap.q[0].shape == cap.k[0].shape == cap.v[0].shape == (B, 4, 64, 16)
    torch.testing.assert_close(cap.maps[0].sum(-1), torch.ones(B, 4, 64))
    a = attention_blocks(model)[2]
    torch.testing.assert_close(((cap.q[1] @ cap.k[1].transpose(-2, -1)) * a.scale).softmax(-1), cap.maps[1])
    with pytest.raises(NotImplementedError, match="GPSA"):
        AttentionCapture(model, [1], what="logits")
    with pytest.raises(NotImplementedError, match="GPSA"):
        attention_logits(model, x)
    with pytest.raises(ValueError, match="class"):
        AttentionCapture(model, [0], what="maps", cls_only=True)


@pytest.mark.parametrize("name,fused", [("vit", True), ("vit", False), ("convit", False)])
def test_gradients_reach_parameters(name, fused):
    model, x = make(name, fused).train(), inputs()
    layer = 1 if name == "vit" else 2
    logits = attention_logits(model, x, layers=[layer])[0]
    assert logits.requires_grad
    logits.square().mean().backward()
    blk = attention_blocks(model)[layer]
    assert blk.qkv.weight.grad is not None and blk.qkv.weight.grad.abs().sum() > 0
    assert model.patch_embed.proj.weight.grad.abs().sum() > 0          # through the earlier blocks
    if name == "convit":
        model.zero_grad()
        attention_maps(model, x, layers=[0])[0].square().sum().backward()
        gp = attention_blocks(model)[0]
        assert gp.gating_param.grad.abs().sum() > 0 and gp.pos_proj.weight.grad.abs().sum() > 0


def test_only_requested_blocks_are_hooked():
    model = set_fused(_vit(depth=4), True).eval()
    blocks = attention_blocks(model)
    with AttentionCapture(model, [1, 3], what="logits") as cap:
        hooked = [any(m._forward_hooks or m._forward_pre_hooks for m in b.modules()) for b in blocks]
        assert hooked == [False, True, False, True]
        assert not blocks[1].qkv._forward_hooks          # v not asked: qkv output is not touched
        model(inputs())
    assert [set(cap._store[i]) for i in (1, 3)] == [{"logits"}, {"logits"}]
    with pytest.raises(KeyError, match="maps"):
        cap.maps
    assert no_hooks(model)


def test_hooks_removed_on_exception_and_fresh_tensors():
    model = make("vit")
    with pytest.raises(ZeroDivisionError):
        with AttentionCapture(model, what=("logits", "maps", "q", "k", "v")):
            model(inputs())
            1 / 0
    assert no_hooks(model)
    with AttentionCapture(model) as c1:
        model(inputs(1))
    with AttentionCapture(model) as c2:
        model(inputs(2))
    assert c1.logits[0] is not c2.logits[0] and not torch.allclose(c1.logits[0], c2.logits[0])
    cap = AttentionCapture(model)
    with cap:
        model(inputs(1))
    first = cap.logits[0]
    with cap:                                            # re-entering starts empty
        with pytest.raises(RuntimeError, match="did not run"):
            cap.logits
        model(inputs(2))
    assert cap.logits[0] is not first
    with cap:
        model(inputs(1))
        with pytest.raises(RuntimeError, match="twice"):
            model(inputs(1))
        cap.clear()
        model(inputs(2))
    torch.testing.assert_close(cap.logits[0], c2.logits[0])
    assert no_hooks(model)


def test_bad_arguments():
    model = make("vit")
    for kw, err in [(dict(layers=1), TypeError), (dict(layers=[2]), IndexError), (dict(layers=[0, -2]), ValueError),
                    (dict(what=("attn",)), ValueError), (dict(what=()), ValueError)]:
        with pytest.raises(err):
            AttentionCapture(model, **kw)


def test_train_mode_maps_are_pre_dropout():
    model, x = set_fused(_vit(attn_drop_rate=0.5), True).train(), inputs()
    ref = set_fused(copy.deepcopy(model), False)
    seen = []
    ref.blocks[0].attn.attn_drop.register_forward_hook(lambda m, i, o: seen.append(i[0]))
    ref(x)
    maps = attention_maps(model, x, layers=[0, 1])
    torch.testing.assert_close(maps[0], seen[0], rtol=1e-5, atol=1e-6)   # block 0's input is dropout-free
    for m in maps:
        torch.testing.assert_close(m.sum(-1), torch.ones(m.shape[:-1]))


@pytest.mark.parametrize("fused", [True, False])
def test_attn_mask_is_applied(fused):
    model, x = make("vit", fused), inputs()
    N = 65
    mask = torch.rand(B, 1, N, N, generator=torch.Generator().manual_seed(0)) > 0.3
    mask |= torch.eye(N, dtype=torch.bool)
    ref = set_fused(copy.deepcopy(model), False)
    seen = []
    for blk in ref.blocks:
        blk.attn.attn_drop.register_forward_hook(lambda m, i, o: seen.append(i[0]))
    ref.forward_features(x, attn_mask=mask)
    with AttentionCapture(model, what=("logits", "maps")) as cap:
        model.forward_features(x, attn_mask=mask)
    for m, r, lg in zip(cap.maps, seen, cap.logits):
        torch.testing.assert_close(m, r, rtol=1e-5, atol=1e-6)
        assert torch.isneginf(lg[~mask.expand_as(lg)]).all()


# ---------------------------------------------------------------------------------------------- override
def _run_with_own(model, x, source, layers=None):
    with torch.no_grad(), AttentionCapture(model, layers, what=(source,)) as own:
        y = model(x)
    with AttentionOverride(model, layers, source=source, tensors=own.get(source)):
        y2 = model(x)
    return y, y2


@pytest.mark.parametrize("name,fused", [p for p in PARAMS if p[0] in TIMM_ATTN])
@pytest.mark.parametrize("source", ["logits", "maps", "q", "k", "v"])
def test_override_with_own_tensors_is_identity(name, fused, source):
    model, x = make(name, fused), inputs()
    y, y2 = _run_with_own(model, x, source)
    torch.testing.assert_close(y2, y, rtol=1e-5, atol=1e-5)
    assert all("forward" not in a.__dict__ for a in attention_blocks(model))


def test_override_gated_scale_norm_attention():
    "A timm Attention with qk-norm, scale-norm and a gate: the replaced forward keeps all of them."
    model = make("vit")
    torch.manual_seed(3)
    model.blocks[1].attn = Attention(48, 3, qkv_bias=True, qk_norm=True, scale_norm=True, gated=True,
                                     norm_layer=nn.LayerNorm).eval()
    for fused in (True, False):
        set_fused(model, fused)
        y, y2 = _run_with_own(model, inputs(), "logits", layers=[1])
        torch.testing.assert_close(y2, y, rtol=1e-5, atol=1e-5)


def _attn_input(model, layer, x):
    "The tensor entering attention block `layer` (to test a block on its own)."
    seen = []
    h = attention_blocks(model)[layer].register_forward_pre_hook(lambda m, a: seen.append(a[0]))
    with torch.no_grad():
        model(x)
    h.remove()
    return seen[0]


@pytest.mark.parametrize("fused", [True, False])
def test_override_with_teacher_equals_manual(fused):
    student, teacher, x = make("vit", fused, seed=0), make("vit", seed=5), inputs()
    with torch.no_grad():
        t_logits = attention_logits(teacher, x, layers=[1])
    a = attention_blocks(student)[1]
    h = _attn_input(student, 1, x)
    with AttentionOverride(student, layers=[1], source="logits", tensors=t_logits):
        out = a(h)
    v = a.qkv(h).reshape(B, 65, 3, 3, 16).permute(2, 0, 3, 1, 4)[2]
    manual = a.proj((t_logits[0].softmax(-1) @ v).transpose(1, 2).reshape(B, 65, 48))
    torch.testing.assert_close(out, manual, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("source", ["logits", "q", "v"])
def test_override_head_subset(source):
    student, teacher, x = make("vit", seed=0), make("vit", seed=5), inputs()
    a = attention_blocks(student)[0]
    h = _attn_input(student, 0, x)
    seen = []
    a.proj.register_forward_hook(lambda m, i, o: seen.append(i[0].reshape(B, 65, 3, 16)))
    with torch.no_grad():
        a(h)
        with AttentionCapture(teacher, [0], what=tuple(dict.fromkeys((source, "logits", "maps")))) as tc:
            teacher(x)
        with AttentionOverride(student, [0], heads=[1], source=source, tensors=tc.get(source)):
            a(h)
    own, mixed = seen
    torch.testing.assert_close(mixed[:, :, [0, 2]], own[:, :, [0, 2]])    # other heads untouched
    assert not torch.allclose(mixed[:, :, 1], own[:, :, 1])
    if source == "logits":
        v = a.qkv(h).reshape(B, 65, 3, 3, 16).permute(2, 0, 3, 1, 4)[2]
        torch.testing.assert_close(mixed[:, :, 1], (tc.maps[0][:, 1] @ v[:, 1]), rtol=1e-5, atol=1e-5)


def _used_maps(model, layers, x, tensors, **kw):
    "The maps the overridden blocks actually multiply with v (read at attn_drop's input)."
    seen = {}
    hs = [attention_blocks(model)[i].attn_drop.register_forward_hook(
        lambda m, inp, o, i=i: seen.__setitem__(i, inp[0])) for i in layers]
    with torch.no_grad(), AttentionOverride(model, layers, tensors=tensors, **kw):
        model(x)
    for h in hs:
        h.remove()
    return [seen[i] for i in layers]


def test_override_aggregates():
    student, teacher, x = make("vit", seed=0), make("vit", seed=5), inputs()
    x4 = torch.cat([x, inputs(7)])
    with torch.no_grad():
        t = attention_logits(teacher, x4)
    tm = [l.softmax(-1) for l in t]
    ex = _used_maps(student, [0, 1], x4, t, source="logits", aggregate="examples")
    for m, r in zip(ex, tm):
        assert torch.allclose(m[0], m[3]) and torch.allclose(m[1], m[2])
        torch.testing.assert_close(m[0], r.mean(0))
    # examples-mean also serves a student batch of another size (e.g. the last, smaller batch)
    assert _used_maps(student, [0], x, t[:1], source="logits", aggregate="examples")[0].shape == (B, 3, 65, 65)
    ly = _used_maps(student, [0, 1], x4, t, source="logits", aggregate="layers")
    torch.testing.assert_close(ly[0], ly[1])
    torch.testing.assert_close(ly[0], (tm[0] + tm[1]) / 2)
    hd = _used_maps(student, [0], x4, t[:1], source="logits", aggregate="heads")[0]
    torch.testing.assert_close(hd[:, 0], hd[:, 2])
    torch.testing.assert_close(hd[:, 1], tm[0].mean(1))
    hs = _used_maps(student, [0], x4, t[:1], source="logits", aggregate="heads", heads=[0, 2])[0]
    torch.testing.assert_close(hs[:, 0], tm[0][:, [0, 2]].mean(1))
    assert not torch.allclose(hs[:, 1], hs[:, 0])                          # head 1 keeps the student's map
    qu = _used_maps(student, [0], x4, tm[:1], source="maps", aggregate="queries")[0]
    torch.testing.assert_close(qu[:, :, 5], qu[:, :, 40])
    torch.testing.assert_close(qu[:, :, 0], tm[0].mean(2))
    for m in (*ex, *ly, hd, hs, qu):
        torch.testing.assert_close(m.sum(-1), torch.ones(m.shape[:-1]))    # still row-stochastic


def test_attention_copy_gradients():
    "All heads copied: the student's q/k projections get no gradient, v/proj and the rest do."
    student, teacher, x = make("vit", seed=0).train(), make("vit", seed=5), inputs()
    with torch.no_grad():
        t = attention_logits(teacher, x)
    with AttentionOverride(student, source="logits") as ov:
        ov.set(t)
        student(x).logsumexp(-1).mean().backward()
    g = student.blocks[0].attn.qkv.weight.grad
    assert g[:96].abs().sum() == 0 and g[96:].abs().sum() > 0
    assert student.blocks[0].attn.proj.weight.grad.abs().sum() > 0


def test_override_dropout_and_errors():
    model, x = set_fused(_vit(attn_drop_rate=0.5), True).eval(), inputs()
    with torch.no_grad():
        t = attention_logits(model, x)
    with AttentionOverride(model, source="logits") as ov:
        model.train()
        outs = []
        for _ in range(2):
            ov.set(t)
            outs.append(model(x))
        assert not torch.allclose(*outs)                    # attn_drop acts on the copied map in train mode
        model.eval()
        ov.set(t)
        y = model(x)
        with pytest.raises(RuntimeError, match="set"):
            model(x)                                        # each set serves one forward
        with pytest.raises(RuntimeError, match="already"):
            with AttentionOverride(model, [0], source="logits"):
                pass
        with pytest.raises(ValueError, match="batch"):
            ov.set([l[:1] for l in t])
            model(x)
    assert all("forward" not in a.__dict__ for a in attention_blocks(model))
    with pytest.raises(ZeroDivisionError):
        with AttentionOverride(model, source="logits", tensors=t):
            1 / 0
    assert all("forward" not in a.__dict__ for a in attention_blocks(model))
    torch.testing.assert_close(model(x), y, rtol=1e-5, atol=1e-5)
    for kw, err in [(dict(source="map"), ValueError), (dict(source="q", aggregate="heads"), ValueError),
                    (dict(aggregate="tokens"), ValueError), (dict(heads=[3]), ValueError), (dict(heads=1), TypeError)]:
        with pytest.raises(err):
            AttentionOverride(model, **kw)
    with pytest.raises(ValueError, match="shape"):
        AttentionOverride(model, source="logits").set([l[:, :2] for l in t])
    with pytest.raises(ValueError, match="2 tensors"):
        AttentionOverride(model, [0], source="logits").set(t)
    with pytest.raises(TypeError, match="GPSA"):
        AttentionOverride(make("convit"), [0])


def test_grad_checkpointing_refused_and_failed_enter_restores():
    model, x = make("vit"), inputs()
    model.set_grad_checkpointing(True)
    with pytest.raises(RuntimeError, match="checkpointing"):
        with AttentionCapture(model):
            model(x)
    with pytest.raises(RuntimeError, match="checkpointing"):
        with AttentionOverride(model):
            model(x)
    assert no_hooks(model) and all("forward" not in a.__dict__ for a in attention_blocks(model))
    model.set_grad_checkpointing(False)
    with pytest.raises(ValueError, match="shape"):
        with AttentionOverride(model, source="logits", tensors=[torch.zeros(B, 3, 65, 64)] * 2):
            pass
    assert all("forward" not in a.__dict__ for a in attention_blocks(model))


# --- Taps: one declaration of what a loss term reads ------------------------------------------------------------------

def test_taps_equal_the_primitives_and_the_timm_forward():
    "Each tapped feature equals what AttentionCapture / a plain forward gives; the output is unchanged; no hook stays."
    from attnrepro.attention import Taps
    m, x = make("vit").train(), inputs()
    spec = {"cls_logits": [1], "attn_maps": [0], "q": [1], "v": [0], "block": [0, 1], "msa": [1], "pre_logits": None,
            "modules": ["norm"]}
    with Taps(m, spec) as tap:
        out = m(x)
    with AttentionCapture(m, [0], what=("maps", "v")) as full, AttentionCapture(m, [1], what="logits", cls_only=True) as cls, \
            AttentionCapture(m, [1], what="q") as q:
        ref = m(x)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    torch.testing.assert_close(tap.get("attn_maps")[0], full.maps[0], rtol=0, atol=0)
    torch.testing.assert_close(tap.get("v")[0], full.v[0], rtol=0, atol=0)
    torch.testing.assert_close(tap.get("cls_logits")[1], cls.logits[0], rtol=0, atol=0)
    torch.testing.assert_close(tap.get("q")[1], q.q[0], rtol=0, atol=0)
    assert tap.get("cls_logits")[1].shape == (B, 3, 65) and tap.get("attn_maps")[0].shape == (B, 3, 65, 65)
    torch.testing.assert_close(m.norm(tap.get("block")[1]), tap.get("modules")["norm"], rtol=0, atol=0)
    torch.testing.assert_close(m.forward_head(tap.get("modules")["norm"]), out, rtol=0, atol=0)
    torch.testing.assert_close(m.head(tap.get("pre_logits")), out, rtol=0, atol=0)
    assert list(tap.out) == list(spec) and list(tap.get("block")) == [0, 1]
    assert no_hooks(m)


def test_taps_errors_name_the_problem_and_leave_no_hooks():
    from attnrepro.attention import Taps
    m, x = make("vit"), inputs()
    with pytest.raises(ValueError, match="unknown tap features \\['attn'\\]"):
        Taps(m, {"attn": [0]})
    with pytest.raises(KeyError, match="no submodules \\['nrom'\\]"):
        Taps(m, {"modules": ["nrom"]})
    with pytest.raises(TypeError, match="VisionTransformer"):      # block outputs need a ViT; ConViT has no such `blocks` API
        Taps(make("pit"), {"block": [0]})
    with pytest.raises(RuntimeError, match="boom"):
        with Taps(m, {"cls_logits": None, "block": None, "pre_logits": None}):
            raise RuntimeError("boom")
    assert no_hooks(m)
    with pytest.raises(RuntimeError, match="ran twice"), Taps(m, {"v": [1]}):
        m(x); m(x)                                                  # two forwards: ambiguous, refused at once
    tap = Taps(m, {"block": [0], "v": [1]})
    with tap:
        m(x)
    assert tap.get("block")[0].shape == (B, 65, 48)
    with Taps(m, {"block": [0]}) as twice:
        m(x); m(x)
    with pytest.raises(RuntimeError, match="more than once"):
        twice.get("block")
    with tap:
        pass                                                       # the forward never ran (a fresh entry forgets)
    with pytest.raises(RuntimeError, match="not run"):
        tap.get("block")
    with pytest.raises(KeyError, match="'q' was not tapped"):
        tap.get("q")
    assert no_hooks(m)


def test_taps_read_convit_attention_without_a_vit():
    "Attention features work on every model attention_blocks supports (here ConViT's MHSA blocks)."
    from attnrepro.attention import Taps
    m, x = make("convit"), inputs()
    with Taps(m, {"attn_maps": [2], "cls_maps": [2]}) as tap:
        m(x)
    torch.testing.assert_close(tap.get("cls_maps")[2], tap.get("attn_maps")[2][:, :, 0], rtol=0, atol=1e-6)
    assert no_hooks(m)
