"""A scripted answer that gives no usage is a turn that reported none -- as an OpenAI-compatible
server's answer without ``usage`` is -- recorded with ``unreported: ["tokens"]``, a
``usage_unreported`` event and, where a budget limit is set, a warning; never left out unseen.
A failed or stopped scripted turn without usage still reports nothing (it may have used nothing)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from castor.adapters.agents.scripted import parse_script
from castor.ports.agent import TurnUsage

REPO = Path(__file__).resolve().parents[2]


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "CASTOR_AGENT": "", "HOME": str(tmp_path / "home"),
            "PI_MATERIA_PROFILE_DIR": str(tmp_path / "profile"), "MATERIA_CONFIG": ""}


def test_an_answered_scripted_turn_without_usage_reports_an_empty_usage_a_failed_one_none() -> None:
    script = parse_script([{"text": "a"}, {"text": "b", "usage": None}, {"text": "c", "stop_reason": "length"},
                           {"error": "boom"}, {"text": "d", "stop_reason": "aborted"},
                           {"text": "e", "usage": {"input_tokens": 3}}])
    outcomes = [answer.outcome(f"t{i}") for i, answer in enumerate(script.by_socket["*"])]
    assert [o.usage for o in outcomes[:3]] == [TurnUsage()] * 3
    assert [o.usage for o in outcomes[3:5]] == [None, None]
    assert outcomes[5].usage is not None and outcomes[5].usage.input_tokens == 3


@pytest.mark.timeout(120)
def test_a_scripted_cast_whose_answers_give_no_usage_records_each_turn_as_unreported(tmp_path: Path) -> None:
    sockets = {f"Socket-{i}": {"type": "agent", "materia": "Step",
                               **({"edges": [{"when": "always", "to": f"Socket-{i + 1}"}]} if i < 2 else {})}
               for i in (1, 2)}
    config: dict[str, Any] = {"activeLoadout": "Two", "budget": {"maxTokens": 1000},
                              "materia": {"Step": {"prompt": "Step for {{request}}", "tools": "none"}},
                              "loadouts": {"Two": {"entry": "Socket-1", "sockets": sockets}}}
    project = tmp_path / "project"
    (project / ".pi").mkdir(parents=True)
    (project / ".pi" / "pi-materia.json").write_text(json.dumps(config))
    (project / "answers.json").write_text(json.dumps(["one", {"text": "two", "usage": {"input_tokens": 7}}]))
    result = subprocess.run([sys.executable, "-m", "castor", "cast", "build it", "--quiet", "--agent",
                             "script:answers.json"], cwd=project, env=_env(tmp_path), text=True,
                            capture_output=True, timeout=90)
    assert result.returncode == 0, result.stderr
    (run_dir,) = [p for p in (project / ".pi" / "pi-materia").iterdir() if p.is_dir()]
    usage = json.loads((run_dir / "usage.json").read_text())
    assert [(t["socket"], t.get("unreported")) for t in usage["turns"]] == [("Socket-1", ["tokens"]),
                                                                           ("Socket-2", ["cost"])]
    # (Socket-2's tokens came at no price: "cost", as for any model with none)
    assert usage["tokens"]["input"] == 7 and usage["costEstimated"] is True
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if line.strip()]
    assert [(e["data"]["socket"], e["data"]["figures"]) for e in events if e["type"] == "usage_unreported"] == [
        ("Socket-1", ["tokens"]), ("Socket-2", ["cost"])]
    assert "Socket-1's turn reported no token counts" in result.stderr, result.stderr
    assert "1 turn reported no usage" in result.stderr, result.stderr
