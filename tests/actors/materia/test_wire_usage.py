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


class PerMessageHarness(FakeHarness):
    """Reports a turn as the Pi extension does: each assistant message's usage map as the provider
    wrote it (``usages``), the answering model as an object, and the thinking level."""

    def __init__(self, client, session_id) -> None:
        super().__init__(client, session_id, {"*": ["done"] * 3})

    def _run_turn(self, params: dict) -> None:
        self.turns.append(params)

        def answer() -> None:
            self.client.call("agent.turn_ended", {
                "session_id": self.session_id, "turn_id": params["turn_id"], "text": "done", "stop_reason": "stop",
                # the summed map an older extension sends: it knows Pi's own names only, so it saw 0
                "usage": {"input": 0, "output": 0, "cache_read": 0, "cache_write": 0, "total_tokens": 0, "cost": None},
                "usages": [FORMATS["anthropic"], {"prompt_tokens": 7, "completion_tokens": 3,
                                                  "cost": {"input": 0.01, "output": 0.02, "totalFromProvider": True}}],
                "model": {"provider": "acme", "id": "m-1", "api": "openai-completions"}, "thinking_level": "high"})

        threading.Thread(target=answer, daemon=True).start()


@pytest.mark.timeout(60)
def test_per_message_usage_in_any_spelling_and_the_model_fields_reach_usage_json(served, project):
    write_project_config(project, {"activeLoadout": "One", "materia": {
        "S": {"prompt": "Step {{request}}", "tools": "none", "model": "acme/m-1", "thinking": "high"}},
        "loadouts": {"One": {"entry": "Socket-1", "sockets": {"Socket-1": {"type": "agent", "materia": "S"}}}}})
    client = served()
    PerMessageHarness(client, "pi-1")
    client.call("session.open", {"session_id": "pi-1", "cwd": str(project), "trusted": True})
    started = client.call("cast.start", {"session_id": "pi-1", "cwd": str(project), "request": "go"})
    done = wait_for(lambda: (v := client.call("cast.status", {"session_id": "pi-1", "cast_id": started["cast_id"]}))
                    ["status"] == "complete" and v, what="the cast's end")
    report = json.loads((Path(done["run_dir"]) / "usage.json").read_text())
    assert report["tokens"]["input"] == 107 and report["tokens"]["output"] == 53
    assert math.isclose(report["cost"]["total"], 0.63)
    assert (report["model"], report["provider"], report["api"], report["thinkingLevel"]) == (
        "m-1", "acme", "openai-completions", "high")
    # one message's cost was the provider's billed figure, the other's not said: pi-materia's kind
    # (actual: no subscription model), and castor's own flag that not all of it was billed
    assert report["costKind"] == "actual" and report["costEstimated"] is True
    [turn] = report["turns"]
    assert (turn["model"], turn["provider"], turn["api"], turn["thinkingLevel"]) == (
        "m-1", "acme", "openai-completions", "high")
    [selection] = report["modelSelections"]
    assert selection["requestedModel"] == "acme/m-1" and selection["provider"] == "acme"
    assert selection["model"] == "m-1" and selection["thinking"] == "high" and selection["source"] == "configured"
    assert selection["label"] == "acme/m-1" and selection["socket"] == "Socket-1"


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("usage", "named"), [(0.0012, "usage=0.0012"), ("12 tokens", 'usage="12 tokens"'),
                                               ([1, 2], "usage=[1, 2]")])
def test_a_usage_that_is_not_a_map_keeps_the_turn_and_is_named_unreadable(served, project, usage, named):
    """``agent.turn_ended`` refused the whole call (invalid_params) for a usage that was not a map:
    the answer was lost and the cast waited for it for ever."""
    write_project_config(project, {"activeLoadout": "One", "materia": {"S": {"prompt": "Step", "tools": "none"}},
                                   "loadouts": {"One": {"entry": "Socket-1", "sockets": {
                                       "Socket-1": {"type": "agent", "materia": "S"}}}}})
    client = served()
    UsageHarness(client, "pi-1", usage)
    client.call("session.open", {"session_id": "pi-1", "cwd": str(project), "trusted": True})
    started = client.call("cast.start", {"session_id": "pi-1", "cwd": str(project), "request": "go"})
    done = wait_for(lambda: (v := client.call("cast.status", {"session_id": "pi-1", "cast_id": started["cast_id"]}))
                    ["status"] != "active" and v, what="the cast's end")
    assert done["status"] == "complete", done
    report = json.loads((Path(done["run_dir"]) / "usage.json").read_text())
    assert [t.get("unreadable") for t in report["turns"]] == [[named]]
    events = [json.loads(line) for line in (Path(done["run_dir"]) / "events.jsonl").read_text().splitlines()]
    assert [e["data"]["figures"] for e in events if e["type"] == "usage_unreadable"] == [[named]]
