"""Loadout graphs: normalization, preparation (generators + loop materialization), validation.

All functions work on plain JSON dicts (the shape of the config file) so that their output is
exactly what a saved config would contain. They never mutate their input.

- :func:`normalize_loadout` — legacy ``next`` → trailing ``always`` edge; ``when`` aliases
  (absent, ``""``, ``"flow"``, ``"Flow"``) → ``always``; missing ``entry`` → first socket;
  ``layout.sockets`` rebuilt from the sockets that exist (stale entries dropped, a legacy
  per-socket ``layout`` moved there); ``socketKind`` derived. Idempotent.
- :func:`prepare_loadout` — normalize, then generator socket normalization, loop consumer
  reconciliation, loop materialization from ``consumes``/``exit`` and the legacy exit shim.
  Idempotent: preparing a prepared loadout changes nothing. Conflicts come back as issues.
- :func:`validate_graph` — the graph rules with pi-materia's codes. Cycles are allowed.
"""

from __future__ import annotations

import copy
import re
from collections import Counter
from collections.abc import Callable
from typing import Any

from castor.domain.jsontext import json_kind, json_shown
from castor.domain.materia.config import (
    EDGE_CONDITIONS,
    END,
    SOCKET_ID_PATTERN,
    ConfigIssue,
    is_plain_object,
    object_at,
    pointer,
)

SOCKET_ID_RE = re.compile(SOCKET_ID_PATTERN)
WHEN_ALIASES = ("", "flow", "Flow")
OPPOSITE = {"satisfied": "not_satisfied", "not_satisfied": "satisfied"}
GUARDED = ("satisfied", "not_satisfied")

# Takes a socket id and whatever the loadout holds under it (a socket object, or not).
GeneratorDetector = Callable[[str, Any], bool]


def is_socket_id(value: Any) -> bool:
    return isinstance(value, str) and SOCKET_ID_RE.fullmatch(value) is not None


def socket_ordinal_text(socket_id: str) -> str | None:
    """The N of ``Socket-N`` as written (an id may have more digits than ``int()`` reads)."""
    match = SOCKET_ID_RE.fullmatch(socket_id)
    return match.group(1) if match else None


def normalize_when(when: Any) -> Any:
    return "always" if when is None or when in WHEN_ALIASES else when


# --------------------------------------------------------------------------- normalization


def normalize_loadout(loadout: dict[str, Any]) -> dict[str, Any]:
    """Canonical graph shape (see module doc). Unknown fields are kept."""
    out = copy.deepcopy(loadout)
    sockets = out.get("sockets")
    if not is_plain_object(sockets):
        return out
    if out.get("entry") is None and sockets:
        out["entry"] = next(iter(sockets))
    for sid, sock in sockets.items():
        if not is_plain_object(sock):
            continue
        if "next" in sock:
            target = sock.pop("next")
            if target is not None:
                edges = sock.get("edges")
                edges = list(edges) if isinstance(edges, list) else []
                edges.append({"when": "always", "to": target})
                sock["edges"] = edges
        if isinstance(sock.get("edges"), list):
            for edge in sock["edges"]:
                if is_plain_object(edge):
                    edge["when"] = normalize_when(edge.get("when"))
        sock["socketKind"] = "entry" if sid == out.get("entry") else "normal"
    _normalize_layout(out, sockets)
    return out


def _socket_layout(value: Any) -> dict[str, Any] | None:
    """``{x?, y?}`` with only the numeric coordinates, or None when it has neither."""
    if not is_plain_object(value):
        return None
    kept = {axis: value[axis] for axis in ("x", "y")
            if isinstance(value.get(axis), (int, float)) and not isinstance(value.get(axis), bool)}
    return kept or None


def _normalize_layout(loadout: dict[str, Any], sockets: dict[str, Any]) -> None:
    """``layout.sockets`` rebuilt from the sockets that exist (as pi-materia does on load and on
    every save): an entry for a socket that is gone is dropped; a legacy per-socket ``layout`` is
    moved here when ``layout.sockets`` has no usable entry for it; only numeric ``x``/``y`` are
    kept; an empty map (and then an empty ``layout``) is removed. Other ``layout`` keys stay."""
    existing = object_at(loadout, "layout")
    current = object_at(existing, "sockets")
    rebuilt: dict[str, Any] = {}
    for sid in sorted(sockets):
        sock = sockets[sid]
        legacy = sock.pop("layout", None) if is_plain_object(sock) else None
        chosen = _socket_layout(current.get(sid)) or _socket_layout(legacy)
        if chosen:
            rebuilt[sid] = chosen
    layout = dict(existing)
    if rebuilt:
        layout["sockets"] = rebuilt
    else:
        layout.pop("sockets", None)
    if layout:
        loadout["layout"] = layout
    else:
        loadout.pop("layout", None)


def default_generator_detector(materia: dict[str, Any]) -> GeneratorDetector:
    """A socket is a generator when it is an agent socket whose materia says ``generator: true``."""

    def detect(_sid: str, sock: Any) -> bool:
        if not is_plain_object(sock) or sock.get("type") != "agent":
            return False
        name = sock.get("materia")
        entry = materia.get(name) if isinstance(name, str) else None
        return is_plain_object(entry) and entry.get("generator") is True

    return detect


def _edges(sock: Any) -> list[dict[str, Any]]:
    if not is_plain_object(sock) or not isinstance(sock.get("edges"), list):
        return []
    return [e for e in sock["edges"] if is_plain_object(e)]


def _into(edge: dict[str, Any], members: set[str] | list[str]) -> bool:
    """Whether ``edge`` leads to one of ``members``: its ``to`` may be anything a file holds (an
    array or an object is no socket, and no key of a set)."""
    target = edge.get("to")
    return isinstance(target, str) and target in members


def _members(loop: Any) -> list[str]:
    if not is_plain_object(loop) or not isinstance(loop.get("sockets"), list):
        return []
    return [m for m in loop["sockets"] if isinstance(m, str)]


def _inbound_generators(
    sockets: dict[str, Any], members: list[str], is_gen: GeneratorDetector
) -> list[tuple[str, int]]:
    """(generator socket, edge index) for each edge from a generator outside the loop into a member."""
    found = []
    for sid, sock in sockets.items():
        if sid in members or not is_gen(sid, sock):
            continue
        for i, edge in enumerate(_edges(sock)):
            if _into(edge, members):
                found.append((sid, i))
    return found


def prepare_loadout(
    loadout: dict[str, Any], materia: dict[str, Any], *, name: str = "", source: str | None = None
) -> tuple[dict[str, Any], list[ConfigIssue]]:
    """Normalize and materialize. Returns the prepared copy and any conflicts."""
    out = normalize_loadout(loadout)
    issues: list[ConfigIssue] = []
    sockets = out.get("sockets")
    loops = out.get("loops")
    if not is_plain_object(sockets):
        return out, issues
    is_gen = default_generator_detector(materia if is_plain_object(materia) else {})
    base = ("loadouts", name) if name else ()

    producing: set[str] = set()
    if is_plain_object(loops):
        for loop in loops.values():
            if not is_plain_object(loop) or not (loop.get("consumes") or loop.get("iterator")):
                continue
            members = _members(loop)
            gens = sorted({sid for sid, _ in _inbound_generators(sockets, members, is_gen)})
            if len(gens) == 1:
                producing.add(gens[0])
                consumes = loop.get("consumes")
                if not is_plain_object(consumes):
                    consumes = {}
                consumes["from"] = gens[0]
                consumes.setdefault("output", "workItems")
                loop["consumes"] = consumes
    for sid, sock in sockets.items():
        if not is_gen(sid, sock):
            continue
        for edge in _edges(sock):
            target = edge.get("to")
            if isinstance(target, str) and is_gen(target, sockets.get(target)):
                producing.update({sid, target})
    for sid in sorted(producing):
        sock = sockets[sid]
        sock["parse"] = "json"
        assign = object_at(sock, "assign")
        assign["workItems"] = "$.workItems"
        sock["assign"] = assign

    if is_plain_object(loops):
        for loop_id, loop in loops.items():
            if is_plain_object(loop):
                issues.extend(_materialize_loop(loop_id, loop, sockets, is_gen, base, source))
    return out, issues


def expected_cursor(consumes: dict[str, Any]) -> str:
    output = consumes.get("output") or "workItems"
    return consumes.get("cursor") or ("workItemIndex" if output == "workItems" else f"{output}Index")


def _upsert_route(loop: dict[str, Any], route: dict[str, Any], *, replace: bool) -> None:
    exits = loop.get("exits")
    exits = list(exits) if isinstance(exits, list) else []
    for i, existing in enumerate(exits):
        if (is_plain_object(existing) and existing.get("from") == route["from"]
                and existing.get("condition") == route["condition"]):
            if replace:
                exits[i] = route
            loop["exits"] = exits
            return
    exits.append(route)
    loop["exits"] = exits


def _materialize_loop(
    loop_id: str,
    loop: dict[str, Any],
    sockets: dict[str, Any],
    is_gen: GeneratorDetector,
    base: tuple[str | int, ...],
    source: str | None,
) -> list[ConfigIssue]:
    issues: list[ConfigIssue] = []
    exit_ = loop.get("exit")
    consumes = loop.get("consumes")
    members = _members(loop)
    if is_plain_object(exit_) and is_plain_object(consumes):
        producer = consumes.get("from")
        exit_when = normalize_when(exit_.get("when"))
        exit_from = exit_.get("from")
        src = sockets.get(exit_from) if isinstance(exit_from, str) else None
        if (isinstance(producer, str) and is_gen(producer, sockets.get(producer)) and isinstance(exit_from, str)
                and is_plain_object(src)):
            exit_["when"] = exit_when
            if exit_when in GUARDED:
                if src.get("parse") is None:
                    src["parse"] = "json"
                elif src["parse"] != "json":
                    issues.append(ConfigIssue(
                        code="invalid-loop", path=pointer(*base, "sockets", exit_from, "parse"), source=source,
                        message=(f"loop \"{loop_id}\" exits from {exit_from} when {exit_when}, but {exit_from} "
                                 f"has parse \"{src['parse']}\": set parse to \"json\" so it can emit the "
                                 "boolean \"satisfied\" field, or make the exit unconditional")))
            target = exit_.get("to", END)
            if _names_socket(target, sockets):
                _upsert_route(loop, {"id": f"exit:{exit_from}:{exit_when}", "from": exit_from,
                                     "condition": exit_when, "targetSocketId": target}, replace=True)
            expected = {"cursor": expected_cursor(consumes),
                        "items": f"state.{consumes.get('output') or 'workItems'}", "when": exit_when}
            advance = src.get("advance")
            if advance is None:
                src["advance"] = dict(expected)
            elif is_plain_object(advance):
                for field in ("cursor", "items", "when"):
                    if advance.get(field) != expected[field]:
                        issues.append(ConfigIssue(
                            code="invalid-loop", path=pointer(*base, "sockets", exit_from, "advance", field),
                            source=source,
                            message=(f"loop \"{loop_id}\": {exit_from} has an existing advance block that "
                                     f"conflicts with the loop exit: {field}: current \"{advance.get(field)}\", "
                                     f"expected \"{expected[field]}\"")))
    # Legacy shim: socket-valued exit.to / advance.done on members become exit routes -- only
    # between sockets that exist (as pi-materia's): a route to or from a missing socket would
    # repeat exit.*'s own problem at an ``exits`` pointer the user's file does not have.
    if is_plain_object(exit_) and _names_socket(exit_.get("to"), sockets) \
            and _names_socket(exit_.get("from"), sockets):
        when = normalize_when(exit_.get("when"))
        _upsert_route(loop, {"id": f"exit:{exit_['from']}:{when}", "from": exit_["from"], "condition": when,
                             "targetSocketId": exit_["to"]}, replace=False)
    for member in members:
        sock = sockets.get(member)
        advance = sock.get("advance") if is_plain_object(sock) else None
        if is_plain_object(advance) and _names_socket(advance.get("done"), sockets):
            when = advance.get("when") if advance.get("when") in EDGE_CONDITIONS else "always"
            _upsert_route(loop, {"id": f"exit:{member}:{when}", "from": member, "condition": when,
                                 "targetSocketId": advance["done"]}, replace=False)
    return issues


def _names_socket(target: Any, sockets: dict[str, Any]) -> bool:
    """True when ``target`` is the id of a socket of the loadout (``"end"`` is none)."""
    return isinstance(target, str) and target != END and target in sockets


# --------------------------------------------------------------------------- validation


def issues_once(prepared: list[ConfigIssue], validated: list[ConfigIssue]) -> list[ConfigIssue]:
    """A loadout's problems, each reported once: the issues of :func:`prepare_loadout`, then those
    of :func:`validate_graph` that do not repeat one of them (the same code at the same place:
    a loop exit's parse or advance conflict is found by both, in different words). Each of
    :func:`prepare_loadout`'s issues hides one of :func:`validate_graph`'s at its code and place,
    never more: a second problem at the same place (another loop's conflict) is still reported."""
    unmatched = Counter((issue.code, issue.path) for issue in prepared)
    out = list(prepared)
    for issue in validated:
        key = (issue.code, issue.path)
        if unmatched[key] > 0:
            unmatched[key] -= 1
        else:
            out.append(issue)
    return out


class _Collector:
    def __init__(self, base: tuple[str | int, ...], source: str | None) -> None:
        self.base = base
        self.source = source
        self.issues: list[ConfigIssue] = []

    def add(self, code: str, parts: tuple[str | int, ...], message: str) -> None:
        self.issues.append(ConfigIssue(code=code, path=pointer(*self.base, *parts), message=message,
                                       source=self.source))


def _dotted(parts: tuple[str | int, ...]) -> str:
    text = ""
    for p in parts:
        text += f"[{p}]" if isinstance(p, int) else (f".{p}" if text else str(p))
    return text


def validate_graph(
    loadout: Any,
    *,
    name: str = "",
    source: str | None = None,
    generator_detector: GeneratorDetector | None = None,
) -> list[ConfigIssue]:
    """Validate one (normalized) loadout graph. Returns every issue; empty means valid.

    ``generator_detector`` is given at resolve time only; it enables the inbound generator
    edge count (exactly one edge from a generator outside the loop into it).
    """
    col = _Collector(("loadouts", name) if name else (), source)
    if not is_plain_object(loadout):
        col.add("not-an-object", (), f"loadout \"{name}\" must be an object (entry, sockets, loops), "
                                     f"not {json_kind(loadout)}")
        return col.issues
    sockets = loadout.get("sockets")
    if sockets is not None and not is_plain_object(sockets):
        col.add("not-an-object", ("sockets",), f"loadout \"{name}\": \"sockets\" must be an object mapping socket "
                                               f"ids (Socket-N) to sockets, not {json_kind(sockets)}")
        return col.issues
    if not sockets:
        col.add("missing-endpoint", ("sockets",), f"loadout \"{name}\" needs a non-empty \"sockets\" object")
        return col.issues

    def check_target(target: Any, parts: tuple[str | int, ...], *, required: bool) -> bool:
        """True when the target is fine. ``"end"`` is always accepted."""
        where = _dotted(parts[1:] if parts[:1] == ("sockets",) else parts)  # messages name the socket
        if target is None:
            if required:
                col.add("missing-endpoint", parts, f"{where} is missing a target")
                return False
            return True
        if target == END:
            return True
        if not is_socket_id(target):
            col.add("invalid-socket-id", parts,
                    f"{where}: \"{target}\" is not a canonical socket id (Socket-N, N >= 1) or \"end\"")
            return False
        if target not in sockets:
            col.add("unknown-endpoint", parts, f"{where}: unknown socket \"{target}\"")
            return False
        return True

    for sid in sockets:
        if not is_socket_id(sid):
            col.add("invalid-socket-id", ("sockets", sid),
                    f"sockets.{sid}: \"{sid}\" is not a canonical socket id (expected Socket-N, N >= 1)")
    entry = loadout.get("entry")
    if entry is None:
        col.add("missing-endpoint", ("entry",), "entry is missing")
    elif not is_socket_id(entry):
        col.add("invalid-socket-id", ("entry",), f"entry: \"{entry}\" is not a canonical socket id (Socket-N)")
    elif entry not in sockets:
        col.add("unknown-endpoint", ("entry",), f"entry: unknown socket \"{entry}\"")

    for sid, sock in sockets.items():
        if not is_plain_object(sock):
            col.add("invalid-socket", ("sockets", sid), f"socket {sid} must be an object (type, materia or "
                                                        f"utility, edges), not {json_kind(sock)}")
            continue
        ok = True
        if "next" in sock:
            ok &= check_target(sock["next"], ("sockets", sid, "next"), required=False)
        for block in ("foreach", "advance"):
            if is_plain_object(sock.get(block)):
                ok &= check_target(sock[block].get("done"), ("sockets", sid, block, "done"), required=False)
        raw_edges = sock.get("edges", [])
        if raw_edges is not None and not isinstance(raw_edges, list):
            col.add("invalid-socket", ("sockets", sid, "edges"),
                    f"{sid}.edges must be an array of {{when, to}} objects, not {json_kind(raw_edges)}")
            continue
        edges = raw_edges or []
        for i, edge in enumerate(edges):
            if not is_plain_object(edge):
                col.add("invalid-socket", ("sockets", sid, "edges", i),
                        f"{sid}.edges[{i}] must be an object {{when, to}}, not {json_kind(edge)}")
                ok = False
                continue
            ok &= check_target(edge.get("to"), ("sockets", sid, "edges", i, "to"), required=True)
        if not ok:
            continue
        seen_always = False
        for i, edge in enumerate(edges):
            when = normalize_when(edge.get("when"))
            if when not in EDGE_CONDITIONS:
                col.add("invalid-edge-condition", ("sockets", sid, "edges", i, "when"),
                        f"{sid}.edges[{i}].when: unsupported condition {json_shown(edge.get('when'))} "
                        f"(one of {', '.join(EDGE_CONDITIONS)})")
                continue
            if seen_always:
                col.add("unreachable-edge", ("sockets", sid, "edges", i),
                        f"{sid}.edges[{i}] is unreachable: an earlier \"always\" edge always matches")
            if when == "always":
                seen_always = True

    loops = loadout.get("loops")
    if loops is not None and not is_plain_object(loops):
        col.add("invalid-loop", ("loops",), "loops must be an object")
    elif is_plain_object(loops):
        for loop_id, loop in loops.items():
            _validate_loop(col, loop_id, loop, sockets, check_target, generator_detector)
    return col.issues


def _validate_loop(col: _Collector, loop_id: str, loop: Any, sockets: dict[str, Any],
                   check_target: Callable[..., bool], is_gen: GeneratorDetector | None) -> None:
    at = ("loops", loop_id)
    label = f"loops.{loop_id}"
    if not is_plain_object(loop):
        col.add("invalid-loop", at, f"{label} must be an object")
        return
    raw_members = loop.get("sockets")
    if not isinstance(raw_members, list) or not raw_members:
        col.add("invalid-loop", (*at, "sockets"), f"{label}.sockets must be a non-empty array of socket ids")
        return
    members_ok = True
    for i, member in enumerate(raw_members):
        members_ok &= check_target(member, (*at, "sockets", i), required=True) and member != END
        if member == END:  # pi-materia's code: "end" is not a socket id
            col.add("invalid-socket-id", (*at, "sockets", i),
                    f"{label}.sockets[{i}]: \"end\" is not a socket id and cannot be a loop member")
    members = [m for m in raw_members if isinstance(m, str)]

    consumes = loop.get("consumes")
    consumes_ok = True
    if consumes is not None:
        if not is_plain_object(consumes):
            col.add("invalid-loop", (*at, "consumes"), f"{label}.consumes must be an object")
            consumes_ok = False
        else:
            frm = consumes.get("from")
            if frm is None:
                col.add("missing-endpoint", (*at, "consumes", "from"), f"{label}.consumes.from is missing")
                consumes_ok = False
            else:
                consumes_ok &= check_target(frm, (*at, "consumes", "from"), required=True) and frm != END
            check_target(consumes.get("done"), (*at, "consumes", "done"), required=False)
    iterator = loop.get("iterator")
    if is_plain_object(iterator):
        check_target(iterator.get("done"), (*at, "iterator", "done"), required=False)

    exit_ = loop.get("exit")
    exit_ok = False
    if exit_ is not None:
        if not is_plain_object(exit_):
            col.add("invalid-loop", (*at, "exit"), f"{label}.exit must be an object")
        else:
            exit_ok = check_target(exit_.get("to", END), (*at, "exit", "to"), required=False)
            frm = exit_.get("from")
            if frm is None:
                col.add("missing-endpoint", (*at, "exit", "from"), f"{label}.exit.from is missing")
                exit_ok = False
            elif check_target(frm, (*at, "exit", "from"), required=True):
                if frm not in members:
                    col.add("invalid-loop", (*at, "exit", "from"),
                            f"{label}.exit.from: \"{frm}\" is not a member of the loop")
                    exit_ok = False
            else:
                exit_ok = False
            if normalize_when(exit_.get("when")) not in EDGE_CONDITIONS:
                col.add("invalid-edge-condition", (*at, "exit", "when"),
                        f"{label}.exit.when: unsupported condition {json_shown(exit_.get('when'))}")
                exit_ok = False

    exits = loop.get("exits")
    if exits is not None:
        if not isinstance(exits, list):
            col.add("invalid-loop", (*at, "exits"), f"{label}.exits must be an array")
        else:
            ids: set[str] = set()
            pairs: set[tuple[str, str]] = set()
            for i, route in enumerate(exits):
                rat = (*at, "exits", i)
                if not is_plain_object(route):
                    col.add("invalid-loop", rat, f"{label}.exits[{i}] must be an object")
                    continue
                rid = route.get("id")
                if not isinstance(rid, str) or not rid.strip():
                    col.add("invalid-loop", (*rat, "id"), f"{label}.exits[{i}].id must be a non-empty string")
                elif rid in ids:
                    col.add("invalid-loop", (*rat, "id"), f"{label}.exits[{i}].id \"{rid}\" is duplicated")
                else:
                    ids.add(rid)
                frm = route.get("from")
                if frm is None:
                    col.add("missing-endpoint", (*rat, "from"), f"{label}.exits[{i}].from is missing")
                elif check_target(frm, (*rat, "from"), required=True) and frm not in members:
                    col.add("invalid-loop", (*rat, "from"), f"{label}.exits[{i}].from: \"{frm}\" is not a loop member")
                cond = route.get("condition")
                if cond not in EDGE_CONDITIONS:
                    col.add("invalid-edge-condition", (*rat, "condition"),
                            f"{label}.exits[{i}].condition: unsupported condition {json_shown(cond)}")
                elif isinstance(frm, str):
                    if (frm, cond) in pairs:
                        col.add("invalid-loop", (*rat, "condition"),
                                f"{label}.exits[{i}]: Only one route per condition per loop exit source "
                                f"({frm} {cond})")
                    pairs.add((frm, cond))
                check_target(route.get("targetSocketId"), (*rat, "targetSocketId"), required=True)

    if not (consumes_ok and members_ok and is_plain_object(consumes)):
        return
    member_set = set(members)
    if not _has_cycle(member_set, sockets):
        col.add("invalid-loop", (*at, "sockets"),
                f"{label} must contain a directed cycle among its member sockets")
    if is_gen is not None:
        inbound = _inbound_generators(sockets, members, is_gen)
        if not inbound:
            col.add("invalid-loop", (*at, "consumes", "from"),
                    f"{label} needs exactly one inbound generator edge: found none")
        elif len(inbound) > 1:
            col.add("invalid-loop", (*at, "consumes", "from"),
                    f"{label} needs exactly one inbound generator edge: found {len(inbound)}")
        elif inbound[0][0] != consumes.get("from"):
            col.add("invalid-loop", (*at, "consumes", "from"),
                    f"{label}.consumes.from is \"{consumes.get('from')}\" but the inbound generator edge "
                    f"comes from \"{inbound[0][0]}\"")
    if exit_ok and is_plain_object(exit_):
        _validate_executable_exit(col, label, at, loop, exit_, consumes, sockets, member_set)


def _has_cycle(members: set[str], sockets: dict[str, Any]) -> bool:
    graph: dict[str, list[str]] = {
        m: [e["to"] for e in _edges(sockets.get(m)) if _into(e, members)] for m in members}
    state: dict[str, int] = {}

    def visit(node: str) -> bool:
        state[node] = 1
        for nxt in graph.get(node, []):
            if state.get(nxt) == 1 or (state.get(nxt) is None and visit(nxt)):
                return True
        state[node] = 2
        return False

    return any(state.get(m) is None and visit(m) for m in sorted(members))


def _validate_executable_exit(col: _Collector, label: str, at: tuple[str | int, ...], loop: dict[str, Any],
                              exit_: dict[str, Any],
                              consumes: dict[str, Any], sockets: dict[str, Any], members: set[str]) -> None:
    frm = exit_["from"]
    src = sockets.get(frm)
    if not is_plain_object(src):
        return
    when = normalize_when(exit_.get("when"))
    if when in GUARDED and src.get("parse") is not None and src.get("parse") != "json":
        col.add("invalid-loop", ("sockets", frm, "parse"),
                f"{frm}.parse must be \"json\": loop exit {label} routes on {when}")
    advance = src.get("advance")
    if is_plain_object(advance):
        expected = {"cursor": expected_cursor(consumes),
                    "items": f"state.{consumes.get('output') or 'workItems'}", "when": when}
        for field, value in expected.items():
            if advance.get(field) != value:
                col.add("invalid-loop", ("sockets", frm, "advance", field),
                        f"{frm}.advance.{field}: current \"{advance.get(field)}\", expected \"{value}\" for {label}")
    back = [e for e in _edges(src) if _into(e, members)]
    if not back:
        col.add("invalid-loop", ("sockets", frm, "edges"),
                f"{label}: exit source {frm} has no outgoing route back into loop members")
        return
    conditional = [e for e in back if normalize_when(e.get("when")) in GUARDED]
    opposite = OPPOSITE.get(when)
    if conditional and opposite and not any(normalize_when(e.get("when")) == opposite for e in back):
        col.add("invalid-loop", ("sockets", frm, "edges"),
                f"{label}: exit source {frm} has no {opposite} route back into the loop")
