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
