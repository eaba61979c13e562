"""A directory of a project's run tree swapped for a link while ``castor serve --console`` runs.

The console found a cast's run directory once (the cast live, or its page visited) and then read
its ``state.json``, ``usage.json`` and ``events.jsonl`` by path, protecting the last component
alone (``O_NOFOLLOW``): another local user who can write in the run tree swapped the run
directory, or a directory above it, for a link to a directory outside the project, and the
console showed what that directory held. Every read now walks the path a component at a time
with directory descriptors, none followed if it is a link: the cast's page is ``forbidden``
naming the link, its stream pushes that refusal, the listings leave the cast out or name it
unreadable, and nothing behind the link reaches any answer.
"""

from __future__ import annotations

import http.client
import json
import os
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from castor.client import Client
from tests.console.conftest import LOADOUT, TOKENS, start_console, stop
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(120)

SECRET = "SECRET-behind-the-link-7f3a"
SAVED = "2026-01-01T00-00-00-000Z"


def _get(url: str) -> tuple[int, str]:
    """``url``'s status and body, with the console's token."""
    token = next(token for base, token in TOKENS.items() if url.startswith(base))
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def _first_push(url: str, path: str) -> tuple[int, str]:
    """The status of the stream at ``path`` and its first ``data:`` line (its body when refused)."""
    token = next(token for base, token in TOKENS.items() if url.startswith(base))
    parsed = urlsplit(url)
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=10)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"})
        response = conn.getresponse()
        if response.status != 200:
            return response.status, response.read().decode()
        line = b""
        while not line.startswith(b"data: "):
            line = response.fp.readline()
        return response.status, line.decode()
    finally:
        conn.close()


def _cast_files(run_dir: Path, request: str) -> None:
    """A failed cast's files as castor writes them (state, usage, events), naming ``request``."""
    from castor.adapters.materia.state_store import CastStateStore

    run_dir.parent.mkdir(parents=True, exist_ok=True)
    store = CastStateStore(run_dir.parent)
    cast_id = run_dir.name
    store.save(cast_id, {"version": 2, "active": False, "phase": "failed", "failedReason": f"boom {request}",
                         "request": request, "updatedAt": time.time()}, incarnation=store.claim(cast_id))
    (run_dir / "usage.json").write_text(json.dumps({"tokens": {"total": 7}, "bySocket": {request: {}}}))
    (run_dir / "events.jsonl").write_text(json.dumps({"ts": "t", "type": "cast_start",
                                                      "data": {"request": request}}) + "\n")


def _answers(url: str, sid: str, cast_id: str) -> dict[str, tuple[int, str]]:
    """What every route that reads a cast's files answers now."""
    return {
        "cast page": _get(f"{url}cast/{sid}/{cast_id}"),
        "cast stream": _first_push(url, f"/events/cast/{sid}/{cast_id}"),
        "casts listing": _get(f"{url}casts/{sid}"),
        "actors": _get(f"{url}api/actors"),
        "main stream": _first_push(url, "/events"),
        "metrics": _get(f"{url}metrics"),
    }


@pytest.mark.parametrize("swapped", ["run_directory", "artifact_root", "directory_above_the_artifact_root"])
def test_a_run_tree_directory_swapped_for_a_link_never_shows_what_lies_behind_it(tmp_path, swapped):
    server, url, sock = start_console(tmp_path)
    client = Client.connect_unix(str(sock))
    project = tmp_path / "project"
    root = project / ".pi" / "pi-materia"
    _cast_files(root / SAVED, "the project's own request")
    elsewhere = tmp_path / "elsewhere"  # outside the project: what the link leads to
    _cast_files(elsewhere / ".pi" / "pi-materia" / SAVED, SECRET)
    try:
        client.call("session.open", {"session_id": "s", "cwd": str(project), "trusted": True}, timeout=20)
        status, page = _get(f"{url}cast/s/{SAVED}")
        assert status == 200, page
        status, push = _first_push(url, f"/events/cast/s/{SAVED}")
        assert status == 200 and "the project's own request" in push, push  # the console knows its run directory
        assert _get(f"{url}casts/s")[0] == 200
        moved = {"run_directory": root / SAVED, "artifact_root": root,
                 "directory_above_the_artifact_root": project / ".pi"}[swapped]
        target = {"run_directory": elsewhere / ".pi" / "pi-materia" / SAVED,
                  "artifact_root": elsewhere / ".pi" / "pi-materia",
                  "directory_above_the_artifact_root": elsewhere / ".pi"}[swapped]
        moved.rename(moved.with_name(moved.name + ".moved"))
        moved.symlink_to(target, target_is_directory=True)
        answers = _answers(url, "s", SAVED)
        for route, (status, body) in answers.items():
            assert SECRET not in body, (route, status, body[:2000])
            assert status != 500, (route, body[:2000])
        for route in ("cast page", "cast stream"):  # the link named (once refused, the artifact root's check names it)
            status, body = answers[route]
            assert status == 403 and ("symbolic link" in body or "(symlink)" in body), (route, body)
    finally:
        client.close()
        stop(server)


def test_a_live_cast_s_run_directory_swapped_for_a_link_is_refused_on_its_page_and_stream(tmp_path):
    """The run directory a live cast's actor reports is read as found: swapped for a link while the
    cast waits on its agent, its page is ``forbidden`` naming the link, and nothing behind it is shown."""
    server, url, sock = start_console(tmp_path)
    client = Client.connect_unix(str(sock))
    turns: list[dict] = []
    client.on_notification("agent.run_turn", turns.append)
    client.on_request("session.append_entry", lambda p: {"ok": True, "entry_id": "e"})
    project = tmp_path / "project"
    project.mkdir()
    try:
        client.call("session.open", {"session_id": "s", "cwd": str(project), "trusted": True}, timeout=20)
        client.call("loadout.set", {"session_id": "s", "cwd": str(project), "name": LOADOUT}, timeout=20)
        started = client.call("cast.start", {"session_id": "s", "cwd": str(project), "request": "live one"},
                              timeout=20)
        cast_id = started.get("cast_id") or started["cast"]["cast_id"]
        wait_for(lambda: turns, timeout=30, what="the cast's first agent turn")
        status, push = _first_push(url, f"/events/cast/s/{cast_id}")
        assert status == 200 and "live one" in push
        run_dir = project / ".pi" / "pi-materia" / cast_id
        theirs = tmp_path / "elsewhere" / cast_id
        theirs.parent.mkdir()
        _cast_files(theirs, SECRET)
        os.rename(run_dir, run_dir.with_name(cast_id + ".moved"))
        run_dir.symlink_to(theirs, target_is_directory=True)
        answers = _answers(url, "s", cast_id)
        for route, (status, body) in answers.items():
            assert SECRET not in body, (route, status, body[:2000])
            assert status != 500, (route, body[:2000])
        assert answers["cast page"][0] == 403 and "symbolic link" in answers["cast page"][1]
    finally:
        client.close()
        stop(server)
