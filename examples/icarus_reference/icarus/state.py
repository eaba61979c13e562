"""STAND-IN for ``icarus.state``: module-global session state plus SQLite storage.

Like the real plugin it reads ``FABRIC_DIR``, ``HERMES_AGENT_NAME`` and
``FABRIC_PROJECT_ID`` at import time. Storage: ``STATE_DB_PATH`` if set, else
``$FABRIC_DIR/icarus_reference.sqlite3``.
"""

import json
import os
import sqlite3
import time

from icarus._control import traced

FABRIC_DIR = os.environ.get("FABRIC_DIR") or os.path.expanduser("~/fabric")
AGENT = os.environ.get("HERMES_AGENT_NAME") or "pi-agent"
PROJECT_ID = os.environ.get("FABRIC_PROJECT_ID") or "unknown"
DB_PATH = os.environ.get("STATE_DB_PATH") or os.path.join(FABRIC_DIR, "icarus_reference.sqlite3")

# Module globals the real plugin keeps per worker process.
session_id = ""
exchanges = []
_recall_log = []
_injected_fabric = set()
_conn = None

_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL, agent TEXT, project TEXT, type TEXT,
    summary TEXT, content TEXT, tags TEXT, training_value TEXT DEFAULT 'normal',
    verified TEXT, evidence TEXT, source_tool TEXT, status TEXT, customer_id TEXT);
CREATE TABLE IF NOT EXISTS facts (id INTEGER PRIMARY KEY AUTOINCREMENT, fact TEXT UNIQUE);
CREATE TABLE IF NOT EXISTS exchanges (
    id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL, session_id TEXT, user_message TEXT,
    assistant_response TEXT);
"""


def db():
    global _conn
    if _conn is None:
        directory = os.path.dirname(DB_PATH)
        if directory:
            os.makedirs(directory, exist_ok=True)
        _conn = sqlite3.connect(DB_PATH, timeout=10, isolation_level=None)
        _conn.execute("PRAGMA journal_mode=WAL")
        _conn.executescript(_SCHEMA)
    return _conn


def reset_session(new_session_id=""):
    global session_id
    session_id = new_session_id
    del exchanges[:]
    del _recall_log[:]
    _injected_fabric.clear()


@traced("state")
def log_recall(query, results, source=""):
    _recall_log.append({"query": query, "results": results, "source": source})
    return len(_recall_log)


@traced("state")
def write_entry(type="note", summary="", content="", tags="", training_value="normal",
                verified=None, evidence=None, source_tool=None, status=None, customer_id=None, **_):
    cur = db().execute(
        "INSERT INTO entries (ts, agent, project, type, summary, content, tags, training_value,"
        " verified, evidence, source_tool, status, customer_id) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
        (time.time(), AGENT, PROJECT_ID, type, summary, content, tags, training_value,
         verified, evidence, source_tool, status, customer_id))
    return cur.lastrowid


@traced("state")
def add_fact(fact):
    db().execute("INSERT OR IGNORE INTO facts (fact) VALUES (?)", (fact,))
    return True


def _row(row):
    keys = ("id", "ts", "agent", "project", "type", "summary", "content", "tags", "training_value",
            "verified", "evidence", "source_tool", "status", "customer_id")
    return dict(zip(keys, row))


def search_entries(query, limit=5, agent=None, project=None):
    words = [w for w in str(query).lower().split() if len(w) > 2] or [str(query).lower()]
    clauses = " OR ".join("lower(summary || ' ' || content || ' ' || coalesce(tags,'')) LIKE ?" for _ in words)
    params = ["%" + w + "%" for w in words]
    sql = "SELECT * FROM entries WHERE (%s)" % clauses
    if agent:
        sql += " AND agent = ?"
        params.append(agent)
    if project:
        sql += " AND project = ?"
        params.append(project)
    sql += " ORDER BY ts DESC, id DESC LIMIT ?"
    params.append(int(limit))
    return [_row(r) for r in db().execute(sql, params).fetchall()]


@traced("state")
def recall(query, max_results=5, agent=None, project=None):
    return search_entries(query, max_results, agent, project)


def facts():
    return [r[0] for r in db().execute("SELECT fact FROM facts ORDER BY id").fetchall()]


@traced("state")
def identity():
    return {"fabric_dir": FABRIC_DIR, "agent": AGENT, "project_id": PROJECT_ID, "db_path": DB_PATH}


@traced("state")
def snapshot():
    return json.dumps({"session_id": session_id, "exchanges": len(exchanges), "recalls": len(_recall_log)})
