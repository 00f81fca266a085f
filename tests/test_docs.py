"""The README and docs/ as a reader uses them: every shell command they show names something that exists (a make
target, a file, a tool), and every relative link resolves. The `attnrepro` commands themselves are parsed by
tests/test_runner.py, the Python examples run in tests/test_methods.py, and the generated blocks are checked for
staleness by tests/test_results.py."""
import re
import shlex
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 150


def _shell_lines(text: str) -> list[str]:
    "The command lines of a page's bash blocks, comments dropped."
    return [l.split(" #")[0].strip() for b in re.findall(r"```bash\n(.*?)```", text, re.S) for l in b.splitlines()
            if l.strip() and not l.strip().startswith("#")]


def _make_targets() -> set[str]:
    return set(re.findall(r"^([A-Za-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))


def _check(cmd: str) -> str | None:
    "Why `cmd` names something missing, or None when all it names exists."
    words = shlex.split(cmd)
    while words and re.match(r"^[A-Z_]+=", words[0]): words = words[1:]   # VAR=value prefixes
    if not words: return "empty command"
    exe, args = words[0], words[1:]
    if exe.endswith("bin/attnrepro"): return None                       # parsed by test_runner
    if exe == "make":
        missing = [a for a in args if "=" not in a and a not in _make_targets()]
        return f"no make target {missing}" if missing else None
    if exe == "bash": return None if (ROOT / args[0]).is_file() else f"no script {args[0]}"
    if exe == "conda": return None if (ROOT / args[args.index("-f") + 1]).is_file() else "no environment file"
    if exe == "python" and args[:2] == ["-m", "ipykernel"]: return None  # what `make setup` runs
    if exe == "cd":   # cd DIR && TOOL --path NOTEBOOK
        d = ROOT / args[0]
        tool = d / args[2]
        tool_ok = tool.exists() or (".venv/bin/" in args[2] and (Path(sys.executable).parent / tool.name).exists())
        nb = d / args[args.index("--path") + 1] if "--path" in args else d
        return None if args[1] == "&&" and tool_ok and nb.exists() else f"{tool} or {nb} missing"
    return f"unknown command {exe!r}: teach tests/test_docs.py to check it"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_shell_command_names_what_exists(page):
    bad = [(c, why) for c in _shell_lines(page.read_text()) if (why := _check(c))]
    assert not bad, f"{page.name}: {bad}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page):
    links = re.findall(r"\]\(([^)\s#]+)(?:#[^)]*)?\)", page.read_text())
    missing = [l for l in links if not re.match(r"^[a-z]+:", l) and not (page.parent / l).exists()]
    assert not missing, f"{page.name} links to missing files: {missing}"


def test_readme_is_short_and_links_every_docs_page():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= README_MAX_LINES, f"README.md has {len(text.splitlines())} lines"
    for page in PAGES[1:]:
        assert f"(docs/{page.name})" in text, f"README.md does not link docs/{page.name}"
    assert "make reproduce" in text and "make test" in text
