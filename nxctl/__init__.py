"""nxctl: the CLI and the HTTP seat over the nxctl engine (glue only, no model math)."""

__version__ = "0.1.0"
