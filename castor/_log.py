"""castor's logger: loguru's, with castor's own lines off until the program turns them on.

A library stays quiet in the program that embeds it: importing any castor module that logs
disables loguru's records from the ``castor`` package, so a crash castor handles does not print
into the embedding program's stderr. ``castor.logs.configure_logging`` (every process castor runs
itself: the command, a Ray cast host) or loguru's ``logger.enable("castor")`` turns them on.
This lives apart from ``castor/__init__.py`` so that ``castor --version`` imports no loguru.
"""

from loguru import logger

logger.disable("castor")

__all__ = ["logger"]
