"""castor's logger: loguru's, with castor's own lines off until the program turns them on.

A library stays quiet in the program that embeds it: importing any castor module that logs
disables loguru's records from the ``castor`` package, so a crash castor handles does not print
into the embedding program's stderr. ``castor.logs.configure_logging`` (every process castor runs
itself: the command, a Ray cast host) or loguru's ``logger.enable("castor")`` turns them on.
This lives apart from ``castor/__init__.py`` so that ``castor --version`` imports no loguru.
"""

from loguru import logger

logger.disable("castor")


class _LoggingSetup:
    """What castor knows of its own logging setup, for a hot path's cheap check."""

    __slots__ = ("debug_dropped",)

    def __init__(self) -> None:
        #: True only while the handlers are the ones ``castor.logs.configure_logging`` installed, at a
        #: level above DEBUG: no sink takes a debug record, so a hot path may skip building one (the
        #: call alone costs loguru a caller-frame lookup). False in a program that embeds castor and
        #: never called it: there loguru and the program's own sinks decide, as for any record.
        self.debug_dropped = False


#: Read as ``LOGGING_SETUP.debug_dropped`` before a debug record on a hot path; written by
#: ``configure_logging`` only. A sink the program adds after ``configure_logging`` at DEBUG does not
#: see the records skipped this way (configure_logging at DEBUG, or loguru's own setup, does).
LOGGING_SETUP = _LoggingSetup()

__all__ = ["LOGGING_SETUP", "logger"]
