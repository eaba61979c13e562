"""STAND-IN for the private Icarus plugin: castor's reference memory backend.

Not the real Icarus. Same package shape and function signatures, so the worker
bridge, ``castor demo`` and the tests have a real backend process. See
``examples/icarus_reference/README.md`` for the test controls.
"""

REFERENCE_BACKEND = True


def register(ctx=None):
    """Hermes plugin entry point; the reference backend registers nothing."""
    return None
