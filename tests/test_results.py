"""The committed mini results are complete and traceable: every output paper.yaml lists, and every run the
manifest used, cached as runs/<hash>.json with its config, commit, wall time and host."""
import json

import pytest

from attnrepro.core import config_hash, project_root
from attnrepro.report import paper_meta
from attnrepro.runner import known_papers, output_dir

DONE = [p for p in known_papers() if (output_dir(p, "mini") / "manifest.json").exists()]


def _meta_at(paper: str, commit: str) -> dict:
    """papers/<paper>/paper.yaml as it was at `commit` (the one that produced the committed outputs): a paper whose
    notebook was redesigned for its next re-run lists outputs the committed results do not have yet. Today's file
    where that commit is not in this clone."""
    import subprocess
    import yaml
    try:
        text = subprocess.run(["git", "show", f"{commit.removesuffix('-dirty')}:papers/{paper}/paper.yaml"],
                              cwd=project_root(), capture_output=True, text=True, check=True).stdout
        return yaml.safe_load(text)
    except (subprocess.CalledProcessError, FileNotFoundError):
        return paper_meta(paper)


def test_some_mini_results_are_committed():
    assert {"aal", "gta", "teachers", "attndistill", "bootstrapping_vit", "attention_transfer"} <= set(DONE)


@pytest.mark.parametrize("paper", DONE)
def test_mini_outputs_are_complete(paper):
    out = output_dir(paper, "mini")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["profile"] == "mini" and manifest["paper"] == paper and manifest["git_commit"]
    meta = _meta_at(paper, manifest["git_commit"])   # the outputs the producing notebook promised
    expected = [o for o in meta["outputs"] if o not in meta.get("paper_profile_only", [])]
    files = {"claims": ["claims.md", "claims.csv"]}
    missing = [f for o in expected for f in files.get(o, [f"{o}.csv", f"{o}.md"] if o.startswith("table_") else [f"{o}.png"])
               if not (out / f).is_file()]
    assert not missing, f"outputs/{paper} lacks {missing} (listed in papers/{paper}/paper.yaml)"
    for f in out.glob("table_*.md"):
        assert "(ours, mini)" in f.read_text(), f"{f} is not labelled with the profile that produced it"


@pytest.mark.parametrize("paper", DONE)
def test_every_used_run_is_recorded(paper):
    out = output_dir(paper, "mini")
    runs = json.loads((out / "manifest.json").read_text())["runs"]
    assert runs, f"outputs/{paper}/manifest.json lists no runs"
    for r in runs:
        rec = json.loads((out / "runs" / f"{r['hash']}.json").read_text())
        assert config_hash(rec["config"]) == r["hash"] == rec["hash"], f"{paper}: run {r['hash']} does not match its config"
        assert rec["profile"] == "mini" and rec["git_commit"] and rec["wall_time_s"] >= 0


@pytest.mark.parametrize("paper", DONE)
def test_claims_have_verdicts_with_intervals(paper):
    import pandas as pd
    from attnrepro.verdicts import VERDICTS
    cl = pd.read_csv(output_dir(paper, "mini") / "claims.csv")
    assert {"id", "claim", "verdict", "claimed", "effect", "ci_low", "ci_high", "n", "mde", "evidence"} <= set(cl.columns)
    assert set(cl["verdict"]) <= set(VERDICTS), f"outputs/{paper}/claims.csv has verdicts outside {VERDICTS}"
    decided = cl[cl["verdict"] != "untestable"]
    assert (decided["ci_low"] <= decided["effect"]).all() and (decided["effect"] <= decided["ci_high"]).all()


def test_readme_results_table_is_generated_from_the_claims():
    from attnrepro.report import update_readme
    assert not update_readme(check=True), "README.md's results table is stale: run `.venv/bin/attnrepro readme`"


def test_readme_row_names_the_regime_of_its_headline_verdict():
    "The README row carries the headline claim's regime (issue #45): its first clause, cut with '...' when longer."
    import pandas as pd
    from attnrepro.report import headline_regime
    cl = pd.DataFrame({"id": ["1", "2"], "regime": ["10 epochs on 5,000 images, 64 px; teacher MAE 16 epochs", "other"]})
    assert headline_regime(cl, "1") == "10 epochs on 5,000 images, 64 px ..."
    assert headline_regime(cl, "2") == "other" and headline_regime(cl, "9") == headline_regime(cl, "1")
    long = pd.DataFrame({"id": ["1"], "regime": ["word " * 40]})
    got = headline_regime(long, "1", limit=30)
    assert got.endswith(" ...") and len(got) <= 34
    assert headline_regime(pd.DataFrame({"id": ["1"], "regime": [float("nan")]}), "1") == ""
    assert headline_regime(pd.DataFrame({"id": ["1"]}), "1") == ""


def test_run_hours_sums_the_manifest_runs_and_counts_gpu_ones():
    from attnrepro.report import run_hours
    runs = [dict(wall_time_s=5400, device="x86_64"), dict(wall_time_s=1800, device="NVIDIA H100 80GB HBM3"),
            dict(wall_time_s=None, device=None), dict(wall_time_s=3600, device="arm64")]
    assert run_hours({"runs": runs}) == "3.0 (1 of 4 runs on a GPU)"
    assert run_hours({"runs": runs[:1]}) == "1.5" and run_hours({}) == "0.0"


def test_pilots_table_reads_every_mini_pilot(tmp_path):
    "The README's pilot rows come from the pilot tables of mini outputs only, one row per method arm."
    import json
    from attnrepro.report import pilots_table
    from attnrepro.verdicts import pilot_table
    runs = {"scratch": [dict(top1=v, n_val=10000, wall_time_s=60.0) for v in (44.4, 45.4, 44.3)],
            "method": [dict(top1=v, n_val=10000, wall_time_s=60.0) for v in (47.0, 48.1)]}
    for name, profile in (("p_mini", "mini"), ("p_smoke", "smoke")):
        d = tmp_path / "outputs" / name
        d.mkdir(parents=True)
        (d / "manifest.json").write_text(json.dumps({"profile": profile}))
        pilot_table(runs, "scratch", chance=10, floor=40, claimed={"method": 8.3}).to_csv(d / "table_pilot_x.csv", index=False)
    text = pilots_table(tmp_path)
    assert "p_mini/pilot_x" in text and "p_smoke" not in text
    row = [l for l in text.splitlines() if "p_mini" in l]
    assert len(row) == 1 and "scratch: 44.70 (>= 40: met)" in row[0] and "| method" in row[0] and "8.3" in row[0]


def test_cost_section_is_generated_from_outputs_bench(tmp_path):
    "The README's cost block shows every committed bench table (and its chart), and says which one is missing."
    from attnrepro.report import COST_END, COST_START, README_END, README_START, cost_section, update_readme
    bench = tmp_path / "outputs" / "bench"
    bench.mkdir(parents=True)
    (bench / "bench.md").write_text("**Cost** caption\n\n| variant | time |\n|:--|--:|\n| plain | 1.00 |\n")
    (bench / "bench.png").write_bytes(b"png")
    sec = cost_section(tmp_path)
    assert "| plain | 1.00 |" in sec and "![bench](outputs/bench/bench.png)" in sec
    assert "No `outputs/bench/throughput.md` committed yet" in sec      # missing table named with the command to make it
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n{README_START}\nold\n{README_END}\n## Cost\n{COST_START}\nhand-written 1.3x\n{COST_END}\ntail\n")
    assert update_readme(tmp_path, check=True)                          # stale before ...
    assert update_readme(tmp_path)
    text = readme.read_text()
    assert "hand-written" not in text and "| plain | 1.00 |" in text and text.endswith(f"{COST_END}\ntail\n")
    assert not update_readme(tmp_path, check=True)                      # ... and in sync after
    readme.write_text(f"{README_START}\n{README_END}\n{COST_START}\n")   # a start marker without its end
    with pytest.raises(ValueError, match="cost:end"):
        update_readme(tmp_path)


def test_reading_section_quotes_mini_readings_with_their_links(tmp_path):
    "The README's reading block quotes each mini `reading.md` (a notebook's `PaperRun.note`) and links its outputs."
    from attnrepro.report import README_END, README_START, READING_END, READING_START, PaperRun, update_readme
    for paper, profile in (("head_to_head", "mini"), ("other", "smoke")):
        pr = PaperRun(paper, profile, str(tmp_path / "outputs" / paper))
        assert pr.note(f"{paper} wins at every size.", "reading") == f"{paper} wins at every size."
        (pr.out_dir / "manifest.json").write_text(json.dumps({"profile": profile}))
        (pr.out_dir / "table_main.md").write_text("t")
        (pr.out_dir / "fig_cost.png").write_bytes(b"png")
        assert "reading.md" in pr.outputs
    readme = tmp_path / "README.md"
    readme.write_text(f"{README_START}\n{README_END}\n{READING_START}\nold\n{READING_END}\n")
    assert update_readme(tmp_path)
    text = readme.read_text()
    assert "**Reading** (ours, mini). head_to_head wins at every size." in text and "old" not in text
    assert "[table_main](outputs/head_to_head/table_main.md) · [fig_cost](outputs/head_to_head/fig_cost.png)" in text
    assert "other wins" not in text                                     # smoke readings stay out of the README
    assert not update_readme(tmp_path, check=True)


def test_readme_regime_is_the_one_that_produced_the_results(tmp_path):
    "The README's regime column reads the manifest's note, else the profile at the manifest's commit, not today's."
    import subprocess
    from attnrepro.report import _regime_note
    prof = tmp_path / "papers" / "p" / "profiles.yaml"
    prof.parent.mkdir(parents=True)
    git = lambda *a: subprocess.run(["git", *a], cwd=tmp_path, check=True, capture_output=True, text=True).stdout.strip()
    git("init", "-q"); git("config", "user.email", "t@t"); git("config", "user.name", "t")
    prof.write_text("mini: {note: 'MINI PROFILE: old regime'}\n")
    git("add", "-A"); git("commit", "-qm", "v1")
    old = git("rev-parse", "HEAD")
    prof.write_text("mini: {note: 'MINI PROFILE: next re-run'}\n")
    git("commit", "-qam", "v2")
    assert _regime_note(tmp_path, "p", {"profile": "mini", "note": "recorded"}) == "recorded"
    assert _regime_note(tmp_path, "p", {"profile": "mini", "git_commit": old + "-dirty"}) == "MINI PROFILE: old regime"
    assert _regime_note(tmp_path, "p", {"profile": "mini", "git_commit": "0" * 40}) == "MINI PROFILE: next re-run"


def test_table_markdown_formats_numbers_in_mixed_columns_and_per_column():
    import pandas as pd
    from attnrepro.report import table_markdown
    df = pd.DataFrame({"top1": [8.716666666666667, "not reproducible offline: no data"], "loss": [0.002105, float("nan")],
                       "share": [72.978, 0.0]})
    assert "8.716666666666667" in table_markdown(df)   # a mixed column is left alone unless named (recipe values)
    df.attrs["floatfmt"] = {"top1": ".2f", "loss": ".3g", "share": ".1f"}
    md = table_markdown(df)
    assert "| 8.72 " in md and "8.7166" not in md and "not reproducible offline: no data" in md
    assert "0.00211" in md and "73.0" in md and "72.98" not in md
    assert df["top1"][0] == 8.716666666666667   # the table (and its csv) keeps the full number
