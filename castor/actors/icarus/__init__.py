"""Icarus sessions as actors: the memory bridge beside each harness session.

| module | what |
|---|---|
| :mod:`.component` | ``icarus_component(backend)``: the session component (the icarus supervisor and its actors) |
| :mod:`.session` | ``IcarusSession``: one session's facade for the endpoint methods |
| :mod:`.hook_controller` | ``HookController``: runs the pure hook lifecycle; ``HookClient`` for the harness events |
| :mod:`.worker` | ``IcarusWorkerActor``: the one persistent Python worker; ``IcarusWorkerClient`` |
| :mod:`.classifier` | ``ClassifierActor``: the context filter's model call, bounded and cancellable |
| :mod:`.audit` | ``AuditActor``: persists the filter decision before the text is released |
| :mod:`.messages` | the process-local messages between them |
"""

from castor.actors.icarus.component import icarus_component, session_of
from castor.actors.icarus.session import IcarusSession
from castor.ports.icarus_backend import IcarusBackend

__all__ = ["IcarusBackend", "IcarusSession", "icarus_component", "session_of"]
