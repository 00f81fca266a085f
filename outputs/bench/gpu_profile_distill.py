"""The torch.profiler run behind outputs/bench/gpu_profile_distill.txt (issue #19): plain vs attention-distillation steps of
ViT-L/16 at 224 px, batch 64, bf16 (attnrepro.bench), 3 profiled steps each, and the teacher forward alone.
On a GPU: `PYTHONPATH=. python outputs/bench/gpu_profile_distill.py > outputs/bench/gpu_profile_distill.txt`;
on the CPU, tiny: `python outputs/bench/gpu_profile_distill.py --tiny`."""
import sys, torch
from torch.profiler import ProfilerActivity, profile
from attnrepro.bench import BenchConfig, build_bench, make_step, teacher_forward_step
tiny = "--tiny" in sys.argv
kw = (dict(img_size=16, patch_size=4, embed_dim=24, depth=4, num_heads=3, batch_size=4, device="cpu", distill_layers=3)
      if tiny else dict(img_size=224, patch_size=16, embed_dim=1024, depth=24, num_heads=16, batch_size=64,
                        device="cuda", distill_layers=18))
cfg = BenchConfig(amp=True, **kw)
student, teacher, opt, x, y = build_bench(cfg)
acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cfg.device == "cuda" else [])
sort = "self_cuda_time_total" if cfg.device == "cuda" else "self_cpu_time_total"
for variant in ("plain", "distill"):
    step = make_step(variant, student, teacher, opt, cfg.distill_layers, amp=True)
    for _ in range(3): step(x, y)
    if cfg.device == "cuda": torch.cuda.synchronize()
    with profile(activities=acts, record_shapes=False) as prof:
        for _ in range(3): step(x, y)
        if cfg.device == "cuda": torch.cuda.synchronize()
    print(f"===== {variant}: top ops by {sort} (3 steps)")
    print(prof.key_averages().table(sort_by=sort, row_limit=30, max_name_column_width=60))
fwd = teacher_forward_step(teacher, cfg.distill_layers, amp=True)
with profile(activities=acts) as prof:
    for _ in range(3): fwd(x)
print("===== teacher forward alone (3 calls)")
print(prof.key_averages().table(sort_by=sort, row_limit=15, max_name_column_width=60))
