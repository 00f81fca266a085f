import shutil

import numpy as np
import pytest
import torch

from attnrepro import data
from attnrepro.data import (ChecksumError, DataNotFoundError, class_balanced_subset, get_dataset, train_transform,
                            eval_transform, verify_archive)


@pytest.fixture(scope="module")
def cifar_sample():
    return get_dataset("cifar10-sample", "train")


def test_embedded_samples_load_offline():
    tiny = get_dataset("tiny-imagenet-sample", "train")
    assert len(tiny) == 200 and len(tiny.classes) == 10
    assert tiny.images.shape == (200, 64, 64, 3) and tiny.images.dtype == np.uint8
    assert len(tiny.boxes) == 200 and all(b.shape == (1, 4) for b in tiny.boxes)
    x0, y0, x1, y1 = tiny.boxes[0][0]
    assert 0 <= x0 < x1 <= 64 and 0 <= y0 < y1 <= 64  # exclusive ends (the files name the last pixel)
    val = get_dataset("tiny-imagenet-sample", "val")
    assert len(val) == 100 and np.bincount(val.targets).tolist() == [10] * 10
    test = get_dataset("cifar10-sample", "test")
    assert len(test) == 100 and test.classes[0] == "airplane"


def test_transform_applied(cifar_sample):
    ds = get_dataset("cifar10-sample", "train", transform=eval_transform(32))
    x, y = ds[5]
    assert isinstance(x, torch.Tensor) and x.shape == (3, 32, 32) and isinstance(y, int)


@pytest.mark.parametrize("fraction,per_class", [(0.05, 2), (0.1, 3), (0.3, 9), (0.5, 15), (1.0, 30)])
def test_subset_sizes(cifar_sample, fraction, per_class):
    sub = class_balanced_subset(cifar_sample, fraction, seed=0)
    # 30 images per class: round(30 * fraction) per class, half rounded up (0.05 * 30 = 1.5 -> 2)
    assert np.bincount(sub.targets, minlength=10).tolist() == [per_class] * 10
    assert sub.targets == [cifar_sample.targets[i] for i in sub.indices]


def test_subsets_nested_and_deterministic(cifar_sample):
    fracs = [0.05, 0.1, 0.3, 0.5, 1.0]
    subsets = [set(class_balanced_subset(cifar_sample, f, seed=3).indices) for f in fracs]
    for small, big in zip(subsets, subsets[1:]):
        assert small < big
    assert class_balanced_subset(cifar_sample, 0.3, seed=3).indices == class_balanced_subset(cifar_sample, 0.3, seed=3).indices
    assert class_balanced_subset(cifar_sample, 0.3, seed=4).indices != class_balanced_subset(cifar_sample, 0.3, seed=3).indices
    by_count = class_balanced_subset(cifar_sample, per_class=9, seed=3)
    assert set(by_count.indices) == subsets[2]  # 9 per class == 30 %


def test_subset_bad_arguments(cifar_sample):
    with pytest.raises(ValueError, match="fraction must be in"):
        class_balanced_subset(cifar_sample, 0.0)
    with pytest.raises(ValueError, match="exactly one"):
        class_balanced_subset(cifar_sample)
    with pytest.raises(ValueError, match="cannot take 31"):
        class_balanced_subset(cifar_sample, per_class=31)


def test_unknown_dataset_and_split():
    with pytest.raises(ValueError, match="valid names"):
        get_dataset("imagenet21k", "train")
    with pytest.raises(ValueError, match="valid splits"):
        get_dataset("tiny-imagenet-sample", "test")


def test_missing_dataset_names_every_place(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNREPRO_DATA", str(tmp_path / "nowhere"))
    monkeypatch.setattr(data, "data_roots", lambda root=None: [tmp_path / "a", tmp_path / "b"])
    with pytest.raises(DataNotFoundError) as e:
        get_dataset("tiny-imagenet", "train")
    msg = str(e.value)
    for root in ["a", "b"]:
        for name in ["tiny-imagenet-200", "tiny-imagenet-200.zip", "tiny-imagenet-200-s200.zip"]:
            assert str(tmp_path / root / name) in msg
    assert "tiny-imagenet-sample" in msg and "To get it" in msg


def test_corrupt_archive_is_refused(tmp_path, monkeypatch):
    bad = tmp_path / "cifar10-jpg.tar.gz"
    bad.write_bytes(b"\x1f\x8b garbage")
    with pytest.raises(ChecksumError, match="corrupt"):
        verify_archive(bad)
    monkeypatch.setenv("ATTNREPRO_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(data, "data_roots", lambda root=None: [tmp_path])
    with pytest.raises(ChecksumError):
        get_dataset("cifar10", "train")
    assert not list((tmp_path / "cache" / "decoded").glob("cifar10-*"))  # nothing half-decoded left


def test_corrupt_archive_without_pinned_hash_names_path_and_fix(tmp_path, monkeypatch):
    """An archive whose name has no pinned sha256 (the official tiny-imagenet-200.zip) but that does not open: the
    error names the file and how to get a good one, and `attnrepro datasets` reports it as corrupt, not found."""
    bad = tmp_path / "tiny-imagenet-200.zip"
    bad.write_bytes(b"PK\x03\x04 truncated")
    monkeypatch.setenv("ATTNREPRO_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(data, "data_roots", lambda root=None: [tmp_path])
    with pytest.raises(ChecksumError, match="tiny-imagenet-200.zip could not be read") as e:
        get_dataset("tiny-imagenet", "val")
    assert "BadZipFile" in str(e.value) and "fresh copy" in str(e.value) and "tiny-imagenet-200-s200.zip" in str(e.value)
    assert data.list_datasets()["tiny-imagenet"]["found"] == f"CORRUPT: {bad}"


def test_decode_once_into_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNREPRO_CACHE", str(tmp_path / "cache"))
    ds = get_dataset("cifar10-sample", "test")
    decoded = list((tmp_path / "cache" / "decoded").glob("cifar10-sample-*"))
    assert len(decoded) == 1 and (decoded[0] / "meta.json").exists()
    stamp = (decoded[0] / "test_images.npy").stat().st_mtime_ns
    ds2 = get_dataset("cifar10-sample", "test")
    assert (decoded[0] / "test_images.npy").stat().st_mtime_ns == stamp
    assert np.array_equal(np.asarray(ds.images), np.asarray(ds2.images))


def test_digits():
    tr, te = get_dataset("digits", "train"), get_dataset("digits", "test")
    assert len(tr) + len(te) == 1797 and tr[0][0].size == (8, 8)


@pytest.mark.parametrize("preset", ["none", "weak", "strong"])
@pytest.mark.parametrize("size", [32, 64, 224])
def test_transform_presets(preset, size):
    img = get_dataset("tiny-imagenet-sample", "val")[0][0]
    x = train_transform(preset, size)(img)
    assert x.shape == (3, size, size) and torch.isfinite(x).all()
    with pytest.raises(ValueError, match="valid"):
        train_transform("medium", size)


def test_full_offline_data(shared_data):
    tiny_val = get_dataset("tiny-imagenet", "val")
    assert len(tiny_val) == 10000 and len(tiny_val.classes) == 200 and len(tiny_val.boxes) == 10000
    b = np.concatenate(tiny_val.boxes + get_dataset("tiny-imagenet", "train").boxes)
    # every box is usable by max_box_acc / boxes_to_mask: non-empty, exclusive ends within the 64 px image
    # (the files hold degenerate one-pixel-high boxes such as 31 0 38 0, i.e. x 31..38, row 0)
    assert (b[:, 2] > b[:, 0]).all() and (b[:, 3] > b[:, 1]).all() and (b[:, :2] >= 0).all() and (b[:, 2:] <= 64).all()
    tiny_train = get_dataset("tiny-imagenet", "train")
    assert len(tiny_train) == 40000 and np.bincount(tiny_train.targets).tolist() == [200] * 200
    assert tiny_train.classes == tiny_val.classes
    c = get_dataset("cifar10", "test")
    assert len(c) == 10000 and np.bincount(c.targets).tolist() == [1000] * 10
    s = get_dataset("imagenet-samples", "val")
    assert len(s) == 100 and s.targets[:3] == [0, 10, 20]
    assert s[0][0].mode == "RGB"


def test_eval_frame_boxes_follow_the_eval_crop():
    "Boxes mapped into eval_transform's frame match a white box rendered and cropped by eval_view, within a pixel."
    from PIL import Image
    from attnrepro.data import eval_frame_boxes, eval_view
    box = [50, 100, 400, 300]
    for (w, h), img_size in (((500, 375), 224), ((375, 500), 224), ((80, 64), 64), ((500, 375), 32)):
        img = np.zeros((h, w, 3), np.uint8)
        x0, y0, x1, y1 = [round(v * s) for v, s in zip(box, (w / 500, h / 500, w / 500, h / 500))]
        img[y0:y1, x0:x1] = 255
        seen = np.asarray(eval_view(img_size)(Image.fromarray(img)))[..., 0] > 127
        assert seen.shape == (img_size, img_size)
        ys, xs = np.nonzero(seen)
        got = eval_frame_boxes([[x0, y0, x1, y1]], (w, h), img_size)
        assert got.shape == (1, 4)
        np.testing.assert_allclose(got[0], [xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], atol=1.0)
    # an image already square at img_size: the identity; a box the crop removes: dropped
    np.testing.assert_array_equal(eval_frame_boxes([[3, 4, 60, 50]], (64, 64), 64), [[3, 4, 60, 50]])
    assert eval_frame_boxes([[0, 0, 20, 20]], (500, 375), 224).shape == (0, 4)


def test_eval_frame_boxes_in_pixels_keep_every_box():
    "pixels=True: integer boxes equal to the rounded float ones; a box the crop removes keeps one edge pixel."
    from attnrepro.data import eval_frame_boxes
    boxes = [[50, 100, 400, 300], [10, 20, 130, 375]]
    f = eval_frame_boxes(boxes, (500, 375), 224)
    p = eval_frame_boxes(boxes, (500, 375), 224, pixels=True)
    assert p.dtype == np.int64 and np.array_equal(p, np.round(f).astype(np.int64))
    # resize 375 -> 256 (x 0.6827), crop offsets (42, 16): [0, 0, 20, 20] lands at x -42..-28, y -16..-2, cut off
    cut = eval_frame_boxes([[0, 0, 20, 20]], (500, 375), 224, pixels=True)
    assert cut.tolist() == [[0, 0, 1, 1]]
    wide = eval_frame_boxes([[0, 0, 500, 375]], (500, 375), 224, pixels=True)
    assert wide.tolist() == [[0, 0, 224, 224]]


def test_denormalize_inverts_the_eval_normalisation():
    "Figures show images back in [0, 1]: the inverse of Normalize(IMAGENET_MEAN, IMAGENET_STD), clamped."
    import torch
    from torchvision.transforms import Normalize
    from attnrepro.data import IMAGENET_MEAN, IMAGENET_STD, denormalize
    x = torch.rand(2, 3, 4, 4)
    torch.testing.assert_close(denormalize(Normalize(IMAGENET_MEAN, IMAGENET_STD)(x)), x)
    assert denormalize(torch.full((3, 2, 2), 100.0)).max() == 1.0


def test_tiny_imagenet_32_is_derived_from_the_64_px_images(tmp_path):
    """The gpu profile's Tiny-ImageNet teachers read a 32-px copy (`tiny-imagenet-32`, small enough for a GPU window's
    carry), made here from the 64-px images: same classes and order, each image the bicubic 32-px resize up to JPEG."""
    import numpy as np
    from PIL import Image
    from attnrepro.data import DATASETS, _decode_tiny32_tar, derive_tiny_imagenet_32
    out = derive_tiny_imagenet_32(tmp_path, source="tiny-imagenet-sample")
    assert out == tmp_path / "tiny-imagenet-32.tar.gz" and derive_tiny_imagenet_32(tmp_path) == out   # kept, not redone
    decoded = _decode_tiny32_tar(out)
    for split in ("train", "val"):
        src = get_dataset("tiny-imagenet-sample", split)
        images, targets, extra = decoded[split]
        assert images.shape == (len(src), 32, 32, 3) and images.dtype == np.uint8
        assert list(targets) == src.targets and extra["classes"] == src.classes
        want = np.stack([np.asarray(Image.fromarray(np.asarray(src.images[i])).resize((32, 32), Image.BICUBIC))
                         for i in range(len(src))]).astype(float)
        assert np.abs(images.astype(float) - want).mean() < 10.0   # JPEG q75, chroma subsampled: ~7 (another image: ~60)
        # boxes (exclusive ends) halved, rounded outward: each 32-px box covers its 64-px box
        for b64, b32 in zip(src.boxes, extra["boxes"]):
            x0, y0, x1, y1 = np.asarray(b64).reshape(-1, 4)[0]
            assert b32 == [[x0 // 2, y0 // 2, -(-x1 // 2), -(-y1 // 2)]]
    spec = DATASETS["tiny-imagenet-32"]
    assert spec.derive is not None and spec.splits == ("train", "val") and not spec.inclusive_boxes
