"""The run record of a multi-turn socket, as pi-materia writes it: each refinement in the manifest
(``socket_refinement`` with its turn), the context of every user-driven refinement turn
(``context_refinement`` with the turn it starts, in the event and in the manifest entry alike), and
the finalized output (``socket_output`` with ``finalized`` and the last refinement turn)."""

from __future__ import annotations

from typing import Any

import pytest

from castor.domain.materia.cast_messages import ContinueRequested, RefinementTurnStarted

from .scripted import Driver, agent, config, resolved

pytestmark = pytest.mark.timeout(10)


def test_a_refined_and_finalized_socket_records_each_turn_in_manifest_and_events() -> None:
    cfg = resolved(config({"Socket-1": {"type": "agent", "materia": "P", "parse": "json"}},
                          materia={"P": agent("Plan", "readOnly", multiTurn=True)}))
    d = Driver(cfg)
    d.reply("not json yet", entry_id="e1")
    d.send(RefinementTurnStarted)
    d.reply('{"summary": "draft"}', entry_id="e2")
    d.send(ContinueRequested)
    d.reply('{"summary": "final"}', entry_id="e3")
    entries: list[dict[str, Any]] = [e.manifest for e in d.effects if getattr(e, "manifest", None)]
    assert [e["refinementTurn"] for e in entries if e["kind"] == "socket_refinement"] == [1, 2]
    assert [e.get("refinementTurn") for e in entries if e["kind"] == "context_refinement"] == [2]
    outputs = [(e.get("finalized"), e.get("refinementTurn")) for e in entries if e["kind"] == "socket_output"]
    assert outputs == [(True, 2)]
    assert [e.data["refinementTurn"] for e in d.events("context_refinement")] == [2]
