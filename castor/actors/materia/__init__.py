"""Materia casts as actors: thin hosts of the pure engine (castor.domain.materia.engine).

| module | what |
|---|---|
| :mod:`.component` | ``materia_component(storage)``: the session component (cast/socket supervisors + SessionActor) |
| :mod:`.session_actor` | ``SessionActor``: a session's ``/materia`` verbs |
| :mod:`.cast_actor` | ``CastActor``: one cast; persists every transition before its effects |
| :mod:`.socket_actor` | ``SocketActor``: one agent-socket visit through the session's AgentPort |
| :mod:`.utility_pool` | ``utility_pool_spec()``, ``UtilityExecutorActor``: the bounded utility pool |
| :mod:`.views` | read-only status/listing views shared with the endpoint and CLI |
| :mod:`.api` | ``materia_ask(runtime, session_id, message)``; ``materia_call(runtime, session_id, verb, params)`` by verb name |
| :mod:`.messages` | the process-local messages between them, one typed message per SessionActor verb |
"""  # noqa: E501 - table rows cannot wrap
