"The full-size datasets of the paper profile, on synthetic trees in their official layouts (offline, seconds)."
import tarfile

import numpy as np
import pytest
from PIL import Image
from scipy.io import savemat

from attnrepro import data
from attnrepro.data import DataNotFoundError, class_balanced_subset, eval_transform, get_dataset, list_datasets

WNIDS = ["n01440764", "n01443537", "n01484850"]
TORCHVISION_SETS = {"cifar100": "cifar-100-python", "stanford_cars": "stanford_cars",
                    "fgvc_aircraft": "fgvc-aircraft-2013b", "oxford_pet": "oxford-iiit-pet", "flowers102": "flowers-102"}


def jpeg(path, size=(24, 16), value=0):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, (value, 64, 128)).save(path)


@pytest.fixture
def roots(tmp_path, monkeypatch):
    "Data roots a (empty) and b (where the trees go); the cache in tmp_path; no download allowed."
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    monkeypatch.setattr(data, "data_roots", lambda root=None: [a, b])
    monkeypatch.setenv("ATTNREPRO_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("ATTNREPRO_DOWNLOAD", raising=False)
    return a, b


def imagenet_tree(root, name="imagenet", per_class=(4, 2)):
    for split, n in zip(["train", "val"], per_class):
        for c, w in enumerate(WNIDS):
            for k in range(n):
                jpeg(root / name / split / w / f"{w}_{k}.JPEG", value=10 * c + k)


def test_registry_names_the_paper_datasets():
    names = set(list_datasets())
    assert {"imagenet", "cub200", "stanford_dogs", *TORCHVISION_SETS} <= names
    assert data.DATASETS["fgvc_aircraft"].splits == ("train", "val", "trainval", "test")
    assert data.DATASETS["oxford_pet"].splits == ("trainval", "test")


@pytest.mark.parametrize("folder", ["imagenet", "ILSVRC2012"])
def test_imagenet_folder_loads_lazily_with_subsets(roots, folder):
    imagenet_tree(roots[1], folder)
    train = get_dataset("imagenet", "train")
    assert isinstance(train, data.FileImageDataset) and str(train.source).endswith(folder)
    assert len(train) == 12 and train.classes == WNIDS
    assert np.bincount(train.targets).tolist() == [4, 4, 4]
    assert str(train.images[5]).endswith(f"train/{WNIDS[1]}/{WNIDS[1]}_1.JPEG") and train.targets[5] == 1
    img, y = train[5]
    assert img.size == (24, 16) and y == 1
    sub = class_balanced_subset(train, fraction=0.5, seed=0)
    assert np.bincount(sub.targets).tolist() == [2, 2, 2] and sub.classes == WNIDS
    assert set(sub.indices) < set(class_balanced_subset(train, fraction=0.75, seed=0).indices)
    val = get_dataset("imagenet", "val", transform=eval_transform(8))
    assert len(val) == 6 and val.targets == [0, 0, 1, 1, 2, 2] and tuple(val[0][0].shape) == (3, 8, 8)
    assert not (roots[1] / folder / "train" / ".cache").exists() and not any((roots[1].parent / "cache").rglob("*.npy"))


def test_imagenet_val_classes_follow_train(roots):
    "A val folder lacking a class keeps the train indices (the wnid, not its rank in val, decides the label)."
    imagenet_tree(roots[1])
    import shutil
    shutil.rmtree(roots[1] / "imagenet" / "val" / WNIDS[0])
    val = get_dataset("imagenet", "val")
    assert val.classes == WNIDS and val.targets == [1, 1, 2, 2]


def test_imagenet_flat_val_and_missing_split_say_the_layout(roots):
    imagenet_tree(roots[1])
    import shutil
    shutil.rmtree(roots[1] / "imagenet" / "val")
    with pytest.raises(DataNotFoundError, match=r"no val/ folder.*val/<wnid>/\*\.JPEG.*image-net\.org"):
        get_dataset("imagenet", "val")
    jpeg(roots[1] / "imagenet" / "val" / "ILSVRC2012_val_00000001.JPEG")
    with pytest.raises(DataNotFoundError, match=r"holds images directly.*extract_ILSVRC"):
        get_dataset("imagenet", "val")


def test_imagenet_missing_names_roots_layout_and_source(roots):
    with pytest.raises(DataNotFoundError) as e:
        get_dataset("imagenet", "train")
    msg = str(e.value)
    for r in roots:
        assert str(r / "imagenet") in msg and str(r / "ILSVRC2012") in msg
    assert "train/<wnid>/*.JPEG" in msg and "image-net.org" in msg


def test_imagenet_subset_reads_its_own_folder_and_says_the_layout(roots, monkeypatch):
    "AttnDistill's ImageNet-Subset: the imagenet layout in its own folder; missing, the error names it; a dry run stands in."
    with pytest.raises(DataNotFoundError) as e:
        get_dataset("imagenet-subset", "train")
    assert str(roots[1] / "imagenet-subset") in str(e.value) and "100 classes" in str(e.value)
    with monkeypatch.context() as m:
        m.setenv("ATTNREPRO_DRY_RUN", "1")
        stand_in = get_dataset("imagenet-subset", "val")
    assert isinstance(stand_in, data.SyntheticImageDataset) and len(stand_in) == 5000 and len(stand_in.classes) == 100
    imagenet_tree(roots[1], "imagenet-subset")
    train = get_dataset("imagenet-subset", "train")
    assert len(train) == 12 and train.classes == WNIDS and str(train.source).endswith("imagenet-subset")


def cub_tree(root):
    "3 classes x 3 images, image 3 of each class in test; boxes x y w h (floats, as in the official file)."
    top = root / "CUB_200_2011"
    classes = ["001.Black_footed_Albatross", "002.Laysan_Albatross", "003.Sooty_Albatross"]
    images, labels, split, boxes = [], [], [], []
    for c, name in enumerate(classes):
        for k in range(3):
            i = 3 * c + k + 1
            rel = f"{name}/{name.split('.')[1]}_{k:04d}_{i}.jpg"
            jpeg(top / "images" / rel, size=(40, 30), value=i)
            images.append(f"{i} {rel}"), labels.append(f"{i} {c + 1}"), split.append(f"{i} {int(k < 2)}")
            boxes.append(f"{i} {float(k)} {float(c)} 20.0 10.0")
    for fname, rows in [("classes.txt", [f"{c + 1} {n}" for c, n in enumerate(classes)]), ("images.txt", images),
                        ("image_class_labels.txt", labels), ("train_test_split.txt", split),
                        ("bounding_boxes.txt", boxes)]:
        (top / fname).write_text("\n".join(rows) + "\n")
    return top, classes


def check_cub(classes):
    train, test = get_dataset("cub200", "train"), get_dataset("cub200", "test")
    assert (len(train), len(test)) == (6, 3) and train.classes == classes
    assert train.targets == [0, 0, 1, 1, 2, 2] and test.targets == [0, 1, 2]
    # image 5 = class 1 (c=1), k=1: box x=1, y=1, w=20, h=10 -> (1, 1, 21, 11), ends exclusive
    assert train.boxes[3].tolist() == [[1, 1, 21, 11]] and test.boxes[2].tolist() == [[2, 2, 22, 12]]
    assert train[3][0].size == (40, 30) and train[3][1] == 1
    sub = class_balanced_subset(train, fraction=0.5, seed=1)
    assert np.bincount(sub.targets).tolist() == [1, 1, 1]
    assert sub.boxes == [train.boxes[i] for i in sub.indices]


def test_cub_folder(roots):
    _, classes = cub_tree(roots[1])
    check_cub(classes)


def test_cub_archive_unpacked_once_into_the_cache(roots, tmp_path):
    top, classes = cub_tree(tmp_path / "src")
    with tarfile.open(roots[1] / "CUB_200_2011.tgz", "w:gz") as tf:
        tf.add(top, arcname="CUB_200_2011")
    check_cub(classes)
    assert str(get_dataset("cub200", "train").source).startswith(str(tmp_path / "cache" / "extracted"))
    assert [p.name for p in roots[1].iterdir()] == ["CUB_200_2011.tgz"]  # nothing written into the data root


def test_cub_incomplete_folder_names_the_missing_files(roots):
    top, _ = cub_tree(roots[1])
    (top / "train_test_split.txt").unlink()
    with pytest.raises(DataNotFoundError, match=r"lacks \['train_test_split.txt'\].*image_class_labels.txt.*caltech"):
        get_dataset("cub200", "train")


def dogs_tree(root, lists_folder=True):
    breeds = ["n02085620-Chihuahua", "n02085782-Japanese_spaniel", "n02085936-Maltese_dog"]
    top = root / "stanford_dogs"
    split_files = {"train": [], "test": []}
    for c, b in enumerate(breeds):
        for k in range(3):
            stem = f"{b.split('-')[0]}_{100 + k}"
            jpeg(top / "Images" / b / f"{stem}.jpg", size=(50, 40), value=c)
            (top / "Annotation" / b).mkdir(parents=True, exist_ok=True)
            (top / "Annotation" / b / stem).write_text(
                f"<annotation><filename>{stem}</filename><object><name>{b}</name><bndbox><xmin>{k}</xmin>"
                f"<ymin>{c}</ymin><xmax>{30 + k}</xmax><ymax>{20 + c}</ymax></bndbox></object></annotation>")
            split_files["train" if k < 2 else "test"].append((f"{b}/{stem}.jpg", c + 1))
    lists = top / "lists" if lists_folder else top
    lists.mkdir(exist_ok=True)
    for split, rows in split_files.items():
        savemat(lists / f"{split}_list.mat", {
            "file_list": np.array([f for f, _ in rows], dtype=object).reshape(-1, 1),
            "annotation_list": np.array([f.rsplit(".", 1)[0] for f, _ in rows], dtype=object).reshape(-1, 1),
            "labels": np.array([[l] for _, l in rows], dtype=np.float64)})
    return top, breeds


@pytest.mark.parametrize("lists_folder", [True, False])
def test_stanford_dogs(roots, lists_folder):
    _, breeds = dogs_tree(roots[1], lists_folder)
    train, test = get_dataset("stanford_dogs", "train"), get_dataset("stanford_dogs", "test")
    assert (len(train), len(test)) == (6, 3) and train.classes == breeds
    assert train.targets == [0, 0, 1, 1, 2, 2] and test.targets == [0, 1, 2]
    assert train.boxes[3].tolist() == [[1, 1, 31, 21]] and test.boxes[-1].tolist() == [[2, 2, 32, 22]]
    assert len(train.boxes) == 6 and train[3][0].size == (50, 40)
    sub = class_balanced_subset(train, fraction=0.5, seed=0)
    assert np.bincount(sub.targets).tolist() == [1, 1, 1]
    assert [b.tolist() for b in sub.boxes] == [train.boxes[i].tolist() for i in sub.indices]


def test_stanford_dogs_missing_lists_and_labels_that_disagree(roots):
    top, _ = dogs_tree(roots[1])
    (top / "lists" / "test_list.mat").unlink()
    with pytest.raises(DataNotFoundError, match=r"lacks test_list.mat.*Annotation/.*vision.stanford.edu"):
        get_dataset("stanford_dogs", "test")
    savemat(top / "lists" / "test_list.mat", {"file_list": np.array(["n02085620-Chihuahua/n02085620_102.jpg"], dtype=object),
                                              "labels": np.array([2.0])})
    with pytest.raises(DataNotFoundError, match="breed other than"):
        get_dataset("stanford_dogs", "test")


@pytest.mark.parametrize("name", sorted(TORCHVISION_SETS))
def test_torchvision_sets_not_found_name_folder_and_source(roots, name):
    with pytest.raises(DataNotFoundError) as e:
        get_dataset(name, data.DATASETS[name].splits[0], download=False)
    msg = str(e.value)
    assert str(roots[1] / TORCHVISION_SETS[name]) in msg and "Expected layout" in msg and "To get it" in msg


def test_torchvision_folder_that_torchvision_cannot_read(roots):
    (roots[1] / "oxford-iiit-pet").mkdir()
    with pytest.raises(DataNotFoundError, match=r"OxfordIIITPet cannot read it.*annotations/\{trainval,test\}.txt"):
        get_dataset("oxford_pet", "test")


def test_fgvc_aircraft_through_torchvision(roots):
    "A small tree in torchvision's FGVCAircraft layout loads through torchvision's own class (no download)."
    top = roots[1] / "fgvc-aircraft-2013b" / "data"
    variants = ["707-320", "A300B4"]
    (top / "images").mkdir(parents=True)
    (top / "variants.txt").write_text("\n".join(variants) + "\n")
    for split, ids in [("train", ["0001", "0002", "0003", "0004"]), ("test", ["0005", "0006"])]:
        rows = [f"{i} {variants[k % 2]}" for k, i in enumerate(ids)]
        (top / f"images_variant_{split}.txt").write_text("\n".join(rows) + "\n")
        for i in ids: jpeg(top / "images" / f"{i}.jpg")
    train = get_dataset("fgvc_aircraft", "train")
    assert isinstance(train, data.FileImageDataset) and train.classes == variants
    assert train.targets == [0, 1, 0, 1] and train[1][1] == 1 and train[1][0].size == (24, 16)
    assert len(class_balanced_subset(train, fraction=0.5, seed=0)) == 2
