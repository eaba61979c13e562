"""The soak's invariant checks detect each violation (so a green soak cannot be vacuous).

Each check is fed a clean input (zero) and a doctored one (non-zero): a torn or garbled
events.jsonl, a corrupt state.json, a duplicated utility visit, a replayed worker call, a
worker call that ran after it was rejected, and a stranded ask.
"""

from __future__ import annotations

import json
from pathlib import Path

from castor.messages.errors import Timeout, WorkerRetired
from castor.testing.soak import (
    SOAK_SUMMARY_PREFIX,
    AskLedger,
    AskRecord,
    MustBeZero,
    WorkerOutcome,
    build_loadout_config,
    count_bad_event_lines,
    count_duplicate_visits,
    count_replayed_worker_calls,
    count_stranded,
    count_unreadable_states,
    expected_sequence,
    is_ask_timeout,
)

GOOD_EVENTS = [{"ts": 1, "type": "cast_start", "data": {}}, {"ts": 2, "type": "cast_end", "data": {"ok": True}}]


def _run_dir(root: Path, name: str, lines: list[str] | bytes) -> Path:
    run = root / name
    run.mkdir(parents=True)
    data = lines if isinstance(lines, bytes) else "".join(line + "\n" for line in lines).encode()
    (run / "events.jsonl").write_bytes(data)
    return run


def test_events_check_counts_garbled_torn_and_typeless_lines(tmp_path):
    clean = _run_dir(tmp_path, "clean", [json.dumps(e) for e in GOOD_EVENTS])
    assert count_bad_event_lines([clean]) == 0
    garbled = _run_dir(tmp_path, "garbled", [json.dumps(GOOD_EVENTS[0]), '{"ts": 2, "type": "socket_st'])
    typeless = _run_dir(tmp_path, "typeless", [json.dumps({"ts": 3, "data": {}}), "[1, 2]"])
    torn = _run_dir(tmp_path, "torn", (json.dumps(GOOD_EVENTS[0]) + "\n" + '{"ts": 4, "ty').encode())
    assert count_bad_event_lines([garbled]) == 1
    assert count_bad_event_lines([typeless]) == 2
    assert count_bad_event_lines([torn]) == 1
    assert count_bad_event_lines([clean, garbled, typeless, torn]) == 4


def _state_doc(cast_id: str, run_dir: Path) -> dict:
    from castor.adapters.materia.config_loader import load_resolved
    from castor.domain.materia.cast_messages import CastStarted
    from castor.domain.materia.engine import step

    project = run_dir.parent.parent.parent
    resolved = load_resolved(project)
    start = CastStarted(cast_id=cast_id, request="r", config=resolved, cwd=str(project), run_dir=str(run_dir),
                        artifact_root=str(run_dir.parent), at=1.0)
    return step(None, start).state.model_dump(mode="json")


def test_state_check_counts_corrupt_and_missing_state_files(tmp_path):
    from castor.adapters.materia.state_store import CastStateStore

    project = tmp_path / "project"
    root = project / ".pi" / "pi-materia"
    root.mkdir(parents=True)
    store = CastStateStore(root)
    for cast_id in ("2026-01-01T00-00-00-000Z", "2026-01-01T00-00-01-000Z", "2026-01-01T00-00-02-000Z"):
        (root / cast_id).mkdir()
        fence = store.claim(cast_id)
        store.save(cast_id, _state_doc(cast_id, root / cast_id), incarnation=fence)
    assert count_unreadable_states([root]) == 0
    (root / "2026-01-01T00-00-01-000Z" / "state.json").write_text('{"revision": 3, "state": {"cast_')
    (root / "2026-01-01T00-00-02-000Z" / "state.json").unlink()
    (root / "2026-01-01T00-00-02-000Z" / "events.jsonl").write_text(json.dumps(GOOD_EVENTS[0]) + "\n")  # a cast's
    assert count_unreadable_states([root]) == 2
    # A start killed before its cast's first save (what a cast host's kill -9 can leave) is no cast:
    # not counted. With anything of a cast's in it, it is.
    bare = root / "2026-01-01T00-00-03-000Z"
    for sub in ("sockets", "contexts"):
        (bare / sub).mkdir(parents=True)
    (bare / "owner.lock").touch()
    (bare / ".state.json.123.9085c2e40.tmp").write_text("{")
    assert count_unreadable_states([root]) == 2
    (bare / "sockets" / "Socket-1").mkdir()
    assert count_unreadable_states([root]) == 3


def test_visit_check_counts_a_duplicated_visit_and_a_run_without_a_visit_id(tmp_path):
    log = tmp_path / "visits.log"
    log.write_text("c1:Socket-6:1:8\nc1:Socket-6:2:11\nc2:Socket-6:1:8\n")
    assert count_duplicate_visits(log) == (0, 0)
    log.write_text(log.read_text() + "c1:Socket-6:2:11\nc1:Socket-6:2:11\nmissing\n")
    assert count_duplicate_visits(log) == (2, 1)
    assert count_duplicate_visits(tmp_path / "absent.log") == (0, 0)


def _start(call_id: str, t: float) -> dict:
    return {"pid": 1, "seq": 1, "call": "tools.fabric_write", "phase": "start", "t": t,
            "args": [{"type": "note", "summary": call_id, "content": "soak"}], "kwargs": {}}


def test_worker_check_counts_replays_and_calls_run_after_their_rejection():
    a, b, c, d = (f"{SOAK_SUMMARY_PREFIX}s-1-{n}" for n in range(1, 5))
    log = [_start(a, 10.0), {"phase": "end", "call": "tools.fabric_write", "t": 10.1}, _start(b, 11.0),
           _start(c, 12.0), {"phase": "start", "call": "hooks.on_session_end", "t": 13.0, "args": []}]
    outcomes = [WorkerOutcome(call_id=a, ok=True, code="ok", ended_at=10.2),
                # c timed out while running: it may have started, and it did, before the rejection
                WorkerOutcome(call_id=c, ok=False, code="timeout", may_have_started=True, ended_at=12.5),
                # d was rejected from the queue and never ran
                WorkerOutcome(call_id=d, ok=False, code="worker_retired", may_have_started=False, ended_at=12.5)]
    assert count_replayed_worker_calls(log, outcomes) == 0
    replayed = log + [_start(a, 20.0)]  # a call id executed twice
    assert count_replayed_worker_calls(replayed, outcomes) == 1
    ran_after_queue_rejection = log + [_start(d, 12.4)]
    assert count_replayed_worker_calls(ran_after_queue_rejection, outcomes) == 1
    started_after_rejection = [r for r in log if r is not log[3]] + [_start(c, 12.6)]  # c began after its timeout
    assert count_replayed_worker_calls(started_after_rejection, outcomes) == 1


def test_stranded_asks_are_those_past_their_deadline_or_never_answered():
    ok = AskRecord(kind="x", started=0.0, deadline=10.0, ended=3.0)
    late = AskRecord(kind="x", started=0.0, deadline=10.0, ended=11.5)
    never = AskRecord(kind="x", started=0.0, deadline=10.0, ended=None)
    timed_out = AskRecord(kind="x", started=0.0, deadline=10.0, ended=10.0, ask_timeout=True)
    assert count_stranded([ok]) == 0
    assert count_stranded([ok, late, never, timed_out]) == 3


def test_ledger_tells_an_ask_level_timeout_from_a_callee_error():
    ledger = AskLedger()

    def nobody_answered():
        raise Timeout("ask materia.session.call to /root/x timed out",
                      data={"path": "/root/x", "message_type": "materia.session.call"})

    def worker_said_no():
        raise WorkerRetired("queued call rejected", data={"path": "/root/w"}, may_have_started=False)

    ledger.run("a", 5.0, nobody_answered)
    ledger.run("b", 5.0, worker_said_no)
    ledger.run("c", 5.0, lambda: 42)
    records = ledger.snapshot()
    assert [r.ask_timeout for r in records] == [True, False, False]
    assert [r.error for r in records] == ["timeout", "worker_retired", None]
    assert count_stranded(records) == 1
    assert not is_ask_timeout(Timeout("icarus call timed out", data={"target": "tools.x"}))


def test_must_be_zero_reports_only_the_violations():
    assert MustBeZero().violations() == {}
    assert MustBeZero(worker_calls_replayed=1, stranded_asks=0).violations() == {"worker_calls_replayed": 1}


def test_the_workload_is_the_bundled_build_loop_with_a_real_command(tmp_path):
    from castor.domain.materia.defaults import default_config

    config = build_loadout_config(tmp_path / "visits.log")
    build = config["loadouts"]["build"]
    bundled = default_config()["loadouts"]["build"]
    assert set(build["sockets"]) == set(bundled["sockets"]) and build["loops"] == bundled["loops"]
    for sid, socket in bundled["sockets"].items():
        if sid != "Socket-6":
            assert build["sockets"][sid] == socket
    assert build["sockets"]["Socket-6"]["command"][-2] == str(tmp_path / "visits.log")
    assert expected_sequence(1) == ["Socket-1", "Socket-2", "Socket-3", "Socket-4", "Socket-5", "Socket-4",
                                    "Socket-5", "Socket-6", "Socket-7"]
