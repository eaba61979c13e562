"""The guarantee mutant suite: each guarantee in docs/reliability.md and docs/supervision.md broken
on purpose, in a scratch copy of the tree, and the tests that back it run against the break.

``python -m tools.mutants`` (or ``python tools/mutants/run.py``) fails if any mutant survives, if a
mutant's old snippet no longer matches its file exactly once, or if the backing tests do not pass
on the unmutated tree. The list is :mod:`tools.mutants.mutants`.
"""
