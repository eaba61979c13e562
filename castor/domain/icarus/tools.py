"""Fabric tools: schemas, registration, validation, result translation.

Pure rules; the actor forwards a prepared call to the worker as
``{module: "tools", function: <name>, args: [params]}``.

Guarantees
----------
- Tool names and parameter schemas are fixed tables (:data:`NORMAL_TOOLS`,
  :data:`ADMIN_TOOLS`, :data:`CONFIG_TOOL`). ``fabric_search`` has no ``limit``.
- :func:`registered_tools`: nothing when ``tools`` is false; normal tools plus
  ``icarus_hook_config`` when true; admin tools only when ``adminTools`` is
  also true.
- :func:`prepare_call` validates *before* any bridge call. ``fabric_write``'s
  ``verified`` is normalised to the backend's ``"true"``/``"false"`` string
  (absent or null -> key absent) and ``verified="true"`` needs non-blank
  ``evidence``. Other parameters are checked against the schema (required,
  basic types, enums, bounds) and forwarded unchanged. A failure raises
  :class:`ToolValidationError`; :func:`error_result` turns it into the
  ``{error}`` envelope with ``is_error``.
- :func:`tool_result`: the value as pretty JSON text plus ``details``; a dict
  with an ``error`` key is ``is_error``. Transport failures are *not*
  translated here: they are raised to the caller and never retried.
- ``icarus_hook_config`` is read-only and local (:func:`config_tool_result`).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from castor.domain.icarus.settings import IcarusSettings, config_inspection, config_schema
from castor.messages.errors import InvalidParams

_TRUE_WORDS = frozenset({"true", "yes", "y", "1", "on"})
_FALSE_WORDS = frozenset({"false", "no", "n", "0", "off", ""})


class ToolValidationError(InvalidParams):
    """Tool parameters rejected before any bridge call."""


class ToolSpec(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    description: str
    parameters: dict[str, Any]
    admin: bool = False
    prompt_snippet: str | None = None


class ToolResult(BaseModel):
    """What a tool call returns to the harness (Pi's tool result shape)."""

    content: list[dict[str, str]]
    details: Any = None
    is_error: bool = Field(default=False, serialization_alias="isError")

    def to_wire(self) -> dict[str, Any]:
        """``icarus.tool``'s ``format: "result"`` answer: ``{content, details, is_error}``, and Pi's
        own ``isError: true`` beside it on an error only (absent otherwise, as Pi's tool results
        and pi-icarus-hook have it)."""
        out = self.model_dump(mode="json")
        if self.is_error:
            out["isError"] = True
        return out


def _s(description: str, **extra: Any) -> dict[str, Any]:
    return {"type": "string", "description": description, **extra}


def _int(description: str, minimum: int | None = None, maximum: int | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer", "description": description}
    if minimum is not None:
        schema["minimum"] = minimum
    if maximum is not None:
        schema["maximum"] = maximum
    return schema


def _params(properties: dict[str, Any], required: tuple[str, ...] = (), *, extra: bool = True) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(required),
            "additionalProperties": extra}


_WRITE_DESCRIPTION = (
    "Persist a Fabric entry (note, decision, result, review...). Mark a result verified only when you "
    "actually verified it: then set verified=\"true\" together with evidence (how it was verified) and "
    "source_tool (the tool that produced the result). Never mark unverified work as verified."
)

NORMAL_TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        name="fabric_write", description=_WRITE_DESCRIPTION,
        prompt_snippet=("fabric_write: only set verified=\"true\" with evidence and source_tool "
                        "when you verified the result."),
        parameters=_params({
            "type": _s("Entry type, e.g. note, decision, result, review."),
            "summary": _s("One-line summary."),
            "content": _s("Full entry text."),
            "tags": _s("Comma-separated tags."),
            "status": _s("Entry status."),
            "outcome": _s("Outcome of the work."),
            "review_of": _s("Entry reviewed by this one."),
            "revises": _s("Entry revised by this one."),
            "customer_id": _s("Customer identifier."),
            "assigned_to": _s("Agent or person assigned."),
            "training_value": _s("Training value: high, normal or low."),
            "artifact_paths": _s("Comma-separated artifact paths."),
            "verified": _s("Only when you verified the result yourself: \"true\"; requires evidence.",
                           enum=["true", "false"]),
            "evidence": _s("How the result was verified."),
            "source_tool": _s("The tool that produced the result."),
        }, ("type", "summary", "content")),
    ),
    ToolSpec(name="fabric_recall", description="Ranked Fabric retrieval for a query.",
             parameters=_params({"query": _s("What to recall."),
                                 "max_results": _int("Number of results.", 1, 100),
                                 "agent": _s("Only entries of this agent."),
                                 "project": _s("Only entries of this project.")}, ("query",))),
    ToolSpec(name="fabric_search", description="Literal search over Fabric entries.",
             parameters=_params({"query": _s("Literal text to search for.")}, ("query",))),
    ToolSpec(name="fabric_pending", description="Pending tasks, reviews and tickets, optionally for one customer.",
             parameters=_params({"customer_id": _s("Customer identifier.")})),
    ToolSpec(name="fabric_curate", description="Change an entry's training value.",
             parameters=_params({"entry_id": _s("Entry identifier."),
                                 "training_value": _s("New training value.", enum=["high", "normal", "low"])},
                                ("entry_id", "training_value"))),
    ToolSpec(name="fabric_brief", description="Operational brief for this agent and project.",
             parameters=_params({})),
    ToolSpec(name="fabric_init_obsidian", description="Initialise Fabric daily/Obsidian support.",
             parameters=_params({})),
)

ADMIN_TOOLS: tuple[ToolSpec, ...] = tuple(
    ToolSpec(name=name, description=description, parameters=parameters, admin=True)
    for name, description, parameters in (
        ("fabric_report", "Corpus health report.", _params({})),
        ("fabric_telemetry", "Recent telemetry.", _params({"last_n": _int("How many records.", 1, 1000)})),
        ("fabric_export", "Export training data.", _params({"mode": _s("Export mode.")})),
        ("fabric_train", "Start a training job.", _params({
            "model": _s("Base model."), "suffix": _s("Model suffix."), "mode": _s("Training mode."),
            "epochs": _int("Epochs.", 1), "batch_size": _int("Batch size.", 1),
            "n_checkpoints": _int("Checkpoints.", 1), "min_pairs": _int("Minimum pairs.", 1),
            "learning_rate": {"type": "number", "description": "Learning rate."}})),
        ("fabric_train_status", "Status of a training job.", _params({"job_id": _s("Job identifier.")})),
        ("fabric_models", "Available trained models.", _params({})),
        ("fabric_eval", "Evaluate a candidate model.", _params({
            "candidate_model": _s("Model to evaluate."), "base_model": _s("Baseline model."),
            "sample_count": _int("Samples.", 1)}, ("candidate_model",))),
        ("fabric_switch_model", "Switch the active model.", _params({
            "model_id": _s("Model to activate."),
            "min_eval_score": {"type": "number", "description": "Refuse below this evaluation score."}},
            ("model_id",))),
        ("fabric_rollback_model", "Roll back to the previous model.", _params({})),
    )
)

CONFIG_TOOL = ToolSpec(
    name="icarus_hook_config",
    description="Inspect the Icarus bridge configuration (read-only) or its supported settings schema.",
    parameters=_params({"schemaOnly": {"type": "boolean", "description": "Return only the settings schema."}},
                       extra=False),
)

TOOLS_BY_NAME: dict[str, ToolSpec] = {t.name: t for t in (*NORMAL_TOOLS, *ADMIN_TOOLS, CONFIG_TOOL)}


def registered_tools(settings: IcarusSettings) -> list[ToolSpec]:
    if not settings.tools:
        return []
    tools = [*NORMAL_TOOLS, CONFIG_TOOL]
    if settings.admin_tools:
        tools.extend(ADMIN_TOOLS)
    return tools


# The names :func:`prepare_call` forwards, by (settings.tools, settings.admin_tools): the registered
# tools but the config tool (answered without the worker). Built once, not per tool call.
_FORWARDED_NAMES: dict[tuple[bool, bool], frozenset[str]] = {
    (tools, admin): frozenset(t.name for t in ([*NORMAL_TOOLS, *(ADMIN_TOOLS if admin else ())] if tools else ()))
    for tools in (False, True) for admin in (False, True)
}


# --------------------------------------------------------------------------- validation

def normalise_verified(value: Any) -> str:
    """bool/number/word -> ``"true"``/``"false"``; anything else is an error."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return "true" if value != 0 else "false"
    if isinstance(value, str):
        word = value.strip().lower()
        if word in _TRUE_WORDS:
            return "true"
        if word in _FALSE_WORDS:
            return "false"
    raise ToolValidationError("verified must be true or false (boolean, 1/0, yes/no, on/off)",
                              data={"reason": "invalid_verified"})


def _validate_fabric_write(params: dict[str, Any]) -> dict[str, Any]:
    params = dict(params)
    if params.get("verified") is None:
        params.pop("verified", None)
        return params
    params["verified"] = normalise_verified(params["verified"])
    if params["verified"] == "true":
        evidence = params.get("evidence")
        if not isinstance(evidence, str) or not evidence.strip():
            raise ToolValidationError("verified=true requires evidence describing how it was verified",
                                      data={"reason": "missing_evidence"})
    return params


_TYPES: dict[str, tuple[type, ...]] = {"string": (str,), "integer": (int,), "number": (int, float),
                                       "boolean": (bool,)}


def _check_value(name: str, value: Any, schema: dict[str, Any]) -> None:
    kind = schema.get("type")
    allowed = _TYPES.get(kind, (object,)) if isinstance(kind, str) else (object,)
    if (kind in ("integer", "number") and isinstance(value, bool)) or not isinstance(value, allowed):
        raise ToolValidationError(f"{name} must be of type {kind}", data={"reason": "invalid_type", "param": name})
    if "enum" in schema and value not in schema["enum"]:
        raise ToolValidationError(f"{name} must be one of {schema['enum']}", data={"reason": "invalid_enum",
                                                                                   "param": name})
    if "minimum" in schema and value < schema["minimum"]:
        raise ToolValidationError(f"{name} must be >= {schema['minimum']}", data={"reason": "out_of_range",
                                                                                 "param": name})
    if "maximum" in schema and value > schema["maximum"]:
        raise ToolValidationError(f"{name} must be <= {schema['maximum']}", data={"reason": "out_of_range",
                                                                                 "param": name})


#: Per tool, its parameters whose schema is a plain string (no enum, no bound) and its required
#: ones: params that are all such strings, the required ones among them, pass _check_schema's
#: general loop unchanged, so they are taken without it (a tool call's commonest params).
_PLAIN_STRINGS: dict[str, tuple[frozenset[str], tuple[str, ...]]] = {
    spec.name: (frozenset(name for name, schema in spec.parameters["properties"].items()
                          if schema.get("type") == "string" and not {"enum", "minimum", "maximum"} & schema.keys()),
                tuple(spec.parameters["required"]))
    for spec in TOOLS_BY_NAME.values()
}


def _check_schema(spec: ToolSpec, params: dict[str, Any]) -> None:
    plain = _PLAIN_STRINGS.get(spec.name)
    if plain is not None:
        strings, required = plain
        for name, value in params.items():
            if type(value) is not str or name not in strings:
                break
        else:
            for name in required:
                if name not in params:
                    break
            else:
                return
    properties = spec.parameters["properties"]
    for name in spec.parameters["required"]:
        if name not in params or params[name] is None:
            raise ToolValidationError(f"{spec.name} requires {name}", data={"reason": "missing_param", "param": name})
    for name, value in list(params.items()):
        if name in properties:
            if properties[name].get("type") == "integer" and isinstance(value, float) and value.is_integer():
                value = params[name] = int(value)  # 5.0 is an integer to JSON Schema (and JavaScript)
            _check_value(name, value, properties[name])
        elif not spec.parameters["additionalProperties"]:
            raise ToolValidationError(f"{spec.name} has no parameter {name}",
                                      data={"reason": "unknown_param", "param": name})


def prepare_call(name: str, params: Any, settings: IcarusSettings) -> dict[str, Any]:
    """Validated params to forward for a registered Fabric tool (not the config tool).

    Raises ``NotFound``-like :class:`ToolValidationError` for a tool that is not
    registered under ``settings`` and for invalid params; no bridge call may follow.
    """
    if name not in _FORWARDED_NAMES[bool(settings.tools), bool(settings.admin_tools)]:
        raise ToolValidationError(f"tool {name!r} is not available", data={"reason": "unknown_tool", "tool": name})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise ToolValidationError("tool parameters must be an object", data={"reason": "invalid_params"})
    spec = TOOLS_BY_NAME[name]
    checked: dict[str, Any] = _validate_fabric_write(params) if name == "fabric_write" else dict(params)
    _check_schema(spec, checked)
    return checked


# --------------------------------------------------------------------------- results

def tool_result(value: Any) -> ToolResult:
    text = json.dumps(value, indent=2, ensure_ascii=False, default=str)
    is_error = isinstance(value, dict) and "error" in value
    return ToolResult(content=[{"type": "text", "text": text}], details=value, is_error=is_error)


def error_result(error: ToolValidationError) -> ToolResult:
    return tool_result({"error": error.message})


def config_tool_result(params: Any, settings: IcarusSettings) -> ToolResult:
    """``icarus_hook_config``: schema or effective configuration; never calls the worker."""
    params = {} if params is None else params
    if not isinstance(params, dict):
        return error_result(ToolValidationError("tool parameters must be an object"))
    try:
        _check_schema(CONFIG_TOOL, params)
    except ToolValidationError as exc:
        return error_result(exc)
    return tool_result(config_schema() if params.get("schemaOnly") else config_inspection(settings))
