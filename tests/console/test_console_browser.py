"""The web console in a real headless Chromium (Debian's chromium + chromium-driver, driven by
selenium with both paths given, so nothing downloads a browser or a driver).

A real ``castor serve --console --allow-faults`` with 3 sessions x 2 casts in flight (casts
whose agent turns no one answers): the tree shows the casts' actors, a cast's page draws its
loadout's sockets, and a kill injected over the endpoint shows up as a restart within 2 s.
Each test saves what the browser showed under ``$TMPDIR/castor-console-shots``;
``CASTOR_SAVE_DOCS_SHOT=1`` makes the restart test refresh ``docs/console.png``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest

from tests.support.waiting import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.timeout(120)]

#: Where a run leaves its screenshots (CASTOR_CONSOLE_SHOTS overrides): evidence to look at, never committed.
SHOTS = Path(os.environ.get("CASTOR_CONSOLE_SHOTS", "") or Path(tempfile.gettempdir()) / "castor-console-shots")


def _rows(driver) -> dict[str, dict[str, str]]:
    """The tree's rows as the page shows them: path -> {kind, restarts, activity}."""
    script = """return Array.from(document.querySelectorAll('#tree tr')).map(tr => [tr.dataset.path,
        tr.dataset.kind, tr.querySelector('.restarts').textContent, tr.querySelector('.activity').textContent]);"""
    return {p: {"kind": k, "restarts": r, "activity": a} for p, k, r, a in driver.execute_script(script)}


def _under_base(driver, live, route: str) -> str:
    """The address of ``route`` under the console's own path (its pages' ``BASE``): where the page's
    links lead, and the only path the browser sends the console's cookie to."""
    return live.url.rstrip("/") + driver.execute_script("return typeof BASE === 'string' ? BASE : '/'") + route


def _shot(driver, name: str) -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / name
    driver.save_screenshot(str(path))
    return path


@contextlib.contextmanager
def _a_bare_console(browser) -> Iterator[None]:
    """A console (no token) on a runtime of its own with nothing in it, its page open in ``browser``
    once the first push drew it; the test then renders documents of its own there. Both stop after."""
    from castor.console import server
    from castor.runtime import Runtime, RuntimeSettings

    runtime = Runtime(RuntimeSettings())
    console = server.ConsoleServer(runtime, "127.0.0.1", 0, token=None).start()
    try:
        browser.get(console.url)
        wait_for(lambda: browser.execute_script("return document.querySelectorAll('#tree tr').length"), timeout=15,
                 what="the first push")
        yield
    finally:
        console.stop()
        runtime.shutdown(10)


def test_the_tree_shows_every_running_casts_actors(browser, busy_console):
    live = busy_console
    browser.get(f"{live.url}?token={live.token}")  # the console's token: a cookie for the page's own requests
    want = {f"/root/session/{sid}/cast/{c}" for sid, casts in live.casts.items() for c in casts}
    rows = wait_for(lambda: (r := _rows(browser)) and want <= set(r) and r, timeout=15, what="the casts in the tree")
    assert all(rows[p]["kind"] == "CastActor" for p in want)
    waiting = [r for p, r in rows.items() if r["kind"] == "SocketActor"]
    assert len(waiting) == 6 and all("awaiting the agent's turn" in r["activity"] for r in waiting)
    cards = browser.execute_script(
        "return Array.from(document.querySelectorAll('[data-session]')).map(e => e.textContent)"
    )
    assert len(cards) == 3 and all(str(live.projects[f"session-{n + 1}"]) in cards[n] for n in range(3))
    # Live: the waits' ages grow without a reload.
    first = _rows(browser)[next(iter(sorted(want)))]["activity"]
    wait_for(lambda: _rows(browser)[next(iter(sorted(want)))]["activity"] != first, timeout=5,
             what="a pushed update")
    path = _shot(browser, "console-tree.png")
    assert path.stat().st_size > 10_000


def test_a_casts_page_draws_its_loadout_with_the_current_socket(browser, busy_console):
    live = busy_console
    sid, cast_id = "session-3", live.casts["session-3"][0]
    browser.get(f"{live.url}?token={live.token}")  # the console's token: a cookie for the page's own requests
    # found and clicked in one script: a push between a lookup and a click redraws the tree, and the
    # link looked up is then a stale element
    wait_for(lambda: browser.execute_script(
        f"const a = document.querySelector('#tree a[href=\"' + BASE + 'cast/{sid}/{cast_id}\"]');"
        " if (a) a.click(); return !!a;"), timeout=15, what="the cast's link, clicked")
    wait_for(lambda: browser.execute_script("return document.querySelectorAll('#graph g.socket').length"),
             timeout=15, what="the graph")
    sockets = browser.execute_script(
        "return Array.from(document.querySelectorAll('#graph g.socket')).map(g => g.dataset.socket)")
    current = browser.execute_script(
        "return Array.from(document.querySelectorAll('#graph g.socket.current')).map(g => g.dataset.socket)")
    edges = browser.execute_script("return document.querySelectorAll('#graph path.edge').length")
    from castor.adapters.materia.config_loader import load_resolved

    resolved = load_resolved(live.projects[sid])
    assert set(sockets) == set(resolved.pipeline.sockets)
    assert len(current) == 1 and current[0] in sockets
    assert edges == sum(len(s.socket.edges) for s in resolved.pipeline.sockets.values())
    facts = wait_for(lambda: browser.execute_script("return document.getElementById('facts').textContent"),
                     timeout=10, what="the cast's facts")
    assert "awaiting the agent's turn" in facts and current[0] in facts
    feed = browser.execute_script("return document.getElementById('feed').textContent")
    assert "cast_start" in feed or "socket_start" in feed
    _shot(browser, "console-cast.png")


def test_a_kill_injected_over_the_endpoint_shows_as_a_restart_within_2_s(browser, busy_console):
    live = busy_console
    sid, cast_id = "session-1", live.casts["session-1"][1]
    path = f"/root/session/{sid}/cast/{cast_id}"
    browser.get(f"{live.url}?token={live.token}")  # the console's token: a cookie for the page's own requests
    wait_for(lambda: path in _rows(browser), timeout=15, what="the cast in the tree")
    assert _rows(browser)[path]["restarts"] == "0"
    live.client.call("ops.fault", {"kind": "kill", "path": path}, timeout=10)
    killed = time.monotonic()
    # The bound: the restart is on the page within 2 s of the kill (a push every second).
    wait_for(lambda: _rows(browser).get(path, {}).get("restarts") == "1", timeout=2.0,
             what="the restart on the page within 2 s")
    shown_after = time.monotonic() - killed
    cell = browser.execute_script(f"return document.querySelector('#tree tr[data-path=\"{path}\"] .restarts')"
                                  ".className")
    assert "restarted" in cell and shown_after < 2.0
    path = _shot(browser, "console-restart.png")
    if os.environ.get("CASTOR_SAVE_DOCS_SHOT"):  # the README's picture: 3 sessions x 2 casts, one restart
        shutil.copy(path, Path(__file__).resolve().parents[2] / "docs" / "console.png")


def test_a_bidirectional_override_in_a_project_path_shows_as_its_escape(browser, busy_console, tmp_path):
    """A project directory ``safe\\u202etxt.exe`` displayed as ``safe...exe.txt`` (the override
    reverses what follows it); ``castor inspect`` escaped it, the console did not. Now the page
    shows the escape, and no override character reaches the page's text."""
    live = busy_console
    project = tmp_path / "safe\u202etxt.exe"
    project.mkdir()
    live.client.call("session.open", {"session_id": "bidi", "cwd": str(project), "trusted": True,
                                      "flags": {"label": "prod\u202edlrow olleh"}}, timeout=20)
    browser.get(f"{live.url}?token={live.token}")

    def card() -> str | None:
        texts = browser.execute_script(
            "return Array.from(document.querySelectorAll('[data-session]')).map(e => e.textContent)")
        return next((t for t in texts if "bidi" in t), None)

    shown = wait_for(card, timeout=15, what="the bidi session's card")
    assert "safe\\u202etxt.exe" in shown and "\u202e" not in shown, shown
    assert "\u202e" not in browser.execute_script("return document.body.innerText")


def test_an_open_cast_page_says_so_when_its_session_closes(browser, busy_console):
    """The page of a cast whose session closes while it is open says the session is gone (its
    stream pushes the not-found) and that what it still shows is not live (it was shown as live),
    and loading it again is the console's 404."""
    live = busy_console
    sid, cast_id = "session-2", live.casts["session-2"][0]
    browser.get(f"{live.url}?token={live.token}")  # the console's token: a cookie for the page's own requests
    browser.get(_under_base(browser, live, f"cast/{sid}/{cast_id}"))
    status_js = "return document.getElementById('status').textContent"
    wait_for(lambda: browser.execute_script(status_js).startswith("updated"), timeout=15,
             what="the cast page's first push")
    live.client.call("session.close", {"session_id": sid}, timeout=20)
    status = wait_for(lambda: (lambda t: t if f"no open session {sid}" in t else None)(
        browser.execute_script(status_js)),
        timeout=15, what="the page saying its session closed")
    assert "NotFound" in status and "not live" in status, status
    assert browser.execute_script("return document.body.classList.contains('stale')")
    browser.get(_under_base(browser, live, f"cast/{sid}/{cast_id}"))
    assert f"no open session {sid}" in browser.find_element("tag name", "body").text


def test_a_bounded_activity_shows_its_deadline_and_a_workers_card_how_long_its_call_runs(browser, busy_console):
    """A hung worker call read "worker call hooks.pre_llm_call" on the worker's card (no age at
    all) and "... for 40.0 s" in the tree, with no word of when its deadline kills the worker.
    The page renders a pushed document (its own stream closed first) whose worker call has run
    40 s and has 5 s left, and a socket's turn that nothing bounds."""
    live = busy_console
    browser.get(f"{live.url}?token={live.token}")
    wait_for(lambda: browser.execute_script("return document.querySelectorAll('#tree tr').length"), timeout=15,
             what="the first push")
    call = {"kind": "worker_call", "text": "worker call hooks.pre_llm_call", "age_s": 40.0,
            "data": {"target": "hooks.pre_llm_call"}, "deadline_in_s": 5.25}
    turn = {"kind": "awaiting_turn", "text": "awaiting the agent's turn", "age_s": 7.0, "data": {},
            "deadline_in_s": None}
    box = {"depth": 0, "oldest_age_s": None}

    def actor(path: str, kind: str, activity: dict) -> dict:
        return {"path": path, "kind": kind, "state": "running", "incarnation": 1, "restarts": 0,
                "mailbox": box, "activity": activity, "last_failure": None, "labels": {}}

    doc = {"at": time.time(), "sessions": [],
           "actors": [actor("/root/session/w/icarus/worker", "IcarusWorkerActor", call),
                      actor("/root/session/w/socket/c.3", "SocketActor", turn)],
           "workers": [{"session_id": "w", "state": "active", "workers_started": 1,
                        "process": {"pid": 4242, "alive": True, "calls": 1},
                        "actor": {"mailbox": {"depth": 0}, "restarts": 0, "activity": call}}]}
    browser.execute_script("source.close(); render(arguments[0]);", doc)
    rows = _rows(browser)
    assert rows["/root/session/w/icarus/worker"]["activity"] == \
        "worker call hooks.pre_llm_call for 40.0 s, deadline in 5.3 s"
    assert rows["/root/session/w/socket/c.3"]["activity"] == "awaiting the agent's turn for 7.0 s"
    card = browser.execute_script("return document.querySelector('[data-worker=\"w\"]').textContent")
    assert "worker call hooks.pre_llm_call for 40.0 s, deadline in 5.3 s" in card, card
    call["deadline_in_s"] = -2.0  # a bound that passed and did not end it (yet): said as such
    browser.execute_script("render(arguments[0]);", doc)
    assert _rows(browser)["/root/session/w/icarus/worker"]["activity"].endswith("deadline passed 2.0 s ago")


def test_a_casts_page_shows_the_deadline_that_ends_its_wait(browser, busy_console):
    """The cast page's "doing" read "... for 12.0 s" even when a bound ends the wait (the user's
    own turn under user_turn_timeout_s): it says how far off that bound is now, as the tree does."""
    live = busy_console
    sid, cast_id = "session-1", live.casts["session-1"][0]
    browser.get(f"{live.url}?token={live.token}")
    browser.get(_under_base(browser, live, f"cast/{sid}/{cast_id}"))
    facts_js = "return document.getElementById('facts').textContent"
    wait_for(lambda: browser.execute_script(facts_js), timeout=15, what="the cast's facts")
    doc = browser.execute_script("""source.close();
        return await (await fetch(BASE + 'api/actors')).json();""")  # any valid document will do for its shape
    cast = {"at": doc["at"], "svg": "<svg></svg>", "phase": "Socket-1", "current_socket": "Socket-1", "item": None,
            "request": "r", "run_dir": "/p", "failed_reason": None, "events": [],
            "usage": {"tokens": 0, "cost_usd": 0, "turns": 0},
            "actor": {"activity": {"kind": "cast", "text": "awaiting the agent's turn", "age_s": 12.0, "data": {},
                                   "deadline_in_s": 8.0}}}
    browser.execute_script("render(arguments[0]);", cast)
    facts = browser.execute_script(facts_js)
    assert "awaiting the agent's turn for 12.0 s, deadline in 8.0 s" in facts, facts


def test_a_page_on_another_port_of_the_host_never_gets_the_console_s_cookie(browser, busy_console):
    """A browser sends a host's cookies to every port of it: after the user opened the console,
    their next visit to a page another local user serves on 127.0.0.1 carried the console's cookie
    there (``Path=/``), and replayed it opened the console. Now the cookie goes only under the
    console's own random path; the token leaves the address bar; a reload still opens the page."""
    import threading
    import urllib.error
    import urllib.request
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    heard: list[str] = []

    class Other(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            heard.append(self.headers.get("Cookie") or "")
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"hi")

        def log_message(self, *args: object) -> None:
            pass

    # A thread per connection: Chromium keeps a speculative connection open that never sends a
    # request; a one-at-a-time server sat reading it, and its shutdown waited ~110 s for Chromium
    # to drop it (the test ran near its timeout). The handlers are daemon threads, not waited for.
    other = ThreadingHTTPServer(("127.0.0.1", 0), Other)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    live = busy_console
    try:
        browser.get(f"{live.url}?token={live.token}")
        wait_for(lambda: browser.execute_script("return document.querySelectorAll('#tree tr').length"),
                 timeout=15, what="the first push")
        shown_at, base_address = browser.current_url, _under_base(browser, live, "")
        for path in ("/", "/cast/x/y", "/c/"):
            browser.get(f"http://127.0.0.1:{other.server_address[1]}{path}")
        assert len(heard) >= 3 and not any("castor_console_" in cookie for cookie in heard), heard  # (a favicon too)
        assert "token=" not in shown_at and shown_at == base_address, shown_at
        browser.back()
        browser.back()
        browser.back()
        browser.refresh()
        wait_for(lambda: browser.execute_script("return document.querySelectorAll('#tree tr').length"),
                 timeout=15, what="the reloaded page's first push")
        with pytest.raises(urllib.error.HTTPError) as refused:  # the path alone opens nothing
            urllib.request.urlopen(_under_base(browser, live, "api/actors"), timeout=10)
        assert refused.value.code == 401
    finally:
        other.shutdown()
        other.server_close()


def test_a_retired_worker_says_why_in_the_tree_and_on_its_card(browser, busy_console):
    """A worker retired after a timed-out call showed "-" under "doing now" (``castor inspect``
    said "retired: call ... timed out"), and its card read "pid 30744 (none running)", a dead
    process's pid given as the worker's, with no word of the retirement. Now both say why it
    retired, and the card names the pid as the last one."""
    live = busy_console
    browser.get(f"{live.url}?token={live.token}")
    wait_for(lambda: browser.execute_script("return document.querySelectorAll('#tree tr').length"), timeout=15,
             what="the first push")
    reason = "call tools.fabric_write timed out"
    box = {"depth": 0, "oldest_age_s": None}
    worker = {"path": "/root/session/w/icarus/worker", "kind": "IcarusWorkerActor", "state": "retired",
              "incarnation": 1, "restarts": 0, "mailbox": box, "activity": None, "last_failure": None,
              "labels": {}, "retired_reason": reason}
    doc = {"at": time.time(), "sessions": [], "actors": [worker],
           "workers": [{"session_id": "w", "state": "active", "workers_started": 1,
                        "process": {"pid": 30744, "alive": False, "calls": 2}, "actor": worker}]}
    browser.execute_script("source.close(); render(arguments[0]);", doc)
    assert _rows(browser)["/root/session/w/icarus/worker"]["activity"] == f"retired: {reason}"
    card = browser.execute_script("return document.querySelector('[data-worker=\"w\"]').textContent")
    assert f"retired: {reason}" in card and "last pid 30744 (none running)" in card, card


def test_a_sessions_card_says_what_each_cast_does_as_the_tree_does(browser, busy_console):
    """A session's card read "... visit 1 38.9 s" for a cast: no "for", and no word of the deadline
    that ends a bounded wait (the user's own turn under user_turn_timeout_s), which the tree and
    ``castor inspect casts`` give. It reads as the tree now."""
    live = busy_console
    browser.get(f"{live.url}?token={live.token}")
    wait_for(lambda: browser.execute_script("return document.querySelectorAll('#tree tr').length"), timeout=15,
             what="the first push")
    cast = {"cast_id": "c1", "activity": "awaiting the agent's turn for Socket-1 (greeter) of cast c1, visit 1",
            "waiting_s": 38.9, "deadline_in_s": 21.1, "phase": "Socket-1"}
    doc = {"at": time.time(), "actors": [], "workers": [],
           "sessions": [{"session_id": "w", "label": "proj", "project": "/p", "casts": [cast]}]}
    browser.execute_script("source.close(); render(arguments[0]);", doc)
    line = browser.execute_script("return document.querySelector('[data-cast=\"c1\"]').textContent")
    assert line == "c1 awaiting the agent's turn for Socket-1 (greeter) of cast c1, visit 1 for 38.9 s, " \
                   "deadline in 21.1 s", line


def test_a_crash_looping_cast_shows_how_much_of_its_restart_limit_is_used(browser, busy_console):
    """Killed twice, a cast read "2" under restarts and nothing more: the page did not say that it
    is given up after 5 restarts in 30 s, nor how close its supervisor is to failing. The
    "restart limit" column says both, from the live runtime."""
    live = busy_console
    sid, cast_id = "session-2", live.casts["session-2"][1]
    path = f"/root/session/{sid}/cast/{cast_id}"
    browser.get(f"{live.url}?token={live.token}")
    wait_for(lambda: path in _rows(browser), timeout=15, what="the cast in the tree")
    for n in (1, 2):
        live.client.call("ops.fault", {"kind": "kill", "path": path}, timeout=10)
        wait_for(lambda n=n: _rows(browser).get(path, {}).get("restarts") == str(n), timeout=10,
                 what=f"restart {n} on the page")

    def limit(row_path: str) -> str:
        return browser.execute_script(
            f"return document.querySelector('#tree tr[data-path=\"{row_path}\"] .budget').textContent")

    wait_for(lambda: limit(path) == "2/5 restarts in 30 s before it is given up", timeout=5,
             what="the cast's restart limit")
    assert limit(f"/root/session/{sid}/cast") == "children: 2/100 restarts in 10 s before it fails"
    assert limit(f"/root/session/{sid}/materia") == ""


def test_a_long_wait_reads_in_minutes_hours_and_days_not_thousands_of_seconds(browser):
    """A cast stuck for five hours read "... for 18123.0 s" on its card and in the tree, and a
    deadline an hour away "deadline in 3600.0 s": an operator had to divide to tell which cast is
    stuck and for how long. A minute or more now reads in minutes, hours and days; under a minute
    as before."""
    with _a_bare_console(browser):
        box = {"depth": 0, "oldest_age_s": None}

        def actor(path: str, age: float, deadline: float | None) -> dict:
            return {"path": path, "kind": "SocketActor", "state": "running", "incarnation": 1, "restarts": 0,
                    "mailbox": box, "last_failure": None, "labels": {},
                    "activity": {"kind": "awaiting_turn", "text": "awaiting the agent's turn", "age_s": age,
                                 "data": {}, "deadline_in_s": deadline}}

        cast = {"cast_id": "c1", "activity": "awaiting the agent's turn", "waiting_s": 18123.0,
                "deadline_in_s": 3600.0, "phase": "Socket-1"}
        doc = {"at": time.time(), "workers": [],
               "sessions": [{"session_id": "w", "label": "proj", "project": "/p", "casts": [cast]}],
               "actors": [actor("/root/a", 18123.0, None), actor("/root/b", 90.5, -125.0),
                          actor("/root/c", 2 * 86400 + 3 * 3600 + 59, None), actor("/root/d", 59.94, 30.0)]}
        browser.execute_script("source.close(); render(arguments[0]);", doc)
        rows = _rows(browser)
        assert rows["/root/a"]["activity"] == "awaiting the agent's turn for 5 h 02 min", rows
        assert rows["/root/b"]["activity"] == "awaiting the agent's turn for 1 min 30 s, deadline passed 2 min 05 s ago"
        assert rows["/root/c"]["activity"] == "awaiting the agent's turn for 2 d 3 h"
        assert rows["/root/d"]["activity"] == "awaiting the agent's turn for 59.9 s, deadline in 30.0 s"
        line = browser.execute_script("return document.querySelector('[data-cast=\"c1\"]').textContent")
        assert line == "c1 awaiting the agent's turn for 5 h 02 min, deadline in 1 h 00 min", line
        _shot(browser, "long-waits.png")


def test_a_since_that_is_not_today_reads_with_its_date(browser):
    """"Needs attention" said "crashed: RuntimeError — since 14:03:12" for an actor that crashed
    yesterday at 14:03 as for one that crashed today: a cast stuck since yesterday read as stuck
    for minutes. A moment not of today now reads with its date (YYYY-MM-DD) before its time; one of
    today as before."""
    import re

    with _a_bare_console(browser):

        def crashed(path: str, age: float) -> dict:
            return {"path": path, "kind": "SocketActor", "state": "crashed", "incarnation": 1, "restarts": 0,
                    "mailbox": {"depth": 0, "oldest_age_s": None}, "labels": {}, "activity": None,
                    "last_failure": {"error_type": "RuntimeError", "message_type": None, "age_s": age}}

        now = time.time()
        doc = {"at": now, "workers": [], "sessions": [],
               "actors": [crashed("/root/yesterday", 26 * 3600.0), crashed("/root/now", 0.0)]}
        browser.execute_script("source.close(); render(arguments[0]);", doc)
        said = dict(browser.execute_script(
            "return Array.from(document.querySelectorAll('#attention li')).map(li => [li.dataset.trouble, "
            "li.textContent]);"))
        day = browser.execute_script(
            "const d = new Date(arguments[0]), two = n => String(n).padStart(2, '0');"
            "return d.getFullYear() + '-' + two(d.getMonth() + 1) + '-' + two(d.getDate());",
            (now - 26 * 3600) * 1000)
        assert re.search(rf" — since {day} \d", said["/root/yesterday"]), said
        assert re.search(r" — since \d{1,2}:\d\d", said["/root/now"]), said  # today's: its time alone
        assert not re.search(r"\d{4}-\d\d-\d\d", said["/root/now"]), said
