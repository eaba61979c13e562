"""A harness reporting usage on ``agent.turn_ended`` in any provider's shape, over a real socket:
castor reads every alias pi-materia reads (nested ``cost`` objects included), ``usage.json``
shows the cost and ``budget.maxCostUsd`` stops the cast."""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path

import pytest

from tests.conformance.test_usage_formats import FORMATS

from .helpers import wait_for, write_project_config
from .test_endpoint import FakeHarness


class UsageHarness(FakeHarness):
    def __init__(self, client, session_id, usage) -> None:
        super().__init__(client, session_id, {"*": ["done"] * 3})
        self.usage = usage

    def _run_turn(self, params: dict) -> None:
        self.turns.append(params)

        def answer() -> None:
            self.client.call("agent.turn_ended", {"session_id": self.session_id, "turn_id": params["turn_id"],
                                                  "text": "done", "stop_reason": "stop", "usage": self.usage})

        threading.Thread(target=answer, daemon=True).start()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_wire_usage_in_each_provider_format_counts_and_the_budget_stops_the_cast(served, project, fmt):
    step = {"prompt": "Step {{request}}", "tools": "none"}
    write_project_config(project, {"activeLoadout": "Three", "budget": {"maxCostUsd": 1.0}, "materia": {"S": step},
                                   "loadouts": {"Three": {"entry": "Socket-1", "sockets": {
                                       f"Socket-{i}": {"type": "agent", "materia": "S",
                                                       **({"edges": [{"when": "always", "to": f"Socket-{i + 1}"}]}
                                                          if i < 3 else {})} for i in (1, 2, 3)}}}})
    client = served()
    usage = {**FORMATS[fmt], "odd": float("nan")}  # one non-finite figure: dropped, the rest still counts
    harness = UsageHarness(client, "pi-1", usage)
    client.call("session.open", {"session_id": "pi-1", "cwd": str(project), "trusted": True})
    started = client.call("cast.start", {"session_id": "pi-1", "cwd": str(project), "request": "go"})
    done = wait_for(lambda: (v := client.call("cast.status", {"session_id": "pi-1", "cast_id": started["cast_id"]}))
                    ["status"] == "failed" and v, what="the budget stop")
    assert "budget limit reached" in done["failed_reason"]
    assert len(harness.turns) == 2
    report = json.loads((Path(done["run_dir"]) / "usage.json").read_text())
    assert math.isclose(report["cost"]["total"], 1.2) and report["tokens"]["total"] == 330
