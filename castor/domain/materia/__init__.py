"""Materia casts, pure rules: config, layering, graphs, handoff, routing, loops, limits,
budget, failure classification, revive and the cast state machine (:mod:`.engine`).

Nothing here touches files, processes, threads or pykka. See ``docs/materia.md``.
"""
