"""A long-lived server keeps nothing per finished cast or closed session (issue 21, "flat for weeks").

One runtime behind a real Unix-socket server, driven as ``bench/longrun.py`` drives ``castor serve``:
each session is a new connection that opens a session, runs casts of the one-socket ``hello``
loadout one after another (turns answered at once), closes the session and disconnects. After a
warm-up, the live Python objects by type and the registry's actors are counted, and castor's live
allocations by site (tracemalloc), and again after each of two rounds of sessions: the actors are
back where they were, and no type and no allocation site in castor grew by one per session or more
in both rounds (what one cast or one session kept would; what only wobbles does not grow twice). What a user can
still ask for stays on disk: every cast is still listed and its status read afterwards.
"""

from __future__ import annotations

import collections
import gc
import json
import tracemalloc
from pathlib import Path

import pytest

import castor
from castor.client import Client
from castor.endpoint.app import build_dispatcher
from castor.endpoint.server import Server
from castor.testing.instant_harness import InstantHarness

from .helpers import make_runtime, wait_for

CASTS_PER_SESSION = 3


class _Session(InstantHarness):
    """One harness connection on the test's socket (castor.testing.instant_harness)."""

    def __init__(self, sock: str, sid: str, project: Path) -> None:
        super().__init__(Client.connect_unix(sock, default_timeout=15), sid, project, client_name="test-retention")

    def cast(self) -> str:  # type: ignore[override]  # the test's one request and deadline
        return super().cast("flat", timeout_s=15)


def _live_types() -> collections.Counter[str]:
    gc.collect()
    return collections.Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.get_objects())


_CASTOR = str(Path(castor.__file__).parent)


def _kept(before: tracemalloc.Snapshot, after: tracemalloc.Snapshot, at_least: int) -> dict[str, int]:
    """The allocation sites in castor's code (a castor frame in the traceback, none of this test's
    harness) with at least ``at_least`` more live blocks in ``after``, by their innermost castor frame."""
    kept: dict[str, int] = {}
    for stat in after.compare_to(before, "traceback"):
        if stat.count_diff < at_least:
            continue
        files = [frame.filename for frame in stat.traceback]
        if __file__ in files:
            continue
        inner = next((f for f in reversed(stat.traceback) if f.filename.startswith(_CASTOR)), None)
        if inner is not None:
            where = f"{inner.filename[len(_CASTOR) + 1:]}:{inner.lineno}"
            kept[where] = kept.get(where, 0) + stat.count_diff
    return kept


@pytest.mark.timeout(300)
def test_finished_casts_and_closed_sessions_leave_nothing_in_memory(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / ".pi").mkdir(parents=True)
    (project / ".pi" / "pi-materia.json").write_text(json.dumps({"activeLoadout": "hello"}))
    sock = str(tmp_path / "castor.sock")
    runtime = make_runtime()
    server = Server(build_dispatcher(runtime), unix_path=sock).start()
    ran: list[int] = []  # counts, not the decoded cast ids: this test's own copies would read as kept
    first_cast: list[str] = []
    counter = iter(range(10_000))

    def sessions(count: int) -> None:
        for _ in range(count):
            session = _Session(sock, f"retention-{next(counter)}", project)
            for _ in range(CASTS_PER_SESSION):
                cast_id = session.cast()
                if not first_cast:
                    first_cast.append(cast_id)
                ran.append(1)
            session.close()

    def settled() -> tuple[int, collections.Counter[str], tracemalloc.Snapshot]:
        # A closed connection's threads and a stopped cast's actor go a moment after the answer.
        wait_for(lambda: len(runtime.system.registry.handles()) <= actors_floor or None, timeout=10,
                 what="the finished casts' and closed sessions' actors gone")
        types = _live_types()
        return len(runtime.system.registry.handles()), types, tracemalloc.take_snapshot()

    tracemalloc.start(6)
    try:
        actors_floor = len(runtime.system.registry.handles())
        sessions(4)  # warm-up: what fills once (config cache, cast index, codecs) fills here
        rounds = [settled()]
        measured = 12
        for _ in range(2):
            sessions(measured)
            rounds.append(settled())
        assert [actors for actors, _, _ in rounds] == [rounds[0][0]] * 3
        # Kept per session or per cast: grown by one per session or more in both rounds. (A count
        # that only wobbles - a connection's worker thread still parked, a lock's bound methods -
        # does not grow twice.)
        (_, base, _), (_, first, _), (_, last, _) = rounds
        grown = {name: (first[name] - base[name], last[name] - first[name]) for name in last
                 if min(first[name] - base[name], last[name] - first[name]) >= measured}
        assert not grown, f"kept per session or per cast ({measured} sessions of {CASTS_PER_SESSION} casts): {grown}"
        # Objects the collector does not track (a dict of strings, a string, bytes), by where castor
        # allocated them: a site holding two more blocks per session or more after both rounds. Why
        # two: a config-merge site was seen 16 then 13 blocks up over 12 sessions (allocator-level
        # reuse of a bounded cache's slots), so one per session would fail now and then on nothing;
        # a block kept per cast is 3 per session here, and an entry kept per session is a key and
        # a value (two blocks at least), so both still fail this.
        per_site = 2 * measured
        first_kept = _kept(rounds[0][2], rounds[1][2], per_site)
        last_kept = _kept(rounds[1][2], rounds[2][2], per_site)
        both = {where: (first_kept[where], last_kept[where]) for where in first_kept.keys() & last_kept.keys()}
        assert not both, f"castor kept blocks per session or per cast at: {both}"
        # Nothing a user can still ask for was lost: every cast is listed and its status read.
        reader = _Session(sock, "retention-reader", project)
        listed = reader.client.call("cast.list", {"session_id": reader.sid, "limit": 1000})
        assert listed["total"] == len(ran)
        status = reader.client.call("cast.status", {"session_id": reader.sid, "cast_id": first_cast[0]})
        assert status["status"] == "complete"
        reader.close()
    finally:
        tracemalloc.stop()
        server.stop()
        runtime.shutdown(10)
