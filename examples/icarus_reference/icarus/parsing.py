"""STAND-IN for ``icarus.parsing``."""

from icarus._control import traced


@traced("parsing")
def split_sections(text):
    return [part for part in str(text).split("\n\n") if part.strip()]
