"""Tests for attnrepro.losses: golden values (numpy, tests/fixtures/loss_golden.json), gradients, shapes, schedules."""
import importlib.util, json, math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attnrepro import losses as L

FIXTURES = Path(__file__).parent / "fixtures"
GOLDEN = json.loads((FIXTURES / "loss_golden.json").read_text())["cases"]

def _generator():
    spec = importlib.util.spec_from_file_location("make_loss_golden", FIXTURES / "make_loss_golden.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod

def _kwargs(case):
    kw = dict(case["kwargs"])
    if "dim" in kw: kw["dim"] = tuple(kw["dim"])
    return kw

# ---- golden values ---------------------------------------------------------------------------------

@pytest.mark.parametrize("case", GOLDEN, ids=[f"{c['loss']}-{c['kwargs']}" for c in GOLDEN])
def test_golden(case):
    fn = getattr(L, case["loss"])
    s = torch.tensor(case["student"], dtype=torch.float32)
    t = torch.tensor(case["teacher"], dtype=torch.float32)
    out = fn(s, t, **_kwargs(case))
    assert out.dtype == torch.float32 and out.ndim == 0
    assert math.isclose(out.item(), case["expected"], rel_tol=1e-5, abs_tol=1e-6), (out.item(), case["expected"])

def test_golden_fixture_matches_numpy_formulas():
    "The stored numbers are what the numpy formulas give on the stored inputs (fixture not hand-edited)."
    g = _generator()
    ref = {"attention_distillation_loss": lambda s, t, kw: g.attention_distillation(s, t),
           "gta_loss": lambda s, t, kw: (g.gta(s[:, :, None], t[:, :, None], kw.get("num_prefix_tokens", 1))
                                         if kw.get("cls_row") else g.gta(s, t, kw.get("num_prefix_tokens", 1))),
           "kd_loss": lambda s, t, kw: g.kd(s, t, kw["T"]),
           "deit_hard_distillation_loss": lambda s, t, kw: g.deit_hard(s, t),
           "feature_mse_loss": lambda s, t, kw: g.feature_mse(s, t, kw["normalize"], tuple(kw.get("dim", [-1])))}
    names = {c["loss"] for c in GOLDEN}
    assert names == set(ref), names
    for c in GOLDEN:
        s, t = np.array(c["student"]), np.array(c["teacher"])
        assert math.isclose(ref[c["loss"]](s, t, c["kwargs"]), c["expected"], rel_tol=1e-12)

# ---- gradients, dtype -------------------------------------------------------------------------------

def _pair(shape, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=dtype).requires_grad_(),
            torch.randn(*shape, generator=g, dtype=dtype).requires_grad_())

CALLS = [(L.attention_distillation_loss, (2, 3, 5, 5), {}),
         (L.gta_loss, (2, 3, 5, 5), {}),
         (L.gta_loss, (2, 3, 5), {"cls_row": True}),
         (L.kd_loss, (4, 6), {"T": 2.0}),
         (L.deit_hard_distillation_loss, (4, 6), {}),
         (L.feature_mse_loss, (2, 5, 8), {"normalize": "none"}),
         (L.feature_mse_loss, (2, 5, 8), {"normalize": "layernorm"}),
         (L.feature_mse_loss, (2, 5, 8), {"normalize": "l2"})]
IDS = [f"{f.__name__}-{kw}" for f, _, kw in CALLS]

@pytest.mark.parametrize("fn,shape,kw", CALLS, ids=IDS)
def test_gradient_reaches_student_only(fn, shape, kw):
    s, t = _pair(shape)
    out = fn(s, t, **kw)
    out.backward()
    assert t.grad is None, "teacher must be treated as a constant"
    assert s.grad is not None and torch.isfinite(s.grad).all() and s.grad.abs().sum() > 0

@pytest.mark.parametrize("fn,shape,kw", CALLS, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_result_is_float32(fn, shape, kw, dtype):
    s, t = _pair(shape, dtype=dtype)
    out = fn(s, t, **kw)
    assert out.dtype == torch.float32 and out.ndim == 0 and torch.isfinite(out)

@pytest.mark.parametrize("fn,shape,kw", CALLS, ids=IDS)
def test_shape_mismatch_names_both_shapes(fn, shape, kw):
    s, _ = _pair(shape)
    t = torch.randn(*shape[:-1], shape[-1] + 1)
    with pytest.raises(ValueError) as e:
        fn(s, t, **kw)
    assert str(tuple(s.shape)) in str(e.value) and str(tuple(t.shape)) in str(e.value)

@pytest.mark.parametrize("fn,shape,kw", CALLS[:5], ids=IDS[:5])
def test_wrong_ndim_names_expected_layout(fn, shape, kw):
    bad = torch.randn(*shape, 2)
    with pytest.raises(ValueError, match=r"expected .*\(B,"):
        fn(bad, bad, **kw)

def test_non_tensor_rejected():
    with pytest.raises(TypeError, match="torch.Tensor"):
        L.kd_loss(np.zeros((2, 3)), torch.zeros(2, 3), T=1.0)

# ---- per-loss properties ----------------------------------------------------------------------------

def test_attention_distillation_is_kl_plus_teacher_entropy():
    s, t = _pair((2, 2, 7, 7), seed=1)
    p = t.detach().softmax(-1)
    kl = (p * (p.log() - s.detach().log_softmax(-1))).sum(-1).mean()
    ent = -(p * p.log()).sum(-1).mean()
    assert torch.allclose(L.attention_distillation_loss(s, t), kl + ent, atol=1e-6)

def test_attention_distillation_gradient_vanishes_at_teacher():
    t = torch.randn(1, 2, 4, 4)
    s = t.clone().requires_grad_()
    L.attention_distillation_loss(s, t).backward()
    assert s.grad.abs().max() < 1e-7  # d/ds CE = softmax(s) - softmax(t) = 0

def test_attention_distillation_rejects_non_square():
    with pytest.raises(ValueError, match="square"):
        L.attention_distillation_loss(torch.zeros(1, 1, 3, 4), torch.zeros(1, 1, 3, 4))

def test_gta_ignores_everything_but_cls_row_patch_keys():
    s, t = _pair((2, 3, 6, 6), seed=2)
    s2 = s.detach().clone()
    s2[:, :, 1:] += 5.0     # other query rows
    s2[:, :, 0, 0] -= 3.0   # the CLS key
    assert torch.allclose(L.gta_loss(s2, t), L.gta_loss(s, t))
    s3 = s.detach().clone()
    s3[:, :, 0, 1] += 1.0
    assert not torch.allclose(L.gta_loss(s3, t), L.gta_loss(s, t))

def test_gta_sums_heads_means_batch():
    s = torch.zeros(2, 3, 4, 4); t = torch.zeros(2, 3, 4, 4)
    t[0, :, 0, 1:] = 1.0  # example 0: 3 heads x 3 keys of squared error 1; example 1: none
    assert L.gta_loss(s, t).item() == pytest.approx(9 / 2)

def test_gta_argument_errors():
    x = torch.zeros(2, 3, 4, 4)
    with pytest.raises(ValueError, match="cls_row=True"):
        L.gta_loss(x[:, :, 0], x[:, :, 0])
    with pytest.raises(ValueError, match=r"\(B, H, N\)"):
        L.gta_loss(x, x, cls_row=True)
    with pytest.raises(ValueError, match="no patch keys"):
        L.gta_loss(x, x, num_prefix_tokens=4)
    with pytest.raises(ValueError, match=">= 0"):
        L.gta_loss(x, x, num_prefix_tokens=-1)

def test_kd_matches_torch_kl_and_scales_with_T2():
    s, t = _pair((5, 10), seed=3)
    for T in (1.0, 3.0):
        ref = F.kl_div(F.log_softmax(s / T, -1), F.softmax(t / T, -1), reduction="batchmean") * T * T
        assert torch.allclose(L.kd_loss(s, t, T), ref, atol=1e-6)
    assert L.kd_loss(t, t, 2.0).abs() < 1e-6
    for bad in (0, -1.0):
        with pytest.raises(ValueError, match="T must be > 0"):
            L.kd_loss(s, t, bad)

def test_deit_hard_uses_teacher_argmax():
    s = torch.tensor([[2.0, 0.0, 0.0]]); t = torch.tensor([[0.0, 0.0, 9.0]])
    assert L.deit_hard_distillation_loss(s, t).item() == pytest.approx(-math.log(math.exp(0) / (math.exp(2) + 2)))

def test_feature_mse_normalizations():
    s, t = _pair((2, 5, 8), seed=4)
    s, t = s.detach(), t.detach()
    assert torch.allclose(L.feature_mse_loss(s, t), F.mse_loss(s, t))
    assert torch.allclose(L.feature_mse_loss(s, t, normalize="layernorm"),
                          F.mse_loss(F.layer_norm(s, (8,), eps=1e-6), F.layer_norm(t, (8,), eps=1e-6)), atol=1e-6)
    assert torch.allclose(L.feature_mse_loss(s, t, normalize="l2"),
                          F.mse_loss(F.normalize(s, dim=-1), F.normalize(t, dim=-1)))
    # layernorm/l2 are invariant to a positive rescale (and layernorm to a shift) of either side
    assert torch.allclose(L.feature_mse_loss(s, 4 * t + 1, normalize="layernorm"),
                          L.feature_mse_loss(s, t, normalize="layernorm"), atol=1e-5)
    assert torch.allclose(L.feature_mse_loss(3 * s, t, normalize="l2", dim=(-2, -1)),
                          L.feature_mse_loss(s, t, normalize="l2", dim=(-2, -1)), atol=1e-6)

def test_feature_mse_unknown_normalize_lists_valid():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError) as e:
        L.feature_mse_loss(x, x, normalize="bn")
    for v in ("none", "layernorm", "l2"):
        assert v in str(e.value)

# ---- schedules --------------------------------------------------------------------------------------

def test_constant_and_exp_decay():
    assert [L.constant(2.0)(e) for e in (0, 5, 99.5)] == [2.0, 2.0, 2.0]
    s = L.exp_decay(10.0, 0.5)
    assert s(0) == 10.0 and s(3) == pytest.approx(1.25) and s(0.5) == pytest.approx(10 * 0.5 ** 0.5)
    assert repr(s) == "exp_decay(w0=10.0, gamma=0.5)"

def test_aal_style_two_phase_decay():
    epochs = 300
    s = L.exp_decay_schedule(2000, 0.99, switch_epoch=2 * epochs // 3, gamma_after=0.98)
    w, ref = 2000.0, []
    for e in range(epochs):  # a trainer multiplying lambda at the end of every epoch
        ref.append(w)
        w *= 0.99 if e < 200 else 0.98
    assert np.allclose([s(e) for e in range(epochs)], ref, rtol=1e-10)
    assert repr(s) == "exp_decay_schedule(w0=2000, gamma=0.99, switch_epoch=200, gamma_after=0.98)"
    assert L.exp_decay_schedule(3.0, 0.9)(2) == pytest.approx(3 * 0.81)
    with pytest.raises(ValueError, match="both"):
        L.exp_decay_schedule(1.0, 0.9, switch_epoch=10)

def test_piecewise_exp_decay():
    s = L.piecewise_exp_decay(1.0, {0: 0.5, 2: 1.0, 4: 2.0})
    assert [s(e) for e in range(7)] == pytest.approx([1, 0.5, 0.25, 0.25, 0.25, 0.5, 1.0])
    assert s(1.5) == pytest.approx(0.5 ** 1.5)  # continuous between epochs
    assert repr(s) == "piecewise_exp_decay(w0=1.0, gammas_by_epoch={0: 0.5, 2: 1.0, 4: 2.0})"
    with pytest.raises(ValueError, match="epoch 0"):
        L.piecewise_exp_decay(1.0, {1: 0.5})
    with pytest.raises(ValueError, match="> 0"):
        L.piecewise_exp_decay(1.0, {0: 0.0})

def test_linear_decay_and_step():
    s = L.linear_decay(4.0, 8)
    assert [s(e) for e in (0, 2, 8)] == [4.0, 3.0, 0.0]
    with pytest.raises(ValueError, match="past the end"):
        s(9)
    st = L.step_schedule({30: 0.1, 0: 1.0, 60: 0.01})
    assert [st(e) for e in (0, 29.9, 30, 59, 60, 1000)] == [1.0, 1.0, 0.1, 0.1, 0.01, 0.01]
    assert repr(st) == "step_schedule({0: 1.0, 30: 0.1, 60: 0.01})"
    with pytest.raises(ValueError, match="epoch 0"):
        L.step_schedule({5: 1.0})

def test_schedules_reject_negative_epoch():
    for s in (L.constant(1.0), L.exp_decay(1.0, 0.9), L.linear_decay(1.0, 5), L.step_schedule({0: 1.0})):
        with pytest.raises(ValueError, match=">= 0"):
            s(-1)
