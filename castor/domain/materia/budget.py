"""Usage accounting and the budget rule.

- :func:`extract_usage` reads a provider/harness usage map with the many alias spellings and
  never under-reports cost (``total = max(provided, sum of parts)``).
- :func:`check_budget` runs after every ``socket_complete``: warn once at ``warnAtPercent``
  (default 75), then at a limit emit ``budget_limit`` and stop unless ``stopAtLimit is False``.
"""

from __future__ import annotations

import collections
import functools
import json
import math
import re
import weakref
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, Field, TypeAdapter

from castor.domain.materia.config import DEFAULT_WARN_AT_PERCENT, Budget
from castor.domain.materia.memo import derived, known, remember
from castor.messages.built import built

PARTS = ("input", "output", "cacheRead", "cacheWrite")

# The alias spellings pi-materia reads, in its order of preference (the first present wins), and
# after them Amazon Bedrock Converse's cache names (castor's own). docs/materia.md "Usage and cost"
# has the same lists as a table.
TOKEN_ALIASES: dict[str, tuple[str, ...]] = {
    "input": ("input", "inputTokens", "input_tokens", "promptTokens", "prompt_tokens"),
    "output": ("output", "outputTokens", "output_tokens", "completionTokens", "completion_tokens"),
    "cacheRead": ("cacheRead", "cacheReadTokens", "cache_read", "cache_read_tokens", "cache_read_input_tokens",
                  "cachedInputTokens", "cached_input_tokens", "cachedTokens", "cached_tokens",
                  "cacheReadInputTokens"),
    "cacheWrite": ("cacheWrite", "cacheWriteTokens", "cache_write", "cache_write_tokens",
                   "cache_creation_input_tokens", "cacheCreationTokens", "cache_creation_tokens",
                   "cacheWriteInputTokens"),
}
TOTAL_TOKEN_ALIASES = ("totalTokens", "total", "tokens", "total_tokens")


def _spellings(*stems: str) -> tuple[str, ...]:
    """camelCase and snake_case of ``<stem>Cost``, ``<stem>Usd`` and ``<stem>CostUsd``."""
    out: list[str] = []
    for stem in stems:
        snake = re.sub(r"(?<!^)(?=[A-Z])", "_", stem).lower()
        out += [f"{stem}Cost", f"{snake}_cost", f"{stem}CostUsd", f"{snake}_cost_usd", f"{stem}Usd", f"{snake}_usd"]
    return tuple(out)


def _nested(*stems: str) -> tuple[str, ...]:
    """Names read inside a nested ``usage.cost`` object: the bare stem first, then the suffixed forms."""
    out: list[str] = []
    for stem in stems:
        snake = re.sub(r"(?<!^)(?=[A-Z])", "_", stem).lower()
        out += [stem] + ([snake] if snake != stem else [])
        out += [f"{stem}Cost", f"{snake}_cost", f"{stem}Usd", f"{snake}_usd", f"{stem}CostUsd", f"{snake}_cost_usd"]
    return tuple(out)


_COST_STEMS = {
    "input": ("input", "prompt"),
    "output": ("output", "completion"),
    "cacheRead": ("cacheRead", "cachedInput"),
    "cacheWrite": ("cacheWrite", "cacheCreation"),
}
#: Cost component names inside ``usage.cost`` (an object).
NESTED_COST_ALIASES: dict[str, tuple[str, ...]] = {part: _nested(*stems) for part, stems in _COST_STEMS.items()}
#: Cost component names at the top level of ``usage`` (read only when ``usage.cost`` has none).
FLAT_COST_ALIASES: dict[str, tuple[str, ...]] = {part: _spellings(*stems) for part, stems in _COST_STEMS.items()}
#: Provided cost totals: inside ``usage.cost``; else ``usage.cost`` itself as a number; else top level.
NESTED_TOTAL_COST_ALIASES = ("total", "totalCost", "total_cost", "totalUsd", "total_usd", "totalCostUsd",
                             "total_cost_usd", "costUsd", "cost_usd", "usd")
FLAT_TOTAL_COST_ALIASES = ("totalCost", "total_cost", "totalCostUsd", "total_cost_usd", "totalUsd", "total_usd",
                           "costUsd", "cost_usd", "usd")


class Amounts(BaseModel):
    # float | int: a whole count stays an int, written as JavaScript writes it (120, not 120.0)
    input: float | int = 0
    output: float | int = 0
    cacheRead: float | int = 0
    cacheWrite: float | int = 0
    total: float | int = 0

    def plus(self, other: Amounts) -> Amounts:
        """Each figure summed (:func:`figure_sum`: capped, and free of binary float drift); ``self``
        itself when ``other`` is :data:`NO_AMOUNTS` (nothing to add: no new object)."""
        if other is NO_AMOUNTS:
            return self
        return Amounts(**{k: figure_sum(getattr(self, k), getattr(other, k)) for k in (*PARTS, "total")})


class TurnUsage(BaseModel):
    tokens: Amounts = Field(default_factory=Amounts)
    cost: Amounts = Field(default_factory=Amounts)


#: Every figure 0, as :func:`extract_usage` reads a usage that counts nothing (a provider that sent
#: none, an empty map): one shared object, never changed (nothing in a report is changed in place),
#: so a turn that reported nothing costs its record no figures of its own, and adding it to the
#: cast's totals and tables makes nothing new (:meth:`Amounts.plus`, :meth:`UsageReport.add_turn`).
NO_AMOUNTS = Amounts(input=0, output=0, cacheRead=0, cacheWrite=0, total=0)
#: The usage of a turn that counts nothing (:data:`NO_AMOUNTS` twice), shared likewise.
NO_USAGE = TurnUsage(tokens=NO_AMOUNTS, cost=NO_AMOUNTS)


CostKind = Literal["actual", "subscription", "estimated"]
"""pi-materia's cost kinds. castor writes ``subscription`` or ``actual``, as pi-materia does;
``estimated`` is what castor wrote before (a state saved then still reads); whether a cost was the
provider's billed figure is ``costFromProvider`` (a turn) and ``costEstimated`` (the report)."""

#: The model fields a turn and the report carry (pi-materia's names).
MODEL_FIELDS = ("model", "provider", "api", "thinkingLevel")


class TurnRecord(BaseModel):
    """One turn's usage, with what answered it: the answer's model / provider / api / thinking
    where it named them, else the materia's selection's, and the selection's fields (pi-materia's
    ``UsageTurn``). ``thinkingLevel`` is castor's older name for ``thinking``, kept for readers."""

    socket: str
    materia: str | None = None
    taskId: str | None = None
    attempt: int = 1
    tokens: Amounts
    cost: Amounts
    model: str | None = None
    provider: str | None = None
    api: str | None = None
    thinkingLevel: str | None = None
    thinking: str | None = None
    requestedModel: str | None = None
    requestedThinking: str | None = None
    effectiveModel: str | None = None
    effectiveThinking: str | None = None
    modelFallbackReason: str | None = None
    thinkingFallbackReason: str | None = None
    fallbackReason: str | None = None
    modelExplicit: bool | None = None
    thinkingExplicit: bool | None = None
    source: str | None = None
    costKind: CostKind = "actual"
    costFromProvider: bool | None = None  # Pi's cost.totalFromProvider, where the usage said
    unreadable: list[str] | None = None  # figures given but not numbers: not counted (unreadable_figures)
    # what an answered turn left out without saying so: "tokens" (none counted), "cost" (tokens at no
    # cost that is not the provider's billed figure: a model with no price)
    unreported: list[str] | None = None


#: The records of turns that counted nothing (:data:`NO_AMOUNTS`), by their fields: see :func:`turn_record`.
_COUNTED_NOTHING: weakref.WeakValueDictionary[tuple[Any, ...], TurnRecord] = weakref.WeakValueDictionary()
#: How many of the latest such records are kept when no cast holds them (a cast that follows the
#: last one ended finds its records, their texts rendered): a few KB each, at most.
RECENT_RECORDS_KEPT = 256
_RECENT: collections.deque[TurnRecord] = collections.deque(maxlen=RECENT_RECORDS_KEPT)


def turn_record(fields: dict[str, Any]) -> TurnRecord:
    """``TurnRecord(**fields)``; for a turn that counted nothing (its ``tokens`` and ``cost`` both
    :data:`NO_AMOUNTS`: a provider that sent no usage, recorded ``unreported``), the one record of
    those fields while any cast holds it. Such a record says only where the turn ran and what it
    left out, so the turns of concurrent casts of a loadout, each at the same socket, hold one
    record and its rendered text (:func:`usage_file_text` renders a record once per object), not
    one each. A record is never changed in place (a report's turns are read, never edited), so
    sharing it is unseen; the fields are the key (a value that is no string, number, bool, None
    or list of those makes a record of its own). The latest :data:`RECENT_RECORDS_KEPT` are kept
    after their casts end, so casts that follow one another share them too."""
    if fields.get("tokens") is not NO_AMOUNTS or fields.get("cost") is not NO_AMOUNTS:
        return TurnRecord(**fields)
    try:
        key = tuple((name, tuple(value) if isinstance(value, list) else value)
                    for name, value in fields.items() if name not in ("tokens", "cost"))
        record = _COUNTED_NOTHING.get(key)
    except TypeError:  # a value that is no key (a map)
        return TurnRecord(**fields)
    if record is None:
        record = TurnRecord(**fields)
        _COUNTED_NOTHING[key] = record
        _RECENT.append(record)
    return record


#: The fields of a model selection a turn record carries (pi-materia's ``UsageTurn``).
SELECTION_FIELDS = ("requestedModel", "requestedThinking", "effectiveModel", "effectiveThinking",
                    "modelFallbackReason", "thinkingFallbackReason", "fallbackReason", "modelExplicit",
                    "thinkingExplicit", "source")


def is_subscription(*names: str | None) -> bool:
    """pi-materia's rule: a provider, api, model or requested model that contains ``openai-codex``
    or starts with ``codex/`` (in any case) is billed by subscription, not per token. Asked twice a
    turn with the same few names: answered once per set of names (a function of them alone)."""
    try:
        return _subscription(names)
    except TypeError:  # a name that cannot be a key (no str: it names no subscription either)
        return _names_a_subscription(names)


def _names_a_subscription(names: tuple[Any, ...]) -> bool:
    return any(isinstance(n, str) and ("openai-codex" in n.lower() or n.lower().startswith("codex/")) for n in names)


_subscription = functools.lru_cache(maxsize=256)(_names_a_subscription)


_NEW = object.__new__
_SET_ATTR = object.__setattr__


class UsageReport(BaseModel):
    """The ``usage.json`` document (camelCase on purpose: it is written as is).

    ``model``/``provider``/``api``/``thinkingLevel`` are the latest turn's that reported them.
    ``costKind``: ``subscription`` (and it stays so) once a turn's or a selection's model is one
    :func:`is_subscription` names, else ``actual`` -- pi-materia's rule. ``costEstimated`` (castor's
    own) is true once any turn's cost was not the provider's billed figure (Pi marks a catalog
    estimate ``cost.totalFromProvider: false``; a usage map without the marker, or a turn that
    reported no usage at all, counts as an estimate).
    ``modelSelections``: one record per materia model application (:func:`model_selection`).
    """

    tokens: Amounts = Field(default_factory=Amounts)
    cost: Amounts = Field(default_factory=Amounts)
    model: str | None = None
    provider: str | None = None
    api: str | None = None
    thinkingLevel: str | None = None
    costKind: CostKind = "actual"
    costEstimated: bool = False
    bySocket: dict[str, TurnUsage] = Field(default_factory=dict)
    byMateria: dict[str, TurnUsage] = Field(default_factory=dict)
    byTask: dict[str, TurnUsage] = Field(default_factory=dict)
    byAttempt: dict[str, TurnUsage] = Field(default_factory=dict)
    turns: list[TurnRecord] = Field(default_factory=list)
    modelSelections: list[dict[str, Any]] = Field(default_factory=list)

    def add_turn(self, record: TurnRecord) -> UsageReport:
        """A new report with ``record`` counted in. Nothing in a report is changed in place (a
        table is copied before an entry is replaced), so the copy is shallow: a deep copy of a
        report grown with its turns cost a transition more than everything else it did."""
        nothing = record.tokens is NO_AMOUNTS and record.cost is NO_AMOUNTS  # a turn that counted nothing
        usage = NO_USAGE if nothing else TurnUsage(tokens=record.tokens, cost=record.cost)
        update: dict[str, Any] = {"turns": [*self.turns, record]}
        # Only what changes is in the update: the texts of the fields it leaves are carried to the new
        # report (``_updated``), so a turn that counted nothing renders none of the totals again.
        for name, value in (("tokens", self.tokens.plus(record.tokens)), ("cost", self.cost.plus(record.cost)),
                            ("costKind", _combined_kind(self.costKind, record.costKind)),
                            ("costEstimated", self.costEstimated or record.costFromProvider is not True)):
            if value is not getattr(self, name) and value != getattr(self, name):
                update[name] = value

        grown: list[tuple[str, str]] = []  # tables grown by an entry at a new key (it goes last)

        def bump(name: str, key: str) -> None:
            cur = getattr(self, name).get(key)
            if nothing and cur is not None:
                return  # adds 0 to an entry there already: the table stands (never changed in place)
            table = dict(getattr(self, name))
            table[key] = usage if cur is None else TurnUsage(tokens=cur.tokens.plus(usage.tokens),
                                                             cost=cur.cost.plus(usage.cost))
            update[name] = table
            if cur is None:
                grown.append((name, key))

        bump("bySocket", record.socket)
        if record.materia:
            bump("byMateria", record.materia)
        if record.taskId:  # an item keyed "" is no task (pi-materia tests the key for truthiness)
            bump("byTask", record.taskId)
            bump("byAttempt", f"{record.taskId}:{record.attempt}")
        for name in MODEL_FIELDS:
            if getattr(record, name) is not None:
                update[name] = getattr(record, name)
        if record.thinking is not None:
            update["thinkingLevel"] = record.thinking
        out = self._updated(update)
        if grown:
            _grow_table_texts(self, out, grown)
        return out

    def _updated(self, update: dict[str, Any]) -> UsageReport:
        """``self.model_copy(update=update)`` (a shallow copy, ``update`` unvalidated, its fields
        marked set) without pydantic's generic copy steps: a report has no extra fields and no
        private attributes, and a cast makes two new reports a transition.

        ``update``'s ``turns`` and ``modelSelections``, when given, extend this report's (their first
        items are this report's): the new report starts from the text of the items already rendered
        here (see :func:`usage_state_json`), so it renders only its new items."""
        out = _NEW(type(self))
        _SET_ATTR(out, "__dict__", {**self.__dict__, **update})
        _SET_ATTR(out, "__pydantic_fields_set__", self.__pydantic_fields_set__ | update.keys())
        _SET_ATTR(out, "__pydantic_extra__", None)
        _SET_ATTR(out, "__pydantic_private__", None)
        rendered = known(self, _LIST_TEXTS)
        if rendered is not None:
            remember(out, _LIST_TEXTS, dict(rendered))
        leading = known(self, _BEFORE_TEXTS)
        if leading:
            # The texts of the fields before the lists that the update leaves as they were (all of
            # them for a selection added with no model named, the benchmark's every transition; all
            # but ``bySocket`` for a turn that counted nothing at a new socket), per part and form.
            changed = update.keys() & _BEFORE_LISTS
            carried = {key: text for key, text in leading.items() if key[1] not in changed
                       and (key[1] != _SCALARS_PART or changed.isdisjoint(_SCALARS))}
            if carried:
                remember(out, _BEFORE_TEXTS, carried)
        return out

    def estimated(self) -> UsageReport:
        """A new report whose cost is marked estimated (``costEstimated``): what
        ``model_copy(update={"costEstimated": True})`` gives, its lists' texts carried over
        (``_updated``) instead of every turn record and selection rendered again."""
        return self._updated({"costEstimated": True})

    def add_selection(self, selection: dict[str, Any]) -> UsageReport:
        """A new report with ``selection`` (a :func:`model_selection` record) appended."""
        update: dict[str, Any] = {"modelSelections": [*self.modelSelections, selection]}
        for name, key in (("model", "model"), ("provider", "provider"), ("api", "api"), ("thinkingLevel", "thinking")):
            if selection.get(key):  # the report names what was asked for until a turn says what answered
                update[name] = selection[key]
        if is_subscription(selection.get("requestedModel"), selection.get("model"), selection.get("provider")):
            update["costKind"] = "subscription"  # in the update: a field set, as an assignment sets it
        return self._updated(update)


_USAGE_SERIALIZER = UsageReport.__pydantic_serializer__
#: The report's lists, rendered item by item (each item once), in the report's field order; every
#: field before the first is rendered whole, as is every field after the last.
_ITEM_LISTS = ("turns", "modelSelections")
_ITEM_SERIALIZERS = {"turns": TurnRecord.__pydantic_serializer__,
                     "modelSelections": TypeAdapter(dict[str, Any]).serializer}
_USAGE_FIELDS = tuple(UsageReport.model_fields)
_FIRST, _LAST = _USAGE_FIELDS.index(_ITEM_LISTS[0]), _USAGE_FIELDS.index(_ITEM_LISTS[-1])
assert _USAGE_FIELDS[_FIRST:_LAST + 1] == _ITEM_LISTS, "the item lists are consecutive fields"
_BEFORE_LISTS = set(_USAGE_FIELDS[:_FIRST])
#: The report's tables (``{key: TurnUsage}``), the last of its fields before its lists: each is
#: rendered from its entries' texts (:func:`_table_text`); the fields before them (``_SCALARS``:
#: the totals, the model names, the cost kind) are rendered whole.
_TABLES = ("bySocket", "byMateria", "byTask", "byAttempt")
assert _USAGE_FIELDS[_FIRST - len(_TABLES):_FIRST] == _TABLES, "the tables are the last fields before the lists"
_SCALARS = _BEFORE_LISTS - set(_TABLES)
_SCALARS_PART = "scalars"
_BEFORE_PARTS = (_SCALARS_PART, *_TABLES)
_TURN_USAGE_SERIALIZER = TurnUsage.__pydantic_serializer__
_KEY_SERIALIZER = TypeAdapter(str).serializer
_AFTER_LISTS = set(_USAGE_FIELDS[_LAST + 1:])
_COMPACT, _INDENTED, _ESCAPED = "compact", "indented", "escaped"
#: The memo name of a report's rendered lists: ``{(list, form): (how many items, their joined text)}``.
_LIST_TEXTS = "usage_list_texts"
#: The memo name of a report's rendered fields before its lists: ``{(form, part): its members' text}``,
#: a part being the scalars or one table (a report made by ``_updated`` starts from its parent's
#: texts of the parts its update left as they were).
_BEFORE_TEXTS = "usage_before_texts"
#: The indentation of an item's lines in ``usage.json`` (an item of a list in the top object).
_ITEM_INDENT = "\n    "
_ITEM_SEPARATOR = ",\n    "


def usage_state_json(report: UsageReport) -> bytes:
    """The report's compact JSON: exactly ``report.__pydantic_serializer__.to_json(report)`` (what
    the report is in the state document), joined from its parts' texts (each derived once, see
    below) at each call, not kept: a cast holds its report between transitions, and the whole text
    beside its lists' texts doubled what a live cast's report kept (bench/casts.py's (b)).

    A report is never changed in place, nor are its turn records and model selections, so each
    is rendered once: a report made by :meth:`UsageReport.add_turn` or
    :meth:`UsageReport.add_selection` joins its parent's rendered items with its new one's text,
    and a cast's transition pays for its new items, not for all.
    """
    return _compact(report)


def usage_file_text(report: UsageReport) -> str:
    """``usage.json``'s text: exactly ``report.model_dump_json(indent=2, exclude_none=True)`` (a
    field with no value left out, as pi-materia's JSON leaves out what is undefined), joined at each
    call from each item's text rendered once (see :func:`usage_state_json`); the engine asks once a
    transition. Its JSON string, for the outbox, is joined from the same pieces' escapes and kept
    with it (one slot for the process: see :func:`usage_file_text_json`)."""
    global _LAST_FILE_TEXT
    text, escaped = _file_texts(report)
    _LAST_FILE_TEXT = (text, escaped)
    return text


#: The latest ``usage.json`` text made and its escape (see usage_file_text_json); no report is
#: kept here (nor its records: a report the engine left behind within its transition is not kept).
_LAST_FILE_TEXT: tuple[str, bytes] | None = None


def usage_file_text_json(text: str) -> bytes | None:
    """``text`` as a JSON string (its quotes included), exactly as pydantic writes it in an effect's
    JSON, when ``text`` is the latest :func:`usage_file_text` made (the same object), else None: a
    cast's outbox carries the ``usage.json`` text written at that transition, and its escaped form
    is joined from each piece's escaped text (each derived once, as the indented text's: per item
    object, per report's part) instead of escaping the whole text at every transition. JSON's
    escaping is character by character, so the pieces' escapes joined are the whole's escape."""
    global _LAST_FILE_TEXT
    last = _LAST_FILE_TEXT
    if last is None or last[0] is not text:
        return None
    _LAST_FILE_TEXT = None  # used once: the slot holds no text past its transition
    return b"".join((b'"', last[1], b'"'))


@functools.lru_cache(maxsize=64)
def _glue(text: str, form: str) -> Any:
    """Fixed text of usage.json's layout in ``form`` (indented: as is; escaped: its JSON escape)."""
    return _escape(text) if form == _ESCAPED else text


def _escape(text: str) -> bytes:
    """``text``'s JSON string escape, without the quotes, as pydantic writes a string."""
    escaped: bytes = _KEY_SERIALIZER.to_json(text)[1:-1]
    return escaped


def _before_lists(report: UsageReport, form: str) -> Any:
    """The members of the report's fields before its lists in ``form`` (compact: their JSON without
    the braces; indented: their lines), from the texts of its parts -- the scalars and totals
    rendered whole by pydantic, each table (:data:`_TABLES`) joined from its entries' texts
    (:func:`_table_text`) -- each derived once per report and carried to a report made from it
    that changed none of that part's fields (see ``_updated``)."""
    texts: dict[tuple[str, str], Any] = derived(report, _BEFORE_TEXTS, dict)
    parts: list[Any] = []
    for part in _BEFORE_PARTS:
        text = texts.get((form, part))
        if text is None:
            if part != _SCALARS_PART:
                text = _table_text(part, getattr(report, part), form)
            elif form == _COMPACT:
                text = _USAGE_SERIALIZER.to_json(report, include=_SCALARS)[1:-1]
            else:
                text = _USAGE_SERIALIZER.to_json(report, indent=2, exclude_none=True, include=_SCALARS).decode()[2:-2]
            texts[form, part] = text
        parts.append(text)
    separator: Any = b"," if form == _COMPACT else ",\n"
    return separator.join(parts)


def _table_text(name: str, table: dict[str, TurnUsage], form: str) -> Any:
    """A table's member of the report's JSON (``"bySocket":{...}``), as pydantic writes it, joined
    from each entry's key and value texts: a value's text is derived once per :class:`TurnUsage`
    object (:data:`NO_USAGE`, the entry of every turn that counted nothing, once per process)."""
    if form == _COMPACT:
        entries = [b"".join((_key_text(key), b":", derived(value, _COMPACT, functools.partial(
            _TURN_USAGE_SERIALIZER.to_json, value)))) for key, value in table.items()]
        return b"".join((b'"', name.encode(), b'":{', b",".join(entries), b"}"))
    if not table:
        return f'  "{name}": {{}}'
    entries_text = ",\n".join(f"    {_key_text(key).decode()}: "
                               f"{derived(value, _INDENTED, functools.partial(_indented_usage, value))}"
                               for key, value in table.items())
    return f'  "{name}": {{\n{entries_text}\n  }}'


def _grow_table_texts(parent: UsageReport, report: UsageReport, grown: list[tuple[str, str]]) -> None:
    """The texts of ``report``'s tables that grew by one entry at a new key (the entry last, as a
    dict keeps insertion order) made from ``parent``'s texts of them with the entry's text added,
    in each form ``parent`` has one, instead of joined again from every entry at the next
    rendering: what :func:`_table_text` joins for the whole table, byte for byte. Nothing more is
    kept than before (a report keeps its tables' texts once rendered); no escape is kept."""
    leading = known(parent, _BEFORE_TEXTS)
    if not leading:
        return
    texts: dict[tuple[str, str], Any] | None = None
    for name, key in grown:
        value = getattr(report, name)[key]
        compact = leading.get((_COMPACT, name))
        indented = leading.get((_INDENTED, name))
        if compact is None and indented is None:
            continue
        if texts is None:
            texts = derived(report, _BEFORE_TEXTS, dict)
        if compact is not None:
            entry = b"".join((_key_text(key), b":", derived(value, _COMPACT, functools.partial(
                _TURN_USAGE_SERIALIZER.to_json, value))))
            # '"name":{}' or '"name":{...}': the entry before the closing brace, after a comma if any
            texts[_COMPACT, name] = b"".join((compact[:-1], b"," if compact[-2:] != b"{}" else b"", entry, b"}"))
        if indented is not None:
            entry_text = (f"    {_key_text(key).decode()}: "
                          f"{derived(value, _INDENTED, functools.partial(_indented_usage, value))}")
            if indented.endswith("{}"):  # '  "name": {}'
                texts[_INDENTED, name] = f'  "{name}": {{\n{entry_text}\n  }}'
            else:  # '  "name": {\n<entries>\n  }'
                texts[_INDENTED, name] = "".join((indented[:-4], ",\n", entry_text, "\n  }"))


def _indented_usage(usage: TurnUsage) -> str:
    """A table entry's value, indented as pydantic indents it at that depth (an entry of a table in
    the top object: its lines after the first 4 spaces in)."""
    return _TURN_USAGE_SERIALIZER.to_json(usage, indent=2).decode().replace("\n", "\n    ")


@functools.lru_cache(maxsize=4096)
def _key_text(key: str) -> bytes:
    """A table key as pydantic writes it (a JSON string)."""
    return _KEY_SERIALIZER.to_json(key)


def _compact(report: UsageReport) -> bytes:
    members = [_before_lists(report, _COMPACT)]
    members += [b"".join([b'"', name.encode(), b'":[', _items_text(report, name, _COMPACT), b"]"])
                for name in _ITEM_LISTS]
    if _AFTER_LISTS:
        members.append(_USAGE_SERIALIZER.to_json(report, include=_AFTER_LISTS)[1:-1])
    return b",".join([member for member in members if member]).join((b"{", b"}"))


def _file_texts(report: UsageReport) -> tuple[str, bytes]:
    # pydantic's indented JSON: each member on its own line, indented by its depth; a nested
    # value's lines are its own indented text's lines indented by the depth it sits at, and an
    # empty list is "[]". A JSON string never holds a raw newline, so every newline is a line's.
    # With it, its JSON escape (bytes): the same pieces, each one's escape (derived with it).
    before = _before_lists(report, _INDENTED)  # its escape in one pass: the tables change with most turns
    texts: list[str] = [before]
    escapes: list[bytes] = [_escape(before)]
    for name in _ITEM_LISTS:
        if name == "turns":
            items, escaped = _turn_texts(report)
        else:
            items, escaped = _items_text(report, name, _INDENTED), _items_text(report, name, _ESCAPED)
        if items:
            texts.append(f'  "{name}": [\n    {items}\n  ]')
            escapes.append(escaped.join((_glue(f'  "{name}": [\n    ', _ESCAPED), _glue("\n  ]", _ESCAPED))))
        else:
            texts.append(f'  "{name}": []')
            escapes.append(_glue(f'  "{name}": []', _ESCAPED))
    if _AFTER_LISTS:  # "{\n" members "\n}", or "{}"
        whole = _USAGE_SERIALIZER.to_json(report, indent=2, exclude_none=True, include=_AFTER_LISTS).decode()[2:-2]
        texts.append(whole)
        escapes.append(_glue(whole, _ESCAPED))
    text = "{\n" + ",\n".join([member for member in texts if member]) + "\n}"
    escaped_text = _glue(",\n", _ESCAPED).join([member for member in escapes if member])
    return text, escaped_text.join((_glue("{\n", _ESCAPED), _glue("\n}", _ESCAPED)))


#: The memo name of a turn record's ``usage.json`` texts: (indented, its JSON escape).
_FILE_FORMS = "usage_file_forms"


def _with_escape(text: str) -> tuple[str, bytes]:
    return text, _escape(text)


def _turn_texts(report: UsageReport) -> tuple[str, bytes]:
    """The report's turns' indented text and its escape, each record's pair derived once per record."""
    texts: list[str] = []
    escapes: list[bytes] = []
    for item in report.turns:
        pair = known(item, _FILE_FORMS)
        if pair is None:
            indented = derived(item, _INDENTED, functools.partial(_indented_item, "turns", item))
            pair = derived(item, _FILE_FORMS, functools.partial(_with_escape, indented))
        texts.append(pair[0])
        escapes.append(pair[1])
    return _ITEM_SEPARATOR.join(texts), _glue(_ITEM_SEPARATOR, _ESCAPED).join(escapes)


def _items_text(report: UsageReport, name: str, form: str) -> Any:
    """The text of the report's list ``name`` in ``form``, its items joined (compact: ``,``;
    indented: ``,`` and a new line, each line indented as an item of a list in ``usage.json``'s top
    object). A turn record's text is derived once per record and kept with it (a record shared by
    casts, :func:`turn_record`, once for all of them); the turns' joined text is joined again at
    each call, not kept with the report: a live cast's report would hold a second copy of every
    record's text (bench/casts.py's (b)). The selections (dicts: no memo of their own) start from
    what the memo holds for the report (its parent's items, see ``_updated``). Escaped (the
    indented text's JSON escape, for the outbox): a record's escape derived once per record, the
    selections' escapes made with their indented texts."""
    items = getattr(report, name)
    render = _compact_item if form == _COMPACT else _indented_item
    separator: Any = b"," if form == _COMPACT else _glue(_ITEM_SEPARATOR, form)
    if name == "turns":  # a record supports a weak reference (a selection, a dict, does not)
        pieces: list[Any] = []
        for item in items:
            piece = known(item, form)
            pieces.append(piece if piece is not None else derived(item, form, functools.partial(render, name, item)))
        return separator.join(pieces)
    texts: dict[tuple[str, str], tuple[int, Any]] = derived(report, _LIST_TEXTS, dict)
    if form == _ESCAPED:  # from the indented texts' escapes, brought along as they are rendered
        indented = _items_text(report, name, _INDENTED)
        count, text = texts.get((name, form), (0, None))
        if count != len(items) or text is None:  # not in step with the indented text: escaped whole
            text = _escape(indented)
            texts[name, form] = (len(items), text)
        return text
    start, text = texts.get((name, form), (0, None))
    if start == len(items) and text is not None:
        return text
    pieces = [render(name, item) for item in items[start:]]
    if form == _INDENTED:  # the new items' escapes too, when the escaped text is at the same item
        escaped_start, escaped_text = texts.get((name, _ESCAPED), (0, None))
        if escaped_start == start and (start == 0 or escaped_text is not None):
            escaped = [_escape(piece) for piece in pieces]
            if start:
                escaped.insert(0, escaped_text)
            texts[name, _ESCAPED] = (len(items), _glue(_ITEM_SEPARATOR, _ESCAPED).join(escaped))
    if start:  # the parent's items' text (none when it had no items)
        pieces.insert(0, text)
    joined: Any = separator.join(pieces)
    texts[name, form] = (len(items), joined)
    return joined


def _compact_item(name: str, item: Any) -> bytes:
    return _ITEM_SERIALIZERS[name].to_json(item)


def _indented_item(name: str, item: Any) -> str:
    return _ITEM_SERIALIZERS[name].to_json(item, indent=2, exclude_none=True).decode().replace("\n", _ITEM_INDENT)


def usage_caveats(report: UsageReport) -> str:
    """What a cast's totals do not say by themselves, for its end notice and its status: `` (estimated;
    2 turns with no price counted as $0)``, or nothing when every cost was the provider's billed figure
    and every turn's usage was counted."""
    def turns(n: int) -> str:
        return f"{n} turn{'s' if n != 1 else ''}"

    notes = ["subscription: no per-token billing" if report.costKind == "subscription"
             else "estimated" if report.costEstimated else ""]
    unreported = [t for t in report.turns if "tokens" in (t.unreported or ())]
    # a turn stopped after earlier steps counts their tokens: only its stopped message's are missing
    partial = sum(1 for t in unreported if t.tokens.total)
    for n, said in ((len(unreported) - partial, "reported no usage"),
                    (partial, f"stopped before {'its' if partial == 1 else 'their'} last message reported usage"),
                    (sum(1 for t in report.turns if "cost" in (t.unreported or ())), "with no price counted as $0")):
        if n:
            notes.append(f"{turns(n)} {said}")
    # a figure past 10^18 is counted as 10^18, not left out: the two are said apart
    n = sum(1 for t in report.turns if any(not note.endswith(CAPPED_NOTE) for note in t.unreadable or ()))
    if n:
        notes.append(f"{turns(n)} with unreadable figures left out")
    n = sum(1 for t in report.turns if any(note.endswith(CAPPED_NOTE) for note in t.unreadable or ()))
    if n:
        notes.append(f"{turns(n)} with figures past 10^18 counted as 10^18")
    shown = [note for note in notes if note]
    return f" ({'; '.join(shown)})" if shown else ""


def _combined_kind(report: CostKind, turn: CostKind) -> CostKind:
    return "subscription" if "subscription" in (report, turn) else "actual"


def turn_cost_kind(*names: str | None) -> CostKind:
    """A turn's cost kind, pi-materia's rule: ``subscription`` by :func:`is_subscription` over its
    model names, else ``actual``."""
    return "subscription" if is_subscription(*names) else "actual"


def cost_from_provider(raw: Any) -> bool | None:
    """Whether a usage map says its cost is the provider's billed figure: Pi's marker
    ``cost.totalFromProvider`` (true, or false for its catalog estimate); None where it says
    nothing."""
    cost = raw.get("cost") if isinstance(raw, dict) else None
    marker = cost.get("totalFromProvider") if isinstance(cost, dict) else None
    return marker if isinstance(marker, bool) else None


def materia_model_selection(*, requested_model: str | None, requested_thinking: str | None, thinking: str | None,
                            thinking_fallback_reason: str | None) -> dict[str, Any]:
    """pi-materia's ``MateriaModelSelection`` of one materia, as castor knows it when it asks for a
    turn: what was requested and what castor applies. ``model`` is the model id and ``provider``
    the part before its ``/`` (``anthropic/claude-test`` -> ``claude-test``, ``anthropic``); a
    blank model is no model (the active Pi model). The one record events and manifest entries carry
    as ``materiaModel`` and ``usage.json`` extends per application (:func:`model_selection`). The
    harness resolves the model against its registry; the model that answered is each turn's
    ``model``/``provider``/``api`` (``effectiveModel`` is castor's request, not a confirmation)."""
    model = (requested_model or "").strip() or None
    provider, _, model_id = (model or "").partition("/")
    configured = bool(model or thinking)
    return {
        "model": (model_id or provider) if model else None,
        "provider": provider if model and model_id else None,
        "api": None,
        "thinking": thinking,
        "requestedModel": model,
        "requestedThinking": requested_thinking,
        "effectiveModel": model,
        "effectiveThinking": thinking,
        "modelFallbackReason": None,
        "thinkingFallbackReason": thinking_fallback_reason,
        "fallbackReason": thinking_fallback_reason,
        "modelExplicit": model is not None,
        "thinkingExplicit": requested_thinking is not None,
        "source": "configured" if configured else "active",
        "label": model or "active Pi model",
    }


def model_selection(*, socket: str, materia: str | None, visit: int, requested_model: str | None,
                    requested_thinking: str | None, thinking: str | None,
                    thinking_fallback_reason: str | None, item_key: str | None = None,
                    attempt: int | None = None) -> dict[str, Any]:
    """The ``usage.json`` record of one materia model application: where it was applied (socket,
    materia, visit, the loop item and its attempt) and the :func:`materia_model_selection` record,
    field for field."""
    return {
        "socket": socket, "materia": materia, "visit": visit, **({"itemKey": item_key} if item_key is not None else {}),
        # pi-materia's key of the selection: the task (the loop item) and its attempt
        **({"taskId": item_key} if item_key is not None else {}),
        **({"attempt": attempt} if attempt is not None else {}),
        **_shared_selection(requested_model, requested_thinking, thinking, thinking_fallback_reason),
    }


@functools.lru_cache(maxsize=256)
def _shared_selection(requested_model: str | None, requested_thinking: str | None, thinking: str | None,
                      thinking_fallback_reason: str | None) -> dict[str, Any]:
    """:func:`materia_model_selection` of these arguments without the fields that have no value (as
    pi-materia's JSON leaves out what is undefined), made once (a function of them alone); only ever
    spread into a new record, never handed out or changed."""
    record = materia_model_selection(requested_model=requested_model, requested_thinking=requested_thinking,
                                     thinking=thinking, thinking_fallback_reason=thinking_fallback_reason)
    return {key: value for key, value in record.items() if value is not None}


def text_or_none(value: Any) -> str | None:
    """``value`` if it is a non-empty string, else None."""
    return value if isinstance(value, str) and value else None


def answering_model(params: dict[str, Any]) -> tuple[str | None, str | None, str | None]:
    """(model, provider, api) of the turn's answer: ``model`` as an id, or as an object
    ``{provider, id (or model), api}``; ``provider``/``api`` beside it fill what the object lacks."""
    model = params.get("model")
    if isinstance(model, dict):
        return (text_or_none(model.get("id")) or text_or_none(model.get("model")),
                text_or_none(model.get("provider")) or text_or_none(params.get("provider")),
                text_or_none(model.get("api")) or text_or_none(params.get("api")))
    return text_or_none(model), text_or_none(params.get("provider")), text_or_none(params.get("api"))


#: How many usage maps of one turn are read (one per assistant message).
MAX_USAGE_MAPS = 1024


def sum_usage_maps(maps: list[Any]) -> dict[str, Any]:
    """Several usage maps as a harness sent them (one per assistant message of a turn, the first
    :data:`MAX_USAGE_MAPS`, the rest named unreadable) as one map in the canonical spellings, each read by
    :func:`extract_usage` (anything unreadable counts 0, and is named under :data:`UNREADABLE_KEY`,
    see :func:`unreadable_figures`); ``cost.totalFromProvider`` true only if every map says so
    (absent when none says either way)."""
    total = TurnUsage()
    flags: list[bool | None] = []
    # maps past the bound are not read (each costs a read): named, so the totals never look complete
    unreadable = ([f"usages=[{len(maps)} maps: the last {len(maps) - MAX_USAGE_MAPS} not read]"]
                  if len(maps) > MAX_USAGE_MAPS else [])
    for raw in maps[:MAX_USAGE_MAPS]:
        unreadable += unreadable_figures(raw) if raw is None or isinstance(raw, dict) else [_note("usage", raw)]
        turn = extract_usage(raw)
        total = TurnUsage(tokens=total.tokens.plus(turn.tokens), cost=total.cost.plus(turn.cost))
        cost = raw.get("cost") if isinstance(raw, dict) else None
        flags.append(cost.get("totalFromProvider") is True if isinstance(cost, dict) and "totalFromProvider" in cost
                     else None)
    tokens = total.tokens.model_dump()
    out: dict[str, Any] = {part: tokens[part] for part in PARTS}
    out["totalTokens"] = tokens["total"]
    out["cost"] = total.cost.model_dump()
    if any(flag is not None for flag in flags):
        out["cost"]["totalFromProvider"] = all(flags)
    if unreadable:
        out[UNREADABLE_KEY] = unreadable[:MAX_UNREADABLE]
    return out


#: The largest usage figure (tokens or USD) castor keeps: a larger report counts as this much, and so
#: does a sum that would pass it. A report of 1e308 tokens summed to infinity, which no JSON can
#: hold: the cast's state could not be saved and the cast was lost. Far above any real cast.
MAX_FIGURE = 1e18


#: The significant digits a usage figure or sum keeps: what a double holds exactly in decimal. A sum
#: of binary floats drifts past them ($0.10 + $0.20 is 0.30000000000000004); kept to 15 digits it
#: is the decimal sum (0.3) in ``usage.json``, the events and every view that shows a figure as is.
FIGURE_DIGITS = 15


def decimal_figure(number: float | int) -> float | int:
    """``number`` kept to :data:`FIGURE_DIGITS` significant digits (an int as it is; a whole float
    as an int, as JavaScript holds it)."""
    if isinstance(number, int):
        return number
    kept = float(f"{number:.{FIGURE_DIGITS}g}")
    return int(kept) if kept.is_integer() else kept


def figure_sum(*figures: float | int) -> float | int:
    """The sum of usage figures: exact for integers, kept to :data:`FIGURE_DIGITS` significant digits
    otherwise (:func:`decimal_figure`), and capped at :data:`MAX_FIGURE` (a sum of huge reported
    figures must stay a finite number the state can be saved with)."""
    total = sum(figures)
    if total >= MAX_FIGURE:
        return MAX_FIGURE
    return decimal_figure(total)


def non_negative_number(value: Any) -> float | None:
    """A finite, non-negative number as a float (at most :data:`MAX_FIGURE`), else None (a usage
    figure that was not reported)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int past a float's range: as large as castor counts
        return MAX_FIGURE if value > 0 else None
    if not math.isfinite(number) or number < 0:
        return None
    if number >= MAX_FIGURE:
        return MAX_FIGURE
    if isinstance(value, int):
        return value  # exact (under the cap)
    return decimal_figure(number)  # 120.0 is 120, as JavaScript holds it; Pi's drifted total is its decimal


#: A cost written as a string that is read as a number: exactly a non-negative decimal -- ASCII
#: digits with at most one point, no sign, exponent, space, separator or unit -- of at most
#: :data:`MAX_DECIMAL_COST_CHARS` characters (``"0.25"``, ``"3"``, ``".5"``; not ``"NaN"``,
#: ``"1e400"``, ``" 0.25"``, ``"$0.25"``, ``"-1"``).
DECIMAL_COST = re.compile(r"[0-9]+(?:\.[0-9]*)?|\.[0-9]+")
MAX_DECIMAL_COST_CHARS = 64


def cost_figure(value: Any) -> float | None:
    """A cost figure: a number as :func:`non_negative_number` reads it, or a string that is exactly
    a non-negative decimal (:data:`DECIMAL_COST`; some providers and proxies send their cost so) as
    that number; else None. Token counts are never read from strings: through Pi a string count has
    already turned the total into a concatenation."""
    if isinstance(value, str):
        if len(value) > MAX_DECIMAL_COST_CHARS or not DECIMAL_COST.fullmatch(value):
            return None
        return non_negative_number(float(value))
    return non_negative_number(value)


#: How a figure is read: :func:`non_negative_number` (tokens) or :func:`cost_figure` (costs).
Reader = Callable[[Any], float | None]


def _first(raw: Any, names: tuple[str, ...], read: Reader = non_negative_number) -> float | None:
    if not isinstance(raw, dict):
        return None
    for name in names:
        given = raw.get(name)
        if given is None:  # absent or null: not reported, nothing to read (most of the aliases, every turn)
            continue
        value = read(given)
        if value is not None:
            return value
    return None


#: Google's (Gemini's) token names, read as Pi maps them, at the top level of a usage map or inside
#: its ``usageMetadata`` (Google's response field): input ``promptTokenCount`` less the cached ones,
#: plus ``toolUsePromptTokenCount`` (the prompt of a tool call Gemini made itself, billed as input and
#: counted apart from ``promptTokenCount``; Pi leaves it out), output ``candidatesTokenCount`` plus
#: ``thoughtsTokenCount`` (billed as output), cache-read ``cachedContentTokenCount``, total
#: ``totalTokenCount``.
GOOGLE_TOKEN_NAMES = ("promptTokenCount", "candidatesTokenCount", "thoughtsTokenCount", "cachedContentTokenCount",
                      "toolUsePromptTokenCount", "totalTokenCount")
#: Where OpenAI nests its cached (cache-read) tokens: Chat Completions', then the Responses API's.
OPENAI_TOKEN_DETAILS = ("prompt_tokens_details", "input_tokens_details")
#: Where Anthropic splits its cache-write tokens by cache lifetime (``ephemeral_5m_input_tokens``,
#: ``ephemeral_1h_input_tokens``: every ``*_input_tokens`` figure in it counts).
ANTHROPIC_CACHE_CREATION = "cache_creation"


def _anthropic_cache_writes(raw: dict[str, Any]) -> float | None:
    """The sum of the ``*_input_tokens`` figures of Anthropic's nested :data:`ANTHROPIC_CACHE_CREATION`
    object, when ``raw`` gives no cache-write count of its own (every such name absent or null);
    None when there is no such object or it holds no figure."""
    nested = raw.get(ANTHROPIC_CACHE_CREATION)
    if not isinstance(nested, dict) or any(raw.get(name) is not None for name in TOKEN_ALIASES["cacheWrite"]):
        return None
    figures = [non_negative_number(value) for key, value in nested.items()
               if isinstance(key, str) and key.endswith("_input_tokens")]
    counted = [figure for figure in figures if figure is not None]
    return figure_sum(*counted) if counted else None


#: Cohere v2's usage: ``billed_units`` (what Cohere charges) and ``tokens`` (what the model read and
#: wrote, Cohere's own prompt template included), each ``{input_tokens, output_tokens}``.
COHERE_BILLED, COHERE_TOKENS = "billed_units", "tokens"
COHERE_PARTS = (("input", "input_tokens"), ("output", "output_tokens"))
#: Codex's names of its cached input tokens (``token_count``'s ``cached_input_tokens``; the app
#: server's ``cachedInputTokens``): a part of its input tokens, as in all of OpenAI's reporting.
CODEX_CACHED_INPUT = ("cachedInputTokens", "cached_input_tokens")


def _cohere_sources(raw: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Cohere's usage objects in ``raw``, billed units first, when ``raw`` names no input or output
    count of its own (its own names win); empty otherwise."""
    sources = [(name, raw[name]) for name in (COHERE_BILLED, COHERE_TOKENS) if isinstance(raw.get(name), dict)]
    if sources and any(name in raw for part in ("input", "output") for name in TOKEN_ALIASES[part]):
        return []
    return sources


def _cohere_usage(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` with Cohere v2's input and output counts under castor's names: each from the billed
    units when they give it (what the turn cost: ``tokens`` also counts the prompt Cohere adds itself,
    unbilled), else from ``tokens``; ``tokens`` (an object, no total) dropped; and, with no total
    given, the total made of input and output (Cohere's ``cached_tokens`` are prompt tokens, inside
    its input). ``raw`` as it is when it is no Cohere usage."""
    sources = _cohere_sources(raw)
    lifted: dict[str, Any] = {}
    for part, name in COHERE_PARTS:
        figure = next((f for f in (non_negative_number(src.get(name)) for _, src in sources) if f is not None), None)
        if figure is not None:
            lifted[part] = figure
    if not lifted:
        return raw
    out = {key: value for key, value in raw.items() if key != COHERE_TOKENS or not isinstance(value, dict)}
    if _first(out, TOTAL_TOKEN_ALIASES) is None:
        lifted["totalTokens"] = figure_sum(*lifted.values())
    return {**out, **lifted}


def _cohere_unread(raw: dict[str, Any]) -> list[str]:
    """Cohere's input or output counts given (in its billed units or ``tokens``) where neither gives a
    usage figure: ``billed_units.input_tokens=…`` each (:func:`_note`)."""
    sources = _cohere_sources(raw)
    out: list[str] = []
    for _, name in COHERE_PARTS:
        given = [(f"{where}.{name}", src[name]) for where, src in sources if src.get(name) is not None]
        if given and all(non_negative_number(value) is None for _, value in given):
            out.append(_note(*given[0]))
    return out


def _nested_unread(raw: dict[str, Any]) -> list[str]:
    """The figures of the provider shapes :func:`provider_usage` reads (Google's, OpenAI's nested
    cached tokens, Anthropic's nested cache writes) that were given but are not usage figures, where
    that shape is read: ``usageMetadata.promptTokenCount=false`` each (:func:`_note`)."""
    def bad(value: Any) -> bool:
        return value is not None and non_negative_number(value) is None

    out: list[str] = []
    meta = raw.get("usageMetadata")
    google, prefix = (meta, "usageMetadata.") if isinstance(meta, dict) else (raw, "")
    given = [name for name in GOOGLE_TOKEN_NAMES if bad(google.get(name))]  # the cheap test first
    if given and not any(name in raw for names in TOKEN_ALIASES.values() for name in names):
        out += [_note(prefix + name, google[name]) for name in given]
    details = [(field, raw[field]) for field in OPENAI_TOKEN_DETAILS
               if isinstance(raw.get(field), dict) and bad(raw[field].get("cached_tokens"))]
    if details and not any(raw.get(name) is not None for name in TOKEN_ALIASES["cacheRead"]):
        out += [_note(f"{field}.cached_tokens", inner["cached_tokens"]) for field, inner in details]
    nested = raw.get(ANTHROPIC_CACHE_CREATION)
    if isinstance(nested, dict) and not any(raw.get(name) is not None for name in TOKEN_ALIASES["cacheWrite"]):
        out += [_note(f"{ANTHROPIC_CACHE_CREATION}.{key}", value) for key, value in nested.items()
                if isinstance(key, str) and key.endswith("_input_tokens") and bad(value)]
    return out


def _with_codex_total(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` with a total that counts Codex's cached input once: when its cache-read count is read
    from a Codex name (:data:`CODEX_CACHED_INPUT`) and no total is given, the total is input, output
    and cache writes, plus any cached tokens past the input (never less than either figure); the
    parts' sum would count the cached ones twice. ``raw`` as it is otherwise."""
    if not any(name in raw for name in CODEX_CACHED_INPUT):  # the cheap test first
        return raw
    source = next((name for name in TOKEN_ALIASES["cacheRead"] if non_negative_number(raw.get(name)) is not None),
                  None)
    if source not in CODEX_CACHED_INPUT or _first(raw, TOTAL_TOKEN_ALIASES) is not None:
        return raw
    cached = non_negative_number(raw.get(source)) or 0
    counted = {part: _first(raw, TOKEN_ALIASES[part]) or 0 for part in ("input", "output", "cacheWrite")}
    extra = figure_sum(cached, -counted["input"]) if cached > counted["input"] else 0
    return {**raw, "totalTokens": figure_sum(*counted.values(), extra)}


def provider_usage(raw: Any) -> Any:
    """``raw`` with the token counts of provider shapes pi-materia's aliases miss added under castor's
    names, where ``raw`` names no such count itself (its own names always win):

    - Google's (:data:`GOOGLE_TOKEN_NAMES`), read as Pi reads them, when ``raw`` names no token part;
    - OpenAI's nested ``cached_tokens`` (:data:`OPENAI_TOKEN_DETAILS`) as cache-read tokens when
      ``raw`` names none; OpenAI counts them inside its input tokens too, so a total is then the
      input plus the output (the parts' sum would count them twice);
    - Anthropic's nested ``cache_creation`` figures, summed, as cache-write tokens when ``raw``
      gives no cache-write count (:func:`_anthropic_cache_writes`); Anthropic's input tokens leave
      them out, so the parts' sum counts them once;
    - Cohere v2's ``billed_units`` and ``tokens`` (:func:`_cohere_usage`: the billed units win);
    - a total for Codex's cached input (:func:`_with_codex_total`: counted once, inside the input).

    Anything else (not a dict, no such shape) is returned as it is. A figure that is not a usage
    figure counts as not given here."""
    if not isinstance(raw, dict):
        return raw
    raw = _cohere_usage(raw)
    meta = raw.get("usageMetadata")
    google = meta if isinstance(meta, dict) else raw
    named = any(name in raw for names in TOKEN_ALIASES.values() for name in names)
    if not named and any(non_negative_number(google.get(name)) is not None for name in GOOGLE_TOKEN_NAMES):
        def count(name: str) -> float:
            return non_negative_number(google.get(name)) or 0
        prompt, cached = count("promptTokenCount"), count("cachedContentTokenCount")
        uncached = figure_sum(prompt, -cached) if cached <= prompt else prompt
        lifted: dict[str, Any] = {"input": figure_sum(uncached, count("toolUsePromptTokenCount")),
                                  "output": figure_sum(count("candidatesTokenCount"), count("thoughtsTokenCount")),
                                  "cacheRead": cached}
        total = non_negative_number(google.get("totalTokenCount"))
        if total is not None and not any(name in raw for name in TOTAL_TOKEN_ALIASES):
            lifted["totalTokens"] = total
        return {**lifted, **raw}
    cache_writes = _anthropic_cache_writes(raw)
    if cache_writes is not None:
        raw = {**raw, "cacheWrite": cache_writes}
    if any(name in raw for name in TOKEN_ALIASES["cacheRead"]):
        return _with_codex_total(raw)
    for field in OPENAI_TOKEN_DETAILS:
        details = raw.get(field)
        nested = non_negative_number(details.get("cached_tokens")) if isinstance(details, dict) else None
        if nested is None:
            continue
        lifted = {"cacheRead": nested}
        if not any(name in raw for name in TOTAL_TOKEN_ALIASES):
            counted = [_first(raw, TOKEN_ALIASES[part]) for part in ("input", "output")]
            if all(n is not None for n in counted):
                lifted["totalTokens"] = figure_sum(*(n or 0 for n in counted))
        return {**raw, **lifted}
    return raw


def extract_usage(raw: Any) -> TurnUsage:
    """Usage of one assistant turn, read the way pi-materia reads it; anything unreadable counts as 0.

    - tokens: each part from its first present alias (:data:`TOKEN_ALIASES`); the total is the
      provided one (:data:`TOTAL_TOKEN_ALIASES`), else the sum of the parts;
    - cost parts: from the nested ``usage.cost`` object (:data:`NESTED_COST_ALIASES`), else from
      the top level (:data:`FLAT_COST_ALIASES`);
    - Google's token names and OpenAI's nested cached tokens as :func:`provider_usage` adds them;
    - cost total: ``max(provided, sum of the parts)`` (a provided total never under-reports), the
      provided one read inside ``usage.cost``, else ``usage.cost`` as a number, else the top level;
    - every cost figure may be a decimal string (:func:`cost_figure`); a token count may not.

    One difference from pi-materia, on purpose: a negative or non-finite figure counts as *not
    reported* (the next alias is tried), so a malformed payload can never lower a cast's total --
    nor can a provided token total made from such a figure: when a token part was given but is not
    counted, the total is at least the sum of the parts that are.
    """
    if not isinstance(raw, dict) or not raw:
        return NO_USAGE  # nothing given (an agent's answer without usage): nothing to look up
    raw = provider_usage(raw)
    tokens = {part: _first(raw, names) or 0 for part, names in TOKEN_ALIASES.items()}
    total = _first(raw, TOTAL_TOKEN_ALIASES)
    parts_sum = figure_sum(*(tokens[p] for p in PARTS))
    if total is None:
        tokens["total"] = parts_sum
    elif any(_unread(raw, names) for names in TOKEN_ALIASES.values()):
        # A part was given but not counted (a negative, a string): a provided total may have been
        # made from it (Pi's ``totalTokens`` is its plain sum: 10 + -5 = 5), so it is no floor; and
        # a ``true`` part added 1 to it there (10 + true = 11), which is taken off again.
        ones = sum(1 for names in TOKEN_ALIASES.values() if _given(raw, names) is True)
        tokens["total"] = min(max(total - ones, parts_sum), MAX_FIGURE)
    else:
        tokens["total"] = total
    nested = raw.get("cost") if isinstance(raw.get("cost"), dict) else None
    cost: dict[str, float] = {}
    for part in PARTS:
        value = _first(nested, NESTED_COST_ALIASES[part], cost_figure)
        if value is None:
            value = _first(raw, FLAT_COST_ALIASES[part], cost_figure)
        cost[part] = value or 0
    provided = _first(nested, NESTED_TOTAL_COST_ALIASES, cost_figure)
    if provided is None:
        provided = cost_figure(raw.get("cost"))
    if provided is None:
        provided = _first(raw, FLAT_TOTAL_COST_ALIASES, cost_figure)
    cost_sum = figure_sum(*(cost[p] for p in PARTS))
    cost["total"] = cost_sum if provided is None else max(provided, cost_sum)
    if all(type(v) is int and v == 0 for v in (*tokens.values(), *cost.values())):
        return NO_USAGE  # counts nothing: the shared figures (a provider that sent no usage)
    return TurnUsage(tokens=Amounts(**tokens), cost=Amounts(**cost))


#: The key of a turn's usage map that says its stopped message reported nothing of its own (it was
#: stopped before its provider said what it used: an OpenAI-style stream reports usage at its end),
#: so the map counts only the turn's earlier messages (tool-call steps). Set to ``true`` by the
#: harness link (``agent.turn_ended`` ``stopped_usage_unknown``) and by :func:`stopped_run_usage`.
STOPPED_UNREPORTED_KEY = "stoppedUnreported"


def stopped_unreported(usage: Any) -> bool:
    """Whether a turn's usage map says its stopped message reported nothing (:data:`STOPPED_UNREPORTED_KEY`)."""
    return isinstance(usage, dict) and usage.get(STOPPED_UNREPORTED_KEY) is True


def stopped_run_usage(answers: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The summed usage (:func:`sum_usage_maps`) of a run's assistant messages, oldest first, each a
    summary ``{stop_reason, usage}``: when the newest was stopped (``aborted``) with a usage that
    counts no tokens (absent, or Pi's zeros), that usage is unknown, not nothing -- it is left out,
    and the sum says so (:data:`STOPPED_UNREPORTED_KEY`), or is None when no other message reported any."""
    usages = [m["usage"] for m in answers if isinstance(m.get("usage"), dict)]
    last = answers[-1] if answers else {}
    stopped = last.get("stop_reason") == "aborted" and extract_usage(last.get("usage")).tokens.total == 0
    if stopped and isinstance(last.get("usage"), dict):
        usages = usages[:-1]
    if not usages:
        return None
    summed = sum_usage_maps(usages)
    if stopped:
        summed[STOPPED_UNREPORTED_KEY] = True
    return summed


#: The key of a usage map under which :func:`sum_usage_maps` keeps what :func:`unreadable_figures`
#: found in the maps it summed (the sum itself holds only numbers).
UNREADABLE_KEY = "unreadable"
#: At most this many unreadable figures are named per turn, each value cut to this many characters.
MAX_UNREADABLE, MAX_UNREADABLE_VALUE = 8, 40


def _note(name: str, value: Any) -> str:
    try:
        shown = json.dumps(value, allow_nan=True, ensure_ascii=False)
    except (TypeError, ValueError):
        shown = type(value).__name__
    return f"{name}={shown if len(shown) <= MAX_UNREADABLE_VALUE else shown[:MAX_UNREADABLE_VALUE] + '…'}"


def _given(raw: dict[str, Any], names: tuple[str, ...]) -> Any:
    """The value of the first of ``names`` given in ``raw`` (not null), or None."""
    return next((raw[name] for name in names if raw.get(name) is not None), None)


#: How a figure past :data:`MAX_FIGURE` is named (:func:`unreadable_figures`): it counts as that much.
CAPPED_NOTE = " (counted as 10^18)"


def _capped(raw: dict[str, Any], prefix: str = "", depth: int = 0) -> list[str]:
    """The figures of a usage map (and of the maps in it, two deep) that are finite numbers past
    :data:`MAX_FIGURE` -- an integer past 2**63 as the wire carries it --, counted as that much:
    ``name=value (counted as 10^18)`` each. A figure castor counts as less than was given is said,
    as one it counts as not given is."""
    out: list[str] = []
    for key, value in raw.items():
        if isinstance(value, dict):
            if depth < 2 and isinstance(key, str):
                out += _capped(value, f"{prefix}{key}.", depth + 1)
        elif (isinstance(value, (int, float)) and not isinstance(value, bool) and isinstance(key, str)
              and value > MAX_FIGURE and (isinstance(value, int) or math.isfinite(value))):
            out.append(_note(prefix + key, value) + CAPPED_NOTE)
        elif (isinstance(value, str) and isinstance(key, str) and _is_cost_name(prefix, key)
              and cost_figure(value) == MAX_FIGURE and float(value) > MAX_FIGURE):
            out.append(_note(prefix + key, value) + CAPPED_NOTE)  # a decimal string cost, read as a number
    return out


_FLAT_COST_NAMES = frozenset(name for names in FLAT_COST_ALIASES.values() for name in names) | frozenset(
    FLAT_TOTAL_COST_ALIASES)


def _is_cost_name(prefix: str, key: str) -> bool:
    """Whether ``prefix + key`` names a cost figure, the only figures read from a decimal string."""
    return prefix == "cost." or (not prefix and (key == "cost" or key in _FLAT_COST_NAMES))


def _unread(raw: Any, names: tuple[str, ...], prefix: str = "", read: Reader = non_negative_number) -> str | None:
    """The first of ``names`` given in ``raw`` with a value that is not a usage figure (a string, a
    negative or non-finite number, a list...), when none of them gives a figure; else None. ``null``
    is how a provider says "not reported": never noted."""
    if not isinstance(raw, dict) or _first(raw, names, read) is not None:
        return None
    for name in names:
        value = raw.get(name)
        if value is not None:
            return _note(prefix + name, value)
    return None


def unreadable_usage(name: str, value: Any) -> dict[str, Any]:
    """A usage map for a usage given as something that is not one (a number, a string, a list):
    it counts nothing and names ``value`` under ``name`` as unreadable (:func:`unreadable_figures`),
    so the turn is kept and the user is told its usage could not be read."""
    return {UNREADABLE_KEY: [_note(name, value)]}


def unreadable_figures(raw: Any) -> list[str]:
    """The figures of a usage map that were given but are not finite, non-negative numbers, so
    :func:`extract_usage` counts them as not reported (pi-materia skips them too, without a word):
    ``name=value`` each (the value as JSON, cut), then those past :data:`MAX_FIGURE`, counted as
    that much (:func:`_capped`), at most :data:`MAX_UNREADABLE` in all. What a summed map
    (:func:`sum_usage_maps`) carries under :data:`UNREADABLE_KEY` comes first."""
    if not isinstance(raw, dict) or not raw:
        return []  # nothing given, nothing unreadable
    carried = raw.get(UNREADABLE_KEY)
    out = [n for n in carried if isinstance(n, str)] if isinstance(carried, list) else []
    nested = raw.get("cost") if isinstance(raw.get("cost"), dict) else None
    found: list[str | None] = [_unread(raw, names) for names in TOKEN_ALIASES.values()]
    found += _cohere_unread(raw) + _nested_unread(raw)
    cohere = _cohere_sources(raw)  # Cohere's ``tokens`` object is its breakdown, not a total
    found.append(_unread({k: v for k, v in raw.items() if k != COHERE_TOKENS} if cohere else raw, TOTAL_TOKEN_ALIASES))
    for part in PARTS:
        if (_first(nested, NESTED_COST_ALIASES[part], cost_figure) is None
                and _first(raw, FLAT_COST_ALIASES[part], cost_figure) is None):
            found.append(_unread(nested, NESTED_COST_ALIASES[part], "cost.", cost_figure)
                         or _unread(raw, FLAT_COST_ALIASES[part], read=cost_figure))
    cost = raw.get("cost")
    if (_first(nested, NESTED_TOTAL_COST_ALIASES, cost_figure) is None and cost_figure(cost) is None
            and _first(raw, FLAT_TOTAL_COST_ALIASES, cost_figure) is None):
        bare = _note("cost", cost) if nested is None and cost is not None else None  # a cost that is no number
        found.append(_unread(nested, NESTED_TOTAL_COST_ALIASES, "cost.", cost_figure) or bare
                     or _unread(raw, FLAT_TOTAL_COST_ALIASES, read=cost_figure))
    if nested is not None and not _read_any_cost(nested) and not any(n and n.startswith("cost.") for n in found):
        # a cost object in a form castor does not read ({"amount": 0.5, "currency": "USD"}): it would
        # count $0 without a word; an empty one (or Pi's marker alone) says nothing, as null does
        if any(value is not None for key, value in nested.items() if key != "totalFromProvider"):
            found.append(_note("cost", nested))
    out += [n for n in found if n is not None]
    out += _capped(raw)
    return out[:MAX_UNREADABLE]


def _read_any_cost(nested: dict[str, Any]) -> bool:
    """Whether a ``usage.cost`` object gives any cost figure castor reads (a part or a total)."""
    return any(_first(nested, names, cost_figure) is not None
               for names in (*NESTED_COST_ALIASES.values(), NESTED_TOTAL_COST_ALIASES))


#: A non-finite float as :func:`plain_usage` keeps it: by its JavaScript name, as the Pi extension sends it.
NON_FINITE_NAMES = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def plain_usage(raw: Any, _depth: int = 0) -> Any:
    """``raw`` as plain JSON: a non-finite float kept by its name (``"NaN"``, ``"Infinity"``: a
    string, so it is named unreadable as the Pi extension's are, and the map keeps its other
    figures), values that are not JSON dropped, integers kept at any size, nesting cut at 8 levels."""
    if isinstance(raw, dict):
        if _depth >= 8:
            return {}
        out = {}
        for key, value in raw.items():
            clean = plain_usage(value, _depth + 1)
            if isinstance(key, str) and clean is not _DROP:
                out[key] = clean
        return out
    if isinstance(raw, list):
        return [v for v in (plain_usage(x, _depth + 1) for x in raw[:64]) if v is not _DROP] if _depth < 8 else []
    if raw is None or isinstance(raw, (str, bool, int)):
        return raw  # an integer is JSON at any size (one past a double's range has no math.isfinite)
    if isinstance(raw, float):
        return raw if math.isfinite(raw) else NON_FINITE_NAMES[repr(raw)]
    return _DROP


_DROP = object()


class BudgetCheck(BaseModel):
    percent: float | int
    warn: bool
    limit_hit: bool
    over_token: bool
    over_cost: bool
    stop: bool


def _ratio(used: float, limit: float | None) -> float:
    """``used / limit``, 0 for an unset limit or a limit of 0 (pi-materia's ``maxTokens ? … : 0``:
    a 0 limit is reached at once -- see ``over_token`` -- but has no percentage to warn at)."""
    if not limit:
        return 0.0
    return used / limit


def check_budget(budget: Budget, report: UsageReport, *, already_warned: bool) -> BudgetCheck:
    """Where ``report`` stands against ``budget``: the percentage used (the larger of tokens and
    cost), whether to warn now (once, at ``warnAtPercent``), and whether a limit is hit."""
    tokens_ratio = _ratio(report.tokens.total, budget.max_tokens)
    cost_ratio = _ratio(report.cost.total, budget.max_cost_usd)
    # finite (it is written in an event), and decimal: $0.30 of $0.40 is 75%, not the binary
    # 74.99999999999999 that never reached a warnAtPercent of 75; 75, not 75.0, as JavaScript writes it
    ratio = max(tokens_ratio, cost_ratio)
    # no limit set (or nothing used): 0, as decimal_figure keeps it, without formatting the float
    percent = decimal_figure(min(ratio * 100, MAX_FIGURE)) if ratio else 0
    warn_at = budget.warn_at_percent if budget.warn_at_percent is not None else DEFAULT_WARN_AT_PERCENT
    # A limit of 0 is a limit (pi-materia: ``maxTokens !== undefined && total >= maxTokens``): the
    # first completion reaches it. Only an unset limit is none.
    over_token = budget.max_tokens is not None and report.tokens.total >= budget.max_tokens
    over_cost = budget.max_cost_usd is not None and report.cost.total >= budget.max_cost_usd
    limit_hit = over_token or over_cost
    # Built without validation (a check on every socket's completion): every value is made here,
    # a bool or the percentage (an int or a float), exactly what validation would keep.
    return built(
        BudgetCheck,
        percent=percent,
        warn=(not already_warned) and (budget.max_tokens is not None or budget.max_cost_usd is not None)
        and percent >= warn_at,
        limit_hit=limit_hit,
        over_token=over_token,
        over_cost=over_cost,
        stop=limit_hit and budget.stop_at_limit is not False,
    )
