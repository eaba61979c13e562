"""From layer dicts to a validated config, and from a config to the resolved active loadout.

- :func:`load_config` — per-layer obsolete checks (with the layer's path), merge,
  materia/budget/limits/compaction checks, prepare and validate **every** loadout graph.
  Returns a :class:`LoadedConfig` whose ``issues`` lists every problem (empty = valid).
- :func:`resolve_config` — resolve one loadout (default: ``activeLoadout``) into the
  typed :class:`ResolvedConfig` a cast runs on, or raise :class:`ConfigError` with every issue.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, ValidationError

from castor.domain.jsontext import json_kind, json_shown
from castor.domain.materia import checks, graph
from castor.domain.materia.config import (
    END,
    AgentMateria,
    Budget,
    Compaction,
    ConfigError,
    ConfigIssue,
    LayerInfo,
    Limits,
    Loop,
    LoopIterator,
    ResolvedConfig,
    ResolvedPipeline,
    ResolvedSocket,
    Socket,
    is_plain_object,
    issues_from_validation_error,
    object_at,
    pointer,
    warning,
)
from castor.domain.materia.layers import Provenance, merge_layers


class LoadedConfig(BaseModel):
    merged: dict[str, Any]
    provenance: Provenance
    layers: list[LayerInfo] = Field(default_factory=list)
    issues: list[ConfigIssue] = Field(default_factory=list)  # errors only
    warnings: list[ConfigIssue] = Field(default_factory=list)
    #: warnings about the layer files as read (a repeated key), carried into every resolved config
    layer_warnings: list[ConfigIssue] = Field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.issues

    def raise_if_invalid(self) -> None:
        if self.issues:
            raise ConfigError(self.issues)


def load_config(
    layers: list[tuple[str, dict[str, Any]]], *, layer_info: list[LayerInfo] | None = None
) -> LoadedConfig:
    """Merge and validate. ``layers`` is ``[(label, dict), ...]`` lowest first (default first)."""
    issues: list[ConfigIssue] = []
    for label, layer in layers:
        issues.extend(checks.check_obsolete(layer, label))
    merged_result = merge_layers(layers)
    merged = merged_result.merged
    source = merged_result.provenance.source or None
    issues.extend(validate_merged(merged, source=source))
    return LoadedConfig(merged=merged, provenance=merged_result.provenance, layers=layer_info or [],
                        issues=[_attribute(i, merged_result.provenance) for i in issues if not i.is_warning],
                        warnings=[_attribute(i, merged_result.provenance) for i in issues if i.is_warning])


def validate_merged(merged: dict[str, Any], *, source: str | None = None) -> list[ConfigIssue]:
    """The post-merge checks. Prepares loadouts in place (idempotent normalization)."""
    issues: list[ConfigIssue] = []
    materia = merged.get("materia")
    if not is_plain_object(materia):
        issues.append(ConfigIssue(code="invalid-materia", path=pointer("materia"), source=source,
                                  message="\"materia\" must be an object mapping names to materia, "
                                          f"not {json_kind(materia)}"))
        materia = {}
    else:
        for name, entry in materia.items():
            issues.extend(checks.check_materia_entry(name, entry, source))
    issues.extend(checks.check_compaction(merged.get("compaction"), source))
    issues.extend(checks.check_budget_limits(merged, source))
    loadouts = merged.get("loadouts")
    if loadouts is not None and not is_plain_object(loadouts):
        issues.append(ConfigIssue(code="not-an-object", path=pointer("loadouts"), source=source,
                                  message="\"loadouts\" must be an object mapping names to loadouts, "
                                          f"not {json_kind(loadouts)}"))
        return issues
    for name, loadout in (loadouts or {}).items():
        if not is_plain_object(loadout):
            issues.append(ConfigIssue(code="not-an-object", path=pointer("loadouts", name), source=source,
                                      message=f"loadout \"{name}\" must be an object (entry, sockets, loops), "
                                              f"not {json_kind(loadout)}"))
            continue
        prepared, prep_issues = graph.prepare_loadout(loadout, materia, name=name, source=source)
        assert loadouts is not None  # the loop runs over its items
        loadouts[name] = prepared
        graph_issues = graph.issues_once(prep_issues, graph.validate_graph(prepared, name=name, source=source))
        for issue in graph_issues:
            issues.append(issue.model_copy(update={
                "message": f"Materia loadout \"{name}\" graph is invalid: {issue.message}"}))
    return issues


def resolve_config(
    loaded: LoadedConfig | dict[str, Any], loadout_name: str | None = None, *, source: str | None = None
) -> ResolvedConfig:
    """Resolve a loadout for a cast or the grid. Raises ConfigError with every issue."""
    if isinstance(loaded, LoadedConfig):
        loaded.raise_if_invalid()
        merged, provenance, layers = loaded.merged, loaded.provenance, loaded.layers
        read_warnings = loaded.layer_warnings  # already named by the file they are in
    else:
        merged, provenance, layers = loaded, Provenance(source=source or ""), []
        read_warnings = []
    source = source or provenance.source or None
    issues: list[ConfigIssue] = []
    for key in checks.OBSOLETE_TOP:
        if key in merged:
            issues.append(ConfigIssue(code="obsolete-field", path=pointer(key), source=source,
                                      message=f"obsolete field \"{key}\": use \"materia\""))
    materia = object_at(merged, "materia")
    for materia_name, entry in materia.items():
        issues.extend(checks.check_materia_entry(materia_name, entry, source))
    loadouts = merged.get("loadouts")
    if not is_plain_object(loadouts) or not loadouts:
        raise ConfigError([*issues, ConfigIssue(code="missing-loadouts", path=pointer("loadouts"), source=source,
                                                message="no Materia loadouts are configured")])
    available = ", ".join(loadouts)
    name = loadout_name or merged.get("activeLoadout")
    # an activeLoadout the config chose names the layer that chose it; a name asked for, the chain
    chosen_by = (provenance.whole.get("activeLoadout") if loadout_name is None else None) or source
    if not isinstance(name, str) or not name:
        said = "is not set" if name is None or name == "" else f"must be a loadout name, not {json_kind(name)}"
        raise ConfigError([*issues, ConfigIssue(code="unknown-loadout", path=pointer("activeLoadout"),
                                                source=chosen_by,
                                                message=f"activeLoadout {said}. Available loadouts: {available}")])
    if name not in loadouts or not is_plain_object(loadouts[name]):
        raise ConfigError([*issues, ConfigIssue(
            code="unknown-loadout", path=pointer("activeLoadout"), source=chosen_by,
            message=f"Unknown Materia loadout \"{name}\". Available loadouts: {available}")])
    prepared, prep_issues = graph.prepare_loadout(loadouts[name], materia, name=name, source=source)
    for field in checks.OBSOLETE_LOADOUT:
        if field in prepared:
            issues.append(ConfigIssue(code="obsolete-field", path=pointer("loadouts", name, field), source=source,
                                      message=f"loadout \"{name}\" has obsolete field \"{field}\""))
    issues.extend(graph.issues_once(prep_issues, graph.validate_graph(
        prepared, name=name, source=source, generator_detector=graph.default_generator_detector(materia))))
    sockets_out: dict[str, ResolvedSocket] = {}
    for sid, raw in (prepared.get("sockets") or {}).items():
        resolved, socket_issues = _resolve_socket(name, sid, raw, materia, source)
        issues.extend(socket_issues)
        if resolved is not None:
            sockets_out[sid] = resolved
    loops_out: dict[str, Loop] = {}
    for loop_id, raw_loop in (prepared.get("loops") or {}).items():
        loop, loop_issues = _resolve_loop(name, loop_id, raw_loop, sockets_out, source)
        issues.extend(loop_issues)
        if loop is not None:
            loops_out[loop_id] = loop
    issues.extend(_text_guard_issues(name, sockets_out, source))
    issues.extend(_enforced_limit_warnings(name, sockets_out, source))
    issues.extend(_ignored_budget_warnings(name, prepared, source))
    issues.extend(checks.unknown_field_warnings(merged, name, prepared, source))
    issues.extend(checks.unreadable_expression_warnings(name, sockets_out, loops_out, source))
    issues.extend(checks.unknown_utility_warnings(name, sockets_out, source))
    issues.extend(_no_end_warnings(name, sockets_out, loops_out, source))
    warnings = [*read_warnings, *(_attribute(i, provenance) for i in issues if i.is_warning)]
    issues = [_attribute(i, provenance) for i in issues if not i.is_warning]
    if issues:
        raise ConfigError(issues)
    pipeline = ResolvedPipeline(loadout_name=name, entry=prepared["entry"], sockets=sockets_out, loops=loops_out)
    snapshot = dict(merged)
    snapshot["loadouts"] = {**loadouts, name: prepared}
    try:
        return ResolvedConfig(
            config=snapshot,
            pipeline=pipeline,
            source=provenance.source,
            layers=layers,
            artifact_dir=merged.get("artifactDir") or ".pi/pi-materia",
            budget=Budget.model_validate(merged.get("budget") or {}),
            limits=Limits.model_validate(merged.get("limits") or {}),
            compaction=Compaction.model_validate(merged["compaction"]) if merged.get("compaction") else None,
            warnings=warnings,
        )
    except ValidationError as exc:
        raise ConfigError(issues_from_validation_error(exc, base=(), code="invalid-field", source=source,
                                                       what="config", keys={"artifact_dir": "artifactDir"})) from None


def _resolve_socket(lname: str, sid: str, raw: Any, materia: dict[str, Any],
                    source: str | None) -> tuple[ResolvedSocket | None, list[ConfigIssue]]:
    base = ("loadouts", lname, "sockets", sid)
    issues: list[ConfigIssue] = []

    def bad(code: str, field: str | None, message: str) -> None:
        parts = (*base, field) if field else base
        issues.append(ConfigIssue(code=code, path=pointer(*parts), source=source, message=f"socket {sid}: {message}"))

    if not is_plain_object(raw):
        bad("invalid-socket", None, "must be an object")
        return None, issues
    stype = raw.get("type")
    if "type" not in raw:
        bad("invalid-socket", "type", "type is missing (agent or utility)")
    elif stype not in ("agent", "utility"):
        bad("invalid-socket", "type", f"unsupported type {json_shown(stype)} (agent or utility)")
    if raw.get("parse") is not None and raw.get("parse") not in ("text", "json"):
        bad("invalid-socket", "parse", f"unsupported parse mode {json_shown(raw.get('parse'))}")
    for field in ("multiTurn", *checks.OBSOLETE_SOCKET_AT_LOAD):
        if field in raw:
            bad("obsolete-field", field, f"obsolete {field}: it belongs on the materia" if field == "multiTurn"
                else f"obsolete {field}: reference a materia instead")
    agent: AgentMateria | None = None
    if stype == "utility":
        if not raw.get("utility") and not raw.get("command"):
            bad("invalid-socket", "utility", "a utility socket needs \"utility\" or \"command\"")
        issues.extend(i.model_copy(update={"source": source}) for i in checks.command_issues(
            raw.get("command"), base, source, f"socket {sid}"))
        issues.extend(checks.timeout_issues(raw.get("timeoutMs"), base, source, f"socket {sid}"))
    elif stype == "agent":
        mname = raw.get("materia")
        entry = materia.get(mname) if isinstance(mname, str) else None
        if mname is None:
            bad("unknown-materia", "materia", "an agent socket needs a materia (the name of one in \"materia\")")
        elif not isinstance(mname, str):
            bad("unknown-materia", "materia", f"materia must be the name of a materia, not {json_kind(mname)}")
        elif entry is None:
            bad("unknown-materia", "materia", f"references unknown materia {json_shown(mname)}")
        elif (entry.get("type") or "agent") != "agent":
            bad("unknown-materia", "materia", f"materia {json_shown(mname)} has unsupported type "
                                              f"{json_shown(entry.get('type'))} for an agent socket")
        else:
            try:
                agent = AgentMateria.model_validate(entry)
            except ValidationError as exc:
                issues.extend(issues_from_validation_error(exc, base=("materia", str(mname)), code="invalid-materia",
                                                           source=source, what=f"materia {mname}"))
    if issues:
        return None, issues
    try:
        sock = Socket.model_validate(raw)
    except ValidationError as exc:
        return None, issues_from_validation_error(exc, base=base, code="invalid-socket", source=source,
                                                  what=f"socket {sid}")
    return ResolvedSocket(id=sid, socket=sock, materia_name=raw.get("materia") if agent else None,
                          materia=agent), issues


def _resolve_loop(lname: str, loop_id: str, raw: Any, sockets: dict[str, ResolvedSocket],
                  source: str | None) -> tuple[Loop | None, list[ConfigIssue]]:
    base = ("loadouts", lname, "loops", loop_id)
    try:
        loop = Loop.model_validate(raw)
    except ValidationError as exc:
        return None, issues_from_validation_error(exc, base=base, code="invalid-loop", source=source,
                                                  what=f"loop {loop_id}")
    issues: list[ConfigIssue] = []
    if loop.consumes is not None:
        producer = sockets.get(loop.consumes.from_)
        if producer is not None and not (producer.is_agent and producer.is_generator):
            issues.append(ConfigIssue(code="invalid-generator", path=pointer(*base, "consumes", "from"), source=source,
                                      message=f"loop \"{loop_id}\" consumes {loop.consumes.from_}, which is not a "
                                              "generator agent socket (materia generator: true)"))
        if loop.consumes.output != "workItems":
            issues.append(ConfigIssue(code="invalid-generator", path=pointer(*base, "consumes", "output"),
                                      source=source, message=f"loop \"{loop_id}\" consumes output "
                                      f"\"{loop.consumes.output}\"; generators only produce \"workItems\""))
        if loop.iterator is None:
            loop = loop.model_copy(update={"iterator": _derived_iterator(loop)})
    return loop, issues


def _derived_iterator(loop: Loop) -> LoopIterator:
    c = loop.consumes
    assert c is not None
    return LoopIterator.model_validate({"items": "state.workItems", "as": c.as_ or "workItem",
                                        "cursor": c.cursor or "workItemIndex", "done": c.done or END})


def _attribute(issue: ConfigIssue, provenance: Provenance) -> ConfigIssue:
    """The issue's ``source`` narrowed from the merged layers to the layer file that set the
    place it points at (the loadout field's -- ``sockets``, ``entry``, ``loops`` --, the materia
    field's, the ``budget``/``limits``/``compaction`` field's, or a top-level value's), when
    provenance knows it; otherwise (a field no layer set) the merged layers stay named."""
    parts = [p.replace("~1", "/").replace("~0", "~") for p in issue.path.split("/")[1:]]
    label = None
    if len(parts) >= 3 and parts[0] == "loadouts":
        label = provenance.loadout_fields.get(parts[1], {}).get(parts[2])
    elif len(parts) == 2 and parts[0] == "loadouts" and parts[1] not in provenance.protected_loadouts:
        label = provenance.loadouts.get(parts[1])  # (a bundled loadout always reports the default layer)
    elif len(parts) >= 3 and parts[0] == "materia":
        label = provenance.materia.get(parts[1], {}).get(parts[2])
    elif len(parts) >= 2 and parts[0] in provenance.object_fields:  # budget / limits / compaction
        label = provenance.object_fields[parts[0]].get(parts[1])
    elif len(parts) == 1:  # a top-level value one layer wrote whole
        label = provenance.whole.get(parts[0])
    return issue.model_copy(update={"source": label}) if label else issue


def _text_guard_issues(lname: str, sockets: dict[str, ResolvedSocket], source: str | None) -> list[ConfigIssue]:
    """A text socket with a ``satisfied``/``not_satisfied`` edge: a warning, not a refusal.

    pi-materia loads it (its own editor once saved this shape) and runs it: a text output never
    carries ``satisfied``, so a guarded edge never matches and, with no ``always`` edge after
    it, the cast ends at that socket. castor runs it the same way and says so here.
    """
    issues = []
    for sid, rs in sockets.items():
        if rs.socket.is_json:
            continue
        for i, edge in enumerate(rs.socket.edges):
            if edge.when != "always":
                issues.append(warning(
                    "text-socket-guarded-edge", pointer("loadouts", lname, "sockets", sid, "edges", i, "when"),
                    source=source,
                    message=(f"loadout \"{lname}\": {sid}.edges[{i}] routes on {edge.when} but {sid} has parse "
                             "\"text\": a text output never carries \"satisfied\", so this edge never matches "
                             "(the cast takes the next matching edge, or ends at "
                             f"{sid}); set parse \"json\" on {sid} to route on it")))
    return issues


def _no_end_warnings(lname: str, sockets: dict[str, ResolvedSocket], loops: dict[str, Loop],
                     source: str | None) -> list[ConfigIssue]:
    """A loadout no cast of which can end: every socket has an ``always`` edge, no edge leads to
    ``end``, and nothing else routes (no loop, no ``foreach``, no ``advance``), so each visit goes on
    to another socket until a limit fails the cast. pi-materia runs it without a word; castor runs
    it too and says so. Conservative: any way out anywhere, reachable or not, is no warning."""
    if not sockets or loops:
        return []
    for rs in sockets.values():
        socket = rs.socket
        if socket.foreach is not None or socket.advance is not None:
            return []
        if any(edge.to == "end" for edge in socket.edges) or not any(e.when == "always" for e in socket.edges):
            return []
    return [warning("no-end", pointer("loadouts", lname, "sockets"), source=source,
                    message=(f"loadout \"{lname}\" has no way to end: every socket has an \"always\" edge to "
                             "another socket and none leads to \"end\", so every cast runs until "
                             "limits.maxSocketVisits (or maxEdgeTraversals) fails it; add an edge to \"end\""))]


def _ignored_budget_warnings(lname: str, prepared: dict[str, Any], source: str | None) -> list[ConfigIssue]:
    """A ``budget`` on the loadout or on one of its sockets: the budget is the config's own (its top
    level) and counts the whole cast, so one written there limits nothing. pi-materia ignores it
    without a word; castor loads the config too, and says so once per place."""
    places: list[tuple[tuple[str, ...], str]] = []
    if "budget" in prepared:
        places.append(((), f"loadout \"{lname}\""))
    sockets = prepared.get("sockets")
    for sid, raw in (sockets.items() if isinstance(sockets, dict) else ()):
        if isinstance(raw, dict) and "budget" in raw:
            places.append((("sockets", sid), f"loadout \"{lname}\": {sid}"))
    return [warning("ignored-budget", pointer("loadouts", lname, *where, "budget"), source=source,
                    message=(f"{what} has a budget, which is ignored: the budget is read only at the config's "
                             "top level (\"budget\": {maxTokens, maxCostUsd, ...}) and counts the whole cast; "
                             "move it there to limit this cast"))
            for where, what in places]


def _enforced_limit_warnings(lname: str, sockets: dict[str, ResolvedSocket],
                             source: str | None) -> list[ConfigIssue]:
    """Socket ``limits.maxEdgeTraversals`` / ``limits.maxOutputBytes``: pi-materia parses and
    ignores them; castor enforces them (a declared limit is a limit). Said once per socket."""
    issues = []
    for sid, rs in sockets.items():
        lim = rs.socket.limits
        if lim is None:
            continue
        for field, value in (("maxEdgeTraversals", lim.max_edge_traversals), ("maxOutputBytes", lim.max_output_bytes)):
            if value is not None:
                issues.append(warning(
                    "socket-limit-enforced", pointer("loadouts", lname, "sockets", sid, "limits", field),
                    source=source,
                    message=(f"loadout \"{lname}\": {sid}.limits.{field} = {value} is enforced by castor "
                             "(pi-materia accepts it but never applies it): a cast that goes past it fails")))
    return issues
