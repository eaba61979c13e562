"""The materia trust rule: what an untrusted project may not make castor do.

A session is *trusted* when the user said so (``session.open {trusted: true}``, given only by a
peer that may assert it). An untrusted session may still run casts, and may still load its
project's materia config layer (``<cwd>/.pi/pi-materia.json``) — prompts, loadouts and models are
the project's to choose — but a loadout whose sockets run utility ``command``\\ s is refused
(``forbidden``, ``data.reason`` ``"untrusted_project"``, ``data.sockets`` naming them) while a
project layer is loaded: those commands would run as castor's user, chosen by whoever wrote the
project's files. The same commands from the user's own (global) or an explicit config layer are
allowed. Trusting a project trusts its owner's files: a project layer whose file another user owns
(root aside) or every user may write was chosen by someone else, so its commands are refused
the same way in a trusted session too (git refuses another user's repository for the same reason).

A cast saved on disk is a project file too: its ``state.json`` holds the whole resolved config,
commands included, and nothing proves castor wrote it (a checkout can ship one, or edit one).
So an untrusted session never *resumes* (recast, revive, continue) a saved cast whose config runs
utility commands, whichever layer they came from -- nor does a trusted one when the cast's
``state.json`` belongs to another user (root aside) or every user may write it (``forbidden``, ``untrusted_project``,
``data.cast_id``): trusting the project, or resuming it from a trusted session, is the way on.
The Icarus counterpart (``castor.domain.icarus.settings``) goes further: an untrusted
project's ``.pi/settings.json`` is not read at all.

The rule is pure: it decides from the resolved config and the session's trust flag, and touches
nothing.
"""

from __future__ import annotations

from castor.domain.materia.config import ResolvedConfig
from castor.messages.errors import Forbidden


def untrusted_commands(resolved: ResolvedConfig, *, trusted: bool) -> list[str]:
    """The ids of the command sockets the rule refuses (empty when the cast may start)."""
    project = [layer for layer in resolved.layers if layer.scope == "project" and layer.loaded]
    if not project or (trusted and not any(layer.foreign for layer in project)):
        return []
    return [sid for sid, rs in resolved.pipeline.sockets.items() if rs.socket.command]


def check_project_trust(resolved: ResolvedConfig, *, trusted: bool) -> None:
    """Raise ``Forbidden`` if an untrusted session's config would run a project's commands, or
    any session's would run those of a project layer another user may have written."""
    commands = untrusted_commands(resolved, trusted=trusted)
    foreign = [layer for layer in resolved.layers if layer.scope == "project" and layer.loaded and layer.foreign]
    if commands and trusted and foreign:
        raise Forbidden(f"the project's materia config {foreign[0].path} is not castor's user's to trust: "
                        f"{foreign[0].foreign}, so its utility commands ({', '.join(commands)}) are not run, "
                        "trusted or not; make it your own file (chown, chmod o-w) if you mean to run them",
                        data={"reason": "untrusted_project", "sockets": commands, "path": foreign[0].path})
    if commands:
        raise Forbidden("this project is not trusted: its materia config runs utility commands "
                        f"({', '.join(commands)}); trust the project first",
                        data={"reason": "untrusted_project", "sockets": commands})


def check_saved_cast_trust(resolved: ResolvedConfig, cast_id: str, *, trusted: bool,
                           foreign: str | None = None) -> None:
    """Raise ``Forbidden`` if an untrusted session would resume a saved cast that runs commands
    (its saved config is a project file: it may have been shipped or edited, see above), or any
    session would resume one whose ``state.json`` another user may have written (``foreign``:
    why; its file is theirs, or every user may write it)."""
    if trusted and foreign is None:
        return
    commands = [sid for sid, rs in resolved.pipeline.sockets.items() if rs.socket.command]
    if commands and foreign is not None:
        raise Forbidden(f"the saved cast {cast_id} is not castor's user's to resume: its state.json {foreign}, "
                        f"and its config runs utility commands ({', '.join(commands)}); start a new cast instead",
                        data={"reason": "untrusted_project", "sockets": commands, "cast_id": cast_id})
    if commands:
        raise Forbidden(f"this project is not trusted: the saved cast {cast_id} runs utility commands "
                        f"({', '.join(commands)}) and its saved config is a project file; trust the project "
                        "first to resume it",
                        data={"reason": "untrusted_project", "sockets": commands, "cast_id": cast_id})
