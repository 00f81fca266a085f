import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("ATTNREPRO_SHARED_DATA", ROOT.parent / "shared" / "data"))


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: takes more than ~30 s")
    config.addinivalue_line("markers", "browser: drives headless Chromium (JupyterLab, the static site); needs "
                            "Debian's chromium (`make browser`)")


@pytest.fixture
def shared_data():
    "The offline data folder beside the project; tests needing it skip when it is absent."
    if not (SHARED_DATA / "README.md").exists():
        pytest.skip(f"shared offline data not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(autouse=True)
def _close_figures():
    "Figures a test draws through pyplot are closed after it (the library's plot functions return open figures)."
    yield
    import sys
    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close("all")
