"""A trial process's memory: the cap that makes an over-large batch fail, and the peak it reached.

Both are used alike by a one-shot trial (``trainopt.trial.worker`` through
``trainopt.trial.measure``), an arm (``trainopt.trial.arm``) and a data-parallel rank
(``trainopt.trial.ddp_rank``). torch is imported inside the functions, so a trial process
can tie itself to its parent before paying for ``import torch``.
"""

from __future__ import annotations

import contextlib
import resource

__all__ = ["cap_memory", "PeakMemory"]


def cap_memory(memory_gb: float | None, device) -> None:
    """Make an over-large batch fail with the allocator's own out-of-memory error.

    On CUDA the device's caching allocator is capped at ``memory_gb`` (as a fraction of
    the device's memory): an address-space limit would make the CUDA driver itself fail
    to start. On a CPU the process's address space is capped, set after ``import torch``
    (whose libraries reserve address space up front) so that it bounds what training
    allocates; loader workers inherit the cap.

    Args:
        memory_gb: The cap in GiB; None leaves memory uncapped.
        device: The torch.device the trial trains on.
    """
    if memory_gb is None:
        return
    limit = int(memory_gb * 1024**3)
    if device.type == "cuda":
        import torch

        index = device.index if device.index is not None else torch.cuda.current_device()
        total = int(torch.cuda.get_device_properties(index).total_memory)
        torch.cuda.set_per_process_memory_fraction(min(1.0, limit / total), index)
        return
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


class PeakMemory:
    """Peak memory: CUDA max allocated, or on CPU peak RSS of this process plus loader workers.

    Created before the memory to be counted is allocated: on CUDA it resets the
    allocator's peak. Loader workers are separate processes, so their resident memory is
    sampled at window edges (outside the timed region) and added to this process's own peak.

    Args:
        device: The torch.device the trial trains on.

    Attributes:
        children_peak: The largest total RSS of the loader workers sampled so far (CPU only).
    """

    def __init__(self, device):
        self.device = device
        self.children_peak = 0
        if device.type == "cuda":
            import torch

            torch.cuda.reset_peak_memory_stats(device)

    def sample(self) -> None:
        """Record the loader workers' resident memory now (a no-op on CUDA)."""
        if self.device.type == "cuda":
            return
        try:
            import psutil

            total = 0
            for kid in psutil.Process().children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    total += kid.memory_info().rss
            self.children_peak = max(self.children_peak, total)
        except Exception:  # noqa: BLE001 - memory sampling must never fail a trial
            pass

    def peak(self) -> int:
        """The peak in bytes: the allocator's on CUDA, own peak RSS plus the workers' on CPU."""
        if self.device.type == "cuda":
            import torch

            return int(torch.cuda.max_memory_allocated(self.device))
        own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
        return int(own + self.children_peak)
