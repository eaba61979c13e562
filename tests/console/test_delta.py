"""The main stream's patches (castor.console.delta): what the page holds after applying them is
what a whole push says, and a push of nothing that changed is a few bytes."""

from __future__ import annotations

import copy
import json
import random

import pytest

from castor.console import delta

pytestmark = pytest.mark.timeout(30)


def _actor(path: str, age: float, *, text: str = "idle", processed: int = 0) -> dict:
    return {"path": path, "kind": "CastActor", "uptime_s": age + 1.0, "restarts": 0,
            "mailbox": {"depth": 0, "oldest_age_s": None, "processed": processed, "queued": [],
                        "in_flight": {"message_type": "x", "since_s": age}},
            "activity": {"kind": "cast", "text": text, "age_s": age, "deadline_in_s": 30.0 - age, "data": {}},
            "last_failure": None, "labels": {}}


def _doc(at: float, actors: list[dict], ended: list[dict] | None = None) -> dict:
    return {"at": at, "actors": actors,
            "sessions": [{"session_id": "s", "path": "/root/session/s", "casts": [
                {"cast_id": a["path"].rsplit("/", 1)[1], "path": a["path"], "waiting_s": a["activity"]["age_s"],
                 "deadline_in_s": a["activity"]["deadline_in_s"], "socket_actors": []} for a in actors],
                "ended": ended or []}],
            "workers": []}


def test_a_push_of_a_tree_where_only_time_passed_is_its_time_alone():
    """Every age and deadline moves every second; anchored, they stand still, so the patch of a
    second where nothing happened is the push's time alone (it was the whole tree)."""
    actors = [_actor(f"/root/session/s/cast/c{n:03d}", 5.0 + n) for n in range(200)]
    first = delta.anchor(_doc(1000.0, actors), 1000.0)
    later = [_actor(a["path"], a["activity"]["age_s"] + 1.0) for a in actors]
    second = delta.anchor(_doc(1001.0, later), 1001.0, first)
    change = delta.patch(first, second)
    assert change == {"set": {"at": 1001.0}}
    assert len(json.dumps(change)) < len(json.dumps(second)) / 1000


def test_an_anchored_time_that_jitters_within_the_slack_keeps_its_value():
    first = delta.anchor({"age_s": 2.0}, 100.0)
    assert delta.anchor({"age_s": 3.03}, 101.0, first) == first  # 0.03 s off: the same moment
    assert delta.anchor({"age_s": 3.2}, 101.0, first) == {"age_s": 97.8}  # 0.2 s off: a new moment


def test_a_mapping_read_at_its_own_moment_counts_its_times_from_it():
    """An actor's figures are read at its own moment, up to a paced snapshot's length before the
    push's ``at``: anchored from that moment, they do not move with the snapshot's length."""
    actor = {"path": "/a", "age_s": 1.5, "data": {"age_s": 0.5}}
    anchored = delta.anchor({"at": 100.0, "actors": [actor], "age_s": 1.0}, 100.0, None, {id(actor): 99.5})
    assert anchored["actors"][0] == {"path": "/a", "age_s": 98.0, "data": {"age_s": 99.0}}
    assert anchored["age_s"] == 99.0


def test_patches_turn_every_push_into_the_next_through_adds_removals_moves_and_changes():
    """A run of random pushes (actors appear, go, change, reorder; casts end): the page's document,
    patched push after push, is each push's whole document; unanchored, it says what the push's
    figures said, each time within the slack."""
    rng = random.Random(7)
    paths = [f"/root/session/s/cast/c{n:03d}" for n in range(40)]
    live = {p: rng.uniform(0, 50) for p in paths[:20]}
    ended: list[dict] = []
    at, previous, held = 1000.0, None, None
    for step in range(60):
        at += rng.uniform(0.5, 1.5)
        for path in list(live):
            live[path] += at - (at - 1.0)
            if rng.random() < 0.1:
                del live[path]
                ended.insert(0, {"cast_id": path.rsplit("/", 1)[1], "status": "failed", "ended_at": at})
        for path in paths:
            if path not in live and rng.random() < 0.05:
                live[path] = 0.0
        order = sorted(live) if step % 7 else sorted(live, reverse=True)  # now and then the order moves
        doc = _doc(at, [_actor(p, live[p], text=f"t{int(live[p]) // 10}", processed=int(live[p]) // 5)
                        for p in order], ended[:5])
        anchored = delta.anchor(doc, at, previous)
        if previous is None:
            held = json.loads(json.dumps(anchored))
        else:
            change = delta.patch(previous, anchored)
            before = copy.deepcopy(held)
            held = delta.apply(held, json.loads(json.dumps(change)))
            assert before == json.loads(json.dumps(previous))  # applying leaves the old document as it was
        assert held == anchored, step
        shown = delta.unanchor(held, held["at"])
        for was, now in zip(doc["actors"], shown["actors"], strict=True):
            assert was["path"] == now["path"]
            assert abs(was["activity"]["age_s"] - now["activity"]["age_s"]) < delta.ANCHOR_SLACK_S
            assert abs(was["activity"]["deadline_in_s"] - now["activity"]["deadline_in_s"]) < delta.ANCHOR_SLACK_S
        previous = anchored


def test_a_list_whose_kept_items_moved_is_sent_with_its_order():
    old = [{"path": "/a"}, {"path": "/b"}, {"path": "/c"}]
    new = [{"path": "/c"}, {"path": "/a"}, {"path": "/d"}]
    change = delta.patch(old, new)
    assert change is not None and change["order"] == ["/c", "/a", "/d"] and change["del"] == ["/b"]
    assert delta.apply(old, change) == new
    added = delta.patch(old, [{"path": "/0"}, *old, {"path": "/z"}])
    assert added is not None and added["add"] == [["/0", None], ["/z", "/c"]] and "order" not in added
