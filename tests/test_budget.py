"""The gpu queue's budget (attnrepro.budget): a run whose projected cost cannot finish in a device window is not started,
finished runs are kept, and the queue's order file is valid."""
import json

import pytest

from attnrepro.budget import (BudgetExhausted, clear_budget, fits, load_queue, queue_order, seconds_left,
                              start_budget)
from attnrepro.cli import build_parser
from attnrepro.core import config_hash
from attnrepro.report import PROFILES, PaperRun
from attnrepro.runner import gpu_queue_papers, output_dir


@pytest.fixture(autouse=True)
def no_budget():
    clear_budget()
    yield
    clear_budget()


def _finished(runs_dir, config, wall):
    runs_dir.mkdir(parents=True, exist_ok=True)
    (runs_dir / f"{config_hash(config)}.json").write_text(json.dumps(
        dict(config=config, result={"acc1": 50.0}, wall_time_s=wall, name="copy-s0")))


def test_a_run_that_cannot_finish_is_not_started(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNREPRO_GPU_PROFILE_ON_CPU", "1")   # gpu-profile runs of a fake fn, on this CPU
    pr = PaperRun("demo_paper", "gpu", tmp_path / "out")   # not in the queue: no estimates, only measurements
    _finished(pr.runs_dir, {"method": "copy", "seed": 0, "epochs": 100}, wall=600.0)   # measured: 10 min a run
    calls = []
    def train(config, ckpt_dir):
        calls.append(config)
        return {"acc1": 51.0}
    start_budget(2.0)
    with pytest.raises(BudgetExhausted, match=r"copy-s1.*projected 10.0 min \(measured\)"):
        pr.run({"method": "copy", "seed": 1, "epochs": 100}, train, "copy-s1")
    assert calls == []                                     # nothing started, nothing lost
    # a cheaper kind of run of unknown cost starts (it is the measurement); with no budget, everything starts
    assert pr.run({"method": "scratch", "seed": 0, "epochs": 1}, train, "scratch-s0") == {"acc1": 51.0}
    clear_budget()
    assert pr.run({"method": "copy", "seed": 1, "epochs": 100}, train, "copy-s1") == {"acc1": 51.0}
    assert len(calls) == 2 and len(list(pr.runs_dir.glob("*.json"))) == 3


def test_budget_errors_name_the_bad_value(monkeypatch):
    with pytest.raises(ValueError, match="budget minutes must be a number > 0"):
        start_budget(-1)
    monkeypatch.setenv("ATTNREPRO_BUDGET_DEADLINE", "soon")
    with pytest.raises(ValueError, match="ATTNREPRO_BUDGET_DEADLINE='soon'"):
        seconds_left()


def test_queue_file_orders_the_headline_claims_first():
    q = load_queue()
    assert queue_order()[:2] == ["teachers", "attention_transfer"]
    assert set(queue_order()) == {"teachers", "attention_transfer", "bootstrapping_vit", "gta", "aal", "attndistill"}
    assert q["command_limit_minutes"] <= 10
    # only papers with a gpu profile are queued; each listed one is a runnable paper
    assert set(gpu_queue_papers()) <= set(queue_order())


def test_gpu_profile_plumbing(tmp_path):
    assert "gpu" in PROFILES
    assert output_dir("attention_transfer", "gpu", tmp_path) == tmp_path / "outputs" / "gpu" / "attention_transfer"
    args = build_parser().parse_args(["reproduce", "--profile", "gpu", "--budget-minutes", "8"])
    assert args.profile == "gpu" and args.budget_minutes == 8.0
    start_budget(0.5)
    ok, why = fits("p", "x", {"a": 1}, tmp_path, {"order": [{"paper": "p", "estimate_min": {"default": 5.0}}]})
    assert not ok and "projected 5.0 min (estimated)" in why


def test_gpu_window_script_runs_the_queue_and_packs_what_finished(tmp_path):
    """The one prepared script of a GPU window (.device/gpu_window.sh), on the smoke profile: with a budget too small for
    any run nothing starts, the paper is reported pending (exit 3), and the pack and log come back under $OUT."""
    import os, subprocess, tarfile
    from attnrepro.core import project_root
    root = project_root()
    import sys
    # the script runs `python3`: this interpreter's (the venv's), as on the device the image's
    env = dict(os.environ, OUT=str(tmp_path), GPU_WINDOW_PROFILE="smoke", GPU_WINDOW_PAPERS="teachers",
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    # runs of the smoke teachers cached by an earlier smoke test would leave nothing pending: set aside meanwhile
    import shutil
    earlier, aside = root / "outputs" / "smoke" / "teachers", tmp_path / "earlier_smoke_teachers"
    if earlier.exists(): shutil.move(earlier, aside)
    try:
        r = subprocess.run(["bash", str(root / ".device" / "gpu_window.sh"), "0.001"], cwd=root, env=env,
                           capture_output=True, text=True, timeout=600)
    finally:
        if aside.exists():
            shutil.rmtree(earlier, ignore_errors=True); shutil.move(aside, earlier)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    log = (tmp_path / "window.log").read_text()
    assert "PENDING" in log and "not started" in log, log[-2000:]
    assert "window: exit 3" in r.stdout
    with tarfile.open(tmp_path / "window.tar.gz") as t:
        # nothing of the queued paper finished, so none of its runs is packed (other processes may write elsewhere)
        assert not [n for n in t.getnames() if "/teachers/" in n]


def test_estimates_scale_with_the_runs_epochs():
    from attnrepro.budget import estimated_seconds, run_epochs
    q = {"order": [{"paper": "p", "estimate_epochs": 100, "estimate_min": {"default": 10.0, "copy": 20.0}}]}
    assert run_epochs({"kind": "train", "schedule": {"train": {"epochs": 30, "lr": 1e-3}}}) == 30.0
    assert run_epochs({"per_seed": {"0": {"ft": {"schedule": {"train": {"epochs": 100}}}}}}) == 100.0
    assert run_epochs({"kind": "bench"}) is None
    assert estimated_seconds("p", "copy teacher=x schedule=sweep", q, 30.0) == 60.0 * 20.0 * 0.3
    assert estimated_seconds("p", "scratch", q, None) == 600.0            # no epochs known: not scaled
    q["order"][0].pop("estimate_epochs")
    assert estimated_seconds("p", "scratch", q, 30.0) == 600.0            # no reference epochs: not scaled


def test_queue_status_reads_the_plan_against_the_finished_runs(tmp_path):
    """`attnrepro queue`: a paper's plan (its gpu grid, as a dry run listed it) read against its finished runs: what
    is done shows its wall time and top-1, what is left its projected minutes (measured on a finished run of the same
    config up to the seed, else the queue's estimate scaled by epochs), the headline runs summed apart."""
    from attnrepro.budget import cost_key, queue_markdown, queue_status, write_plan
    from attnrepro.core import config_hash
    (tmp_path / "papers" / "demo").mkdir(parents=True)
    (tmp_path / "papers" / "demo" / "profiles.yaml").write_text("mini: {}\ngpu:\n  extends: mini\n")
    (tmp_path / "papers" / "later").mkdir(parents=True)
    (tmp_path / "papers" / "later" / "profiles.yaml").write_text("mini: {}\n")
    (tmp_path / "papers" / "gpu_queue.yaml").write_text(
        "window_jobs: 2\nwindow_budget_minutes: 8\norder:\n"
        "  - {paper: demo, why: claim 1, headline: pilot, estimate_epochs: 100, estimate_min: {default: 10.0}}\n"
        "  - {paper: later, why: claim 2, estimate_min: {default: 1.0}}\n")
    cfg = lambda seed, ep, kind="pilot": {"kind": kind, "train": {"epochs": ep}, "seed": seed}
    runs = [("scratch pilot s0", cfg(0, 100)), ("scratch pilot s1", cfg(1, 100)), ("copy sweep s0", cfg(0, 30, "sweep"))]
    write_plan("demo", [dict(run=n, hash=config_hash(c), epochs=c["train"]["epochs"], cost_key=cost_key(c))
                        for n, c in runs], tmp_path)
    d = tmp_path / "outputs" / "gpu" / "demo" / "runs"
    d.mkdir(parents=True)
    (d / f"{config_hash(cfg(0, 100))}.json").write_text(json.dumps(
        dict(config=cfg(0, 100), result={"acc1": 81.5}, wall_time_s=420.0, host={"device_name": "NVIDIA H200"})))
    demo, later = queue_status(tmp_path)
    assert [x["run"] for x in demo["done"]] == ["scratch pilot s0"] and demo["done"][0]["top1"] == 81.5
    left = {x["run"]: x for x in demo["left"]}
    assert left["scratch pilot s1"]["projected_min"] == 7.0 and left["scratch pilot s1"]["source"] == "measured"
    assert left["copy sweep s0"]["projected_min"] == 3.0 and left["copy sweep s0"]["source"] == "estimated"
    assert left["scratch pilot s1"]["headline"] and not left["copy sweep s0"]["headline"]
    assert later["has_profile"] is False and later["plan"] is None
    md = queue_markdown([demo, later], tmp_path)
    # 10 run-min left = 5 GPU-min with 2 jobs, 3.5 of them headline; 5 / 8 = 0.6 windows
    assert "| 1 | demo | 1 | 2 | 10 | 5 | 4 | 0.6 | a GPU window |" in md, md
    assert "| 2 | later | 0 | - | - | - | - | - | its gpu profile" in md
    assert "| scratch pilot s0 | 7.0 | NVIDIA H200 | 81.5 |" in md


def test_the_committed_queue_report_is_current():
    """outputs/gpu/QUEUE.md is what `attnrepro queue` writes from the committed plans and finished runs (regenerate it
    whenever a plan, an estimate or a finished gpu run changes); only its date may differ."""
    from attnrepro.budget import QUEUE_REPORT, queue_markdown, queue_status
    from attnrepro.core import project_root
    md = (project_root() / "outputs" / "gpu" / QUEUE_REPORT).read_text()
    for paper in queue_order():
        assert f"| {paper} |" in md, f"{paper} is missing from outputs/gpu/{QUEUE_REPORT}: run `attnrepro queue`"
    undated = lambda text: [l for l in text.splitlines() if not l.startswith("Generated by")]
    assert undated(md) == undated(queue_markdown(queue_status())), f"outputs/gpu/{QUEUE_REPORT} is stale: run `attnrepro queue`"


def test_a_gpu_profile_run_does_not_start_on_a_cpu_unasked(tmp_path, monkeypatch):
    """A gpu-profile run is sized for a GPU window (hours on a CPU): without CUDA it stops before training and says what
    to do instead; cached runs still publish (a window's results are regenerated here)."""
    import torch
    if torch.cuda.is_available(): pytest.skip("this machine has a GPU")
    monkeypatch.delenv("ATTNREPRO_GPU_PROFILE_ON_CPU", raising=False)
    pr = PaperRun("demo_paper", "gpu", tmp_path / "out")
    with pytest.raises(RuntimeError, match=r"gpu-profile run and this machine has no CUDA device.*--dry-run.*attnrepro queue"):
        pr.run({"method": "copy", "seed": 0}, lambda c, d: {"acc1": 1.0}, "copy-s0")
    _finished(pr.runs_dir, {"method": "copy", "seed": 1}, wall=60.0)   # finished in a window: read, not trained
    assert pr.run({"method": "copy", "seed": 1}, lambda c, d: {"acc1": 1.0}, "copy-s1") == {"acc1": 50.0}


def test_a_run_a_window_stopped_is_priced_from_what_it_did(tmp_path, monkeypatch):
    """A run stopped by the window's time limit leaves a checkpoint in the device's cache: `record_unfinished` turns it
    into runs/<hash>.unfinished (epochs done, training time), and the queue then projects the whole run from it (a
    measurement) instead of retrying it on the estimate that did not hold."""
    import torch
    from attnrepro.budget import cost_key, projected_seconds, queue_status, record_unfinished, write_plan
    monkeypatch.setenv("ATTNREPRO_CACHE", str(tmp_path / "cache"))
    (tmp_path / "papers" / "demo").mkdir(parents=True)
    (tmp_path / "papers" / "demo" / "profiles.yaml").write_text("gpu: {}\n")
    (tmp_path / "papers" / "gpu_queue.yaml").write_text(
        "order:\n  - {paper: demo, why: claim 1, estimate_epochs: 100, estimate_min: {default: 4.0}}\n")
    cfg = {"kind": "train", "train": {"epochs": 100}, "seed": 0}
    h = config_hash(cfg)
    write_plan("demo", [dict(run="scratch s0", hash=h, epochs=100, cost_key=cost_key(cfg))], tmp_path)
    ck = tmp_path / "cache" / "checkpoints" / "demo" / "gpu" / h
    ck.mkdir(parents=True)
    torch.save(dict(format=1, epoch=20, step=3900, wall_time_s=120.0, model={}), ck / "checkpoint.pth")
    runs = tmp_path / "outputs" / "gpu" / "demo" / "runs"
    assert projected_seconds("demo", "scratch s0", cfg, runs, load_queue(tmp_path)) == (240.0, "estimated")
    [p] = record_unfinished(tmp_path)
    assert p == runs / f"{h}.unfinished" and json.loads(p.read_text())["epoch"] == 20
    assert projected_seconds("demo", "scratch s0", cfg, runs, load_queue(tmp_path)) == (600.0, "measured (unfinished)")
    [demo] = queue_status(tmp_path)
    assert demo["left"][0]["projected_min"] == 10.0 and demo["left"][0]["source"] == "measured (unfinished)"
    start_budget(8.5)
    ok, why = fits("demo", "scratch s0", cfg, runs, load_queue(tmp_path))
    assert not ok and "projected 10.0 min (measured (unfinished))" in why
