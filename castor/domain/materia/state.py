"""The persisted cast state (castor's version of pi-materia's).

:class:`CastState` is JSON-serialisable and versioned (``version``). ``CastState.from_json(s.to_json())``
equals ``s`` exactly; the actor persists it on every transition. Field names are snake_case
(castor's own format); the artifact documents (events, manifest, usage) keep pi-materia's names.
"""

from __future__ import annotations

import array
import functools
import json
import re
import sys
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from castor.domain.jsontext import js_collapse_whitespace, js_slice, js_stringify, json_problem
from castor.domain.materia.budget import UsageReport
from castor.domain.materia.config import ResolvedConfig, ResolvedSocket
from castor.domain.materia.failures import RecoveryAllowance
from castor.domain.materia.revive import RecoveryExhaustion
from castor.domain.materia.surface import Surface
from castor.messages.errors import InvalidMessage

CAST_STATE_VERSION = 1

#: ``interrupted``: castor's own turn on the current socket was stopped before it answered (the
#: user's Esc); nothing of it was taken as output and the cast waits for ``continue`` (re-run it),
#: ``recast`` (the same) or ``abort`` (see the engine's decision table).
SocketState = Literal["awaiting_agent_response", "awaiting_user_refinement", "running_utility", "idle",
                      "complete", "failed", "interrupted"]
TurnMode = Literal["normal", "refinement", "finalization"]


class Pending(BaseModel):
    """The one piece of outside work the cast waits for. Outcomes must quote ``visit_id``."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["agent_turn", "utility", "compaction"]
    visit_id: str
    socket_id: str
    visit: int
    mode: TurnMode = "normal"
    # agent_turn only: driven by the user's own message (the harness's agent_end answers it; castor
    # sent nothing and can never send it again)
    user_driven: bool = False
    # compaction only: what to do after it and why
    recovery_key: str | None = None
    failure_class: str | None = None
    original_error: str | None = None
    entry_id: str | None = None
    # utility only
    command: list[str] | None = None
    timeout_ms: float | int | None = None


class CastState(BaseModel):
    version: int = CAST_STATE_VERSION
    cast_id: str
    request: str
    cwd: str = ""
    run_dir: str = ""
    artifact_root: str = ""
    config_source: str = ""
    config_hash: str = ""
    config: ResolvedConfig

    active: bool = True
    phase: str = ""
    current_socket_id: str = ""
    current_materia: str | None = None
    current_item_key: str | None = None
    current_item_label: str | None = None
    awaiting_response: bool = False
    socket_state: SocketState = "idle"
    pending: Pending | None = None
    dispatch_seq: int = 0

    last_entry_id: str | None = None
    last_assistant_text: str | None = None
    active_turn_prompt: str | None = None
    active_turn_mode: TurnMode = "normal"
    active_turn_socket_id: str | None = None
    active_turn_visit: int = 0
    multi_turn_finalizing: bool = False
    failed_reason: str | None = None
    aborted: bool = False
    started_at: float = 0.0
    updated_at: float = 0.0
    ended_at: float | None = None

    data: dict[str, Any] = Field(default_factory=dict)
    cursors: dict[str, int] = Field(default_factory=dict)
    visits: dict[str, int] = Field(default_factory=dict)
    multi_turn_refinements: dict[str, int] = Field(default_factory=dict)
    recovery_attempts: dict[str, int] = Field(default_factory=dict)
    recovery_allowances: dict[str, RecoveryAllowance] = Field(default_factory=dict)
    recovery_exhaustion: RecoveryExhaustion | None = None
    task_attempts: dict[str, int] = Field(default_factory=dict)
    edge_traversals: dict[str, int] = Field(default_factory=dict)
    last_output: str | None = None
    last_json: dict[str, Any] | None = None

    attempt: int = 0
    last_message: str = ""
    surface: Surface = "harness"  # where the user drives the cast from (the commands its texts name)
    usage: UsageReport = Field(default_factory=UsageReport)
    budget_warned: bool = False

    # ------------------------------------------------------------------ helpers
    def __setattr__(self, name: str, value: Any) -> None:
        # What pydantic does for a field of a model without validate_assignment (store it, mark
        # it set), minus its handler lookup: the engine assigns fields on every step.
        if name in _CAST_STATE_FIELDS:
            self.__dict__[name] = value
            self.__pydantic_fields_set__.add(name)
        else:
            super().__setattr__(name, value)

    def assign(self, **values: Any) -> None:
        """Set several fields at once, exactly as that many attribute assignments would (no
        validation on assignment is configured): the engine's hot path sets them in groups."""
        self.__dict__.update(values)
        self.__pydantic_fields_set__.update(values)

    def to_json(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_json(cls, text: str | bytes) -> CastState:
        """Rebuild a persisted state. Raises InvalidMessage on bad JSON or an unknown version."""
        try:
            raw = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise InvalidMessage(f"cast state is not JSON: {json_problem(exc)}") from None
        if not isinstance(raw, dict) or raw.get("version") != CAST_STATE_VERSION:
            raise InvalidMessage(
                f"unsupported cast state version {raw.get('version') if isinstance(raw, dict) else None!r}"
                f" (expected {CAST_STATE_VERSION})",
                data={"reason": "version"},
            )
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            raise InvalidMessage(f"invalid cast state: {exc.error_count()} problem(s)",
                                 data={"errors": json.loads(exc.json())}) from None

    @property
    def socket(self) -> ResolvedSocket:
        return self.config.pipeline.sockets[self.current_socket_id]

    @property
    def visit(self) -> int:
        return self.visits.get(self.current_socket_id, 0)

    @property
    def failed(self) -> bool:
        return self.phase == "failed" or self.socket_state == "failed"

    @property
    def complete(self) -> bool:
        return self.phase == "complete"

    @property
    def paused(self) -> bool:
        return (self.active and not self.awaiting_response and self.socket_state == "awaiting_user_refinement"
                and self.current_socket_id in self.config.pipeline.sockets and self.socket.multi_turn)

    @property
    def interrupted(self) -> bool:
        """An active cast whose own turn was stopped (Esc) and that waits for continue / recast / abort."""
        return self.active and self.pending is None and self.socket_state == "interrupted"

    @property
    def user_turn_pending(self) -> bool:
        """An active cast waiting for a user-driven refinement turn that only the harness can end."""
        p = self.pending
        return self.active and p is not None and p.kind == "agent_turn" and p.user_driven

    @property
    def resumable(self) -> bool:
        return not self.active and not self.complete and self.failed

    def item_fields(self) -> dict[str, Any]:
        """The item fields of events and manifest entries (a fresh dict: callers may keep it)."""
        return dict(_item_fields(self.current_item_key, self.current_item_label))

    def refinement_turn(self) -> int:
        return self.multi_turn_refinements.get(refinement_counter_key(self.current_socket_id,
                                                                      self.current_item_key, self.visit), 0)


_CAST_STATE_FIELDS = frozenset(CastState.model_fields)


def interrupted_document(document: dict[str, Any]) -> bool:
    """:attr:`CastState.interrupted` of a saved state's document, read without building the state:
    a listing asks it of every active cast on its page, and building a :class:`CastState` from its
    document costs a millisecond or more (the whole config and usage report validated). Equal to
    ``CastState.from_json(json.dumps(document)).interrupted`` for every document that builds
    (``tests/domain/materia/test_interrupted_document.py``)."""
    return (document.get("active") is True and document.get("pending") is None
            and document.get("socket_state") == "interrupted")


@functools.lru_cache(maxsize=1024)
def _item_fields(key: str | None, label: str | None) -> dict[str, Any]:
    fields = {"itemKey": key, "itemLabel": label, "itemLabelShort": short_label(label)}
    return {name: value for name, value in fields.items() if value is not None}


#: pi-materia's ``MAX_CONTEXT_ITEM_LABEL_LENGTH``, in UTF-16 code units.
SHORT_LABEL_UNITS = 80


def short_label(label: str | None) -> str | None:
    """pi-materia's short item label: whitespace runs collapsed to one space and trimmed; None when
    nothing is left; else at most 80 UTF-16 code units (JavaScript's ``length``), a longer one cut
    to 79 and ended with "…". A surrogate pair cut in half leaves a lone surrogate in JavaScript,
    which castor writes as U+FFFD (see ``castor/domain/jsontext.py``)."""
    if label is None:
        return None
    collapsed = js_collapse_whitespace(label)
    if not collapsed:
        return None
    if js_slice(collapsed, SHORT_LABEL_UNITS) == collapsed:
        return collapsed
    return js_slice(collapsed, SHORT_LABEL_UNITS - 1) + "…"


@functools.lru_cache(maxsize=4096)
def refinement_counter_key(socket_id: str, item_key: str | None, visit: int) -> str:
    return json.dumps([socket_id, item_key if item_key is not None else "__singleton__", visit], separators=(",", ":"))


@functools.lru_cache(maxsize=4096)
def task_attempt_key(socket_id: str, item_key: str | None) -> str:
    return json.dumps([socket_id, item_key if item_key is not None else "__singleton__"], separators=(",", ":"))


def seg(value: Any) -> str:
    """pi-materia's artifact name segment: each run of characters outside ``[A-Za-z0-9._-]`` is one
    ``-``, leading and trailing ``-`` are trimmed, dots are kept (``../x y`` is ``..-x-y``, as
    pi-materia names it); an empty result, ``.`` or ``..`` is ``task``, so a segment never means a
    directory."""
    return _seg_text(value if type(value) is str else str(value))


@functools.lru_cache(maxsize=4096)  # socket ids and item keys repeat on every transition
def _seg_text(text: str) -> str:
    text = _NOT_SEGMENT.sub("-", text).strip("-")
    return "task" if text in ("", ".", "..") else text


_NOT_SEGMENT = re.compile(r"[^A-Za-z0-9._-]+")


def config_hash(config: dict[str, Any]) -> str:
    """pi-materia's ``configHash``: the Java-style 31-multiplier hash of ``JSON.stringify(config)``
    (numbers as JavaScript writes them) over its UTF-16 code units, as unsigned hex -- the value
    pi-materia records for the same config, emoji and small numbers included."""
    units = array.array("H", js_stringify(config).encode("utf-16-le", "surrogatepass"))
    if sys.byteorder == "big":
        units.byteswap()
    h = 0
    for unit in units:
        h = (31 * h + unit) & 0xFFFFFFFF
    return format(h, "x")
