"""Tests for attnrepro.evaluate against brute-force numpy / scipy references on small synthetic data."""
import itertools, math

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from scipy import ndimage
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

def test_linear_probe_warmup_and_lars_follow_mae():
    """Defaults are the plain SGD + cosine probe bit for bit; with one step per epoch, epochs=2 and warmup_epochs=1 the
    lr is 0 at step 0 (MAE's linear warm-up) and full at step 1, so both steps see the initial weights' gradient g:
    SGD moves by lr (0.9 g + g); LARS scales the 2-D weight's g by 0.001 |w| / |g| and leaves the bias's alone."""
    xtr, ytr = _separable(0, C=3, n=48)
    xte, yte = _separable(1, C=3, n=48)
    kw = dict(epochs=2, lr=0.5, batch_size=len(xtr), seed=3, return_probe=True)
    r0, p0 = E.linear_probe(xtr, ytr, xte, yte, **kw)
    r1, p1 = E.linear_probe(xtr, ytr, xte, yte, optimizer="sgd", warmup_epochs=0, **kw)
    assert r0 == r1 and torch.equal(p0[1].weight, p1[1].weight)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        ref = E.LinearProbe(xtr.shape[1], 3)
    w0, b0 = ref[1].weight.detach().clone(), ref[1].bias.detach().clone()
    ref.train()
    F.cross_entropy(ref(xtr), ytr).backward()
    gw, gb = ref[1].weight.grad, ref[1].bias.grad
    _, ps = E.linear_probe(xtr, ytr, xte, yte, warmup_epochs=1, **kw)
    torch.testing.assert_close(ps[1].weight.detach(), w0 - 0.5 * 1.9 * gw)
    torch.testing.assert_close(ps[1].bias.detach(), b0 - 0.5 * 1.9 * gb)
    _, pl = E.linear_probe(xtr, ytr, xte, yte, warmup_epochs=1, optimizer="lars", **kw)
    q = 0.001 * w0.norm() / gw.norm()
    torch.testing.assert_close(pl[1].weight.detach(), w0 - 0.5 * 1.9 * q * gw)
    torch.testing.assert_close(pl[1].bias.detach(), b0 - 0.5 * 1.9 * gb)
    with pytest.raises(ValueError, match="valid: sgd, lars"):
        E.linear_probe(xtr, ytr, xte, yte, epochs=2, lr=0.1, batch_size=16, optimizer="adam")
    with pytest.raises(ValueError, match="warmup_epochs"):
        E.linear_probe(xtr, ytr, xte, yte, epochs=2, lr=0.1, batch_size=16, warmup_epochs=2)

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
    # every matching at once (the pairwise matrix shared by 'minimum' and 'bipartite'), in either order: the same values
    for order in (E.JSD_MATCHINGS, E.JSD_MATCHINGS[::-1]):
        assert E.head_jsds(p, q, order) == {m: E.head_jsd(p, q, m) for m in order}
    assert E.head_jsds(p, q)["bipartite"] == pytest.approx(best, rel=1e-9)

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

# Reference: clovaai/wsolevaluation, evaluation.py (calculate_multiple_iou, compute_bboxes_from_scoremaps,
# BoxEvaluator.accumulate / compute), transcribed in numpy. Its cv2 calls are replaced by a plain-Python
# transcription of the algorithm OpenCV implements (Suzuki & Abe 1985 border following, RETR_TREE order):
# cv2.findContours, cv2.boundingRect, cv2.contourArea. Ground-truth boxes there are inclusive corners
# (Tiny-ImageNet's annotations are too; attnrepro.data loads them as x1 + 1, exclusive).

def wsol_calculate_multiple_iou(box_a, box_b):
    "evaluation.py, calculate_multiple_iou (inclusive x0y0x1y1 corners)."
    num_a, num_b = box_a.shape[0], box_b.shape[0]
    box_a = np.tile(box_a, num_b)
    box_a = np.expand_dims(box_a, axis=1).reshape((num_a, num_b, -1))
    box_b = np.tile(box_b, num_a)
    box_b = np.expand_dims(box_b, axis=1).reshape((num_b, num_a, -1))
    box_b = np.transpose(box_b, (1, 0, 2))
    min_x = np.maximum(box_a[:, :, 0], box_b[:, :, 0])
    min_y = np.maximum(box_a[:, :, 1], box_b[:, :, 1])
    max_x = np.minimum(box_a[:, :, 2], box_b[:, :, 2])
    max_y = np.minimum(box_a[:, :, 3], box_b[:, :, 3])
    area_intersect = np.maximum(0, max_x - min_x + 1) * np.maximum(0, max_y - min_y + 1)
    area_a = (box_a[:, :, 2] - box_a[:, :, 0] + 1) * (box_a[:, :, 3] - box_a[:, :, 1] + 1)
    area_b = (box_b[:, :, 2] - box_b[:, :, 0] + 1) * (box_b[:, :, 3] - box_b[:, :, 1] + 1)
    denominator = area_a + area_b - area_intersect
    degenerate_indices = np.where(denominator <= 0)
    denominator[degenerate_indices] = 1
    ious = area_intersect / denominator
    ious[degenerate_indices] = 0
    return ious

_NBR = [(0, 1), (1, 1), (1, 0), (1, -1), (0, -1), (-1, -1), (-1, 0), (-1, 1)]  # clockwise from east, rows down

def suzuki_find_contours(binary):
    "cv2.findContours(RETR_TREE) stand-in: Suzuki & Abe border following; (x, y) point arrays in OpenCV's order."
    f = np.pad(np.asarray(binary) != 0, 1).astype(np.int64)   # the frame is background
    borders = {1: dict(parent=None, hole=True, points=None, children=[])}   # NBD 1 = the frame
    nbd = 1
    for i in range(1, f.shape[0] - 1):
        lnbd = 1
        for j in range(1, f.shape[1] - 1):
            if f[i, j] == 1 and f[i, j - 1] == 0:                     # (1a) outer border starts
                hole, (i2, j2) = False, (i, j - 1)
            elif f[i, j] >= 1 and f[i, j + 1] == 0:                   # (1b) hole border starts
                hole, (i2, j2) = True, (i, j + 1)
                if f[i, j] > 1:
                    lnbd = f[i, j]
            else:
                if f[i, j] not in (0, 1):
                    lnbd = abs(f[i, j])
                continue
            nbd += 1
            last = borders[lnbd]                                       # (2) parent, Suzuki's Table 1
            parent = last["parent"] if hole == last["hole"] else lnbd
            s = _NBR.index((i2 - i, j2 - j))                           # (3.1) clockwise for a non-zero pixel
            first = next(((i + d[0], j + d[1]) for d in (_NBR[(s + k) % 8] for k in range(8))
                          if f[i + d[0], j + d[1]] != 0), None)
            pts = []
            if first is None:
                f[i, j] = -nbd
                pts.append((i, j))
            else:
                (i2, j2), (i3, j3) = first, (i, j)                     # (3.2)
                while True:
                    s = _NBR.index((i2 - i3, j2 - j3))                 # (3.3) counter-clockwise from after (i2, j2)
                    right_zero = False
                    for k in range(1, 9):
                        d = _NBR[(s - k) % 8]
                        if f[i3 + d[0], j3 + d[1]] != 0:
                            i4, j4 = i3 + d[0], j3 + d[1]
                            break
                        right_zero |= d == (0, 1)
                    if right_zero:                                     # (3.4)
                        f[i3, j3] = -nbd
                    elif f[i3, j3] == 1:
                        f[i3, j3] = nbd
                    pts.append((i3, j3))
                    if (i4, j4) == (i, j) and (i3, j3) == first:       # (3.5)
                        break
                    (i2, j2), (i3, j3) = (i3, j3), (i4, j4)
            borders[nbd] = dict(parent=parent, hole=hole, children=[],
                                points=np.array([(c - 1, r - 1) for r, c in pts]))
            borders[parent]["children"].insert(0, nbd)   # OpenCV puts a new contour first among its siblings
            if f[i, j] not in (0, 1):                                  # (4)
                lnbd = abs(f[i, j])
    out, stack = [], borders[1]["children"][::-1]                     # depth first, as cvTreeToNodeSeq
    while stack:
        b = stack.pop()
        out.append(borders[b]["points"])
        stack.extend(borders[b]["children"][::-1])
    return out

def cv_bounding_rect(pts):
    (x0, y0), (x1, y1) = pts.min(0), pts.max(0)
    return int(x0), int(y0), int(x1 - x0 + 1), int(y1 - y0 + 1)

def cv_contour_area(pts):
    x, y = pts[:, 0].astype(float), pts[:, 1].astype(float)
    return abs(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1))) / 2   # shoelace

def wsol_scoremap2bbox(scoremap, threshold, multi_contour_eval, find_contours=suzuki_find_contours,
                       bounding_rect=cv_bounding_rect, contour_area=cv_contour_area):
    "evaluation.py, compute_bboxes_from_scoremaps.scoremap2bbox (cv2.threshold written out)."
    height, width = scoremap.shape
    scoremap_image = (scoremap * 255).astype(np.uint8)
    thr_gray_heatmap = scoremap_image > int(threshold * np.max(scoremap_image))   # THRESH_BINARY: strictly above
    contours = find_contours(thr_gray_heatmap)
    if len(contours) == 0:
        return np.asarray([[0, 0, 0, 0]]), 1
    if not multi_contour_eval:
        contours = [max(contours, key=contour_area)]
    estimated_boxes = []
    for contour in contours:
        x, y, w, h = bounding_rect(contour)
        x0, y0, x1, y1 = x, y, x + w, y + h
        x1 = min(x1, width - 1)
        y1 = min(y1, height - 1)
        estimated_boxes.append([x0, y0, x1, y1])
    return np.asarray(estimated_boxes), len(contours)

def wsol_max_box_acc(cams, gt_boxes_inclusive, iou_threshold_list, cam_threshold_list, multi_contour_eval=False,
                     **contour_fns):
    "evaluation.py, BoxEvaluator.accumulate over the images then compute; normalize_scoremap of inference.py."
    num_correct = {t: np.zeros(len(cam_threshold_list)) for t in iou_threshold_list}
    for cam, gt in zip(cams, gt_boxes_inclusive):
        cam = cam - cam.min()
        cam = cam / cam.max() if cam.max() > 0 else np.zeros_like(cam)
        found = [wsol_scoremap2bbox(cam, t, multi_contour_eval, **contour_fns) for t in cam_threshold_list]
        boxes_at_thresholds = np.concatenate([b for b, _ in found], axis=0)
        multiple_iou = wsol_calculate_multiple_iou(np.array(boxes_at_thresholds), np.array(gt))
        idx, sliced_multiple_iou = 0, []
        for _, nr_box in found:
            sliced_multiple_iou.append(max(multiple_iou.max(1)[idx:idx + nr_box]))
            idx += nr_box
        for t in iou_threshold_list:
            num_correct[t][np.where(np.asarray(sliced_multiple_iou) >= (t / 100))[0]] += 1
    return [(num_correct[t] * 100. / float(len(cams))).max() for t in iou_threshold_list]

def random_wsol_case(rng, n, size):
    "Blob maps with noise (many components, holes and ties) and inclusive ground-truth boxes near the first blob."
    yy, xx = np.mgrid[0:size, 0:size]
    maps, boxes = [], []
    for k in range(n):
        m, gt = np.zeros((size, size)), []
        for b in range(rng.integers(1, 5)):
            cy, cx, s = rng.uniform(0, size), rng.uniform(0, size), rng.uniform(0.7, size / 5)
            m += (1.0 if b == 0 else rng.uniform(0.2, 0.8)) * np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * s * s))
            if b == 0:   # the object: a box of about +-2 sd around the first blob, jittered
                r = 2 * s * rng.uniform(0.6, 1.4, 4) + rng.normal(0, 1, 4)
                gt.append([int(np.clip(v, 0, size - 1)) for v in (cx - r[0], cy - r[1], cx + r[2], cy + r[3])])
                gt[0][2], gt[0][3] = max(gt[0][2], gt[0][0]), max(gt[0][3], gt[0][1])
        maps.append(m + rng.uniform(0, 0.4) * rng.random((size, size)))
        if k % 3 == 0:   # a second box, one pixel wide (Tiny-ImageNet has such boxes)
            x0, y0 = rng.integers(0, size, 2)
            gt.append([x0, y0, x0, min(y0 + rng.integers(0, 6), size - 1)])
        boxes.append(np.array(gt))
    return np.stack(maps), boxes

def test_box_iou_is_wsolevaluation_calculate_multiple_iou():
    rng = np.random.default_rng(3)
    a = np.sort(rng.integers(0, 12, (40, 2, 2)), axis=1).reshape(40, 4)   # (x0, y0, x1, y1), x0 <= x1, y0 <= y1
    b = np.sort(rng.integers(0, 12, (7, 2, 2)), axis=1).reshape(7, 4)
    assert (a[:, 2] >= a[:, 0]).all() and (a[:, 3] >= a[:, 1]).all()
    assert np.allclose(E._box_iou(a.astype(float), b.astype(float)), wsol_calculate_multiple_iou(a, b))
    # by hand: inclusive corners, so (0,0,1,1) and (1,1,2,2) are 2x2 boxes sharing one pixel: 1 / (4 + 4 - 1)
    assert E._box_iou(np.array([[0, 0, 1, 1]]), np.array([[1, 1, 2, 2]]))[0, 0] == pytest.approx(1 / 7)
    # a single-pixel box (x0 == x1) has area 1, not 0
    assert E._box_iou(np.array([[3, 3, 3, 3]]), np.array([[3, 3, 4, 3]]))[0, 0] == pytest.approx(1 / 2)

@pytest.mark.parametrize("multi_contour", [False, True])
def test_max_box_acc_matches_reference_on_random_blobs(multi_contour):
    rng = np.random.default_rng(6)
    maps, gt_incl = random_wsol_case(rng, 24, 16)
    cams = np.arange(0, 1, 0.02)
    boxes = [g + np.array([0, 0, 1, 1]) for g in gt_incl]   # x1 = last column + 1, attnrepro's (and CUB's x + w)
    ours = E.max_box_acc(maps, boxes, iou_thresholds=(0.3, 0.5, 0.7), cam_curve_interval=0.02, multi_contour=multi_contour)
    refs = wsol_max_box_acc(maps, boxes, (30, 50, 70), cams, multi_contour)   # the reference gets the same numbers
    assert [ours["iou30"], ours["iou50"], ours["iou70"]] == pytest.approx(refs)
    assert ours["mean"] == pytest.approx(np.mean(refs))
    assert 0 < refs[1] < 100   # the case exercises hits and misses

def test_contour_boxes_match_reference_at_every_threshold():
    "The per-threshold box (largest contour area, ties in OpenCV's order) and every multi-contour box."
    rng = np.random.default_rng(11)
    maps, _ = random_wsol_case(rng, 10, 14)
    maps[0] = rng.random((14, 14))                     # pure noise: nested components, holes, area ties
    maps[1] = (rng.random((14, 14)) > 0.5) * rng.random((14, 14))
    by_pixel_count_differs = 0
    for m in maps:
        m = (m - m.min()) / (m.max() - m.min())
        img = (m * 255).astype(np.uint8)
        for t in np.arange(0, 1, 0.05):
            mask = img > int(t * 255)
            for multi in (False, True):
                ref, _ = wsol_scoremap2bbox(m, t, multi)
                got = E._contour_boxes(mask, multi)
                assert sorted(map(tuple, got.tolist())) == sorted(map(tuple, ref.astype(float).tolist()))
            lab, n = ndimage.label(mask, structure=np.ones((3, 3)))
            if n > 1:   # the largest pixel count, the rule before the reference was followed
                sy, sx = ndimage.find_objects(lab)[int(np.argmax(np.bincount(lab.ravel())[1:]))]
                by_pixel_count_differs += [sx.start, sy.start, min(sx.stop, 13), min(sy.stop, 13)] != \
                    wsol_scoremap2bbox(m, t, False)[0][0].tolist()
    assert by_pixel_count_differs > 0   # the cases tell contour area from pixel count

def test_max_box_acc_matches_opencv_reference():
    "The reference's own cv2 calls (run where OpenCV is installed; the project does not depend on it)."
    cv2 = pytest.importorskip("cv2")
    def find(binary):
        return cv2.findContours((binary * 255).astype(np.uint8), cv2.RETR_TREE, cv2.CHAIN_APPROX_SIMPLE)[-2]
    fns = dict(find_contours=find, bounding_rect=cv2.boundingRect, contour_area=cv2.contourArea)
    rng = np.random.default_rng(12)
    maps, gt_incl = random_wsol_case(rng, 30, 20)
    for m in maps[:8]:   # the stand-in itself, contour by contour
        m = (m - m.min()) / (m.max() - m.min())
        b = (m * 255).astype(np.uint8) > 100
        assert [(cv_bounding_rect(c), cv_contour_area(c)) for c in suzuki_find_contours(b)] == \
               [(cv2.boundingRect(c), cv2.contourArea(c)) for c in find(b)]
    for multi in (False, True):
        boxes = [g + np.array([0, 0, 1, 1]) for g in gt_incl]
        ours = E.max_box_acc(maps, boxes, (0.3, 0.5, 0.7), 0.01, multi)
        refs = wsol_max_box_acc(maps, boxes, (30, 50, 70), np.arange(0, 1, 0.01), multi, **fns)
        assert [ours["iou30"], ours["iou50"], ours["iou70"]] == pytest.approx(refs)

def test_max_box_acc_known_cases():
    m = np.zeros((1, 24, 24))
    box = [np.array([[4, 6, 14, 16]])]       # 10x10 pixels, columns 4..13
    m[0, 6:16, 4:14] = 1.0
    # the reference reads the component's box (4, 6, 14, 16) and the ground truth (4, 6, 14, 16) alike, as inclusive
    # corners (11x11): a map that is exactly the box scores IoU 1
    assert E.max_box_acc(m, box, (0.5, 0.9, 1.0)) == {"iou50": 100.0, "iou90": 100.0, "iou100": 100.0, "mean": 100.0}
    # the rule before issue #45 read the ground truth as (4, 6, 13, 15), 10x10: IoU 100 / 121 = 0.83
    assert E.max_box_acc(m, box, (0.5, 0.8, 0.9), gt_ends="exclusive") == {"iou50": 100.0, "iou80": 100.0, "iou90": 0.0,
                                                                          "mean": pytest.approx(200 / 3)}
    # at the bottom-right edge the estimated box is clipped to (14, 14, 23, 23), one short of the ground truth's 24
    edge = np.zeros((1, 24, 24)); edge[0, 14:24, 14:24] = 1.0
    assert E.max_box_acc(edge, [np.array([[14, 14, 24, 24]])], (0.82, 0.83)) == {"iou82": 100.0, "iou83": 0.0, "mean": 50.0}
    assert E.max_box_acc(edge, [np.array([[14, 14, 24, 24]])], (1.0,), gt_ends="exclusive")["iou100"] == 100.0
    far = np.zeros((1, 24, 24)); far[0, 18:24, 18:24] = 1.0
    assert E.max_box_acc(far, box)["iou50"] == 0.0
    half = np.zeros((1, 24, 24)); half[0, 6:11, 4:14] = 1.0  # top half: box 11x6 of the 11x11 truth: IoU 66 / 121
    assert E.max_box_acc(torch.tensor(half), box, (0.54, 0.55)) == {"iou54": 100.0, "iou55": 0.0, "mean": 50.0}
    assert E.max_box_acc(torch.tensor(half), box, (0.56, 0.57), gt_ends="exclusive") == {"iou56": 100.0, "iou57": 0.0,
                                                                                         "mean": 50.0}   # 60 / 106
    # two gt boxes: the best-matching one counts
    assert E.max_box_acc(far, [np.array([[4, 6, 14, 16], [18, 18, 24, 24]])])["iou50"] == 100.0

def test_max_box_acc_largest_contour_vs_multi_contour():
    m = np.zeros((1, 30, 30))
    m[0, 2:6, 2:6] = 1.0       # small blob, matches the box
    m[0, 15:28, 10:28] = 1.0   # large blob elsewhere
    box = [np.array([[2, 2, 6, 6]])]
    assert E.max_box_acc(m, box)["iou50"] == 0.0
    assert E.max_box_acc(m, box, multi_contour=True)["iou50"] == 100.0
    diag = np.zeros((1, 10, 10)); diag[0, [2, 3, 4], [2, 3, 4]] = 1.0  # diagonal pixels: one 8-connected blob
    assert E.max_box_acc(diag, [np.array([[2, 2, 5, 5]])])["iou50"] == 100.0   # 3x3 in 4x4: IoU 9 / 16
    # contour area, not pixel count: a 1x9 line (9 pixels, area 0) loses to a 2x2 square (4 pixels, area 1)
    line = np.zeros((1, 12, 12)); line[0, 1, 1:10] = 1.0; line[0, 6:8, 6:8] = 1.0
    assert E.max_box_acc(line, [np.array([[6, 6, 8, 8]])], (0.4,))["iou40"] == 100.0   # 4 / 9
    assert E.max_box_acc(line, [np.array([[1, 1, 10, 2]])], (0.4,))["iou40"] == 0.0

def test_max_box_acc_constant_map_predicts_the_corner_pixel():
    # the reference normalises a constant map to zeros; nothing is above any threshold, and the box is (0, 0, 0, 0)
    m = np.full((1, 10, 10), 0.3)
    assert E.max_box_acc(m, [np.array([[0, 0, 10, 6]])], (0.01,))["iou1"] == 100.0   # IoU 1 / 77
    assert E.max_box_acc(m, [np.array([[0, 0, 10, 6]])], (0.1,))["iou10"] == 0.0
    assert E.max_box_acc(m, [np.array([[0, 0, 1, 1]])], (0.25, 0.26)) == {"iou25": 100.0, "iou26": 0.0, "mean": 50.0}
    assert E.max_box_acc(m, [np.array([[0, 0, 1, 1]])], (1.0,), gt_ends="exclusive")["iou100"] == 100.0

def test_whole_image_box_acc_matches_reference_iou():
    rng = np.random.default_rng(4)
    _, gt_incl = random_wsol_case(rng, 30, 16)
    full = np.array([[0, 0, 15, 15]])   # the reference's box of a map whose foreground touches every edge
    boxes = [g + np.array([0, 0, 1, 1]) for g in gt_incl]   # x1 = last column + 1
    ts = (0.05, 0.1, 0.2)
    best = np.array([wsol_calculate_multiple_iou(full, b).max() for b in boxes])   # the reference gets the same numbers
    got = E.whole_image_box_acc(boxes, 16, 16, ts)
    assert [got["iou5"], got["iou10"], got["iou20"]] == pytest.approx([100 * (best >= t).mean() for t in ts])
    # the rule before issue #45 scored the corners one smaller
    best_old = np.array([wsol_calculate_multiple_iou(full, g).max() for g in gt_incl])
    old = E.whole_image_box_acc(boxes, 16, 16, ts, gt_ends="exclusive")
    assert [old["iou5"], old["iou10"], old["iou20"]] == pytest.approx([100 * (best_old >= t).mean() for t in ts])
    # the left half [0, 8] x [0, 16] counts 9 x 17 pixels: IoU 144 / 265
    assert E.whole_image_box_acc([np.array([[0, 0, 8, 16]])], 16, 16, (0.54, 0.55)) == {"iou54": 100.0, "iou55": 0.0}
    assert E.whole_image_box_acc([np.array([[0, 0, 8, 16]])], 16, 16, (0.5,), gt_ends="exclusive") == {"iou50": 100.0}

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
    with pytest.raises(ValueError, match="gt_ends must be one of"):
        E.max_box_acc(m, good, gt_ends="half-open")
    with pytest.raises(ValueError, match="gt_ends must be one of"):
        E.whole_image_box_acc(good, 8, 8, gt_ends="half-open")


def test_max_box_acc_golden_single_box_follows_wsolevaluation():
    """Golden case (issue #45): maps that light exactly one ground-truth box. wsolevaluation reads the ground truth's
    x1 column and y1 row as part of the box, as it reads the estimated box's x + w, so every such map scores IoU 1;
    the rule before issue #45 dropped them and scored the small boxes below IoU 0.3."""
    rng = np.random.default_rng(45)
    n, size = 40, 32
    maps, boxes = np.zeros((n, size, size)), []
    for i in range(n):
        w, h = rng.integers(1, 9, 2)
        x0, y0 = rng.integers(0, size - 9, 2)
        maps[i, y0:y0 + h, x0:x0 + w] = 1.0
        boxes.append(np.array([[x0, y0, x0 + w, y0 + h]]))
    new = E.max_box_acc(maps, boxes, (0.3, 0.5, 0.7, 1.0))
    assert new == {"iou30": 100.0, "iou50": 100.0, "iou70": 100.0, "iou100": 100.0, "mean": 100.0}
    assert [new["iou30"], new["iou50"], new["iou70"]] == pytest.approx(
        wsol_max_box_acc(maps, boxes, (30, 50, 70), np.arange(0, 1, 0.01)))
    old = E.max_box_acc(maps, boxes, (0.3, 1.0), gt_ends="exclusive")
    # by hand: a w x h box scored against (w + 1) x (h + 1) corners, IoU wh / ((w + 1)(h + 1))
    iou_old = np.array([(b[0, 2] - b[0, 0]) * (b[0, 3] - b[0, 1]) / ((b[0, 2] - b[0, 0] + 1) * (b[0, 3] - b[0, 1] + 1))
                        for b in boxes])
    assert old["iou30"] == pytest.approx(100 * (iou_old >= 0.3).mean()) and old["iou30"] < 100.0
    assert old["iou100"] == 0.0
    assert E.MAXBOXACC_GT_ENDS == "inclusive"

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
    # a Tiny-ImageNet annotation names its last pixel: (2, 1, 2, 3) is column 2, rows 1-3, loaded as (2, 1, 3, 4)
    assert (E.boxes_to_mask([[2, 1, 3, 4]], 4, 6).numpy() == (np.arange(6)[None] == 2) & (np.arange(4)[:, None] >= 1)).all()
    with pytest.raises(ValueError, match="0 <= x0 < x1 <= 6"):
        E.boxes_to_mask([[0, 0, 7, 1]], 4, 6)
