"""Utility socket output (spec §7.1) and the built-in utilities (spec §7.2).

Output source precedence, first match wins:

| socket has                                  | output comes from                               |
|---------------------------------------------|-------------------------------------------------|
| ``command``                                 | the command's raw stdout (via the pool)         |
| ``params`` with its own key ``output``      | that value; a string as is, else compact JSON   |
| ``utility`` naming a built-in               | the built-in                                    |
| anything else                               | ``UtilityError`` "Unknown utility alias ..."    |

Built-ins: ``noop`` (""), ``echo`` (``params.output`` else ``text`` else
``message`` else ""; non-strings as JSON), ``project.ensureIgnored`` and
``vcs.detect`` (see their docstrings).

Guarantees and failure behaviour
--------------------------------
- A command's *result* is returned whatever its exit status; the caller
  decides failure with ``command_failure_message`` and writes the command
  artifacts. Only a spawn failure raises (``UtilitySpawnError``).
- Bad built-in params and unknown aliases raise :class:`UtilityError`
  (code ``invalid_config``, ``data.reason``); nothing is written.
- ``project.ensureIgnored`` keeps its file inside the project: the root must
  be the cwd, a directory under it, or the discovered VCS root, and the file
  must be inside that root (else ``Forbidden``). This is stricter than
  pi-materia, which followed any path.
- ``vcs.detect`` runs only ``jj``/``git`` found on ``PATH`` (never a
  project-chosen binary), each with a 2 s deadline and a 1 MiB cap.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from castor.adapters.fs import atomic_write_text
from castor.adapters.materia.artifacts import CastArtifacts, CommandArtifacts
from castor.adapters.materia.utility_runner import (
    RunningUtility,
    UtilityCommand,
    command_failure_message,
    UtilityPool,
    UtilityResult,
    UtilitySpawnError,
    run_command,
)
from castor.messages.errors import CastorError, ErrorCode, Forbidden

__all__ = [
    "BUILTIN_ALIASES",
    "UtilityError",
    "UtilityOutput",
    "UtilitySocketRun",
    "UtilitySpec",
    "ensure_ignored",
    "produce_utility_output",
    "run_utility_socket",
    "run_builtin",
    "vcs_detect",
]

BUILTIN_ALIASES = ("noop", "echo", "project.ensureIgnored", "vcs.detect")
_VCS_TIMEOUT_MS = 2_000


class UtilityError(CastorError):
    """A utility socket that cannot produce output (bad alias or params)."""

    code = ErrorCode.INVALID_CONFIG


class UtilitySpec(BaseModel):
    """The utility fields of a socket (spec §1.6)."""

    model_config = ConfigDict(frozen=True)

    utility: str | None = None
    command: list[str] | None = None
    params: dict[str, Any] | None = None
    timeout_ms: int | None = None


class UtilityOutput(BaseModel):
    """Where a utility socket's output came from, and the command result if one ran."""

    model_config = ConfigDict(frozen=True)

    source: Literal["command", "params.output", "builtin"]
    output: str
    command: UtilityResult | None = None


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(",", ":"))


# --------------------------------------------------------------------------- vcs


def _marker_root(start: Path, marker: str) -> Path | None:
    for directory in (start, *start.parents):
        if (directory / marker).exists():
            return directory
    return None


def _command_root(argv: list[str], cwd: Path) -> Path | None:
    try:
        result = run_command(UtilityCommand(argv=argv, cwd=cwd, timeout_ms=_VCS_TIMEOUT_MS))
    except UtilitySpawnError:
        return None
    text = result.stdout.strip()
    return Path(text) if result.ok and text else None


def vcs_detect(cwd: str | os.PathLike[str]) -> dict[str, Any]:
    """``{kind: jj|git|none, root, available:{jj,git}}`` (spec §7.2)."""
    base = Path(cwd).resolve()
    available = {"jj": shutil.which("jj") is not None, "git": shutil.which("git") is not None}
    roots: dict[str, Path | None] = {}
    for name, marker, argv in (("jj", ".jj", ["jj", "root"]), ("git", ".git", ["git", "rev-parse", "--show-toplevel"])):
        root = _marker_root(base, marker)
        if root is None and available[name]:
            root = _command_root(argv, base)
        roots[name] = root
    kind = "jj" if roots["jj"] else "git" if roots["git"] else "none"
    root = roots.get(kind) if kind != "none" else None
    return {"kind": kind, "root": str(root) if root else None, "available": available}


# --------------------------------------------------------------------------- ensureIgnored


def _patterns(params: dict[str, Any]) -> list[str]:
    raw = params.get("patterns")
    if not isinstance(raw, list) or not raw or not all(isinstance(p, str) and p.strip() for p in raw):
        raise UtilityError(
            "project.ensureIgnored requires params.patterns: a non-empty array of non-blank strings",
            data={"reason": "invalid_params"},
        )
    return [p.strip() for p in raw]


def _inside(path: Path, root: Path) -> bool:
    return path == root or path.is_relative_to(root)


def _ignore_root(params: dict[str, Any], cwd: Path) -> Path:
    vcs_root = _marker_root(cwd, ".jj") or _marker_root(cwd, ".git")
    if "root" not in params or params["root"] is None:
        return vcs_root or cwd
    if not isinstance(params["root"], str) or "\x00" in params["root"]:
        raise UtilityError("params.root must be a string", data={"reason": "invalid_params"})
    root = (cwd / params["root"]).resolve()
    if not (_inside(root, cwd) or root == vcs_root):
        raise Forbidden("params.root leaves the project", data={"reason": "root outside project"})
    return root


def ensure_ignored(params: dict[str, Any], cwd: str | os.PathLike[str]) -> dict[str, Any]:
    """Append missing patterns to an ignore file, idempotently (spec §7.2)."""
    base = Path(cwd).resolve()
    patterns = _patterns(params)
    root = _ignore_root(params, base)
    file_param = params.get("file")
    if file_param is not None and (not isinstance(file_param, str) or "\x00" in file_param):
        raise UtilityError("params.file must be a string", data={"reason": "invalid_params"})
    target = (root / file_param).resolve() if file_param else root / ".gitignore"
    if not _inside(target, root):
        raise Forbidden("params.file leaves the root", data={"reason": "file outside root"})
    existing_text = target.read_text(encoding="utf-8") if target.exists() else ""
    existing = {
        line.strip() for line in existing_text.splitlines() if line.strip() and not line.strip().startswith("#")
    }
    added: list[str] = []
    unchanged: list[str] = []
    for pattern in patterns:
        if pattern in existing:
            if pattern not in unchanged:
                unchanged.append(pattern)
        elif pattern not in added:
            added.append(pattern)
    if added or not target.exists():
        prefix = "" if not existing_text or existing_text.endswith("\n") else "\n"
        addition = "".join(f"{p}\n" for p in added)
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(target, existing_text + prefix + addition)
    return {
        "ok": True,
        "root": str(root),
        "file": str(target),
        "patterns": patterns,
        "added": added,
        "unchanged": unchanged,
    }


# --------------------------------------------------------------------------- dispatch


def _echo(params: dict[str, Any]) -> str:
    if "output" in params:
        return _as_text(params["output"])
    value = params.get("text", params.get("message", ""))
    return _as_text("" if value is None else value)


def run_builtin(alias: str, params: dict[str, Any] | None, *, cwd: str | os.PathLike[str]) -> str:
    """Run a built-in utility by alias and return its output text."""
    params = params or {}
    if alias == "noop":
        return ""
    if alias == "echo":
        return _echo(params)
    if alias == "project.ensureIgnored":
        return _as_text(ensure_ignored(params, cwd))
    if alias == "vcs.detect":
        return _as_text(vcs_detect(cwd))
    raise UtilityError(f'Unknown utility alias "{alias}".', data={"reason": "unknown_alias", "alias": alias})


def produce_utility_output(
    spec: UtilitySpec,
    *,
    socket_id: str,
    input_obj: dict[str, Any],
    cwd: str | os.PathLike[str],
    pool: UtilityPool,
    on_start: Callable[[RunningUtility], None] | None = None,
    queue_timeout_s: float | None = None,
) -> UtilityOutput:
    """Apply §7.1 precedence. Commands run through ``pool`` with ``input_obj`` on stdin."""
    if spec.command:
        cmd_kwargs: dict[str, Any] = {"argv": list(spec.command), "cwd": Path(cwd), "stdin": input_obj}
        if spec.timeout_ms is not None:
            cmd_kwargs["timeout_ms"] = spec.timeout_ms
        result = pool.run(UtilityCommand(**cmd_kwargs), on_start=on_start, queue_timeout_s=queue_timeout_s)
        return UtilityOutput(source="command", output=result.stdout, command=result)
    params = spec.params or {}
    if "output" in params:
        return UtilityOutput(source="params.output", output=_as_text(params["output"]))
    if spec.utility in BUILTIN_ALIASES:
        with pool.slot(queue_timeout_s=queue_timeout_s):
            return UtilityOutput(source="builtin", output=run_builtin(spec.utility, params, cwd=cwd))
    raise UtilityError(
        f'Unknown utility alias "{spec.utility}" for socket "{socket_id}".',
        data={"reason": "unknown_alias", "alias": spec.utility, "socket": socket_id},
    )


class UtilitySocketRun(BaseModel):
    """A utility socket's output plus, for commands, the written artifacts and event data."""

    model_config = ConfigDict(frozen=True)

    source: Literal["command", "params.output", "builtin"]
    output: str
    failure: str | None = None  # spec wording; None = success
    command: UtilityResult | None = None
    artifacts: CommandArtifacts | None = None
    command_event: dict[str, Any] | None = None  # ``data`` of the ``utility_command`` event


def run_utility_socket(
    artifacts: CastArtifacts,
    spec: UtilitySpec,
    *,
    socket_id: str,
    visit: int,
    input_obj: dict[str, Any],
    cwd: str | os.PathLike[str],
    pool: UtilityPool,
    item_key: str | None = None,
    on_start: Callable[[RunningUtility], None] | None = None,
    queue_timeout_s: float | None = None,
) -> UtilitySocketRun:
    """Produce a utility socket's output; for a command, write its three artifacts (spec §7.3 step 4).

    The caller still records the input artifact before, and appends the
    manifest entries and the ``utility_command`` event (``command_event``)
    after. A spawn failure raises ``UtilitySpawnError`` and writes nothing.
    """
    produced = produce_utility_output(
        spec, socket_id=socket_id, input_obj=input_obj, cwd=cwd, pool=pool, on_start=on_start,
        queue_timeout_s=queue_timeout_s,
    )
    result = produced.command
    if result is None:
        return UtilitySocketRun(source=produced.source, output=produced.output)
    written = artifacts.write_command_result(
        socket_id, visit, stdout=result.stdout, stderr=result.stderr, stdout_truncated=result.stdout_truncated,
        stderr_truncated=result.stderr_truncated, max_bytes=result.max_bytes, item_key=item_key,
    )
    event = {
        "socket": socket_id,
        "command": list(result.argv),
        "code": result.exit_code,
        "signal": result.signal_name,
        "timedOut": result.timed_out,
        "timeoutMs": result.timeout_ms,
        "stdoutArtifact": str(written.stdout),
        "stderrArtifact": str(written.stderr),
        "stdoutTruncated": result.stdout_truncated,
        "stderrTruncated": result.stderr_truncated,
    }
    failure = command_failure_message(
        result, socket_id=socket_id, stdout_artifact=str(written.stdout), stderr_artifact=str(written.stderr)
    )
    return UtilitySocketRun(
        source="command", output=result.stdout, failure=failure, command=result, artifacts=written,
        command_event=event,
    )
