"""pi-materia writes its events and manifest entries with ``JSON.stringify``: a field whose value is
unset (a utility socket's ``materia`` and ``materiaModel``, a failure's ``entryId`` when there is no
entry, the failed entry's ``itemKey`` outside a loop) is left out, not written ``null``. castor wrote
``"materia": null`` in a utility socket's ``socket_start``/``socket_complete``, and ``null`` for the
unset fields of the failed manifest entry. Only the values pi-materia itself writes as ``null``
stay (a command's exit ``code``/``signal``, as Node reports them). Each test runs a fresh project."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conformance.test_cli_run_records import cast

REPO = Path(__file__).resolve().parents[2]

#: pi-materia's event types (its catalogue); castor's own events are documented with their own shapes.
PI_MATERIA_EVENTS = {
    "cast_start", "socket_start", "materia_model_settings", "context_refinement", "socket_refinement",
    "socket_complete", "utility_input", "utility_command", "budget_warning", "budget_limit",
    "proactive_compaction_start", "proactive_compaction_complete", "proactive_compaction_failed",
    "transient_transport_turn_failure", "same_socket_recovery_start", "same_socket_recovery_action_start",
    "same_socket_recovery_action_complete", "same_socket_recovery_action_failed", "same_socket_recovery_retry",
    "same_socket_recovery_retry_failed", "same_socket_recovery_exhausted", "cast_recast", "cast_revive", "cast_end",
}
NULL_AS_PI_MATERIA_WRITES = {("utility_command", "code"), ("utility_command", "signal")}


def _null_paths(value: Any, at: str = "") -> list[str]:
    if value is None:
        return [at]
    if isinstance(value, dict):
        return [p for key, item in value.items() for p in _null_paths(item, f"{at}/{key}" if at else key)]
    if isinstance(value, list):
        return [p for i, item in enumerate(value) for p in _null_paths(item, f"{at}/{i}")]
    return []


def _nulls(run_dir: Path) -> list[tuple[str, str]]:
    """Every unset value (at any depth: ``cast_end``'s usage report is ``usage.json``'s, which
    leaves them out too) of pi-materia's events and of the manifest entries."""
    rows = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    found = [(row["type"], key) for row in rows if row["type"] in PI_MATERIA_EVENTS
             for key in _null_paths(row["data"])]
    found += [(f"manifest:{entry['phase']}", key)
              for entry in json.loads((run_dir / "manifest.json").read_text())["entries"]
              for key, value in entry.items() if value is None]
    return [f for f in found if f not in NULL_AS_PI_MATERIA_WRITES]


@pytest.mark.timeout(120)
def test_a_utility_socket_then_an_agent_socket_write_no_unset_field_as_null(tmp_path: Path) -> None:
    run_dir = cast(tmp_path, {
        "Socket-1": {"type": "utility", "utility": "echo", "params": {"text": "x"},
                     "edges": [{"when": "always", "to": "Socket-2"}]},
        "Socket-2": {"type": "agent", "materia": "A"},
    }, ["done"])
    assert _nulls(run_dir) == []
    rows = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    utility_start = next(r["data"] for r in rows if r["type"] == "socket_start" and r["data"]["socket"] == "Socket-1")
    assert "materia" not in utility_start and utility_start["type"] == "utility"
    agent_start = next(r["data"] for r in rows if r["type"] == "socket_start" and r["data"]["socket"] == "Socket-2")
    assert agent_start["materia"] == "A"


@pytest.mark.timeout(120)
def test_a_cast_failed_at_a_utility_command_writes_no_unset_field_as_null(tmp_path: Path) -> None:
    run_dir = cast(tmp_path, {
        "Socket-1": {"type": "utility", "command": [sys.executable, "-c", "import sys; sys.exit(7)"]},
    }, [])
    assert _nulls(run_dir) == []
    manifest = json.loads((run_dir / "manifest.json").read_text())["entries"]
    failed = manifest[-1]
    assert failed["phase"] == "failed" and failed["socket"] == "Socket-1" and "materia" not in failed
    rows = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    (command,) = [r["data"] for r in rows if r["type"] == "utility_command"]
    assert command["code"] == 7 and command["signal"] is None  # Node's close(code, signal): kept as written
