"""attnrepro as a wheel user meets it: built from this checkout, installed into a fresh virtual environment in a
temporary folder (offline: `pip install --no-deps --no-index`; the dependencies come from the current environment's
site-packages, added as a plain path), and used from outside the clone."""
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow   # about 80 s on a busy 2-core CPU: a wheel build, a venv, two fresh imports of torch

ROOT = Path(__file__).resolve().parents[1]
BUILD_FILES = ("setup.py", "settings.ini", "pyproject.toml", "MANIFEST.in", "README.md")


def _run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert r.returncode == 0, f"{cmd} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


@pytest.fixture(scope="module")
def wheel_python(tmp_path_factory):
    "The python of a temporary venv holding only the attnrepro wheel (the rest of its imports: this venv's packages)."
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"   # a copy of what the wheel is built from: the build leaves no build/ or egg-info in the clone
    src.mkdir()
    for f in BUILD_FILES:
        shutil.copy2(ROOT / f, src / f)
    shutil.copytree(ROOT / "attnrepro", src / "attnrepro", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-index", "--no-build-isolation", "-q",
          "-w", str(tmp / "dist"), str(src)])
    wheel, = (tmp / "dist").glob("attnrepro-*.whl")
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    py = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index", "-q", str(wheel)])
    # this venv's packages (torch, timm, ...) as a plain path: its .pth files, among them the editable install of
    # this clone, are not processed, so `import attnrepro` finds the wheel's copy
    purelib = _run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    deps = {sysconfig.get_paths()["purelib"], *site.getsitepackages()}
    (Path(purelib) / "_attnrepro_test_deps.pth").write_text("\n".join(sorted(deps)) + "\n")
    return py, tmp


def _outside(py, tmp, code: str, **env):
    "Run `code` with the wheel's python in a folder outside the clone, with a fresh cache and no teacher variables."
    work = tmp / "elsewhere"
    work.mkdir(exist_ok=True)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ATTNREPRO_") and k != "PYTHONPATH"}
    clean |= dict(ATTNREPRO_CACHE=str(tmp / "cache"), **env)
    return subprocess.run([str(py), "-c", textwrap.dedent(code)], cwd=work, env=clean, capture_output=True, text=True,
                          timeout=300)


def test_unknown_committed_teacher_names_where_it_looked_and_the_variables(wheel_python):
    py, tmp = wheel_python
    r = _outside(py, tmp, """
        import attnrepro
        from attnrepro.pretrain import get_teacher
        print("package:", attnrepro.__file__)
        try: get_teacher("mae_cifar10_mini")
        except ValueError as e: print("error:", e)
        else: print("loaded")
        """)
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout
    assert f"package: {tmp / 'venv'}" in out, f"attnrepro was not imported from the wheel:\n{out}"
    assert "error: Unknown teacher 'mae_cifar10_mini'" in out, out
    assert str(tmp / "cache" / "teachers") in out, f"the error does not name the folders looked in:\n{out}"
    assert "ATTNREPRO_TEACHERS" in out and "ATTNREPRO_TEACHER_URL" in out, out
    assert "outputs/teachers/weights" in out and "not in the installed package" in out, out


def test_committed_teacher_loads_from_the_installed_wheel_with_attnrepro_teachers(wheel_python):
    "What the error advises works: ATTNREPRO_TEACHERS pointed at the clone's committed teachers."
    py, tmp = wheel_python
    weights = ROOT / "outputs" / "teachers" / "weights"
    if not (weights / "mae_cifar10_mini.safetensors").is_file():
        pytest.skip(f"no committed mae_cifar10_mini in {weights}")
    r = _outside(py, tmp, """
        from attnrepro.pretrain import get_teacher
        t = get_teacher("mae_cifar10_mini")
        print("loaded", t.teacher_cfg["name"])
        """, ATTNREPRO_TEACHERS=str(weights))
    assert r.returncode == 0 and "loaded mae_cifar10_mini" in r.stdout, r.stdout + r.stderr[-3000:]
