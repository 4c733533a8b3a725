"""The full environment fingerprint, read inside a trial (or training) process, where torch is loaded."""

from __future__ import annotations

import platform
import sys
from typing import Any

import torch

from trainopt.contract.fingerprint import cpu_info

__all__ = ["environment"]


def environment(device: Any = None) -> dict[str, Any]:
    """The full fingerprint of this process's machine and software.

    Args:
        device: The torch.device the trial runs on, or None for CPU.
    """
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "hostname": platform.node(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.version.cuda,
        "executable": sys.executable,
    }
    env.update(cpu_info())
    if device is not None and getattr(device, "type", "cpu") == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        env.update(
            device_type="cuda",
            device_name=props.name,
            device_memory_bytes=int(props.total_memory),
            device_capability=f"{props.major}.{props.minor}",
        )
    else:
        env.update(device_type="cpu", device_name=env["cpu_model"])
    return env
