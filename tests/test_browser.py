"""The browser test: JupyterLab and the static results site in headless Chromium.

JupyterLab is started on 127.0.0.1 with a token at the project root, as `make lab` starts it, and Debian's `chromium`
(driven by Playwright, which never downloads a browser here) opens `nbs/papers/gta.ipynb` and clicks Run > Run All
Cells, as a person would: no parameters are injected, so the notebook runs at its default (smoke) profile and writes
`outputs/smoke/gta/`. It must select the project's kernel by itself, finish every cell without an error and show a
figure. Then the site `attnrepro site` builds from the committed results must read well at 1400 x 900 (claims-table rows
of at most 6 text lines, at least 8 claims on the first screen, papers first, a paper's page opening with its claims)
and load every image of its index and of a paper page. Screenshots are saved in pytest's temp dir (the path is
printed; pytest keeps the last three runs' folders)."""
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
NOTEBOOK = "nbs/papers/gta.ipynb"
START_TIMEOUT_S, KERNEL_TIMEOUT_S, RUN_TIMEOUT_S = 120, 120, 600

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def chromium_path() -> str:
    path = os.environ.get("ATTNREPRO_CHROMIUM") or shutil.which("chromium")
    if not path:
        pytest.fail("the browser test needs Debian's chromium, which is not installed: run `make browser` (as root it "
                    "runs `apt-get install -y chromium`; `make test` does it first), or set ATTNREPRO_CHROMIUM to a "
                    "Chromium binary", pytrace=False)
    return path


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("the browser test needs Playwright: `make setup` installs it (pip install -e '.[dev]')", pytrace=False)
    exe = chromium_path()
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=["--disable-dev-shm-usage"])
        yield b
        b.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_settings(d: Path) -> None:
    "JupyterLab user settings for the test: no news or update checks (offline), no autosave into nbs/."
    for plugin, values in {"apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
                           "docmanager-extension/plugin": {"autosave": False}}.items():
        f = d / "@jupyterlab" / f"{plugin}.jupyterlab-settings"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps(values))


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server at the project root, as `make lab` starts it, with its own config, settings and file checkpoints
    (no .ipynb_checkpoints/ left in nbs/); yields (url, token, log)."""
    tmp = tmp_path_factory.mktemp("jupyterlab")
    _write_settings(tmp / "settings")
    token, port = secrets.token_hex(16), _free_port()
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(tmp / "config"), JUPYTER_RUNTIME_DIR=str(tmp / "runtime"),
               JUPYTERLAB_SETTINGS_DIR=str(tmp / "settings"), JUPYTERLAB_WORKSPACES_DIR=str(tmp / "workspaces"))
    cmd = [str(BIN / "jupyter"), "lab", "--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
           "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={ROOT}",
           "--MappingKernelManager.default_kernel_name=attnrepro", "--LabApp.expose_app_in_browser=True",
           "--LabApp.extension_manager=readonly", f"--FileCheckpoints.checkpoint_dir={tmp / 'checkpoints'}"]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    log = tmp / "jupyterlab.log"
    url = f"http://127.0.0.1:{port}"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"jupyter lab exited ({proc.returncode}):\n{log.read_text()[-3000:]}", pytrace=False)
            try:
                urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=5)
                break
            except OSError:
                if time.time() > deadline:
                    pytest.fail(f"jupyter lab did not answer in {START_TIMEOUT_S} s:\n{log.read_text()[-3000:]}",
                                pytrace=False)
                time.sleep(0.5)
        yield url, token, log
    finally:
        try:   # shuts down the kernels too
            urllib.request.urlopen(urllib.request.Request(f"{url}/api/shutdown?token={token}", method="POST"), timeout=10)
            proc.wait(30)
        except Exception:
            proc.terminate()
            try: proc.wait(30)
            except subprocess.TimeoutExpired: proc.kill()


# The notebook as JupyterLab holds it (the app is exposed to the page by --LabApp.expose_app_in_browser).
NOTEBOOK_STATE = """() => {
  const nb = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  if (!nb || !nb.sessionContext || !nb.content || !nb.content.model) return null;
  const kernel = nb.sessionContext.session && nb.sessionContext.session.kernel;
  const code = [...nb.content.model.cells].filter(c => c.type === 'code');
  return {path: nb.context.path, kernel: kernel ? kernel.name : null, status: nb.sessionContext.kernelDisplayStatus,
          kernel_display: nb.sessionContext.kernelDisplayName, n_code: code.length,
          executed: code.filter(c => c.executionCount !== null).length,
          running: code.filter(c => c.executionState === 'running').length,
          last_executed: code.length > 0 && code[code.length - 1].executionCount !== null,
          errors: code.map((c, i) => ({cell: i, errors: c.outputs.toJSON().filter(o => o.output_type === 'error')
                                                                  .map(o => o.ename + ': ' + o.evalue)}))
                      .filter(e => e.errors.length)};
}"""


def _wait_state(page, done, timeout_s: float, what: str) -> dict:
    deadline = time.time() + timeout_s
    while True:
        state = page.evaluate(NOTEBOOK_STATE)
        if state and done(state):
            return state
        if time.time() > deadline:
            pytest.fail(f"{what}: not done after {timeout_s:.0f} s; JupyterLab shows {state}", pytrace=False)
        time.sleep(1)


def test_gta_notebook_runs_all_in_jupyterlab(browser, lab, tmp_path):   # browser first: no chromium, no server
    url, token, log = lab
    started = time.time()
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    page.goto(f"{url}/lab/tree/{NOTEBOOK}?token={token}&reset", timeout=START_TIMEOUT_S * 1000)
    state = _wait_state(page, lambda s: s["kernel"] and s["status"] == "idle", KERNEL_TIMEOUT_S,
                        "the notebook's kernel (is the attnrepro kernel installed? `make setup`)")
    assert state["path"] == NOTEBOOK and state["kernel"] == "attnrepro", state   # picked from the kernelspec, no dialog
    assert state["executed"] == 0, state
    page.get_by_role("menuitem", name="Run", exact=True).click()      # Run > Run All Cells, as a person does
    page.locator("li[data-command='runmenu:run-all']").click()
    state = _wait_state(page, lambda s: s["errors"] or (s["last_executed"] and not s["running"] and s["status"] == "idle"),
                        RUN_TIMEOUT_S, f"Run All of {NOTEBOOK}")
    run_s = time.time() - started
    assert not state["errors"], f"cells show errors: {state['errors']}"
    assert state["executed"] == state["n_code"], state
    # a figure rendered: PaperRun.figure shows each saved figure under its cell
    images = page.evaluate("() => [...document.querySelectorAll('.jp-OutputArea-output img')]"
                           ".map(i => ({w: i.naturalWidth, ok: i.complete && i.naturalWidth > 0}))")
    assert images and all(i["ok"] for i in images), f"no figure rendered in the notebook: {images}"
    page.evaluate("""async () => {   // the last figure and the cell that made it in view, for the screenshot
      const nb = window.jupyterapp.shell.currentWidget.content;
      const i = nb.widgets.map(w => !!w.node.querySelector('.jp-OutputArea-output img')).lastIndexOf(true);
      nb.activeCellIndex = i; await nb.scrollToItem(i, 'start');
      await new Promise(r => setTimeout(r, 300));
      nb.widgets[i].node.querySelector('.jp-OutputArea-output img').scrollIntoView({block: 'end'}); }""")
    page.wait_for_timeout(1000)
    shot = tmp_path / "jupyterlab_gta.png"
    page.screenshot(path=str(shot))
    print(f"\nRun All of {NOTEBOOK} in JupyterLab: {run_s:.0f} s, {state['n_code']} code cells, "
          f"{len(images)} figures; screenshot {shot}")
    # default parameters: the smoke profile's outputs under the project root, whatever the kernel's cwd
    out = ROOT / "outputs" / "smoke" / "gta"
    figs = sorted(out.glob("fig_*.png"))
    assert figs and all(f.stat().st_mtime >= started - 1 for f in figs), f"no fresh figures in {out}"
    assert (out / "claims.csv").stat().st_mtime >= started - 1
    page.close()


# every claims-table row: its height in text lines of its claim cell, and where it stands on the first screen
CLAIM_ROWS = """() => [...document.querySelectorAll('table.claims tr.claim')].map(r => {
  const lh = parseFloat(getComputedStyle(r.querySelector('td.claim')).lineHeight), b = r.getBoundingClientRect();
  return {claim: r.dataset.paper + ' ' + r.dataset.claim, lines: b.height / lh, bottom: b.bottom}; })"""
SITE_VIEWPORT = {"width": 1400, "height": 900}
MAX_ROW_LINES, MIN_FIRST_SCREEN_CLAIMS = 6, 8


def test_site_index_and_paper_page_load_their_images(browser, tmp_path):
    """The site of the committed results reads well at 1400 x 900: no claims-table row taller than 6 text lines, at
    least 8 claims on the first screen, the papers before the teachers and the head to head, a paper's page opening
    with its claims; every image loads. Screenshots of the index and of a paper's page are kept in pytest's temp dir."""
    from attnrepro.site import build_site
    index = build_site("mini", out=tmp_path / "site", log=lambda s: None)   # the committed results, as `attnrepro site`
    page = browser.new_page(viewport=SITE_VIEWPORT)
    outside = []   # the pages ask a CDN for MathJax and require.js; offline here, so those requests are refused
    page.route("**/*", lambda r: r.continue_() if r.request.url.startswith("file:") else
               (outside.append(r.request.url), r.abort()))
    shots = {}
    for name, path in [("index", index), ("gta", index.parent / "gta" / "index.html")]:
        page.goto(path.as_uri())
        page.wait_for_load_state("load")
        images = page.evaluate("() => [...document.images].map(i => ({src: i.getAttribute('src'), "
                               "ok: i.complete && i.naturalWidth > 0}))")
        broken = [i["src"] for i in images if not i["ok"]]
        assert images and not broken, f"{path}: {len(images)} images, broken: {broken}"
        rows = page.evaluate(CLAIM_ROWS)
        assert rows, f"{path}: no claims table"
        tall = [r for r in rows if r["lines"] > MAX_ROW_LINES]
        assert not tall, f"{path}: claims-table rows taller than {MAX_ROW_LINES} lines at 1400 px: {tall}"
        shots[name] = tmp_path / f"site_{name}.png"
        page.screenshot(path=str(shots[name]), full_page=False)
        if name == "index":
            index_rows, first = rows, sum(r["bottom"] <= SITE_VIEWPORT["height"] for r in rows)
            assert first >= MIN_FIRST_SCREEN_CLAIMS, f"the first screen shows {first} claims, fewer than {MIN_FIRST_SCREEN_CLAIMS}"
            papers = list(dict.fromkeys(r["claim"].split()[0] for r in rows))
            assert papers.index("teachers") > papers.index("gta") and papers.index("head_to_head") > papers.index("gta"), papers
        else:   # the paper's claims open its page, before the executed notebook
            text = page.inner_text("body")
            assert text.index("The paper's claims, checked") < text.index("The executed notebook"), text[:2000]
    page.goto(index.as_uri())
    text = page.inner_text("body")
    assert "gta" in text and "[95 % CI]" in text and "regime at mini" in text
    links = page.evaluate("() => [...document.querySelectorAll('a')].map(a => a.getAttribute('href'))")
    assert "gta/index.html" in links
    print(f"\nsite: {index} ({len(outside)} CDN requests refused); {len(index_rows)} claims, the first screen shows {first}; "
          f"screenshots {shots['index']} and {shots['gta']}")
    page.close()
