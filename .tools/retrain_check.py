"""(Run from the repository root: .venv/bin/python .tools/retrain_check.py <paper> <hash>...)
Retrain committed mini runs through today's code and compare each result with the committed one, field by field.
usage: retrain_check.py <paper> <hash> [<hash> ...]   (prints JSON lines; exit 1 if any result differs)"""
import json, sys, tempfile, time
from functools import partial
from pathlib import Path
import torch
torch.set_num_threads(2)
from attnrepro.report import PaperRun, load_profile

SKIP = {"wall_time_s", "train_time_s", "train_s", "wall_s", "eval_s", "images_per_s", "epoch_time_s", "peak_mem_mb", "host"}

def strip(x):
    if isinstance(x, dict): return {k: strip(v) for k, v in x.items() if k not in SKIP}
    if isinstance(x, list): return [strip(v) for v in x]
    return x

def diff(a, b, path=""):
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b: out.append(f"{path}.{k}: only in {'committed' if k in a else 'retrained'}")
            else: out += diff(a[k], b[k], f"{path}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b): return [f"{path}: length {len(a)} vs {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in diff(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r} vs {b!r}"[:300]]

def fn_for(paper, cfg, tmp):
    P = load_profile(paper, "mini")
    if paper == "attention_transfer":
        from attnrepro.papers.attention_transfer import TransferRuns
        pr = PaperRun(paper, "mini", tmp / "out", Path("outputs") / paper / "runs")
        return TransferRuns(P, pr).train
    if paper == "gta":
        from attnrepro.papers.gta import finetune_run
        return finetune_run
    if paper == "attndistill":
        from attnrepro.papers.attndistill import distill_run
        return partial(distill_run, recipe=P)
    if paper == "bootstrapping_vit":
        from attnrepro.papers.bootstrapping_vit import run_options, train_run
        return partial(train_run, recipe=run_options(P))
    if paper == "aal":
        from attnrepro.papers.aal import run_recipe, train_run
        return partial(train_run, recipe=run_recipe(P))
    if paper == "head_to_head":
        from attnrepro import head_to_head
        return head_to_head.run_fn
    if paper == "teachers":
        from attnrepro.pretrain import gate_run
        return partial(gate_run, recipe=P, teacher_dir=None)
    raise SystemExit(f"no run function for {paper}")

bad = 0
paper = sys.argv[1]
for h in sys.argv[2:]:
    rec = json.load(open(f"outputs/{paper}/runs/{h}.json"))
    with tempfile.TemporaryDirectory() as d:
        t0 = time.time()
        res = fn_for(paper, rec["config"], Path(d))(rec["config"], Path(d) / "ckpt")
        res = json.loads(json.dumps(res, default=str))
    dd = diff(strip(rec["result"]), strip(res))
    bad += bool(dd)
    print(json.dumps(dict(paper=paper, hash=h, name=rec["name"], identical=not dd, differences=dd[:8],
                          retrain_s=round(time.time() - t0, 1), committed_at=rec["git_commit"][:8])), flush=True)
sys.exit(1 if bad else 0)
