"""Scale-out: casts and their utility work on a Ray cluster (the optional ``castor[ray]`` extra).

Nothing here imports Ray at module level: ``castor`` without the extra never imports it. The
design, its guarantees and how to run it are in docs/scale-out.md.
"""

BACKENDS = ("local", "ray")
"""The values of ``--backend`` on ``castor serve``, ``castor cast`` and ``castor soak``."""

RAY_MINOR = (2, 60)
"""The Ray minor version castor's Ray backend is built and tested against (``castor[ray]`` pins
it): it uses Ray's state and scheduling internals, which change between minors. Another installed
Ray is a usage error of ``--backend ray``, before anything starts."""
