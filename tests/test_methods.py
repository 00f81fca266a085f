"""The method registry: every registered method builds on a tiny timm ViT, trains a few steps with finite, named loss
terms, and resumes exactly after a kill (same final weights bit for bit, same history)."""
import pytest
import torch

from attnrepro.data import IMAGENET_MEAN, IMAGENET_STD
from attnrepro.methods import create_method, list_methods, method_info
from attnrepro.models import cifar_resnet, create_student
from attnrepro.train import CKPT_NAME, TrainConfig, fit, load_checkpoint

EPOCHS, N, BATCH = 2, 24, 8   # 3 steps per epoch, 6 in all


class Killed(Exception):
    "Raised from a hook to stop a run the way a kill would: after a checkpoint, before the next."


def build(name: str, seed: int = 0):
    "A tiny student of the method's architecture and a tiny frozen teacher of the kind it needs (seeded)."
    info = method_info(name)
    torch.manual_seed(seed)
    depth = 3 if info.student == "pit" else 2
    student = create_student(info.student, img_size=32, patch_size=8, embed_dim=32, depth=depth, num_heads=2,
                             num_classes=10 if info.head else 0)
    teacher = None
    if info.teacher == "cnn":
        teacher = cifar_resnet(20)
    elif info.teacher == "vit":
        teacher = create_student("vit", img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=0)
    opts = {}
    if "teacher_mean" in info.options: opts.update(teacher_mean=IMAGENET_MEAN, teacher_std=IMAGENET_STD)
    if "epochs" in info.options: opts["epochs"] = EPOCHS
    if "compress_queue" in info.options: opts["compress_queue"] = 16
    if "n_iter" in info.options: opts["n_iter"] = 5
    model, method = create_method(name, student, teacher, **opts)
    return model, method


def data():
    g = torch.Generator().manual_seed(1)
    return torch.utils.data.TensorDataset(torch.rand(N, 3, 32, 32, generator=g), torch.randint(0, 10, (N,), generator=g))


def train(name: str, ckpt_dir, kill_at: int | None = None):
    model, method = build(name)
    after, done = method.after_step, [0]
    def after_step(ctx):   # counts the steps this process takes; raises at `kill_at`
        after(ctx)
        done[0] += 1
        if done[0] == kill_at: raise Killed()
    method.after_step = after_step
    cfg = TrainConfig(**{**dict(epochs=EPOCHS, batch_size=BATCH, lr=1e-3, warmup_epochs=0, seed=3), **method.train_overrides})
    res = fit(model, data(), None, cfg, method=method, ckpt_dir=ckpt_dir, progress=False, ckpt_interval_s=0)
    res["steps_this_process"] = done[0]
    return model, method, res


def test_registry_lists_every_paper():
    names = list_methods()
    assert len(names) == len(set(names)) >= 20
    assert {method_info(n).paper for n in names} == {"baseline", "aal", "attention_transfer", "attndistill",
                                                     "bootstrapping_vit", "gta"}
    assert list_methods("aal") == ["aal", "pit_aal", "deit_hard", "deit_soft"]


@pytest.mark.parametrize("name", list_methods())
def test_method_trains_and_resumes_exactly(name, tmp_path):
    model, method, res = train(name, tmp_path / "a")
    hist = res["history"]
    assert res["steps"] == EPOCHS * N // BATCH and len(hist) == EPOCHS
    terms = [t.name for t in method.terms]
    assert terms and all(f"loss_{t}" in hist[-1] for t in terms), (terms, sorted(hist[-1]))
    losses = [row[k] for row in hist for k in row if k.startswith("loss")]
    assert losses and all(torch.isfinite(torch.tensor(v)) for v in losses)
    # a run killed inside its second epoch, resumed in fresh objects, ends exactly where the uninterrupted one did
    with pytest.raises(Killed):
        train(name, tmp_path / "b", kill_at=4)
    assert load_checkpoint(tmp_path / "b" / CKPT_NAME)["step"] == 3
    model_b, method_b, res_b = train(name, tmp_path / "b")
    assert res_b["steps_this_process"] == 3, "the resumed run did not start from the step-3 checkpoint"
    for key, v in model.state_dict().items():
        assert torch.equal(v, model_b.state_dict()[key]), f"{name}: {key} differs after resume"
    for mod, m in method.extra_modules.items():
        for key, v in m.state_dict().items():
            assert torch.equal(v, method_b.extra_modules[mod].state_dict()[key]), f"{name}: {mod}.{key} differs"
    strip = lambda h: [{k: v for k, v in row.items() if k != "epoch_time_s"} for row in h]
    assert strip(res_b["history"]) == strip(hist) and res["steps_this_process"] == 6


def test_readme_registry_example_runs():
    "The README's registry example runs as written."
    import re
    from attnrepro.core import project_root
    text = (project_root() / "README.md").read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "create_method" in b]
    assert len(blocks) == 1, "the README shows one registry example"
    torch.manual_seed(0)
    exec(compile(blocks[0], "README.md", "exec"), {})
