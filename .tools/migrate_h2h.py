"""Migrate head_to_head run files whose attention distillation read every block by the registry's old default:
their config gains the explicit option (layers='all'), so they hash anew; each file records where it came from."""
import json, glob, os, sys
from attnrepro.core import atomic_write_json, config_hash, git_commit
WHY = ("the registry's attn_distill default became the paper's first 3/4 of the blocks; this run distilled every block "
       "(the old default), now explicit in its config")
KEY = {"attn_distill": "layers", "attn_distill+kd": "attn_distill__layers", "finetune+gta+attn_distill": "attn_distill__layers"}
moved = []
for f in sorted(glob.glob("outputs/head_to_head/runs/*.json")):
    d = json.load(open(f)); cfg = d["config"]; m = cfg["method"]
    if m not in KEY: continue
    opts = cfg.get("options") or {}
    if "layers" in opts or KEY[m] in opts: continue
    old = d["hash"]; assert old == config_hash(cfg), f
    cfg["options"] = {**opts, KEY[m]: "all"}
    new = config_hash(cfg)
    d.update(hash=new, config=cfg, migrated=dict(from_hash=old, why=WHY, at_commit=git_commit()))
    out = os.path.join(os.path.dirname(f), new + ".json")
    atomic_write_json(out, d)
    os.remove(f); moved.append((old, new, d["name"]))
for o, n, name in moved: print(o, "->", n, name)
print(len(moved), "migrated")
