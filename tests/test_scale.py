"""Grids of runs on submitit executors (PaperRun.run_many, attnrepro.scale) and the dry run that costs a grid."""
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attnrepro.cli import main
from attnrepro.core import config_hash
from attnrepro.report import RECORD_FIELDS, PaperRun
from attnrepro.scale import GridFailed, RunsPending, marker_path, require_submitit

FIXTURE = Path(__file__).parent / "fixtures" / "grid_paper.ipynb"


@pytest.fixture
def env(tmp_path, monkeypatch):
    "A throw-away cache and jobs folder; local jobs two at a time, polled often."
    monkeypatch.setenv("ATTNREPRO_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("ATTNREPRO_JOBS_DIR", str(tmp_path / "jobs"))
    monkeypatch.setenv("ATTNREPRO_LOCAL_JOBS", "2")
    monkeypatch.setenv("ATTNREPRO_POLL_S", "0.2")
    for k in ("ATTNREPRO_EXECUTOR", "ATTNREPRO_WAIT", "ATTNREPRO_DRY_RUN", "ATTNREPRO_CACHED_ONLY"):
        monkeypatch.delenv(k, raising=False)
    return tmp_path


def make_fn(sleep_s: float = 0.0):
    "A run function defined here (a closure: cloudpickle sends it by value, as it does a notebook's function)."
    offset = 7
    def fn(cfg, ckpt_dir):
        import os, time
        time.sleep(sleep_s)
        (Path(ckpt_dir) / "checkpoint.pth").write_text("done")
        return {"value": cfg["seed"] * 10 + offset, "pid": os.getpid()}
    return fn


GRID = [(f"arm a seed {s}", {"arm": "a", "seed": s}) for s in (0, 1)]


def test_local_executor_runs_in_separate_processes_and_equals_serial(env, monkeypatch, capsys):
    fn = make_fn()
    serial = PaperRun("grid", "smoke", env / "serial").run_many(GRID, fn)
    monkeypatch.setenv("ATTNREPRO_EXECUTOR", "local")
    pr = PaperRun("grid", "smoke", env / "local")
    local = pr.run_many(GRID, fn)
    pids = {r["pid"] for r in local}
    assert os.getpid() not in pids and len(pids) == 2   # each run in its own process
    assert [{k: v for k, v in r.items() if k != "pid"} for r in local] == \
           [{k: v for k, v in r.items() if k != "pid"} for r in serial] == [{"value": 7}, {"value": 17}]
    for name, cfg in GRID:   # the same record, written by the job
        a = json.loads((env / "serial" / "runs" / f"{config_hash(cfg)}.json").read_text())
        b = json.loads((env / "local" / "runs" / f"{config_hash(cfg)}.json").read_text())
        assert set(RECORD_FIELDS) <= set(b) and b["name"] == a["name"] == name and b["config"] == a["config"]
        assert not marker_path(pr.runs_dir, config_hash(cfg)).exists()   # the job removed its marker
    assert list(pr.used) == [config_hash(c) for _, c in GRID]
    # a second call (a new execution of the notebook) skips the finished runs: only the new one is submitted
    capsys.readouterr()
    again = PaperRun("grid", "smoke", env / "local").run_many(GRID + [("arm a seed 2", {"arm": "a", "seed": 2})], fn)
    assert again[:2] == local and again[2]["value"] == 27
    out = capsys.readouterr().out
    assert out.count("[grid] submitted") == 1 and "arm a seed 2" in out


def test_local_jobs_share_the_cpu_cores(env, monkeypatch):
    "Local jobs get the machine's cores shared out (each would otherwise take them all), unless OMP_NUM_THREADS says."
    from attnrepro.scale import job_threads
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("ATTNREPRO_EXECUTOR", "local")
    monkeypatch.setenv("ATTNREPRO_LOCAL_JOBS", "2")
    def fn(cfg, ckpt_dir):
        import torch
        return {"threads": torch.get_num_threads()}
    res = PaperRun("grid", "smoke", env).run_many([("a", {"arm": "a"}), ("b", {"arm": "b"})], fn)
    share = max(1, (os.cpu_count() or 1) // 2)
    assert [r["threads"] for r in res] == [share, share] and job_threads(2) == share and job_threads(10**6) == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert job_threads(2) is None   # the user's setting stands


def test_dependencies_finish_first(env, monkeypatch):
    "A run that needs another run of the grid (a teacher) is submitted once that run has its result."
    monkeypatch.setenv("ATTNREPRO_EXECUTOR", "local")
    pr = PaperRun("grid", "smoke", env)
    runs_dir = str(pr.runs_dir)
    def fn(cfg, ckpt_dir):
        if "teacher" in cfg:   # the teacher's result must be there when this job starts
            t = json.loads((Path(runs_dir) / f"{config_hash(cfg['teacher'])}.json").read_text())
            return {"value": t["result"]["value"] + 1}
        return {"value": cfg["seed"]}
    teacher = {"arm": "ft", "seed": 5}
    student = {"arm": "copy", "teacher": teacher}
    deps = lambda c: [("ft", c["teacher"])] if "teacher" in c else []
    assert pr.run_many([("copy", student)], fn, depends=deps) == [{"value": 6}]
    assert (pr.runs_dir / f"{config_hash(teacher)}.json").exists()


def test_no_wait_submits_then_gathers(env, monkeypatch):
    monkeypatch.setenv("ATTNREPRO_EXECUTOR", "local")
    monkeypatch.setenv("ATTNREPRO_WAIT", "0")
    fn = make_fn(sleep_s=4)
    pr = PaperRun("grid", "smoke", env)
    with pytest.raises(RunsPending) as e:
        pr.run_many(GRID, fn)
    msg = str(e.value)
    assert "2 run(s) submitted to local now" in msg and "2 of the grid's 2 runs have no result yet" in msg
    assert "Re-run the same `attnrepro reproduce` command" in msg
    markers = [marker_path(pr.runs_dir, config_hash(c)) for _, c in GRID]
    ids = {json.loads(m.read_text())["job_id"] for m in markers}
    assert len(ids) == 2 and all(i in msg for i in ids)
    # again while the jobs run: nothing is submitted twice
    with pytest.raises(RunsPending) as e:
        PaperRun("grid", "smoke", env).run_many(GRID, fn)
    assert "0 run(s) submitted to local now" in str(e.value) and "2 still queued or running" in str(e.value)
    deadline = time.time() + 120
    while not all((pr.runs_dir / f"{config_hash(c)}.json").exists() for _, c in GRID):
        assert time.time() < deadline, "the local jobs did not finish"
        time.sleep(0.5)
    # once they are done, the same call gathers them without submitting anything
    done = PaperRun("grid", "smoke", env).run_many(GRID, fn)
    assert [r["value"] for r in done] == [7, 17] and not any(m.exists() for m in markers)


def test_stale_marker_is_replaced_and_reported(env, monkeypatch, capsys):
    monkeypatch.setenv("ATTNREPRO_EXECUTOR", "local")
    pr = PaperRun("grid", "smoke", env)
    dead = subprocess.Popen([sys.executable, "-c", "pass"]); dead.wait()   # a pid that has ended
    h = config_hash(GRID[0][1])
    marker_path(pr.runs_dir, h).write_text(json.dumps({"job_id": str(dead.pid), "executor": "local", "folder": "/gone"}))
    assert [r["value"] for r in pr.run_many(GRID[:1], make_fn())] == [7]
    out = capsys.readouterr().out
    assert "1 earlier job(s) ended without a result" in out and str(dead.pid) in out


def test_failed_job_is_named_with_its_log(env, monkeypatch):
    monkeypatch.setenv("ATTNREPRO_EXECUTOR", "local")
    def fn(cfg, ckpt_dir):
        if cfg["seed"] == 1: raise ValueError("diverged at step 3")
        return {"value": 0}
    pr = PaperRun("grid", "smoke", env)
    with pytest.raises(GridFailed) as e:
        pr.run_many(GRID, fn)
    assert "1 run(s) of the grid failed: arm a seed 1" in str(e.value) and "diverged at step 3" in str(e.value)
    assert (pr.runs_dir / f"{config_hash(GRID[0][1])}.json").exists()   # the other run finished and is kept


def test_unknown_executor_and_missing_submitit(env, monkeypatch, capsys):
    monkeypatch.setenv("ATTNREPRO_EXECUTOR", "cluster")
    with pytest.raises(ValueError, match="not an executor; valid: serial, local, slurm"):
        PaperRun("grid", "smoke", env).run_many(GRID, make_fn())
    with pytest.raises(SystemExit):   # argparse lists the choices
        main(["reproduce", "--paper", "grid", "--executor", "cluster"])
    assert "invalid choice: 'cluster'" in capsys.readouterr().err
    assert main(["reproduce", "--paper", "grid"]) == 2   # a bad ATTNREPRO_EXECUTOR from outside, before any notebook
    assert "ATTNREPRO_EXECUTOR='cluster'" in capsys.readouterr().err
    monkeypatch.delenv("ATTNREPRO_EXECUTOR")
    assert main(["reproduce", "--paper", "grid", "--no-wait"]) == 2
    assert "only apply to --executor local or slurm" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "submitit", None)   # as if it were not installed
    with pytest.raises(ImportError, match="pip install submitit"):
        require_submitit()
    assert main(["reproduce", "--paper", "grid", "--executor", "local"]) == 2
    assert "pip install submitit" in capsys.readouterr().err


@pytest.fixture
def project(env, monkeypatch):
    "A throw-away project holding the grid fixture notebook."
    root = env / "project"
    (root / "nbs" / "papers").mkdir(parents=True)
    shutil.copy(FIXTURE, root / "nbs" / "papers" / "grid.ipynb")
    (root / "papers" / "grid").mkdir(parents=True)
    (root / "papers" / "grid" / "paper.yaml").write_text("short: grid\ntitle: Grid\noutputs: [table_1]\n")
    (root / "settings.ini").write_text("[DEFAULT]\nlib_name = attnrepro\n")
    monkeypatch.chdir(root)
    return root


def test_notebook_grid_on_local_executor(project, capsys):
    "From a papermill-executed notebook (ipykernel's __main__): the runs are jobs, the notebook gathers them."
    assert main(["reproduce", "--paper", "grid", "--profile", "mini", "--executor", "local"]) == 0
    out = project / "outputs" / "grid"
    t = (out / "table_1.csv").read_text().splitlines()
    rows = [dict(zip(t[0].split(","), r.split(","))) for r in t[1:]]
    assert len(rows) == 2 and len({r["pid"] for r in rows}) == 2 and {r["offset"] for r in rows} == {"100"}
    assert len(list((out / "runs").glob("*.json"))) == 2 and not list((out / "runs").glob("*.job"))
    serial = json.loads(next((out / "runs").glob("*.json")).read_text())
    assert serial["result"]["steps"] == 2 * (1437 // 32)   # two epochs of the digits training split


def test_dry_run_costs_the_grid_and_caches_nothing(project, capsys):
    assert main(["reproduce", "--paper", "grid", "--profile", "smoke", "--dry-run", "--dry-run-steps", "2"]) == 0
    out = project / "outputs" / "dryrun" / "grid" / "smoke"
    import pandas as pd
    t = pd.read_csv(out / "table_cost.csv")
    assert list(t.run) == ["linear seed 0", "linear seed 1", "TOTAL (2 runs)"]
    r = t.iloc[0]
    assert r["status"] == "ok" and float(r["batch (recipe)"]) == 32 and float(r["batch (timed)"]) == 8   # cut on the CPU
    assert r["steps/epoch"] == 1437 // 32 and r["epochs"] == 2 and r["step s (timed batch)"] > 0
    assert r["step s (recipe batch)"] == pytest.approx(4 * r["step s (timed batch)"]) and r["peak memory GB"] > 0
    assert r["train h"] == pytest.approx(r["step s (recipe batch)"] * 44 * 2 / 3600)
    assert t["total h"].iloc[-1] == pytest.approx(t["total h"].iloc[:2].sum())
    twin = t.iloc[1]   # seed 1 differs from seed 0 only in its seed: not built again, seed 0's timing credited
    assert twin["status"] == "ok: timed as linear seed 0 (same config but the seed)"
    assert twin["step s (timed batch)"] == r["step s (timed batch)"] and twin["train h"] == r["train h"]
    md = (out / "table_cost.md").read_text()
    assert "recipe -> timed: 32 -> 8" in md and "VmHWM" in md and "INCOMPLETE" not in md
    assert "table_cost.csv and .md" in capsys.readouterr().out
    assert not (project / "outputs" / "smoke").exists() and not (project / "outputs" / "grid").exists()
    assert not (Path(os.environ["ATTNREPRO_CACHE"]) / "checkpoints").exists()   # no checkpoint in the real cache


def test_interrupted_dry_run_still_writes_what_it_measured(project, monkeypatch):
    "Ctrl-C or `timeout -s INT` mid-notebook: the table holds the runs measured so far and says INCOMPLETE."
    import papermill
    from attnrepro.runner import dry_run_paper
    def interrupted(*a, **kw):
        probe = dict(kind="probe", run="linear seed 0", hash="h0", method="m", device="cpu", device_name="x86_64", batch_recipe=32,
                     batch_timed=8, step_s_timed=0.1, step_s=0.4, peak_mem_mb=100.0, mem_kind="fake", n_train=1437,
                     steps_per_epoch=44, epochs=2, train_h=0.01, eval_h=0.0)
        with open(os.environ["ATTNREPRO_DRY_RUN_LOG"], "a") as f: f.write(json.dumps(probe) + "\n")
        raise KeyboardInterrupt
    monkeypatch.setattr(papermill, "execute_notebook", interrupted)
    res = dry_run_paper("grid", "smoke")
    assert res["stopped"].startswith("interrupted") and list(res["table"].run) == ["linear seed 0", "TOTAL (1 runs)"]
    assert "INCOMPLETE: interrupted (Ctrl-C or a time limit)" in (res["out"] / "table_cost.md").read_text()
    from nbclient.exceptions import DeadKernelError
    def interrupted_then_killed(*a, **kw):
        try: interrupted()
        except KeyboardInterrupt: raise DeadKernelError("Kernel died") from None
    monkeypatch.setattr(papermill, "execute_notebook", interrupted_then_killed)
    res = dry_run_paper("grid", "smoke")
    assert res["stopped"].startswith("the notebook's kernel died") and len(res["table"]) == 2
    assert "INCOMPLETE: the notebook's kernel died" in (res["out"] / "table_cost.md").read_text()


def test_synthetic_stand_in_and_dry_checkpoints(env, monkeypatch):
    "A missing dataset becomes synthetic data of its real size in a dry run only; a dry checkpoint is never resumed."
    import attnrepro.data as data
    import torch
    from attnrepro.train import TrainConfig, fit
    monkeypatch.setattr(data, "_find_source", lambda spec, root: (None, ["/nowhere"]))
    with pytest.raises(data.DataNotFoundError):
        data.get_dataset("imagenet", "val")
    monkeypatch.setenv("ATTNREPRO_DRY_RUN", "1")
    va = data.get_dataset("imagenet", "val", transform=data.eval_transform(32))
    assert len(va) == 50000 and len(va.classes) == 1000 and va[1001][1] == 1 and tuple(va[3][0].shape) == (3, 32, 32)
    assert torch.equal(va[3][0], va[3][0])   # drawn from its index: the same image every time
    sub = data.class_balanced_subset(va, per_class=2)
    assert len(sub) == 2000
    tr = data.get_dataset("cifar10", "train", transform=data.eval_transform(8))
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 64, 10))
    res = fit(model, tr, None, TrainConfig(epochs=3, batch_size=64, warmup_epochs=0), ckpt_dir=env, progress=False)
    p = res["dry_run"]
    assert p["steps_per_epoch"] == 50000 // 64 and p["batch_timed"] == 8 and p["steps_timed"] == 1
    monkeypatch.delenv("ATTNREPRO_DRY_RUN")
    with pytest.raises(RuntimeError, match="written by a dry run"):
        fit(model, torch.utils.data.TensorDataset(torch.zeros(64, 3, 8, 8), torch.zeros(64, dtype=torch.long)),
            None, TrainConfig(epochs=3, batch_size=64, warmup_epochs=0), ckpt_dir=env, progress=False)


def test_dry_fit_times_the_step_on_held_batches(env, monkeypatch):
    "The timed steps replay one step's batches held in memory: the loader serves those alone, its cold time recorded."
    import torch
    from attnrepro.train import TrainConfig, fit
    served = []
    class Counted(torch.utils.data.TensorDataset):
        def __getitem__(self, i): served.append(i); return super().__getitem__(i)
    tr = Counted(torch.randn(640, 3, 8, 8), torch.randint(0, 10, (640,)))
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 64, 10))
    monkeypatch.setenv("ATTNREPRO_DRY_RUN", "3")
    p = fit(model, tr, None, TrainConfig(epochs=2, batch_size=8, accum_steps=2, warmup_epochs=0), ckpt_dir=env,
            progress=False)["dry_run"]
    assert len(served) == 2 * 8   # one optimiser step's two micro-batches, then replayed for 1 + 3 steps
    assert p["steps_timed"] == 3 and p["load_s"] > 0 and p["step_s_timed"] > 0


def test_cpu_dry_fit_times_float32_and_quick_checkpoints_hold_no_weights(env, monkeypatch):
    """A CPU times float32 where the recipe sets bf16 autocast (emulated there, many times slower); the probe keeps the
    recipe's precision beside the timed one. Under --dry-run-quick the dry checkpoint carries no weights."""
    import torch
    import attnrepro.train as train
    from attnrepro.train import CKPT_NAME, TrainConfig, fit, load_checkpoint
    seen = []
    real = train.train_one_epoch
    monkeypatch.setattr(train, "train_one_epoch", lambda run, *a, **kw: seen.append(run.cfg.amp) or real(run, *a, **kw))
    tr = torch.utils.data.TensorDataset(torch.randn(64, 3, 8, 8), torch.randint(0, 10, (64,)))
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 64, 10))
    monkeypatch.setenv("ATTNREPRO_DRY_RUN", "1")
    p = fit(model, tr, None, TrainConfig(epochs=1, batch_size=8, warmup_epochs=0, amp=True), ckpt_dir=env,
            progress=False)["dry_run"]
    assert seen == [False] and p["amp"] is True and p["amp_timed"] is False
    import contextlib
    autocast = []   # evaluate alike: a CPU dry run scores in float32 whatever amp it is given
    monkeypatch.setattr(torch, "autocast", lambda *a, enabled=True, **kw: autocast.append(enabled) or contextlib.nullcontext())
    train.evaluate(model, torch.utils.data.DataLoader(tr, batch_size=32), amp=True)
    assert autocast == [False, False]
    assert load_checkpoint(env / CKPT_NAME)["model"]   # a plain dry run keeps the weights for analyses
    monkeypatch.setenv("ATTNREPRO_DRY_RUN_QUICK", "1")
    monkeypatch.setattr(train, "_TIMED_SHAPES", {})
    fit(model, tr, None, TrainConfig(epochs=1, batch_size=8, warmup_epochs=0, seed=1), ckpt_dir=env, progress=False)
    ck = load_checkpoint(env / CKPT_NAME)
    assert ck["dry_run"] and ck["model"] == {} and ck["extra"] == {}


def test_dry_fit_reuses_synthetic_batches_across_runs(env, monkeypatch):
    "Runs on the same synthetic stand-in, sample shapes and batch reuse the first run's held batches and its load_s."
    import collections
    import numpy as np
    import torch
    import attnrepro.train as train
    from attnrepro.data import SyntheticImageDataset
    from attnrepro.train import TrainConfig, fit
    monkeypatch.setattr(train, "_HELD_SYNTHETIC", collections.OrderedDict())
    served = []
    class Counted(SyntheticImageDataset):
        def __getitem__(self, i): served.append(i); return super().__getitem__(i)
    def to_tensor(side):
        return lambda img: torch.from_numpy(np.asarray(img)[:side, :side]).permute(2, 0, 1).float() / 255
    def probe(side, n=64):
        served.clear()
        data = Counted(n, 4, 8, to_tensor(side), name="stand-in", split="train")
        model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * side * side, 4))
        p = fit(model, data, None, TrainConfig(epochs=1, batch_size=8, warmup_epochs=0), ckpt_dir=env,
                progress=False)["dry_run"]
        return p, len(served)
    monkeypatch.setenv("ATTNREPRO_DRY_RUN", "2")
    first, n_first = probe(8)
    again, n_again = probe(8)
    assert n_first == 1 + 8 and n_again == 1   # one sample for the shapes, then the held batch is reused
    assert again["load_s"] == first["load_s"] and again["step_s_timed"] > 0
    assert probe(4)[1] == 1 + 8                 # other sample shapes: drawn again
    assert probe(8, n=128)[1] == 1 + 8          # another stand-in: drawn again
    assert probe(8)[1] == 1                     # the first key is still held (the last 4 are kept)


def test_slurm_submission_markers_and_resubmission(env, monkeypatch, capsys):
    "The slurm path against stand-ins for sbatch / sacct / srun: the job script, markers, live and stale jobs, gathering."
    from attnrepro.report import train_record
    bin_, state, last = env / "bin", env / "sacct_state", env / "last_job"
    bin_.mkdir()
    state.write_text("PENDING")
    last.write_text("4241")
    def tool(name, body):
        (bin_ / name).write_text("#!/bin/sh\n" + body)
        (bin_ / name).chmod(0o755)
    tool("srun", "exit 0\n")
    tool("sbatch", f'n=$(($(cat {last}) + 1)); echo $n > {last}; echo "Submitted batch job $n"\n')
    tool("sacct", 'echo "JobID|State|NodeList"\nwhile [ $# -gt 0 ]; do [ "$1" = "-j" ] && ids="$ids $2"; shift; done\n'
                  f'for j in $(echo $ids | tr , " "); do echo "$j|$(cat {state})|node1"; done\n')   # -j once per job
    monkeypatch.setenv("PATH", f"{bin_}{os.pathsep}{os.environ['PATH']}")
    for k, v in dict(ATTNREPRO_EXECUTOR="slurm", ATTNREPRO_WAIT="0", ATTNREPRO_SLURM_PARTITION="gpu",
                     ATTNREPRO_SLURM_GPUS="2", ATTNREPRO_SLURM_TIME="600").items():
        monkeypatch.setenv(k, v)
    fn = make_fn()
    with pytest.raises(RunsPending, match=r"2 run\(s\) submitted to slurm now \(job ids 4242, 4243\)"):
        PaperRun("grid", "paper", env).run_many(GRID, fn)
    script = next((env / "jobs" / "grid" / "paper").glob("**/4242_submission.sh")).read_text()
    for line in ("#SBATCH --partition=gpu", "#SBATCH --gpus-per-node=2", "#SBATCH --ntasks-per-node=2", "#SBATCH --time=600"):
        assert line in script, script
    with pytest.raises(RunsPending, match=r"0 run\(s\) submitted.*2 still queued or running.*\(job ids 4242, 4243\)"):
        PaperRun("grid", "paper", env).run_many(GRID, fn)   # pending jobs are not submitted twice
    state.write_text("FAILED")
    capsys.readouterr()
    with pytest.raises(RunsPending, match=r"2 run\(s\) submitted to slurm now \(job ids 4244, 4245\)"):
        PaperRun("grid", "paper", env).run_many(GRID, fn)   # failed without a result: submitted again, and said so
    assert "2 earlier job(s) ended without a result" in capsys.readouterr().out
    pr = PaperRun("grid", "paper", env)
    for name, cfg in GRID:   # what the jobs do on the cluster: write the records (and drop their markers)
        train_record(pr.runs_dir, "grid", "paper", cfg, fn, name)
        marker_path(pr.runs_dir, config_hash(cfg)).unlink()
    assert [r["value"] for r in pr.run_many(GRID, fn)] == [7, 17]   # gathered, nothing submitted


def test_dry_call_times_seed_twins_once_and_repeats_a_twin_failure(monkeypatch):
    "Runs that differ only in `seed` keys (at any depth) are built once; a twin of a failed run fails with its reason."
    import attnrepro.dryrun as dryrun
    import attnrepro.scale as scale
    for k in ("PROBES", "_CURRENT"):   # the probe log lives in dryrun; scale holds the same lists
        fresh = []
        for mod in (dryrun, scale): monkeypatch.setattr(mod, k, fresh)
    for k in ("_STAND_IN", "_TWINS"): monkeypatch.setattr(scale, k, {})
    monkeypatch.delenv("ATTNREPRO_DRY_RUN_LOG", raising=False)
    calls = []
    def fn(cfg, ckpt_dir):
        calls.append(cfg)
        if cfg["width"] == 0: raise MemoryError("out of memory")
        scale.record_probe(dict(method="m", device="cpu", batch_recipe=8, batch_timed=8, step_s_timed=cfg["width"] / 10,
                                step_s=cfg["width"] / 10, peak_mem_mb=1.0, mem_kind="fake", n_train=80,
                                steps_per_epoch=10, epochs=1, train_h=1.0, eval_h=0.0))
        return {"top1": cfg["width"]}
    a = {"width": 3, "seed": 0, "train": {"seed": 0, "epochs": 2}}
    assert scale.dry_call("a0", "h0")(fn, a, None) == {"top1": 3}
    assert scale.dry_call("a1", "h1")(fn, dict(a, seed=1, train={"seed": 1, "epochs": 2}), None) == {"top1": 3}
    assert scale.dry_call("b", "h2")(fn, dict(a, train={"seed": 0, "epochs": 3}), None) == {"top1": 3}
    assert len(calls) == 2   # a1 reused a0; b differs in more than its seeds
    twin = [p for p in scale.PROBES if p["hash"] == "h1"]
    # each run opens with its start row (the gpu queue's plan: the run's cost key and epochs), then the twin's probes
    assert twin[0]["kind"] == "start" and twin[0]["epochs"] == 2.0 and twin[0]["run"] == "a1"
    assert twin[0]["cost_key"] == [p for p in scale.PROBES if p["hash"] == "h0"][0]["cost_key"]   # seeds apart: alike
    twin = twin[1:]
    assert [p["kind"] for p in twin] == ["probe", "run"] and all(p["twin"] == "a0" for p in twin)
    assert twin[0]["step_s"] == 0.3 and twin[0]["run"] == "a1"
    with pytest.raises(MemoryError):   # no earlier result of fn stands in for the first failure ... (fresh key)
        monkeypatch.setattr(scale, "_STAND_IN", {})
        scale.dry_call("z0", "h3")(fn, {"width": 0, "seed": 0}, None)
    with pytest.raises(RuntimeError, match="as its seed twin z0: MemoryError: out of memory"):
        scale.dry_call("z1", "h4")(fn, {"width": 0, "seed": 1}, None)
    assert len(calls) == 3   # the twin of the failure was not built again
    t = scale.cost_table(scale.PROBES)
    assert t.set_index("run").loc["a1", "status"] == "ok: timed as a0 (same config but the seed)"


def test_quick_dry_run_steps_each_step_shape_once(monkeypatch):
    "--dry-run-quick: a second run of the same step shape is built, not stepped, and shows the first one's step time."
    import timm
    import torch
    import attnrepro.dryrun as dryrun
    import attnrepro.scale as scale
    import attnrepro.train as train
    from torch.utils.data import TensorDataset
    probes, current = [], []
    for mod in (dryrun, scale):
        monkeypatch.setattr(mod, "PROBES", probes); monkeypatch.setattr(mod, "_CURRENT", current)
    monkeypatch.setattr(train, "_CURRENT", current); monkeypatch.setattr(train, "_TIMED_SHAPES", {})
    monkeypatch.setenv("ATTNREPRO_DRY_RUN", "1"); monkeypatch.setenv("ATTNREPRO_DRY_RUN_QUICK", "1")
    monkeypatch.delenv("ATTNREPRO_DRY_RUN_LOG", raising=False)
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(32, 3, 16, 16), torch.randint(0, 4, (32,)))
    steps = []
    monkeypatch.setattr(train, "train_one_epoch", lambda *a, _f=train.train_one_epoch, **k: steps.append(1) or _f(*a, **k))
    res = []
    # (epochs, classes, depth): a run's epochs and its head's size (to 2 significant digits) make no new shape, depth does
    for i, (epochs, classes, depth) in enumerate(((3, 4, 1), (6, 4, 1), (3, 5, 1), (3, 4, 2))):
        current.append(dict(run=f"r{i}", hash=f"h{i}"))
        model = timm.create_model("vit_tiny_patch16_224", img_size=16, patch_size=8, embed_dim=32, depth=depth,
                                  num_heads=2, num_classes=classes)
        res.append(train.fit(model, data, data, train.TrainConfig(epochs=epochs, batch_size=8, lr=1e-3, warmup_epochs=0),
                             progress=False)["dry_run"])
        current.pop()
    assert len(steps) == 2                                          # only the first and the deeper run were stepped
    assert res[2]["shape_timed_by"] == "r0" and "shape_timed_by" not in res[3]
    assert res[1]["shape_timed_by"] == "r0" and res[1]["step_s"] == res[0]["step_s"]
    assert res[1]["train_h"] == pytest.approx(2 * res[0]["train_h"])   # its own epochs in its projection
    t = scale.cost_table(probes).set_index("run")
    assert t.loc["r1", "status"].startswith("ok: step timed as r0 (same step shape")


def test_quick_dry_run_on_a_cpu_builds_vits_wider_than_vit_s_narrower(monkeypatch):
    """--dry-run-quick on a CPU (a grid check, not a costing): a ViT-L student and a ViT-L hub teacher are built 16 wide
    per head, depth and heads kept (so they still pair), a ViT-S as it is, both without random init; the cost table names
    the narrowing."""
    import torch
    import attnrepro.dryrun as dryrun
    import attnrepro.scale as scale
    from attnrepro.models import create_student, load_teacher, quick_build
    from attnrepro.transfer import vit_shape
    probes, current = [], [dict(run="r0", hash="h0")]
    for mod in (dryrun, scale):
        monkeypatch.setattr(mod, "PROBES", probes); monkeypatch.setattr(mod, "_CURRENT", current)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("ATTNREPRO_DRY_RUN_LOG", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    large = dict(img_size=32, patch_size=16, embed_dim=1024, depth=2, num_heads=16, num_classes=10)
    monkeypatch.setenv("ATTNREPRO_DRY_RUN", "1")
    assert create_student("vit", **large).embed_dim == 1024   # a dry run that costs the grid: the real size
    monkeypatch.setenv("ATTNREPRO_DRY_RUN_QUICK", "1")
    student = create_student("vit", **large)
    assert (student.embed_dim, student.student_cfg["embed_dim"], len(student.blocks)) == (256, 256, 2)
    # ... without random init: matrices cut from one fixed noise vector, norms 1, biases 0; its forward is finite
    q0, q1 = (b.attn.qkv.weight for b in student.blocks)
    assert torch.equal(q0, q1) and 0 < q0.std() < 0.05 and (student.norm.weight == 1).all() and (student.head.bias == 0).all()
    assert torch.isfinite(student(torch.randn(2, 3, 32, 32))).all()
    bn = quick_build(lambda: torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)))
    assert (bn[1].running_var == 1).all() and not torch.equal(bn[0].weight, bn[0].weight.new_zeros(4, 4))  # buffers: built as usual
    assert create_student("vit", **dict(large, embed_dim=384, num_heads=6)).embed_dim == 384
    teacher = load_teacher("timm:vit_large_patch16_224", timm_kwargs=dict(img_size=32, depth=2))
    assert vit_shape(teacher) == vit_shape(student)   # teacher and student still pair block by block, head by head
    assert [(p["width"], p["built"]) for p in probes if p["kind"] == "narrowed"] == [(1024, 256)] * 2
    rows = probes + [dict(kind="probe", run="r0", hash="h0", method="ce", device="cpu", batch_recipe=8, batch_timed=2,
                          step_s_timed=1.0, step_s=4.0, peak_mem_mb=1.0, mem_kind="fake", n_train=80, steps_per_epoch=10,
                          epochs=1, train_h=1.0, eval_h=0.0)]
    status = scale.cost_table(rows).set_index("run").loc["r0", "status"]
    assert status == "ok; ViT width 1024 -> 256 (quick, CPU: hours not the recipe's)"


def test_grid_runs_waiting_for_an_untrained_teacher_leave_the_grid_pending(env, monkeypatch):
    "A local job that needs a teacher not trained yet (`TeacherPending`) leaves its paper pending, not failed."
    monkeypatch.setenv("ATTNREPRO_EXECUTOR", "local")
    def fn(cfg, ckpt_dir):
        if cfg["seed"] == 1:
            from attnrepro.pretrain import TeacherPending
            raise TeacherPending("teacher 'mae_cifar10_gpu' is not trained yet")
        return {"value": 0}
    pr = PaperRun("grid", "smoke", env)
    with pytest.raises(RunsPending, match=r"1 run\(s\) wait for a teacher not trained yet: arm a seed 1"):
        pr.run_many(GRID, fn)
    assert (pr.runs_dir / f"{config_hash(GRID[0][1])}.json").exists()   # the other run finished and is kept
