"""Render a resolved loadout as readable text (``castor grid``)."""

from __future__ import annotations

from castor.domain.jsontext import js_string
from castor.domain.materia.config import END, RUNTIME_LIMIT_FALLBACK, ResolvedConfig
from castor.shown import one_line


def _fmt_limit(value: object) -> str:
    """A figure as the config would write it (``4000000``, not Python's ``4000000.0``)."""
    return "-" if value is None else js_string(value)


def render_grid(resolved: ResolvedConfig) -> str:
    p = resolved.pipeline
    lines = [
        f"⌘ loadout {p.loadout_name}",
        f"source: {resolved.source or '-'}",
        f"artifactDir: {resolved.artifact_dir}",
        f"limits: maxSocketVisits={resolved.limits.max_socket_visits or RUNTIME_LIMIT_FALLBACK} "
        f"maxEdgeTraversals={resolved.limits.max_edge_traversals or RUNTIME_LIMIT_FALLBACK}",
        f"budget: maxTokens={_fmt_limit(resolved.budget.max_tokens)} "
        f"maxCostUsd={_fmt_limit(resolved.budget.max_cost_usd)} "
        f"warnAt={_fmt_limit(resolved.budget.warn_at_percent)}% "
        f"stopAtLimit={js_string(resolved.budget.stop_at_limit is not False)}",
        f"entry: {p.entry}",
        "",
        "sockets:",
    ]
    for sid, rs in p.sockets.items():
        sock = rs.socket
        if rs.is_agent and rs.materia:
            m = rs.materia
            what = (f"agent {rs.materia_name} tools={m.tools} multiTurn={js_string(m.multi_turn)} "
                    f"model={m.model or '-'} thinking={m.thinking or '-'}"
                    + (" generator=workItems:array<workItem>" if m.generator else ""))
        else:
            what = f"utility {' '.join(sock.command) if sock.command else sock.utility}"
        marker = "▶ " if sid == p.entry else "  "
        lines.append(f"{marker}{sid}: {what} parse={sock.parse or 'text'}")
        if sock.assign:
            lines.append("      assign: " + ", ".join(f"{k}={v}" for k, v in sock.assign.items()))
        if sock.advance:
            a = sock.advance
            lines.append(f"      advance: {a.cursor} over {a.items}" + (f" when {a.when}" if a.when else "")
                         + (f" done {a.done}" if a.done else ""))
        if sock.limits:
            lines.append(f"      limits: maxVisits={_fmt_limit(sock.limits.max_visits)} "
                         f"maxEdgeTraversals={_fmt_limit(sock.limits.max_edge_traversals)} "
                         f"maxOutputBytes={_fmt_limit(sock.limits.max_output_bytes)}")
        for edge in sock.edges:
            cap = f" (max {edge.max_traversals})" if edge.max_traversals is not None else ""
            lines.append(f"      --{edge.when}--> {edge.to}{cap}")
        if not sock.edges:
            lines.append(f"      --> {END}")
    if p.loops:
        lines += ["", "loops:"]
        for loop_id, loop in p.loops.items():
            parts = [f"{loop_id}{' (' + loop.label + ')' if loop.label else ''}: [{', '.join(loop.sockets)}]"]
            if loop.consumes:
                parts.append(f"consumes={loop.consumes.from_}.{loop.consumes.output}")
            if loop.iterator:
                parts.append(f"iterator={loop.iterator.items} as {loop.iterator.as_ or 'item'} "
                             f"cursor {loop.iterator.cursor or '-'}")
            if loop.exit:
                parts.append(f"exit={loop.exit.from_}.{loop.exit.when}->{loop.exit.to}")
            lines.append("  " + " ".join(parts))
            for route in loop.exits:
                lines.append(
                    f"      exit route {route.id}: {route.from_} {route.condition} -> {route.target_socket_id}"
                )
    if resolved.warnings:
        lines += ["", "warnings:"]
        lines += [f"  {w.pointed()}" for w in resolved.warnings]
    # One line each: a name the config chose (a loadout, a materia, a label) with a line break or
    # an escape in it is shown escaped, so it cannot add a line of its own.
    return "\n".join(one_line(line) for line in lines) + "\n"
