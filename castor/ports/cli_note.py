"""The keys of a cast's ``cli.json`` (what the CLI keeps beside a cast in its run directory) that
more than the CLI writes. Imports nothing: the CLI's parser reads it without loading pydantic."""

CAST_BACKEND_FLAGS = "backendFlags"
"""The backend flags of the command (or the serving process) that last ran the cast: ``--backend
ray`` and its ``--ray-address``/``--ray-hosts``, never a token; absent for this machine."""
