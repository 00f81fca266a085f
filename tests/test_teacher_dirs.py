"""Saved teachers live outside the package: search order, the committed ones, and fetching by URL with a pinned sha256."""
import json

import pytest
import torch

from attnrepro.core import project_root
from attnrepro.models import (CheckpointError, create_student, fetch_teacher, load_teacher, save_teacher, teacher_dirs,
                              teacher_names)


def test_committed_teachers_are_outside_the_package():
    names = teacher_names()
    assert {"mae_tiny_imagenet_mini", "dino_tiny_imagenet_mini", "supervised_tiny_imagenet_mini", "mae_cifar10_mini"} <= set(names)
    assert teacher_dirs()[0] == project_root() / "outputs" / "teachers" / "weights"
    assert not list((project_root() / "attnrepro").rglob("*.safetensors")), "weights must not ship in the package"


def test_env_folder_comes_first_and_url_fetch_checks_the_pin(tmp_path, monkeypatch):
    src = tmp_path / "served"
    m = create_student("vit", img_size=16, patch_size=8, embed_dim=16, depth=1, num_heads=2, num_classes=0)
    save_teacher(m, "tiny_served", dir=src)
    monkeypatch.setenv("ATTNREPRO_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("ATTNREPRO_TEACHERS", str(tmp_path / "mine"))
    assert teacher_dirs()[0] == tmp_path / "mine" and teacher_dirs()[-1] == tmp_path / "cache" / "teachers"
    with pytest.raises(ValueError, match="Unknown teacher 'tiny_served'"):
        load_teacher("tiny_served")
    monkeypatch.setenv("ATTNREPRO_TEACHER_URL", src.as_uri())   # file:// stands in for a web server
    t = load_teacher("tiny_served")
    assert (tmp_path / "cache" / "teachers" / "tiny_served.safetensors").is_file()
    assert torch.equal(t.state_dict()["cls_token"], m.state_dict()["cls_token"].half().float())
    bad = tmp_path / "bad"
    bad.mkdir()
    save_teacher(m, "tiny_bad", dir=bad)
    j = json.loads((bad / "tiny_bad.json").read_text())
    (bad / "tiny_bad.json").write_text(json.dumps(dict(j, sha256="0" * 64)))
    with pytest.raises(CheckpointError, match="refusing it"):
        fetch_teacher("tiny_bad", base_url=bad.as_uri())
