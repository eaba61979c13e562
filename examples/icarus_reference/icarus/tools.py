"""STAND-IN for ``icarus.tools``: Fabric tool handlers ``fn(args: dict, **kw) -> str`` (JSON)."""

import json

from icarus import state
from icarus._control import traced


def _out(value):
    return json.dumps(value)


@traced("tools")
def fabric_write(args, **kw):
    if not all(str(args.get(k) or "").strip() for k in ("type", "content", "summary")):
        return _out({"error": "Need type, content, and summary"})
    fields = {k: args.get(k) for k in ("type", "summary", "content", "tags", "training_value", "verified",
                                          "evidence", "source_tool", "status", "customer_id") if k in args}
    entry_id = state.write_entry(**fields)
    return _out({"status": "written", "id": entry_id, "path": "sqlite:%s#entries/%s" % (state.DB_PATH, entry_id)})


@traced("tools")
def fabric_recall(args, **kw):
    query = str(args.get("query") or "")
    if not query.strip():
        return _out({"error": "No query provided"})
    entries = state.search_entries(query, int(args.get("max_results") or 5), args.get("agent"), args.get("project"))
    return _out({"query": query, "count": len(entries), "entries": entries})


@traced("tools")
def fabric_search(args, **kw):
    query = str(args.get("query") or "")
    if not query.strip():
        return _out({"error": "No query provided"})
    results = state.search_entries(query, 20)
    return _out({"query": query, "count": len(results), "results": results})


@traced("tools")
def fabric_pending(args, **kw):
    return _out({"open_tasks": [], "reviews_of_my_work": [], "open_tickets": [], "total": 0})


@traced("tools")
def fabric_curate(args, **kw):
    value = args.get("training_value")
    if value not in ("high", "normal", "low"):
        return _out({"error": "training_value must be high, normal or low"})
    cur = state.db().execute("UPDATE entries SET training_value = ? WHERE id = ?", (value, args.get("entry_id")))
    if cur.rowcount == 0:
        return _out({"error": "No entry %s" % args.get("entry_id")})
    return _out({"ok": True, "entry_id": args.get("entry_id"), "training_value": value})


@traced("tools")
def fabric_brief(args=None, **kw):
    rows = state.db().execute("SELECT summary FROM entries ORDER BY id DESC LIMIT 5").fetchall()
    return _out({"agent": state.AGENT, "project": state.PROJECT_ID, "recent": [r[0] for r in rows]})


def _generic(name):
    @traced("tools")
    def handler(args=None, **kw):
        return _out({"ok": True, "tool": name, "args": args or {}})

    handler.__name__ = name
    return handler


fabric_init_obsidian = _generic("fabric_init_obsidian")
fabric_report = _generic("fabric_report")
fabric_telemetry = _generic("fabric_telemetry")
fabric_export = _generic("fabric_export")
fabric_train = _generic("fabric_train")
fabric_train_status = _generic("fabric_train_status")
fabric_models = _generic("fabric_models")
fabric_eval = _generic("fabric_eval")
fabric_switch_model = _generic("fabric_switch_model")
fabric_rollback_model = _generic("fabric_rollback_model")
