"""The method registry: every registered method (and registered composition) builds on a tiny timm ViT, trains a few
steps with finite, named loss terms, and resumes exactly after a kill (same final weights bit for bit, same history).
Compositions: their loss is the sum of their parts' weighted terms, a shared teacher runs once per step (and only as
far as some term needs), incompatible parts are refused."""
import math

import pytest
import torch
from torch import nn

from attnrepro.data import IMAGENET_MEAN, IMAGENET_STD
from attnrepro.methods import create_method, list_methods, method_info
from attnrepro.models import cifar_resnet, create_student
from attnrepro.train import CKPT_NAME, TrainConfig, fit, load_checkpoint
from attnrepro.protocol import ComposedMethod, StepContext

EPOCHS, N, BATCH = 2, 24, 8   # 3 steps per epoch, 6 in all


class Killed(Exception):
    "Raised from a hook to stop a run the way a kill would: after a checkpoint, before the next."


def build(name: str, seed: int = 0, **options):
    "A tiny student of the method's architecture and a tiny frozen teacher of the kind it needs (seeded)."
    model, method, _ = build_with_teacher(name, seed, **options)
    return model, method


def build_with_teacher(name: str, seed: int = 0, **options):
    info = method_info(name)
    torch.manual_seed(seed)
    depth = 3 if info.student == "pit" else 2
    student = create_student("vit" if info.student == "any" else info.student, img_size=32, patch_size=8, embed_dim=32, depth=depth, num_heads=2,
                             num_classes=10 if info.head else 0)
    teacher = None
    if info.teacher == "cnn":
        teacher = cifar_resnet(20)
    elif info.teacher == "vit":
        teacher = create_student("vit", img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2,
                                 num_classes=10 if info.teacher_classifies else 0)
    opts = {}
    if "teacher_mean" in info.options: opts.update(teacher_mean=IMAGENET_MEAN, teacher_std=IMAGENET_STD)
    if "epochs" in info.options: opts["epochs"] = EPOCHS
    if "compress_queue" in info.options: opts["compress_queue"] = 16
    if "n_iter" in info.options: opts["n_iter"] = 5
    model, method = create_method(name, student, teacher, **{**opts, **options})
    return model, method, teacher


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
                                                     "bootstrapping_vit", "gta", "composition"}
    assert list_methods("aal") == ["aal", "pit_aal", "deit_hard", "deit_soft"]
    # the combinations the head-to-head comparison (issue 27) needs
    assert list_methods("composition") == ["gta+attn_distill", "aal+deit_hard", "attn_distill+kd"]


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


def test_readme_examples_run():
    """Every Python example of the README and docs/ runs as written: among them the README's method on a timm ViT, and
    docs/library.md's registry and composition examples."""
    import re
    from attnrepro.core import project_root
    root = project_root()
    pages = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    blocks = [(p.name, b) for p in pages for b in re.findall(r"```python\n(.*?)```", p.read_text(), re.S)]
    readme = [b for name, b in blocks if name == "README.md"]
    assert any("create_method" in b and "timm.create_model" in b for b in readme), "the README applies a method to a timm ViT"
    assert any('"gta+attn_distill"' in b for _, b in blocks), "docs/ show a composition example"
    for name, b in blocks:
        torch.manual_seed(0)
        exec(compile(b, name, "exec"), {})


# --- compositions ---------------------------------------------------------------------------------------------------
COMPOSITIONS = list_methods("composition")


def batch(n: int = 8):
    g = torch.Generator().manual_seed(5)
    return torch.rand(n, 3, 32, 32, generator=g), torch.randint(0, 10, (n,), generator=g)


def step_losses(method, model, x, y) -> dict[str, float]:
    "Each term of `method` on one step's hooks over (x, y), as `fit` computes it (train mode, no update)."
    model.train()
    for m in method.extra_modules.values(): m.train()
    cfg = TrainConfig(epochs=1, batch_size=len(x), warmup_epochs=0)
    ctx = StepContext(model=model, train_model=model, modules=method.extra_modules, method=method, cfg=cfg,
                      device=torch.device("cpu"), state=method.state, epoch=0, step=0, it=0, micro=0, n_micro=1,
                      x=x, y=y, target=y, batch=(x, y), out=None, logits=None,
                      weights={t.name: t.weight_at(0) for t in method.terms})
    torch.manual_seed(0)
    method.before_forward(ctx)
    method.forward(ctx)
    return {t.name: float(t.fn(ctx).detach()) for t in method.terms}


@pytest.mark.parametrize("name", COMPOSITIONS)
def test_composed_loss_is_the_sum_of_its_parts(name):
    "Golden: on one batch, each composed term equals that term of its part run alone, and the total is their weighted sum."
    model, method = build(name)
    x, y = batch()
    info = method_info(name)
    assert isinstance(method, ComposedMethod) and list(method.parts) == list(info.parts)
    got = step_losses(method, model, x, y)
    total = sum(t.weight_at(0) * got[t.name] for t in method.terms)
    expected, ce = 0.0, None
    for part_name, part in method.parts.items():
        alone = step_losses(part, model, x, y)   # the part's own hooks: its own teacher forward and student forward
        for t in part.terms:
            if t.name == "ce":   # one shared CE term, with the composition's weight
                ce = alone["ce"]
                continue
            # the same computation (the shared teacher forward carries the part's own captures): bit for bit
            assert got[t.name] == alone[t.name], (part_name, t.name, got[t.name], alone[t.name])
            expected += t.weight_at(0) * alone[t.name]
    assert ce is not None and got["ce"] == ce
    expected += method.terms[0].weight_at(0) * ce
    assert method.terms[0].name == "ce" and math.isclose(total, expected, rel_tol=1e-6), (total, expected)
    if "ce_weight" in info.defaults:
        assert method.terms[0].weight == info.defaults["ce_weight"]


def test_composition_equals_the_single_methods():
    "gta+attn_distill's terms equal those of create_method('gta') and create_method('attn_distill') on the same batch."
    model, method, teacher = build_with_teacher("gta+attn_distill", gta__coef=0.5, attn_distill__layers=[1])
    x, y = batch()
    got = step_losses(method, model, x, y)
    _, gta = create_method("gta", model, teacher, coef=0.5)
    _, distill = create_method("attn_distill", model, teacher, layers=[1])
    singles = {**step_losses(gta, model, x, y), **step_losses(distill, model, x, y)}
    assert got.keys() == singles.keys() == {"ce", "gta", "attn_distill"}
    for k in got:
        assert math.isclose(got[k], singles[k], rel_tol=1e-6), (k, got[k], singles[k])
    assert [t.weight for t in method.terms] == [1.0, 0.5, 3.0]


def _count_calls(module: nn.Module) -> list:
    calls = []
    module.register_forward_hook(lambda *a: calls.append(1))
    return calls


@pytest.mark.parametrize("name", COMPOSITIONS)
def test_shared_teacher_runs_once_per_step(name, tmp_path):
    "Both parts read the teacher; it runs once per step (each part alone runs it once: twice without sharing)."
    model, method, teacher = build_with_teacher(name)
    calls = _count_calls(teacher.patch_embed if method_info(name).teacher == "vit" else teacher)
    x, y = batch()
    for part in method.parts.values():   # alone, every part runs its own teacher forward
        step_losses(part, model, x, y)
    assert len(calls) == len(method.parts) == 2
    calls.clear()
    cfg = TrainConfig(**{**dict(epochs=1, batch_size=BATCH, lr=1e-3, warmup_epochs=0, seed=3), **method.train_overrides})
    res = fit(model, data(), None, cfg, method=method, progress=False)
    assert res["steps"] == N // BATCH and len(calls) == res["steps"]


def test_shared_teacher_stops_at_the_last_needed_block():
    "Terms that read block 0 only: the teacher's block 1 never runs; KD needs the logits: the full forward, once."
    model, method, teacher = build_with_teacher("gta+attn_distill", layers=[0])   # a bare option: both parts
    assert method.parts["gta"].term_layers == {"gta": [0]}
    b0, b1 = _count_calls(teacher.blocks[0]), _count_calls(teacher.blocks[1])
    step_losses(method, model, *batch())
    assert (len(b0), len(b1)) == (1, 0)
    model, method, teacher = build_with_teacher("attn_distill+kd", attn_distill__layers=[0])
    b0, b1, head = _count_calls(teacher.blocks[0]), _count_calls(teacher.blocks[1]), _count_calls(teacher.head)
    step_losses(method, model, *batch())
    assert (len(b0), len(b1), len(head)) == (1, 1, 1)


def test_drop_path_sharing_is_a_different_teacher_forward():
    """With stochastic depth, attention distillation runs the teacher with the student's drop-path masks and GTA its
    source in eval mode: two different forwards, so two per step; without mask sharing, one."""
    def teacher_calls(**options) -> int:
        torch.manual_seed(0)
        vit = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2)
        student, teacher = create_student("vit", **vit, num_classes=10, drop_path_rate=0.2), create_student("vit", **vit)
        model, method = create_method("gta+attn_distill", student, teacher, **options)
        calls = _count_calls(teacher.patch_embed)
        step_losses(method, model, *batch())
        return len(calls)
    assert teacher_calls() == 2 and teacher_calls(attn_distill__shared_drop_path=False) == 1


def test_composition_options_route_to_their_part():
    info = method_info("attn_distill+kd")
    assert info.defaults == {"ce_weight": 0.5} and info.teacher == "vit" and info.teacher_classifies
    assert {"ce_weight", "T", "kd__T", "attn_distill__weight"} <= set(info.options)
    _, method = build("attn_distill+kd", kd__T=2.0, weight=1.5, ce_weight=0.25)
    kd, distill = method.parts["kd"], method.parts["attn_distill"]
    assert [(t.name, t.weight) for t in method.terms] == [("ce", 0.25), ("attn_distill", 1.5), ("kd", 0.5)]
    assert kd.terms[1].weight == 0.5 and distill.distill[0].weight == 1.5
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['kd__lam'\]; valid: \['ce_weight'"):
        build("attn_distill+kd", kd__lam=1.0)


def test_composition_errors():
    vit = lambda: create_student("vit", img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=10)
    src = create_student("vit", img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=0)
    with pytest.raises(ValueError, match=r"unknown part 'gtaa'; did you mean \['gta'"):
        create_method("gtaa+attn_distill", vit(), teacher=src)
    with pytest.raises(ValueError, match="names a method twice"):
        method_info("gta+gta")
    # two parts that change the student's computation: refused before anything is built
    with pytest.raises(ValueError, match="'attn_copy' and 'sparse' both change the student's own computation"):
        create_method("attn_copy+sparse", vit(), teacher=src)
    # Attention Copy wraps the student; GTA's captures would read a student that is not the one computing
    with pytest.raises(ValueError, match="'gta' reads the student's attention or features in its forward, and "
                                         "'attn_copy' changes"):
        create_method("attn_copy+gta", vit(), teacher=src)
    with pytest.raises(ValueError, match="'bootstrap_shared' and 'sam' both override backward"):
        create_method("bootstrap_shared+sam", vit(), epochs=2)
    with pytest.raises(ValueError, match="part 'sam' overrides backward in a way that does not compose"):
        create_method("sam+attn_distill", vit(), teacher=src)
    with pytest.raises(ValueError, match="the forward of 'bootstrap_joint' does more than capture"):
        create_method("bootstrap_joint+gta", vit(), teacher=src, epochs=2)
    with pytest.raises(ValueError, match=r"different weights \(gta: 1.0, attn_distill: 2.0\).*ce_weight="):
        create_method("gta+attn_distill", vit(), teacher=src, attn_distill__ce_weight=2.0)
    with pytest.raises(ValueError, match=r"parts 'a' and 'b' both have a loss term named 'gta'"):
        ComposedMethod({"a": create_method("gta", vit(), teacher=src)[1], "b": create_method("gta", vit(), teacher=src)[1]})
    with pytest.raises(ValueError, match=r"a teacher dict must name exactly the parts that need one, \['attn_distill'\]"):
        create_method("ce+attn_distill", vit(), teacher={"ce": src})


def test_official_code_options():
    """Issue #46's options (defaults unchanged; tests/test_parity.py checks their numbers against the official code):
    `end_layer` (attention transfer), `proj_layers=0` (AttnDistill --noproj), `down_sample_layers`, `pre_norm` and
    `align` (Bootstrapping ViTs); `method_info` lists them, bad values are refused by name."""
    for name, opts in (("attn_copy", {"end_layer"}), ("attn_distill", {"end_layer"}), ("q_distill", {"end_layer"}),
                       ("attndistill", {"proj_layers"}),
                       ("bootstrap_shared", {"down_sample_layers", "pre_norm", "align"}),
                       ("bootstrap_joint", {"down_sample_layers", "pre_norm", "align"})):
        assert opts <= set(method_info(name).options) and not opts & set(method_info(name).defaults), name
    vit = lambda: create_student("vit", img_size=32, patch_size=8, embed_dim=32, depth=4, num_heads=2, num_classes=10)
    src = create_student("vit", img_size=32, patch_size=8, embed_dim=32, depth=4, num_heads=2, num_classes=0)
    assert create_method("attn_copy", vit(), src, end_layer=-3)[0].layers == [0]
    assert create_method("attn_copy", vit(), src)[0].layers == [0, 1, 2, 3]
    _, m = create_method("attn_distill", vit(), src, end_layer=-1)
    assert m.distill[0].layers == (0, 1, 2)
    # the default is the paper's first 3/4 of the blocks (18 of 24); 'all' every block (Distill's None)
    assert create_method("attn_distill", vit(), src)[1].distill[0].layers == (0, 1, 2)
    assert create_method("attn_distill", vit(), src, layers="all")[1].distill[0].layers is None
    deep = create_student("vit", img_size=32, patch_size=8, embed_dim=32, depth=24, num_heads=2, num_classes=10)
    assert create_method("attn_distill", deep, create_student("vit", img_size=32, patch_size=8, embed_dim=32, depth=24,
                                                              num_heads=2, num_classes=0))[1].distill[0].layers == tuple(range(18))
    assert create_method("q_distill", vit(), src)[1].distill[0].layers is None   # Q: every block, as before
    for bad in ("first", "ALL"):
        with pytest.raises(ValueError, match=rf"layers={bad!r}: give block indices, 'all'"):
            create_method("attn_distill", vit(), src, layers=bad)
    for bad in (1, -4, 0.5, True, "-3"):
        with pytest.raises(ValueError, match=rf"end_layer={bad!r}: must be an int in -3..0"):
            create_method("attn_distill", vit(), src, end_layer=bad)
    with pytest.raises(ValueError, match="give layers or end_layer, not both"):
        create_method("attn_copy", vit(), src, layers=[0], end_layer=-1)
    _, m = build("attndistill", proj_layers=0)
    assert "projector" not in m.extra_modules and "projector" in build("attndistill")[1].extra_modules
    with pytest.raises(ValueError, match="proj_layers=0 .* use proj_layers >= 1"):
        create_method("attndistill", create_student("vit", img_size=32, patch_size=8, embed_dim=16, depth=2,
                                                    num_heads=2, num_classes=0), src, proj_layers=0)
    _, m = build("bootstrap_shared", down_sample_layers=[1], pre_norm=False, align=False)
    agent = m.extra_modules["agent"]
    assert agent.down_sample_layers == [1] and not agent.pre_norm and not any(b.pre_norm for b in agent.blocks)
    assert build("bootstrap_shared")[1].extra_modules["agent"].pre_norm
    with pytest.raises(ValueError, match="align=True needs a shared agent"):
        build("bootstrap_joint", align=True)
    with pytest.raises(ValueError, match="pre_norm='no'"):
        build("bootstrap_joint", pre_norm="no")
    with pytest.raises(TypeError, match="down_sample_layers=1; give a list"):
        build("bootstrap_joint", down_sample_layers=1)


def test_two_teachers_writing_one_step_state_are_refused():
    "AAL and KD with different CNN teachers both set ctx.teacher_logits: an error at the first step, not an overwrite."
    torch.manual_seed(0)
    student = create_student("vit", img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=10)
    model, method = create_method("aal+kd", student, teacher={"aal": cifar_resnet(20), "kd": cifar_resnet(20)},
                                  teacher_mean=IMAGENET_MEAN, teacher_std=IMAGENET_STD, epochs=2, ce_weight=1.0)
    with pytest.raises(ValueError, match="parts 'aal' and 'kd' both set ctx.teacher_logits, to different values"):
        step_losses(method, model, *batch())
    # one teacher for both: one forward, the same logits, no clash
    model, method = create_method("aal+kd", student, teacher=cifar_resnet(20), teacher_mean=IMAGENET_MEAN,
                                  teacher_std=IMAGENET_STD, epochs=2, ce_weight=1.0)
    assert set(step_losses(method, model, *batch())) == {"ce", "aal", "kd"}


class _FixedLogits(nn.Module):
    "A 'teacher' that predicts fixed logits, whatever the images."
    def __init__(self, logits: torch.Tensor):
        super().__init__()
        self.register_buffer("logits", logits)

    def forward(self, x): return self.logits[: len(x)]


def test_kd_term_matches_hintons_formula():
    """Golden value from Hinton et al.'s loss with the T^2 scaling: T^2 * mean_b sum_c p_t log(p_t / p_s), p = softmax(z/T).
    T = 2; row 0: teacher z/T = [ln 3, 0] -> p_t = [3/4, 1/4], student [0, 0] -> p_s = [1/2, 1/2],
    KL = 3/4 ln(3/2) + 1/4 ln(1/2) = 0.1308120; row 1: teacher p_t = [1/2, 1/2], student z/T = [1/2, -1/2] ->
    p_s = [s, 1 - s] with s = sigmoid(1), KL = 1/2 ln(1/(2s)) + 1/2 ln(1/(2(1-s))) = 0.1201145;
    loss = 4 * (0.1308120 + 0.1201145) / 2 = 0.5018531."""
    from attnrepro.aal import kd_method
    s = torch.tensor([[0.0, 0.0], [1.0, -1.0]], requires_grad=True)
    t = torch.tensor([[2 * math.log(3), 0.0], [0.0, 0.0]])
    method = kd_method(_FixedLogits(t), T=2.0, teacher_mean=IMAGENET_MEAN, teacher_std=IMAGENET_STD)
    assert [(term.name, term.weight) for term in method.terms] == [("ce", 0.5), ("kd", 0.5)]
    ctx = StepContext(x=torch.zeros(2, 3, 8, 8), y=torch.tensor([0, 1]))
    method.before_forward(ctx)
    ctx.logits, ctx.target, ctx.cfg = s, ctx.y, TrainConfig(epochs=1, warmup_epochs=0)
    kd = method.terms[1].fn(ctx)
    assert math.isclose(float(kd.detach()), 0.5018531, abs_tol=1e-6)
    kd.backward()
    assert s.grad is not None and torch.isfinite(s.grad).all()   # the student learns; the teacher's logits are fixed
    with pytest.raises(ValueError, match="must predict the student's classes"):
        ctx.logits = torch.zeros(2, 3)
        method.terms[1].fn(ctx)


def test_ce_trains_any_classifier():
    """`ce` (the papers' plain baselines, issue #46: every run through the registry) trains any classifier: a DeiT in
    distilled mode on its class head (its distillation head gets no term), a CNN, a ViT."""
    cfg = TrainConfig(epochs=1, batch_size=BATCH, lr=1e-3, warmup_epochs=0, seed=0)
    deit = create_student("deit", img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=10)
    deit.set_distilled_training(True)
    dist_head, cls_head = deit.head_dist.weight.detach().clone(), deit.head.weight.detach().clone()
    for student in (deit, cifar_resnet(20)):
        model, method = create_method("ce", student)
        assert model is student and method.name == "ce" and [t.name for t in method.terms] == ["ce"]
        res = fit(model, data(), data(), cfg, method=method, progress=False)
        assert res["steps"] == N // BATCH and math.isfinite(res["history"][-1]["loss_ce"])
    assert torch.equal(deit.head_dist.weight.detach().cpu(), dist_head)   # no term trains the distillation head
    assert not torch.equal(deit.head.weight.detach().cpu(), cls_head)   # the class head's CE does
    assert method_info("ce").student == "any" and {"cutmix", "gta_transmix"} <= set(list_methods("gta"))
