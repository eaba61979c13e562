"""The ``/icarus`` command grammar: text -> typed command, or a typed error.

Parsing is pure and total: every input gives exactly one :class:`IcarusCommand`
or raises :class:`CommandError` (``invalid_params``) carrying :data:`USAGE`.
Parsing never writes anything, so an invalid command cannot change state.

Grammar (words lower-cased, split on whitespace; extra trailing words are errors)

============================================  =====================================
input                                         command
============================================  =====================================
``""`` | ``toggle``                           ``HooksCommand(toggle)``
``on`` | ``enable``                           ``HooksCommand(on)``
``off`` | ``disable``                         ``HooksCommand(off)``
``status``                                    ``HooksCommand(status)``
``context`` | ``context toggle``              ``ContextCommand(toggle)``
``context status``                            ``ContextCommand(status)``
``context on|show|visible|enable``            ``ContextCommand(show)``
``context off|hide|hidden|disable``           ``ContextCommand(hide)``
``context default``                           ``ContextDefaultCommand(status)``
``context default status [scope]``            ``ContextDefaultCommand(status, scope)``
``context default <scope>``                   ``ContextDefaultCommand(status, scope)``
``context default show|hide|toggle [scope]``  write the startup default
                                              (show/hide accept the visibility aliases)
``config`` / ``schema``                       read-only inspection
============================================  =====================================

Scope words: ``project`` | ``local`` -> project; ``global`` | ``user`` -> global.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from castor.messages.errors import InvalidParams
from castor.shown import clipped

Scope = Literal["project", "global"]

USAGE = (
    "Usage: /icarus [toggle|on|off|status] | /icarus context [toggle|show|hide|status] | "
    "/icarus context default [status|show|hide|toggle] [project|global] | /icarus config | /icarus schema"
)

HookAction = Literal["toggle", "on", "off", "status"]
ContextAction = Literal["toggle", "show", "hide", "status"]

_HOOK_WORDS: dict[str, HookAction] = {
    "toggle": "toggle", "on": "on", "enable": "on", "off": "off", "disable": "off", "status": "status"}
_STATE_WORDS: dict[str, ContextAction] = {"status": "status", "toggle": "toggle"}
_INSPECT_WORDS: dict[str, Literal["config", "schema"]] = {"config": "config", "schema": "schema"}
_SHOW_WORDS = frozenset({"on", "show", "visible", "enable"})
_HIDE_WORDS = frozenset({"off", "hide", "hidden", "disable"})
_SCOPE_WORDS: dict[str, Scope] = {"project": "project", "local": "project", "global": "global", "user": "global"}


class CommandError(InvalidParams):
    """An invalid ``/icarus`` command: report a warning plus usage; change nothing."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"{reason}. {USAGE}", data={"reason": "invalid_command", "usage": USAGE})


class HooksCommand(BaseModel):
    model_config = ConfigDict(frozen=True)
    kind: Literal["hooks"] = "hooks"
    action: HookAction


class ContextCommand(BaseModel):
    model_config = ConfigDict(frozen=True)
    kind: Literal["context"] = "context"
    action: ContextAction


class ContextDefaultCommand(BaseModel):
    model_config = ConfigDict(frozen=True)
    kind: Literal["context_default"] = "context_default"
    action: ContextAction
    scope: Scope | None = None

    @property
    def writes(self) -> bool:
        return self.action != "status"


class InspectCommand(BaseModel):
    model_config = ConfigDict(frozen=True)
    kind: Literal["inspect"] = "inspect"
    what: Literal["config", "schema"]


IcarusCommand = HooksCommand | ContextCommand | ContextDefaultCommand | InspectCommand


def _quoted(word: str) -> str:
    """``word`` as a message names it: clipped and escaped to one line, then quoted once (``repr()``
    of the escaped text doubled every backslash of its escapes, and switched quotes on a ``'``)."""
    return f"'{clipped(word, 64)}'"


def _no_more(words: list[str], used: int) -> None:
    if len(words) > used:
        raise CommandError(f"unexpected argument {_quoted(words[used])}")


def _visibility(word: str) -> Literal["show", "hide"] | None:
    if word in _SHOW_WORDS:
        return "show"
    if word in _HIDE_WORDS:
        return "hide"
    return None


def _parse_default(words: list[str]) -> ContextDefaultCommand:
    # words[0:2] == ["context", "default"]
    if len(words) == 2:
        return ContextDefaultCommand(action="status")
    word = words[2]
    if word in _SCOPE_WORDS:
        _no_more(words, 3)
        return ContextDefaultCommand(action="status", scope=_SCOPE_WORDS[word])
    action: ContextAction | None = _STATE_WORDS.get(word) or _visibility(word)
    if action is None:
        raise CommandError(f"unknown context default action {_quoted(word)}")
    scope: Scope | None = None
    if len(words) > 3:
        scope_word = words[3]
        if scope_word not in _SCOPE_WORDS:
            raise CommandError(f"unknown scope {_quoted(scope_word)} (use project or global)")
        scope = _SCOPE_WORDS[scope_word]
        _no_more(words, 4)
    return ContextDefaultCommand(action=action, scope=scope)


def _parse_context(words: list[str]) -> IcarusCommand:
    if len(words) == 1:
        return ContextCommand(action="toggle")
    word = words[1]
    if word == "default":
        return _parse_default(words)
    _no_more(words, 2)
    if word in _STATE_WORDS:
        return ContextCommand(action=_STATE_WORDS[word])
    action = _visibility(word)
    if action is None:
        raise CommandError(f"unknown context action {_quoted(word)}")
    return ContextCommand(action=action)


def parse_command(text: str | None) -> IcarusCommand:
    """Parse the arguments of ``/icarus`` (without the command name)."""
    words = (text or "").lower().split()
    if not words:
        return HooksCommand(action="toggle")
    head = words[0]
    if head in _HOOK_WORDS:
        _no_more(words, 1)
        return HooksCommand(action=_HOOK_WORDS[head])
    if head in _INSPECT_WORDS:
        _no_more(words, 1)
        return InspectCommand(what=_INSPECT_WORDS[head])
    if head == "context":
        return _parse_context(words)
    raise CommandError(f"unknown /icarus command {_quoted(head)}")
