"""Batch-size probes on the largest items: a padded batch is as large as its longest item.

Where items differ in size (text padded per batch, images of several sizes), a probe on
an average batch can pass and production then run out of memory on the batch that holds
the longest items. So a probe trains on the largest items found in a bounded sample of
the data set: up to ``SAMPLE_ITEMS`` items (all of a smaller set, else an even spread
with a seeded random offset), ranked by the total elements of the tensors, arrays and
number lists in each, and every probe batch is made of the largest of them.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Mapping
from dataclasses import fields, is_dataclass
from typing import Any

from torch.utils.data import Dataset

__all__ = ["SAMPLE_ITEMS", "SAMPLE_SECONDS", "item_size", "LargestItems", "largest_items"]

SAMPLE_ITEMS = 512
# Reading items may decode images: the sample stops early rather than delay the probe.
SAMPLE_SECONDS = 10.0


def item_size(item: Any) -> int:
    """Elements in one item: tensors' and arrays' ``numel``/``size``, a list of numbers' length, 1 per number."""
    numel = getattr(item, "numel", None)
    if callable(numel):
        return int(numel())
    size = getattr(item, "size", None)
    if isinstance(size, int) and hasattr(item, "shape"):  # a numpy array
        return size
    if isinstance(item, (int, float, bool)):
        return 1
    if isinstance(item, (str, bytes)):
        return len(item)
    if isinstance(item, Mapping):
        return sum(item_size(v) for v in item.values())
    if isinstance(item, (list, tuple)):
        return sum(item_size(v) for v in item)
    if is_dataclass(item) and not isinstance(item, type):
        return sum(item_size(getattr(item, f.name)) for f in fields(item))
    return 0


class LargestItems(Dataset):
    """The chosen items of ``dataset``, repeated to ``length``."""

    def __init__(self, dataset: Any, indices: list[int], length: int):
        self.dataset = dataset
        self.indices = indices
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> Any:
        return self.dataset[self.indices[i % len(self.indices)]]


def _sample_indices(n: int, limit: int, seed: int) -> list[int]:
    if n <= limit:
        return list(range(n))
    # An even spread covers the whole set (sorted or grouped data included); the offset varies it by seed.
    stride = n / limit
    offset = random.Random(seed).random() * stride
    return sorted({min(n - 1, int(offset + k * stride)) for k in range(limit)})


def largest_items(dataset: Any, batch_items: int, seed: int = 0, limit: int = SAMPLE_ITEMS,
                  seconds: float = SAMPLE_SECONDS, clock=time.perf_counter,
                  copies: int = 1) -> tuple[LargestItems, dict[str, Any]]:
    """A data set of the ``batch_items`` largest sampled items, and what was found.

    Args:
        dataset: The map-style data set.
        batch_items: Items in one probe batch (``batch_size``): its length, so each batch is exactly them.
        seed: Varies which items an even spread samples.
        limit: Items sampled at most.
        seconds: Stop sampling after this long (the items read so far are ranked).
        clock: The time source.
        copies: Batches' worth of items in the returned set: the ranks of a data-parallel
            probe each draw a whole batch from it, every one of the largest items.

    Returns:
        The probe's data set and ``{sampled, dataset_len, largest, median, smallest, in_batch, unit}``
        (sizes in elements; ``in_batch`` the smallest size among the items a probe batch holds).
    """
    n = len(dataset)
    start = clock()
    sizes: list[tuple[int, int]] = []
    for index in _sample_indices(n, limit, seed):
        sizes.append((item_size(dataset[index]), index))
        if clock() - start > seconds:
            break
    ranked = sorted(sizes, key=lambda pair: (-pair[0], pair[1]))
    chosen = ranked[:max(1, batch_items)]
    values = [size for size, _ in sizes]
    info = {
        "sampled": len(sizes),
        "dataset_len": n,
        "largest": ranked[0][0],
        "median": statistics.median(values),
        "smallest": min(values),
        "in_batch": chosen[-1][0],
        "unit": "elements",
    }
    return LargestItems(dataset, [index for _, index in chosen], max(batch_items, 1) * max(copies, 1)), info
