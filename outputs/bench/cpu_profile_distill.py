"""torch.profiler of plain vs attention-distillation training steps on the CPU, at `attnrepro bench`'s default config
(ViT 192/6/3 student and teacher, 64 px, patch 8, batch 64, fp32, all 6 blocks distilled), and of the teacher forward
alone (the floor's extra cost): which ops make distillation's time above its floor (issue #19; bench.md: 1.10x).
Writes outputs/bench/cpu_profile_distill.txt (raw tables) and .md (the summary the README shows). Run on an idle machine:
`OMP_NUM_THREADS=2 PYTHONPATH=. python outputs/bench/cpu_profile_distill.py [--note "what else ran"]`."""
import os, platform, subprocess, sys, time
from pathlib import Path
import torch
from torch.profiler import ProfilerActivity, profile
from attnrepro.bench import BenchConfig, build_bench, make_step, teacher_forward_step

STEPS, WARMUP = 10, 3
# ops that only the distillation loss and its capture run: the N x N logits (teacher's, and the student's recomputed
# in the loss's forward and backward), their softmaxes, and elementwise work on N x N tensors
LOSS_OPS = {"aten::bmm": "Q K^T products (teacher logits; student logits recomputed by the loss, forward and backward)",
            "aten::_softmax": "softmax of N x N logits", "aten::_log_softmax": "log-softmax of the student logits",
            "aten::copy_": "tensor copies (capture and loss)", "aten::mul": "elementwise products on N x N maps",
            "aten::sub_": "softmax(s) - softmax(t) in the loss's backward", "aten::matmul": "matmul dispatch",
            "_AttnDistillQK": "the loss's autograd function (own time)", "_AttnDistillQKBackward": "its backward (own time)"}

def profiled(fn, *args):
    for _ in range(WARMUP): fn(*args)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(STEPS): fn(*args)
    return prof

def main(out=Path("outputs/bench"), note: str = ""):
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", 2)))
    cfg = BenchConfig()
    student, teacher, opt, x, y = build_bench(cfg)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    if subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "attnrepro", __file__]).returncode: commit += "-dirty"   # code changed
    load0 = os.getloadavg()[0]
    profs = {v: profiled(make_step(v, student, teacher, opt, cfg.distill_layers), x, y) for v in ("plain", "distill")}
    profs["teacher"] = profiled(teacher_forward_step(teacher, cfg.depth), x)
    load1 = os.getloadavg()[0]
    ms = {k: {e.key: e.self_cpu_time_total / STEPS / 1e3 for e in p.key_averages()} for k, p in profs.items()}
    tot = {k: sum(v.values()) for k, v in ms.items()}
    floor = tot["plain"] + tot["teacher"]
    excess = {n: ms["distill"].get(n, 0) - ms["plain"].get(n, 0) - ms["teacher"].get(n, 0) for n in set().union(*ms.values())}
    loss_ms = sum(excess.get(n, 0) for n in LOSS_OPS)
    head = (f"measured {time.strftime('%Y-%m-%d')} on a {os.cpu_count()}-core CPU ({platform.machine()}, "
            f"{torch.get_num_threads()} torch threads), torch {torch.__version__}, commit {commit}; 1-min load average "
            f"before/after {load0:.2f} / {load1:.2f}; {STEPS} profiled steps after {WARMUP} warm-up steps each; config: "
            f"batch {cfg.batch_size}, {cfg.img_size} px, patch {cfg.patch_size}, ViT {cfg.embed_dim}/{cfg.depth}/"
            f"{cfg.num_heads} student and teacher, fp32, all {cfg.depth} blocks distilled" + (f"; {note}" if note else ""))
    raw = [f"# {head}",
           "# ms per step = sum of self CPU time of every op / steps (profiler overhead included)",
           "# " + ", ".join(f"{k} {v:.1f}" for k, v in tot.items()) + f"; floor (plain + teacher) {floor:.1f}; "
           f"distill x floor {tot['distill'] / floor:.3f}",
           "# excess of distill over the floor by op (ms/step): distill - plain - teacher"]
    for n in sorted(excess, key=excess.get, reverse=True)[:20]:
        raw.append(f"{excess[n]:8.2f}  {n:50s} distill {ms['distill'].get(n, 0):7.2f}  plain {ms['plain'].get(n, 0):7.2f}"
                   f"  teacher {ms['teacher'].get(n, 0):7.2f}")
    for k, p in profs.items():
        raw += [f"===== {k}: top ops by self CPU time ({STEPS} steps)",
                p.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=50)]
    (out / "cpu_profile_distill.txt").write_text("\n".join(raw) + "\n")
    rows = "\n".join(f"| `{n}` | {LOSS_OPS[n]} | {excess.get(n, 0):.1f} | {ms['distill'].get(n, 0):.1f} | "
                     f"{ms['plain'].get(n, 0) + ms['teacher'].get(n, 0):.1f} |"
                     for n in sorted(LOSS_OPS, key=lambda n: -excess.get(n, 0)) if abs(excess.get(n, 0)) >= 0.05)
    d = tot["distill"] - floor
    md = (f"**What bounds distillation on the CPU** (torch.profiler; raw tables in `outputs/bench/cpu_profile_distill.txt`). "
          f"Self CPU time per step: plain {tot['plain']:.1f} ms, teacher forward through all {cfg.depth} blocks "
          f"{tot['teacher']:.1f} ms, so the floor is {floor:.1f} ms; distillation {tot['distill']:.1f} ms = "
          f"{tot['distill'] / floor:.3f}x its floor (the 5 % goal allows {0.05 * floor:.1f} ms above it; the excess is "
          f"{d:.1f} ms). The ops only the loss and its capture run account for {loss_ms:.1f} ms of it "
          f"({100 * loss_ms / d:.0f} %): the teacher's N x N logits (its floor forward runs fused attention, which "
          f"never forms them) and the student's, recomputed by the loss in its forward and again in its backward "
          f"(`losses._AttnDistillQK` keeps only q and k, so no N x N tensor outlives a block), with their softmaxes. "
          f"The ops every step runs (linear layers, GELU) differ by {d - loss_ms:+.1f} ms in all between the separately "
          f"profiled steps. So on this CPU the floor misses the loss's own N x N work; skipping the recomputation "
          f"(explicit attention in the distilled blocks, its own logits feeding the loss) trades it for memory: "
          f"`outputs/bench/cpu_attention_recompute.txt` measures one block both ways.\n\n"
          f"| op | what | excess ms/step | distill | plain + teacher |\n|:--|:--|--:|--:|--:|\n{rows}\n\n{head}.")
    (out / "cpu_profile_distill.md").write_text(md + "\n")
    print(md)

if __name__ == "__main__":
    main(note=sys.argv[sys.argv.index("--note") + 1] if "--note" in sys.argv else "")
