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

import errno
import json as _json  # ``configure_logging`` takes a ``json`` flag
import os
import sys
import threading
from datetime import datetime, timezone
from typing import Any

from castor._log import LOGGING_SETUP, logger

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


#: The longest message a log line carries, in characters: a longer one (a peer's huge method name, a
#: command's output quoted whole) is cut, and says how long it was, so one record cannot make a line of
#: megabytes that a log shipper splits or drops (each stays one JSON object, with ``--log-json``).
MAX_MESSAGE_CHARS = 16_384


def _cut_long_message(record: Any) -> None:
    """loguru patcher: a message over :data:`MAX_MESSAGE_CHARS` is cut, with how long it was.

    loguru 0.8 also keeps the message as it was given, before any ``{}`` was filled in
    (``record["template"]``, serialized into every JSON line): one over :data:`MAX_TEMPLATE_CHARS`
    is cut the same way, or the line would carry the whole text after all."""
    message = record["message"]
    if len(message) > MAX_MESSAGE_CHARS:
        record["message"] = f"{message[:MAX_MESSAGE_CHARS]}… (cut: {len(message)} characters in all)"
    template = record.get("template")
    if isinstance(template, str) and len(template) > MAX_TEMPLATE_CHARS:
        record["template"] = f"{template[:MAX_TEMPLATE_CHARS]}… (cut: {len(template)} characters in all)"


#: The longest template (the message before its ``{}`` are filled in) a JSON line carries: shorter
#: than a message, since the message beside it already says what the line is about.
MAX_TEMPLATE_CHARS = 1_024


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


class FileSink:
    """castor's log file (``configure_logging(sink=PATH)``: ``castor demo``'s and ``castor soak``'s
    ``<workdir>/*.log``), appended to line by line, unbuffered.

    A file that cannot be written (a full disk, a quota, a failing device) costs the log its lines,
    never the program: each line that does not fit is dropped and counted, one line on stderr says
    so the first time, and the first line that fits again is preceded by a note of how many were
    dropped. (loguru's own file sink printed its record and two tracebacks on stderr for every line
    it could not write, and one more traceback at exit.)"""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self._lock = threading.Lock()
        self._dropped = 0
        self._why = ""
        self._torn = False  # the last failed write left part of its line: start the next on a line of its own

    def _writable_fd(self) -> int | None:
        return self._fd

    def _first_failure(self) -> None:
        _say(f"castor: cannot write the log file {self.path} ({self._why}); its lines are dropped "
             "until it can be written again")

    def write(self, message: str) -> None:
        data = message.encode("utf-8", "backslashreplace")
        with self._lock:
            fd = self._writable_fd()
            if fd is None:
                return
            if self._dropped:
                note = (f"castor: {self._dropped} log lines were dropped: {self.path} could not be written "
                        f"({self._why})\n")
                data = ("\n" if self._torn else "").encode() + note.encode("utf-8", "backslashreplace") + data
            view = memoryview(data)
            try:
                while view:
                    view = view[os.write(fd, view):]
            except OSError as exc:
                self._torn = self._torn or len(view) < len(data)
                if not self._dropped:
                    self._why = f"{errno.errorcode.get(exc.errno or 0, exc.errno)}: {exc.strerror}"
                    self._first_failure()
                self._dropped += 1
                return
            self._dropped, self._torn = 0, False

    def stop(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


class StderrSink(FileSink):
    """The default sink: stderr (``castor serve … 2>>LOG`` puts it on a disk), with the file sink's
    rule. Each record is one ``write`` to the descriptor behind ``sys.stderr`` (after what Python
    buffered there), so a disk that fills mid-line cannot leave a torn line that the next record
    runs on into: the next line that fits starts on a line of its own, after a note of how many
    were dropped. (loguru's stream sink lost a line's tail, and ``--log-json`` got a line that was
    two records and neither JSON.) A ``sys.stderr`` with no descriptor (a test's capture) is
    written as a stream."""

    def __init__(self) -> None:  # no file of its own: nothing opened, nothing to close
        self.path = "stderr"
        self._fd = None
        self._lock = threading.Lock()
        self._dropped = 0
        self._why = ""
        self._torn = False

    def _writable_fd(self) -> int | None:
        stream = sys.stderr
        try:
            fd = stream.fileno()
            stream.flush()  # whatever Python holds for it goes first
        except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both
            return None
        return fd

    def _first_failure(self) -> None:
        pass  # stderr is what failed: the note follows once it takes a line again

    def write(self, message: str) -> None:
        try:
            sys.stderr.fileno()
        except (AttributeError, OSError, ValueError):
            pass
        else:
            super().write(message)
            return
        try:
            sys.stderr.write(message)
            sys.stderr.flush()
        except (AttributeError, OSError, ValueError):
            pass

    def isatty(self) -> bool:  # loguru colours a terminal's lines, as for sys.stderr itself
        try:
            return sys.stderr.isatty()
        except (AttributeError, OSError, ValueError):
            return False

    def stop(self) -> None:
        pass  # fd 2 is the process's, not the sink's


def _say(line: str) -> None:
    """One line on stderr, if stderr can take it (it may be on the same full disk)."""
    try:
        sys.stderr.write(line.translate(_ESCAPES) + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


#: Whether :func:`configure_logging` last chose the JSON log (read by lines castor prints itself).
_LOGGING_AS_JSON = False


def logging_as_json() -> bool:
    """True when the configured log writes one JSON object per line (``--log-json`` / ``CASTOR_LOG_JSON``)."""
    return _LOGGING_AS_JSON


def json_log_line(message: str, *, actor: str, level: str = "INFO", **extra: object) -> str:
    """``message`` as one line of the JSON log, for a line castor prints itself, outside any sink.

    Shaped like the sink's records (``text``, and ``record`` with ``message``, ``level``, ``time`` and
    ``extra`` holding ``actor`` and ``msg_type`` besides ``extra``'s own fields), so a reader of the JSON
    log takes it like any other line; it is printed whatever the log level (it is what castor says
    once it listens, not a log record)."""
    now = datetime.now(timezone.utc).astimezone()
    record = {
        "message": message,
        "level": {"name": level, "no": logger.level(level).no},
        "time": {"repr": str(now), "timestamp": now.timestamp()},
        "extra": {"actor": actor, "msg_type": "-", **extra},
        "process": {"id": os.getpid()},
    }
    return _json.dumps({"text": message + "\n", "record": record}, ensure_ascii=False)


def configure_logging(level: str | None = None, *, json: bool | None = None, sink: Any = None) -> None:
    """Replace loguru's handlers with castor's (idempotent) and turn castor's lines on: imported
    as a library, castor logs nothing until this (or ``logger.enable("castor")``) is called.

    ``level`` (else ``CASTOR_LOG_LEVEL``, else WARNING) and ``CASTOR_LOG_JSON`` are checked
    first: a bad value raises :class:`LogSettingError` and leaves the logging as it was. A ``sink``
    given as a path is a :class:`FileSink` (a file that cannot be opened raises ``OSError``, the
    logging as it was)."""
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
    if isinstance(sink, str | os.PathLike):
        sink = FileSink(sink)  # opened before the old handlers go: a file that cannot be opened changes nothing
    global _LOGGING_AS_JSON
    _LOGGING_AS_JSON = bool(json)
    logger.remove()
    LOGGING_SETUP.debug_dropped = False  # until castor's own handler is in place, at its level
    logger.enable("castor")  # castor's package disables its lines until the program configures logging
    logger.configure(extra={"actor": "-", "msg_type": "-"}, patcher=_cut_long_message)
    logger.add(
        sink or StderrSink(),
        level=level,
        format="{message}" if json else _human_format,
        serialize=bool(json),
        backtrace=False,
        diagnose=False,
        enqueue=False,
    )
    level_no = level if isinstance(level, int) else logger.level(level).no
    LOGGING_SETUP.debug_dropped = level_no > logger.level("DEBUG").no
