"""The version of trainopt, written into every result and ``best.yaml``.

The one place it is written: pyproject.toml reads it from here (``dynamic = ["version"]``), and
CHANGELOG.md has a section for it (a unit test holds both).
"""

__version__ = "0.4.0"
