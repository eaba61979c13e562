"""Scripted answers matched to the turn they belong to (socket, work item, visit, mode, key)."""

from __future__ import annotations

import json
import threading

import pytest

from castor.adapters.agents.scripted import ScriptedAgent, load_script, parse_script
from castor.messages.errors import InvalidConfig
from castor.ports.agent import TurnOutcome, TurnRequest


def ask(agent: ScriptedAgent, turn_id: str, *, cast_id: str = "c1", socket: str = "Socket-1",
        item: str | None = None, visit: int = 1, mode: str = "normal") -> TurnOutcome:
    got: list[TurnOutcome] = []
    done = threading.Event()

    def reply(outcome: TurnOutcome) -> None:
        got.append(outcome)
        done.set()

    agent.run_turn(TurnRequest(turn_id=turn_id, cast_id=cast_id, socket_id=socket, visit=visit, prompt="p",
                               item_key=item, mode=mode), reply)
    assert done.wait(5), f"no reply for {turn_id}"
    return got[0]


BUILD = [
    {"key": "Socket-3", "text": '{"workItems": [{"id": "w1"}, {"id": "w2"}]}'},
    {"socket": "Socket-4", "item": "w1", "text": "w1 built"},
    {"key": "Socket-4/w2", "text": "w2 built"},
    {"key": "Socket-5/w1", "text": "w1 ok"},
    {"key": "Socket-5/w2", "text": "w2 ok"},
    "any other turn",
]


def test_a_new_process_resumed_at_work_item_w2_gets_w2s_answer() -> None:
    first = ScriptedAgent(parse_script(BUILD))
    assert ask(first, "t1", socket="Socket-3").text.startswith('{"workItems"')
    assert ask(first, "t2", socket="Socket-4", item="w1").text == "w1 built"
    first.close()
    # castor recast in a new process: every answer is unused again, and the turn finds its own.
    resumed = ScriptedAgent(parse_script(BUILD))
    assert ask(resumed, "t3", socket="Socket-4", item="w2", visit=2).text == "w2 built"
    assert ask(resumed, "t4", socket="Socket-5", item="w2", visit=2).text == "w2 ok"
    assert ask(resumed, "t5", socket="Socket-9").text == "any other turn"
    out = ask(resumed, "t6", socket="Socket-4", item="w2", visit=3)
    assert out.error.kind == "exhausted" and "Socket-4, item w2, visit 3" in out.error.message
    resumed.close()


def test_the_most_specific_answer_wins_then_file_order_and_each_is_used_once_per_cast() -> None:
    agent = ScriptedAgent(parse_script([
        "plain 1",
        {"socket": "Socket-1", "text": "socket"},
        {"socket": "Socket-1", "visit": 2, "text": "socket visit 2"},
        {"socket": "Socket-1", "mode": "finalization", "text": "final"},
        "plain 2",
    ]))
    assert ask(agent, "a", visit=2).text == "socket visit 2"
    assert ask(agent, "b", mode="finalization").text == "final"
    assert ask(agent, "c").text == "socket"
    assert ask(agent, "d").text == "plain 1"
    assert ask(agent, "e", cast_id="other", visit=2).text == "socket visit 2"  # another cast: its own answers
    assert ask(agent, "f").text == "plain 2"
    agent.close()


def test_a_plain_list_keeps_its_old_meaning() -> None:
    agent = ScriptedAgent(parse_script(["one", "two"]))
    assert [ask(agent, t, socket=s).text for t, s in (("a", "Socket-1"), ("b", "Socket-7"))] == ["one", "two"]
    assert ask(agent, "c").error.kind == "exhausted"
    agent.close()


def test_object_lists_are_keys_and_jsonl_lines_may_carry_them(tmp_path) -> None:
    doc = tmp_path / "s.json"
    doc.write_text(json.dumps({"Socket-4/w2": ["w2"], "Socket-4": ["any item"], "*": ["rest"]}))
    agent = ScriptedAgent(str(doc))
    assert agent.agent_label == "scripted agent (s.json)"
    assert ask(agent, "a", socket="Socket-4", item="w1").text == "any item"
    assert ask(agent, "b", socket="Socket-4", item="w2").text == "w2"
    assert ask(agent, "c", socket="Socket-4", item="w3").text == "rest"
    agent.close()
    lines = tmp_path / "s.jsonl"
    lines.write_text('{"key": "Socket-2/x/2", "text": "x2"}\n"plain"\n')
    agent = ScriptedAgent(str(lines))
    assert ask(agent, "a", socket="Socket-2", item="x", visit=2).text == "x2"
    agent.close()


@pytest.mark.parametrize("content", [
    '[{"key": "a/b/c/d"}]', '[{"key": "Socket-1//2"}]', '[{"key": "Socket-1/w/two"}]',
    '[{"key": "Socket-1", "socket": "Socket-2"}]', '{"Socket-1": [{"key": "Socket-2"}]}',
    '[{"visit": 0}]', '[{"mode": "sideways"}]', '[{"item": ""}]',
])
def test_bad_keys_are_invalid_config_naming_where(tmp_path, content: str) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    with pytest.raises(InvalidConfig) as err:
        load_script(bad)
    assert err.value.data["reason"] in ("bad_answer", "bad_script") and "at" in err.value.message
