"""Config layering, validation, normalization and resolve (spec §1–§3, conformance 1–27)."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest

from castor.adapters.materia import config_loader
from castor.domain.materia import checks, graph
from castor.domain.materia.config import ConfigError, ConfigIssue, pointer
from castor.domain.materia.defaults import DEFAULT_LABEL, default_config
from castor.domain.materia.grid import render_grid
from castor.domain.materia.layers import merge_layers
from castor.domain.materia.resolve import load_config, resolve_config
from castor.messages.errors import ErrorCode

from .scripted import agent, config


def codes(issues: list[ConfigIssue]) -> list[str]:
    return [i.code for i in issues]


def write(path: Path, data: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return path


# ----------------------------------------------------------------------------- layering


def test_1_layers_precedence_and_scopes(tmp_path: Path) -> None:
    profile = tmp_path / "profile"
    cwd = tmp_path / "proj"
    one = {"type": "agent", "entry": "Socket-1", "sockets": {"Socket-1": {"type": "agent", "materia": "builder"}}}
    write(profile / "materia.json", {"activeLoadout": "U", "materia": {"builder": {"model": "user/m"}},
                                     "loadouts": {"U": one}})
    write(cwd / ".pi/pi-materia.json", {"activeLoadout": "P", "materia": {"builder": {"model": "proj/m"}},
                                        "loadouts": {"P": one}})
    explicit = write(tmp_path / "x.json", {"activeLoadout": "X", "materia": {"builder": {"model": "exp/m"}},
                                           "loadouts": {"X": one}})
    loaded = config_loader.load(cwd, config_path=explicit, env={"PI_MATERIA_PROFILE_DIR": str(profile)})
    assert loaded.merged["activeLoadout"] == "X"
    assert loaded.merged["materia"]["builder"]["model"] == "exp/m"
    assert loaded.merged["materia"]["builder"]["tools"] == "coding"  # other fields kept
    assert {"U", "P", "X", "build", "hello", "plan"} <= set(loaded.merged["loadouts"])
    assert [i.scope for i in loaded.layers] == ["default", "user", "project", "explicit"]
    assert loaded.provenance.source.count(" < ") == 3


def test_2_flag_beats_env_entirely(tmp_path: Path) -> None:
    flag = write(tmp_path / "flag.json", {"activeLoadout": "hello"})
    env_file = write(tmp_path / "env.json", {"activeLoadout": "plan", "materia": {"extra": agent()}})
    loaded = config_loader.load(tmp_path, config_path=flag,
                                env={"MATERIA_CONFIG": str(env_file), "PI_MATERIA_PROFILE_DIR": str(tmp_path / "p")})
    assert loaded.merged["activeLoadout"] == "hello"
    assert "extra" not in loaded.merged["materia"]
    only_env = config_loader.load(tmp_path, env={"MATERIA_CONFIG": f"  {env_file}  ",
                                                 "PI_MATERIA_PROFILE_DIR": str(tmp_path / "p")})
    assert only_env.merged["activeLoadout"] == "plan"
    blank = config_loader.load(tmp_path, env={"MATERIA_CONFIG": "   ", "PI_MATERIA_PROFILE_DIR": str(tmp_path / "p")})
    assert blank.merged["activeLoadout"] == "build"


def test_explicit_missing_file_is_an_issue(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        config_loader.load(tmp_path, config_path="nope.json", env={"PI_MATERIA_PROFILE_DIR": str(tmp_path)})
    assert err.value.code == ErrorCode.INVALID_CONFIG
    assert codes(err.value.issues) == ["file-not-found"]
    assert "config file not found" in err.value.issues[0].message
    assert err.value.issues[0].source == str(tmp_path / "nope.json")


def test_3_null_deletes_loadout_but_shipped_ones_are_protected() -> None:
    base = default_config()
    merged = merge_layers([(DEFAULT_LABEL, base), ("user", {"loadouts": {"X": {"entry": "Socket-1", "sockets": {}},
                                                                          "build": None}}),
                           ("project", {"loadouts": {"X": None}})])
    assert "X" not in merged.merged["loadouts"]
    assert "build" in merged.merged["loadouts"]
    assert merged.provenance.loadouts["build"] == DEFAULT_LABEL
    assert merged.provenance.ignored_deletes == ["user:build"]


def test_5_materia_field_null_deletes_only_that_field() -> None:
    base = default_config()
    base["materia"]["builder"]["model"] = "a/b"
    merged = merge_layers([(DEFAULT_LABEL, base), ("u", {"materia": {"builder": {"model": None}}})]).merged
    assert "model" not in merged["materia"]["builder"]
    assert merged["materia"]["builder"]["tools"] == "coding"


def test_sockets_replaced_wholesale_and_loops_dropped_without_override() -> None:
    override = {"loadouts": {"build": {"sockets": {"Socket-1": {"type": "agent", "materia": "greeter"}}}}}
    merged = merge_layers([(DEFAULT_LABEL, default_config()), ("p", override)]).merged
    assert list(merged["loadouts"]["build"]["sockets"]) == ["Socket-1"]
    assert "loops" not in merged["loadouts"]["build"]
    assert merged["loadouts"]["build"]["entry"] == "Socket-1"
    kept = merge_layers([(DEFAULT_LABEL, default_config()), ("p", {"loadouts": {"build": {"entry": "Socket-1"}}})])
    assert "loops" in kept.merged["loadouts"]["build"]


def test_budget_limits_shallow_merge() -> None:
    merged = merge_layers([(DEFAULT_LABEL, default_config()), ("p", {"limits": {"maxSocketVisits": 3},
                                                                     "budget": {"maxCostUsd": None}})]).merged
    assert merged["limits"] == {"maxSocketVisits": 3, "maxEdgeTraversals": 25}
    assert "maxCostUsd" not in merged["budget"] and merged["budget"]["maxTokens"] == 4_000_000


def test_merge_does_not_mutate_inputs() -> None:
    base = default_config()
    layer = {"loadouts": {"build": None, "hello": {"entry": "Socket-1"}}, "materia": {"greeter": {"model": None}}}
    snapshot = (copy.deepcopy(base), copy.deepcopy(layer))
    merge_layers([(DEFAULT_LABEL, base), ("x", layer)])
    assert (base, layer) == snapshot


# ----------------------------------------------------------------------------- obsolete / materia


@pytest.mark.parametrize(
    ("layer", "field"),
    [
        ({"materia": {"m": {"prompt": "p", "tools": "none", "systemPrompt": "x"}}}, "systemPrompt"),
        ({"loadouts": {"L": {"prompt": "x", "sockets": {}}}}, "prompt"),
        ({"loadouts": {"L": {"systemPrompt": "x", "sockets": {}}}}, "systemPrompt"),
        ({"loadouts": {"L": {"sockets": {"Socket-1": {"type": "agent", "role": "r"}}}}}, "role"),
        ({"loadouts": {"L": {"sockets": {"Socket-1": {"type": "agent", "prompt": "r"}}}}}, "prompt"),
        ({"roles": {}}, "roles"),
        ({"materiaDefinitions": {}}, "materiaDefinitions"),
    ],
)
def test_6_obsolete_fields_named_with_file(layer: dict, field: str) -> None:
    issues = checks.check_obsolete(layer, "/tmp/proj/.pi/pi-materia.json")
    assert codes(issues) == ["obsolete-field"]
    assert f'"{field}"' in issues[0].message
    assert "/tmp/proj/.pi/pi-materia.json" in issues[0].message
    assert issues[0].path.endswith(field)


def test_7_socket_multiturn_fails_at_resolve() -> None:
    cfg = config({"Socket-1": {"type": "agent", "materia": "A", "multiTurn": True}})
    loaded = load_config([("t", cfg)])
    assert loaded.ok  # load accepts it: it is a resolve-time check
    with pytest.raises(ConfigError) as err:
        resolve_config(loaded)
    assert any("obsolete multiTurn" in i.message for i in err.value.issues)


def test_a_bad_top_level_value_is_pointed_at_by_the_key_the_file_uses() -> None:
    cfg = {**config({"Socket-1": {"type": "agent", "materia": "A"}}), "artifactDir": 5}
    with pytest.raises(ConfigError) as err:
        resolve_config(load_config([("t", cfg)]))
    assert [i.path for i in err.value.issues] == ["/artifactDir"], err.value.issues
    assert "artifactDir" in err.value.issues[0].message and "artifact_dir" not in err.value.issues[0].message


def test_8_generates_metadata() -> None:
    bad = checks.check_obsolete({"materia": {"m": {"prompt": "p", "tools": "none", "generates": {"x": 1}}}}, "f")
    assert "obsolete generates metadata" in bad[0].message
    assert checks.check_obsolete({"materia": {"m": {"prompt": "p", "tools": "none", "generates": None}}}, "f") == []


def test_9_agent_materia_prompt_and_tools() -> None:
    assert "invalid prompt" in checks.check_materia_entry("m", {"tools": "none"})[0].message
    assert "invalid tools" in checks.check_materia_entry("m", {"prompt": "p", "tools": "all"})[0].message
    assert "unsupported type" in checks.check_materia_entry("m", {"type": "robot"})[0].message
    assert checks.check_materia_entry("u", {"type": "utility", "utility": "noop"}) == []
    assert checks.check_materia_entry("u", {"type": "utility", "prompt": "x"})  # needs utility/command, no prompt


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("entry", "field", "words"), [
    ({"type": "utility", "utility": 5, "command": ["true"]}, "utility", "utility must be a string"),
    ({"type": "utility", "utility": ["echo"]}, "utility", "utility must be a string"),
    ({"type": "utility", "utility": "echo", "parse": "yaml"}, "parse", "unsupported parse mode"),
])
def test_a_utility_materia_with_a_utility_not_a_string_or_an_unknown_parse_is_refused_as_in_pi_materia(
    entry: dict, field: str, words: str
) -> None:
    # pi-materia checks a utility palette entry's utility and parse as it checks a socket's; castor
    # loaded both (a palette entry that a socket copying it could not use).
    issues = checks.check_materia_entry("u", entry)
    assert [(i.code, i.path) for i in issues] == [("invalid-materia", f"/materia/u/{field}")]
    assert words in issues[0].message


def test_unknown_palette_fields_are_kept_through_resolve() -> None:
    cfg = config({"Socket-1": {"type": "agent", "materia": "A", "empty": False, "layout": {"x": 1}}},
                 materia={"A": agent(label="Alpha", color="#fff", group="g", description="d", parse="json")})
    rc = resolve_config(load_config([("t", cfg)]))
    assert rc.pipeline.sockets["Socket-1"].materia.model_extra["color"] == "#fff"
    assert rc.config["materia"]["A"]["label"] == "Alpha"
    # legacy per-socket layout moved under loadout.layout.sockets
    assert rc.config["loadouts"]["L"]["layout"]["sockets"]["Socket-1"] == {"x": 1}


# ----------------------------------------------------------------------------- graph validation


@pytest.mark.parametrize("bad_id", ["Socket-0", "Socket-03", "Build", "Socket 3"])
def test_10_socket_ids(bad_id: str) -> None:
    issues = graph.validate_graph({"entry": bad_id, "sockets": {bad_id: {"type": "agent"}}}, name="L")
    assert "invalid-socket-id" in codes(issues)
    hit = [i for i in issues if i.path == f"/loadouts/L/sockets/{bad_id}"][0]
    assert "Socket-N" in hit.message


@pytest.mark.timeout(30)
@pytest.mark.parametrize("bad_id", ["Socket-1\n", "Socket-1\u0663", "Socket-\u0661", "Socket-2\uff13"])
def test_socket_ids_take_ascii_digits_and_nothing_after_them_as_pi_materias_pattern_does(bad_id: str) -> None:
    # JavaScript's ^Socket-([1-9]\d*)$ has ASCII digits only and its $ is the end of the text; Python's
    # \d and $ took "Socket-1\n" (its artifacts were written under Socket-1's) and other scripts' digits.
    issues = graph.validate_graph({"entry": "Socket-1", "sockets": {"Socket-1": {"type": "agent"},
                                                                    bad_id: {"type": "agent"}}}, name="L")
    assert [i.code for i in issues if i.path == pointer("loadouts", "L", "sockets", bad_id)] == ["invalid-socket-id"]
    assert not graph.is_socket_id(bad_id)


def test_11_entry_end() -> None:
    issues = graph.validate_graph({"entry": "end", "sockets": {"Socket-1": {}}})
    assert [(i.code, i.path) for i in issues] == [("invalid-socket-id", "/entry")]


def test_12_unreachable_edges() -> None:
    sockets = {"Socket-1": {"edges": [{"when": "always", "to": "Socket-2"}, {"when": "not_satisfied", "to": "Socket-3"},
                                      {"when": "always", "to": "Socket-3"}]}, "Socket-2": {}, "Socket-3": {}}
    issues = graph.validate_graph({"entry": "Socket-1", "sockets": sockets})
    assert [(i.code, i.path) for i in issues] == [("unreachable-edge", "/sockets/Socket-1/edges/1"),
                                                  ("unreachable-edge", "/sockets/Socket-1/edges/2")]


def test_13_repeated_guards_are_valid() -> None:
    sockets = {"Socket-1": {"edges": [{"when": "satisfied", "to": "Socket-2"}, {"when": "satisfied", "to": "Socket-3"},
                                      {"when": "not_satisfied", "to": "Socket-3"}]}, "Socket-2": {}, "Socket-3": {}}
    assert graph.validate_graph({"entry": "Socket-1", "sockets": sockets}) == []


@pytest.mark.parametrize("when", [" ", "$.passed == true", "exists($.x)"])
def test_14_invalid_edge_conditions(when: str) -> None:
    loadout = graph.normalize_loadout({"sockets": {"Socket-1": {"edges": [{"when": when, "to": "end"}]}}})
    assert codes(graph.validate_graph(loadout)) == ["invalid-edge-condition"]


@pytest.mark.parametrize("when", [None, "", "flow", "Flow"])
def test_14_when_aliases_normalize_to_always(when: str | None) -> None:
    edge = {"to": "end"} if when is None else {"when": when, "to": "end"}
    loadout = graph.normalize_loadout({"sockets": {"Socket-1": {"edges": [edge]}}})
    assert loadout["sockets"]["Socket-1"]["edges"] == [{"when": "always", "to": "end"}]
    assert graph.validate_graph(loadout) == []


def test_15_legacy_next_and_idempotence() -> None:
    raw = {"sockets": {"Socket-1": {"type": "agent", "next": "Socket-2"}, "Socket-2": {"type": "agent"}}}
    once = graph.normalize_loadout(raw)
    assert once["sockets"]["Socket-1"]["edges"] == [{"when": "always", "to": "Socket-2"}]
    assert "next" not in once["sockets"]["Socket-1"]
    assert once["entry"] == "Socket-1"
    assert graph.normalize_loadout(once) == once
    assert "next" in raw["sockets"]["Socket-1"]  # input untouched


def test_16_missing_edge_target() -> None:
    issues = graph.validate_graph({"entry": "Socket-1", "sockets": {"Socket-1": {"edges": [{"when": "always"}]}}})
    assert [(i.code, i.path) for i in issues] == [("missing-endpoint", "/sockets/Socket-1/edges/0/to")]


def test_end_as_a_loop_member_is_not_a_socket_id() -> None:
    lo = _loop_loadout()
    lo["loops"]["lp"]["sockets"] = ["Socket-2", "end"]
    issues = graph.validate_graph(lo)
    assert [(i.code, i.path) for i in issues] == [("invalid-socket-id", "/loops/lp/sockets/1")]  # pi-materia's code
    assert 'loops.lp.sockets[1]: "end"' in issues[0].message


def test_unknown_endpoint() -> None:
    issues = graph.validate_graph({"entry": "Socket-1", "sockets": {"Socket-1": {"edges": [{"to": "Socket-9"}]}}})
    assert codes(issues) == ["unknown-endpoint"]


def _loop_loadout(**loop_fields: object) -> dict:
    sockets = {
        "Socket-1": {"type": "agent", "materia": "G", "edges": [{"when": "always", "to": "Socket-2"}]},
        "Socket-2": {"type": "agent", "materia": "A", "edges": [{"when": "always", "to": "Socket-3"}]},
        "Socket-3": {"type": "agent", "materia": "A", "edges": [{"when": "always", "to": "Socket-2"}]},
        "Socket-4": {"type": "agent", "materia": "A"},
    }
    loop = {"sockets": ["Socket-2", "Socket-3"], "consumes": {"from": "Socket-1"}, **loop_fields}
    return {"entry": "Socket-1", "sockets": sockets, "loops": {"lp": loop}}


def test_17_exit_from_not_member() -> None:
    issues = graph.validate_graph(_loop_loadout(exit={"from": "Socket-4", "when": "always", "to": "end"}))
    assert ("invalid-loop", "/loops/lp/exit/from") in [(i.code, i.path) for i in issues]


def test_18_exits_problems_all_reported() -> None:
    exits = [
        {"id": "", "from": "Socket-3", "condition": "always", "targetSocketId": "Socket-4"},
        {"id": "a", "from": "Socket-3", "condition": "satisfied", "targetSocketId": "Socket-4"},
        {"id": "a", "from": "Socket-4", "condition": "always", "targetSocketId": "Socket-4"},
        {"id": "b", "from": "Socket-3", "condition": "satisfied", "targetSocketId": "end"},
    ]
    issues = graph.validate_graph(_loop_loadout(exits=exits))
    messages = " | ".join(i.message for i in issues)
    assert "exits[0].id must be a non-empty string" in messages
    assert 'exits[2].id "a" is duplicated' in messages
    assert "exits[2].from" in messages and "not a loop member" in messages
    assert "Only one route per condition per loop exit source" in messages


def test_19_consuming_loop_needs_cycle() -> None:
    lo = _loop_loadout()
    lo["sockets"]["Socket-3"]["edges"] = [{"when": "always", "to": "Socket-4"}]
    issues = graph.validate_graph(lo)
    assert any("must contain a directed cycle" in i.message for i in issues)


def test_20_inbound_generator_edges_counted_at_resolve() -> None:
    materia = {"A": agent(), "G": agent(generator=True)}
    detector = graph.default_generator_detector(materia)
    none = _loop_loadout()
    none["sockets"]["Socket-1"]["edges"] = [{"when": "always", "to": "Socket-4"}]
    assert any("found none" in i.message for i in graph.validate_graph(none, generator_detector=detector))
    two = _loop_loadout()
    two["sockets"]["Socket-1"]["edges"] = [
        {"when": "satisfied", "to": "Socket-2"},
        {"when": "always", "to": "Socket-3"},
    ]
    assert any("found 2" in i.message for i in graph.validate_graph(two, generator_detector=detector))
    assert graph.validate_graph(_loop_loadout(), generator_detector=detector) == []
    assert not any("found" in i.message for i in graph.validate_graph(none))  # load time: not counted


def test_21_exit_source_with_text_parse_is_rejected() -> None:
    lo = _loop_loadout(exit={"from": "Socket-3", "when": "satisfied", "to": "end"})
    lo["sockets"]["Socket-3"]["parse"] = "text"
    _, issues = graph.prepare_loadout(lo, {"A": agent(), "G": agent(generator=True)}, name="L")
    assert codes(issues) == ["invalid-loop"]
    assert 'parse' in issues[0].message and '"json"' in issues[0].message


def test_22_materialization_adds_parse_and_advance_idempotently() -> None:
    materia = {"A": agent(), "G": agent(generator=True)}
    lo = _loop_loadout(exit={"from": "Socket-3", "when": "satisfied", "to": "end"})
    lo["sockets"]["Socket-3"]["edges"] = [{"when": "not_satisfied", "to": "Socket-2"},
                                          {"when": "satisfied", "to": "Socket-2"}]
    prepared, issues = graph.prepare_loadout(lo, materia)
    assert issues == []
    src = prepared["sockets"]["Socket-3"]
    assert src["parse"] == "json"
    assert src["advance"] == {"cursor": "workItemIndex", "items": "state.workItems", "when": "satisfied"}
    again, issues2 = graph.prepare_loadout(prepared, materia)
    assert again == prepared and issues2 == []
    assert graph.validate_graph(prepared, generator_detector=graph.default_generator_detector(materia)) == []


def test_23_conflicting_existing_advance() -> None:
    lo = _loop_loadout(exit={"from": "Socket-3", "when": "satisfied", "to": "end"})
    lo["sockets"]["Socket-3"]["advance"] = {"cursor": "otherIndex", "items": "state.workItems", "when": "satisfied"}
    _, issues = graph.prepare_loadout(lo, {"A": agent(), "G": agent(generator=True)})
    assert any('existing advance block' in i.message and 'cursor: current "otherIndex", expected "workItemIndex"'
               in i.message for i in issues)


def test_24_exit_to_socket_materializes_route() -> None:
    materia = {"A": agent(), "G": agent(generator=True)}
    prepared, _ = graph.prepare_loadout(_loop_loadout(exit={"from": "Socket-3", "when": "always", "to": "Socket-4"}),
                                        materia)
    assert prepared["loops"]["lp"]["exits"] == [{"id": "exit:Socket-3:always", "from": "Socket-3",
                                                 "condition": "always", "targetSocketId": "Socket-4"}]
    to_end, _ = graph.prepare_loadout(_loop_loadout(exit={"from": "Socket-3", "when": "always", "to": "end"}), materia)
    assert to_end["loops"]["lp"].get("exits", []) == []


def _loadout_errors(loadout: dict) -> list[tuple[str, str]]:
    cfg = {"materia": {"A": agent(), "G": agent(generator=True)}, "activeLoadout": "L", "loadouts": {"L": loadout}}
    with pytest.raises(ConfigError) as err:
        resolve_config(load_config([("t", copy.deepcopy(cfg))]))
    at_resolve = [(i.code, i.path) for i in err.value.issues]
    assert at_resolve == [(i.code, i.path) for i in load_config([("t", cfg)]).issues]  # validate says the same
    return at_resolve


@pytest.mark.parametrize("exit_", [{"from": "Socket-3", "when": "always", "to": "Socket-9"},
                                   {"from": "Socket-9", "when": "done", "to": "Socket-10"}])
def test_24_an_exit_to_a_missing_socket_is_reported_where_the_file_says_it_and_materializes_no_route(
        exit_: dict) -> None:
    """The legacy exit shim mirrored ``exit.to`` into ``exits`` whatever it named, so a missing
    target was reported again at ``/loops/lp/exits/0/...``, a pointer the file does not have."""
    lo = _loop_loadout(exit=exit_)
    prepared, _ = graph.prepare_loadout(lo, {"A": agent(), "G": agent(generator=True)})
    assert "exits" not in prepared["loops"]["lp"]
    errors = _loadout_errors(lo)
    assert ("unknown-endpoint", "/loadouts/L/loops/lp/exit/to") in errors
    assert not [path for _, path in errors if "/exits/" in path]
    assert len(errors) == len(set(errors))


def test_24_an_advance_done_naming_a_missing_socket_materializes_no_route() -> None:
    lo = _loop_loadout()
    lo["sockets"]["Socket-3"]["advance"] = {"cursor": "workItemIndex", "items": "state.workItems", "done": "Socket-9"}
    prepared, _ = graph.prepare_loadout(lo, {"A": agent(), "G": agent(generator=True)})
    assert "exits" not in prepared["loops"]["lp"]
    assert _loadout_errors(lo) == [("unknown-endpoint", "/loadouts/L/sockets/Socket-3/advance/done")]


def test_21_23_a_loop_exit_problem_found_by_preparation_and_validation_is_reported_once() -> None:
    """Preparing and validating a loadout both check a loop exit's parse and advance: each
    problem was reported twice, in two wordings."""
    lo = _loop_loadout(exit={"from": "Socket-3", "when": "satisfied", "to": "end"})
    lo["sockets"]["Socket-3"]["parse"] = "text"
    assert _loadout_errors(lo) == [("invalid-loop", "/loadouts/L/sockets/Socket-3/parse")]
    lo = _loop_loadout(exit={"from": "Socket-3", "when": "satisfied", "to": "end"})
    lo["sockets"]["Socket-3"]["edges"] = [{"when": "not_satisfied", "to": "Socket-2"}]
    lo["sockets"]["Socket-3"]["advance"] = {"cursor": "i", "items": "state.other", "when": "always"}
    assert _loadout_errors(lo) == [("invalid-loop", f"/loadouts/L/sockets/Socket-3/advance/{field}")
                                   for field in ("cursor", "items", "when")]


def test_25_generator_sockets_forced_to_json() -> None:
    materia = {"A": agent(), "G": agent(generator=True), "G2": agent(generator=True)}
    lo = _loop_loadout()
    lo["sockets"]["Socket-1"]["parse"] = "text"
    prepared, _ = graph.prepare_loadout(lo, materia)
    assert prepared["sockets"]["Socket-1"]["parse"] == "json"
    assert prepared["sockets"]["Socket-1"]["assign"] == {"workItems": "$.workItems"}
    chain = {"entry": "Socket-1", "sockets": {
        "Socket-1": {"type": "agent", "materia": "G", "assign": {"x": "$.x"}, "edges": [{"to": "Socket-2"}]},
        "Socket-2": {"type": "agent", "materia": "G2"}}}
    prepared, _ = graph.prepare_loadout(chain, materia)
    for sid in ("Socket-1", "Socket-2"):
        assert prepared["sockets"][sid]["parse"] == "json"
        assert prepared["sockets"][sid]["assign"]["workItems"] == "$.workItems"
    assert prepared["sockets"]["Socket-1"]["assign"]["x"] == "$.x"


def test_26_consumes_derives_iterator() -> None:
    lo = _loop_loadout()
    cfg = {"materia": {"A": agent(), "G": agent(generator=True)}, "loadouts": {"L": lo}, "activeLoadout": "L"}
    rc = resolve_config(load_config([("t", cfg)]))
    assert rc.pipeline.loops["lp"].iterator.to_json() == {"items": "state.workItems", "as": "workItem",
                                                          "cursor": "workItemIndex", "done": "end"}


def test_27_compaction_tiers() -> None:
    gap = [{"thresholdPercent": 70, "maxContextWindow": 100}, {"thresholdPercent": 60, "minContextWindow": 150}]
    overlap = [{"thresholdPercent": 70, "maxContextWindow": 100}, {"thresholdPercent": 60, "minContextWindow": 50}]
    closed = [{"thresholdPercent": 70, "maxContextWindow": 100},
              {"thresholdPercent": 60, "minContextWindow": 100, "maxContextWindow": 200}]
    for tiers, word in ((gap, "gap"), (overlap, "overlap"), (closed, "open-ended")):
        issues = checks.check_compaction({"proactiveThresholdTiers": tiers})
        assert codes(issues) == ["invalid-compaction"] and word in issues[0].message
    good = [{"thresholdPercent": 70, "maxContextWindow": 100}, {"thresholdPercent": 60, "minContextWindow": 100}]
    assert checks.check_compaction({"proactiveThresholdPercent": 42, "proactiveThresholdTiers": good}) == []


# ----------------------------------------------------------------------------- resolve


def test_resolve_names_available_loadouts_and_unknown_materia() -> None:
    loaded = load_config([(DEFAULT_LABEL, default_config())])
    with pytest.raises(ConfigError) as err:
        resolve_config(loaded, "nope")
    assert "Available loadouts: hello, plan, build" in str(err.value)
    bad = config({"Socket-1": {"type": "agent", "materia": "ghost"}})
    with pytest.raises(ConfigError) as err2:
        resolve_config(load_config([("t", bad)]))
    assert codes(err2.value.issues) == ["unknown-materia"]
    assert 'references unknown materia "ghost"' in err2.value.issues[0].message


def test_resolve_reports_every_issue_with_pointer() -> None:
    bad = config({"Socket-1": {"type": "utility", "command": ["ok", "", "h\0i"], "timeoutMs": -1, "parse": "yaml"},
                  "Socket-2": {"type": "robot"}})
    with pytest.raises(ConfigError) as err:
        resolve_config(load_config([("t", bad)]))
    found = {(i.code, i.path) for i in err.value.issues}
    assert ("invalid-socket", "/loadouts/L/sockets/Socket-1/command/1") in found
    assert ("invalid-socket", "/loadouts/L/sockets/Socket-1/command/2") in found  # a NUL no program can receive
    assert ("invalid-socket", "/loadouts/L/sockets/Socket-1/timeoutMs") in found
    assert ("invalid-socket", "/loadouts/L/sockets/Socket-1/parse") in found
    assert ("invalid-socket", "/loadouts/L/sockets/Socket-2/type") in found
    assert err.value.to_wire()["code"] == "invalid_config"
    assert len(err.value.to_wire()["data"]["issues"]) == len(err.value.issues)


def test_text_socket_with_guarded_edges_loads_with_a_warning() -> None:
    """pi-materia loads this shape (conformance 31): castor loads it too and warns where it is."""
    cfg = config({"Socket-1": {"type": "agent", "materia": "A", "edges": [{"when": "satisfied", "to": "Socket-2"}]},
                  "Socket-2": {"type": "agent", "materia": "A"}})
    rc = resolve_config(load_config([("t", cfg)]))
    assert [(w.code, w.path, w.severity) for w in rc.warnings] == [
        ("text-socket-guarded-edge", "/loadouts/L/sockets/Socket-1/edges/0/when", "warning")]
    assert 'parse "text"' in rc.warnings[0].message


def test_every_loadout_graph_validated_at_load() -> None:
    cfg = default_config()
    cfg["loadouts"]["broken"] = {"entry": "Socket-1", "sockets": {"Socket-1": {"type": "agent", "materia": "greeter",
                                                                               "edges": [{"to": "Socket-5"}]}}}
    loaded = load_config([(DEFAULT_LABEL, cfg)])
    assert codes(loaded.issues) == ["unknown-endpoint"]
    assert loaded.issues[0].message.startswith('Materia loadout "broken" graph is invalid:')


def test_bundled_default_resolves_every_loadout() -> None:
    loaded = load_config([(DEFAULT_LABEL, default_config())])
    assert loaded.ok
    for name in ("hello", "plan", "build"):
        rc = resolve_config(loaded, name)
        assert rc.pipeline.loadout_name == name
        assert render_grid(rc).startswith(f"⌘ loadout {name}")
    assert resolve_config(loaded).pipeline.loadout_name == "build"


# ----------------------------------------------------------------------------- loader IO


def test_malformed_files_become_issues_not_tracebacks(tmp_path: Path) -> None:
    bad_json = write(tmp_path / "a.json", '{"activeLoadout": ')
    array = write(tmp_path / "b.json", "[1, 2]")
    binary = tmp_path / "c.json"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    directory = tmp_path / "d.json"
    directory.mkdir()
    assert codes(config_loader.validate_file(bad_json)) == ["invalid-json"]
    assert "line 1" in config_loader.validate_file(bad_json)[0].message
    assert codes(config_loader.validate_file(array)) == ["not-an-object"]
    assert codes(config_loader.validate_file(binary)) == ["read-error"]
    assert codes(config_loader.validate_file(directory)) == ["read-error"]
    assert codes(config_loader.validate_file(tmp_path / "missing.json")) == ["file-not-found"]


def test_validate_file_reports_obsolete_with_path_and_resolve_issues(tmp_path: Path) -> None:
    obsolete = write(tmp_path / "o.json", {"roles": {}})
    issues = config_loader.validate_file(obsolete)
    assert codes(issues) == ["obsolete-field"] and str(obsolete) in issues[0].message
    active_bad = write(tmp_path / "r.json", {"loadouts": {"R": {"sockets": {"Socket-1": {"type": "agent",
                                                                                          "materia": "ghost"}}}},
                                             "activeLoadout": "R"})
    assert codes(config_loader.validate_file(active_bad)) == ["unknown-materia"]
    assert config_loader.validate_file(write(tmp_path / "ok.json", {"activeLoadout": "hello"})) == []


def test_project_layer_and_save_active_loadout(tmp_path: Path) -> None:
    env = {"PI_MATERIA_PROFILE_DIR": str(tmp_path / "profile")}
    target = config_loader.save_active_loadout(tmp_path, "plan", env=env)
    assert target == tmp_path / ".pi/pi-materia.json"
    assert json.loads(target.read_text()) == {"activeLoadout": "plan"}
    assert config_loader.load_resolved(tmp_path, env=env).pipeline.loadout_name == "plan"
    with pytest.raises(ConfigError) as err:
        config_loader.save_active_loadout(tmp_path, "nope", env=env)
    assert "Unknown Materia loadout" in str(err.value) and "plan" in str(err.value)
    assert json.loads(target.read_text()) == {"activeLoadout": "plan"}  # unchanged


def test_profile_dir_env_trimmed_and_default(tmp_path: Path) -> None:
    assert config_loader.profile_dir({"PI_MATERIA_PROFILE_DIR": f"  {tmp_path}  "}) == tmp_path
    assert config_loader.profile_dir({}, home=tmp_path) == tmp_path / ".config/pi/pi-materia"


@pytest.mark.timeout(20)
def test_validate_file_refuses_devices_fifos_and_huge_files_without_reading_them(tmp_path: Path) -> None:
    """A config path to /dev/zero or a FIFO is a read-error at once, not a hang that eats memory."""
    zero = tmp_path / "zero.json"
    zero.symlink_to("/dev/zero")
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)  # nobody ever writes to it: opening it blocking would wait forever
    huge = tmp_path / "huge.json"
    with open(huge, "wb") as handle:
        handle.write(b'{"x": "' + b"a" * config_loader.MAX_CONFIG_BYTES + b'"}')
    for path in (zero, fifo, huge):
        issues = config_loader.validate_file(path)
        assert codes(issues) == ["read-error"], path
    assert "not a regular file" in config_loader.validate_file(fifo)[0].message
    assert "larger than" in config_loader.validate_file(huge)[0].message


def test_a_lone_surrogate_escaped_in_a_config_file_loads_as_a_replacement_character(tmp_path: Path) -> None:
    cfg = tmp_path / "c.json"
    cfg.write_text('{"materia": {"Odd": {"prompt": "say \\ud800 {{request}}", "tools": "none"}}}')
    loaded = config_loader.load(tmp_path, config_path=str(cfg), env={"PI_MATERIA_PROFILE_DIR": str(tmp_path)})
    assert loaded.merged["materia"]["Odd"]["prompt"] == "say \ufffd {{request}}"


def test_save_active_loadout_keeps_the_file_mode(tmp_path: Path) -> None:
    project = tmp_path / "p"
    target = write(project / ".pi" / "pi-materia.json", {"activeLoadout": "hello"})
    target.chmod(0o664)
    config_loader.save_active_loadout(project, "plan", env={"PI_MATERIA_PROFILE_DIR": str(tmp_path)})
    assert json.loads(target.read_text())["activeLoadout"] == "plan"
    assert (target.stat().st_mode & 0o777) == 0o664


def test_a_negative_traversal_or_socket_limit_is_a_config_error_not_a_failed_cast() -> None:
    bad = config({"Socket-1": {"type": "agent", "materia": "A",
                               "edges": [{"when": "always", "to": "end", "maxTraversals": -1}]}})
    with pytest.raises(ConfigError) as err:
        resolve_config(load_config([("t.json", bad)]))
    assert codes(err.value.issues) == ["invalid-socket"]
    assert err.value.issues[0].path.endswith("/sockets/Socket-1/edges/0/maxTraversals")
    limits = config({"Socket-1": {"type": "agent", "materia": "A", "limits": {"maxVisits": -2}}})
    with pytest.raises(ConfigError):
        resolve_config(load_config([("t.json", limits)]))


def test_the_grid_shows_a_name_with_a_line_break_on_one_line() -> None:
    cfg = config({"Socket-1": {"type": "agent", "materia": "A"}})
    cfg["loadouts"] = {"a\nFAKE LINE\x1b[2J": cfg["loadouts"][next(iter(cfg["loadouts"]))]}
    cfg["activeLoadout"] = "a\nFAKE LINE\x1b[2J"
    text = render_grid(resolve_config(load_config([("t", cfg)])))
    assert "⌘ loadout a\\nFAKE LINE\\x1b[2J" in text.splitlines()
    assert not any(line.startswith("FAKE LINE") for line in text.splitlines())


@pytest.mark.timeout(10)
def test_each_prepared_issue_hides_one_validated_issue_at_its_place_never_a_second_problem_there() -> None:
    at = "/loadouts/L/sockets/Socket-2/advance/cursor"
    prepared = [ConfigIssue(code="invalid-loop", path=at, message='loop "a" conflicts')]
    validated = [ConfigIssue(code="invalid-loop", path=at, message='Socket-2.advance.cursor ... for loop "a"'),
                 ConfigIssue(code="invalid-loop", path=at, message='Socket-2.advance.cursor ... for loop "b"'),
                 ConfigIssue(code="unknown-endpoint", path=at, message="elsewhere")]
    assert [i.message for i in graph.issues_once(prepared, validated)] == [
        'loop "a" conflicts', 'Socket-2.advance.cursor ... for loop "b"', "elsewhere"]


def _json_paths(doc: object, base: tuple = ()) -> list[tuple]:
    out = [base] if base else []
    if isinstance(doc, dict):
        for key, value in doc.items():
            out += _json_paths(value, (*base, key))
    elif isinstance(doc, list):
        for index, value in enumerate(doc):
            out += _json_paths(value, (*base, index))
    return out


@pytest.mark.timeout(60)
@pytest.mark.parametrize("wrong", [[], {}, ["Socket-2"], {"Socket-2": 1}])
def test_an_array_or_object_anywhere_in_a_loop_loadout_is_a_config_issue_never_a_crash(wrong: object) -> None:
    """An edge ``to`` written as an array or object on a loop member ("to": ["Socket-2"]) crashed
    loading with ``TypeError: unhashable type`` (the loop's cycle and exit-route checks looked the
    value up in a set): `castor validate`, `grid` and `cast` printed a traceback. Every field of a
    loop loadout set to an array or an object is a ConfigError, or loads."""
    loadout = _loop_loadout(exit={"from": "Socket-3", "when": "satisfied", "to": "Socket-4"},
                            exits=[{"id": "x", "from": "Socket-3", "condition": "not_satisfied",
                                    "targetSocketId": "Socket-4"}])
    loadout["sockets"]["Socket-3"]["parse"] = "json"
    loadout["sockets"]["Socket-3"]["edges"] = [{"when": "not_satisfied", "to": "Socket-2"}]
    base = config(loadout["sockets"], loops=loadout["loops"])
    paths = [p for p in _json_paths(base) if p[0] == "loadouts"]
    assert any(p[-1] == "to" for p in paths)
    for path in paths:
        mutated = copy.deepcopy(base)
        parent = mutated
        for key in path[:-1]:
            parent = parent[key]
        parent[path[-1]] = copy.deepcopy(wrong)
        try:
            resolve_config(load_config([("t", mutated)]))
        except ConfigError as exc:
            assert exc.issues, path


@pytest.mark.timeout(30)
def test_a_config_problem_names_the_json_kind_it_found_not_a_python_type(tmp_path: Path) -> None:
    """A config file holding `null` or an array was refused "must contain a JSON object, not
    NoneType" / "not list"; a socket without a materia "references unknown materia None"; an
    `activeLoadout` of 3 "is not set"; a file that is not UTF-8 showed Python's codec message.
    Each now says what the file holds in JSON's words."""
    assert "not null" in config_loader.validate_file(write(tmp_path / "n.json", "null"))[0].message
    assert "not an array" in config_loader.validate_file(write(tmp_path / "a.json", "[1]"))[0].message
    latin = tmp_path / "l.json"
    latin.write_bytes(b'{"activeLoadout": "Caf\xe9"}')
    (issue,) = config_loader.validate_file(latin)
    assert issue.code == "read-error" and "not UTF-8 text (byte 22)" in issue.message and "codec" not in issue.message
    missing = config({"Socket-1": {"type": "agent"}})
    with pytest.raises(ConfigError) as err:
        resolve_config(load_config([("t", missing)]))
    assert [(i.code, i.path) for i in err.value.issues] == [("unknown-materia", "/loadouts/L/sockets/Socket-1/materia")]
    assert "None" not in err.value.issues[0].message and "needs a materia" in err.value.issues[0].message
    numbered = config({"Socket-1": {"type": "agent", "materia": 5}})
    with pytest.raises(ConfigError) as err:
        resolve_config(load_config([("t", numbered)]))
    assert "a number" in err.value.issues[0].message
    with pytest.raises(ConfigError) as err:
        resolve_config(load_config([("t", {**config({"Socket-1": {"type": "agent", "materia": "A"}}),
                                            "activeLoadout": 3})]))
    (issue,) = err.value.issues
    assert issue.code == "unknown-loadout" and "not set" not in issue.message and "a number" in issue.message


@pytest.mark.timeout(30)
def test_a_bad_config_value_is_shown_as_json_not_as_python() -> None:
    """A materia without `tools` was refused "invalid tools None", a socket without `type`
    "unsupported type None", an edge `when: true` "unsupported condition True" and a parse mode
    "'yaml'": Python spellings of values the user wrote in JSON. Each value is now shown as JSON
    (`null`, `true`, `"yaml"`), and a field that is absent is said to be missing."""
    def messages(issues: list[ConfigIssue]) -> str:
        return "\n".join(i.message for i in issues)

    no_tools = messages(checks.check_materia_entry("m", {"prompt": "p"}))
    assert "None" not in no_tools and "tools is missing" in no_tools
    assert 'invalid tools null' in messages(checks.check_materia_entry("m", {"prompt": "p", "tools": None}))
    assert 'invalid tools "all"' in messages(checks.check_materia_entry("m", {"prompt": "p", "tools": "all"}))
    assert 'unsupported type true' in messages(checks.check_materia_entry("m", {"type": True}))
    assert 'unsupported parse mode "yaml"' in messages(
        checks.check_materia_entry("m", {"prompt": "p", "tools": "none", "parse": "yaml"}))
    untyped = config({"Socket-1": {"materia": "Build"}, "Socket-2": {"type": "agent", "materia": "Build",
                                                                    "parse": False}})
    with pytest.raises(ConfigError) as err:
        resolve_config(load_config([("t", untyped)]))
    text = messages(err.value.issues)
    assert "None" not in text and "False" not in text
    assert "type is missing" in text and "unsupported parse mode false" in text
    edges = config({"Socket-1": {"type": "utility", "utility": "echo", "edges": [{"when": True, "to": "end"}]}})
    with pytest.raises(ConfigError) as err:
        resolve_config(load_config([("t", edges)]))
    assert "unsupported condition true" in messages(err.value.issues)
    ghost = config({"Socket-1": {"type": "agent", "materia": "gh\u00f6st"}})
    with pytest.raises(ConfigError) as err:
        resolve_config(load_config([("t", ghost)]))
    assert 'references unknown materia "gh\u00f6st"' in messages(err.value.issues)


@pytest.mark.timeout(30)
def test_a_config_error_names_the_layer_file_that_wrote_the_bad_field(tmp_path: Path) -> None:
    """A bad materia field or socket in the profile's materia.json was reported as
    "castor:bundled-default < <profile> < <project>#/materia/M/prompt": every layer, not the
    one to edit (warnings were already narrowed). An error names the file that set the field;
    a loadout the project overrides names the layer whose `sockets` it runs."""
    profile = write(tmp_path / "profile" / "materia.json", {
        "materia": {"M": {"prompt": 3, "tools": "none"}},
        "loadouts": {"U": {"sockets": {"Socket-1": {"type": "agent", "materia": "Nope"}}}}})
    project = write(tmp_path / "proj" / ".pi" / "pi-materia.json", {
        "activeLoadout": "U", "materia": {"M": {"model": "a/b"}}, "loadouts": {"U": {"entry": "Socket-1"}}})
    env = {"PI_MATERIA_PROFILE_DIR": str(profile.parent)}
    with pytest.raises(ConfigError) as err:
        config_loader.load(tmp_path / "proj", env=env)
    assert [(i.path, i.source) for i in err.value.issues] == [("/materia/M/prompt", str(profile))]
    fixed = write(profile, {**json.loads(profile.read_text()), "materia": {"M": {"prompt": "p", "tools": "none"}}})
    with pytest.raises(ConfigError) as err:
        resolve_config(config_loader.load(tmp_path / "proj", env=env))
    assert [(i.path, i.source) for i in err.value.issues] == [
        ("/loadouts/U/sockets/Socket-1/materia", str(fixed))]
    assert str(project) not in str(err.value)


@pytest.mark.timeout(30)
def test_an_unknown_loadout_to_save_names_the_file_it_would_be_saved_to(tmp_path: Path) -> None:
    """`castor loadout Nope` said "<config>#/activeLoadout: Unknown Materia loadout" -- no file;
    it names the config file whose activeLoadout it would set (the explicit one when given)."""
    env = {"PI_MATERIA_PROFILE_DIR": str(tmp_path / "profile")}
    with pytest.raises(ConfigError) as err:
        config_loader.save_active_loadout(tmp_path, "Nöpe", env=env)
    (issue,) = err.value.issues
    assert issue.source == str(tmp_path / ".pi" / "pi-materia.json") and issue.path == "/activeLoadout"
    assert "<config>" not in str(issue)
    explicit = write(tmp_path / "mine.json", {"activeLoadout": "hello"})
    with pytest.raises(ConfigError) as err:
        config_loader.save_active_loadout(tmp_path, "Nöpe", env=env, config_path=explicit)
    assert err.value.issues[0].source == str(explicit)


@pytest.mark.timeout(10)
def test_compaction_tier_problems_are_named_in_plain_words() -> None:
    """Each tier problem says what is wrong as pi-materia's checks do (a percent between 0 and 100,
    a non-negative integer window, tiers without gaps or overlaps, an open-ended final tier)."""
    def message(compaction: dict[str, object]) -> str:
        issues = checks.check_compaction(compaction)
        assert codes(issues) == ["invalid-compaction"]
        return issues[0].message

    assert "between 0 and 100" in message({"proactiveThresholdPercent": 101})
    assert "between 0 and 100" in message({"proactiveThresholdTiers": [{"thresholdPercent": -1}]})
    assert "non-negative integer" in message({"proactiveThresholdTiers": [{"minContextWindow": -1,
                                                                           "thresholdPercent": 80}]})
    overlap = message({"proactiveThresholdTiers": [{"maxContextWindow": 10, "thresholdPercent": 80},
                                                   {"minContextWindow": 9, "thresholdPercent": 70}]})
    assert "without gaps or overlaps" in overlap and "leaves an overlap" in overlap
    gap = message({"proactiveThresholdTiers": [{"maxContextWindow": 10, "thresholdPercent": 80},
                                               {"minContextWindow": 11, "thresholdPercent": 70}]})
    assert "without gaps or overlaps" in gap and "leaves a gap" in gap
    assert "final tier must be open-ended" in message(
        {"proactiveThresholdTiers": [{"maxContextWindow": 10, "thresholdPercent": 80},
                                     {"minContextWindow": 10, "maxContextWindow": 20, "thresholdPercent": 70}]})
