"""The library is only ever written by nbdev_export: exporting the notebooks must reproduce attnrepro/ exactly,
and the notebooks must be clean (no outputs, no execution counts, only `tags` kept in cell metadata)."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def test_export_reproduces_library(tmp_path):
    for name in ["settings.ini", "nbs", "attnrepro"]:
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / name)
    for py in (tmp_path / "attnrepro").rglob("*.py"):
        py.unlink()  # export must recreate every module from the notebooks alone
    subprocess.run([str(BIN / "nbdev_export")], cwd=tmp_path, check=True, capture_output=True)
    ours = {p.relative_to(ROOT / "attnrepro"): p.read_text() for p in (ROOT / "attnrepro").rglob("*.py")
            if "__pycache__" not in p.parts}
    exported = {p.relative_to(tmp_path / "attnrepro"): p.read_text() for p in (tmp_path / "attnrepro").rglob("*.py")
                if "__pycache__" not in p.parts}
    assert sorted(exported) == sorted(ours), "modules differ: run nbdev_export and commit attnrepro/"
    stale = [str(k) for k in ours if ours[k] != exported[k]]
    assert not stale, f"attnrepro/ out of sync with nbs/ for {stale}: run nbdev_export and commit"


def test_notebooks_are_clean():
    dirty = []
    for nb in sorted((ROOT / "nbs").rglob("*.ipynb")) + sorted((ROOT / "tests").rglob("*.ipynb")):
        if ".ipynb_checkpoints" in nb.parts:
            continue
        for cell in json.loads(nb.read_text())["cells"]:
            if cell["cell_type"] != "code":
                continue
            if cell.get("outputs") or cell.get("execution_count") or set(cell.get("metadata", {})) - {"tags"}:
                dirty.append(nb.name)
                break
    assert not dirty, f"run nbdev_clean on {dirty}"


def test_environment_yml_has_the_same_pins_as_settings_ini():
    import configparser
    cfg = configparser.ConfigParser(delimiters=["="])
    cfg.read(ROOT / "settings.ini")
    d = cfg["DEFAULT"]
    pins = set((d["requirements"] + " " + d["pip_requirements"] + " " + d["dev_requirements"]).split())
    env = {l.strip()[2:] for l in (ROOT / "environment.yml").read_text().splitlines() if "==" in l}
    assert pins == env, f"only in settings.ini: {pins - env}; only in environment.yml: {env - pins}"


def test_reported_numbers_parse():
    "Every transcription in papers/*/reported/ names its source and loads with attnrepro.report.load_reported."
    from attnrepro.report import load_reported
    files = sorted((ROOT / "papers").glob("*/reported/*.csv"))
    for f in files:
        assert f.read_text().startswith("# source:"), f"{f} must start with a '# source: ...' line"
        assert "#" not in "".join(l for l in f.read_text().splitlines() if not l.startswith("#")), \
            f"{f}: '#' inside a data line would be cut by comment='#'"
        df = load_reported(f.parent.parent.name, f.stem)
        assert len(df.columns) >= 1, f
