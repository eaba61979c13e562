"""STAND-IN for ``icarus.obsidian``."""

from icarus._control import traced


@traced("obsidian")
def init_obsidian(fabric_dir=None):
    return {"status": "ok"}
