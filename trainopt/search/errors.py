"""Why a search stops before its end."""

from __future__ import annotations

__all__ = ["SearchFailed"]


class SearchFailed(Exception):
    """The search cannot go on (for example, the baseline itself fails)."""
