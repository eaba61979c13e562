"""Usage and cost in every provider format pi-materia reads, through a real cast.

Each test runs ``python -m castor cast`` in a fresh project with the scripted agent reporting the
provider's usage shape on every turn, then reads ``usage.json`` and checks that the budget
(``budget.maxCostUsd``) stopped the cast at the socket where the total crossed it. The
OpenAI-compatible agent's tests do the same against a tiny chat-completions server on 127.0.0.1
answering with each provider's ``usage`` body as it sends it.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from castor.domain.materia.budget import (
    Amounts,
    TurnRecord,
    UsageReport,
    extract_usage,
    plain_usage,
    sum_usage_maps,
    unreadable_figures,
    usage_caveats,
)

REPO = Path(__file__).resolve().parents[2]

# One turn's usage in each provider's own shape; each costs $0.60 and reports 165 tokens.
PI_USAGE = {"input": 100, "output": 50, "cacheRead": 10, "cacheWrite": 5, "totalTokens": 165,
            "cost": {"input": 0.2, "output": 0.3, "cacheRead": 0.05, "cacheWrite": 0.05, "total": 0.6}}
CODEX_USAGE = {"input_tokens": 100, "output_tokens": 50, "cached_input_tokens": 10, "cache_creation_tokens": 5,
               "total_tokens": 165,
               "cost": {"input_cost_usd": 0.2, "output_cost_usd": 0.3, "cached_input_cost_usd": 0.05,
                        "cache_creation_cost_usd": 0.05, "total_cost_usd": 0.6}}
ANTHROPIC_USAGE = {"input_tokens": 100, "output_tokens": 50, "cache_read_input_tokens": 10,
                   "cache_creation_input_tokens": 5,
                   "input_cost_usd": 0.2, "output_cost_usd": 0.3, "cache_read_cost_usd": 0.05,
                   "cache_creation_cost_usd": 0.05}
FORMATS = {"pi": PI_USAGE, "openai-codex": CODEX_USAGE, "anthropic": ANTHROPIC_USAGE}


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "CASTOR_AGENT": "", "HOME": str(tmp_path / "home"),
            "PI_MATERIA_PROFILE_DIR": str(tmp_path / "profile"), "MATERIA_CONFIG": ""}


def _three_sockets(budget: dict[str, Any]) -> dict[str, Any]:
    step = {"prompt": "Step for {{request}}", "tools": "none"}
    sockets = {f"Socket-{i}": {"type": "agent", "materia": "Step",
                               **({"edges": [{"when": "always", "to": f"Socket-{i + 1}"}]} if i < 3 else {})}
               for i in (1, 2, 3)}
    return {"activeLoadout": "Three", "budget": budget, "materia": {"Step": step},
            "loadouts": {"Three": {"entry": "Socket-1", "sockets": sockets}}}


def _cast(
    tmp_path: Path, config: dict[str, Any], usage: dict[str, Any], agent: str = "script:answers.json"
) -> tuple[subprocess.CompletedProcess[str], Path]:
    project = tmp_path / "project"
    (project / ".pi").mkdir(parents=True)
    (project / ".pi" / "pi-materia.json").write_text(json.dumps(config))
    (project / "answers.json").write_text(json.dumps([{"text": f"done {i}", "usage": usage} for i in range(3)]))
    result = subprocess.run([sys.executable, "-m", "castor", "cast", "build it", "--quiet",
                             "--agent", agent], cwd=project, env=_env(tmp_path), text=True,
                            capture_output=True, timeout=90)
    (run_dir,) = [p for p in (project / ".pi" / "pi-materia").iterdir() if p.is_dir()]
    return result, run_dir


def _events(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if line.strip()]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_the_budget_stops_a_cast_at_max_cost_usd_in_each_provider_format(tmp_path: Path, fmt: str) -> None:
    result, run_dir = _cast(tmp_path, _three_sockets({"maxCostUsd": 1.0, "maxTokens": 10_000_000}), FORMATS[fmt])
    assert result.returncode == 1, result.stdout
    assert "budget limit reached" in result.stderr, result.stderr
    usage = json.loads((run_dir / "usage.json").read_text())
    assert math.isclose(usage["cost"]["total"], 1.2)  # two turns of $0.60: the second crossed $1.00
    assert math.isclose(usage["cost"]["input"], 0.4) and math.isclose(usage["cost"]["cacheWrite"], 0.1)
    assert (
        usage["tokens"]["total"] == 330 and usage["tokens"]["cacheRead"] == 20 and usage["tokens"]["cacheWrite"] == 10
    )
    assert sorted(usage["bySocket"]) == ["Socket-1", "Socket-2"]
    events = _events(run_dir)
    limit = [e for e in events if e["type"] == "budget_limit"]
    assert len(limit) == 1 and limit[0]["data"]["overCost"] is True and limit[0]["data"]["overToken"] is False
    assert not any(e["type"] == "socket_start" and e["data"]["socket"] == "Socket-3" for e in events)


@pytest.mark.timeout(120)
def test_without_a_stop_the_same_usage_only_warns_and_the_cast_completes(tmp_path: Path) -> None:
    result, run_dir = _cast(tmp_path, _three_sockets({"maxCostUsd": 1.0, "stopAtLimit": False}), CODEX_USAGE)
    assert result.returncode == 0, result.stderr
    usage = json.loads((run_dir / "usage.json").read_text())
    assert math.isclose(usage["cost"]["total"], 1.8)
    kinds = [e["type"] for e in _events(run_dir)]
    assert kinds.count("budget_warning") == 1 and kinds.count("budget_limit") == 2  # repeats, never stops


# --------------------------------------------------------------------------- an OpenAI-compatible server

# Each provider's chat-completion ``usage`` as it writes it (the text is sent verbatim: NaN and
# integers past 2**63 included), the budget, whether the budget stops the cast at Socket-2, and the
# totals usage.json must hold after the turns that ran.
SERVER_USAGES: dict[str, tuple[str, dict[str, Any], bool, dict[str, Any]]] = {
    "openai": ('{"prompt_tokens": 100, "completion_tokens": 50, "total_tokens": 150, '
               '"prompt_tokens_details": {"cached_tokens": 20, "audio_tokens": 0}, '
               '"completion_tokens_details": {"reasoning_tokens": 10, "accepted_prediction_tokens": 0}}',
               {"maxTokens": 250}, True,
               {"tokens": {"input": 200, "output": 100, "cacheRead": 40, "total": 300}, "cost": 0}),
    "anthropic-style": ('{"input_tokens": 100, "output_tokens": 50, "cache_read_input_tokens": 10, '
                        '"cache_creation_input_tokens": 5, "service_tier": "standard"}',
                        {"maxTokens": 300}, True,
                        {"tokens": {"input": 200, "output": 100, "cacheRead": 20, "cacheWrite": 10, "total": 330},
                         "cost": 0}),
    "openrouter": ('{"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15, "cost": 0.6, '
                   '"is_byok": false, "cost_details": {"upstream_inference_cost": null}}',
                   {"maxCostUsd": 1.0}, True, {"tokens": {"total": 30}, "cost": 1.2}),
    "malformed figures": ('{"prompt_tokens": 10.5, "completion_tokens": -5, "total_tokens": NaN, "cost": "0.6 USD", '
                          '"total_cost": true, "cost_usd": null, "usd": -1, "extra": 99999999999999999999999}',
                          {"maxCostUsd": 0.5, "maxTokens": 10_000}, False,
                          {"tokens": {"input": 31.5, "output": 0, "total": 31.5}, "cost": 0}),
    # Cohere v2: the billed units count (its tokens also hold the prompt Cohere adds, unbilled)
    "cohere-v2": ('{"billed_units": {"input_tokens": 80, "output_tokens": 50}, '
                  '"tokens": {"input_tokens": 120, "output_tokens": 50}, "cached_tokens": 0}',
                  {"maxTokens": 250}, True, {"tokens": {"input": 160, "output": 100, "total": 260}, "cost": 0}),
    # Codex's token_count with no total: its cached input is inside its input, counted once
    "codex-token-count": ('{"input_tokens": 100, "cached_input_tokens": 40, "output_tokens": 50, '
                          '"reasoning_output_tokens": 20}',
                          {"maxTokens": 300}, True,
                          {"tokens": {"input": 200, "cacheRead": 80, "output": 100, "total": 300}, "cost": 0}),
    # a proxy that sends OpenRouter's billed cost as a decimal string: read as that number
    "string cost": ('{"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15, "cost": "0.6"}',
                    {"maxCostUsd": 1.0}, True, {"tokens": {"total": 30}, "cost": 1.2}),
    "no usage": ("", {"maxCostUsd": 0.5, "maxTokens": 10}, False, {"tokens": {"total": 0}, "cost": 0}),
}


class _ChatServer(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802 - http.server naming
        request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        body = json.dumps({"id": "c", "object": "chat.completion", "model": request["model"],
                           "choices": [{"index": 0, "finish_reason": "stop",
                                        "message": {"role": "assistant", "content": "done"}}]})
        usage = self.server.usage_text  # type: ignore[attr-defined]
        data = (body[:-1] + (f', "usage": {usage}' if usage else "") + "}").encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def chat_server() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ChatServer)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fmt", sorted(SERVER_USAGES))
def test_an_openai_compatible_servers_usage_reaches_the_report_and_the_budget_in_each_providers_shape(
    tmp_path: Path, chat_server: ThreadingHTTPServer, fmt: str
) -> None:
    usage_text, budget, stops, expected = SERVER_USAGES[fmt]
    chat_server.usage_text = usage_text  # type: ignore[attr-defined]
    port = chat_server.server_address[1]
    result, run_dir = _cast(tmp_path, _three_sockets(budget), {}, agent=f"openai:http://127.0.0.1:{port}/v1#m")
    assert "internal" not in result.stderr and "Traceback" not in result.stderr, result.stderr
    usage = json.loads((run_dir / "usage.json").read_text())
    for name, value in expected["tokens"].items():
        assert usage["tokens"][name] == value, (name, usage["tokens"])
    assert math.isclose(usage["cost"]["total"], expected["cost"])
    # A cost the server states is what it charged (OpenRouter's usage.cost): not an estimate. Every
    # other shape states none, or none that is a number: castor's cost is then no billed figure.
    billed = fmt in ("openrouter", "string cost")
    assert usage["costEstimated"] is (not billed), usage
    assert [turn.get("costFromProvider") is True for turn in usage["turns"]] == [billed] * len(
        usage["turns"]), usage["turns"]
    events = _events(run_dir)
    started = [e["data"]["socket"] for e in events if e["type"] == "socket_start"]
    if stops:
        assert result.returncode == 1 and "budget limit reached" in result.stderr, result.stderr
        assert started == ["Socket-1", "Socket-2"] and sorted(usage["bySocket"]) == ["Socket-1", "Socket-2"]
    else:
        assert result.returncode == 0, result.stderr
        assert started == ["Socket-1", "Socket-2", "Socket-3"]
        assert not any(e["type"] in ("budget_limit", "budget_warning") for e in events)
        assert len(usage["turns"]) == 3
    if fmt == "no usage":
        # a server that sends no usage (a local one, a proxy that strips it): each turn is recorded as
        # reporting none -- the budget cannot count it, and the cast says so -- never left out unseen
        assert [turn.get("unreported") for turn in usage["turns"]] == [["tokens"]] * 3, usage["turns"]
        assert [e["data"]["figures"] for e in events if e["type"] == "usage_unreported"] == [["tokens"]] * 3
        assert "reported no token counts" in result.stderr, result.stderr


# --------------------------------------------------------------------------- the alias rules themselves


def test_a_provided_total_never_under_reports_and_a_bare_number_cost_is_a_total() -> None:
    low_total = extract_usage({"cost": {"input": 0.005, "output": 0.03, "cacheRead": 0.0005, "total": 0.005}})
    assert math.isclose(low_total.cost.total, 0.0355)
    assert extract_usage({"cost": 0.25}).cost.total == 0.25
    assert extract_usage({"total_cost_usd": 0.5, "input_cost_usd": 0.1}).cost.total == 0.5


def test_nested_cost_names_win_over_flat_ones_and_aliases_follow_pi_materias_order() -> None:
    usage = extract_usage({"cost": {"prompt_cost_usd": 0.1}, "input_cost_usd": 9.0,
                           "prompt_tokens": 7, "inputTokens": 3, "cached_tokens": 4, "cache_read_input_tokens": 2})
    assert usage.cost.input == 0.1  # the nested object has a component: the flat one is not read
    assert usage.tokens.input == 3  # inputTokens precedes prompt_tokens
    assert usage.tokens.cacheRead == 2  # cache_read_input_tokens precedes cached_tokens
    assert usage.tokens.total == 5  # no total given: the sum of the parts


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), True, "0.5", None])
def test_a_malformed_figure_counts_as_not_reported_and_the_next_alias_is_read(bad: Any) -> None:
    usage = extract_usage({"input": bad, "inputTokens": 4, "cost": {"input": bad, "inputCost": 0.2}})
    cost = 0.5 if bad == "0.5" else 0.2  # a cost written as a decimal string is that number; tokens never are
    assert usage.tokens.input == 4 and usage.cost.input == cost and usage.cost.total == cost


def test_plain_usage_drops_only_what_json_cannot_hold_and_names_a_non_finite_figure() -> None:
    raw = {"input": 1, "cost": {"total": float("nan"), "output": 0.5}, "odd": object(), "list": [1, float("inf")]}
    assert plain_usage(raw) == {"input": 1, "cost": {"total": "NaN", "output": 0.5}, "list": [1, "Infinity"]}
    deep: dict[str, Any] = {}
    cursor = deep
    for _ in range(50):
        cursor["x"] = {}
        cursor = cursor["x"]
    json.dumps(plain_usage(deep))  # bounded, no recursion error


@pytest.mark.parametrize(("usage", "named"), [
    ({"input": 10, "output": "5", "totalTokens": "1050"}, ['output="5"', 'totalTokens="1050"']),  # Pi given strings
    ({"input": 10, "cost": "$0.0012"}, ['cost="$0.0012"']),
    ({"input": 10, "cost": {"input": 0.1, "total": "1.2e-3"}}, ['cost.total="1.2e-3"']),
    ({"input": 10, "cost": {"total": "NaN", "output": -1}}, ['cost.output=-1', 'cost.total="NaN"']),
    ({"prompt_tokens": "12", "total_cost_usd": "$1"}, ['prompt_tokens="12"', 'total_cost_usd="$1"']),
    ({"input": 10, "cost": [0.5]}, ["cost=[0.5]"]),
    # a cost object castor reads nothing in, and the nested figures of the provider shapes it reads
    ({"input": 10, "cost": {"amount": 0.5, "currency": "USD"}}, ['cost={"amount": 0.5, "currency": "USD"}']),
    ({"usageMetadata": {"promptTokenCount": True, "candidatesTokenCount": 5}}, ["usageMetadata.promptTokenCount=true"]),
    ({"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": "3"}},
     ['prompt_tokens_details.cached_tokens="3"']),
    ({"input_tokens": 1, "cache_creation": {"ephemeral_5m_input_tokens": -1, "ephemeral_1h_input_tokens": 2}},
     ["cache_creation.ephemeral_5m_input_tokens=-1"]),
    ({"billed_units": {"input_tokens": "5", "output_tokens": 2}}, ['billed_units.input_tokens="5"']),
])
def test_a_figure_that_is_given_but_not_a_number_is_named(usage: dict[str, Any], named: list[str]) -> None:
    assert unreadable_figures(usage) == named
    assert unreadable_figures(sum_usage_maps([usage])) == named, "a harness's summed usage keeps the names"


@pytest.mark.parametrize("usage", [
    {"input": 10, "output": 5, "cost": {"input": 0.1, "total": 0.1}},
    {"input": None, "output": None, "cost": None},  # null: the provider said "not reported"
    {"input": -3, "input_tokens": 4},  # a later alias gave the figure
    {}, "not a map", None,
])
def test_a_usage_whose_every_given_figure_is_read_names_nothing(usage: Any) -> None:
    assert unreadable_figures(usage) == []
    # a per-message usage that is not a map is itself named (usage="not a map"): it is malformed
    named = [f"usage={json.dumps(usage)}"] if usage is not None and not isinstance(usage, dict) else []
    assert unreadable_figures(sum_usage_maps([usage])) == named


def test_names_of_unreadable_figures_are_bounded() -> None:
    usage = {"input": "x" * 500, **{f"{k}": "?" for k in ("output", "cacheRead", "cacheWrite", "totalTokens")},
             "cost": {k: "?" for k in ("input", "output", "cacheRead", "cacheWrite", "total")}}
    named = unreadable_figures(sum_usage_maps([usage, usage]))
    assert len(named) == 8 and len(named[0]) < 60, named


@pytest.mark.timeout(120)
def test_a_cost_written_as_a_string_is_skipped_with_a_note_not_lost_silently(tmp_path: Path) -> None:
    """A provider that writes its cost as ``"$0.60"``: castor cannot read it (as pi-materia cannot),
    so the budget cannot stop on it -- the cast completes, its totals stay numbers, and the skipped
    figure is named: in the turn's record, in a ``usage_unreadable`` event per turn and in one warning."""
    usage = {"input": 100, "output": 50, "cost": "$0.60"}
    result, run_dir = _cast(tmp_path, _three_sockets({"maxCostUsd": 1.0}), usage)
    assert result.returncode == 0, result.stderr
    report = json.loads((run_dir / "usage.json").read_text())
    assert report["cost"]["total"] == 0 and report["tokens"]["total"] == 450
    assert [t["unreadable"] for t in report["turns"]] == [['cost="$0.60"']] * 3
    noted = [e["data"] for e in _events(run_dir) if e["type"] == "usage_unreadable"]
    assert noted == [{"socket": f"Socket-{i}", "taskId": None, "figures": ['cost="$0.60"']} for i in (1, 2, 3)]
    assert result.stderr.count("not numbers") == 1, result.stderr
    assert 'Socket-1\'s turn has figures that are not numbers (cost="$0.60")' in result.stderr, result.stderr


@pytest.mark.timeout(120)
def test_a_cost_past_what_castor_counts_is_said_counted_as_that_much_not_left_out(tmp_path: Path) -> None:
    """A provider's cost of 1e308 counts as 10^18 (so a budget stops on it), but the budget's
    notice said the turn's figures were "left out" -- the opposite of what happened."""
    result, run_dir = _cast(tmp_path, _three_sockets({"maxCostUsd": 5.0}), {"input": 1, "output": 1, "cost": 1e308})
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert json.loads((run_dir / "usage.json").read_text())["cost"]["total"] == 1e18
    (limit,) = [line for line in result.stderr.splitlines() if "budget limit reached:" in line]
    assert "1 turn with figures past 10^18 counted as 10^18" in limit and "left out" not in limit, limit
    # turns with a figure left out and a figure counted as 10^18 are each said as what they are
    raw = {"input": 1, "output": -1, "cost": 1e300}
    turn = TurnRecord(socket="Socket-1", tokens=Amounts(), cost=Amounts(), unreadable=unreadable_figures(raw))
    caveats = usage_caveats(UsageReport(turns=[turn, turn.model_copy(update={"unreadable": ["cost=-1"]})]))
    assert "2 turns with unreadable figures left out" in caveats and "1 turn with figures past 10^18" in caveats


@pytest.mark.timeout(120)
@pytest.mark.parametrize("cost", ["1e30", "1" + "0" * 30, '"' + "1" + "0" * 30 + '"', "9" * 5000])
def test_a_billed_cost_past_what_castor_counts_is_named_not_counted_as_the_cap_without_a_word(
    tmp_path: Path, chat_server: ThreadingHTTPServer, cost: str
) -> None:
    """An OpenAI-compatible server's ``usage.cost`` past 10^18 (a float, a long integer, a decimal
    string, an integer past Python's 4,300 digits) counted as 10^18 and stopped the budget, but the
    turn named nothing: the cap replaced the figure before it was read, so no warning said why."""
    chat_server.usage_text = '{"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15, "cost": ' + cost + "}"
    port = chat_server.server_address[1]
    result, run_dir = _cast(tmp_path, _three_sockets({"maxCostUsd": 5.0}), {}, agent=f"openai:http://127.0.0.1:{port}/v1#m")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    usage = json.loads((run_dir / "usage.json").read_text())
    assert usage["cost"]["total"] == 1e18 and usage["costEstimated"] is False
    (named,) = usage["turns"][0]["unreadable"]
    assert named.startswith("cost.total=") and named.endswith("(counted as 10^18)"), named
    assert "has figures past what castor counts (cost.total=" in result.stderr, result.stderr
    assert "1 turn with figures past 10^18 counted as 10^18" in result.stderr, result.stderr


@pytest.mark.timeout(30)
@pytest.mark.parametrize("usage", [{"input": 1, "cost": "1" + "0" * 30},
                                   {"input": 1, "cost": {"total": "1" + "0" * 30}},
                                   {"input": 1, "total_cost_usd": "1" + "0" * 30}])
def test_a_decimal_string_cost_past_the_cap_is_named_as_counted_as_the_cap(usage: dict[str, Any]) -> None:
    """A cost written as a decimal string is read as that number; past 10^18 it counted as 10^18
    without a word, where the same figure written as a number was named."""
    assert extract_usage(usage).cost.total == 1e18
    (named,) = unreadable_figures(usage)
    assert named.endswith('="1000000000000000000000000000000" (counted as 10^18)'), named
    assert unreadable_figures({"input": "1" + "0" * 30}) == ['input="1000000000000000000000000000000"']  # no count
