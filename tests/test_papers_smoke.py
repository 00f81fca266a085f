"""A headless papermill run of every paper notebook at the smoke profile, as `attnrepro reproduce` does it."""
import json

import pytest

from attnrepro.core import project_root
from attnrepro.report import paper_meta
from attnrepro.runner import output_dir, run_paper, runnable_papers

PAPERS = runnable_papers()
# notebooks whose runs are asked for as grids (`PaperRun.run_many`: `--executor local|slurm` trains them as jobs), and
# the name prefixes of the runs each may ask for one at a time (configs that depend on earlier results; measurements
# and analyses of trained models)
OUTSIDE_GRIDS_OK = {"bootstrapping_vit": (), "head_to_head": (), "aal": ("aal_beta_", "arch_counts", "step_time"),
                    "attention_transfer": ("ensembles", "corruption", "cost bench", "CKA", "head JSD", "attention vis"),
                    "attndistill": ("teacher_quality",), "gta": ("pretrained-attention",), "teachers": ("random_init",)}


def test_every_known_paper_has_metadata():
    root = project_root()
    expected = {"teachers", "aal", "attndistill", "bootstrapping_vit", "attention_transfer", "gta"}
    assert expected <= {p.name for p in (root / "papers").iterdir() if (p / "paper.yaml").exists()}


@pytest.mark.parametrize("paper", PAPERS)
def test_smoke_run(paper):
    manifest = run_paper(paper, "smoke")
    out = output_dir(paper, "smoke")
    assert json.loads((out / "manifest.json").read_text())["profile"] == "smoke"
    assert (out / f"{paper}.ipynb").exists()
    assert manifest["wall_time_s"] > 0
    if paper in OUTSIDE_GRIDS_OK:
        alone = [n for n in manifest["outside_grids"] if not n.startswith(OUTSIDE_GRIDS_OK[paper])]   # () matches none
        assert not alone, f"{paper} asked for runs outside its grids: {alone}"
    meta = paper_meta(paper)
    expected = [o for o in meta["outputs"] if o not in meta.get("paper_profile_only", [])]
    assert expected, f"papers/{paper}/paper.yaml lists no outputs"
    files = {"claims": ["claims.md", "claims.csv"]}
    missing = [f for o in expected for f in files.get(o, [f"{o}.csv", f"{o}.md"] if o.startswith("table_") else [f"{o}.png"])
               if not (out / f).is_file()]
    assert not missing, f"{paper} at smoke did not produce {missing} (listed in papers/{paper}/paper.yaml)"


def test_teachers_paper_profile_lists_the_hub_checkpoints():
    "At `paper` the teachers notebook trains nothing: it lists the papers' hub checkpoints, each one timm knows."
    import pandas as pd
    run_paper("teachers", "paper")
    t = pd.read_csv(output_dir("teachers", "paper") / "table_published.csv")
    assert len(t) >= 5 and t["in_timm_registry"].all() and t["checkpoint"].str.startswith("timm:").all()
