"""Suite-wide setup: quiet, privacy-safe logging to stderr."""

from castor.logs import configure_logging

configure_logging("ERROR")
