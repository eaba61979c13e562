"""The visible "Casting **<materia> (<N>)**" line a turn shows the user, as pi-materia formats it:
the materia first with the socket's ordinal, a legacy " Socket-N" suffix of the materia's name
dropped, the names trimmed, and the current item's label on its own paragraph when there is one."""

from __future__ import annotations

import pytest

from .scripted import Driver, agent, config, resolved

pytestmark = pytest.mark.timeout(10)


def _summary(materia_name: str, socket_id: str = "Socket-3", data: dict[str, object] | None = None,
             **socket: object) -> str:
    cfg = resolved(config({socket_id: {"type": "agent", "materia": materia_name, **socket}},
                          materia={materia_name: agent("Plan {{request}}", "none")}))
    return Driver(cfg, data=data).pending().visible_summary


def test_the_materia_comes_first_with_the_sockets_ordinal() -> None:
    assert _summary("interactivePlan") == "Casting **interactivePlan (3)**"


def test_a_legacy_socket_suffix_of_the_materia_name_is_not_shown() -> None:
    assert _summary("interactivePlan Socket-3") == "Casting **interactivePlan (3)**"
    assert _summary("interactivePlan\tSocket-7") == "Casting **interactivePlan (3)**"  # any suffix, any spacing
    assert _summary("Socket-3") == "Casting **Socket-3 (3)**"  # nothing before it: the name stays
    assert _summary("  spaced  ") == "Casting **spaced (3)**"


def test_the_current_items_label_is_trimmed_and_a_blank_one_is_left_out() -> None:
    loop = {"foreach": {"items": "state.items", "as": "it", "cursor": "c"}}
    assert _summary("Build", data={"items": [{"id": "a", "title": "  Reduce prominence \n"}]},
                    **loop) == "Casting **Build (3)**\n\nReduce prominence"
    assert _summary("Build", data={"items": [{"id": "a", "title": "   "}]}, **loop) == "Casting **Build (3)**"
    assert _summary("Build", data={"items": [{"id": "a", "title": ""}]}, **loop) == "Casting **Build (3)**"
    assert _summary("Build", data={"items": [{"id": "a"}]}, **loop) == "Casting **Build (3)**\n\na"  # label = key


def _details(materia_name: str, socket_id: str = "Socket-3", data: dict[str, object] | None = None,
             **socket: object) -> tuple[dict, dict, dict]:
    from castor.domain.materia.prompts import turn_message_details

    cfg = resolved(config({socket_id: {"type": "agent", "materia": materia_name, **socket}},
                          materia={materia_name: agent("Plan {{request}}", "none")}))
    turn = Driver(cfg, data=data).pending()
    visible, hidden = turn_message_details(socket_id=turn.socket_id, materia_name=turn.materia,
                                           item_key=turn.item_key, item_label=turn.item_label,
                                           materia_model=turn.materia_model)
    return visible, hidden, turn.materia_model


def test_the_turn_s_messages_carry_pi_materia_s_details() -> None:
    """pi-materia's visible "Casting" message names its socket, the materia as shown, the socket's
    ordinal (a number), the item and the model record (its renderer labels the message by them);
    the hidden prompt names the phase, socket, materia as configured, item and record. Keys with no
    value are left out, as pi-materia's JSON leaves out what is undefined."""
    visible, hidden, record = _details("interactivePlan Socket-3")
    assert record and record["source"] == "active"  # the socket's materiaModel record, as in its events
    assert visible == {"prefix": "materia", "socketId": "Socket-3", "materiaName": "interactivePlan",
                       "socketOrdinal": 3, "eventType": "materia_prompt", "materiaModel": record}
    assert hidden == {"phase": "Socket-3", "socketId": "Socket-3", "materiaName": "interactivePlan Socket-3",
                      "materiaModel": record}
    loop = {"foreach": {"items": "state.items", "as": "it", "cursor": "c"}}
    visible, hidden, _ = _details("Build", data={"items": [{"id": "a", "title": "Reduce prominence"}]}, **loop)
    assert (visible["itemKey"], visible["itemLabel"]) == ("a", "Reduce prominence") == (hidden["itemKey"],
                                                                                        hidden["itemLabel"])
