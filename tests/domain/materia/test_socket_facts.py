"""``facts_of``: the plain facts a transition reads of a socket equal what the socket itself gives."""

from __future__ import annotations

import gc

from castor.domain.materia.config import THINKING_LEVELS, ResolvedSocket
from castor.domain.materia.socket_facts import SocketFacts, facts_of, shared_materia_model

from .scripted import agent, config, resolved


def _every_kind_of_socket() -> list[ResolvedSocket]:
    # Socket-1..6: a plain agent (a model padded with blanks, a known thinking level), a JSON one,
    # a JSON generator, a multi-turn one (a blank model, an unknown level), one with empty
    # settings, and a utility (no materia).
    cfg = resolved(config(
        {"Socket-1": {"type": "agent", "materia": "A", "edges": [{"to": "Socket-2"}]},
         "Socket-2": {"type": "agent", "materia": "J", "parse": "json", "edges": [{"to": "Socket-3"}]},
         "Socket-3": {"type": "agent", "materia": "G", "parse": "json", "edges": [{"to": "Socket-4"}]},
         "Socket-4": {"type": "agent", "materia": "M", "edges": [{"to": "Socket-5"}]},
         "Socket-5": {"type": "agent", "materia": "B", "edges": [{"to": "Socket-6"}]},
         "Socket-6": {"type": "utility", "utility": "echo", "params": {"output": "x"}, "edges": [{"to": "end"}]}},
        materia={"A": agent(model="  anthropic/claude-test ", thinking="high"),
                 "J": agent(tools="readOnly"),
                 "G": agent(generator=True, tools="none"),
                 "M": agent(multiTurn=True, thinking="no-such-level", model="   "),
                 "B": agent(model="", thinking="")}))
    return list(cfg.pipeline.sockets.values())


def test_the_facts_of_every_socket_equal_the_socket_s_own_fields() -> None:
    sockets = _every_kind_of_socket()
    assert [rs.id for rs in sockets] == [f"Socket-{n}" for n in range(1, 7)]
    for rs in sockets:
        facts = facts_of(rs)
        materia = rs.materia
        assert (facts.id, facts.socket, facts.type, facts.materia_name, facts.materia) == (
            rs.id, rs.socket, rs.socket.type, rs.materia_name, rs.materia)
        assert (facts.is_agent, facts.is_generator, facts.multi_turn, facts.is_json) == (
            rs.is_agent, rs.is_generator, rs.multi_turn, rs.socket.is_json)
        assert facts.prompt == (materia.prompt if materia else "")
        assert facts.model == (materia.model if materia else None)
        assert facts.turn_model == ((materia.model or "").strip() or None if materia else None)
        assert facts.thinking == (materia.thinking if materia else None)
        assert facts.applied_thinking == (materia.thinking if materia and materia.thinking in THINKING_LEVELS
                                          else None)
        assert facts.tools == (materia.tools if materia else "none")
        assert facts.materia_model == (shared_materia_model(materia.model, materia.thinking) if materia else None)
    plain, json_agent, generator, multi_turn, _, utility = (facts_of(rs) for rs in sockets)
    assert (plain.turn_model, plain.applied_thinking) == ("anthropic/claude-test", "high")
    assert (multi_turn.turn_model, multi_turn.applied_thinking, multi_turn.multi_turn) == (None, None, True)
    assert generator.is_generator and generator.is_json and json_agent.is_json and not json_agent.is_generator
    assert utility.materia_model is None and not utility.is_agent and utility.tools == "none"


def test_a_socket_s_facts_are_made_once_and_die_with_it() -> None:
    rs = _every_kind_of_socket()[0]
    facts = facts_of(rs)
    assert facts_of(rs) is facts
    assert facts_of(rs.model_copy()) is not facts  # another socket object: its own facts, equal fields
    assert isinstance(facts, SocketFacts) and not hasattr(facts, "__dict__")  # plain slots, no pydantic hook
    del rs
    gc.collect()
    fresh = _every_kind_of_socket()[0]
    assert facts_of(fresh) is not facts

