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

from loguru import logger

_HUMAN = (
    "<green>{time:HH:mm:ss.SSS}</green> <level>{level: <7}</level> "
    "<cyan>{extra[actor]}</cyan> {message}"
)


def configure_logging(level: str | None = None, *, json: bool | None = None, sink=None) -> None:
    """Replace loguru's default handler with castor's (idempotent)."""
    level = (level or os.environ.get("CASTOR_LOG_LEVEL") or "WARNING").upper()
    if json is None:
        json = os.environ.get("CASTOR_LOG_JSON", "") in ("1", "true", "yes")
    logger.remove()
    logger.configure(extra={"actor": "-", "msg_type": "-"})
    logger.add(
        sink or sys.stderr,
        level=level,
        format="{message}" if json else _HUMAN,
        serialize=bool(json),
        backtrace=False,
        diagnose=False,
        enqueue=False,
    )
