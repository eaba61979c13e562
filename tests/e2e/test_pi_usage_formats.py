"""Usage the provider reports in odd forms, through the real Pi and the real castor.

Pi reads an OpenAI-compatible provider's ``usage`` with plain arithmetic: a figure written as a
string stays a string (and turns Pi's ``totalTokens`` into a concatenated string), figures past a
double's range make ``Infinity``, a stream with no usage leaves zeros. castor counts none of the
figures that are not numbers (as pi-materia), keeps every total a finite number, and says which
figures it skipped: each turn's record (``usage.json`` ``turns[].unreadable``), a
``usage_unreadable`` event per such turn, and one warning in Pi per cast.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from .fake_llm import OMIT_USAGE
from .test_pi_castor_e2e import project_with_loadout, up, wait_cast_end

pytestmark = [pytest.mark.pi, pytest.mark.timeout(60)]

THREE = {
    "artifactDir": ".pi/pi-materia",
    "activeLoadout": "Three",
    "budget": {"maxTokens": 10_000_000_000_000_000_000, "stopAtLimit": False},
    "materia": {name: {"prompt": f"{name.upper()}-MATERIA: go.", "tools": "none"} for name in ("A", "B", "C")},
    "loadouts": {"Three": {"entry": "Socket-1", "sockets": {
        "Socket-1": {"type": "agent", "materia": "A", "edges": [{"when": "always", "to": "Socket-2"}]},
        "Socket-2": {"type": "agent", "materia": "B", "edges": [{"when": "always", "to": "Socket-3"}]},
        "Socket-3": {"type": "agent", "materia": "C"},
    }}},
}


def strict_json(text: str) -> Any:
    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} in a file that must be JSON")
    return json.loads(text, parse_constant=refuse)


def test_odd_provider_usage_never_breaks_a_cast_or_its_totals_and_what_is_skipped_is_said(
        start_pi, castor_command, fake_llm, tmp_path):
    project = project_with_loadout(tmp_path, THREE)
    fake_llm.reply_text("A done", when="A-MATERIA", usage={"prompt_tokens": 10, "completion_tokens": "5"})
    fake_llm.reply_text("B done", when="B-MATERIA", usage={"prompt_tokens": 1e308, "completion_tokens": 1e308})
    fake_llm.reply_text("C done", when="C-MATERIA", usage=OMIT_USAGE)
    pi = start_pi(castor_command, cwd=project, settings={"defaultProjectTrust": "always"})
    up(pi)
    start = pi.command("/materia cast count it")
    run_dir, events = wait_cast_end(pi, project, start=start)
    assert events[-1]["data"]["ok"] is True, events[-1]

    report = strict_json((run_dir / "usage.json").read_text())
    turns = report["turns"]
    assert [t["socket"] for t in turns] == ["Socket-1", "Socket-2", "Socket-3"]
    # Pi's own arithmetic: output "5", totalTokens 10 + "5" + 0 + 0 = "10500"; neither is counted.
    assert turns[0]["unreadable"] == ['output="5"', 'totalTokens="10500"'], turns[0]
    assert turns[0]["tokens"] == {"input": 10, "output": 0, "cacheRead": 0, "cacheWrite": 0, "total": 10}
    # 1e308 + 1e308 is Infinity in Pi: the extension sends it by name, castor caps what it reads.
    assert turns[1]["unreadable"] == ['totalTokens="Infinity"'], turns[1]
    assert turns[1]["tokens"]["input"] == 1e18 and turns[1]["tokens"]["total"] == 1e18
    # No usage from the provider: Pi's zeros, nothing skipped, the cost an estimate.
    assert turns[2]["unreadable"] is None and turns[2]["tokens"]["total"] == 0
    assert report["tokens"]["total"] == 1e18 and report["costEstimated"] is True
    noted = [e["data"] for e in events if e["type"] == "usage_unreadable"]
    assert [n["socket"] for n in noted] == ["Socket-1", "Socket-2"]
    warnings = [e["message"] for e in pi.ui("notify", start=start) if "not numbers" in str(e.get("message"))]
    assert len(warnings) == 1 and 'output="5"' in warnings[0], warnings
    assert not [e for e in pi.ui("notify", start=start) if e.get("notifyType") == "error"]
