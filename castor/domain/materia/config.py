"""Typed models of the pi-materia config, and the issue/error model of config validation.

Guarantees:
- Configs written for pi-materia load unchanged: field names are the camelCase JSON names
  (models use aliases), and palette/UI fields the runtime ignores (``label``, ``description``,
  ``group``, ``color``, ``layout``, ``empty`` ...) are kept (``extra="allow"``) so a resolved
  config dumps back to what was read.
- Obsolete pi-materia fields are rejected with the file they came from.
- Every problem is a :class:`ConfigIssue` ``(code, path, message, source)``; ``path`` is a JSON
  pointer into the file (or the merged config), ``source`` the file path / layer label.
  A :class:`ConfigError` carries the full list, never only the first problem.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.alias_generators import to_camel
from typing_extensions import TypeIs  # typing.TypeIs is 3.13+; castor supports 3.11

from castor.messages.errors import ErrorCode, InvalidConfig

# --------------------------------------------------------------------------- issues

#: Issue codes. The graph codes are pi-materia's; the others are castor's.
GRAPH_CODES = (
    "missing-endpoint",
    "unknown-endpoint",
    "invalid-socket-id",
    "invalid-edge-condition",
    "unreachable-edge",
    "invalid-loop",
)
OTHER_CODES = (
    "file-not-found",
    "read-error",
    "unsafe-permissions",
    "invalid-json",
    "not-an-object",
    "obsolete-field",
    "invalid-materia",
    "invalid-socket",
    "invalid-compaction",
    "invalid-budget",
    "invalid-limits",
    "missing-loadouts",
    "unknown-loadout",
    "unknown-materia",
    "invalid-generator",
    "invalid-field",
)
#: Warning codes: castor loads and runs the config (the way pi-materia does) and says why it is suspect.
WARNING_CODES = (
    "text-socket-guarded-edge",
    "unknown-thinking",
    "socket-limit-enforced",
    "ignored-budget",
    "no-end",
    "unknown-field",
    "unreadable-expression",
    "expression-as-assign-target",
    "dangling-config-link",
    "unknown-utility",
)


class ConfigIssue(BaseModel):
    """One config problem: a stable ``code``, where it is, and a readable message.

    ``severity`` ``"error"`` refuses the config; ``"warning"`` loads and runs it and reports it
    (``castor validate``, the cast's ``config_warning`` events, the cast start result)."""

    model_config = ConfigDict(frozen=True)

    code: str
    path: str = ""
    message: str
    source: str | None = None
    severity: Literal["error", "warning"] = "error"

    @property
    def is_warning(self) -> bool:
        return self.severity == "warning"

    def __str__(self) -> str:
        """``[code] file#pointer: message``, naming the file once: an issue whose message names its
        file already is ``[code] #pointer: message`` (an obsolete field, a repeated key: their
        messages name the file, as a cast's notice shows no other), or ``[code] message`` when it is
        about the whole file (it cannot be read, is not JSON, is not an object)."""
        label = f"warning {self.code}" if self.is_warning else self.code
        named = bool(self.source) and str(self.source) in self.message
        if named and not self.path:
            return f"[{label}] {self.message}"
        where = f"#{self.path}" if named else f"{self.source or '<config>'}#{self.path or '/'}"
        return f"[{label}] {where}: {self.message}"

    def pointed(self) -> str:
        """``[code] pointer: message``, as a cast's notice and ``castor grid`` show a warning of the
        config they run; ``[code] message`` for one about no field (a linked file that is missing)."""
        return f"[{self.code}] {self.path}: {self.message}" if self.path else f"[{self.code}] {self.message}"


def warning(code: str, path: str, message: str, source: str | None = None) -> ConfigIssue:
    return ConfigIssue(code=code, path=path, message=message, source=source, severity="warning")


class ConfigError(InvalidConfig):
    """Raised with every issue found. ``data["issues"]`` holds them as wire maps."""

    code = ErrorCode.INVALID_CONFIG

    def __init__(self, issues: list[ConfigIssue], *, headline: str | None = None) -> None:
        self.issues = list(issues)
        lines = [str(i) for i in self.issues]
        message = headline or ("invalid materia config: " + "; ".join(lines) if lines else "invalid materia config")
        super().__init__(message, data={"issues": [i.model_dump() for i in self.issues]})


def pointer(*parts: str | int) -> str:
    """A JSON pointer (RFC 6901) from path parts."""
    out = []
    for part in parts:
        text = str(part).replace("~", "~0").replace("/", "~1")
        out.append(text)
    return "/" + "/".join(out) if out else ""


# --------------------------------------------------------------------------- constants

#: JavaScript's ``^Socket-([1-9]\d*)$``: ASCII digits, and nothing after them (matched whole, so
#: unlike Python's ``\d`` and ``$`` no other script's digits and no trailing line break).
SOCKET_ID_PATTERN = r"^Socket-([1-9][0-9]*)$"
END = "end"
EDGE_CONDITIONS = ("always", "satisfied", "not_satisfied")
TOOL_SCOPES = ("none", "readOnly", "coding")
THINKING_LEVELS = ("off", "minimal", "low", "medium", "high", "xhigh")
PARSE_MODES = ("text", "json")
RUNTIME_LIMIT_FALLBACK = 25
DEFAULT_WARN_AT_PERCENT = 75.0
DEFAULT_UTILITY_TIMEOUT_MS = 30_000
DEFAULT_MAX_OUTPUT_BYTES = 1_048_576


# --------------------------------------------------------------------------- models


class _Model(BaseModel):
    """camelCase JSON names, snake_case attributes; unknown fields are kept."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class Budget(_Model):
    # float | int: a whole number stays one, so it is written back as JavaScript writes it (300, not 300.0)
    max_tokens: float | int | None = None
    max_cost_usd: float | int | None = None
    warn_at_percent: float | int | None = None
    stop_at_limit: bool | None = None


class Limits(_Model):
    max_socket_visits: int | None = None
    max_edge_traversals: int | None = None


class CompactionTier(_Model):
    id: str | None = None
    threshold_percent: float
    min_context_window: int = 0
    max_context_window: int | None = None


class Compaction(_Model):
    proactive_threshold_percent: float | None = None
    proactive_threshold_tiers: list[CompactionTier] | None = None


class AgentMateria(_Model):
    type: Literal["agent"] = "agent"
    prompt: str
    tools: Literal["none", "readOnly", "coding"]
    model: str | None = None
    thinking: str | None = None  # a level castor does not know is warned about and not applied
    multi_turn: bool = False
    generator: bool = False
    parse: str | None = None  # palette metadata only


class UtilityMateria(_Model):
    type: Literal["utility"]
    utility: str | None = None
    command: list[str] | None = None
    params: dict[str, Any] | None = None
    timeout_ms: float | int | None = None
    assign: dict[str, str] | None = None
    parse: str | None = None


class Edge(_Model):
    when: Literal["always", "satisfied", "not_satisfied"] = "always"
    to: str
    max_traversals: int | None = Field(default=None, ge=0)  # a negative limit could only fail the cast


class Foreach(_Model):
    items: str
    as_: str | None = Field(default=None, alias="as")
    cursor: str | None = None
    done: str | None = None


class Advance(_Model):
    cursor: str
    items: str
    done: str | None = None
    when: str | None = None


class SocketLimits(_Model):
    max_visits: int | None = Field(default=None, ge=0)
    max_edge_traversals: int | None = Field(default=None, ge=0)
    max_output_bytes: int | None = Field(default=None, ge=0)


class SocketResources(_Model):
    """What a utility command needs where it runs (used by the Ray backend to place it)."""

    cpus: float = Field(default=1.0, gt=0, le=1024)


class Socket(_Model):
    type: Literal["agent", "utility"]
    materia: str | None = None
    utility: str | None = None
    command: list[str] | None = None
    params: dict[str, Any] | None = None
    timeout_ms: float | int | None = None
    parse: Literal["text", "json"] | None = None
    assign: dict[str, str] = Field(default_factory=dict)
    edges: list[Edge] = Field(default_factory=list)
    foreach: Foreach | None = None
    advance: Advance | None = None
    limits: SocketLimits | None = None
    resources: SocketResources | None = None
    socket_kind: Literal["entry", "normal"] | None = None

    @field_validator("assign", "edges", mode="before")
    @classmethod
    def _null_is_empty(cls, value: Any, info: Any) -> Any:
        # pi-materia reads an explicit null (as an editor may save it) as "none".
        return ({} if info.field_name == "assign" else []) if value is None else value

    @field_validator("assign")
    @classmethod
    def _targets_name_a_key(cls, value: dict[str, str]) -> dict[str, str]:
        for target in value:
            if not any(target.strip().split(".")):
                raise ValueError(f"assign target {target!r} names no key (a dotted path such as \"result.items\")")
        return value

    @property
    def is_json(self) -> bool:
        return self.parse == "json"


class LoopConsumes(_Model):
    from_: str = Field(alias="from")
    output: str = "workItems"
    as_: str | None = Field(default=None, alias="as")
    cursor: str | None = None
    done: str | None = None

    @field_validator("output", mode="before")
    @classmethod
    def _null_output(cls, value: Any) -> Any:
        return "workItems" if value is None else value  # pi-materia: output ?? "workItems"


class LoopIterator(_Model):
    items: str
    as_: str | None = Field(default=None, alias="as")
    cursor: str | None = None
    done: str | None = None


class LoopExit(_Model):
    from_: str = Field(alias="from")
    when: Literal["always", "satisfied", "not_satisfied"] = "always"
    to: str = END

    @field_validator("when", mode="before")
    @classmethod
    def _when_alias(cls, value: Any) -> Any:
        return "always" if value is None or value in ("", "flow", "Flow") else value  # as edges


class LoopExitRoute(_Model):
    id: str
    from_: str = Field(alias="from")
    condition: Literal["always", "satisfied", "not_satisfied"]
    target_socket_id: str


class Loop(_Model):
    label: str | None = None
    sockets: list[str]
    consumes: LoopConsumes | None = None
    iterator: LoopIterator | None = None
    exit: LoopExit | None = None
    exits: list[LoopExitRoute] = Field(default_factory=list)

    @field_validator("exits", mode="before")
    @classmethod
    def _null_exits(cls, value: Any) -> Any:
        return [] if value is None else value


class Loadout(_Model):
    entry: str
    sockets: dict[str, Socket]
    loops: dict[str, Loop] = Field(default_factory=dict)


class MateriaFileConfig(_Model):
    """The merged top-level config. ``materia`` stays raw: it is validated per entry."""

    artifact_dir: str | None = None
    budget: Budget = Field(default_factory=Budget)
    limits: Limits = Field(default_factory=Limits)
    compaction: Compaction | None = None
    materia: dict[str, dict[str, Any]] = Field(default_factory=dict)
    loadouts: dict[str, dict[str, Any]] = Field(default_factory=dict)
    active_loadout: str | None = None


class ResolvedSocket(_Model):
    """A socket of the active loadout with its agent materia attached (None for utilities)."""

    id: str
    socket: Socket
    materia_name: str | None = None
    materia: AgentMateria | None = None

    @property
    def is_agent(self) -> bool:
        return self.socket.type == "agent"

    @property
    def is_generator(self) -> bool:
        return bool(self.materia and self.materia.generator)

    @property
    def multi_turn(self) -> bool:
        return bool(self.materia and self.materia.multi_turn)


class ResolvedPipeline(_Model):
    loadout_name: str
    entry: str
    sockets: dict[str, ResolvedSocket]
    loops: dict[str, Loop] = Field(default_factory=dict)


class LayerInfo(_Model):
    scope: Literal["default", "user", "project", "explicit"]
    path: str
    loaded: bool
    #: Why another user may have chosen what a loaded project layer says (its file is theirs, or
    #: every user may write it), else None: such a layer's utility commands are never run, trusted
    #: or not (``castor.domain.materia.trust``). Not part of any JSON shape.
    foreign: str | None = Field(default=None, exclude=True)


class ResolvedConfig(_Model):
    """What a cast runs on: the merged config snapshot plus the resolved active loadout."""

    config: dict[str, Any]
    pipeline: ResolvedPipeline
    source: str = ""
    layers: list[LayerInfo] = Field(default_factory=list)
    artifact_dir: str = ".pi/pi-materia"
    budget: Budget = Field(default_factory=Budget)
    limits: Limits = Field(default_factory=Limits)
    compaction: Compaction | None = None
    warnings: list[ConfigIssue] = Field(default_factory=list)


# --------------------------------------------------------------------------- helpers


def issues_from_validation_error(
    exc: ValidationError, *, base: tuple[str | int, ...], code: str, source: str | None, what: str,
    keys: dict[str, str] | None = None,
) -> list[ConfigIssue]:
    """Turn pydantic's errors into ConfigIssues with JSON pointers under ``base``. ``keys``: the
    config file's key for a field validated by its Python name (``artifact_dir`` -> ``artifactDir``),
    so the pointer names what the user wrote."""
    out = []
    for err in exc.errors():
        loc = tuple(p for p in err.get("loc", ()) if not isinstance(p, str) or not p.startswith("function-"))
        if keys and loc and isinstance(loc[0], str) and loc[0] in keys:
            loc = (keys[loc[0]], *loc[1:])
        said = err.get("msg", "invalid")
        if err.get("type") == "int_parsing_size":  # pydantic's words are about a string: the config wrote a number
            said = f"{err.get('input')!r} is past the largest whole number castor holds here (2**63 - 1)"
        out.append(
            ConfigIssue(
                code=code,
                path=pointer(*base, *loc),
                message=f"{what}: {'.'.join(str(p) for p in loc) or '<value>'}: {said}",
                source=source,
            )
        )
    return out


def is_plain_object(value: Any) -> TypeIs[dict[str, Any]]:
    """True when ``value`` is a JSON object (a dict); narrows it for the type checker."""
    return isinstance(value, dict)


def object_at(container: dict[str, Any], key: str) -> dict[str, Any]:
    """The JSON object under ``key`` itself (not a copy), or a new empty dict when the key is
    missing or holds something else."""
    value = container.get(key)
    return value if is_plain_object(value) else {}
