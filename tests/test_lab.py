"""The notebooks as a person runs them in JupyterLab (`make lab`), without a browser: the project's kernel is selected
in every notebook, a paper notebook's defaults are the smoke profile writing to outputs/smoke/<paper>/ from whatever
folder the kernel starts in, and figures show under their cells (but stay files in the runner's executed notebooks).
The browser itself is driven in test_browser.py."""
import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat

from attnrepro.runner import KERNEL_NAME, notebook_parameters, paper_notebook, run_paper, runnable_papers

ROOT = Path(__file__).resolve().parents[1]


def test_every_notebook_selects_the_project_kernel():
    nbs = sorted((ROOT / "nbs").rglob("*.ipynb"))
    assert nbs
    wrong = {str(nb.relative_to(ROOT)): json.loads(nb.read_text())["metadata"].get("kernelspec", {}).get("name")
             for nb in nbs if ".ipynb_checkpoints" not in nb.parts}
    wrong = {k: v for k, v in wrong.items() if v != KERNEL_NAME}
    assert not wrong, f"kernelspec name must be {KERNEL_NAME!r} (the kernel `make setup` installs): {wrong}"


def test_paper_notebooks_default_to_smoke_and_say_how_to_switch():
    for paper in runnable_papers():
        nb = json.loads(paper_notebook(paper).read_text())
        params = notebook_parameters(paper_notebook(paper))
        assert (params["profile"], params["out_dir"], params["runs_dir"]) == ('"smoke"', '""', '""'), (paper, params)
        i = next(i for i, c in enumerate(nb["cells"]) if "parameters" in c["metadata"].get("tags", []))
        intro = "".join(nb["cells"][i - 1]["source"])   # the cell just above the parameters says it
        for needle in ("Run All", "`smoke`", f"outputs/smoke/{paper}/", 'profile = "mini"',
                       f"attnrepro reproduce --paper {paper} --profile mini"):
            assert needle in intro, f"{paper}: the cell above the parameters should mention {needle!r}"


def test_outputs_data_and_teachers_are_found_from_any_kernel_cwd(tmp_path):
    "A kernel started outside the clone (another folder as JupyterLab's root, a server config) finds the project."
    code = ("from attnrepro.runner import output_dir; from attnrepro.data import data_roots; "
            "from attnrepro.models import teacher_dirs; import json; "
            "print(json.dumps([str(output_dir('gta', 'smoke')), [str(r) for r in data_roots()], "
            "[str(d) for d in teacher_dirs()]]))")
    for cwd in (tmp_path, ROOT / "nbs" / "papers"):
        r = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, check=True)
        out, data, teachers = json.loads(r.stdout)
        assert Path(out) == ROOT / "outputs" / "smoke" / "gta", (cwd, out)
        assert (ROOT.parent / "shared" / "data").resolve() in [Path(d) for d in data], (cwd, data)
        assert ROOT / "outputs" / "teachers" / "weights" in [Path(t) for t in teachers], (cwd, teachers)


def test_make_lab_opens_the_project_root_with_the_project_kernel():
    r = subprocess.run(["make", "-n", "lab"], cwd=ROOT, capture_output=True, text=True, check=True)
    line = next(l for l in r.stdout.splitlines() if "jupyter lab" in l)
    assert f'--ServerApp.root_dir="{ROOT}"' in line and f"default_kernel_name={KERNEL_NAME}" in line, line


DEMO_PARAMS = 'profile = "smoke"\nout_dir = ""\nruns_dir = ""\nforce = False'
DEMO_CODE = """import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
from attnrepro.report import PaperRun
from attnrepro.runner import output_dir
pr = PaperRun("demo", profile, out_dir or str(output_dir("demo", profile)), runs_dir or None, force)
fig, ax = plt.subplots(figsize=(2, 1.5)); ax.plot([0, 1])
pr.figure(fig, "1"); plt.close(fig)
pr.finish()"""


def _images(nb) -> int:
    return sum("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))


def test_figures_show_under_their_cell_in_a_kernel_but_stay_files_in_the_runner(tmp_path, monkeypatch):
    import nbclient
    monkeypatch.setenv("ATTNREPRO_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("ATTNREPRO_INLINE_FIGURES", raising=False)
    (tmp_path / "settings.ini").write_text("[DEFAULT]\nlib_name = attnrepro\n")   # a project root of its own
    (tmp_path / "papers" / "demo").mkdir(parents=True)
    (tmp_path / "papers" / "demo" / "paper.yaml").write_text("short: demo\ntitle: Demo\noutputs: [fig_1]\n")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(DEMO_PARAMS, metadata={"tags": ["parameters"]}),
                                         nbformat.v4.new_code_cell(DEMO_CODE)],
                                  metadata={"kernelspec": {"name": KERNEL_NAME, "display_name": KERNEL_NAME,
                                                           "language": "python"}})
    path = tmp_path / "nbs" / "papers" / "demo.ipynb"
    path.parent.mkdir(parents=True)
    nbformat.write(nb, str(path))
    # as JupyterLab runs it: no parameters injected, the kernel in the notebook's folder -> figure shown, smoke outputs
    ran = nbclient.NotebookClient(nbformat.read(str(path), as_version=4), kernel_name=KERNEL_NAME, timeout=120,
                                  resources={"metadata": {"path": str(path.parent)}}).execute()
    assert _images(ran) == 1
    assert (tmp_path / "outputs" / "smoke" / "demo" / "fig_1.png").is_file()
    # as the runner runs it: the figure is a file beside the executed notebook, not a copy inside it
    run_paper("demo", "smoke", root=tmp_path)
    executed = nbformat.read(str(tmp_path / "outputs" / "smoke" / "demo" / "demo.ipynb"), as_version=4)
    assert _images(executed) == 0 and (tmp_path / "outputs" / "smoke" / "demo" / "fig_1.png").is_file()
    assert "ATTNREPRO_INLINE_FIGURES" not in os.environ   # set for the runner's kernel only
