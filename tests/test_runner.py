"""The papermill runner and CLI, on a throw-away project holding one demo paper notebook."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from attnrepro.cli import main
from attnrepro.runner import PaperFailed, reproduce, run_paper, status

FIXTURE = Path(__file__).parent / "fixtures" / "demo_paper.ipynb"


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNREPRO_CACHE", str(tmp_path / "cache"))   # checkpoints of the demo runs
    (tmp_path / "nbs" / "papers").mkdir(parents=True)
    shutil.copy(FIXTURE, tmp_path / "nbs" / "papers" / "demo.ipynb")
    (tmp_path / "papers" / "demo").mkdir(parents=True)
    (tmp_path / "papers" / "demo" / "paper.yaml").write_text("short: demo\ntitle: Demo\noutputs: [table_1]\n")
    (tmp_path / "papers" / "nonb").mkdir(parents=True)
    (tmp_path / "papers" / "nonb" / "paper.yaml").write_text("short: nonb\ntitle: No notebook yet\n")
    return tmp_path


def calls(project):
    f = project / "calls.txt"
    return f.read_text().split() if f.exists() else []


def test_run_publishes_outputs_and_manifest(project):
    man = run_paper("demo", "mini", root=project, params={"counter_file": str(project / "calls.txt")})
    out = project / "outputs" / "demo"
    names = {p.name for p in out.iterdir()}
    assert {"table_1.csv", "table_1.md", "claims.md", "manifest.json", "demo.ipynb", "runs"} <= names
    assert len(list((out / "runs").glob("*.json"))) == 2
    disk = json.loads((out / "manifest.json").read_text())
    assert disk["profile"] == "mini" and disk["seeds"] == [0, 1] and len(disk["runs"]) == 2
    assert {"git_commit", "wall_time_s", "packages"} <= set(disk) and disk["packages"]["torch"]
    assert {r["hash"] for r in disk["runs"]} == {p.stem for p in (out / "runs").glob("*.json")}
    assert "(ours, mini)" in (out / "table_1.md").read_text()
    assert man["claims"][0]["verdict"] == "holds" and man["claims"][0]["effect"] == 1.0
    # provenance: from a table to the notebook cell that wrote it, in the .md and the manifest
    assert disk["provenance"]["table_1.md"].startswith("nbs/papers/demo.ipynb, cell 2 (id ")
    assert f"Produced by {disk['provenance']['table_1.md']}" in (out / "table_1.md").read_text()
    assert not list((project / "outputs").glob(".staging*"))


def test_executed_notebook_is_shareable(project):
    """The executed notebook names paths relative to the project root (its injected parameters name the published
    folder, not the staging one), warnings name library files without this machine's site-packages, and tqdm's
    'IProgress not found' (ipywidgets missing) does not show."""
    import nbformat
    run_paper("demo", "mini", root=project, params={"warn_like_a_library": True})
    path = project / "outputs" / "demo" / "demo.ipynb"
    nb, text = nbformat.read(str(path), as_version=4), path.read_text()
    injected, = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert 'out_dir = "outputs/demo"' in injected.source and 'runs_dir = "outputs/demo/runs"' in injected.source
    assert str(project) not in text and str(project.resolve()) not in text and ".staging" not in text
    assert "site-packages" not in text and "IProgress" not in text
    streams = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []) if o.output_type == "stream")
    assert "tqdm/__init__.py:1: UserWarning: a library warning" in streams, streams
    assert "-> outputs/demo/runs/" in streams, streams   # the run files, as printed when they were written
    assert nb.metadata.papermill["input_path"] == "nbs/papers/demo.ipynb"
    assert nb.metadata.papermill["parameters"]["out_dir"] == "outputs/demo"


@pytest.mark.parametrize("profile", ["smoke", "paper"])
def test_other_profiles_never_touch_the_committed_outputs(project, profile):
    run_paper("demo", profile, root=project, params={"counter_file": str(project / "calls.txt")})
    assert (project / "outputs" / profile / "demo" / "manifest.json").exists()
    assert not (project / "outputs" / "demo").exists()


def test_cache_reuse_and_force(project):
    p = {"counter_file": str(project / "calls.txt")}
    run_paper("demo", "mini", root=project, params=p)
    run_paper("demo", "mini", root=project, params=p)
    assert calls(project) == ["0", "1"]  # second regeneration trained nothing
    run_paper("demo", "mini", root=project, params=p, force=True)
    assert calls(project) == ["0", "1", "0", "1"]


def test_failure_keeps_old_outputs_and_finished_runs(project):
    p = {"counter_file": str(project / "calls.txt")}
    run_paper("demo", "mini", root=project, params=p)
    out = project / "outputs" / "demo"
    before = {f.name: f.read_bytes() for f in out.iterdir() if f.is_file()}
    shutil.rmtree(out / "runs")  # pretend run 0 and 1 were never trained
    with pytest.raises(PaperFailed, match=r"failed in cell \d+.*RuntimeError: boom"):
        run_paper("demo", "mini", root=project, params=dict(p, fail_after_first_run=True))
    assert {f.name: f.read_bytes() for f in out.iterdir() if f.is_file()} == before
    assert len(list((out / "runs").glob("*.json"))) == 1  # the run finished before the failure survives
    assert (project / "outputs" / ".failed" / "mini" / "demo" / "demo.ipynb").exists()
    # going on: only the missing run trains (run 0 found its finished checkpoint, as fit would resume it)
    run_paper("demo", "mini", root=project, params=p)
    assert calls(project) == ["0", "1", "0resumed", "1resumed"]


def test_reproduce_goes_on_after_a_failure(project):
    res = reproduce(["demo"], "mini", root=project, params={"counter_file": str(project / "calls.txt"),
                                                           "fail_after_first_run": True}, progress=False)
    assert isinstance(res["demo"], PaperFailed)


def test_bad_arguments(project):
    with pytest.raises(ValueError, match=r"known papers: \['demo', 'nonb'\]"):
        run_paper("nope", "mini", root=project)
    with pytest.raises(ValueError, match="no notebook yet"):
        run_paper("nonb", "mini", root=project)
    with pytest.raises(ValueError, match=r"valid profiles: \['smoke', 'mini', 'gpu', 'paper'\]"):
        run_paper("demo", "tiny", root=project)
    with pytest.raises(ValueError, match=r"settable parameters: \['counter_file', 'fail_after_first_run', 'sleep_in_second_run', 'teacher', 'warn_like_a_library'\]"):
        run_paper("demo", "mini", root=project, params={"lr": 1})
    with pytest.raises(ValueError, match="reserved"):
        run_paper("demo", "mini", root=project, params={"profile": "paper"})
    with pytest.raises(ValueError, match="Unknown paper"):
        reproduce(["demo", "nope"], root=project)


def test_status_lists_outputs(project):
    run_paper("demo", "mini", root=project, params={"counter_file": str(project / "calls.txt")})
    rows = {r["paper"]: r for r in status(project)}
    assert rows["demo"]["notebook"] and not rows["nonb"]["notebook"]
    assert rows["demo"]["mini"]["runs"] == 2 and "table_1.csv" in rows["demo"]["mini"]["files"]


def test_cli_errors_list_valid_choices():
    exe = Path(sys.executable).parent / "attnrepro"  # the console script
    r = subprocess.run([str(exe), "reproduce", "--profile", "huge"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "invalid choice: 'huge'" in r.stderr and "'smoke', 'mini', 'gpu', 'paper'" in r.stderr
    assert main(["reproduce", "--paper", "nope"]) == 2
    assert main(["reproduce", "--paper", "aal", "--max-device-batch", "0"]) == 2   # named before any notebook starts
    with pytest.raises(SystemExit):
        main(["reproduce", "--param", "novalue"])


def test_ctrl_c_then_rerun_reuses_finished_runs(project):
    """`attnrepro reproduce` interrupted with Ctrl-C (SIGINT) while the second run trains: the first run's
    result survives, no staging folder is left, and the next call trains only what is missing."""
    import os, signal, time
    (project / "settings.ini").write_text("[DEFAULT]\nlib_name = attnrepro\n")
    exe = Path(sys.executable).parent / "attnrepro"
    counter = str(project / "calls.txt")
    args = [str(exe), "reproduce", "--paper", "demo", "--profile", "mini", "--param", f"counter_file={counter}"]
    # the child gets the default SIGINT disposition: an ignored SIGINT is inherited across exec, and pytest itself
    # runs with SIGINT ignored when started as a background job (`.ci/run &`: the interrupt was then lost)
    proc = subprocess.Popen(args + ["--param", "sleep_in_second_run=60"], cwd=project, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    runs = project / "outputs" / "demo" / "runs"
    deadline = time.time() + 120
    while time.time() < deadline and "1" not in calls(project):
        time.sleep(0.5)
    assert calls(project) == ["0", "1"], proc.communicate(timeout=5)[0]  # run 0 done, run 1 sleeping
    os.killpg(proc.pid, signal.SIGINT)
    # communicate, not wait: drains the pipe (a full pipe would block the child) and shows its output on failure;
    # generous timeout because a loaded 2-core CI machine tears the kernel down slowly
    out = proc.communicate(timeout=180)[0].decode(errors="replace")
    assert proc.returncode == 130, out   # 0 would mean the interrupt was lost and run 1 finished
    assert "interrupted: demo (mini) stopped; 1 run(s) finished" in out and "run the same command" in out, out
    assert "Traceback" not in out, out
    assert len(list(runs.glob("*.json"))) == 1
    assert not (project / "outputs" / "demo" / "manifest.json").exists()
    r = subprocess.run(args, cwd=project, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert calls(project) == ["0", "1", "1resumed"]  # only the interrupted run trained again, from its checkpoint
    assert len(list(runs.glob("*.json"))) == 2
    assert not list((project / "outputs").glob(".staging*"))


def test_force_retrains_from_scratch_and_failures_are_cleared(project):
    """--force trains again from scratch: a finished checkpoint of the same config is removed, not resumed (the
    fixture records 'resumed' when it finds one), and a later success clears the paper's stale failure folder."""
    p = {"counter_file": str(project / "calls.txt")}
    with pytest.raises(PaperFailed):
        run_paper("demo", "mini", root=project, params=dict(p, fail_after_first_run=True))
    assert (project / "outputs" / ".failed" / "mini" / "demo").exists()
    run_paper("demo", "mini", root=project, params=p)
    assert not (project / "outputs" / ".failed" / "mini" / "demo").exists()
    run_paper("demo", "mini", root=project, params=p, force=True)
    assert calls(project) == ["0", "1", "0", "1"]   # run 0 of the failed call is reused, then retrained fresh
    man = json.loads((project / "outputs" / "demo" / "manifest.json").read_text())
    assert man["parameters"]["out_dir"] == "outputs/demo"   # relative, not this machine's absolute path


def test_malformed_param_names_the_parameter(project):
    with pytest.raises(ValueError, match=r"parameter 'fail_after_first_run' expects a bool .*got '\[0,'"):
        run_paper("demo", "mini", root=project, params={"fail_after_first_run": "[0,"})
    with pytest.raises(ValueError, match=r"parameter 'counter_file' expects a str"):
        run_paper("demo", "mini", root=project, params={"counter_file": [1, 2]})
    (project / "settings.ini").write_text("[DEFAULT]\nlib_name = attnrepro\n")
    exe = Path(sys.executable).parent / "attnrepro"
    r = subprocess.run([str(exe), "reproduce", "--paper", "demo", "--profile", "mini", "--param", "sleep_in_second_run=[0,"],
                       cwd=project, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "'sleep_in_second_run' expects a float" in r.stderr, r.stderr


def test_log_output_shows_runs_and_claims(project):
    (project / "settings.ini").write_text("[DEFAULT]\nlib_name = attnrepro\n")
    exe = Path(sys.executable).parent / "attnrepro"
    r = subprocess.run([str(exe), "reproduce", "--paper", "demo", "--profile", "mini", "--log-output",
                        "--param", f"counter_file={project / 'calls.txt'}"], cwd=project, capture_output=True, text=True,
                       timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "[run] training" in out and "[run] finished" in out and "[holds] claim 1" in out, out
    assert "outputs in outputs/demo" in r.stdout


def _doc_texts() -> dict:
    "README.md and every docs/*.md page, {relative path: text}: every command they show is checked."
    from attnrepro.core import project_root
    root = project_root()
    return {p.relative_to(root).as_posix(): p.read_text() for p in [root / "README.md", *sorted((root / "docs").glob("*.md"))]}


def test_readme_param_examples_are_settable_in_every_paper():
    """Every `--param KEY=VALUE` example in the README and docs/ names a parameter the paper notebooks declare, with a
    value of its declared type; `seeds` is settable in every paper notebook."""
    import re
    from attnrepro.cli import _parse_param
    from attnrepro.runner import RUNNER_PARAMS, check_parameter, notebook_parameters, paper_notebook, runnable_papers
    declared = {p: notebook_parameters(paper_notebook(p)) for p in runnable_papers()}
    assert all("seeds" in d for d in declared.values()), {p: sorted(d) for p, d in declared.items()}
    examples = [(f, ex) for f, text in _doc_texts().items() for ex in re.findall(r"--param (\S+)", text)]
    assert examples, "neither the README nor docs/ show a --param example"
    for f, ex in examples:
        k, v = _parse_param(ex)
        for p, d in declared.items():
            assert k in d and k not in RUNNER_PARAMS, f"{f} example {ex!r}: {p} declares no parameter {k!r}"
            check_parameter(k, v, d[k])


def test_atomic_writes_respect_the_umask(tmp_path):
    import os, stat
    from attnrepro.core import atomic_write_text
    old = os.umask(0o022)
    try: p = atomic_write_text(tmp_path / "x.md", "table")
    finally: os.umask(old)
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o644   # like every other file, not mkstemp's 0600


def test_readme_cli_commands_parse_and_the_quick_ones_run(capsys):
    """Every `attnrepro ...` command shown in the README and docs/ (a line of a shell block, or inline code) parses with
    the real parser and its paper names exist; the ones that train nothing (list, datasets, readme --check) run here."""
    import re, shlex
    from attnrepro.cli import build_parser
    from attnrepro.runner import known_papers
    cmds = []
    for f, text in _doc_texts().items():
        lines = [l.split(" #")[0].strip() for b in re.findall(r"```bash\n(.*?)```", text, re.S) for l in b.splitlines()]
        cmds += [(f, l[l.index("attnrepro ") + len("attnrepro "):]) for l in lines if re.search(r"\.venv/bin/attnrepro ", l)]
        cmds += [(f, c) for c in re.findall(r"`(?:[A-Z_]+=\S+ )*(?:\.venv/bin/)?attnrepro ([^`]+)`", text)]
    assert {shlex.split(c)[0] for _, c in cmds} >= {"list", "reproduce", "datasets", "readme", "site", "prune"}, cmds
    for f, c in cmds:
        args = build_parser().parse_args(shlex.split(c))
        assert not getattr(args, "paper", None) or set(args.paper) <= set(known_papers()), (f, c)
    assert main(["list"]) == 0 and "--param: seeds=None" in capsys.readouterr().out   # settable parameters shown
    for c in (["datasets"], ["readme", "--check"], ["prune"]):   # prune without --yes only lists
        assert main(c) == 0, (c, capsys.readouterr())


def test_paper_profile_names_everything_it_lacks_before_training(tmp_path, monkeypatch):
    "require_paper_resources: at the paper profile without CUDA, one error names the GPU, each missing dataset and teacher."
    import torch
    from attnrepro.report import PaperRun
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("ATTNREPRO_DOWNLOAD", raising=False)
    monkeypatch.delenv("ATTNREPRO_TEACHER_URL", raising=False)
    pr = PaperRun("gta", "paper", tmp_path / "out")
    with pytest.raises(RuntimeError) as e:
        pr.require_paper_resources("a ViT-S/16 grid", datasets=["cub200", "cifar10"],
                                   teachers={"no_such_teacher": "pre-train it first", "timm:vit_small_patch16_224": "hub"})
    msg = str(e.value)
    assert "GPUs (this machine has no CUDA device): the recipe trains a ViT-S/16 grid" in msg
    assert "dataset 'cub200'" in msg and "dataset 'cifar10'" not in msg          # CIFAR-10 is in the offline data
    assert "the teacher 'no_such_teacher': pre-train it first" in msg and "timm:vit_small" not in msg
    assert "--paper gta --profile paper --dry-run" in msg
    assert (tmp_path / "out" / "runs_used.json").is_file()                       # finished: the runner keeps what was written
    for profile in ("smoke", "mini"):                                            # other profiles: nothing to check
        PaperRun("gta", profile, tmp_path / profile).require_paper_resources("x", datasets=["cub200"])
    monkeypatch.setenv("ATTNREPRO_DRY_RUN", "2")                                 # a dry run goes on
    PaperRun("gta", "paper", tmp_path / "dry").require_paper_resources("x", datasets=["cub200"])


def test_run_arrays_are_kept_beside_the_run_json(tmp_path, monkeypatch):
    "Images and maps in a run's result go to runs/<hash>.npz; the JSON keeps a placeholder; a cached run gets them back."
    monkeypatch.setenv("ATTNREPRO_CACHE", str(tmp_path / "cache"))
    import numpy as np
    from attnrepro.core import config_hash
    from attnrepro.report import PaperRun
    images = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    maps = np.linspace(0, 1, 8, dtype=np.float32).reshape(2, 2, 2)
    calls = []
    def fn(config, ckpt_dir):
        calls.append(1)
        return dict(top1=12.5, images=images, maps={"init": {"3": maps}})
    config = dict(kind="vis", seed=0)
    first = PaperRun("gta", "smoke", tmp_path / "out").run(config, fn, name="vis")
    h = config_hash(config)
    rec = json.loads((tmp_path / "out" / "runs" / f"{h}.json").read_text())
    assert rec["result"]["images"] == {"__array__": "images", "shape": [2, 3, 4], "dtype": "uint8"}
    assert rec["result"]["maps"]["init"]["3"]["__array__"] == "maps/init/3" and rec["result"]["top1"] == 12.5
    assert first["images"] is images   # the caller gets the arrays, not the placeholders
    cached = PaperRun("gta", "smoke", tmp_path / "out").run(config, fn, name="vis")
    assert calls == [1] and cached["top1"] == 12.5
    assert cached["images"].dtype == np.uint8 and np.array_equal(cached["images"], images)
    assert np.array_equal(cached["maps"]["init"]["3"], maps)
    (tmp_path / "out" / "runs" / f"{h}.npz").unlink()
    with pytest.raises(ValueError, match=rf"{h}.npz are missing or unreadable .*delete the run's .json and .npz"):
        PaperRun("gta", "smoke", tmp_path / "out").run(config, fn, name="vis")


def test_a_fresh_run_reads_as_its_cached_record(tmp_path, monkeypatch):
    "The result of a run just trained comes back as a later execution reads it (key order, str keys, lists), so tables agree."
    monkeypatch.setenv("ATTNREPRO_CACHE", str(tmp_path / "cache"))
    from attnrepro.report import PaperRun
    fn = lambda config, ckpt: dict(scores={"scratch": 1.0, "pre-trained": 2.0}, by_block={3: (0.5, 0.25)})
    fresh = PaperRun("gta", "smoke", tmp_path / "out").run(dict(kind="cka"), fn)
    cached = PaperRun("gta", "smoke", tmp_path / "out").run(dict(kind="cka"), fn)
    assert fresh == cached == dict(by_block={"3": [0.5, 0.25]}, scores={"pre-trained": 2.0, "scratch": 1.0})
    assert list(fresh["scores"]) == list(cached["scores"]) == ["pre-trained", "scratch"]


def test_prune_deletes_only_older_runs_the_manifest_does_not_use(project, monkeypatch, capsys):
    from attnrepro.runner import prune_runs
    with pytest.raises(ValueError, match="no published outputs.*attnrepro reproduce --paper demo --profile mini"):
        prune_runs("demo", "mini", root=project)
    run_paper("demo", "mini", root=project)   # no --param: its runs are the profile's grid
    runs = project / "outputs" / "demo" / "runs"
    used = {f.name for f in runs.glob("*.json")}
    old = dict(hash="0ld", name="superseded", finished="2020-01-01T00:00:00+0000")
    (runs / "0ld.json").write_text(json.dumps(old))
    (runs / "0ld.npz").write_bytes(b"arrays")
    (runs / "n3w.json").write_text(json.dumps(dict(old, hash="n3w", finished="2999-01-01T00:00:00+0000")))
    listed = prune_runs("demo", "mini", root=project)                      # dry run: lists, deletes nothing
    assert [f.name for f in listed["stale"]] == ["0ld.json"] and listed["used"] == 2 and listed["kept_newer"] == 1
    assert (runs / "0ld.json").exists()
    row = {r["paper"]: r for r in status(project)}["demo"]["mini"]
    assert row["runs"] == 4 and row["unused"] == 2 and row["stale"] == 1
    # the command line, from inside the project: lists without --yes, deletes with it
    (project / "settings.ini").write_text("[DEFAULT]\nlib_name = attnrepro\n")
    monkeypatch.chdir(project)
    assert main(["prune", "--paper", "demo"]) == 0 and (runs / "0ld.json").exists()
    assert "1 unused and older: would be deleted" in capsys.readouterr().out
    assert main(["prune", "--paper", "demo", "--yes"]) == 0
    assert {f.name for f in runs.iterdir()} == used | {"n3w.json"}       # the .npz went with its run; newer kept
    assert main(["prune", "--paper", "nope"]) == 2 and "Unknown paper 'nope'" in capsys.readouterr().err
    # a manifest made with --param overrides is not the profile's grid: refuse
    man = json.loads((project / "outputs" / "demo" / "manifest.json").read_text())
    man["parameters"]["fail_after_first_run"] = True
    (project / "outputs" / "demo" / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(ValueError, match=r"made with --param \['fail_after_first_run'\]"):
        prune_runs("demo", "mini", root=project)


def test_a_project_teacher_not_trained_yet_leaves_the_paper_pending(project):
    """A teacher papers/teachers/profiles.yaml defines but nobody trained yet (the gpu profile's before a GPU window):
    the paper is pending (exit code 3 in the CLI), not failed, and the runs finished before it are kept."""
    from attnrepro.runner import PaperPending
    (project / "settings.ini").write_text("[DEFAULT]\nlib_name = attnrepro\n")   # the notebook's project root
    (project / "papers" / "teachers").mkdir()
    (project / "papers" / "teachers" / "profiles.yaml").write_text(
        "gpu:\n  arch: {img_size: 32, patch_size: 4, embed_dim: 16, depth: 1, num_heads: 2}\n"
        "  teachers:\n    demo_teacher_gpu: {algorithm: mae}\n")
    p = {"counter_file": str(project / "calls.txt"), "teacher": "demo_teacher_gpu"}
    with pytest.raises(PaperPending, match=r"teacher 'demo_teacher_gpu'.*profile 'gpu'.*not trained yet.*--profile gpu"):
        run_paper("demo", "mini", root=project, params=p)
    assert not (project / "outputs" / ".failed" / "mini" / "demo").exists()
    assert len(list((project / "outputs" / "demo" / "runs").glob("*.json"))) == 1   # the first run is kept
