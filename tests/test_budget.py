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


def test_a_run_that_cannot_finish_is_not_started(tmp_path):
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
