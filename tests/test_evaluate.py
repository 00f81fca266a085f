"""Tests for attnrepro.evaluate against brute-force numpy / scipy references on small synthetic data."""
import itertools, math
from collections import deque

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from scipy.spatial.distance import jensenshannon

from attnrepro import evaluate as E

# ---- top-k, ensembles -------------------------------------------------------------------------------

def test_topk_accuracy_matches_numpy():
    rng = np.random.default_rng(0)
    logits, labels = rng.normal(size=(200, 10)), rng.integers(0, 10, 200)
    order = np.argsort(-logits, axis=1)
    ref = {k: 100 * np.mean([labels[i] in order[i, :k] for i in range(200)]) for k in (1, 3, 5)}
    out = E.topk_accuracy(torch.tensor(logits), torch.tensor(labels), ks=(1, 3, 5))
    assert out.keys() == ref.keys() and all(out[k] == pytest.approx(ref[k]) for k in ref)
    assert E.topk_accuracy(logits, labels, ks=(1,)) == {1: pytest.approx(ref[1])}  # numpy accepted

def test_topk_accuracy_errors():
    with pytest.raises(ValueError, match="C=3"):
        E.topk_accuracy(torch.zeros(2, 3), [0, 1], ks=(1, 5))
    with pytest.raises(ValueError, match=r"\(2,\)"):
        E.topk_accuracy(torch.zeros(2, 3), [0, 1, 2])
    with pytest.raises(ValueError, match="NaN"):
        E.topk_accuracy(torch.tensor([[float("nan"), 0.0]]), [0], ks=(1,))
    assert E.topk_accuracy(torch.eye(3), [0, 1, 0], ks=(1,))[1] == 200 / 3  # exact, not a float32 mean

def test_ensemble_softmax():
    a, b = torch.randn(4, 5), torch.randn(4, 5)
    assert torch.allclose(E.ensemble_softmax([a, b.numpy()]), (a.softmax(-1) + b.softmax(-1)) / 2)
    with pytest.raises(ValueError, match="one shape"):
        E.ensemble_softmax([a, torch.randn(4, 6)])

# ---- k-NN -------------------------------------------------------------------------------------------

def knn_numpy(xtr, ytr, xte, yte, k, T, C):
    "Brute-force DINO weighted k-NN, one test example at a time, float64."
    xtr = xtr / np.linalg.norm(xtr, axis=1, keepdims=True)
    xte = xte / np.linalg.norm(xte, axis=1, keepdims=True)
    top1 = top5 = 0
    for x, y in zip(xte, yte):
        sim = xtr @ x
        nn_idx = np.argsort(-sim)[:k]
        votes = np.zeros(C)
        for j in nn_idx:
            votes[ytr[j]] += np.exp(sim[j] / T)
        top1 += votes.argmax() == y
        top5 += votes[y] > 0 and np.sum(votes > votes[y]) < 5
    return {"top1": 100 * top1 / len(yte), "top5": 100 * top5 / len(yte)}

@pytest.fixture(scope="module")
def clusters():
    rng = np.random.default_rng(1)
    C, d = 8, 12
    centres = rng.normal(size=(C, d))
    ytr, yte = rng.integers(0, C, 400), rng.integers(0, C, 120)
    xtr = centres[ytr] + 1.2 * rng.normal(size=(400, d))
    xte = centres[yte] + 1.2 * rng.normal(size=(120, d))
    return xtr.astype(np.float32), ytr, xte.astype(np.float32), yte, C

@pytest.mark.parametrize("k", [1, 5, 20])
@pytest.mark.parametrize("batch_size", [7, 1024])
def test_knn_matches_brute_force(clusters, k, batch_size):
    xtr, ytr, xte, yte, C = clusters
    out = E.knn_accuracy(torch.from_numpy(xtr), torch.from_numpy(ytr), xte, yte, k=k, T=0.07, batch_size=batch_size)
    ref = knn_numpy(xtr.astype(np.float64), ytr, xte.astype(np.float64), yte, k, 0.07, C)
    assert out == pytest.approx(ref)
    assert 20 < out["top1"] < 100  # a non-trivial case

def test_knn_list_of_k(clusters):
    xtr, ytr, xte, yte, C = clusters
    multi = E.knn_accuracy(xtr, ytr, xte, yte, k=[10, 20], T=0.1)
    assert set(multi) == {10, 20}
    for k in (10, 20):
        assert multi[k] == E.knn_accuracy(xtr, ytr, xte, yte, k=k, T=0.1)

def test_knn_top5_only_with_five_classes_and_errors():
    x = torch.randn(20, 4)
    y = torch.arange(20) % 3
    assert set(E.knn_accuracy(x, y, x, y, k=3)) == {"top1"}
    assert set(E.knn_accuracy(x, y, x, y, k=3, num_classes=5)) == {"top1", "top5"}
    assert E.knn_accuracy(x, y, x, y, k=1)["top1"] == 100.0  # every point is its own nearest neighbour
    with pytest.raises(ValueError, match="n_train=20"):
        E.knn_accuracy(x, y, x, y, k=21)
    with pytest.raises(ValueError, match="num_classes=2"):
        E.knn_accuracy(x, y, x, y, k=3, num_classes=2)

def test_knn_and_probe_per_image_hits_match_their_accuracy(clusters):
    "return_correct: one hit per test example, whose mean is the reported top-1, for an int k and a list of k."
    xtr, ytr, xte, yte, C = clusters
    one = E.knn_accuracy(xtr, ytr, xte, yte, k=5, batch_size=7, return_correct=True)
    assert one["correct"].dtype == bool and one["correct"].shape == (len(yte),)
    assert 100 * one["correct"].mean() == pytest.approx(one["top1"])
    multi = E.knn_accuracy(xtr, ytr, xte, yte, k=[1, 20], return_correct=True)
    assert all(100 * multi[k]["correct"].mean() == pytest.approx(multi[k]["top1"]) for k in (1, 20))
    assert not (multi[1]["correct"] == multi[20]["correct"]).all()   # the hits belong to their own k
    lp = E.linear_probe(xtr, ytr, xte, yte, epochs=3, lr=0.1, batch_size=32, return_correct=True)
    assert lp["correct"].shape == (len(yte),) and 100 * lp["correct"].mean() == pytest.approx(lp["top1"])
    assert "correct" not in E.knn_accuracy(xtr, ytr, xte, yte, k=5)

# ---- linear probe and feature extraction --------------------------------------------------------------

def test_linear_probe_module_layout():
    torch.manual_seed(0)
    p = E.LinearProbe(512, 100)
    bn, fc = p[0], p[1]
    assert isinstance(bn, nn.BatchNorm1d) and not bn.affine and bn.eps == 1e-6
    assert isinstance(fc, nn.Linear) and fc.weight.shape == (100, 512)
    assert (fc.bias == 0).all() and fc.weight.std().item() == pytest.approx(0.01, rel=0.05)
    assert fc.weight.abs().max() <= 2.0

def _separable(seed=0, C=6, d=32, n=240):
    "Gaussian clusters around fixed centres (same for every seed); `seed` draws the noise."
    centres = torch.randn(C, d, generator=torch.Generator().manual_seed(99)) * 4 + 10  # BatchNorm must cope
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % C
    return centres[y] + torch.randn(n, d, generator=g), y

def test_linear_probe_separable_reaches_100():
    xtr, ytr = _separable(0)
    xte, yte = _separable(1)
    out = E.linear_probe(xtr, ytr, xte, yte, epochs=15, lr=0.1, batch_size=32, seed=0)
    assert out == {"top1": 100.0, "top5": 100.0}

def test_linear_probe_deterministic_and_leaves_global_rng():
    xtr, ytr = _separable(0, C=3)
    xte, yte = _separable(1, C=3)
    torch.manual_seed(123)
    state = torch.get_rng_state()
    r1, p1 = E.linear_probe(xtr, ytr, xte, yte, epochs=2, lr=0.05, batch_size=16, seed=7, return_probe=True)
    assert torch.equal(torch.get_rng_state(), state)
    r2, p2 = E.linear_probe(xtr.numpy(), ytr.numpy(), xte, yte, epochs=2, lr=0.05, batch_size=16, seed=7,
                            return_probe=True)
    _, p3 = E.linear_probe(xtr, ytr, xte, yte, epochs=2, lr=0.05, batch_size=16, seed=8, return_probe=True)
    assert r1 == r2 and set(r1) == {"top1"}  # 3 classes: no top-5
    assert torch.equal(p1[1].weight, p2[1].weight) and not torch.equal(p1[1].weight, p3[1].weight)

def test_linear_probe_errors():
    x, y = _separable(0, C=3, n=12)
    with pytest.raises(ValueError, match="batch_size"):
        E.linear_probe(x, y, x, y, epochs=1, lr=0.1, batch_size=1)
    with pytest.raises(FloatingPointError, match="lr"):
        E.linear_probe(x, y, x, y, epochs=3, lr=1e38, batch_size=4)
    with pytest.raises(ValueError, match="NaN or inf"):
        E.linear_probe(x.masked_fill(x > 11, float("inf")), y, x, y, epochs=1, lr=0.1, batch_size=4)

def _tiny_vit(**kw):
    from timm.models.vision_transformer import VisionTransformer
    torch.manual_seed(0)
    return VisionTransformer(img_size=16, patch_size=8, embed_dim=24, depth=1, num_heads=2, num_classes=3, **kw)

def test_extract_features_default_is_timm_pre_logits():
    vit = _tiny_vit(drop_rate=0.5, proj_drop_rate=0.5)  # dropout: only deterministic in eval mode
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(4, 3, 16, 16, generator=g) for _ in range(3)]
    loader = [(x, torch.tensor([i, 0, 1, 2]), "extra") for i, x in enumerate(xs)]
    vit.train()
    f, y = E.extract_features(vit, loader)
    assert vit.training  # mode restored
    vit.eval()
    with torch.no_grad():
        ref = torch.cat([vit.forward_head(vit.forward_features(x), pre_logits=True) for x in xs])
    assert f.shape == (12, 24) and f.dtype == torch.float32 and not f.requires_grad
    assert torch.allclose(f, ref) and y.tolist() == [0, 0, 1, 2, 1, 0, 1, 2, 2, 0, 1, 2]
    f2, _ = E.extract_features(vit, loader, fn=lambda m, x: m.forward_features(x)[:, 0])
    assert f2.shape == (12, 24) and not vit.training

def test_extract_features_errors():
    lin = nn.Linear(4, 2)
    loader = [(torch.randn(3, 4), torch.zeros(3))]
    with pytest.raises(TypeError, match="fn="):
        E.extract_features(lin, loader)
    f, y = E.extract_features(lin, loader, fn=lambda m, x: m(x))
    assert f.shape == (3, 2) and y.dtype == torch.long
    with pytest.raises(ValueError, match=r"expected \(3, d\)"):
        E.extract_features(lin, loader, fn=lambda m, x: m(x)[None])
    with pytest.raises(TypeError, match="images, labels"):
        E.extract_features(lin, [torch.randn(3, 4)], fn=lambda m, x: m(x))

# ---- linear CKA ---------------------------------------------------------------------------------------

def cka_gram_numpy(x, y):
    "Linear CKA through centred Gram matrices and the HSIC estimator tr(KHLH)/(n-1)^2."
    n = len(x)
    H = np.eye(n) - np.ones((n, n)) / n
    K, L = x @ x.T, y @ y.T
    hsic = lambda A, B: np.trace(A @ H @ B @ H) / (n - 1) ** 2
    return hsic(K, L) / np.sqrt(hsic(K, K) * hsic(L, L))

def test_linear_cka():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(60, 10))
    y = x[:, :6] @ rng.normal(size=(6, 7)) + 0.5 * rng.normal(size=(60, 7))
    q, _ = np.linalg.qr(rng.normal(size=(10, 10)))
    assert E.linear_cka(x, x) == pytest.approx(1.0, abs=1e-12)
    c = E.linear_cka(torch.tensor(x, dtype=torch.float32), y)
    assert 0 <= c <= 1 and c == pytest.approx(cka_gram_numpy(x, y), rel=1e-6)
    assert E.linear_cka(x @ q, y) == pytest.approx(E.linear_cka(x, y), rel=1e-9)         # orthogonal
    assert E.linear_cka(5.0 * x, 0.1 * y) == pytest.approx(E.linear_cka(x, y), rel=1e-9)  # isotropic scale
    assert E.linear_cka(x + 3.0, y) == pytest.approx(E.linear_cka(x, y), rel=1e-9)        # centred
    for _ in range(5):
        a, b = rng.normal(size=(30, 4)), rng.normal(size=(30, 9))
        assert 0 <= E.linear_cka(a, b) <= 1 and E.linear_cka(a, b) == pytest.approx(cka_gram_numpy(a, b), rel=1e-9)

def test_linear_cka_errors():
    with pytest.raises(ValueError, match="same n"):
        E.linear_cka(np.zeros((5, 2)), np.zeros((6, 2)))
    with pytest.raises(ValueError, match="constant"):
        E.linear_cka(np.ones((5, 2)), np.random.default_rng(0).normal(size=(5, 2)))

# ---- head JSD -----------------------------------------------------------------------------------------

def _maps(rng, B=2, H=3, N=5, sparse=False):
    p = rng.random((B, H, N, N)) ** 3
    if sparse:
        p[p < 0.3] = 0.0  # exact zeros
        p[..., 0] += 1e-3  # keep every row non-empty
    return p / p.sum(-1, keepdims=True)

def jsd_matrix_scipy(p, q):
    "(Hp, Hq) mean over examples and query rows of scipy's JS distance squared (natural log)."
    B, Hp, N, _ = p.shape
    Hq = q.shape[1]
    d = np.zeros((Hp, Hq))
    for i, j in itertools.product(range(Hp), range(Hq)):
        d[i, j] = np.mean([jensenshannon(p[b, i, n], q[b, j, n]) ** 2 for b in range(B) for n in range(N)])
    return d

@pytest.mark.parametrize("sparse", [False, True])
def test_head_jsd_matches_scipy(sparse):
    rng = np.random.default_rng(3)
    p, q = _maps(rng, sparse=sparse), _maps(rng, sparse=sparse)
    d = jsd_matrix_scipy(p, q)
    assert E.head_jsd(p, q, "direct") == pytest.approx(np.mean(np.diag(d)), rel=1e-9)
    assert E.head_jsd(torch.tensor(p, dtype=torch.float32), q, "direct") == pytest.approx(np.mean(np.diag(d)), rel=1e-4)
    best = min(np.mean([d[i, j] for i, j in enumerate(perm)]) for perm in itertools.permutations(range(3)))
    assert E.head_jsd(p, q, "bipartite") == pytest.approx(best, rel=1e-9)
    assert E.head_jsd(p, q, "minimum") == pytest.approx(d.min(1).mean(), rel=1e-9)
    pa, qa = p.mean(1), q.mean(1)
    ref_avg = np.mean([jensenshannon(pa[b, n], qa[b, n]) ** 2 for b in range(2) for n in range(5)])
    assert E.head_jsd(p, q, "average") == pytest.approx(ref_avg, rel=1e-9)
    assert np.isfinite([E.head_jsd(p, q, m) for m in E.JSD_MATCHINGS]).all()

def test_head_jsd_properties():
    rng = np.random.default_rng(4)
    p = _maps(rng, H=4)
    perm = p[:, [2, 3, 0, 1]]
    assert E.head_jsd(p, perm, "bipartite") == pytest.approx(0, abs=1e-12)
    assert E.head_jsd(p, perm, "minimum") == pytest.approx(0, abs=1e-12)
    assert E.head_jsd(p, perm, "direct") > 0.01
    one_hot = np.broadcast_to(np.eye(5), (1, 1, 5, 5))
    assert E.head_jsd(one_hot, np.roll(one_hot, 1, -1)) == pytest.approx(math.log(2))  # natural-log maximum
    q3 = _maps(rng, H=3)  # different head counts
    d = jsd_matrix_scipy(p[:, :, :5], q3)
    best = min(np.mean([d[i, j] for j, i in enumerate(c)]) for c in itertools.permutations(range(4), 3))
    assert E.head_jsd(p, q3, "bipartite") == pytest.approx(best, rel=1e-9)

def test_head_jsd_errors():
    rng = np.random.default_rng(5)
    p = _maps(rng)
    with pytest.raises(ValueError) as e:
        E.head_jsd(p, p, "hungarian")
    assert all(m in str(e.value) for m in ("direct", "bipartite", "minimum", "average"))
    with pytest.raises(ValueError, match="softmax"):
        E.head_jsd(np.log(p + 1e-9), p)  # logits, not probabilities
    with pytest.raises(ValueError, match="sum to 1"):
        E.head_jsd(2 * p, p)
    with pytest.raises(ValueError, match="head counts differ"):
        E.head_jsd(p, _maps(rng, H=2), "direct")
    with pytest.raises(ValueError, match=r"\(B, H, N, N\)"):
        E.head_jsd(p[0], p[0])

# ---- MaxBoxAcc ----------------------------------------------------------------------------------------

def box_acc_reference(maps, boxes, iou_thr, cams):
    "Slow independent reference: own BFS 8-connected labelling, inclusive-exclusive IoU."
    def largest_box(mask):
        h, w = mask.shape
        seen = np.zeros_like(mask)
        best = None
        for r in range(h):
            for c in range(w):
                if mask[r, c] and not seen[r, c]:
                    comp, dq = [], deque([(r, c)])
                    seen[r, c] = True
                    while dq:
                        y, x = dq.popleft()
                        comp.append((y, x))
                        for dy in (-1, 0, 1):
                            for dx in (-1, 0, 1):
                                yy, xx = y + dy, x + dx
                                if 0 <= yy < h and 0 <= xx < w and mask[yy, xx] and not seen[yy, xx]:
                                    seen[yy, xx] = True
                                    dq.append((yy, xx))
                    if best is None or len(comp) > len(best):
                        best = comp
        if best is None:
            return None
        ys, xs = zip(*best)
        return (min(xs), min(ys), max(xs) + 1, max(ys) + 1)
    def iou(a, b):
        iw = max(0, min(a[2], b[2]) - max(a[0], b[0])); ih = max(0, min(a[3], b[3]) - max(a[1], b[1]))
        inter = iw * ih
        return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)
    acc = np.zeros(len(cams))
    for m, gts in zip(maps, boxes):
        m = (m - m.min()) / (m.max() - m.min())
        for j, t in enumerate(cams):
            pb = largest_box(m >= t)
            acc[j] += pb is not None and max(iou(pb, g) for g in gts) >= iou_thr
    return 100 * acc.max() / len(maps)

def test_max_box_acc_matches_reference_on_random_blobs():
    rng = np.random.default_rng(6)
    maps, boxes = [], []
    yy, xx = np.mgrid[0:16, 0:16]
    for _ in range(6):
        m = np.zeros((16, 16))
        for _ in range(3):  # a few gaussian blobs
            cy, cx, s = rng.uniform(0, 16), rng.uniform(0, 16), rng.uniform(1, 4)
            m += rng.uniform(0.3, 1) * np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * s * s))
        maps.append(m + 0.05 * rng.random((16, 16)))
        x0, y0 = rng.integers(0, 10, 2)
        boxes.append(np.array([[x0, y0, x0 + rng.integers(3, 7), y0 + rng.integers(3, 7)]]))
    maps = np.stack(maps)
    out = E.max_box_acc(maps, boxes, iou_thresholds=(0.3, 0.5, 0.7), cam_curve_interval=0.05)
    refs = [box_acc_reference(maps, boxes, t, np.arange(0, 1, 0.05)) for t in (0.3, 0.5, 0.7)]
    assert [out["iou30"], out["iou50"], out["iou70"]] == pytest.approx(refs)
    assert out["mean"] == pytest.approx(np.mean(refs))
    assert refs[0] > 0  # the test exercises hits

def test_max_box_acc_known_cases():
    m = np.zeros((1, 24, 24))
    box = [np.array([[4, 6, 14, 16]])]
    m[0, 6:16, 4:14] = 1.0
    assert E.max_box_acc(m, box, (0.5, 0.7, 0.9)) == {"iou50": 100.0, "iou70": 100.0, "iou90": 100.0, "mean": 100.0}
    far = np.zeros((1, 24, 24)); far[0, 18:24, 18:24] = 1.0
    assert E.max_box_acc(far, box)["iou50"] == 0.0
    half = np.zeros((1, 24, 24)); half[0, 6:11, 4:14] = 1.0  # top half of the box: IoU exactly 0.5
    assert E.max_box_acc(torch.tensor(half), box, (0.5, 0.6)) == {"iou50": 100.0, "iou60": 0.0, "mean": 50.0}
    # two gt boxes: the best-matching one counts
    assert E.max_box_acc(far, [np.array([[4, 6, 14, 16], [18, 18, 24, 24]])])["iou50"] == 100.0

def test_max_box_acc_largest_component_vs_multi_contour():
    m = np.zeros((1, 30, 30))
    m[0, 2:6, 2:6] = 1.0       # small blob, matches the box
    m[0, 15:28, 10:28] = 1.0   # large blob elsewhere
    box = [np.array([[2, 2, 6, 6]])]
    assert E.max_box_acc(m, box)["iou50"] == 0.0
    assert E.max_box_acc(m, box, multi_contour=True)["iou50"] == 100.0
    diag = np.zeros((1, 10, 10)); diag[0, [2, 3, 4], [2, 3, 4]] = 1.0  # diagonal pixels: one 8-connected blob
    assert E.max_box_acc(diag, [np.array([[2, 2, 5, 5]])])["iou50"] == 100.0

def test_max_box_acc_constant_map_is_whole_image_at_zero():
    m = np.full((1, 10, 10), 0.3)  # normalises to zeros: only t=0 gives a (whole-image) box
    assert E.max_box_acc(m, [np.array([[0, 0, 10, 6]])], (0.6,))["iou60"] == 100.0
    assert E.max_box_acc(m, [np.array([[0, 0, 10, 5]])], (0.6,))["iou60"] == 0.0

def test_max_box_acc_errors():
    m = np.zeros((2, 8, 8))
    good = [np.array([[0, 0, 4, 4]])] * 2
    with pytest.raises(ValueError, match="2 maps but 1"):
        E.max_box_acc(m, good[:1])
    with pytest.raises(ValueError, match="fractions"):
        E.max_box_acc(m, good, iou_thresholds=(50,))
    with pytest.raises(ValueError, match="inclusive-exclusive"):
        E.max_box_acc(m, [np.array([[0, 0, 9, 4]])] * 2)
    with pytest.raises(ValueError, match="NaN"):
        E.max_box_acc(np.full((2, 8, 8), np.nan), good)

def test_upsample_maps():
    x = torch.rand(3, 4, 5)
    ref = F.interpolate(x[:, None], size=(8, 10), mode="bilinear", align_corners=False)[:, 0]
    assert torch.allclose(E.upsample_maps(x, (8, 10)), ref)
    assert E.upsample_maps(x.numpy(), 16).shape == (3, 16, 16)
    with pytest.raises(ValueError, match=r"\(N, h, w\)"):
        E.upsample_maps(x[0], 8)

# ---- attention-mask Jaccard ---------------------------------------------------------------------------

def mass_mask_reference(a, keep):
    "Smallest set of highest values holding >= keep of the total mass (values distinct)."
    flat = a.ravel() / a.sum()
    order = np.argsort(-flat)
    csum = np.cumsum(flat[order])
    n = int(np.searchsorted(csum, keep - 1e-12)) + 1
    m = np.zeros(flat.size, bool); m[order[:n]] = True
    return m.reshape(a.shape)

def test_attention_mass_mask_matches_reference():
    rng = np.random.default_rng(7)
    a = rng.random((4, 9, 9)) ** 4
    for keep in (0.3, 0.6, 0.9):
        got = E.attention_mass_mask(torch.tensor(a, dtype=torch.float32), keep).numpy()
        assert all((got[i] == mass_mask_reference(a[i], keep)).all() for i in range(4))
    # keep_mass=1 keeps exactly the pixels with non-zero attention
    sparse = np.where(a > 0.2, a, 0.0)
    assert (E.attention_mass_mask(sparse, 1.0).numpy() == (sparse > 0)).all()

def test_attention_mask_jaccard():
    attn = torch.zeros(2, 10, 10)
    attn[0, 2:5, 3:7] = 1.0 + torch.rand(3, 4) * 1e-3  # near-uniform blob: 60% of it is kept
    attn[1, 0:2, 0:2] = torch.tensor([[4.0, 3.0], [2.0, 1.0]])
    gt = torch.stack([E.boxes_to_mask([[3, 2, 7, 5]], 10, 10), E.boxes_to_mask([[0, 0, 1, 1]], 10, 10)])
    j = E.attention_mask_jaccard(attn, gt)
    kept0 = E.attention_mass_mask(attn[0]).sum().item()
    assert kept0 == 8  # ceil(0.6 * 12) pixels of a near-uniform 12-pixel blob
    # image 1: top values 4+3 = 7/10 >= 0.6 -> mask {4, 3}; gt is the single pixel of value 4
    assert j.shape == (2,) and j[0].item() == pytest.approx(8 / 12) and j[1].item() == pytest.approx(1 / 2)
    assert E.attention_mask_jaccard(attn[1], gt[1].numpy()).ndim == 0
    with pytest.raises(ValueError, match="upsample_maps"):
        E.attention_mask_jaccard(attn, gt[:, :5])
    with pytest.raises(ValueError, match="zero total"):
        E.attention_mask_jaccard(torch.zeros(4, 4), torch.ones(4, 4))
    with pytest.raises(ValueError, match="keep_mass"):
        E.attention_mask_jaccard(attn, gt, keep_mass=0)

def test_boxes_to_mask():
    m = E.boxes_to_mask(np.array([[1, 2, 4, 3], [3, 0, 5, 1]]), 4, 6)
    ref = np.zeros((4, 6), bool); ref[2, 1:4] = True; ref[0, 3:5] = True
    assert m.dtype == torch.bool and (m.numpy() == ref).all()
    # fractional box: pixel centres (i + 0.5) inside [0.6, 2.4) x [0.4, 1.6) are column 1, rows 0-1
    assert (E.boxes_to_mask([[0.6, 0.4, 2.4, 1.6]], 3, 3).numpy() == np.array(
        [[0, 1, 0], [0, 1, 0], [0, 0, 0]], bool)).all()
    with pytest.raises(ValueError, match="0 <= x0 < x1 <= 6"):
        E.boxes_to_mask([[0, 0, 7, 1]], 4, 6)
