"""The sampling chapter in a real browser: JupyterLab + headless Chromium, sliders moved by keyboard.

Starts JupyterLab on 127.0.0.1 (free port, random token, every Jupyter/IPython dir inside a temp dir)
on a temp copy of notebooks/09_sampling.ipynb, opens it in Debian's chromium through playwright (the
browser playwright would download is never used), runs all cells from the Run menu, moves the
temperature and top-p sliders of the live panel, and checks that the distribution (the chart and its
summary line) and the sampled text change, that the panel keeps its height (one chart image updated in
place) and that its status line reads "computing..." while a redraw runs, all with JupyterLab's default
notebook windowing. Then it saves the notebook the way a learner does, shuts its kernel down and opens it
again: where the panel was, the saved stand-in line must show, not "Error displaying widget: model not
found". Saves a screenshot of the panel as
09_browser_sampling.png where the figures go (LLM_COURSE_FIGURES: a temp folder in the test suite, so the
test leaves the git tree clean). Every request that is not to 127.0.0.1 is blocked.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

import pytest

from helpers.course.widgets import PANEL_MODEL_ID, PANEL_TEXT
from helpers.paths import REPO, figures_dir

NOTEBOOK = REPO / "notebooks" / "09_sampling.ipynb"
SCREENSHOT = figures_dir() / "09_browser_sampling.png"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
RUN_ALL_TIMEOUT_S = 420  # the notebook takes well under a minute on a quiet machine; shared CI machines are not quiet

pytestmark = pytest.mark.browser


def chromium_or_skip() -> str:
    path = shutil.which("chromium")
    if path is None:
        pytest.skip("chromium is not installed (CI installs it with `apt-get install -y chromium`)")
    pytest.importorskip("playwright.sync_api", reason="the playwright Python package is not installed")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def api(base: str, token: str, path: str, method: str = "GET"):
    req = urllib.request.Request(f"{base}{path}", method=method, headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(req, timeout=5) as r:
        body = r.read()
    return json.loads(body) if body else None


def write_settings(root: Path) -> dict:
    """Jupyter, JupyterLab and IPython dirs inside `root`, with settings that keep the page quiet."""
    dirs = {name: root / name for name in ("config", "data", "runtime", "lab-settings", "lab-workspaces", "ipython")}
    for d in dirs.values():
        d.mkdir(parents=True)
    settings = dirs["lab-settings"] / "@jupyterlab"
    (settings / "apputils-extension").mkdir(parents=True)
    (settings / "apputils-extension" / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False})
    )  # no news pop-up over the page
    # the notebook's windowing is left at JupyterLab's default: the panel must work the way learners see it
    return dirs


@pytest.fixture
def jupyterlab(tmp_path):
    """A JupyterLab server on a copy of the notebook; yields (base_url, token, the copy's path); stops only this
    server."""
    work = tmp_path / "notebooks"
    work.mkdir()
    shutil.copy(NOTEBOOK, work / NOTEBOOK.name)  # JupyterLab autosaves into what it opens
    dirs = write_settings(tmp_path)
    port, token = free_port(), secrets.token_hex(16)
    env = dict(
        os.environ,
        JUPYTER_CONFIG_DIR=str(dirs["config"]),
        JUPYTER_DATA_DIR=str(dirs["data"]),
        JUPYTER_RUNTIME_DIR=str(dirs["runtime"]),
        JUPYTERLAB_SETTINGS_DIR=str(dirs["lab-settings"]),
        JUPYTERLAB_WORKSPACES_DIR=str(dirs["lab-workspaces"]),
        IPYTHONDIR=str(dirs["ipython"]),
        JUPYTER_PLATFORM_DIRS="1",
        PYTHONHASHSEED="0",
        OMP_NUM_THREADS="1",
    )  # one thread: as fast for this small model, and robust on a busy machine
    log = open(tmp_path / "jupyterlab.log", "w")
    cmd = [
        sys.executable,
        "-m",
        "jupyter",
        "lab",
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={work}",
        "--allow-root",
        "--LabApp.news_url=",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]
    server = subprocess.Popen(cmd, env=env, cwd=work, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"JupyterLab exited with {server.returncode}; see {tmp_path / 'jupyterlab.log'}")
            try:
                api(base, token, "/api/status")
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)
        yield base, token, work / NOTEBOOK.name
    finally:
        try:
            api(base, token, "/api/shutdown", method="POST")  # also shuts down its kernels
            server.wait(timeout=15)
        except Exception:
            if server.poll() is None:
                os.killpg(server.pid, signal.SIGTERM)  # the process group of this server only
                try:
                    server.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(server.pid, signal.SIGKILL)
        log.close()


def wait_for_idle_kernel(page, base, token, timeout=120):
    """The toolbar reads "idle" before a kernel exists, so ask the server: a session with an idle kernel.

    Waits with page.wait_for_timeout, never time.sleep: the sync API runs the route handler (and so lets
    the page's requests through) only while a playwright call is in progress."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sessions = [
            s for s in api(base, token, "/api/sessions") if NOTEBOOK.name in (s.get("name"), Path(s["path"]).name)
        ]  # JupyterLab 4: path may be an id
        if sessions and sessions[0]["kernel"]["execution_state"] == "idle":
            return
        page.wait_for_timeout(500)
    raise TimeoutError("no idle kernel for the notebook")


def prompts(page) -> list[str]:
    return page.locator(".jp-Notebook .jp-CodeCell .jp-InputArea-prompt").all_inner_texts()


def run_all_cells(page, base, token):
    """Run All from the menu; done when the kernel has stayed idle for 3 s and the last cell has a number.

    With JupyterLab's default windowing, cells far from the viewport are not rendered (their prompts read
    empty), so completion is judged from the kernel's state, not from every prompt."""
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
    page.wait_for_timeout(2000)
    deadline = time.monotonic() + RUN_ALL_TIMEOUT_S
    idle_since = None
    while time.monotonic() < deadline:
        texts = [t.strip() for t in prompts(page)]
        sessions = [
            s for s in api(base, token, "/api/sessions") if NOTEBOOK.name in (s.get("name"), Path(s["path"]).name)
        ]
        idle = bool(sessions) and sessions[0]["kernel"]["execution_state"] == "idle"
        if idle and texts and "[*]:" not in texts and re.fullmatch(r"\[\d+\]:", texts[-1]):
            idle_since = idle_since or time.monotonic()
            if time.monotonic() - idle_since > 3:
                return int(texts[-1][1:-2])  # the last cell's execution count
        else:
            idle_since = None
        page.wait_for_timeout(1000)
    raise TimeoutError(f"cells still running or unrun after {RUN_ALL_TIMEOUT_S} s: {prompts(page)}")


def scroll_to(page, locator, steps: int = 200):
    """Scroll the notebook from the top until `locator` is rendered (windowing renders only what is near)."""
    page.evaluate("document.querySelectorAll('.jp-WindowedPanel-outer').forEach(e => e.scrollTop = 0)")
    for _ in range(steps):
        if locator.count() > 0:
            # the top of the element at the top of the view: "if needed" leaves a panel that peeks in at the
            # bottom where it is, and the part of it below the view is not rendered (empty inner_text)
            locator.first.evaluate("e => e.scrollIntoView({block: 'start'})")
            page.wait_for_timeout(300)
            return
        page.evaluate("document.querySelectorAll('.jp-WindowedPanel-outer').forEach(e => e.scrollTop += 400)")
        page.wait_for_timeout(150)
    raise TimeoutError("the sampling panel was never rendered")


def panel_state(panel) -> tuple[str, str]:
    """(the panel's summary text, the src of its one chart image)."""
    return panel.locator(".sampling-panel-summary").inner_text(), panel.locator("img").first.get_attribute("src")


def panel_height(panel) -> float:
    return panel.bounding_box()["height"]


def move_slider(page, panel, index: int, key: str, presses: int, expect: str, before: tuple[str, str], height: float):
    """Press a slider's key; wait for the summary to name the new setting; check the panel kept its height
    at every poll on the way (the chart is updated in place, never cleared and redrawn) and that the status
    line said "computing..." at some poll before the new setting showed (each press is one redraw).
    Returns the new (summary, chart) state."""
    handle = panel.locator(".noUi-handle[role='slider']").nth(index)
    handle.focus()
    for _ in range(presses):
        handle.press(key)
    busy_seen = False
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # the summary line names the new setting once the redraw is done
        assert panel.locator("img").count() == 1
        assert abs(panel_height(panel) - height) < 1, (panel_height(panel), height)
        busy_seen = busy_seen or "computing..." in panel.locator(".sampling-panel-status").inner_text()
        text = panel.locator(".sampling-panel-summary").inner_text()
        if expect in text:
            state = panel_state(panel)
            if state != before:
                assert busy_seen, "the status line never said computing... while the panel redrew"
                return state
        page.wait_for_timeout(100)
    raise TimeoutError(f"the panel never showed {expect!r}; it shows {panel.inner_text()[:300]!r}")


def widget_errors_top_to_bottom(page, steps: int = 400) -> list[str]:
    """Scroll the notebook from top to bottom (windowing renders only what is near) and return the input of
    every code cell whose output reads "Error displaying widget"."""
    page.evaluate("document.querySelectorAll('.jp-WindowedPanel-outer').forEach(e => e.scrollTop = 0)")
    broken = set()
    for _ in range(steps):
        page.wait_for_timeout(150)
        for cell in page.locator(
            ".jp-CodeCell", has=page.locator(".jp-OutputArea-output", has_text="Error displaying widget")
        ).all():
            broken.add(cell.locator(".jp-InputArea").inner_text()[:80])
        at_end = page.evaluate(
            "Array.from(document.querySelectorAll('.jp-WindowedPanel-outer')).every("
            "e => e.scrollTop + e.clientHeight >= e.scrollHeight - 2)"
        )
        if at_end:
            return sorted(broken)
        page.evaluate("document.querySelectorAll('.jp-WindowedPanel-outer').forEach(e => e.scrollTop += 400)")
    raise TimeoutError("never reached the end of the notebook")


def save_and_reopen(context, page, base, token, saved: Path):
    """Save from the page (File > Save Notebook), shut the kernel down, and open the notebook in a new page.
    Returns the new page once its fresh kernel is idle."""
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^File$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Save Notebook$")).click()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the saved file holds the live panel's view, under its model id
        outputs = [out for cell in json.loads(saved.read_text())["cells"] for out in cell.get("outputs", [])]
        views = [
            out["data"]["application/vnd.jupyter.widget-view+json"]
            for out in outputs
            if "application/vnd.jupyter.widget-view+json" in out.get("data", {})
        ]
        if any(view.get("model_id") == PANEL_MODEL_ID for view in views):
            break
        page.wait_for_timeout(500)
    else:
        raise TimeoutError("the saved notebook never held the live panel's view")
    for session in api(base, token, "/api/sessions"):
        api(base, token, f"/api/sessions/{session['id']}", method="DELETE")  # shuts its kernel down
    page.close()
    reopened = context.new_page()
    reopened.goto(f"{base}/lab/tree/{NOTEBOOK.name}?token={token}")
    reopened.locator(".jp-Notebook .jp-CodeCell").first.wait_for(timeout=120_000)
    wait_for_idle_kernel(reopened, base, token)
    return reopened


def kept_line(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("kept "))


def continuation(text: str) -> str:
    return text.split("sampled continuation:", 1)[1]


def test_sampling_panel_in_jupyterlab(jupyterlab):
    chromium = chromium_or_skip()
    from playwright.sync_api import sync_playwright

    base, token, saved = jupyterlab
    blocked = []

    def only_localhost(route):
        if urlparse(route.request.url).hostname == "127.0.0.1":
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort()

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS, headless=True)
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 1000})
            context.route("**/*", only_localhost)
            page = context.new_page()
            page.goto(f"{base}/lab/tree/{NOTEBOOK.name}?token={token}")
            page.locator(".jp-Notebook .jp-CodeCell").first.wait_for(timeout=120_000)
            wait_for_idle_kernel(page, base, token)
            n_cells = run_all_cells(page, base, token)
            assert n_cells > 20
            errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.error']")
            assert errors.count() == 0, errors.first.inner_text()

            panel = page.locator(".sampling-panel")
            scroll_to(page, panel)
            assert panel.count() == 1
            panel.locator("img").first.wait_for(timeout=60_000)
            start = panel_state(panel)
            assert "temperature=0.80  top_p=0.90" in start[0]
            height = panel_height(panel)
            assert panel.locator("img").first.bounding_box()["height"] == pytest.approx(340, abs=1)  # fixed size

            # temperature 0.80 -> 1.20 (step 0.05), then top-p 0.90 -> 0.50; the height never moves
            hot = move_slider(page, panel, 0, "ArrowRight", 8, "temperature=1.20  top_p=0.90", start, height)
            assert hot[1] != start[1]  # the chart was redrawn
            assert kept_line(hot[0]) != kept_line(start[0])  # the kept set and its probabilities changed
            cut = move_slider(page, panel, 1, "ArrowLeft", 8, "temperature=1.20  top_p=0.50", hot, height)
            assert cut[1] != hot[1]
            assert kept_line(cut[0]) != kept_line(hot[0])
            assert continuation(cut[0]) != continuation(start[0])  # and a different text was sampled
            SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
            panel.screenshot(path=str(SCREENSHOT))

            # the learner saves, closes, and comes back later: a fresh kernel, no live panel
            page = save_and_reopen(context, page, base, token, saved)
            stand_in = page.locator(".jp-OutputArea-output", has_text=PANEL_TEXT)
            scroll_to(page, stand_in)
            stand_in.first.wait_for(timeout=60_000)
            panel_cell = page.locator(".jp-CodeCell", has=stand_in)
            assert panel_cell.count() == 1 and "sampling_panel(" in panel_cell.inner_text()
            assert "Error displaying widget" not in panel_cell.inner_text()
            assert widget_errors_top_to_bottom(page) == []  # nor under a progress bar, anywhere
        finally:
            browser.close()
