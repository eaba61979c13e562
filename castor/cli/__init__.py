"""The ``castor`` command line: one module per command group (``serve``, ``inspect``, ``demo``,
the materia commands, ``soak``), what they share in :mod:`castor.cli.common`, and the parser
and ``main`` that wire them in :mod:`castor.cli.app`. ``castor.cli:main`` is the console entry
point and ``python -m castor`` runs it.
"""

from castor.cli.app import build_parser, main

__all__ = ["build_parser", "main"]
