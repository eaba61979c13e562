"""When to stop starting Icarus workers: the crash-loop limit, as a pure rule.

A package whose worker process dies in every call (an ``os._exit`` in a hook, a backend killed by
a signal each time) would otherwise get a fresh process per call, without end. The rule: after
``max_deaths`` deaths of the session's worker within ``within_s`` seconds, the worker is *given
up*: for ``cool_down_s`` seconds every call is refused at once (no process is started), then one
call is let through on a fresh worker (*probing*). A probe that dies gives up again at once, for
another cool-down; any call the worker answers (its own error included: the process lived)
clears the record. A new session starts with a clean record.

Nothing here reads a clock or takes a lock: the caller passes ``now`` (monotonic seconds) and
serialises the calls (the worker actor's lock).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

DEFAULT_MAX_DEATHS = 5
DEFAULT_WITHIN_S = 60.0
DEFAULT_COOL_DOWN_S = 60.0

State = Literal["ok", "given_up", "probing"]


@dataclass(frozen=True)
class CrashLoopLimit:
    """At most ``max_deaths`` worker deaths within ``within_s`` seconds, then ``cool_down_s`` of refusals."""

    max_deaths: int = DEFAULT_MAX_DEATHS
    within_s: float = DEFAULT_WITHIN_S
    cool_down_s: float = DEFAULT_COOL_DOWN_S

    def __post_init__(self) -> None:
        if self.max_deaths < 1 or not self.within_s > 0 or not self.cool_down_s > 0:
            raise ValueError(f"a crash-loop limit needs max_deaths >= 1 and positive seconds, got {self}")


@dataclass
class CrashLoop:
    """One session's record of its worker's deaths (mutable; the caller serialises access)."""

    limit: CrashLoopLimit = field(default_factory=CrashLoopLimit)
    deaths: list[float] = field(default_factory=list)  # when each death in the window happened
    given_up_at: float | None = None
    until: float | None = None  # refusals end here (then one probe)
    probing: bool = False
    give_ups: int = 0  # how many times this session's worker was given up
    refused: int = 0  # calls refused while given up
    last_death: str = ""  # how the last one ended ("exit code 3", "killed by SIGKILL"), never backend text

    def state(self, now: float) -> State:
        if self.until is not None and now < self.until:
            return "given_up"
        if self.until is not None or self.probing:
            return "probing"
        return "ok"

    def admit(self, now: float) -> float | None:
        """Whether a call may start a worker now: ``None`` if so, else the seconds until it may.
        The first call after the cool-down is admitted as the probe."""
        if self.until is None:
            return None
        if now < self.until:
            self.refused += 1
            return self.until - now
        self.until = None
        self.probing = True
        return None

    def death(self, now: float, how: str = "") -> bool:
        """Record a death of the worker during a call; True when this one gives the worker up
        (the caller says so once, in its log)."""
        self.last_death = how
        window_start = now - self.limit.within_s
        self.deaths = [at for at in self.deaths if at > window_start]
        self.deaths.append(now)
        if self.probing or len(self.deaths) >= self.limit.max_deaths:
            self.probing = False
            self.given_up_at = now
            self.until = now + self.limit.cool_down_s
            self.give_ups += 1
            return True
        return False

    def answered(self) -> bool:
        """A call was answered by a living worker: the record is cleared. True when this ends a
        give-up (the probe worked: worth one line in the log)."""
        recovered = self.probing or self.until is not None
        if self.deaths or recovered:
            self.deaths = []
            self.probing = False
            self.until = None
            self.given_up_at = None
        return recovered

    def view(self, now: float) -> dict[str, Any]:
        """What an operator reads (``castor inspect worker``, the console): plain scalars."""
        window_start = now - self.limit.within_s
        view: dict[str, Any] = {
            "state": self.state(now), "deaths_in_window": sum(1 for at in self.deaths if at > window_start),
            "max_deaths": self.limit.max_deaths, "within_s": self.limit.within_s,
            "cool_down_s": self.limit.cool_down_s,
            "retry_in_s": round(self.until - now, 3) if self.until is not None and now < self.until else None,
            "give_ups": self.give_ups, "refused": self.refused, "last_death": self.last_death or None}
        view["text"] = view_text(view)
        return view


def view_text(view: dict[str, Any]) -> str:
    """One line for an operator (``castor inspect worker``, the console card)."""
    limit = f"{view['max_deaths']} deaths within {view['within_s']:g} s"
    last = f", last: {view['last_death']}" if view.get("last_death") else ""
    if view["state"] == "given_up":
        return (f"given up ({limit}{last}): calls fail at once (worker_retired, crash_loop) for "
                f"{view['retry_in_s']:.0f} s more, then one call tries a fresh worker; {view['refused']} refused")
    if view["state"] == "probing":
        return f"cool-down over: the next call tries a fresh worker; a death gives it up again ({limit}{last})"
    deaths = view["deaths_in_window"]
    ended = f"; given up {view['give_ups']} times before" if view["give_ups"] else ""
    return f"ok ({deaths} deaths in the last {view['within_s']:g} s; gives up at {view['max_deaths']}{last}){ended}"


__all__ = ["CrashLoop", "CrashLoopLimit", "view_text", "DEFAULT_COOL_DOWN_S", "DEFAULT_MAX_DEATHS", "DEFAULT_WITHIN_S"]
