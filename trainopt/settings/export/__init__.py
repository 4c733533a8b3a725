"""``trainopt export``: the winning settings as text to paste into a training script.

Formats: plain PyTorch (``torch``), PyTorch Lightning (``lightning``), Hugging Face
``TrainingArguments`` (``hf``) and ``best.yaml`` itself (``yaml``). Every output starts
with where the settings were measured and how much faster they were, and names every
knob: as code where the target can express it, otherwise as a comment saying what to do,
so no measured setting is silently lost on the way into a training script.

Each format has its own module (``plain_torch``, ``lightning_trainer``,
``training_arguments``, ``best_yaml``); ``header`` writes the comment header and
``lines`` the lines the code formats share. The Lightning ``Trainer(...)`` and Hugging Face
``TrainingArguments(...)`` calls are ``s.framework_args(...)`` written out by ``arguments``:
exactly the keyword arguments ``TrainSettings.trainer_kwargs`` builds
(``trainopt.settings.frameworks``). The code is rendered from
``trainopt.knobs.kwargs``' data (backend flags, DataLoader keyword arguments, compile mode,
autocast dtype, optimizer keyword arguments), the same data the trial applied, so every
value that differs from PyTorch's default comes out as code. The backend flags are always
written as code: PyTorch's own TF32 defaults differ between matmuls (off) and cuDNN (on),
so leaving either out would not reproduce what was measured.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from trainopt.errors import UserError
from trainopt.settings.export import (
    best_yaml,
    lightning_trainer,
    plain_torch,
    training_arguments,
)
from trainopt.settings.export.header import header
from trainopt.settings.production import TrainSettings, load_settings

__all__ = ["ExportError", "FORMATS", "render_export", "render_settings"]


class ExportError(UserError):
    """Nothing to export at the given path, or an unknown format."""


FORMATS: dict[str, Callable[[TrainSettings, list[str]], str]] = {
    "torch": plain_torch.render,
    "lightning": lightning_trainer.render,
    "hf": training_arguments.render,
    "yaml": best_yaml.render,
}


def render_settings(settings: TrainSettings, fmt: str, source: str = "best.yaml") -> str:
    """Render already-loaded settings in one format.

    Args:
        settings: The settings.
        fmt: One of ``FORMATS``.
        source: Named in the header as where the settings came from.

    Raises:
        ExportError: Unknown format.
    """
    render = FORMATS.get(fmt)
    if render is None:
        raise ExportError(f"--format {fmt!r} is not one of {', '.join(FORMATS)}; pick one of those")
    return render(settings, header(settings, source))


def render_export(path: Path, fmt: str) -> str:
    """Render the winning settings of a search output folder or a ``best.yaml``.

    Args:
        path: A search output folder (with ``best.yaml`` in it) or a ``best.yaml`` file.
        fmt: ``torch``, ``lightning``, ``hf`` or ``yaml``.

    Returns:
        Ready-to-paste text starting with a comment header.

    Raises:
        ExportError: The path does not exist, the folder has no best.yaml, or the
            format is unknown.
        SettingsError: The best.yaml is invalid (``trainopt.settings.record.SettingsError``).
    """
    path = Path(path)
    if fmt not in FORMATS:
        raise ExportError(f"--format {fmt!r} is not one of {', '.join(FORMATS)}; pick one of those")
    if not path.exists():
        raise ExportError(f"{path}: no such file or folder; pass a search output folder or its best.yaml")
    if path.is_dir():
        best = path / "best.yaml"
        if not best.is_file():
            raise ExportError(
                f"{path}: no best.yaml in this folder; run `trainopt search SPEC --out {path}` first, "
                f"or pass the best.yaml file itself"
            )
        path = best
    # The export is text for another machine, so a fingerprint mismatch here is no warning.
    return render_settings(load_settings(path, warn=False), fmt, source=str(path))
