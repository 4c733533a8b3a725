"""The settings as a training framework's keyword arguments: one dict API, rendered by the exports.

``framework_args(record, framework, device_type)`` returns a ``FrameworkArgs``: the keyword
arguments for PyTorch Lightning's ``Trainer`` (``lightning``) or Hugging Face's
``TrainingArguments`` (``hf``), each with the settings it carries and a comment, and the
``Unexpressed`` records of what the framework cannot express and what to do instead.
``TrainSettings.trainer_kwargs`` builds them for the constructor and
``trainopt export --format lightning|hf`` writes them as code, so both come from this data.

Which knobs are written: a keyword argument changes a framework's default only for a
setting that is a decision (``SettingsRecord.established``: changed by the search, or set off
trainopt's default), or where the framework's default would run something other than
what was measured without changing what training computes (the device, the optimizer's
kernels, loader pinning, DDP's unused-parameter search). A knob at trainopt's default
leaves the framework's default and gets a comment saying so.
"""

from __future__ import annotations

from trainopt.errors import UserError
from trainopt.settings.frameworks.common import BUFFER_KWARGS
from trainopt.settings.frameworks.hf_args import hf_args
from trainopt.settings.frameworks.lightning_args import lightning_args
from trainopt.settings.frameworks.records import Argument, Call, FrameworkArgs, Unexpressed
from trainopt.settings.record import SettingsRecord

__all__ = [
    "Argument",
    "BUFFER_KWARGS",
    "Call",
    "FRAMEWORKS",
    "FrameworkArgs",
    "FrameworkError",
    "Unexpressed",
    "framework_args",
]

FRAMEWORKS = {"lightning": lightning_args, "hf": hf_args}


class FrameworkError(UserError):
    """An unknown framework name."""


def framework_args(record: SettingsRecord, framework: str, device_type: str,
                   buffer_kwarg: str = "forward_sync_buffers") -> FrameworkArgs:
    """The keyword arguments of ``framework`` for settings measured on ``device_type``.

    Args:
        record: The settings.
        framework: ``lightning`` or ``hf``.
        device_type: ``cpu`` or ``cuda``: what the settings were measured on
            (``SettingsRecord.measured_device_type``).
        buffer_kwarg: DistributedDataParallel's keyword for the buffer broadcast in the
            installed torch (one of ``BUFFER_KWARGS``).

    Raises:
        FrameworkError: ``framework`` is not one of ``FRAMEWORKS``.
    """
    build = FRAMEWORKS.get(framework)
    if build is None:
        raise FrameworkError(f"framework {framework!r} is not one of {', '.join(FRAMEWORKS)}; pick one of those")
    if device_type not in ("cpu", "cuda"):
        raise ValueError(f"device_type {device_type!r} is not cpu or cuda")
    if buffer_kwarg not in BUFFER_KWARGS:
        raise ValueError(f"buffer_kwarg {buffer_kwarg!r} is not one of {', '.join(BUFFER_KWARGS)}")
    return build(record, device_type, buffer_kwarg)
