"""The version of trainopt, written into every result and ``best.yaml``."""

__version__ = "0.1.0"
