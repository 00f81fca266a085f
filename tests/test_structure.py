"""The library's import structure (issue #46): methods apart from their papers. Importing the method registry loads no
paper-reproduction module, no tables or statistics stack; and no module imports, at its top level or inside a function,
a module that imports it back (no circle: a deferred import that hides one counts too)."""
import ast
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "attnrepro"


def test_the_registry_loads_no_paper_reproduction_code():
    code = ("import sys, attnrepro.methods; bad = sorted(m for m in sys.modules if m.split('.')[0] in "
            "('pandas', 'scipy', 'matplotlib', 'papermill') or m.startswith(('attnrepro.papers', 'attnrepro.report', "
            "'attnrepro.scale', 'attnrepro.verdicts', 'attnrepro.runner'))); print(sorted({m.split('.')[0] if not "
            "m.startswith('attnrepro') else m for m in bad}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]", f"import attnrepro.methods loads {out}: the registry must stay apart from the paper code"


def _imports(path: Path) -> set[str]:
    "The attnrepro modules `path` imports, at its top level or inside a function (relative imports resolved)."
    mod = ".".join(path.relative_to(PKG.parent).with_suffix("").parts)
    pkg = mod.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.rsplit(".", node.level - 1)[0] if node.level > 1 else pkg
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            if target.startswith("attnrepro"):
                out.add(target)
                out |= {f"{target}.{a.name}" for a in node.names}   # `from attnrepro.papers import aal`
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("attnrepro")}
    return out


def test_no_import_circle():
    files = {".".join(p.relative_to(PKG.parent).with_suffix("").parts): p for p in PKG.rglob("*.py")
             if p.name not in ("_modidx.py", "__init__.py")}
    graph = {m: {t for t in _imports(p) if t in files and t != m} for m, p in files.items()}
    seen, stack, circles = set(), [], []

    def visit(m):
        if m in stack:
            circles.append(stack[stack.index(m):] + [m]); return
        if m in seen: return
        seen.add(m); stack.append(m)
        for t in sorted(graph[m]): visit(t)
        stack.pop()

    for m in sorted(graph): visit(m)
    assert not circles, f"import circles: {[' -> '.join(c) for c in circles]}"
    # the methods never import their papers
    for m in ("attnrepro.aal", "attnrepro.attndistill", "attnrepro.bootstrapping", "attnrepro.gta", "attnrepro.transfer",
              "attnrepro.methods"):
        assert not {t for t in graph[m] if t.startswith("attnrepro.papers")}, m


# issue #46: the hand-written library smaller than the 16.1k lines it had grown to (15,991 when it closed); raised on
# purpose by issue #44's CPU side (+280: the gpu queue's plan and report, runs a window stopped priced from what they
# did, the 32-px Tiny-ImageNet a GPU window can carry, a teacher not trained yet leaving its paper pending, the
# papers' gpu captions)
LIBRARY_LINES = 16_300


def test_the_library_stays_smaller_than_it_was():
    """Non-blank, non-comment lines of the exported library (docstrings count; the generated _modidx does not). A
    consolidation that lands keeps its gain: new code pays for itself, or the bound is raised on purpose, here."""
    def count(p):
        return sum(1 for line in p.read_text().splitlines() if line.strip() and not line.strip().startswith("#"))
    sizes = {p.relative_to(PKG).as_posix(): count(p) for p in PKG.rglob("*.py") if p.name != "_modidx.py"}
    total = sum(sizes.values())
    largest = sorted(sizes.items(), key=lambda kv: -kv[1])[:5]
    assert total < LIBRARY_LINES, f"the library holds {total} lines (bound {LIBRARY_LINES}); largest: {largest}"
