"""The protocols castor's actors need, implemented by adapters (or by the harness, over the wire).

| module | what it names |
|--------|---------------|
| :mod:`.agent` | ``AgentPort``: one agent turn |
| :mod:`.session` | ``SessionPort`` (the harness's session log), ``SessionUiPort`` (status, toasts) |
| :mod:`.classifier` | ``ClassifierPort``: the Icarus classification call |
| :mod:`.host_context` | ``HostContextPort``: the harness's own transcript (compaction, usage) |
| :mod:`.worker` | ``WorkerCalls``: calls into the Icarus worker |
| :mod:`.cast_storage` | ``CastStorage``: materia's state documents, artifacts, leases, index and config |
| :mod:`.icarus_backend` | ``IcarusBackend``, ``WorkerProcessPort``: Icarus's files and processes |
| :mod:`.cli_note` | the keys of a cast's ``cli.json`` that more than the CLI writes |
| :mod:`.session_component` | the session-component contract: ``SessionComponent``, ``SessionContext``, ``SessionHost``, ``SessionInfo``, ``HarnessLink``, ``RuntimeSettings`` |

Ports import only ``castor.domain``, ``castor.messages`` and (for the component contract's
``ChildSpec`` and ``ActorSystem``) ``castor.supervision``; never an actor or an adapter.
"""  # noqa: E501 - table rows cannot wrap
