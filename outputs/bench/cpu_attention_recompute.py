"""The time / memory trade-off behind attention distillation's cost on the CPU (issue #19), for ONE attention block at
`attnrepro bench`'s default shape (batch 64, 3 heads, 65 tokens, head dim 64), forward + backward:
  fused               F.scaled_dot_product_attention alone (a plain step's attention)
  explicit            softmax(q k^T / sqrt(d)) v written out (timm's fused_attn=False)
  fused + loss        fused attention, plus the distillation loss on student logits recomputed from q and k, plain
                      autograd (keeps the N x N logits and log-softmax for the backward)
  fused + attnrepro   fused attention, plus `losses.attention_distillation_from_qk` (what attnrepro runs: it keeps
                      only q and k and recomputes the logits in its backward too)
  explicit + loss     explicit attention whose own logits feed the loss (no recomputation)
Time: median of 15 interleaved repeats. Memory: bytes of the tensors autograd saves for the backward
(torch.autograd.graph.saved_tensors_hooks), beyond q, k, v and the teacher's map that every variant holds.
Run: `OMP_NUM_THREADS=2 PYTHONPATH=. python outputs/bench/cpu_attention_recompute.py > outputs/bench/cpu_attention_recompute.txt`."""
import os, platform, statistics, subprocess, time
import torch, torch.nn.functional as F
from attnrepro.losses import attention_distillation_from_qk

torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", 2))); torch.manual_seed(0)
B, H, N, D = 64, 3, 65, 64
q, k, v = (torch.randn(B, H, N, D, requires_grad=True) for _ in range(3))
t_logits = torch.randn(B, H, N, N)
p_teacher = t_logits.softmax(-1)
held = {t.data_ptr() for t in (q, k, v, p_teacher, t_logits)}   # storages every variant holds anyway

def loss_of(logits): return -(p_teacher * logits.log_softmax(-1)).sum(-1).mean()
def fused(): return F.scaled_dot_product_attention(q, k, v).sum()
def explicit(): return ((q * D ** -0.5) @ k.transpose(-2, -1)).softmax(-1).matmul(v).sum()
def fused_loss(): return F.scaled_dot_product_attention(q, k, v).sum() + loss_of((q * D ** -0.5) @ k.transpose(-2, -1))
def fused_attnrepro():
    return F.scaled_dot_product_attention(q, k, v).sum() + attention_distillation_from_qk(q, k, t_logits, D ** -0.5)
def explicit_loss():
    logits = (q * D ** -0.5) @ k.transpose(-2, -1)
    return (logits.softmax(-1) @ v).sum() + loss_of(logits)
VARIANTS = {"fused": fused, "explicit": explicit, "fused + loss": fused_loss, "fused + attnrepro": fused_attnrepro,
            "explicit + loss": explicit_loss}

def saved_mb(fn):
    seen, total = set(), [0]
    def pack(t):
        if t.data_ptr() not in held and t.data_ptr() not in seen:
            seen.add(t.data_ptr()); total[0] += t.numel() * t.element_size()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    out.backward()
    return total[0] / 2 ** 20

def step(fn): fn().backward()
for fn in VARIANTS.values(): step(fn); step(fn)
times = {name: [] for name in VARIANTS}
load0 = os.getloadavg()[0]
for _ in range(15):
    for name, fn in VARIANTS.items():
        t0 = time.perf_counter(); step(fn); times[name].append(time.perf_counter() - t0)
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
if subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "attnrepro", __file__]).returncode: commit += "-dirty"   # code changed
print(f"# {time.strftime('%Y-%m-%d %H:%M')} commit {commit}, torch {torch.__version__}, {platform.machine()}, "
      f"{torch.get_num_threads()} threads, 1-min load before/after {load0:.2f} / {os.getloadavg()[0]:.2f}; one block: "
      f"batch {B}, {H} heads, {N} tokens, head dim {D}, fp32, forward + backward")
print(f"{'variant':18s} {'median ms':>10s} {'fastest ms':>11s} {'saved for backward MB':>22s}")
for name, fn in VARIANTS.items():
    print(f"{name:18s} {1e3 * statistics.median(times[name]):10.2f} {1e3 * min(times[name]):11.2f} {saved_mb(fn):22.1f}")
