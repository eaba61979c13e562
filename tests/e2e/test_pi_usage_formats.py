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


def wait_end_notice(pi: Any, start: int, words: str) -> None:
    """Wait for the cast's ending notice: ``cast_end`` is on disk before Pi shows it (a CI run read
    the notices a moment early and found none); the notices of the cast came before it."""
    pi.wait_ui("notify", lambda e: words in str(e.get("message")), start=start)


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
    wait_end_notice(pi, start, "cast complete")

    report = strict_json((run_dir / "usage.json").read_text())
    turns = report["turns"]
    assert [t["socket"] for t in turns] == ["Socket-1", "Socket-2", "Socket-3"]
    # Pi's own arithmetic: output "5", totalTokens 10 + "5" + 0 + 0 = "10500"; neither is counted.
    assert turns[0]["unreadable"] == ['output="5"', 'totalTokens="10500"'], turns[0]
    assert turns[0]["tokens"] == {"input": 10, "output": 0, "cacheRead": 0, "cacheWrite": 0, "total": 10}
    # 1e308 + 1e308 is Infinity in Pi: the extension sends it by name; castor caps what it reads
    # and names each figure it capped.
    assert turns[1]["unreadable"] == ['totalTokens="Infinity"', "input=1e+308 (counted as 10^18)",
                                      "output=1e+308 (counted as 10^18)"], turns[1]
    assert turns[1]["tokens"]["input"] == 1e18 and turns[1]["tokens"]["total"] == 1e18
    # No usage from the provider: Pi's zeros, nothing skipped, the cost an estimate.
    assert turns[2].get("unreadable") is None and turns[2]["tokens"]["total"] == 0
    assert report["tokens"]["total"] == 1e18 and report["costEstimated"] is True
    noted = [e["data"] for e in events if e["type"] == "usage_unreadable"]
    assert [n["socket"] for n in noted] == ["Socket-1", "Socket-2"]
    warnings = [e["message"] for e in pi.ui("notify", start=start) if "not numbers" in str(e.get("message"))]
    assert len(warnings) == 1 and 'output="5"' in warnings[0], warnings
    assert not [e for e in pi.ui("notify", start=start) if e.get("notifyType") == "error"]


def chain(budget: dict[str, Any], models: dict[str, str | None]) -> dict[str, Any]:
    """A loadout of one socket per materia in ``models`` (name -> the materia's model, None: the
    active one), in order, under ``budget``."""
    names = list(models)
    sockets = {f"Socket-{i + 1}": {"type": "agent", "materia": name,
                                   **({"edges": [{"when": "always", "to": f"Socket-{i + 2}"}]}
                                      if i + 1 < len(names) else {})}
               for i, name in enumerate(names)}
    return {"artifactDir": ".pi/pi-materia", "activeLoadout": "Chain", "budget": budget,
            "materia": {name: {"prompt": f"{name.upper()}-MATERIA: go.", "tools": "none",
                               **({"model": model} if model else {})} for name, model in models.items()},
            "loadouts": {"Chain": {"entry": "Socket-1", "sockets": sockets}}}


def test_a_negative_figure_never_lowers_the_token_total_the_budget_stops_at(start_pi, castor_command, fake_llm,
                                                                            tmp_path):
    """A provider's ``completion_tokens`` of -5: Pi's ``totalTokens`` is its plain sum (12 + -5 = 7).
    castor skipped the -5 but took that total, so the turn counted 7 tokens, not the 12 it read,
    and a ``maxTokens`` of 12 let the cast run on. The total is now at least the counted parts."""
    project = project_with_loadout(tmp_path, chain({"maxTokens": 12}, {"A": None, "B": None}))
    fake_llm.reply_text("A done", when="A-MATERIA", usage={"prompt_tokens": 12, "completion_tokens": -5})
    pi = start_pi(castor_command, cwd=project, settings={"defaultProjectTrust": "always"})
    up(pi)
    start = pi.command("/materia cast count it")
    run_dir, events = wait_cast_end(pi, project, start=start, tolerate_errors=True)
    (turn,) = strict_json((run_dir / "usage.json").read_text())["turns"]
    assert turn["unreadable"] == ["output=-5"], turn
    assert turn["tokens"] == {"input": 12, "output": 0, "cacheRead": 0, "cacheWrite": 0, "total": 12}, turn
    assert events[-1]["data"]["ok"] is False and events[-1]["data"]["error"] == "pi-materia budget limit reached"
    assert not any("B-MATERIA" in json.dumps(r["messages"]) for r in fake_llm.log()), "the cast ran past its budget"


def test_a_boolean_token_count_counts_nothing_even_in_the_total_pi_added_it_to(start_pi, castor_command, fake_llm,
                                                                                tmp_path):
    """A provider's ``completion_tokens`` of ``true``: Pi keeps it (``output: true``) and adds it
    into ``totalTokens`` as 1 (10 + true = 11). castor named the part but took that total, so the
    turn counted a token nobody reported. The boolean counts nothing now, in the total too."""
    project = project_with_loadout(tmp_path, chain({"maxTokens": 1000}, {"A": None}))
    fake_llm.reply_text("A done", when="A-MATERIA", usage={"prompt_tokens": 10, "completion_tokens": True})
    pi = start_pi(castor_command, cwd=project, settings={"defaultProjectTrust": "always"})
    up(pi)
    start = pi.command("/materia cast count it")
    run_dir, _events = wait_cast_end(pi, project, start=start, tolerate_errors=True)
    (turn,) = strict_json((run_dir / "usage.json").read_text())["turns"]
    assert turn["unreadable"] == ["output=true"], turn
    assert turn["tokens"] == {"input": 10, "output": 0, "cacheRead": 0, "cacheWrite": 0, "total": 10}, turn


def test_usage_pi_cannot_read_and_tokens_with_no_price_are_named_and_said_once(start_pi, castor_command, fake_llm,
                                                                              tmp_path):
    """Usage the budget cannot count, said instead of silently counted as nothing: an Anthropic-
    shaped and a Google-shaped usage through an OpenAI-compatible provider (Pi reads neither: its
    zeros), and tokens from a model Pi has no price for (cost 0, Pi's estimate). Each turn's record
    names what it left out (``turns[].unreported``), an event per turn, one warning per kind per
    cast; the cast runs to its end. OpenRouter's billed cost of 0 is a price, not a gap."""
    models = {"A": None, "B": None, "C": None, "D": None, "E": "fake-router/router-model"}
    project = project_with_loadout(tmp_path, chain({"maxTokens": 1_000_000, "maxCostUsd": 5}, models))
    fake_llm.reply_text("A done", when="A-MATERIA", usage={
        "input_tokens": 50, "output_tokens": 10, "cache_creation_input_tokens": 30, "cache_read_input_tokens": 20})
    fake_llm.reply_text("B done", when="B-MATERIA", usage={
        "promptTokenCount": 40, "candidatesTokenCount": 8, "totalTokenCount": 48})
    fake_llm.reply_text("C done", when="C-MATERIA", usage={
        "prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120,
        "prompt_tokens_details": {"cached_tokens": 60}})
    fake_llm.reply_text("D done", when="D-MATERIA", usage=OMIT_USAGE)
    fake_llm.reply_text("E done", when="E-MATERIA", usage={"prompt_tokens": 10, "completion_tokens": 5, "cost": 0,
                                                            "is_byok": False})
    pi = start_pi(castor_command, cwd=project, settings={"defaultProjectTrust": "always"})
    up(pi)
    start = pi.command("/materia cast count it")
    run_dir, events = wait_cast_end(pi, project, start=start)
    assert events[-1]["data"]["ok"] is True, events[-1]
    wait_end_notice(pi, start, "cast complete")
    turns = strict_json((run_dir / "usage.json").read_text())["turns"]
    assert [t.get("unreported") for t in turns] == [["tokens"], ["tokens"], ["cost"], ["tokens"], None], turns
    assert turns[2]["tokens"] == {"input": 40, "output": 20, "cacheRead": 60, "cacheWrite": 0, "total": 120}
    assert turns[4]["costFromProvider"] is True and turns[4]["cost"]["total"] == 0, turns[4]
    noted = [(e["data"]["socket"], e["data"]["figures"]) for e in events if e["type"] == "usage_unreported"]
    assert noted == [("Socket-1", ["tokens"]), ("Socket-2", ["tokens"]), ("Socket-3", ["cost"]),
                     ("Socket-4", ["tokens"])], noted
    said = [(e.get("notifyType"), str(e["message"])) for e in pi.ui("notify", start=start)
            if "turns[].unreported" in str(e.get("message"))]
    assert len(said) == 2, said
    assert said[0][0] == "warning" and "Socket-1's turn reported no token counts" in said[0][1], said
    # a notice: the bundled budget's maxCostUsd and a model with no price are both common
    assert said[1][0] == "info" and "Socket-3's turn used 120 tokens at no reported cost" in said[1][1], said
    assert "($5)" in said[1][1], said
    (done,) = [str(e["message"]) for e in pi.ui("notify", start=start) if "cast complete" in str(e.get("message"))]
    assert done.endswith(": 135 tokens, $0.0000 (estimated; 3 turns reported no usage; 1 turn with no price "
                         "counted as $0)."), done
    shown = pi.wait_ui("notify", start=pi.command("/materia status"))["message"]
    assert "\nusage: 135 tokens, $0.0000 (estimated; 3 turns reported no usage; 1 turn with no price counted as " \
           "$0)\n" in shown, shown
    assert not [e for e in pi.ui("notify", start=start) if e.get("notifyType") == "error"]


@pytest.mark.parametrize(("model", "usage", "billed"), [
    # Pi's price list: 40 input, 60 cached and 20 output tokens at 1000 / 100 / 2000 USD per million
    ("fake-priced/priced-model", {"prompt_tokens": 100, "completion_tokens": 20,
                                  "prompt_tokens_details": {"cached_tokens": 60}}, False),
    # OpenRouter's own billed figure
    ("fake-router/router-model", {"prompt_tokens": 10, "completion_tokens": 5, "cost": 0.3, "is_byok": False}, True),
])
def test_a_priced_turn_stops_the_cast_at_max_cost_usd(start_pi, castor_command, fake_llm, tmp_path, model, usage,
                                                      billed):
    project = project_with_loadout(tmp_path, chain({"maxCostUsd": 0.05}, {"A": model, "B": model}))
    fake_llm.reply_text("A done", when="A-MATERIA", usage=usage)
    pi = start_pi(castor_command, cwd=project, settings={"defaultProjectTrust": "always"})
    up(pi)
    start = pi.command("/materia cast count it")
    run_dir, events = wait_cast_end(pi, project, start=start, tolerate_errors=True)
    wait_end_notice(pi, start, "budget limit reached:")
    report = strict_json((run_dir / "usage.json").read_text())
    (turn,) = report["turns"]
    assert turn["cost"]["total"] == pytest.approx(0.3 if billed else 0.086), turn
    assert turn["costFromProvider"] is billed and report["costEstimated"] is (not billed), report
    assert turn.get("unreported") is None and turn.get("unreadable") is None, turn
    (limit,) = [e["data"] for e in events if e["type"] == "budget_limit"]
    assert limit["overCost"] is True and limit["overToken"] is False, limit
    said = [str(e["message"]) for e in pi.ui("notify", start=start) if "budget limit reached:" in str(e.get("message"))]
    assert said == [f"pi-materia budget limit reached: ${0.3 if billed else 0.086:.4f} of budget.maxCostUsd 0.05"
                    + ("" if billed else " (estimated)")], said
    assert events[-1]["data"]["ok"] is False and events[-1]["data"]["error"] == "pi-materia budget limit reached"
    assert not any("B-MATERIA" in json.dumps(r["messages"]) for r in fake_llm.log()), "the cast ran past its budget"
