"""Generic supervision over pykka: actors, handles, supervisors, faults, inspection.

Nothing here knows about casts or Icarus. See docs/supervision.md for the
guarantees as tables.
"""

from castor.supervision.actor import Actor, handles
from castor.supervision.handle import DEFAULT_ASK_TIMEOUT, ActorHandle, PendingAsk
from castor.supervision.kinds import (
    ActorKilled,
    ExitKind,
    HandleState,
    InjectedCrash,
    Restart,
    RestartIntensityExceeded,
    Strategy,
)
from castor.supervision.supervisor import (
    DEFAULT_MAX_RESTARTS,
    DEFAULT_SHUTDOWN_TIMEOUT,
    DEFAULT_WITHIN_SECONDS,
    ChildSpec,
    Supervisor,
    supervisor_spec,
)
from castor.supervision.system import ROOT_PATH, ActorSystem
from castor.supervision.timers import CancelToken, call_later, tell_later

__all__ = [
    "Actor", "ActorKilled", "InjectedCrash", "handles", "DEFAULT_ASK_TIMEOUT", "ActorHandle", "PendingAsk",
    "DEFAULT_MAX_RESTARTS", "DEFAULT_SHUTDOWN_TIMEOUT", "DEFAULT_WITHIN_SECONDS", "ChildSpec", "Restart",
    "RestartIntensityExceeded", "Strategy", "Supervisor", "supervisor_spec", "ROOT_PATH", "ActorSystem",
    "ExitKind", "HandleState", "CancelToken", "call_later", "tell_later",
]
