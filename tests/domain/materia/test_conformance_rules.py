"""pi-materia compatibility rules in the domain: layout normalization, warnings instead of
refusals, the empty-work-list route, and the targeted ``activeLoadout`` text edit."""

from __future__ import annotations

import json
from typing import Any

import pytest

from castor.domain.materia.config import ConfigError
from castor.domain.materia.config_edit import EditRefused, set_top_level_string
from castor.domain.materia.defaults import DEFAULT_LABEL, default_config
from castor.domain.materia.graph import normalize_loadout, prepare_loadout
from castor.domain.materia.loops import empty_loop_target, iteration_for
from castor.domain.materia.resolve import load_config, resolve_config
from tests.domain.materia.scripted import Driver


def _cfg(sockets: dict[str, Any], **loadout: Any) -> dict[str, Any]:
    return {"activeLoadout": "L", "materia": {"A": {"prompt": "p {{request}}", "tools": "none"},
                                              "G": {"prompt": "g", "tools": "none", "generator": True}},
            "loadouts": {"L": {"entry": next(iter(sockets)), "sockets": sockets, **loadout}}}


# --------------------------------------------------------------------------- layout


def test_layout_sockets_are_rebuilt_from_the_sockets_that_exist() -> None:
    loadout = {
        "entry": "Socket-1",
        "layout": {
            "sockets": {"Socket-1": {"x": 1, "y": 2, "w": 9}, "Socket-9": {"x": 5}, "Socket-2": {"x": True}},
            "zoom": 2,
        },
        "sockets": {
            "Socket-2": {"type": "agent", "materia": "A", "layout": {"y": 3}},
            "Socket-1": {"type": "agent", "materia": "A"},
            "Socket-3": {"type": "agent", "materia": "A"},
        },
    }
    out = normalize_loadout(loadout)
    assert out["layout"] == {"sockets": {"Socket-1": {"x": 1, "y": 2}, "Socket-2": {"y": 3}}, "zoom": 2}
    assert "layout" not in out["sockets"]["Socket-2"]
    assert normalize_loadout(out) == out  # idempotent
    assert loadout["layout"]["sockets"]["Socket-9"] == {"x": 5}  # the input is not mutated


def test_a_layout_with_only_stale_entries_disappears_and_survives_nothing_but_other_keys() -> None:
    only_stale = normalize_loadout({"entry": "Socket-1", "layout": {"sockets": {"Socket-7": {"x": 1}}},
                                    "sockets": {"Socket-1": {"type": "agent", "materia": "A"}}})
    assert "layout" not in only_stale
    junk = normalize_loadout({"entry": "Socket-1", "layout": "oops", "sockets": {"Socket-1": {"type": "agent",
                                                                                               "materia": "A"}}})
    assert "layout" not in junk


def test_a_cast_snapshot_of_a_config_with_stale_layout_has_none_of_it() -> None:
    cfg = _cfg({"Socket-1": {"type": "agent", "materia": "A"}},
               layout={"sockets": {"Socket-1": {"x": 0}, "Socket-4": {"x": 1}}})
    rc = resolve_config(load_config([("t.json", cfg)]))
    assert rc.config["loadouts"]["L"]["layout"] == {"sockets": {"Socket-1": {"x": 0}}}
    prepared, _ = prepare_loadout(cfg["loadouts"]["L"], cfg["materia"], name="L")
    assert prepared["layout"] == {"sockets": {"Socket-1": {"x": 0}}}


# --------------------------------------------------------------------------- warnings


def test_an_unknown_thinking_level_loads_with_a_warning_and_is_not_applied() -> None:
    cfg = _cfg({"Socket-1": {"type": "agent", "materia": "A"}})
    cfg["materia"]["A"]["thinking"] = "max"
    loaded = load_config([("t.json", cfg)])
    assert loaded.issues == [] and [w.code for w in loaded.warnings] == ["unknown-thinking"]
    rc = resolve_config(loaded)
    assert [(w.code, w.path) for w in rc.warnings] == [("unknown-thinking", "/materia/A/thinking")]
    d = Driver(rc)
    assert d.pending().thinking is None  # the harness keeps its own level, as pi-materia falls back
    (settings,) = d.events("materia_model_settings")
    assert settings.data["materiaModel"]["thinkingFallbackReason"] == "unknown_thinking"
    assert (
        settings.data["materiaModel"]["requestedThinking"] == "max"
        and settings.data["materiaModel"].get("thinking") is None
    )
    assert [e.data["code"] for e in d.events("config_warning")] == ["unknown-thinking"]


def test_a_non_string_thinking_is_still_refused() -> None:
    cfg = _cfg({"Socket-1": {"type": "agent", "materia": "A"}})
    cfg["materia"]["A"]["thinking"] = 3
    with pytest.raises(ConfigError) as err:
        resolve_config(load_config([("t.json", cfg)]))
    assert [i.code for i in err.value.issues] == ["invalid-materia"]


def test_socket_limits_castor_enforces_are_warned_about() -> None:
    cfg = _cfg({"Socket-1": {"type": "agent", "materia": "A", "limits": {"maxEdgeTraversals": 2, "maxVisits": 3}}})
    rc = resolve_config(load_config([("t.json", cfg)]))
    assert [(w.code, w.path) for w in rc.warnings] == [
        ("socket-limit-enforced", "/loadouts/L/sockets/Socket-1/limits/maxEdgeTraversals")]


def test_a_budget_on_a_loadout_or_a_socket_limits_nothing_and_is_warned_about() -> None:
    cfg = _cfg({"Socket-1": {"type": "agent", "materia": "A", "budget": {"maxCostUsd": 0}}})
    cfg["loadouts"]["L"]["budget"] = {"maxTokens": 1}
    rc = resolve_config(load_config([("t.json", cfg)]))
    assert [(w.code, w.path) for w in rc.warnings] == [
        ("ignored-budget", "/loadouts/L/budget"), ("ignored-budget", "/loadouts/L/sockets/Socket-1/budget")]
    assert rc.budget.max_tokens is None and rc.budget.max_cost_usd is None  # the cast's budget: none set


def test_a_loadout_whose_every_socket_always_routes_to_another_socket_is_warned_that_it_never_ends() -> None:
    # a user's edit that closes a cycle with no way out: validate said "valid", and every cast ran
    # until limits.maxSocketVisits failed it
    cycle = {"Socket-1": {"type": "agent", "materia": "A", "edges": [{"when": "always", "to": "Socket-2"}]},
             "Socket-2": {"type": "agent", "materia": "A", "parse": "json",
                          "edges": [{"when": "satisfied", "to": "Socket-1"}, {"when": "always", "to": "Socket-1"}]}}
    rc = resolve_config(load_config([("t.json", _cfg(cycle))]))
    assert [(w.code, w.path) for w in rc.warnings] == [("no-end", "/loadouts/L/sockets")]
    assert "limits.maxSocketVisits" in rc.warnings[0].message
    # a way out anywhere -- an edge to end, a socket without an always edge, an advance -- is no warning
    to_end = {**cycle, "Socket-2": {**cycle["Socket-2"], "edges": [{"when": "satisfied", "to": "end"},
                                                                   {"when": "always", "to": "Socket-1"}]}}
    guarded = {**cycle, "Socket-2": {**cycle["Socket-2"], "edges": [{"when": "satisfied", "to": "Socket-1"}]}}
    for sockets in (to_end, guarded, {"Socket-1": {"type": "agent", "materia": "A"}}):
        assert resolve_config(load_config([("t.json", _cfg(sockets))])).warnings == []


def test_a_text_socket_with_guarded_edges_runs_as_pi_materia_runs_it_and_says_so_in_events() -> None:
    cfg = _cfg({"Socket-1": {"type": "agent", "materia": "A", "parse": "text",
                             "edges": [{"when": "satisfied", "to": "Socket-2"}]},
                "Socket-2": {"type": "agent", "materia": "A"}})
    rc = resolve_config(load_config([("t.json", cfg)]))
    d = Driver(rc)
    warned = d.events("config_warning")
    assert [(e.data["code"], e.data["path"]) for e in warned] == [
        ("text-socket-guarded-edge", "/loadouts/L/sockets/Socket-1/edges/0/when")]
    d.reply("plain text, even saying satisfied: true")
    assert d.state.phase == "complete" and "Socket-2" not in d.state.visits  # no edge matched: end


def test_warnings_never_hide_errors() -> None:
    cfg = _cfg(
        {"Socket-1": {"type": "agent", "materia": "Missing", "edges": [{"when": "satisfied", "to": "Socket-1"}]}}
    )
    with pytest.raises(ConfigError) as err:
        resolve_config(load_config([("t.json", cfg)]))
    assert all(not i.is_warning for i in err.value.issues)
    assert "unknown-materia" in [i.code for i in err.value.issues]


# --------------------------------------------------------------------------- empty work list


def test_an_empty_work_list_at_a_member_without_a_route_of_its_own_ends_the_cast() -> None:
    cfg = _cfg({"Socket-1": {"type": "agent", "materia": "G", "parse": "json",
                             "edges": [{"when": "always", "to": "Socket-2"}]},
                "Socket-2": {"type": "agent", "materia": "A", "edges": [{"when": "always", "to": "Socket-3"}]},
                "Socket-3": {"type": "agent", "materia": "A", "parse": "json",
                             "edges": [{"when": "always", "to": "Socket-2"}]},
                "Socket-4": {"type": "agent", "materia": "A"}},
               loops={"lp": {"sockets": ["Socket-2", "Socket-3"], "consumes": {"from": "Socket-1"},
                             "exit": {"from": "Socket-3", "when": "always", "to": "Socket-4"}}})
    rc = resolve_config(load_config([("t.json", cfg)]))
    it = iteration_for(rc.pipeline, "Socket-2")
    assert it is not None and empty_loop_target(rc.pipeline, "Socket-2", it) == "end"
    d = Driver(rc)
    d.reply(json.dumps({"workItems": []}))
    assert d.state.phase == "complete" and "Socket-4" not in d.state.visits


def test_castors_bundled_build_routes_an_empty_work_list_to_its_summary_explicitly() -> None:
    rc = resolve_config(load_config([(DEFAULT_LABEL, default_config())]), "build")
    it = iteration_for(rc.pipeline, "Socket-4")
    assert it is not None and empty_loop_target(rc.pipeline, "Socket-4", it) == "Socket-7"


# --------------------------------------------------------------------------- activeLoadout text edit


@pytest.mark.parametrize(("text", "expected"), [
    ('{\n  "a": "→",\n  "activeLoadout": "x"\n}\n', '{\n  "a": "→",\n  "activeLoadout": "Y"\n}\n'),
    ('{"activeLoadout" :  null , "b":[1,2]}', '{"activeLoadout" :  "Y" , "b":[1,2]}'),
    ('{\n\t"a": 1\n}', '{\n\t"a": 1,\n\t"activeLoadout": "Y"\n}'),
    ('{"a": {"activeLoadout": "inner"}}', '{"a": {"activeLoadout": "inner"}, "activeLoadout": "Y"}'),
    ('  {  }  ', '  {"activeLoadout": "Y"}  '),
    ('{"activeLoadout":"p","activeLoadout":"q"}', '{"activeLoadout":"p","activeLoadout":"Y"}'),
    ('{"active\\u004coadout": 1}', '{"active\\u004coadout": "Y"}'),
    ('{\r\n  "a": 1\r\n}\r\n', '{\r\n  "a": 1,\r\n  "activeLoadout": "Y"\r\n}\r\n'),
])
def test_set_top_level_string_changes_only_that_value(text: str, expected: str) -> None:
    assert set_top_level_string(text, "activeLoadout", "Y") == expected


def test_a_name_needing_escapes_is_written_as_valid_json() -> None:
    out = set_top_level_string('{"activeLoadout": "a"}', "activeLoadout", 'We"ird → \\ name')
    assert json.loads(out)["activeLoadout"] == 'We"ird → \\ name' and "→" in out


@pytest.mark.parametrize("text", ["[1]", "not json", '{"a": 1} trailing', ""])
def test_text_that_is_not_one_object_is_refused(text: str) -> None:
    with pytest.raises(EditRefused):
        set_top_level_string(text, "activeLoadout", "Y")


# --------------------------------------------------------------------------- shapes pi-materia tolerates


def test_explicit_nulls_an_editor_may_save_load_as_empty() -> None:
    cfg = _cfg({"Socket-1": {"type": "agent", "materia": "G", "parse": "json", "assign": None,
                             "edges": [{"when": "always", "to": "Socket-2"}]},
                "Socket-2": {"type": "agent", "materia": "A", "edges": [{"when": "always", "to": "Socket-3"}]},
                "Socket-3": {"type": "agent", "materia": "A", "parse": "json", "edges": None, "assign": None}},
               loops={"lp": {"sockets": ["Socket-2", "Socket-3"], "consumes": {"from": "Socket-1", "output": None},
                             "exits": None,
                             "exit": {"from": "Socket-3", "when": "Flow", "to": "end"}}})
    cfg["loadouts"]["L"]["sockets"]["Socket-3"]["edges"] = [{"when": "always", "to": "Socket-2"}]
    rc = resolve_config(load_config([("t.json", cfg)]))
    assert rc.warnings == []
    assert rc.pipeline.loops["lp"].exit is not None and rc.pipeline.loops["lp"].exit.when == "always"
    assert rc.pipeline.loops["lp"].consumes is not None and rc.pipeline.loops["lp"].consumes.output == "workItems"
    lone = _cfg({"Socket-1": {"type": "agent", "materia": "A", "edges": None, "assign": None}})
    assert resolve_config(load_config([("t.json", lone)])).pipeline.sockets["Socket-1"].socket.edges == []


@pytest.mark.parametrize(("where", "code"), [("edge", "invalid-socket"), ("limits", "invalid-limits")])
def test_limits_that_can_only_fail_every_cast_are_refused(where: str, code: str) -> None:
    cfg = _cfg({"Socket-1": {"type": "agent", "materia": "A", "edges": [{"when": "always", "to": "Socket-2"}]},
                "Socket-2": {"type": "agent", "materia": "A"}})
    if where == "edge":
        cfg["loadouts"]["L"]["sockets"]["Socket-1"]["edges"][0]["maxTraversals"] = -1
    else:
        cfg["limits"] = {"maxSocketVisits": 0}
    with pytest.raises(ConfigError) as err:
        resolve_config(load_config([("t.json", cfg)]))
    assert code in [i.code for i in err.value.issues]


def test_a_warning_names_the_layer_file_that_set_the_place() -> None:
    user = {"materia": {"A": {"prompt": "p", "tools": "none", "thinking": "ultra"}}}
    project = _cfg({"Socket-1": {"type": "agent", "materia": "A", "edges": [{"when": "satisfied", "to": "Socket-1"}]}})
    del project["materia"]
    rc = resolve_config(
        load_config([(DEFAULT_LABEL, default_config()), ("user.json", user), ("project.json", project)])
    )
    assert {(w.code, w.source) for w in rc.warnings} == {("unknown-thinking", "user.json"),
                                                         ("text-socket-guarded-edge", "project.json")}


# --------------------------------------------------------------------------- nulls in a higher layer


def test_nulls_in_a_higher_layer_merge_as_in_pi_materia() -> None:
    from castor.domain.materia.layers import merge_layers

    base = default_config()
    merged = merge_layers([(DEFAULT_LABEL, base), ("p", {"activeLoadout": None, "budget": None, "limits": None,
                                                         "materia": None, "loadouts": None})]).merged
    assert merged["activeLoadout"] == base["activeLoadout"] and merged["budget"] == base["budget"]
    assert merged["limits"] == base["limits"] and merged["materia"] == base["materia"]
    assert merged["loadouts"] == base["loadouts"]
    loops_null = merge_layers([(DEFAULT_LABEL, base), ("p", {"loadouts": {"Full-Auto": {"loops": None}}})]).merged
    assert loops_null["loadouts"]["Full-Auto"]["loops"] == base["loadouts"]["Full-Auto"]["loops"]  # no sockets key
    sockets_null = merge_layers([(DEFAULT_LABEL, base), ("p", {"loadouts": {"Full-Auto": {"sockets": None}}})]).merged
    assert sockets_null["loadouts"]["Full-Auto"]["sockets"] == base["loadouts"]["Full-Auto"]["sockets"]
    assert "loops" not in sockets_null["loadouts"]["Full-Auto"]  # a sockets key, even null, drops the loops
    entry_null = load_config([(DEFAULT_LABEL, base), ("p", {"loadouts": {"build": {"entry": None}}})])
    assert entry_null.merged["loadouts"]["build"]["entry"] == "Socket-1"  # null entry: the first socket


def test_a_whole_number_written_with_a_point_is_a_limit_as_pi_materia_reads_it() -> None:
    """JSON has one kind of number: pi-materia (JavaScript) reads ``3.0`` as 3, and castor refused
    ``limits.maxSocketVisits: 3.0`` as not an integer. It is taken as 3; 2.5 is still refused."""
    cfg = _cfg({"Socket-1": {"type": "agent", "materia": "A"}})
    cfg["limits"] = {"maxSocketVisits": 3.0, "maxEdgeTraversals": 2.0}
    limits = resolve_config(load_config([("t.json", json.loads(json.dumps(cfg)))])).limits
    assert (limits.max_socket_visits, limits.max_edge_traversals) == (3, 2)
    cfg["limits"] = {"maxSocketVisits": 2.5}
    with pytest.raises(ConfigError) as err:
        resolve_config(load_config([("t.json", cfg)]))
    assert [i.code for i in err.value.issues] == ["invalid-limits"]


def test_a_misspelt_field_is_warned_about_where_it_would_be_silently_ignored() -> None:
    # "maxCostUSD" for maxCostUsd: pi-materia loads it and the cast runs with no cost limit at all
    cfg = _cfg({"Socket-1": {"type": "agent", "materia": "A", "edgse": [{"when": "always", "to": "end"}]}})
    cfg.update(budget={"maxCostUSD": 1, "maxTokens": 10}, limits={"maxSocketVisit": 3}, buget={},
               compaction={"proactiveThresholdPercnt": 50})
    cfg["materia"]["A"]["multiturn"] = True
    rc = resolve_config(load_config([("t.json", cfg)]))
    assert sorted((w.code, w.path) for w in rc.warnings) == sorted([
        ("unknown-field", "/buget"), ("unknown-field", "/budget/maxCostUSD"),
        ("unknown-field", "/compaction/proactiveThresholdPercnt"), ("unknown-field", "/limits/maxSocketVisit"),
        ("unknown-field", "/loadouts/L/sockets/Socket-1/edgse"), ("unknown-field", "/materia/A/multiturn")])
    said = {w.path: w.message for w in rc.warnings}
    assert "maxCostUsd" in said["/budget/maxCostUSD"] and "ignored" in said["/budget/maxCostUSD"]
    assert all(w.source == "t.json" for w in rc.warnings)


def test_every_field_pi_materia_and_castor_define_is_known() -> None:
    cfg = _cfg({"Socket-1": {"type": "agent", "materia": "A", "parse": "json", "assign": {"x": "$.summary"},
                             "edges": [{"when": "satisfied", "to": "end"}, {"when": "always", "to": "Socket-2"}],
                             "limits": {"maxVisits": 2}, "empty": False, "layout": {"x": 1}},
                "Socket-2": {"type": "utility", "utility": "echo", "params": {"text": "hi"}, "timeoutMs": 5,
                             "next": "end"}},
               layout={"sockets": {}})
    cfg.update({"$schema": "x", "artifactDir": ".pi/pi-materia",
                "budget": {"maxTokens": 1, "maxCostUsd": 1, "warnAtPercent": 5, "stopAtLimit": False},
                "limits": {"maxSocketVisits": 3, "maxEdgeTraversals": 3},
                "compaction": {"proactiveThresholdPercent": 50}})
    cfg["materia"]["A"].update(model="m", thinking="low", multiTurn=False, generator=False, parse="text",
                               label="l", description="d", group="g", color="c", generates=None)
    assert resolve_config(load_config([(DEFAULT_LABEL, default_config()), ("t.json", cfg)])).warnings == []
    for name in default_config()["loadouts"]:
        assert resolve_config(load_config([(DEFAULT_LABEL, default_config())]), name).warnings == []
