"""castor's version: one string, importable from any layer without importing the package's public surface."""

__version__ = "0.1.0"
