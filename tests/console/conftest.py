"""A real ``castor serve --console`` with busy sessions, shared by the console tests."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from castor.client import Client
from tests.support.waiting import wait_for

CASTOR = [sys.executable, "-m", "castor"]
#: The bundled build loop (planner, builder, reviewer, ... with a rework edge): a graph worth drawing.
LOADOUT = "build"


#: console base URL -> the token castor made for it (a console always has one; tests/console's
#: HTTP helper presents it unless a test sends its own credentials)
TOKENS: dict[str, str] = {}
TOKEN_FILES: dict[str, Path] = {}


@dataclass
class Live:
    url: str
    sock: Path
    client: Client
    token: str = ""
    casts: dict[str, list[str]] = field(default_factory=dict)  # session id -> cast ids
    projects: dict[str, Path] = field(default_factory=dict)


def serve_env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["HOME"] = str(tmp_path / "home")
    env["PI_CODING_AGENT_DIR"] = str(tmp_path / "home" / ".pi" / "agent")
    env.pop("MATERIA_CONFIG", None)
    return env


def start_console(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen, str, Path]:
    sock = tmp_path / "castor.sock"
    (tmp_path / "home").mkdir(exist_ok=True)  # where castor keeps a token file it makes (~/.castor/run)
    server = subprocess.Popen([*CASTOR, "serve", "--socket", str(sock), "--console", "127.0.0.1:0", *extra],
                              env=serve_env(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    line = server.stderr.readline()
    match = re.search(r"console: (http://127\.0\.0\.1:\d+/)(?: \(token file: ([^)]+)\))?", line)
    if match is None:
        server.kill()
        raise AssertionError(f"no console URL in {line!r}: {server.stderr.read()[-2000:]}")
    if match.group(2):
        TOKENS[match.group(1)] = Path(match.group(2)).read_text().strip()
        TOKEN_FILES[match.group(1)] = Path(match.group(2))
    return server, match.group(1), sock


def stop(server: subprocess.Popen) -> None:
    server.send_signal(signal.SIGTERM)
    try:
        server.wait(30)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait(10)


def open_busy(client: Client, tmp_path: Path, sessions: int, casts: int) -> Live:
    """``sessions`` sessions with ``casts`` casts each, all waiting on agent turns no one answers."""
    turns: list[dict] = []
    client.on_notification("agent.run_turn", turns.append)
    client.on_request("session.append_entry", lambda p: {"ok": True, "entry_id": "e"})
    live = Live(url="", sock=Path(), client=client)
    for n in range(sessions):
        sid = f"session-{n + 1}"
        project = tmp_path / f"project-{n + 1}"
        project.mkdir()
        client.call("session.open", {"session_id": sid, "cwd": str(project), "trusted": True}, timeout=20)
        client.call("loadout.set", {"session_id": sid, "cwd": str(project), "name": LOADOUT}, timeout=20)
        live.projects[sid] = project
        live.casts[sid] = []
        for c in range(casts):
            started = client.call("cast.start", {"session_id": sid, "cwd": str(project), "request": f"task {c}"},
                                  timeout=20)
            live.casts[sid].append(started.get("cast_id") or started["cast"]["cast_id"])
    wait_for(lambda: len(turns) >= sessions * casts, timeout=30, what="every cast's first agent turn")
    return live


@pytest.fixture
def busy_console(tmp_path):
    """3 sessions x 2 casts in flight behind a console; faults allowed."""
    server, url, sock = start_console(tmp_path, "--allow-faults", "--max-casts-per-session", "2")
    client = Client.connect_unix(str(sock))
    try:
        live = open_busy(client, tmp_path, 3, 2)
        live.url, live.sock, live.token = url, sock, TOKENS.get(url, "")
        yield live
    finally:
        client.close()
        stop(server)


# The browser tests' Chromium: Debian's chromium + chromium-driver (.ci/install-browser.sh), driven
# by selenium with both paths given, so nothing downloads a browser or a driver.
CHROMIUM = os.environ.get("CASTOR_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("CASTOR_CHROMEDRIVER", "/usr/bin/chromedriver")


def _browser_missing() -> str | None:
    for path in (CHROMIUM, CHROMEDRIVER):
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            return f"{path} is missing (run .ci/install-browser.sh)"
    try:
        import selenium  # noqa: F401 - only whether selenium imports
    except ImportError:
        return "selenium is not installed (pip install -e '.[test]')"
    return None


@pytest.fixture
def browser():
    """A headless Chromium at 1500 x 1100 whose devtools log :func:`browser_errors` reads."""
    missing = _browser_missing()
    if missing is not None:
        if os.environ.get("CI"):
            pytest.fail(f"browser tests need a browser in CI: {missing}")
        pytest.skip(missing)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.environ.setdefault("SE_OFFLINE", "true")  # selenium's manager must never fetch anything
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1500,1100", "--no-first-run", "--disable-extensions"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the devtools log, for browser_errors
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def browser_errors(driver) -> list[str]:
    """The errors the browser's devtools log holds since the last call (a failed load, a script error)."""
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
