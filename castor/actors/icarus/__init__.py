"""Icarus sessions as actors: the memory bridge beside each harness session.

| module | what |
|---|---|
| :mod:`.component` | ``icarus_component()``: the session component (the icarus supervisor and its actors) |
| :mod:`.session` | ``IcarusSession``: one session's facade for the endpoint methods; ``IcarusBackend`` |
| :mod:`.hook_controller` | ``HookController``: runs the pure hook lifecycle; ``HookClient`` for the harness events |
| :mod:`.worker` | ``IcarusWorkerActor``: the one persistent Python worker; ``IcarusWorkerClient`` |
| :mod:`.classifier` | ``ClassifierActor``: the context filter's model call, bounded and cancellable |
| :mod:`.audit` | ``AuditActor``: persists the filter decision before the text is released |
| :mod:`.messages` | the process-local messages between them |
"""

from castor.actors.icarus.component import default_backend, icarus_component, session_of
from castor.actors.icarus.session import IcarusBackend, IcarusSession

__all__ = ["IcarusBackend", "IcarusSession", "default_backend", "icarus_component", "session_of"]
