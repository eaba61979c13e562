"""Pure settings resolution (castor.domain.icarus.settings)."""

from __future__ import annotations

import pytest

from castor.domain.icarus.settings import (
    SettingsDocumentError,
    SettingsLayer,
    Source,
    apply_bool_default,
    config_inspection,
    config_schema,
    inspect_bool,
    parse_bool,
    parse_positive_int,
    plan_default_write,
    resolve_settings,
    settings_paths,
)

CWD = "/work/proj"
HOME = "/home/u"
PROJECT_PATH = "/work/proj/.pi/settings.json"
GLOBAL_PATH = "/home/u/.pi/agent/settings.json"


def layers(project=None, global_=None):
    return (SettingsLayer(scope="project", path=PROJECT_PATH, doc=project),
            SettingsLayer(scope="global", path=GLOBAL_PATH, doc=global_))


def resolve(project=None, global_=None, *, trusted=True, env=None, exists=lambda p: False):
    p, g = layers(project, global_)
    return resolve_settings(project=p, global_=g, trusted=trusted, env=env or {}, cwd=CWD, home=HOME, exists=exists)


def test_defaults():
    s = resolve()
    assert (s.platform, s.hooks, s.tools, s.admin_tools, s.timeout_ms) == ("pi", True, True, False, 30000)
    assert (s.classifier, s.classifier_timeout_ms, s.context_display) == ("default", 5000, True)
    assert s.footer_status == "\U0001fabd Icarus"
    assert s.icarus_dir == "/home/u/.hermes/plugins/icarus" and s.hermes_home is None
    assert s.python == "python3" and s.fabric_dir == "/home/u/fabric"
    assert s.agent == "pi-agent" and s.project_id == "proj" and s.state_db_path is None
    assert s.warnings == ()


def test_section_aliases_in_order_and_first_object_wins():
    s = resolve(global_={"pi-icarus-hook": {"timeoutMs": 10}, "icarusHook": {"timeoutMs": 20}})
    assert s.timeout_ms == 10
    s = resolve(global_={"piIcarusHook": "not an object", "icarusHook": {"timeoutMs": 20}})
    assert s.timeout_ms == 20


def test_project_before_global_per_key():
    s = resolve(project={"piIcarusHook": {"tools": False}}, global_={"piIcarusHook": {"tools": True, "hooks": False}})
    assert s.tools is False and s.hooks is False
    assert s.sources["tools"] == Source.PROJECT and s.sources["hooks"] == Source.GLOBAL


def test_untrusted_project_is_ignored_including_python_and_icarus_dir():
    project = {"piIcarusHook": {"hooks": False, "python": "/evil/python", "icarusDir": "/evil/icarus"}}
    s = resolve(project=project, trusted=False)
    assert s.hooks is True and s.python == "python3"
    assert s.icarus_dir == "/home/u/.hermes/plugins/icarus"
    assert s.sources["python"] == Source.BUILTIN
    trusted = resolve(project=project, trusted=True)
    assert trusted.python == "/evil/python" and trusted.icarus_dir == "/evil/icarus"


def test_key_aliases_and_canonical_wins_within_a_file():
    s = resolve(global_={"piIcarusHook": {"bindHooks": False, "registerTools": False, "registerAdminTools": True,
                                          "callTimeoutMs": 99, "statusLabel": "M"}})
    assert (s.hooks, s.tools, s.admin_tools, s.timeout_ms, s.footer_status) == (False, False, True, 99, "M")
    assert not s.admin_tools_enabled  # admin tools need tools
    assert resolve(global_={"piIcarusHook": {"contextDisplay": True, "hiddenDisplay": False}}).context_display is True
    # hiddenDisplay keeps the same meaning (not inverted)
    assert resolve(global_={"piIcarusHook": {"hiddenDisplay": False}}).context_display is False


@pytest.mark.parametrize(("raw", "expected"), [
    (True, True), (False, False), (0, False), (2, True), (0.0, False), ("false", False), (" OFF ", False),
    ("no", False), ("0", False), ("disabled", False), ("maybe", True), ("", True), (None, None), ({}, None),
])
def test_bool_words(raw, expected):
    assert parse_bool(raw) is expected


@pytest.mark.parametrize(("raw", "expected"), [
    (1234, 1234), (12.9, 12), ("1234", 1234), ("1234ms", 1234), (" 7", 7), (-5, None), (0, None),
    ("abc", None), (True, None), (float("inf"), None), (None, None),
])
def test_positive_int(raw, expected):
    assert parse_positive_int(raw) == expected


@pytest.mark.parametrize("value", ["None", "NONE", " none ", "off", "gpt-4o", "/model", "provider/"])
def test_a_classifier_value_that_is_not_default_or_a_model_turns_filtering_off(value):
    """"None", "off" or "gpt-4o" became the built-in "default": the user's prompt went to whatever
    model the harness had, a remote one included. Keywords are any case; anything else is invalid,
    which behaves like "none" (no model asked, the text as it is) and is reported."""
    from castor.domain.icarus.classify import parse_choice

    s = resolve(global_={"piIcarusHook": {"classifier": value}})
    assert parse_choice(s.classifier).kind in ("none", "invalid"), s.classifier
    assert resolve(global_={"piIcarusHook": {"classifier": "DEFAULT"}}).classifier == "default"


def test_invalid_values_give_defaults_and_warnings_never_raise():
    s = resolve(project={"piIcarusHook": {"timeoutMs": -5, "hooks": None, "classifier": "nonsense"}},
                global_={"piIcarusHook": {"timeoutMs": 100, "hooks": False}})
    assert s.timeout_ms == 30000 and s.hooks is True  # quirk Q5: built-in default
    assert s.classifier == "nonsense"  # kept: the classifier reads it as invalid, which behaves like "none"
    assert len(s.warnings) == 3
    assert resolve(global_={"piIcarusHook": {"classifier": "ollama/qwen3:4b"}}).classifier == "ollama/qwen3:4b"


def test_blank_strings_fall_through_to_the_next_file():
    s = resolve(project={"piIcarusHook": {"footerStatus": "  ", "platform": 5}},
                global_={"piIcarusHook": {"footerStatus": "G"}})
    assert s.footer_status == "G" and s.platform == "pi"


def test_unusable_layer_becomes_a_warning():
    p = SettingsLayer(scope="project", path=PROJECT_PATH, error="not valid JSON")
    g = SettingsLayer(scope="global", path=GLOBAL_PATH, doc={"piIcarusHook": {"footerStatus": "G"}})
    s = resolve_settings(project=p, global_=g, trusted=True, env={}, cwd=CWD, home=HOME)
    assert s.footer_status == "G" and any("not valid JSON" in w for w in s.warnings)


def test_paths_resolve_against_their_settings_file_and_expand_home():
    s = resolve(project={"piIcarusHook": {"icarusDir": "./icarus", "fabricDir": "~/fab"}},
                global_={"piIcarusHook": {"hermesHome": "../hh"}})
    assert s.icarus_dir == "/work/proj/.pi/icarus"
    assert s.fabric_dir == "/home/u/fab"
    assert s.hermes_home == "/home/u/.pi/hh"
    assert resolve(global_={"piIcarusHook": {"fabricDir": "~"}}).fabric_dir == "/home/u/.pi/agent/~"


def test_env_overrides_backend_settings_only():
    env = {"ICARUS_DIR": "rel/icarus", "ICARUS_PYTHON": "/usr/bin/python3.12", "FABRIC_AGENT": "fa",
           "HERMES_STATE_DB": "state.db", "PI_ICARUS_HOOK_TOOLS": "1"}
    s = resolve(project={"piIcarusHook": {"icarusDir": "./icarus", "tools": False, "agent": "set"}}, env=env)
    assert s.icarus_dir == "/work/proj/rel/icarus" and s.sources["icarusDir"] == Source.ENV
    assert s.python == "/usr/bin/python3.12" and s.agent == "fa" and s.state_db_path == "state.db"
    assert s.tools is False  # PI_ICARUS_HOOK_* is ignored
    both = resolve(env={"HERMES_AGENT_NAME": "first", "FABRIC_AGENT": "second"})
    assert both.agent == "first"


def test_setting_aliases_for_backend_keys_and_fabric_dir_locations():
    s = resolve(global_={"piIcarusHook": {"icarus_python": "py", "hermesAgentName": "ag", "project_id": "pid",
                                          "state_db_path": "/db"}, "fabric": {"dir": "/fab"}})
    assert (s.python, s.agent, s.project_id, s.state_db_path, s.fabric_dir) == ("py", "ag", "pid", "/db", "/fab")
    assert resolve(global_={"pi-fabric": {"fabricDir": "/pf"}}).fabric_dir == "/pf"


def test_hermes_home_fallback_only_when_it_exists_and_agent_suffix():
    assert resolve(exists=lambda p: p == "/home/u/.hermes").hermes_home == "/home/u/.hermes"
    s = resolve(env={"HERMES_HOME": "/x/.hermes-kev"})
    assert s.agent == "kev" and s.icarus_dir == "/x/.hermes-kev/plugins/icarus"


def test_settings_paths_honour_pi_coding_agent_dir():
    assert settings_paths(CWD, {}, HOME) == (PROJECT_PATH, GLOBAL_PATH)
    assert settings_paths(CWD, {"PI_CODING_AGENT_DIR": "agent"}, HOME)[1] == "/work/proj/agent/settings.json"
    assert settings_paths(CWD, {"PI_CODING_AGENT_DIR": "~/a"}, HOME)[1] == "/home/u/a/settings.json"


def test_inspect_bool_uses_aliases_and_scopes():
    p, g = layers({"piIcarusHook": {"hiddenDisplay": False}}, {"piIcarusHook": {"contextDisplay": True}})
    found = inspect_bool("contextDisplay", project=p, global_=g, trusted=True)
    assert (found.value, found.source, found.package_key, found.path) == (False, Source.PROJECT, "piIcarusHook",
                                                                           PROJECT_PATH)
    assert inspect_bool("contextDisplay", project=p, global_=g, trusted=False).source == Source.GLOBAL
    none = inspect_bool("contextDisplay", *(), project=layers()[0], global_=layers()[1], trusted=True)
    assert (none.value, none.source) == (True, Source.BUILTIN)


def test_plan_default_write_scope_rules():
    p, g = layers({"piIcarusHook": {"contextDisplay": False}}, {})
    assert plan_default_write("contextDisplay", scope=None, trusted=True, project=p, global_=g).scope == "project"
    assert plan_default_write("contextDisplay", scope=None, trusted=False, project=p, global_=g).scope == "global"
    refused = plan_default_write("contextDisplay", scope="project", trusted=False, project=p, global_=g)
    assert isinstance(refused, str)
    warned = plan_default_write("contextDisplay", scope="global", trusted=True, project=p, global_=g)
    assert warned.path == GLOBAL_PATH and "override" in warned.warnings[0]
    p2, g2 = layers({}, {"icarusHook": {"hiddenDisplay": True}})
    assert plan_default_write("contextDisplay", scope=None, trusted=True, project=p2, global_=g2).scope == "global"


def test_apply_bool_default_preserves_keys_aliases_and_sections():
    doc = {"icarusHook": {"hiddenDisplay": False, "other": 1}, "unrelated": "preserved"}
    new, value = apply_bool_default(doc, "contextDisplay", "toggle")
    assert value is True  # the scope's own false, flipped
    assert new == {"icarusHook": {"hiddenDisplay": False, "other": 1, "contextDisplay": True}, "unrelated": "preserved"}
    assert doc["icarusHook"] == {"hiddenDisplay": False, "other": 1}  # input untouched
    new, value = apply_bool_default({}, "contextDisplay", "toggle")
    assert value is False and new == {"piIcarusHook": {"contextDisplay": False}}  # built-in true, flipped
    assert apply_bool_default({}, "contextDisplay", "show")[1] is True
    with pytest.raises(SettingsDocumentError):
        apply_bool_default([], "contextDisplay", "hide")
    with pytest.raises(SettingsDocumentError):
        apply_bool_default({"piIcarusHook": "x"}, "contextDisplay", "hide")


def test_schema_and_inspection_are_plain_data():
    schema = config_schema()
    assert schema["key"] == "piIcarusHook" and schema["aliases"] == ["pi-icarus-hook", "icarusHook"]
    assert "icarusDir" not in schema["settings"] and "python" not in schema["settings"]
    assert set(schema["runtimeEnv"]) == {"ICARUS_DIR", "ICARUS_PYTHON", "HERMES_HOME", "FABRIC_DIR",
                                         "HERMES_AGENT_NAME", "FABRIC_PROJECT_ID", "STATE_DB_PATH"}
    inspection = config_inspection(resolve())
    assert inspection["package"] == "pi-icarus-hook"
    assert inspection["effective"]["stateDbPath"] is None
    assert set(inspection["settingsSnippet"]["piIcarusHook"]) == {
        "platform", "hooks", "tools", "adminTools", "timeoutMs", "contextDisplay", "footerStatus", "classifier",
        "classifierTimeoutMs"}
