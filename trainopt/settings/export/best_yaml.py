"""The ``yaml`` export: ``best.yaml`` itself, every knob written out, under the comment header."""

from __future__ import annotations

import yaml

from trainopt.knobs.catalog import KNOBS
from trainopt.settings.production import TrainSettings
from trainopt.settings.record import SETTINGS_KIND, SETTINGS_SCHEMA_VERSION

__all__ = ["render"]


def render(s: TrainSettings, header: list[str]) -> str:
    """The settings as a complete ``best.yaml`` that ``load_settings`` reads back.

    Args:
        s: The settings.
        header: The comment lines to start with.
    """
    doc = {
        "schema_version": SETTINGS_SCHEMA_VERSION,
        "kind": SETTINGS_KIND,
        "device": s.device,
        "settings": {name: s.settings[name] for name in KNOBS},
    }
    if s.distributed:
        doc["distributed"] = dict(s.distributed)
    if s.code:
        doc["code"] = dict(s.code)
    return "\n".join(header) + "\n" + yaml.safe_dump(doc, sort_keys=False)
