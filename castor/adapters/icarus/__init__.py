"""IO side of the Icarus memory bridge.

- ``worker_program`` — the program the worker subprocess runs (stdlib only).
- ``launch`` — argv, cwd and sanitised environment, from trusted settings only.
- ``worker_process`` — :class:`WorkerProcess`: one subprocess, JSON lines, deadlines, kill_tree.
- ``settings_store`` — tolerant settings reads and locked atomic settings writes.
"""
