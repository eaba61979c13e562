"""Pure rules of the Icarus memory bridge (no threads, files, processes or pykka).

Modules (one idea each):

- ``settings`` — the ``piIcarusHook`` settings: parsing, precedence, trust, paths,
  inspection, the read-only schema, and the pure half of settings writes.
- ``commands`` — the ``/icarus`` command grammar: text -> typed command or error.
- ``tools`` — Fabric tool schemas, ``fabric_write`` validation, result translation.
- ``worker_protocol`` — the worker reply contract: ``reply_result`` and its typed errors.

Other modules in this package (``spans``, ``classify``, ``audit``, ``lifecycle``) are owned by
their own authors; see ``docs/icarus.md``.
"""
