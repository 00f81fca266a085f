"""Bootstrapping ViTs: generalised convolution, agent CNN, losses (golden values by numpy) and the method."""
import math

import numpy as np
import pytest
import torch
import torch.nn as nn
from torch.utils.data import TensorDataset

from attnrepro.bootstrapping import (AGENT_TERMS, VIT_TERMS, AgentCNN, GeneralizedConv2d, bootstrap_method,
                                     describe_agent, generalized_conv_matrix_form, head_offsets, hint_loss,
                                     intermediate_loss, mutual_kd, neighbourhood_matrices)
from attnrepro.models import create_student
from attnrepro.train import TrainConfig, fit
from attnrepro.protocol import StepContext, project_conflicting

torch.set_num_threads(1)


def tiny_vit(seed=0, **kw):
    torch.manual_seed(seed)
    cfg = dict(img_size=32, patch_size=4, embed_dim=32, depth=2, num_heads=4, num_classes=10) | kw
    return create_student("vit", **cfg)


def np_ln(a, eps=1e-5):
    return (a - a.mean(-1, keepdims=True)) / np.sqrt(a.var(-1, keepdims=True) + eps)


# ---------------------------------------------------------------- generalised convolution

def test_head_offsets_follow_ceil_sqrt_kernel():
    assert head_offsets(9) == [(i, j) for i in (-1, 0, 1) for j in (-1, 0, 1)]
    assert head_offsets(6) == head_offsets(9)[:6]               # ViT-B: top two rows of a 3x3 kernel
    assert head_offsets(4) == [(0, 0), (0, 1), (1, 0), (1, 1)]  # k=2: PyTorch "same" convention
    assert head_offsets(1) == [(0, 0)]
    with pytest.raises(ValueError, match="positive int"):
        head_offsets(0)


def test_neighbourhood_matrices_select_one_neighbour():
    phi = neighbourhood_matrices(3, 4, 9)
    assert phi.shape == (9, 12, 12) and (phi.sum(-1) <= 1).all()
    # centre head (offset 0,0) is the identity; head 0 (offset -1,-1) maps token (1,1) to token (0,0)
    assert torch.equal(phi[4], torch.eye(12))
    assert phi[0, 1 * 4 + 1, 0] == 1 and phi[0, 0].sum() == 0   # token (0,0): neighbour in the zero padding


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")  # the reference conv for H=4 (k=2)
@pytest.mark.parametrize("heads", [4, 6, 9])
def test_generalized_conv_equals_conv2d(heads):
    g = torch.Generator().manual_seed(heads)
    x = torch.randn(2, 8, 5, 6, generator=g)
    conv = GeneralizedConv2d(8, heads)
    with torch.no_grad():
        conv.bias.normal_(generator=g)
    k = math.ceil(math.sqrt(heads))
    ref = nn.Conv2d(8, 8, k, padding="same")
    # the equivalent kernel built by hand: head h's (C_out, C_in) matrix at its offset, zeros elsewhere
    kernel = torch.zeros(8, 8, k, k)
    lo = -((k - 1) // 2)
    for h, (di, dj) in enumerate(head_offsets(heads)):
        kernel[:, :, di - lo, dj - lo] = conv.weight[h].detach()
    with torch.no_grad():
        ref.weight.copy_(kernel)
        ref.bias.copy_(conv.bias)
    assert torch.allclose(conv(x), ref(x), atol=1e-5)
    assert torch.allclose(conv(x), generalized_conv_matrix_form(x, conv.head_weights(), conv.bias), atol=1e-5)


def test_shared_conv_weight_is_wv_wo_of_the_vit():
    vit = tiny_vit()
    attn = vit.blocks[0].attn
    conv = GeneralizedConv2d(32, 4, attn=attn)
    assert list(conv.parameters()) == list(attn.parameters())  # no own parameters
    W = attn.qkv.weight.detach().numpy()
    P = attn.proj.weight.detach().numpy()
    hd = 8
    for h in range(4):
        w_v = W[64 + h * hd: 64 + (h + 1) * hd].T                    # (D_in, d_k): token @ w_v = v of head h
        w_o = P[:, h * hd:(h + 1) * hd].T                           # (d_k, D_out)
        assert np.allclose(conv.head_weights()[h].detach().numpy(), (w_v @ w_o).T, atol=1e-6)
    assert conv.conv_bias() is attn.proj.bias
    # gradients reach the ViT's v rows and proj, not the q/k rows
    conv(torch.randn(2, 32, 4, 4)).square().sum().backward()
    gq = attn.qkv.weight.grad
    assert gq[:64].abs().sum() == 0 and gq[64:].abs().sum() > 0
    assert attn.proj.weight.grad.abs().sum() > 0 and attn.proj.bias.grad.abs().sum() > 0


def test_shared_conv_matches_mhsa_when_attention_is_the_hard_coded_neighbourhood():
    """Eq. 4-5: if Psi_h = Phi_h the MHSA output equals the shared CONV output (y_err = 0), bias of v aside."""
    vit = tiny_vit()
    attn = vit.blocks[0].attn
    with torch.no_grad():
        attn.qkv.bias.zero_()
    conv = GeneralizedConv2d(32, 4, attn=attn)
    x = torch.randn(2, 32, 4, 4)
    X = x.flatten(2).transpose(1, 2)                                  # (B, n, D)
    v = attn.qkv(X)[..., 64:].reshape(2, 16, 4, 8).transpose(1, 2)    # (B, H, n, d_k)
    psi = neighbourhood_matrices(4, 4, 4)                             # attention = hard-coded neighbourhoods
    y = attn.proj((psi @ v).transpose(1, 2).reshape(2, 16, 32))
    assert torch.allclose(conv(x).flatten(2).transpose(1, 2), y, atol=1e-5)


# ---------------------------------------------------------------- agent CNN

@pytest.mark.parametrize("arch", ["base", "res_like"])
@pytest.mark.parametrize("shared", [False, True])
def test_agent_forward_shapes(arch, shared):
    vit = tiny_vit()
    agent = AgentCNN(vit, arch, shared=shared)
    logits, feats = agent.forward_with_features(torch.randn(3, 3, 32, 32))
    assert logits.shape == (3, 10) and logits.isfinite().all()
    expect = [(3, 32, 8, 8)] * 2 if arch == "base" else [(3, 32, 4, 4), (3, 32, 2, 2)]
    assert [tuple(f.shape) for f in feats] == expect
    assert all(f.isfinite().all() for f in feats)


def test_agent_parameters_shared_or_not():
    vit = tiny_vit()
    vit_ids = {id(p) for p in vit.parameters()}
    joint, shared = AgentCNN(vit, "base"), AgentCNN(vit, "base", shared=True)
    assert not any(id(p) in vit_ids for p in joint.parameters()) and joint.shared_parameters() == []
    sp = shared.shared_parameters()
    assert sp and all(id(p) in vit_ids for p in sp)
    mask = shared.shared_mask()
    assert mask.numel() == sum(p.numel() for p in sp)
    assert (~mask).sum() == 2 * 2 * 32 * 32  # q and k rows of the 2 blocks' qkv


def test_shared_agent_output_depends_on_vit_weights():
    vit = tiny_vit()
    agent = AgentCNN(vit, "res_like", shared=True).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        y0 = agent(x)
        vit.blocks[0].attn.qkv.weight[:64] += 1.0      # q/k: not used by the agent
        assert torch.allclose(agent(x), y0)
        vit.blocks[0].attn.qkv.weight[64:] += 0.1      # v rows
        y1 = agent(x)
        assert not torch.allclose(y1, y0)
        vit.blocks[1].attn.proj.weight.mul_(2.0)
        y2 = agent(x)
        assert not torch.allclose(y2, y1)
        vit.blocks[1].mlp.fc1.weight.mul_(0.5)
        assert not torch.allclose(agent(x), y2)
    # and the joint agent does not care
    joint = AgentCNN(vit, "res_like").eval()
    with torch.no_grad():
        z = joint(x)
        vit.blocks[0].attn.qkv.weight.add_(1.0)
        assert torch.allclose(joint(x), z)


def test_describe_agent_tables_6_and_7():
    vit_b = create_student("vit", img_size=224, patch_size=16, embed_dim=384, depth=12, num_heads=6, num_classes=100)
    rows = describe_agent(AgentCNN(vit_b, "base"))
    assert rows[0] == dict(layer="Input Projection", operator="16x16 Conv, 384, S16", output_shape=(384, 14, 14))
    blocks = [r for r in rows if r["layer"].startswith("Block")]
    assert len(blocks) == 12 and blocks[0]["operator"] == "H6, CONV, 384 | 1x1 Conv, 1536 | 1x1 Conv, 384"
    assert not any(r["layer"] == "Down-sampling" for r in rows) and rows[-1]["output_shape"] == (100,)
    rows = describe_agent(AgentCNN(vit_b, "res_like"))
    assert [r["operator"] for r in rows[:3]] == ["7x7 Conv, 64, S2", "3x3 Max Pooling, S2", "3x3 Conv, 384, S2"]
    assert rows[2]["output_shape"] == (384, 28, 28)
    layout = ["D" if r["layer"] == "Down-sampling" else "B" for r in rows if r["layer"] not in ("Input Projection", "Head")]
    assert "".join(layout) == "BBD" + "BBD" + "B" * 8            # Table 7, Agent-B: x2, ds, x2, ds, x8


def test_agent_rejects_bad_arguments():
    vit = tiny_vit()
    with pytest.raises(ValueError, match="res_like"):
        AgentCNN(vit, "resnet")
    with pytest.raises(ValueError, match="out of range"):
        AgentCNN(vit, "res_like", down_sample_layers=[5])


# ---------------------------------------------------------------- losses (golden values)

def test_hint_loss_golden_equal_length():
    g = torch.Generator().manual_seed(1)
    v, c = torch.randn(2, 1 + 4, 6, generator=g), torch.randn(2, 6, 2, 2, generator=g)
    vn = v[:, 1:].numpy()                                       # CLS dropped
    cn = c.numpy().reshape(2, 6, 4).transpose(0, 2, 1)          # row-major flatten
    ref = ((np_ln(vn) - np_ln(cn)) ** 2).mean()
    for adapt in ("sequence", "avgpool2d"):
        assert np.isclose(hint_loss(v, c, adapt).item(), ref, atol=1e-6)


def test_hint_loss_golden_pooling_both_ways():
    g = torch.Generator().manual_seed(2)
    # ViT longer (16 tokens, 4x4 grid) than the CNN (2x2): the ViT side is pooled
    v, c = torch.randn(2, 1 + 16, 3, generator=g), torch.randn(2, 3, 2, 2, generator=g)
    cn = c.numpy().reshape(2, 3, 4).transpose(0, 2, 1)
    seq = v[:, 1:].numpy().reshape(2, 4, 4, 3).mean(2)                        # consecutive groups of 4
    ap2 = v[:, 1:].numpy().reshape(2, 2, 2, 2, 2, 3).mean((2, 4)).reshape(2, 4, 3)  # 2x2 spatial blocks
    assert np.isclose(hint_loss(v, c, "sequence").item(), ((np_ln(seq) - np_ln(cn)) ** 2).mean(), atol=1e-6)
    assert np.isclose(hint_loss(v, c, "avgpool2d").item(), ((np_ln(ap2) - np_ln(cn)) ** 2).mean(), atol=1e-6)
    assert not np.isclose(hint_loss(v, c, "sequence").item(), hint_loss(v, c, "avgpool2d").item())
    # CNN longer (4x4) than the ViT (2x2 + CLS): the CNN side is pooled
    v, c = torch.randn(2, 1 + 4, 3, generator=g), torch.randn(2, 3, 4, 4, generator=g)
    vn = v[:, 1:].numpy()
    cf = c.numpy().reshape(2, 3, 16).transpose(0, 2, 1)
    seq = cf.reshape(2, 4, 4, 3).mean(2)
    ap2 = c.numpy().reshape(2, 3, 2, 2, 2, 2).mean((3, 5)).reshape(2, 3, 4).transpose(0, 2, 1)
    assert np.isclose(hint_loss(v, c, "sequence").item(), ((np_ln(vn) - np_ln(seq)) ** 2).mean(), atol=1e-6)
    assert np.isclose(hint_loss(v, c, "avgpool2d").item(), ((np_ln(vn) - np_ln(ap2)) ** 2).mean(), atol=1e-6)


def test_hint_loss_detaches_the_agent_and_checks_inputs():
    v = torch.randn(2, 5, 4, requires_grad=True)
    c = torch.randn(2, 4, 2, 2, requires_grad=True)
    hint_loss(v, c).backward()
    assert v.grad is not None and c.grad is None
    with pytest.raises(ValueError, match="avgpool2d"):
        hint_loss(v, c, "interp")
    with pytest.raises(ValueError, match="multiple"):
        hint_loss(torch.randn(2, 6, 4), c)   # 5 tokens vs 4 positions
    assert torch.isclose(intermediate_loss([v, v], [c, c]), 2 * hint_loss(v, c))


def test_mutual_kd_golden():
    g = torch.Generator().manual_seed(3)
    zv = torch.randn(3, 5, generator=g, requires_grad=True)
    za = torch.randn(3, 5, generator=g, requires_grad=True)
    T = 4.0

    def np_kd(s, t):  # KL(softmax(t/T) || softmax(s/T)) * T^2, summed over classes, mean over the batch
        ls = s / T - np.log(np.exp(s / T).sum(-1, keepdims=True))
        lt = t / T - np.log(np.exp(t / T).sum(-1, keepdims=True))
        return (np.exp(lt) * (lt - ls)).sum(-1).mean() * T * T

    out = mutual_kd(zv, za, T)
    a, b = zv.detach().numpy().astype(np.float64), za.detach().numpy().astype(np.float64)
    assert np.isclose(out["kd_vit"].item(), np_kd(a, b), atol=1e-6)
    assert np.isclose(out["kd_agent"].item(), np_kd(b, a), atol=1e-6)
    out["kd_vit"].backward()
    assert zv.grad is not None and za.grad is None              # the other side is a constant


# ---------------------------------------------------------------- the method

def _ctx_step(method, vit, agent, x, y, epoch=0):
    "One step's context as fit builds it (no optimiser)."
    ctx = StepContext(model=vit, train_model=vit, modules={"agent": agent}, cfg=TrainConfig(), state=method.state,
                      epoch=epoch, x=x, y=y, target=y)
    method.forward(ctx)
    ctx.losses = {t.name: t.fn(ctx) for t in method.terms}
    ctx.weighted = {t.name: t.weight_at(epoch) * ctx.losses[t.name] for t in method.terms}
    ctx.loss = sum(ctx.weighted.values())
    return ctx


def test_method_terms_and_hint_decay():
    vit = tiny_vit()
    m = bootstrap_method(vit, AgentCNN(vit, "base"), epochs=10)
    assert [t.name for t in m.terms] == ["ce", "ce_agent", "kd_vit", "kd_agent", "hint"]
    hint = m.terms[-1]
    assert hint.weight_at(0) == 5.0 and math.isclose(hint.weight_at(4), 5.0 * 0.6)
    assert m.name == "bootstrap_joint" and not m.has_custom_backward()
    assert bootstrap_method(vit, AgentCNN(vit, "base"), 10, hint_decay=False).terms[-1].weight_at(9) == 5.0
    with pytest.raises(ValueError, match="shared agent"):
        bootstrap_method(vit, AgentCNN(vit, "base"), 10, align=True)
    with pytest.raises(ValueError, match="another ViT"):
        bootstrap_method(tiny_vit(seed=1), AgentCNN(vit, "base", shared=True), 10)


def test_joint_method_gradients_stay_on_their_side():
    vit = tiny_vit()
    agent = AgentCNN(vit, "res_like")
    m = bootstrap_method(vit, agent, epochs=2)
    ctx = _ctx_step(m, vit, agent, torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,)))
    assert len(ctx.student["hints"]) == 2 and ctx.student["hints"][0].shape == (4, 65, 32)
    vit_p, agent_p = list(vit.parameters()), list(agent.parameters())
    g = torch.autograd.grad(sum(ctx.weighted[n] for n in VIT_TERMS), agent_p, allow_unused=True, retain_graph=True)
    assert all(t is None or t.abs().sum() == 0 for t in g)      # hint/KD of the ViT do not train the agent
    g = torch.autograd.grad(sum(ctx.weighted[n] for n in AGENT_TERMS), vit_p, allow_unused=True)
    assert all(t is None or t.abs().sum() == 0 for t in g)


def test_shared_backward_is_algorithm_1():
    vit = tiny_vit()
    agent = AgentCNN(vit, "res_like", shared=True)
    m = bootstrap_method(vit, agent, epochs=2)
    assert m.name == "bootstrap_shared" and m.has_custom_backward()
    ctx = _ctx_step(m, vit, agent, torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,)))
    shared = agent.shared_parameters()
    flat = lambda gs: torch.cat([gi.reshape(-1) for gi in gs])
    g_v = flat(torch.autograd.grad(sum(ctx.weighted[n] for n in VIT_TERMS), shared, retain_graph=True))
    g_a = flat(torch.autograd.grad(sum(ctx.weighted[n] for n in AGENT_TERMS), shared, retain_graph=True))
    head = vit.head.weight
    g_head = torch.autograd.grad(ctx.loss, head, retain_graph=True)[0]
    m.backward(ctx)
    mask = agent.shared_mask()
    expect = g_v + g_a
    expect[mask] = 0.5 * (g_v[mask] + project_conflicting(g_a[mask], g_v[mask]))
    got = flat([p.grad for p in shared])
    assert torch.allclose(got, expect, atol=1e-6)
    assert torch.allclose(got[~mask], g_v[~mask])               # q/k rows: the ViT's own gradient
    assert torch.allclose(head.grad, g_head)                    # private parameters untouched
    assert m.state["align_steps"] == 1


@pytest.mark.parametrize("shared", [False, True])
def test_one_fit_epoch(shared):
    g = torch.Generator().manual_seed(0)
    ds = TensorDataset(torch.randn(16, 3, 32, 32, generator=g), torch.randint(0, 10, (16,), generator=g))
    vit = tiny_vit()
    agent = AgentCNN(vit, "res_like", shared=shared)
    before = [p.detach().clone() for p in agent.parameters()]
    res = fit(vit, ds, ds, TrainConfig(epochs=1, batch_size=4, warmup_epochs=0, lr=1e-3), bootstrap_method(vit, agent, 1),
              progress=False, device="cpu")
    h = res["history"][0]
    for t in VIT_TERMS + AGENT_TERMS:
        assert math.isfinite(h[f"loss_{t}"]) and h[f"loss_{t}"] >= 0, (t, h)
    assert math.isfinite(h["loss"]) and res["steps"] == 4 and "acc1" in res["final"]
    assert ("align_conflict_frac" in h) == shared
    assert any(not torch.equal(b, p) for b, p in zip(before, agent.parameters()))  # the agent trained too
    # shared: no extra copy of the shared weights is counted as the agent's own parameters
    vit_ids = {id(p) for p in vit.parameters()}
    n_private = sum(p.numel() for p in agent.parameters() if id(p) not in vit_ids)
    assert res["n_params_extra"] == n_private
    assert (n_private < sum(p.numel() for p in agent.parameters())) == shared


# ---------------------------------------------------------------- stem_pool option

def test_stem_pool_false_equals_dropping_the_maxpool():
    vit = tiny_vit()
    torch.manual_seed(1)
    ref = AgentCNN(vit, "res_like")
    assert isinstance(ref.stem[3], nn.MaxPool2d) and ref.stem_pool
    ref.stem[3] = nn.Identity()                              # what the paper notebook used to do by hand
    torch.manual_seed(1)
    agent = AgentCNN(vit, "res_like", stem_pool=False)
    assert isinstance(agent.stem[3], nn.Identity) and not agent.stem_pool
    sd, sd_ref = agent.state_dict(), ref.state_dict()
    assert list(sd) == list(sd_ref) and all(torch.equal(sd[k], sd_ref[k]) for k in sd)   # same init, same keys
    x = torch.randn(2, 3, 32, 32)
    y, f = agent.eval().forward_with_features(x)
    y_ref, f_ref = ref.eval().forward_with_features(x)
    assert torch.equal(y, y_ref) and [t.shape[-1] for t in f] == [8, 4]     # stride 4 stem: 32 px -> 8, 4
    assert [t.shape[-1] for t in AgentCNN(vit, "res_like").forward_with_features(x)[1]] == [4, 2]
    with pytest.raises(ValueError, match="stem_pool"):
        AgentCNN(vit, "base", stem_pool=False)


def test_stem_conv_stride_one_halves_the_agents_stride():
    "stem_conv_stride=1 (with stem_pool=False): stride 2, maps 16 / 8 at 32 px, the same parameters and keys."
    vit = tiny_vit()
    x = torch.randn(2, 3, 32, 32)
    a2, a1 = AgentCNN(vit, "res_like", stem_pool=False), AgentCNN(vit, "res_like", stem_pool=False, stem_conv_stride=1)
    assert [t.shape[-1] for t in a1.eval().forward_with_features(x)[1]] == [16, 8]
    assert a1.stem[4].stride == (1, 1) and a2.stem[4].stride == (2, 2)
    assert {k: v.shape for k, v in a1.state_dict().items()} == {k: v.shape for k, v in a2.state_dict().items()}
    for bad in (dict(arch="res_like", stem_conv_stride=3), dict(arch="base", stem_conv_stride=1)):
        with pytest.raises(ValueError, match="stem_conv_stride"):
            AgentCNN(vit, **bad)


# ---------------------------------------------------------------- baselines: sparse attention, SAM

from attnrepro.bootstrapping import EntmaxBisect, entmax_bisect, sam_method, sparse_attention_
from attnrepro.protocol import ce_loss


def np_sparsemax(z):
    "Martins & Astudillo's closed form, on the last axis."
    zs = -np.sort(-z, -1)
    cs = zs.cumsum(-1)
    k = np.arange(1, z.shape[-1] + 1)
    kz = (1 + k * zs > cs).sum(-1, keepdims=True)
    tau = (np.take_along_axis(cs, kz - 1, -1) - 1) / kz
    return np.maximum(z - tau, 0)


def test_entmax_alpha2_is_sparsemax_and_alpha_to_1_is_softmax():
    z = torch.randn(4, 3, 9, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 2
    p = entmax_bisect(z, 2.0, 60)
    assert np.allclose(p.numpy(), np_sparsemax(z.numpy()), atol=1e-8) and (p == 0).any()
    torch.testing.assert_close(p.sum(-1), torch.ones(4, 3, dtype=torch.float64))
    errs = [(entmax_bisect(z, a, 60) - z.softmax(-1)).abs().max().item() for a in (1.5, 1.1, 1.01)]
    assert errs[0] > errs[1] > errs[2] and errs[2] < 2e-2           # converges to the softmax as alpha -> 1
    assert (entmax_bisect(z, 1.01, 60) > 0).all()                   # and is dense there


def test_entmax_backward_gradcheck():
    g = torch.Generator().manual_seed(1)
    z = torch.randn(2, 5, generator=g, dtype=torch.float64, requires_grad=True)
    for a in (1.3, 1.7):
        alpha = torch.tensor(a, dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(lambda z, a: EntmaxBisect.apply(z, a, 60), (z, alpha), atol=1e-6)


def test_entmax_bisect_checks_arguments():
    z = torch.randn(2, 5)
    with pytest.raises(ValueError, match="alpha"):
        entmax_bisect(z, 1.0)
    with pytest.raises(ValueError, match="n_iter"):
        entmax_bisect(z, 1.5, 0)


def test_sparse_attention_is_sparsemax_attention_at_alpha_2():
    vit = tiny_vit(img_size=16, patch_size=8, embed_dim=12, depth=1, num_heads=3)
    sparse_attention_(vit, alpha=2.0, learnable=False, n_iter=60)
    attn = vit.blocks[0].attn
    assert "entmax_alpha" in dict(attn.named_buffers()) and "entmax_alpha" not in dict(attn.named_parameters())
    x = torch.randn(2, 5, 12, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out = attn(x)
        B, N, C = x.shape
        q, k, v = attn.qkv(x).reshape(B, N, 3, 3, 4).permute(2, 0, 3, 1, 4).double().unbind(0)
        P = torch.from_numpy(np_sparsemax(((q * attn.scale) @ k.transpose(-2, -1)).numpy()))
        ref = attn.proj((P @ v).transpose(1, 2).reshape(B, N, C).float())
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_sparse_attention_learns_alpha():
    vit = sparse_attention_(tiny_vit(img_size=16, patch_size=8, embed_dim=12, depth=2, num_heads=3), n_iter=20)
    alphas = [b.attn.entmax_alpha for b in vit.blocks]
    assert all(isinstance(a, nn.Parameter) and a.item() == 1.5 for a in alphas)
    assert all(any(p is a for p in vit.parameters()) for a in alphas)
    y = vit(torch.randn(2, 3, 16, 16))
    y.sum().backward()
    assert y.isfinite().all() and all(a.grad is not None and a.grad.isfinite() for a in alphas)
    assert "blocks.0.attn.entmax_alpha" in vit.state_dict()
    with pytest.raises(TypeError, match="VisionTransformer"):
        sparse_attention_(nn.Linear(2, 2))


def test_sam_step_restores_weights_and_uses_the_perturbed_gradient():
    import copy
    m = tiny_vit(img_size=16, patch_size=8, embed_dim=12, depth=1, num_heads=3, num_classes=4)
    m.eval()                                                  # no dropout anyway; keeps both passes comparable
    x, t = torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(3)), torch.tensor([0, 1, 2, 3])
    cfg = TrainConfig(epochs=1, warmup_epochs=0)
    w0 = [p.detach().clone() for p in m.parameters()]
    # independent reference: g at w, then the CE gradient at w + rho g / ||g||
    rho = 0.3
    ref = copy.deepcopy(m)
    g = torch.autograd.grad(ce_loss(StepContext(logits=ref(x), target=t, cfg=cfg)), list(ref.parameters()))
    norm = torch.sqrt(sum((gi ** 2).sum() for gi in g))
    with torch.no_grad():
        for p, gi in zip(ref.parameters(), g):
            p.add_(gi * rho / norm)
    g_adv = torch.autograd.grad(ce_loss(StepContext(logits=ref(x), target=t, cfg=cfg)), list(ref.parameters()))
    ctx = StepContext(model=m, train_model=m, x=x, target=t, cfg=cfg)
    ctx.loss = ce_loss(StepContext(logits=m(x), target=t, cfg=cfg))
    method = sam_method(rho)
    assert method.name == "sam" and method.has_custom_backward()
    method.backward(ctx)
    assert all(torch.equal(a, b) for a, b in zip(w0, m.parameters()))      # weights restored exactly
    for p, ga in zip(m.parameters(), g_adv):
        torch.testing.assert_close(p.grad, ga, rtol=1e-4, atol=1e-6)
    assert not all(torch.allclose(p.grad, gi) for p, gi in zip(m.parameters(), g))
    for bad in (0, -0.1, True):
        with pytest.raises(ValueError, match="rho"):
            sam_method(bad)


def test_sam_method_one_fit_epoch():
    vit = tiny_vit(img_size=16, patch_size=8, embed_dim=12, depth=1, num_heads=3, num_classes=4)
    g = torch.Generator().manual_seed(4)
    ds = TensorDataset(torch.randn(8, 3, 16, 16, generator=g), torch.randint(0, 4, (8,), generator=g))
    res = fit(vit, ds, None, TrainConfig(epochs=1, batch_size=4, warmup_epochs=0), sam_method(0.1), progress=False)
    assert res["method"] == "sam" and math.isfinite(res["history"][0]["loss_ce"])
    assert all(p.isfinite().all() for p in vit.parameters())


# ---------------------------------------------------------------- the paper profile against the official configs
# Transcribed from zhfeing/Bootstrapping-ViTs-pytorch @85f12e9 (config/cifar100/...): training.batch_size is 64 in
# every config (vit/vit-small.yaml l.21, cnn/resnet50.yaml l.21, joint/agent-small-res_like-vit-small.yaml l.38,
# shared/agent-small-res_like-vit-small.yaml l.21) and is the global batch (vit_mutual/data/__init__.py l.95-100 divide it
# by the GPUs: 32 on each of two, the paper's "32 on two A100"); loss weight_dict of joint (l.51-60) and shared (l.85-92).
OFFICIAL_BATCH = 64
OFFICIAL_JOINT = dict(cls=1.0, kd=1.0, hint_cnn=0.0, hint_vit=10.0, kd_temp=4.0)
OFFICIAL_SHARED = dict(cls=0.5, kd=0.5, hint_cnn=0.0, hint_vit=5.0, kd_temp=4.0)   # cls_cnn = cls_vit, kd_cnn = kd_vit


def test_paper_profile_keeps_the_official_batch_and_loss_weights():
    "Not Eq. 9 as printed (feature term 1, mutual KD 10): the official weights, feature hint 10 and KD 1."
    from attnrepro.report import load_profile
    P = load_profile("bootstrapping_vit", "paper")
    assert P["train"]["batch_size"] == P["train_cnn"]["batch_size"] == OFFICIAL_BATCH
    for key, off in (("joint", OFFICIAL_JOINT), ("shared", OFFICIAL_SHARED)):
        w = P[key]
        assert w["w_ce"] == w["w_ce_agent"] == off["cls"], key
        assert w["w_kd"] == w["w_kd_agent"] == off["kd"], key
        assert w["w_hint"] == off["hint_vit"] and w["T"] == off["kd_temp"], key
        assert off["hint_cnn"] == 0 and [k for k in w if "hint" in k] == ["w_hint"]   # no agent-side hint term
        assert w["w_hint"] / w["w_kd"] == 10   # beta (feature) / alpha (KD): the official ratio, Eq. 9's inverse


def test_paper_profile_follows_the_official_configs():
    """Issue #47: the paper profile's clipping, dropout, CNN momentum and crops as the official code applies them
    (zhfeing/Bootstrapping-ViTs-pytorch configs; the YAML comments cite each line)."""
    from attnrepro.methods import create_method
    from attnrepro.papers.bootstrapping_vit import REGISTRY_NAMES, make_agent, method_options, run_config
    from attnrepro.report import load_profile
    P = load_profile("bootstrapping_vit", "paper")
    clip = lambda m, size="S", ds="c10": run_config(P, m, ds=ds, size=size)["train"].get("grad_clip")
    # clip_max_norm 0.1 of the ViT and entmax configs; SAM's 1.0 is never read by sam_train_worker; worker_mutual's
    # clip (Joint-B 2.0, Shared-B 0.1) acts on the first step only; agents and CNNs have none
    assert [clip("ViT", s) for s in "SB"] == [clip("ViT-Sparse", s) for s in "SB"] == [0.1, 0.1]
    assert {clip(m, s) for m in ("ViT-SAM", "Agent", "Joint", "Shared", "ResNet50") for s in "SB"} == {None}
    assert "grad_clip" not in run_config(P, "ViT-SAM", ds="c10")["train"]   # absent, not None: hash as before
    # dropout 0.1 in ViT-S (every ViT-S config) and ViT-B-Sparse (vit-base-entmax.yaml), none in the other ViT-B
    drop = lambda m, size: run_config(P, m, ds="c10", size=size)["model"].get("proj_drop_rate", 0.0)
    assert [drop(m, "S") for m in ("ViT", "ViT-SAM", "ViT-Sparse", "Joint", "Shared")] == [0.1] * 5
    assert [drop(m, "B") for m in ("ViT", "ViT-SAM", "ViT-Sparse", "Joint", "Shared")] == [0.0, 0.0, 0.1, 0.0, 0.0]
    # the agents' MLP dropout 0.1 (cnn/agent-*.yaml); a shared agent's is its ViT's (SharedMLP)
    for m, size, p in (("Agent", "B", 0.1), ("Joint", "B", 0.1), ("Shared", "S", 0.1), ("Shared", "B", 0.0)):
        cfg = run_config(P, m, ds="c10", size=size)
        vit = create_student("vit", num_classes=10, **dict(cfg["model"], img_size=32, patch_size=16))
        # as train_run builds them: a lone agent by make_agent, a joint or shared one by the registry's method
        agent = (make_agent(vit, cfg["agent"]) if m == "Agent" else
                 create_method(REGISTRY_NAMES[m], vit, **method_options(cfg, 1))[1].extra_modules["agent"])
        assert [getattr(b.drop, "p", 0.0) for b in agent.blocks] == [p] * len(agent.blocks), (m, size)
    assert run_config(P, "ResNet50", ds="c10")["train"]["momentum"] == 0.0   # torch SGD's default: none given
    # crops: CIFAR pad-4 random crop at 32 px then resize, evaluation resized to 224 uncropped; ImageNet 0.6-1
    for ds, crop, ev in (("c10", {"pad": 4}, False), ("c100", {"pad": 4}, False), ("imagenet", {"scale": [0.6, 1.0]}, None)):
        d = run_config(P, "ViT", ds=ds)["data"]
        assert d["train_crop"] == crop and d.get("eval_crop") == ev, ds


def test_per_method_clipping_and_sparse_vit_kwargs_leave_other_profiles_alone():
    "train.grad_clip per method (and per size) resolves in run_config; profiles without it keep their configs."
    import copy
    from attnrepro.papers.bootstrapping_vit import run_config
    from attnrepro.core import config_hash
    from attnrepro.report import load_profile
    P = load_profile("bootstrapping_vit", "mini")
    base = {m: config_hash(run_config(P, m, ds="c10")) for m in ("ViT", "ViT-Sparse", "Joint", "Agent")}
    Q = copy.deepcopy(dict(P))
    Q["train"] = dict(Q["train"], grad_clip={"ViT": 0.5, "Joint": {"B": 2.0}})
    Q["sparse"] = dict(Q["sparse"], vit_kwargs={"B": {"proj_drop_rate": 0.1}})
    assert run_config(Q, "ViT", ds="c10")["train"]["grad_clip"] == 0.5
    assert run_config(Q, "Joint", ds="c10", size="B")["train"]["grad_clip"] == 2.0
    for m in ("ViT-Sparse", "Joint", "Agent"):   # not listed (Joint: not at size S): unclipped, hash unchanged
        assert config_hash(run_config(Q, m, ds="c10")) == base[m], m
    assert run_config(Q, "ViT-Sparse", ds="c10", size="B")["model"]["proj_drop_rate"] == 0.1
    assert "vit_kwargs" not in run_config(Q, "ViT-Sparse", ds="c10", size="B")["sparse"]


def test_agent_mlp_dropout():
    "mlp_drop: a Dropout after the MLP activation; none by default; a shared agent takes the ViT MLP's; no new state."
    vit, vit_d = tiny_vit(), tiny_vit(proj_drop_rate=0.2)
    assert all(isinstance(b.drop, nn.Identity) for a in (AgentCNN(vit), AgentCNN(vit_d), AgentCNN(vit, shared=True))
               for b in a.blocks)
    assert [b.drop.p for b in AgentCNN(vit_d, shared=True).blocks] == [0.2, 0.2]
    assert all(isinstance(b.drop, nn.Identity) for b in AgentCNN(vit_d, shared=True, mlp_drop=0.0).blocks)   # explicit
    a = AgentCNN(vit, mlp_drop=0.1)
    assert [b.drop.p for b in a.blocks] == [0.1, 0.1] and list(a.state_dict()) == list(AgentCNN(vit).state_dict())
    x = torch.randn(2, 3, 32, 32)
    a.eval()
    with torch.no_grad(): assert torch.equal(a(x), a(x))   # eval: no dropout
    with pytest.raises(ValueError, match="mlp_drop"):
        AgentCNN(vit, mlp_drop=1.5)


def test_paper_crops_follow_the_official_pipelines():
    "CIFAR: pad-4 random crop at the stored 32 px, flip, resize to 224; evaluation resized, not cropped. ImageNet: 0.6-1."
    from PIL import Image
    from attnrepro.papers.bootstrapping_vit import PadRandomCrop, run_transforms
    im = Image.fromarray(np.arange(32 * 32 * 3, dtype=np.uint8).reshape(32, 32, 3))
    torch.manual_seed(0)
    crops = [np.asarray(PadRandomCrop(4)(im)) for _ in range(20)]
    assert all(c.shape == (32, 32, 3) for c in crops) and any((c == 0).all(-1).any() for c in crops)   # zero padding
    tr, ev = run_transforms(224, {"pad": 4}, eval_crop=False)
    assert tr(im).shape == ev(im).shape == (3, 224, 224)
    big = Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8))
    full = ev(big)   # resize only: the corners survive (a centre crop of 0.875 would cut them)
    from torchvision import transforms as T
    ref = T.Compose([T.Resize((224, 224), T.InterpolationMode.BILINEAR), T.ToTensor()])(big)
    assert torch.allclose(full[:, 0, 0] * torch.tensor([0.229, 0.224, 0.225]) + torch.tensor([0.485, 0.456, 0.406]),
                          ref[:, 0, 0], atol=1e-5)
    tr, ev = run_transforms(224, {"scale": [0.6, 1.0]})
    assert tr.transforms[0].scale == (0.6, 1.0) and [type(t).__name__ for t in ev.transforms][:2] == ["Resize", "CenterCrop"]
    with pytest.raises(ValueError, match="train_crop"):
        run_transforms(224, {"pad": 4, "scale": [0.5, 1]})


def test_paper_figures_draw_from_run_results():
    "Figures 5-7 and Tables 8-11's panels from result-shaped dicts."
    import numpy as np
    from attnrepro.papers.bootstrapping_vit import (plot_layer_removal, plot_learning_curves, plot_sensitivity,
                                                    plot_viz_rows)
    res = dict(curve=[dict(epoch=1, vit=10.0, agent=12.0), dict(epoch=2, vit=20.0, agent=18.0)])
    fig = plot_learning_curves([("(a)", [("ViT", res, "vit"), ("agent", res, "agent")]), ("(b)", [("ViT", res, "vit")])])
    assert [a.get_title() for a in fig.axes] == ["(a)", "(b)"] and len(fig.axes[0].lines) == 2
    pts = {1.0: dict(top1=1.0, agent_top1=2.0), 4.0: dict(top1=3.0, agent_top1=1.0)}
    fig = plot_sensitivity({"alpha": pts, "T": pts}, "6")
    assert [a.get_xlabel() for a in fig.axes] == ["alpha", "T"]
    fig = plot_layer_removal([-1.0, 0.5, 0.2], "7")
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["0.33", "0.67", "1.00"]
    viz = dict(layers=[1, 3], attn=[np.ones((2, 4, 4)), np.zeros((2, 4, 4))])
    fig = plot_viz_rows(torch.zeros(3, 8, 8), [("ViT", viz, "attn")], 1, 2, "8", cmap="viridis", row_height=1.9, top=0.92,
                        normalise=True)
    assert len(fig.axes) == 3 and fig.axes[2].get_title() == "layer 3" and fig.axes[0].get_ylabel() == "ViT"
    assert float(fig.axes[1].images[0].get_array().max()) == 0.0   # a constant map normalises to zeros


# --- the paper notebook's tables, from result-shaped runs ---------------------------------------------------------

def test_seed_noise_pools_the_headline_sd_and_one_seed_rows_borrow_it():
    """The sd pooled over a dataset's headline ViT Arms is what a one-seed ViT row borrows; the agent CNN's row stays out
    of that pool and is what a one-seed agent row borrows; a one-seed dataset has none."""
    from attnrepro.papers.bootstrapping_vit import AGENT_KEYS, HEADLINE, SeedNoise, dataset_labels, table_seed_spread
    from attnrepro.report import load_profile
    from attnrepro.verdicts import arm
    P = load_profile("bootstrapping_vit", "mini")
    labels = dataset_labels(P, "mini")
    assert labels == {"c10": "CIFAR-10", "c100": "CIFAR-100 proxy"} and AGENT_KEYS == ("agent",)
    # ViT rows: sd sqrt(2) each; the agent row: sd 0.1 (it must not pull the ViTs' pool down)
    head = {"c10": {k: arm([10.0 + i, 10.1 + i] if k == "agent" else [10.0 + i, 12.0 + i], k, n_test=100)
                    for i, (k, *_) in enumerate(HEADLINE)},
            "c100": {k: arm([5.0], k, n_test=100) for k, *_ in HEADLINE}}
    noise = SeedNoise(P, head, labels, {"c10": [0, 1], "c100": [0]})
    sd, df = noise.spread["c10"]
    assert sd == pytest.approx(math.sqrt(2)) and df == len(HEADLINE) - 1 and noise.spread["c100"] is None
    asd, adf = noise.agent_spread["c10"]
    assert asd == pytest.approx(0.1 / math.sqrt(2)) and adf == 1 and noise.agent_spread["c100"] is None
    a = noise.one_seed(dict(top1=30.0, n_val=100), "row", "c10")
    assert a.values == (30.0,) and a.sd_seed == pytest.approx(sd) and noise.one_seed(dict(top1=3.0, n_val=9), "r", "c100").sd_seed is None
    assert noise.one_seed(dict(top1=30.0, n_val=100), "agent alone", "c10", cnn=True).sd_seed == pytest.approx(asd)
    assert noise.one_seed(dict(agent_top1=30.0, n_val=100), "agent", "c10", key="agent_top1").sd_df == adf
    assert "no measured seed spread for CIFAR-100 proxy" in noise.note("c100")
    assert noise.note("c10").startswith("One-seed ViT rows borrow the seed sd 1.41 points (df 4) pooled over the 2-seed "
                                        "headline ViT rows") and noise.borrowed("c100") == ""
    assert "own sd" not in noise.note("c10") and "agent row's own sd 0.07 (df 1)" in noise.borrowed("c10", cnn=True)
    t, caption = table_seed_spread(noise)
    assert len(t) == 2 * len(HEADLINE) and list(t[t.dataset == "CIFAR-10"]["mean"]) == [
        10.05 + i if k == "agent" else 11.0 + i for i, (k, *_) in enumerate(HEADLINE)]
    assert "CIFAR-10 1.41 (df 4); CIFAR-100 proxy none (one seed)" in caption and "its own sd: CIFAR-10 0.07 (df 1)" in caption


def _committed_runs(P, ds="c10"):
    "The committed mini run of each headline row and seed, found by its config hash (None: the runs are not here)."
    import json
    from attnrepro.papers.bootstrapping_vit import HEADLINE, run_config
    from attnrepro.core import config_hash
    from attnrepro.runner import output_dir
    runs = output_dir("bootstrapping_vit", "mini") / "runs"
    out = {}
    for k, m, key, name, loss in HEADLINE:
        for s in P["seeds"]:
            path = runs / f"{config_hash(run_config(P, m, ds=ds, seed=s, **loss))}.json"
            if not path.is_file(): return None
            out[k, s] = json.loads(path.read_text())["result"]
    return out


def test_committed_headline_runs_keep_their_hashes_and_pool_the_vit_rows_only():
    """Issue #45: recording per-image hits changed no config hash (every committed headline run is still found), and
    the borrowed CIFAR-10 sd is pooled over the four ViT rows only: 0.61 with df 8, not 0.55 with the agent CNN's row."""
    from attnrepro.papers.bootstrapping_vit import HEADLINE, SeedNoise, headline_arms
    from attnrepro.report import load_profile
    from attnrepro.verdicts import pooled_sd
    P = load_profile("bootstrapping_vit", "mini")
    got = _committed_runs(P)
    if got is None: pytest.skip("the committed mini runs are not here")
    def run(m, ds=None, seed=None, **loss):
        for k, mm, key, name, ll in HEADLINE:
            if mm == m and ll == loss: return got[k, P["seeds"][0] if seed is None else seed]
    head = headline_arms(run, "c10", P["seeds"])
    assert all(a.hits is None for a in head.values())   # the committed runs predate `correct`: unpaired, said so
    noise = SeedNoise(P, {"c10": head}, {"c10": "CIFAR-10"}, {"c10": P["seeds"]})
    sd, df = noise.spread["c10"]
    assert round(sd, 2) == 0.61 and df == 8
    assert round(pooled_sd(head.values())[0], 2) == 0.55   # what the pool read with the agent in it


def test_headline_arms_carry_hits_when_every_run_recorded_them():
    from attnrepro.papers.bootstrapping_vit import headline_arms
    from attnrepro.verdicts import pack_correct
    rng = np.random.default_rng(0)
    def fake(seed, with_hits=True):
        h, ha = rng.random(200) < 0.5, rng.random(200) < 0.6
        r = dict(top1=100 * h.mean(), agent_top1=100 * ha.mean(), n_val=200)
        if with_hits: r.update(correct=pack_correct(h), agent_correct=pack_correct(ha))
        return r
    runs = {}
    run = lambda m, ds=None, seed=0, **loss: runs.setdefault((m, seed, str(loss)), fake(seed))
    head = headline_arms(run, "c10", [0, 1])
    assert all(a.hits is not None and a.hits.shape == (2, 200) for a in head.values())
    assert np.allclose(100 * head["agent"].hits.mean(1), head["agent"].values)   # the agent row takes agent_correct
    runs.clear()
    run_old = lambda m, ds=None, seed=0, **loss: runs.setdefault((m, seed, str(loss)), fake(seed, with_hits=seed == 0))
    assert all(a.hits is None for a in headline_arms(run_old, "c10", [0, 1]).values())


def test_train_run_records_per_image_hits():
    "A joint run's result keeps the ViT's and the agent's per-image top-1 hits on the val set (pack_correct)."
    from attnrepro.papers.bootstrapping_vit import run_config, train_run
    from attnrepro.report import load_profile
    from attnrepro.verdicts import unpack_correct
    import tempfile
    P = load_profile("bootstrapping_vit", "smoke")
    cfg = run_config(P, "Joint", ds="c10")
    assert "correct" not in str(cfg)   # a result, not a config key: no hash changes
    with tempfile.TemporaryDirectory() as d:
        r = train_run(cfg, d, recipe=P)
    for field, top1 in (("correct", "top1"), ("agent_correct", "agent_top1")):
        hits = unpack_correct(r[field])
        assert hits.size == r["n_val"] and 100 * hits.mean() == pytest.approx(r[top1])


def test_teacher_gate_and_table_1_say_when_the_pretrained_teacher_fails():
    "Table 1's pre-trained row names a teacher that fails its gate, in its note and in the caption."
    from attnrepro.papers.bootstrapping_vit import teacher_gate
    from attnrepro.runner import output_dir
    assert teacher_gate({"algorithm": "supervised"}) is None and teacher_gate("no_such_teacher") is None
    if (output_dir("teachers", "mini") / "table_gates.csv").is_file():
        g = teacher_gate("supervised_tiny_imagenet_mini")
        assert g.verdict == "untestable" and "gate not passed" in g.statement and "+3.02" in g.statement
        assert teacher_gate("mae_cifar10_mini").holds


def test_table_1_marks_a_pretrained_row_whose_teacher_fails_its_gate():
    from attnrepro.papers.bootstrapping_vit import SeedNoise, table_1
    from attnrepro.report import load_profile
    from attnrepro.verdicts import gate
    P = load_profile("bootstrapping_vit", "mini")
    res = dict(top1=50.0, agent_top1=60.0, params=1e6, flops=2e6, agent_params=1e6, agent_flops=2e6, n_val=100)
    run = lambda m, **kw: res
    noise = SeedNoise(P, {}, {}, {})
    failed = gate(False, "teacher T (fine-tune - scratch = +3.02 [+1.37, +4.66])")
    t1, caption = table_1(P, run, noise, "mini", gates={"S": failed, "B": None})
    pre = t1[(t1["group"] == "Pre-trained ViTs") & (t1["model"] == "ViT-S")]
    assert pre["note"].str.contains("its teacher FAILS its gate").all() and "fails its gate" in caption
    t1, caption = table_1(P, run, noise, "mini", gates={"S": gate(True, "teacher T"), "B": None})
    assert not t1["note"].fillna("").str.contains("FAILS").any() and "fails its gate" not in caption


def test_regimes_name_epochs_images_and_resolution():
    from attnrepro.papers.bootstrapping_vit import fraction_claim_regime, regime
    from attnrepro.report import load_profile
    P = load_profile("bootstrapping_vit", "mini")
    r = regime(P, "c10")
    assert "5,000 train" in r and "40 epochs" in r and "32 px" in r and "the paper: 240 epochs" in r
    f = fraction_claim_regime(P)
    assert "80 / 40 / 8 epochs (equal optimiser steps)" in f and "5 % / 10 % / 50 %" in f and "32 px, patch 4" in f
    rp = regime(load_profile("bootstrapping_vit", "paper"), "c10")
    assert "the paper" not in rp and "240 epochs, patch 16" in rp


def test_table_3_gains_and_fraction_steps():
    "Table 3: Ours' gain over the ViT at the same fraction; equal optimizer steps per fraction; rows not run say why."
    from attnrepro.papers.bootstrapping_vit import PAPER_T3, SeedNoise, fraction_epochs, fraction_runnable, table_3
    from attnrepro.report import load_profile
    P = load_profile("bootstrapping_vit", "mini")
    d = P["datasets"][P["fractions"]["pool"]]
    assert fraction_epochs(P, d["fraction"]) == dict(epochs=d.get("epochs", P["train"]["epochs"]))
    assert fraction_epochs(P, d["fraction"] / 2)["epochs"] == 2 * d.get("epochs", P["train"]["epochs"])
    assert fraction_runnable(P, "Joint", 0.05) and not fraction_runnable(P, "ViT-SAM", 0.05)
    runs = {(m, f): dict(top1=10 * f + (5.0 if m == "Joint" else 0.0)) if fraction_runnable(P, m, f) else None
            for f in P["fractions"]["values"] for m in PAPER_T3}
    noise = SeedNoise(P, {}, {}, {})
    t3, caption = table_3(P, runs, noise, "mini")
    ours = t3[t3["method"] == "Ours-Joint"]
    assert list(ours["top1_gain (ours, mini)"]) == pytest.approx([5.0, 5.0, 5.0])
    assert t3[t3["method"] == "ViT-B-SAM"]["note"].str.startswith("not run at mini (budget)").all()
    assert "(equal optimizer steps)" in caption and "model size S" in caption
