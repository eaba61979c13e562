"""Which surface a user drives a cast from, and how its commands are spelled there.

A cast can be started in a harness (the Pi extension's ``/materia`` commands) and resumed from
the ``castor`` CLI, or the other way round. Every text castor shows a user names the command of
the surface that user is in: the harness spells it ``/materia continue`` (the extension's
``continue``, ``abort`` and ``status`` take no id: they act on the session's newest cast, and the
extension refuses an id with its usage text; only ``recast`` and ``revive`` name one), the CLI
``castor continue <cast id>`` (a CLI process has no "current" cast, so the id is always part of it).

The surface is saved with the cast (``CastState.surface``); every command event may carry the
surface it came from, and the engine switches to it, so the next message names a command the
user can type where they are.
"""

from __future__ import annotations

from typing import Literal

Surface = Literal["harness", "cli"]
SURFACES: tuple[str, ...] = ("harness", "cli")

# The /materia subcommands that take a cast id in the harness; every other one refuses an argument.
HARNESS_VERBS_WITH_AN_ID = frozenset({"recast", "revive"})


#: Said under a ``castor recast`` / ``continue`` the CLI names for a cast no agent is remembered for
#: (one a harness ran: its agent is the harness's; an ``openai:`` one, never taken from the tree):
#: typed as shown it would stop at once on ``no agent``. A status or listing row says so as ``needs_agent``.
NO_AGENT_REMEMBERED = ("no agent is remembered for it: a recast or continue here needs --agent script:FILE or --agent "
                       "openai:BASE_URL[#MODEL] (or CASTOR_AGENT); or resume it in a harness session (/materia recast)")


def command(surface: str | None, verb: str, cast_id: str | None = None, *, bare_in_harness: bool = False,
            cli_flags: str = "") -> str:
    """The command a user types on ``surface`` to run ``verb`` (``continue``, ``recast``...) on a cast.

    ``bare_in_harness``: leave the id out of the harness's spelling (``/materia continue`` acts on
    the session's newest live cast, the one the message is about); the CLI always names it.
    ``cli_flags``: what the CLI's spelling ends with to name the project the user named (`` --cwd
    DIR``, already quoted for a shell), so the command typed as shown finds the same cast.
    """
    if surface == "cli":
        return (f"castor {verb} {cast_id}" if cast_id else f"castor {verb}") + cli_flags
    if cast_id and not bare_in_harness and verb in HARNESS_VERBS_WITH_AN_ID:
        return f"/materia {verb} {cast_id}"
    return f"/materia {verb}"


__all__ = ["HARNESS_VERBS_WITH_AN_ID", "NO_AGENT_REMEMBERED", "Surface", "SURFACES", "command"]
