"""castor: a supervised actor runtime for materia casts and the Icarus memory bridge."""

__version__ = "0.1.0"
