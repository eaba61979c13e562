"""Dispatch: a message goes to the handler registered for its class (a bound table made per
incarnation); a class that overrides ``receive`` gets every message there, and may delegate."""

from __future__ import annotations

import pytest

from castor.messages.base import Message
from castor.messages.errors import ActorCrashed
from castor.supervision import Actor, ActorSystem, ChildSpec, handles


class Num(Message, type_name="test.dispatch.num"):
    n: int


class Other(Message, type_name="test.dispatch.other"):
    pass


class Plain(Actor):
    @handles(Num)
    def num(self, message: Num) -> int:
        return message.n


class Overriding(Actor):
    @handles(Num)
    def num(self, message: Num) -> int:
        return message.n

    def receive(self, message: object) -> object:
        if isinstance(message, Other):
            return "other"
        return super().receive(message) * 2  # type: ignore[operator]  # Num's handler returns an int


@pytest.mark.timeout(20)
def test_handlers_by_class_an_override_of_receive_and_a_message_without_a_handler():
    system = ActorSystem([ChildSpec("plain", Plain), ChildSpec("over", Overriding)])
    try:
        plain, over = system.lookup("/root/plain"), system.lookup("/root/over")
        assert plain.ask(Num(n=3), timeout=5) == 3
        assert over.ask(Num(n=2), timeout=5) == 4  # through the override, delegating to the table
        assert over.ask(Other(), timeout=5) == "other"
        with pytest.raises(ActorCrashed) as crashed:
            plain.ask(Other(), timeout=5)
        assert isinstance(crashed.value.__cause__, TypeError)
    finally:
        system.shutdown(10)
