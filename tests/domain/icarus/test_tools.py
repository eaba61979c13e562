"""Fabric tool schemas, registration, validation and result translation."""

from __future__ import annotations

import json

import pytest

from castor.domain.icarus.settings import IcarusSettings
from castor.domain.icarus.tools import (
    ADMIN_TOOLS,
    NORMAL_TOOLS,
    TOOLS_BY_NAME,
    ToolValidationError,
    config_tool_result,
    error_result,
    normalise_verified,
    prepare_call,
    registered_tools,
    tool_result,
)


def settings(**kw):
    return IcarusSettings(**{"icarus_dir": "/i", "fabric_dir": "/f", **kw})


WRITE = {"type": "note", "summary": "s", "content": "c"}


def names(tools):
    return {t.name for t in tools}


def test_registration_rules():
    assert registered_tools(settings(tools=False, admin_tools=True)) == []
    default = names(registered_tools(settings()))
    assert default == names(NORMAL_TOOLS) | {"icarus_hook_config"}
    assert "fabric_train" not in default
    with_admin = names(registered_tools(settings(admin_tools=True)))
    assert "fabric_train" in with_admin and names(ADMIN_TOOLS) <= with_admin


def test_schemas_shape():
    for tool in (*NORMAL_TOOLS, *ADMIN_TOOLS):
        assert tool.parameters["type"] == "object" and tool.parameters["additionalProperties"] is True
    assert "limit" not in TOOLS_BY_NAME["fabric_search"].parameters["properties"]
    assert TOOLS_BY_NAME["icarus_hook_config"].parameters["additionalProperties"] is False
    write = TOOLS_BY_NAME["fabric_write"]
    assert "verified" in write.description and "evidence" in write.description
    assert "verified" in write.prompt_snippet and "evidence" in write.prompt_snippet
    assert write.parameters["required"] == ["type", "summary", "content"]


@pytest.mark.parametrize(("raw", "expected"), [
    (True, "true"), ("True", "true"), (" yes ", "true"), ("y", "true"), (1, "true"), ("on", "true"),
    (False, "false"), ("false", "false"), ("", "false"), ("n", "false"), (0, "false"), ("OFF", "false"),
])
def test_verified_normalisation(raw, expected):
    assert normalise_verified(raw) == expected


def test_fabric_write_forwarded_params():
    s = settings()
    assert prepare_call("fabric_write", {**WRITE, "verified": True, "evidence": "ran tests"}, s)["verified"] == "true"
    assert prepare_call("fabric_write", {**WRITE, "verified": "false"}, s)["verified"] == "false"
    assert "verified" not in prepare_call("fabric_write", dict(WRITE), s)
    assert "verified" not in prepare_call("fabric_write", {**WRITE, "verified": None}, s)
    extra = prepare_call("fabric_write", {**WRITE, "custom_field": 3, "tags": "a,b"}, s)
    assert extra == {**WRITE, "custom_field": 3, "tags": "a,b"}  # no renaming, extras forwarded


@pytest.mark.parametrize(("params", "message"), [
    ({**WRITE, "verified": True}, "requires evidence"),
    ({**WRITE, "verified": "true", "evidence": "   "}, "requires evidence"),
    ({**WRITE, "verified": "maybe"}, "verified must be"),
    ({**WRITE, "verified": [1]}, "verified must be"),
    ({"type": "note", "summary": "s"}, "requires content"),
])
def test_fabric_write_validation_errors(params, message):
    with pytest.raises(ToolValidationError) as info:
        prepare_call("fabric_write", params, settings())
    assert message in info.value.message
    result = error_result(info.value)
    assert result.is_error and message in result.details["error"]


def test_generic_schema_checks_and_availability():
    s = settings()
    assert prepare_call("fabric_recall", {"query": "q", "max_results": 5}, s) == {"query": "q", "max_results": 5}
    # 5.0 is an integer to JSON Schema (and the number JavaScript sends): forwarded as 5
    assert type(prepare_call("fabric_recall", {"query": "q", "max_results": 5.0}, s)["max_results"]) is int
    for params in ({"query": "q", "max_results": 0}, {"query": "q", "max_results": "5"}, {"query": 3}, {},
                   {"query": "q", "max_results": 5.5}):
        with pytest.raises(ToolValidationError):
            prepare_call("fabric_recall", params, s)
    with pytest.raises(ToolValidationError):
        prepare_call("fabric_curate", {"entry_id": "1", "training_value": "great"}, s)
    with pytest.raises(ToolValidationError):
        prepare_call("fabric_train", {}, s)  # admin tool not configured
    assert prepare_call("fabric_train", {"epochs": 2}, settings(admin_tools=True)) == {"epochs": 2}
    with pytest.raises(ToolValidationError):
        prepare_call("fabric_brief", [1], s)
    with pytest.raises(ToolValidationError):
        prepare_call("no_such_tool", {}, s)
    assert prepare_call("fabric_brief", None, s) == {}


def test_result_translation():
    error = tool_result({"error": "No query provided"})
    assert error.is_error and error.details == {"error": "No query provided"}
    assert "No query provided" in error.content[0]["text"]
    ok = tool_result({"query": "q", "count": 0, "results": []})
    assert not ok.is_error and ok.details == {"query": "q", "count": 0, "results": []}
    assert json.loads(ok.content[0]["text"]) == ok.details
    assert not tool_result(["error"]).is_error and not tool_result(None).is_error
    assert ok.model_dump(by_alias=True)["isError"] is False


def test_config_tool_is_local_and_read_only():
    schema = config_tool_result({"schemaOnly": True}, settings())
    assert schema.details["key"] == "piIcarusHook" and not schema.is_error
    inspection = config_tool_result({}, settings())
    assert inspection.details["package"] == "pi-icarus-hook"
    assert config_tool_result({"bogus": 1}, settings()).is_error
    assert config_tool_result({"schemaOnly": "yes"}, settings()).is_error


@pytest.mark.timeout(30)
def test_params_of_plain_strings_taken_without_the_general_loop_are_what_it_takes():
    """``_check_schema`` takes params that are all plain-string parameters (the required ones
    among them) without its general loop: over every tool and params that are and are not such,
    its outcome is the general loop's (the same error, or none, and the same params after)."""
    from castor.domain.icarus import tools as t

    def general(spec, params):
        saved = t._PLAIN_STRINGS.pop(spec.name)
        try:
            t._check_schema(spec, params)
            return "ok", params
        except t.ToolValidationError as exc:
            return exc.message, exc.data
        finally:
            t._PLAIN_STRINGS[spec.name] = saved

    def fast(spec, params):
        try:
            t._check_schema(spec, params)
            return "ok", params
        except t.ToolValidationError as exc:
            return exc.message, exc.data

    taken = 0
    for spec in t.TOOLS_BY_NAME.values():
        names = list(spec.parameters["properties"])
        samples: list[dict] = [{}, {"nope": "x"}, {name: "x" for name in names}, {name: None for name in names},
                               {name: 5 for name in names}, {name: 5.0 for name in names}]
        samples += [{name: "x"} for name in names] + [{name: True} for name in names]
        samples += [{**{name: "x" for name in names}, "extra": "x"}]
        for params in samples:
            assert fast(spec, dict(params)) == general(spec, dict(params)), (spec.name, params)
            if set(t._PLAIN_STRINGS[spec.name][1]) <= params.keys() and all(
                    type(v) is str and k in t._PLAIN_STRINGS[spec.name][0] for k, v in params.items()):
                taken += 1
    assert taken > 10  # the fast path was taken, not only the general one
