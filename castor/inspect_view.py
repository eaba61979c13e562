"""``castor inspect``: the live actor tree and mailboxes of a running runtime."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.tree import Tree

from castor.messages.errors import InvalidParams


def actor_tree(snapshot: dict[str, Any]) -> Tree:
    """Render ``ops.actors`` as a tree with each mailbox's depth and oldest age."""
    root = Tree("[bold]castor actors[/bold]")
    nodes: dict[str, Tree] = {}
    for actor in snapshot.get("actors", []):
        path = actor["path"]
        parent_path = path.rsplit("/", 1)[0]
        parent = nodes.get(parent_path, root)
        nodes[path] = parent.add(_actor_line(actor))
    return root


def _actor_line(actor: dict[str, Any]) -> str:
    box = actor["mailbox"]
    name = escape(actor["path"].rsplit("/", 1)[1])
    age = box.get("oldest_age_s")
    flight = box.get("in_flight")
    parts = [
        f"[cyan]{name}[/cyan] {escape(str(actor['kind']))}",
        _state(actor["state"]),
        f"#{actor['incarnation']}",
        f"depth={box['depth']}",
        f"oldest={age:.3f}s" if age is not None else "oldest=-",
        f"done={box['processed']}",
    ]
    if box.get("failed"):
        parts.append(f"[red]failed={box['failed']}[/red]")
    if actor.get("restarts"):
        parts.append(f"[yellow]restarts={actor['restarts']}[/yellow]")
    if flight:
        parts.append(f"busy={escape(str(flight['message_type']))} {flight['since_s']:.2f}s")
    if actor.get("retired_reason"):  # runtime data, shown as text: never rich markup
        parts.append(f"[magenta]retired: {escape(str(actor['retired_reason']))}[/magenta]")
    return "  ".join(parts)


def _state(state: str) -> str:
    color = {"running": "green", "retired": "magenta", "crashed": "red", "stopped": "dim"}.get(state, "yellow")
    return f"[{color}]{state}[/{color}]"


def mailbox_table(actor: dict[str, Any]) -> Table:
    box = actor["mailbox"]
    table = Table(title=f"mailbox of {actor['path']}")
    table.add_column("field")
    table.add_column("value")
    for key in ("depth", "capacity", "oldest_age_s", "processed", "failed", "rejected", "dead_letters"):
        table.add_row(key, str(box.get(key)))
    table.add_row("in_flight", json.dumps(box.get("in_flight")))
    for type_name, count in sorted(box.get("by_type", {}).items()):
        table.add_row(f"queued {type_name}", str(count))
    return table


def hosts_table(data: dict[str, Any]) -> Table:
    """``ops.hosts``: where casts run (the Ray backend's cast hosts, their nodes and casts)."""
    table = Table(title=f"cast hosts ({data.get('backend')})")
    for column in ("host", "node", "pid", "alive", "sessions", "casts"):
        table.add_column(column)
    for host in data.get("hosts", []):
        table.add_row(host["host_id"], str(host["node_id"])[:12], str(host["pid"]), "yes" if host["alive"] else "no",
                      ", ".join(host["sessions"]), "\n".join(c.rsplit("/", 1)[-1] for c in host["casts"]) or "-")
    return table


def run_inspect(args: argparse.Namespace) -> int:
    from castor.client import Client

    import os

    from castor.endpoint.auth import TOKEN_FILE_ENV

    token_file = getattr(args, "token_file", None) or os.environ.get(TOKEN_FILE_ENV) or None
    client = (Client.connect_unix(args.socket, token_file=token_file) if args.socket
              else Client.connect_tcp(*args.tcp, token_file=token_file))
    console = Console()
    try:
        def fetch() -> Any:
            if args.what == "actors":
                return client.call("ops.actors", {}, timeout=10)
            if args.what == "mailbox":
                if not args.path:
                    raise InvalidParams("inspect mailbox needs an actor PATH")
                return client.call("ops.mailbox", {"path": args.path}, timeout=10)
            if args.what == "hosts":
                return client.call("ops.hosts", {}, timeout=10)
            return client.call("ops.worker", {"session_id": args.session_id}, timeout=10)

        def render(data: Any) -> Any:
            if args.json:
                return json.dumps(data, indent=2)
            if args.what == "actors":
                return actor_tree(data)
            if args.what == "mailbox":
                return mailbox_table(data)
            if args.what == "hosts":
                return hosts_table(data)
            return json.dumps(data, indent=2)

        if not args.follow:
            console.print(render(fetch()))
            return 0
        with Live(render(fetch()), console=console, refresh_per_second=4) as live:
            while True:
                time.sleep(max(0.1, args.interval))  # a refresh period, not synchronisation
                live.update(render(fetch()))
    except KeyboardInterrupt:
        return 0
    finally:
        client.close()
