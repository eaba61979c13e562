"""Test actors and small synchronisation helpers for the supervision suite."""

from __future__ import annotations

import threading
import time
from typing import Callable

from castor.messages.base import Message
from castor.supervision import Actor, handles
from tests.support.processes import process_gone  # noqa: F401 - re-exported for the supervision tests
from tests.support.waiting import poll_until  # noqa: F401 - re-exported for the supervision tests


class Ping(Message, type_name="test.ping"):
    n: int = 0


class Boom(Message, type_name="test.boom"):
    pass


class Block(Message, type_name="test.block"):
    """Handler waits on a shared event (by key) so tests control timing."""

    key: str


class Quit(Message, type_name="test.quit"):
    pass


class Journal:
    """Thread-safe record of what actors did, shared across incarnations."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.entries: list[tuple] = []
        self.events: dict[str, threading.Event] = {}
        self.changed = threading.Condition(self.lock)

    def add(self, *entry) -> None:
        with self.lock:
            self.entries.append(entry)
            self.changed.notify_all()

    def event(self, key: str) -> threading.Event:
        with self.lock:
            return self.events.setdefault(key, threading.Event())

    def wait_for(self, predicate: Callable[[list[tuple]], bool], timeout: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout
        with self.lock:
            while not predicate(self.entries):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.changed.wait(left)
            return True

    def count(self, *prefix) -> int:
        with self.lock:
            return sum(1 for e in self.entries if e[: len(prefix)] == prefix)


class Worker(Actor):
    """Echoes pings, crashes on Boom, blocks on Block, stops itself on Quit."""

    def __init__(self, name: str, journal: Journal) -> None:
        super().__init__()
        self.name = name
        self.journal = journal

    def on_start(self) -> None:
        self.journal.add("start", self.name, self.incarnation)

    def on_terminate(self, cause: str) -> None:
        self.journal.add("end", self.name, self.incarnation, cause)

    @handles(Ping)
    def ping(self, message: Ping) -> tuple[str, int, int]:
        self.journal.add("ping", self.name, message.n)
        return (self.name, self.incarnation, message.n)

    @handles(Boom)
    def boom(self, _message: Boom) -> None:
        self.journal.add("boom", self.name)
        raise ValueError(f"boom in {self.name}")

    @handles(Block)
    def block(self, message: Block) -> str:
        self.journal.add("blocked", self.name, message.key)
        self.journal.event(f"{message.key}:entered").set()
        self.journal.event(message.key).wait(10)
        return message.key

    @handles(Quit)
    def quit(self, _message: Quit) -> None:
        self.stop_self()


def worker(name: str, journal: Journal) -> Callable[[], Worker]:
    return lambda: Worker(name, journal)
