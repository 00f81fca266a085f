"""Each library notebook's own cells (examples with asserts) run as tests, as `nbdev_test` does."""
import subprocess
import sys
from pathlib import Path

import pytest

NBS = Path(__file__).resolve().parents[1] / "nbs"
NOTEBOOKS = sorted(p.name for p in NBS.glob("[0-9]*.ipynb"))


@pytest.mark.parametrize("nb", NOTEBOOKS)
def test_notebook_cells(nb):
    r = subprocess.run([str(Path(sys.executable).parent / "nbdev_test"), "--path", nb], cwd=NBS,
                       capture_output=True, text=True)
    assert r.returncode == 0, f"nbdev_test {nb} failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"


def test_paper_notebooks_stay_lean():
    """The paper notebooks read as papers: pipeline code lives in the library (issue #17). Each code cell stays under
    40 non-blank lines and all of them together under 1,245, half of the 2,491 before the experiment layer."""
    import json
    sizes = {}
    for nb in sorted((NBS / "papers").glob("*.ipynb")):
        cells = json.loads(nb.read_text())["cells"]
        sizes[nb.stem] = [sum(1 for l in "".join(c["source"]).splitlines() if l.strip()) for c in cells
                          if c["cell_type"] == "code"]
    long_cells = {k: [n for n in v if n > 40] for k, v in sizes.items() if any(n > 40 for n in v)}
    assert not long_cells, f"paper notebook cells over 40 code lines (move code into the library): {long_cells}"
    total = sum(map(sum, sizes.values()))
    assert total <= 1245, f"paper notebooks hold {total} code lines (limit 1,245): move pipeline code into the library"
