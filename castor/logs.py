"""Logging setup: loguru, structured, never on stdout.

Every actor logs through ``logger.bind(actor=<path>, incarnation=<n>)`` and
adds ``msg_type`` for message-related lines. ``configure_logging`` installs
one stderr sink: human-readable by default, one JSON object per line with
``json=True`` (or ``CASTOR_LOG_JSON=1``) for operators. Tracebacks never
include local variable values (``diagnose=False``): locals may hold memory
text or prompts.

stdout is reserved for the msgpack-rpc stream in ``castor serve --stdio``.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from castor._log import logger

_HUMAN = (
    "<green>{time:HH:mm:ss.SSS}</green> <level>{level: <7}</level> "
    "<cyan>{extra[actor]}</cyan> {message}\n{exception}"
)
#: C0 controls and DEL, as escapes: a message holds text a peer chose (a method name, a path), and a
#: newline in it would start a line that reads as castor's own, an ESC would drive the terminal.
_ESCAPES = {code: f"\\x{code:02x}" for code in (*range(32), 127)} | {9: "\\t", 10: "\\n", 13: "\\r"}


def _human_format(record: Any) -> str:
    """The human sink's format: every record is one line (a traceback, castor's own, follows it)."""
    record["message"] = record["message"].translate(_ESCAPES)
    return _HUMAN


LEVELS = ("TRACE", "DEBUG", "INFO", "SUCCESS", "WARNING", "ERROR", "CRITICAL")
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


class LogSettingError(ValueError):
    """A log level or format (flag or environment) castor does not know; the message is one line."""


def parse_level(value: str, *, source: str = "--log-level") -> str:
    """A loguru level name (case-insensitive) or a number 0-50; :class:`LogSettingError` otherwise."""
    text = value.strip().upper()
    if text in LEVELS or (text.isascii() and text.isdigit() and int(text) <= 50):
        return text
    shown = value[:40].encode("unicode_escape", "backslashreplace").decode("ascii")
    raise LogSettingError(f"{source}: unknown log level {shown!r} (expected one of {', '.join(LEVELS)}, "
                          "or a number 0-50)")


def parse_json_flag(value: str, *, source: str = "CASTOR_LOG_JSON") -> bool:
    text = value.strip().lower()
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    shown = value[:40].encode("unicode_escape", "backslashreplace").decode("ascii")
    raise LogSettingError(f"{source}: expected 1/true/yes/on or 0/false/no/off, got {shown!r}")


def configure_logging(level: str | None = None, *, json: bool | None = None, sink: Any = None) -> None:
    """Replace loguru's handlers with castor's (idempotent) and turn castor's lines on: imported
    as a library, castor logs nothing until this (or ``logger.enable("castor")``) is called.

    ``level`` (else ``CASTOR_LOG_LEVEL``, else WARNING) and ``CASTOR_LOG_JSON`` are checked
    first: a bad value raises :class:`LogSettingError` and leaves the logging as it was."""
    if level:
        level = parse_level(level)
    elif os.environ.get("CASTOR_LOG_LEVEL"):
        level = parse_level(os.environ["CASTOR_LOG_LEVEL"], source="CASTOR_LOG_LEVEL")
    else:
        level = "WARNING"
    if json is None:
        json = parse_json_flag(os.environ.get("CASTOR_LOG_JSON", ""))
    if level.isascii() and level.isdigit():
        level = int(level)  # type: ignore[assignment]  # loguru takes a numeric level as well as a name
    logger.remove()
    logger.enable("castor")  # castor's package disables its lines until the program configures logging
    logger.configure(extra={"actor": "-", "msg_type": "-"})
    logger.add(
        sink or sys.stderr,
        level=level,
        format="{message}" if json else _human_format,
        serialize=bool(json),
        backtrace=False,
        diagnose=False,
        enqueue=False,
    )
