"""IO adapters of materia casts: artifacts, cast state, utilities, config loading."""
