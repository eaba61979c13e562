"""The web console as an operator meets it, in a real headless Chromium (see test_console_browser):
what is stuck or failing, a stream that drops or a castor that restarts, a runtime of thousands of
actors, names others chose, the keyboard, a narrow window and the browser's own error log."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.console.conftest import browser_errors
from tests.console.test_console_browser import _rows
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.timeout(120)]

STATUS_JS = "return document.getElementById('status').textContent"
STALE_JS = "return document.body.classList.contains('stale')"


def _first_push(driver) -> None:
    wait_for(lambda: driver.execute_script(STATUS_JS).startswith("updated"), timeout=15, what="the first push")


@contextlib.contextmanager
def _console(port: int = 0, token: str | None = "t0ken-" + "c" * 40) -> Iterator[object]:
    """A console over a fresh runtime (in this process, so a test can stop it and serve again on its port)."""
    from castor.console.server import ConsoleServer
    from castor.runtime import Runtime, RuntimeSettings

    runtime = Runtime(RuntimeSettings())
    console = ConsoleServer(runtime, "127.0.0.1", port, token=token).start()
    try:
        yield console
    finally:
        console.stop()
        runtime.shutdown(10)


def test_a_page_s_load_and_its_pushes_leave_no_error_in_the_browser_s_log(browser, busy_console):
    """Every page load logged "favicon.ico ... 401 (Unauthorized)": the browser asks the host's root
    for an icon, where the console's cookie does not go. The pages name no icon now, and the root's
    ``/favicon.ico`` is an empty answer."""
    live = busy_console
    browser.get(f"{live.url}?token={live.token}")
    _first_push(browser)
    sid, cast_id = "session-1", live.casts["session-1"][0]
    browser.execute_script(f"document.querySelector('#tree a[href$=\"cast/{sid}/{cast_id}\"]').click()")
    wait_for(lambda: browser.execute_script(STATUS_JS).startswith("updated"), timeout=15,
             what="the cast page's first push")
    assert browser_errors(browser) == []


def test_a_page_says_when_its_stream_is_gone_and_that_what_it_shows_is_not_live(browser):
    """castor stopped under an open page: the page said "disconnected; retrying…" and went on showing
    the last tree as it was; served again on the same port (a new run, whose cookie the page does
    not have), the stream was refused and the page said "retrying…" for ever. Now it says since when
    it has had no push and greys out what it shows; served with another token (castor makes one per
    serve), the page says its access ended and what to do; served with the same token, it is live
    again by itself (the cookie and the page's path come from the token, not from the run)."""
    with _console() as console:
        port = console.port
        browser.get(f"{console.url}?token={console.token}")
        _first_push(browser)
        assert not browser.execute_script(STALE_JS)
    status = wait_for(lambda: (t := browser.execute_script(STATUS_JS)).startswith("disconnected") and t,
                      timeout=10, what="the page saying it is disconnected")
    assert "not live" in status and browser.execute_script(STALE_JS), status
    with _console(port, token="an0ther-" + "d" * 40) as again:
        status = wait_for(lambda: "?token=" in (t := browser.execute_script(STATUS_JS)) and t, timeout=15,
                          what="the page saying its access ended")
        assert "access ended" in status and browser.execute_script(STALE_JS), status
        browser.get(f"{again.url}?token={again.token}")  # what it says to do opens it
        _first_push(browser)
        assert not browser.execute_script(STALE_JS)
    wait_for(lambda: browser.execute_script(STALE_JS), timeout=10, what="the page marked stale")
    with _console(port, token=again.token):
        wait_for(lambda: not browser.execute_script(STALE_JS)
                 and browser.execute_script(STATUS_JS).startswith("updated"), timeout=15,
                 what="the page live again without a reload")


def test_a_page_whose_console_serves_again_goes_live_again_by_itself(browser):
    """A console with no token (its pages under ``/``): served again on its port, the open page's
    stream reconnects, and the page is live again without a reload."""
    with _console(token=None) as console:
        port = console.port
        browser.get(console.url)
        _first_push(browser)
    wait_for(lambda: browser.execute_script(STALE_JS), timeout=10, what="the page marked stale")
    with _console(port, token=None):
        wait_for(lambda: not browser.execute_script(STALE_JS)
                 and browser.execute_script(STATUS_JS).startswith("updated"), timeout=15,
                 what="the page live again")


def test_a_stream_the_console_ends_on_schedule_is_not_shown_as_a_loss(browser, monkeypatch):
    """The console ends each stream after a while (10 minutes) and the browser reconnects within
    half a second: the page flashed "disconnected" and greyed out every time. A reconnection within
    a second is not shown as a loss."""
    from castor.console import server

    monkeypatch.setattr(server, "STREAM_MAX_S", 1.0)
    with _console(token=None) as console:
        browser.get(console.url)
        _first_push(browser)
        browser.execute_script("""window.said = []; new MutationObserver(() => said.push(
            document.getElementById('status').textContent)).observe(document.getElementById('status'),
            {childList: true, characterData: true, subtree: true});""")
        ends = time.monotonic() + 4.5  # the stream ended and came back at least three times
        wait_for(lambda: time.monotonic() > ends, timeout=10, what="three scheduled ends of the stream")
        said = browser.execute_script("return said")
        assert said and not [text for text in said if not text.startswith("updated")], said


def test_a_page_refused_a_stream_for_want_of_room_says_so_and_tries_again(browser, monkeypatch):
    """Every stream slot taken, the console answers a page's stream 503: the page said "disconnected;
    retrying…" and never tried again (a browser gives a refused stream up). It says what the console
    answered, tries again every 5 s, and is live once a slot is free."""
    import http.client

    from castor.console import server

    monkeypatch.setattr(server, "MAX_STREAMS", 1)
    with _console(token=None) as console:
        holder = http.client.HTTPConnection("127.0.0.1", console.port, timeout=10)
        holder.request("GET", "/events")
        held = holder.getresponse()  # kept: the stream lives as long as this answer is open
        assert held.status == 200
        browser.get(console.url)
        status = wait_for(lambda: "503" in (t := browser.execute_script(STATUS_JS)) and t, timeout=15,
                          what="the page saying the console is full")
        assert "too many live streams" in status and "retrying in 5 s" in status, status
        held.close()
        holder.close()
        _first_push(browser)
        assert not browser.execute_script(STALE_JS)


def test_text_selected_in_the_tree_stays_selected_across_pushes(browser, busy_console):
    """Each push redrew the tree every second, and a path an operator was selecting to copy was
    gone before the copy. While text is selected in what the page shows, it holds still and says
    so; once the selection goes, the next push redraws."""
    live = busy_console
    browser.get(f"{live.url}?token={live.token}")
    path = f"/root/session/session-1/cast/{live.casts['session-1'][0]}"
    wait_for(lambda: path in _rows(browser), timeout=15, what="the cast in the tree")
    browser.execute_script(f"""const row = document.querySelector('#tree tr[data-path="{path}"]');
        window.selectedRow = row; getSelection().selectAllChildren(row.querySelector('td.name'));""")
    held = wait_for(lambda: (t := browser.execute_script(STATUS_JS)).endswith("held while text is selected") and t,
                    timeout=5, what="the page holding still")
    wait_for(lambda: browser.execute_script(STATUS_JS) != held, timeout=5, what="another push")
    assert browser.execute_script(f"""return window.selectedRow === document.querySelector(
        '#tree tr[data-path="{path}"]') && !getSelection().isCollapsed""")
    browser.execute_script("getSelection().removeAllRanges()")
    _first_push(browser)
    assert browser.execute_script(f"""return window.selectedRow !== document.querySelector(
        '#tree tr[data-path="{path}"]')""")


def _actor(path: str, kind: str = "SocketActor", **extra: object) -> dict:
    actor = {"path": path, "kind": kind, "state": "running", "incarnation": 1, "restarts": 0,
             "mailbox": {"depth": 0, "oldest_age_s": None}, "last_failure": None, "labels": {},
             "activity": {"kind": "awaiting_turn", "text": "awaiting the agent's turn", "age_s": 3.0, "data": {},
                          "deadline_in_s": None}}
    actor.update(extra)
    return actor


def test_thousands_of_actors_draw_a_bounded_tree_and_the_filter_finds_any(browser, busy_console):
    """Every push redrew every actor: at 1,000 casts (about 4,000 actors) each second's redraw
    took the page's thread for most of the second. The tree draws the first 300 the filter matches
    and says how many there are; a session's card lists 25 casts and counts the rest; 500 sessions
    with an Icarus worker each drew 1,000 cards: 50 of each are drawn, the rest counted."""
    live = busy_console
    browser.get(f"{live.url}?token={live.token}")
    _first_push(browser)
    actors = [_actor(f"/root/session/s/socket/c{n}.Socket-1") for n in range(4000)]
    casts = [{"cast_id": f"c{n}", "activity": "awaiting the agent's turn", "waiting_s": 1.0} for n in range(1000)]
    doc = {"at": time.time(), "actors": actors, "workers": [],
           "sessions": [{"session_id": "s", "label": "big", "project": "/p", "casts": casts}]}
    took = browser.execute_script("""source.close(); const t0 = performance.now(); render(arguments[0]);
        return performance.now() - t0;""", doc)
    assert browser.execute_script("return document.querySelectorAll('#tree tr').length") == 300
    assert "showing 300 of 4000 actors" in browser.execute_script(
        "return document.getElementById('shown').textContent")
    assert browser.execute_script("return document.querySelectorAll('[data-session=\"s\"] li').length") == 26
    assert took < 1000, f"one push took {took:.0f} ms to draw"  # (a bound for a loaded CI host; ~50 ms here)
    many = {"at": time.time(), "actors": [],
            "sessions": [{"session_id": f"s{n}", "label": "", "project": "/p", "casts": []} for n in range(500)],
            "workers": [{"session_id": f"s{n}", "state": "active", "workers_started": 1, "process": {},
                         "actor": {}} for n in range(500)]}
    browser.execute_script("render(arguments[0]);", many)
    assert browser.execute_script("return document.querySelectorAll('[data-session]').length") == 50
    assert browser.execute_script("return document.querySelectorAll('[data-worker]').length") == 50
    assert browser.execute_script("return document.querySelector('[data-more=\"sessions\"]').textContent") == \
        "450 more sessions (filter the tree below)"
    browser.execute_script("render(arguments[0]);", doc)
    browser.find_element("id", "filter").send_keys("c3999.")
    wait_for(lambda: list(_rows(browser)) == ["/root/session/s/socket/c3999.Socket-1"], timeout=5,
             what="the filter narrowing the tree to one actor")


def test_names_others_chose_are_shown_as_text_and_cut_to_fit(browser, busy_console):
    """A 10 KB path segment made one cell 60,000 pixels wide; markup, a script, an emoji or a
    right-to-left override in a name are text, never markup, never a reversed display."""
    live = busy_console
    browser.get(f"{live.url}?token={live.token}")
    _first_push(browser)
    odd = ["<img src=x onerror=window.pwned=1>", "<script>window.pwned=2<\\script><!--", "🦫" * 5000,
           "שלום\u202eexe.txt", "x" * 10_000]
    actors = [_actor(f"/root/session/s/socket/{name}", labels={"label": name, "project": name}) for name in odd]
    doc = {"at": time.time(), "actors": actors, "workers": [],
           "sessions": [{"session_id": "s", "label": odd[0], "project": odd[2],
                         "casts": [{"cast_id": odd[1], "activity": odd[4], "waiting_s": 1.0}]}]}
    browser.execute_script("source.close(); render(arguments[0]);", doc)
    shown = browser.execute_script("""return Array.from(document.querySelectorAll('#tree td.name'))
        .map(td => td.textContent);""")
    assert shown[:2] == odd[:2] and shown[3] == "שלום\\u202eexe.txt", shown
    assert shown[2] == "🦫" * 159 + "…" and shown[4] == "x" * 159 + "…"
    assert browser.execute_script("return window.pwned") is None
    assert not browser.execute_script("return document.querySelectorAll('#tree img, #sessions img').length")
    width = browser.execute_script("return document.querySelector('#tree').scrollWidth")
    assert width < 6000, width
    assert "\u202e" not in browser.execute_script("return document.body.innerText")


def test_a_killed_cast_is_listed_under_needs_attention_with_its_failure_and_restarts(browser, busy_console):
    """The page had no place that said what is stuck or failing: a crash showed as a "1" in one row
    of the tree among hundreds. "needs attention" lists each actor that failed within the last
    minute, crashed, retired, is past a deadline, or holds a message or its mailbox for 10 s."""
    live = busy_console
    sid, cast_id = "session-1", live.casts["session-1"][0]
    path = f"/root/session/{sid}/cast/{cast_id}"
    browser.get(f"{live.url}?token={live.token}")
    _first_push(browser)
    assert browser.execute_script("return document.getElementById('attention').textContent") == \
        "nothing stuck or failing"
    live.client.call("ops.fault", {"kind": "kill", "path": path}, timeout=10)
    item = wait_for(lambda: browser.execute_script(
        f"const li = document.querySelector('#attention li[data-trouble=\"{path}\"]'); return li && li.textContent"),
        timeout=10, what="the killed cast under needs attention")
    assert "failed: " in item and "restarts 1" in item, item
    doc = {"at": time.time(), "workers": [], "sessions": [], "actors": [
        _actor("/root/x/hung", kind="X", activity={"kind": "handling", "text": "handling cast.step", "age_s": 42.0,
                                                   "data": {}, "deadline_in_s": None}),
        _actor("/root/x/late", kind="X", activity={"kind": "worker_call", "text": "worker call t", "age_s": 9.0,
                                                   "data": {}, "deadline_in_s": -1.5}),
        _actor("/root/x/queue", kind="X", mailbox={"depth": 3, "oldest_age_s": 12.0}),
        _actor("/root/x/fine", kind="X")]}
    browser.execute_script("source.close(); render(arguments[0]);", doc)
    listed = browser.execute_script("""return Object.fromEntries(Array.from(
        document.querySelectorAll('#attention li[data-trouble]')).map(li => [li.dataset.trouble, li.textContent]));""")
    assert set(listed) == {"/root/x/hung", "/root/x/late", "/root/x/queue"}, listed
    assert "handling cast.step for 42.0 s" in listed["/root/x/hung"]
    since = browser.execute_script("return new Date(arguments[0]).toLocaleTimeString()", (doc["at"] - 42.0) * 1000)
    assert listed["/root/x/hung"].endswith(f" — since {since}"), listed
    assert "deadline passed 1.5 s ago" in listed["/root/x/late"]
    assert "3 queued, the oldest for 12.0 s" in listed["/root/x/queue"]


def test_a_cast_that_failed_while_the_page_watched_stays_on_its_card_and_under_needs_attention(browser,
                                                                                              busy_console):
    """A cast whose agent turns failed ended as failed, its actor went, and the page forgot it:
    its session's card read "no casts" and nothing anywhere said a cast had failed, or why. The
    card lists it as ended, with its reason, and "needs attention" lists it."""

    live = busy_console
    sid = "failing"
    project, turns = _session_of_its_own(live, sid)
    browser.get(f"{live.url}?token={live.token}")
    _first_push(browser)
    cast_id = live.client.call("cast.start", {"session_id": sid, "cwd": str(project), "request": "r"},
                               timeout=20)["cast_id"]
    path = f"/root/session/{sid}/cast/{cast_id}"
    wait_for(lambda: path in _rows(browser), timeout=15, what="the cast in the tree")
    for n in (1, 2):  # the turn, then its one same-socket retry, fail
        turn = wait_for(lambda n=n: len(turns) >= n and turns[n - 1], timeout=20, what=f"agent turn {n}")
        live.client.call("agent.turn_ended", {"session_id": sid, "turn_id": turn["turn_id"], "stop_reason": "error",
                                              "error": {"message": "the provider exploded"}}, timeout=20)
    line = wait_for(lambda: browser.execute_script(
        f"const li = document.querySelector('[data-session=\"{sid}\"] li[data-ended=\"{cast_id}\"]');"
        " return li && li.textContent"), timeout=20, what="the failed cast on its session's card")
    assert "ended failed: " in line and "the provider exploded" in line, line
    item = browser.execute_script(
        f"const li = document.querySelector('#attention li[data-trouble=\"{path}\"]'); return li && li.textContent")
    assert item and "ended failed: " in item and " — since " in item, item


def test_a_sessions_card_says_what_would_move_each_cast_on(browser, busy_console):
    """A cast's line on its session's card said what it does ("awaiting the agent's turn ... for
    4.2 s"), not what would move it on, which ``castor inspect casts`` says: the agent's turn to
    end, or an abort."""
    live = busy_console
    sid, cast_id = "session-1", live.casts["session-1"][0]
    browser.get(f"{live.url}?token={live.token}")
    line = wait_for(lambda: browser.execute_script(
        f"const li = document.querySelector('[data-session=\"{sid}\"] li[data-cast=\"{cast_id}\"]');"
        " return li && li.textContent"), timeout=15, what="the cast's line on its card")
    assert "; waits for the agent's turn to end (the harness reports it), or abort" in line, line


def test_a_handler_that_does_not_return_is_listed_under_needs_attention(browser, busy_console):
    """A session actor held in its handler (an injected delay, as a hang) reported "injected delay
    ... before handling materia.session.start", an activity of its own, and nothing said its whole
    mailbox waited behind it. Held for 10 s, it is listed, with the message it is handling."""
    import threading

    live = busy_console
    sid = "session-2"
    path = f"/root/session/{sid}/materia"
    browser.get(f"{live.url}?token={live.token}")
    _first_push(browser)
    live.client.call("ops.fault", {"kind": "delay_next", "path": path, "seconds": 14}, timeout=10)

    def ask_the_held_actor() -> None:
        with contextlib.suppress(Exception):  # its answer (a refusal: two casts run) is not the point
            live.client.call("cast.start", {"session_id": sid, "cwd": str(live.projects[sid]), "request": "r"},
                             timeout=30)

    asked = threading.Thread(target=ask_the_held_actor, daemon=True)
    asked.start()
    item = wait_for(lambda: browser.execute_script(
        f"const li = document.querySelector('#attention li[data-trouble=\"{path}\"]'); return li && li.textContent"),
        timeout=20, what="the held session actor under needs attention")
    assert "handling materia.session.start for 1" in item and "its mailbox waits" in item, item
    asked.join(30)


def test_a_keyboard_user_keeps_their_place_across_pushes_and_a_narrow_window_scrolls_only_the_tree(browser,
                                                                                                 busy_console):
    """Each push redrew the tree, and the link a keyboard user had tabbed to was gone: the next Tab
    started over at the top of the page. The focused link is focused again after each redraw. At
    400 px wide the whole page scrolled sideways with the tree; now the tree scrolls in its box."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    live = busy_console
    browser.set_window_size(400, 900)
    browser.get(f"{live.url}?token={live.token}")
    wait_for(lambda: len(_rows(browser)) > 6, timeout=15, what="the tree")
    focused_js = "const a = document.activeElement; return a && a.tagName === 'A' ? a.getAttribute('href') : null"
    href = None
    for _ in range(40):  # Tab through the page to the first cast link of the tree
        ActionChains(browser).send_keys(Keys.TAB).perform()
        href = browser.execute_script(focused_js + " && document.activeElement.closest('#tree') ? "
                                      "document.activeElement.getAttribute('href') : null")
        if href:
            break
    assert href and "/cast/" in href
    pushes = browser.execute_script(STATUS_JS)
    wait_for(lambda: browser.execute_script(STATUS_JS) != pushes, timeout=5, what="a push")
    wait_for(lambda: browser.execute_script(STATUS_JS) != pushes, timeout=5, what="another push")
    assert browser.execute_script(focused_js) == href
    ActionChains(browser).send_keys(Keys.ENTER).perform()
    wait_for(lambda: browser.current_url.endswith(href), timeout=10, what="Enter following the link")
    browser.back()
    _first_push(browser)
    overflow = browser.execute_script("return document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 1, f"the page is {overflow} px wider than the window"


def test_a_casts_page_shows_its_request_and_events_whole_wrapped_in_a_narrow_window(browser, busy_console):
    """A cast's request (up to 500 characters) and each event's data (up to 300) are shown whole,
    wrapped: only the page's other cells are cut. At 400 px the page does not scroll sideways."""
    live = busy_console
    sid, cast_id = "session-1", live.casts["session-1"][0]
    browser.set_window_size(400, 900)
    browser.get(f"{live.url}?token={live.token}")
    browser.get(live.url.rstrip("/") + browser.execute_script("return BASE") + f"cast/{sid}/{cast_id}")
    _first_push(browser)
    request, data = "r" * 499 + "!", "d" * 299 + "…"
    cast = {"at": time.time(), "svg": "<svg></svg>", "phase": "Socket-1", "current_socket": "Socket-1", "item": None,
            "request": request, "run_dir": "/p", "failed_reason": None,
            "events": [{"ts": None, "type": "socket_start", "data": data}],
            "usage": {"tokens": 0, "cost_usd": 0, "turns": 0}, "actor": None}
    browser.execute_script("source.close(); render(arguments[0]);", cast)
    facts = browser.execute_script("return document.getElementById('facts').textContent")
    feed = browser.execute_script("return document.getElementById('feed').textContent")
    assert request in facts and data in feed
    overflow = browser.execute_script("return document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 1, f"the page is {overflow} px wider than the window"


def test_a_wrong_token_or_a_page_of_an_earlier_serve_says_how_to_open_the_console(browser, busy_console):
    """A wrong token read "unauthorized: this console needs its token (?token=...)", which a person
    holding a token of an earlier serve has: it says where the token is and that an old one no
    longer opens it. The token given is nowhere in what the browser shows."""
    live = busy_console
    wrong = "w" * 43
    browser.get(f"{live.url}?token={wrong}")
    said = browser.find_element("tag name", "body").text
    assert "castor serve" in said and "?token=$(cat TOKEN_FILE)" in said and "earlier serve" in said, said
    assert wrong not in browser.page_source


def test_a_cast_that_failed_before_any_page_was_open_is_listed_under_needs_attention(browser, busy_console):
    """Only a cast that failed while a page watched (its actor seen, then gone) was listed: one that
    failed while no page was open was on no card and not under "needs attention". A session's failed
    casts are read from its casts' states, whenever the page opened."""

    live = busy_console
    sid = "failed-unwatched"
    project, turns = _session_of_its_own(live, sid)
    cast_id = live.client.call("cast.start", {"session_id": sid, "cwd": str(project), "request": "r"},
                               timeout=20)["cast_id"]
    for n in (1, 2):  # the turn, then its one same-socket retry, fail
        turn = wait_for(lambda n=n: len(turns) >= n and turns[n - 1], timeout=20, what=f"agent turn {n}")
        live.client.call("agent.turn_ended", {"session_id": sid, "turn_id": turn["turn_id"], "stop_reason": "error",
                                              "error": {"message": "the provider exploded"}}, timeout=20)
    wait_for(lambda: live.client.call("cast.status", {"session_id": sid, "cwd": str(project), "cast_id": cast_id},
                                      timeout=20).get("status") == "failed", timeout=20, what="the cast failed")
    browser.get(f"{live.url}?token={live.token}")  # the first page opened since it failed
    _first_push(browser)
    path = f"/root/session/{sid}/cast/{cast_id}"
    item = wait_for(lambda: browser.execute_script(
        f"const li = document.querySelector('#attention li[data-trouble=\"{path}\"]'); return li && li.textContent"),
        timeout=15, what="the cast that failed unwatched under needs attention")
    assert "ended failed: " in item and "the provider exploded" in item, item
    line = browser.execute_script(
        f"const li = document.querySelector('[data-session=\"{sid}\"] li[data-ended=\"{cast_id}\"]');"
        " return li && li.textContent")
    assert line and "the provider exploded" in line, line


def _elapse(seconds: float, what: str) -> None:
    """``seconds`` of the page's own life pass (its timers run meanwhile), bounded like any wait."""
    ends = time.monotonic() + seconds
    wait_for(lambda: time.monotonic() > ends, timeout=seconds + 5, what=what)


def test_a_page_whose_castor_is_down_retries_backing_off_and_is_live_again_by_itself(browser):
    """While castor was down an open page's stream was retried by the browser every half second,
    each try a connection error in the browser's log (20 a minute... 120). The page retries itself,
    waiting twice as long after each failed try (up to 8 s); it still says at once that it is
    disconnected, is live again by itself when castor serves again, and waits the shortest again
    once a push came."""
    with _console(token=None) as console:
        port = console.port
        browser.get(console.url)
        _first_push(browser)
        browser_errors(browser)  # the log from here on
    down = time.monotonic()
    wait_for(lambda: browser.execute_script(STATUS_JS).startswith("disconnected"), timeout=3,
             what="the page saying at once that it is disconnected")
    assert time.monotonic() - down < 3
    _elapse(8.0, "8 s of castor down")
    refused = [e for e in browser_errors(browser) if "/events" in e]
    # tries at 0.5, 1.5, 3.5 and 7.5 s; the browser's own retries made 16 in 8 s
    assert 1 <= len(refused) <= 5, refused
    with _console(port, token=None):
        wait_for(lambda: not browser.execute_script(STALE_JS)
                 and browser.execute_script(STATUS_JS).startswith("updated"), timeout=15,
                 what="the page live again without a reload")
    wait_for(lambda: browser.execute_script(STALE_JS), timeout=10, what="the page marked stale again")
    with _console(port, token=None):  # back at once: the page tries again after half a second, not 8 s
        again = time.monotonic()
        wait_for(lambda: not browser.execute_script(STALE_JS), timeout=10, what="the page live again")
        assert time.monotonic() - again < 5


def _announcements(driver) -> list[str]:
    return driver.execute_script("return said")


def test_a_screen_reader_is_told_what_changed_in_needs_attention_and_the_connection_not_every_push(
        browser, busy_console):
    """The status line, which changes at every push ("updated 21:04:05 — 52 actors"), was the page's
    live region (role=status): a screen reader read it out every second. The page's live regions
    say only a change of the connection's state and what joined or left "needs attention"."""
    live = busy_console
    sid, cast_id = "session-1", live.casts["session-1"][0]
    path = f"/root/session/{sid}/cast/{cast_id}"
    browser.get(f"{live.url}?token={live.token}")
    _first_push(browser)
    browser.execute_script("""window.said = [];
        const regions = '[role=status],[role=alert],[role=log],[role=timer],[role=marquee],' +
                        '[aria-live]:not([aria-live=off])';
        const was = new Map(Array.from(document.querySelectorAll(regions)).map(el => [el, el.textContent]));
        new MutationObserver(() => { for (const el of document.querySelectorAll(regions))
            if (el.textContent && was.get(el) !== el.textContent) { said.push(el.textContent);
                                                                   was.set(el, el.textContent); } })
          .observe(document.body, {childList: true, characterData: true, subtree: true});""")
    pushed = browser.execute_script(STATUS_JS)
    wait_for(lambda: browser.execute_script(STATUS_JS) != pushed, timeout=5, what="a push")
    _elapse(2.5, "two more pushes")
    assert _announcements(browser) == [], _announcements(browser)
    live.client.call("ops.fault", {"kind": "kill", "path": path}, timeout=10)
    said = wait_for(lambda: [t for t in _announcements(browser) if path in t], timeout=10,
                    what="the killed cast announced")
    assert said[0].startswith("needs attention: "), said
    _elapse(2.5, "two more pushes")
    assert len([t for t in _announcements(browser) if path in t]) == 1, _announcements(browser)


def _session_of_its_own(live, sid: str) -> tuple[Path, list[dict]]:
    """Open session ``sid`` on a project of its own with the test loadout set; the ``agent.run_turn``
    notifications the client gets from then on are collected in the list returned."""
    from tests.console.conftest import LOADOUT

    turns: list[dict] = []
    live.client.on_notification("agent.run_turn", turns.append)
    project = live.projects["session-1"].parent / f"project-{sid}"
    project.mkdir()
    live.client.call("session.open", {"session_id": sid, "cwd": str(project), "trusted": True}, timeout=20)
    live.client.call("loadout.set", {"session_id": sid, "cwd": str(project), "name": LOADOUT}, timeout=20)
    return project, turns


#: A stream of the page's own console, opened beside the page's: its first push (the whole
#: document), the version the page holds then, and the document the page holds.
_WHOLE_BESIDE_JS = """const done = arguments[arguments.length - 1];
const beside = new EventSource(EVENTS_URL);
beside.onmessage = ev => { beside.close(); done([JSON.parse(ev.data).v, heldVersion, ev.data, JSON.stringify(held)]); };
beside.onerror = () => { beside.close(); done(null); };"""


def _held_is_whole(driver) -> None:
    """Wait until the page holds the version a new stream starts with, and check it holds the same document."""
    import json

    def same_version() -> list | None:
        got = driver.execute_async_script(_WHOLE_BESIDE_JS)
        return got if got and got[0] == got[1] else None

    version, _held_version, whole, held = wait_for(same_version, timeout=30, what="the page at a new stream's version")
    assert json.loads(whole)["full"] == json.loads(held), version


def test_the_page_patched_push_after_push_holds_what_a_whole_push_says(browser, busy_console):
    """The main stream sends the whole document once, then what changed: the page, having applied
    every change (a cast killed and restarted, a session opened with a cast and closed), holds what
    a whole push of the same version says. A page that missed a change (here: told it holds
    another version) asks for a new stream, which starts whole, and holds it again."""
    live = busy_console
    browser.get(f"{live.url}?token={live.token}")
    _first_push(browser)
    _held_is_whole(browser)
    path = f"/root/session/session-1/cast/{live.casts['session-1'][0]}"
    live.client.call("ops.fault", {"kind": "kill", "path": path}, timeout=10)
    project, turns = _session_of_its_own(live, "joined")
    cast_id = live.client.call("cast.start", {"session_id": "joined", "cwd": str(project), "request": "r"},
                               timeout=20)["cast_id"]
    wait_for(lambda: f"/root/session/joined/cast/{cast_id}" in _rows(browser), timeout=15, what="the new cast's row")
    wait_for(lambda: _rows(browser)[path]["restarts"] == "1", timeout=15, what="the killed cast's restart")
    _held_is_whole(browser)
    live.client.call("session.close", {"session_id": "joined"}, timeout=20)
    wait_for(lambda: not any(p.startswith("/root/session/joined") for p in _rows(browser)), timeout=15,
             what="the closed session's rows gone")
    _held_is_whole(browser)
    before = browser.execute_script("return heldVersion")
    browser.execute_script("heldVersion = -1")  # as if a push had been missed
    wait_for(lambda: (browser.execute_script("return heldVersion") or 0) > before, timeout=15,
             what="the page holding a newer version again")
    _held_is_whole(browser)
    assert not browser.execute_script(STALE_JS)
    assert browser_errors(browser) == []


def test_a_session_whose_artifact_dir_leads_out_of_its_project_says_why_its_saved_casts_are_not_read(
        browser, busy_console, tmp_path):
    """A project whose ``artifactDir`` leads out of it: ``castor casts`` refuses it (``forbidden``),
    and the console reads none of its saved casts. The page said nothing of it (no failed cast was
    listed, as if none had failed); its session's card and "needs attention" say why now."""
    import json

    live = busy_console
    project = tmp_path / "project-outside"
    (project / ".pi").mkdir(parents=True)
    (project / ".pi" / "pi-materia.json").write_text(json.dumps({"artifactDir": str(tmp_path / "elsewhere")}))
    live.client.call("session.open", {"session_id": "outside", "cwd": str(project), "trusted": True}, timeout=20)
    browser.get(f"{live.url}?token={live.token}")
    _first_push(browser)
    said = wait_for(lambda: browser.execute_script(
        "const li = document.querySelector('[data-session=\"outside\"] li[data-refused]');"
        " return li && li.textContent"),
        timeout=15, what="the refusal on the session's card")
    assert said.startswith("saved casts not read: ") and "artifactDir must stay inside the project" in said, said
    item = browser.execute_script(
        "const li = document.querySelector('#attention li[data-trouble=\"/root/session/outside\"]');"
        " return li && li.textContent")
    assert item and "artifactDir must stay inside the project" in item, item


def test_a_casts_page_applies_what_changed_and_a_page_that_missed_a_push_starts_whole_again(browser, busy_console):
    """A cast's page was sent its whole document every second. Its stream sends it once now, then
    what changed, which the page applies: after a restart of the cast (new events in its feed, its
    actor's restart) it shows what a whole push says. A page that missed a push (here: told it holds
    another version) reconnects, and its new stream starts whole."""
    live = busy_console
    sid, cast_id = "session-2", live.casts["session-2"][0]
    browser.get(f"{live.url}cast/{sid}/{cast_id}?token={live.token}")
    wait_for(lambda: (browser.execute_script("return heldVersion") or 0) >= 2, timeout=15, what="a patched push")
    feed = browser.execute_script("return held.events.map(e => e.event_id)")
    live.client.call("ops.fault", {"kind": "kill", "path": f"/root/session/{sid}/cast/{cast_id}"}, timeout=10)
    wait_for(lambda: browser.execute_script("return held.events.map(e => e.event_id)") != feed, timeout=15,
             what="the restart's events in the page's feed")
    shown = browser.execute_script("return document.getElementById('feed').rows.length")
    assert shown == browser.execute_script("return held.events.length")
    browser.execute_script("window.missed = source; heldVersion = -1")  # as if a push had been missed
    wait_for(lambda: browser.execute_script("return source !== window.missed && heldVersion > 0"), timeout=15,
             what="a new stream, started whole")
    whole = browser.execute_async_script("""const done = arguments[arguments.length - 1];
        const beside = new EventSource(EVENTS_URL);
        beside.onmessage = ev => { beside.close(); done(JSON.parse(ev.data).full); };
        beside.onerror = () => { beside.close(); done(null); };""")
    held = browser.execute_script("return held")
    for key in ("cast_id", "phase", "current_socket", "svg", "events"):
        assert held[key] == whole[key], key
    assert not browser.execute_script(STALE_JS)
    assert browser_errors(browser) == []


def test_an_operator_who_opens_the_console_after_a_cast_ended_finds_it_whatever_its_status(browser, busy_console):
    """The page listed a cast a page had not seen live only when it had failed: one aborted (or
    complete) before the operator opened the console was on no card and nowhere else. A session's
    card lists its project's casts not running here with their status, and links to every cast of
    the project, a page at a time; an aborted cast needs no attention, so it is not listed there."""
    live = busy_console
    sid = "aborted-unwatched"
    project, turns = _session_of_its_own(live, sid)
    cast_id = live.client.call("cast.start", {"session_id": sid, "cwd": str(project), "request": "r"},
                               timeout=20)["cast_id"]
    wait_for(lambda: turns, timeout=20, what="its agent turn")
    live.client.call("cast.abort", {"session_id": sid, "cwd": str(project), "cast_id": cast_id}, timeout=20)
    wait_for(lambda: live.client.call("cast.status", {"session_id": sid, "cwd": str(project), "cast_id": cast_id},
                                      timeout=20).get("status") == "aborted", timeout=20, what="the cast aborted")
    browser.get(f"{live.url}?token={live.token}")  # the first page opened since it ended
    _first_push(browser)
    line = wait_for(lambda: browser.execute_script(
        f"const li = document.querySelector('[data-session=\"{sid}\"] li[data-ended=\"{cast_id}\"]');"
        " return li && li.textContent"), timeout=15, what="the aborted cast on its session's card")
    assert f"{cast_id} ended aborted" in line, line
    assert browser.execute_script(
        f"return document.querySelector('#attention li[data-trouble$=\"/cast/{cast_id}\"]')") is None
    browser.execute_script(f"document.querySelector('[data-session=\"{sid}\"] a[data-all-casts]').click()")
    row = wait_for(lambda: browser.execute_script(
        f"const tr = document.querySelector('#casts tr[data-cast=\"{cast_id}\"]');"
        " return tr && Array.from(tr.cells).map(td => td.textContent)"), timeout=15, what="the project's cast list")
    assert row[:2] == [cast_id, "aborted"], row
    browser.execute_script(f"document.querySelector('#casts tr[data-cast=\"{cast_id}\"] a').click()")
    wait_for(lambda: browser.execute_script(STATUS_JS).startswith("updated"), timeout=15,
             what="the aborted cast's page")
    assert browser.execute_script("return held.cast_id") == cast_id
    assert browser_errors(browser) == []
