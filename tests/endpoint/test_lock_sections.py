"""Lock sections that a caller's thread can run keep ``with lock:``.

``lock.acquire()`` followed by ``try: ... finally: lock.release()`` is ~100 ns cheaper than
``with lock:`` on CPython 3.11, but an exception raised asynchronously -- a signal handler's
``KeyboardInterrupt`` or ``Terminated``, which CPython runs on the main thread between two
bytecodes, right after a call returns -- can land between ``acquire()`` returning and the ``try``,
and leave the lock held: the CLI's ``finally: client.close()`` then waits on it for ever (a
``castor inspect --follow`` stopped with Ctrl-C hung that way once). ``with`` rules that window
out. So the cheaper form is allowed only where no signal handler ever runs: the functions below
run on a connection's own worker threads only. The first test shows the window is real.
"""

from __future__ import annotations

import ast
import signal
import threading
from pathlib import Path

import pytest

import castor

pytestmark = pytest.mark.timeout(60)

#: module (relative to the castor package) -> functions allowed the acquire/try form
ALLOWED: dict[str, set[str]] = {
    # none: no castor code needs the explicit form today
}


def _acquire_then_try(tree: ast.AST) -> list[tuple[str, int]]:
    """(function name, line) of each ``x.acquire()`` statement directly followed by a ``try``
    whose ``finally`` releases ``x``."""
    found: list[tuple[str, int]] = []
    for func in ast.walk(tree):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(func):
            body = getattr(node, "body", None)
            if not isinstance(body, list):
                continue
            for blocks in (body, getattr(node, "orelse", []), getattr(node, "finalbody", [])):
                for first, second in zip(blocks, blocks[1:], strict=False):
                    if not (isinstance(first, ast.Expr) and isinstance(first.value, ast.Call)
                            and isinstance(first.value.func, ast.Attribute)
                            and first.value.func.attr == "acquire" and not first.value.args
                            and isinstance(second, ast.Try)):
                        continue
                    lock = ast.unparse(first.value.func.value)
                    releases = [ast.unparse(s.value.func.value) for s in second.finalbody
                                if isinstance(s, ast.Expr) and isinstance(s.value, ast.Call)
                                and isinstance(s.value.func, ast.Attribute) and s.value.func.attr == "release"]
                    if lock in releases:
                        found.append((func.name, first.lineno))
    return found


def test_an_exception_from_a_signal_handler_can_land_between_acquire_and_try() -> None:
    class Boom(Exception):
        pass

    def boom(*_args: object) -> None:
        raise Boom

    lock = threading.Lock()
    previous = signal.signal(signal.SIGALRM, boom)
    held_after_acquire_try = held_after_with = 0
    try:
        for use_with in (False, True):
            for _ in range(300):
                try:  # the timer can fire as setitimer returns (a loaded machine): inside the try
                    signal.setitimer(signal.ITIMER_REAL, 0.0001)
                    while True:
                        if use_with:
                            with lock:
                                pass
                        else:
                            lock.acquire()
                            try:
                                pass
                            finally:
                                lock.release()
                except Boom:
                    if lock.locked():
                        lock.release()
                        if use_with:
                            held_after_with += 1
                        else:
                            held_after_acquire_try += 1
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert held_after_with == 0
    assert held_after_acquire_try > 0  # the window this file's rule is about


def test_only_worker_thread_code_takes_a_lock_by_acquire_then_try() -> None:
    root = Path(castor.__file__).parent
    offenders = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        for func, line in _acquire_then_try(ast.parse(path.read_text(), str(path))):
            if func not in ALLOWED.get(rel, set()):
                offenders.append(f"{rel}:{line} in {func}")
    assert offenders == [], "use `with lock:` where a caller's (main) thread may run: " + ", ".join(offenders)


def test_the_check_finds_the_form_it_forbids() -> None:
    tree = ast.parse("def f(self):\n    self._lock.acquire()\n    try:\n        pass\n"
                     "    finally:\n        self._lock.release()\n")
    assert _acquire_then_try(tree) == [("f", 2)]
