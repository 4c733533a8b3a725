"""Built-in synthetic data sets: images, token sequences and tabular rows.

Each item is generated on demand from its own generator seeded by ``(seed, index)``, so
item ``i`` is the same in every process and every epoch, whatever order a shuffled,
multi-worker DataLoader asks for it. The sets hold only plain attributes, so they pickle
into loader workers under any start method.

``transform_cost_ms`` and ``latency_ms`` make the input pipeline as slow as a real one:
the first burns CPU per sample like decoding and augmenting, the second sleeps per sample
like reading from slow storage. The difference matters: only CPU work competes with the
training process for cores, and more loader workers help the two in different ways.
"""

from __future__ import annotations

import math
import operator
import time
from typing import Any, Mapping, Sequence

import torch
from torch.utils.data import Dataset

from trainopt.contract.reference import WorkloadError, check_kwargs

__all__ = ["SyntheticImages", "SyntheticTokens", "SyntheticTabular", "BUILTIN_DATA", "build_dataset", "burn_cpu"]

# Item seeds are seed * _SEED_STRIDE + index. Torch's CPU generator keeps only the low
# 32 bits of a seed, so every seed here is taken modulo 2**32 on purpose.
_SEED_STRIDE = 1_000_003
_SEED_MOD = 2**32


def burn_cpu(ms: float) -> int:
    """Spend ``ms`` milliseconds of this thread's CPU time on arithmetic.

    The deadline is on the thread's CPU clock rather than the wall clock, so the cost is
    a fixed amount of work, as a real transform is: on a busy machine it takes longer
    in wall time instead of silently doing less.

    Args:
        ms: CPU milliseconds to spend; 0 returns at once.

    Returns:
        A value derived from the loop, so the work cannot be skipped as dead code.
    """
    if ms <= 0:
        return 0
    deadline = time.thread_time() + ms / 1000.0
    x = 1
    while time.thread_time() < deadline:
        for _ in range(64):
            x = (x * 1103515245 + 12345) & 0x7FFFFFFF
    return x


def _int(value: Any, key: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise WorkloadError(f"data.args.{key} must be an integer >= {minimum}, got {value!r}")
    return value


def _ms(value: Any, key: str) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
    if not ok:
        raise WorkloadError(f"data.args.{key} must be a number of milliseconds >= 0, got {value!r}")
    return float(value)


def _seed(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**32:
        raise WorkloadError(f"data.args.seed must be an integer in [0, 2**32), got {value!r}")
    return value


class _Synthetic(Dataset):
    """Shared indexing, seeding and per-sample cost of the synthetic sets."""

    def __init__(self, size: Any, transform_cost_ms: Any, latency_ms: Any, seed: Any):
        self.size = _int(size, "size", 1)
        self.transform_cost_ms = _ms(transform_cost_ms, "transform_cost_ms")
        self.latency_ms = _ms(latency_ms, "latency_ms")
        self.seed = _seed(seed)

    def __len__(self) -> int:
        return self.size

    def _generator(self, index: Any) -> torch.Generator:
        i = operator.index(index)
        if i < 0:
            i += self.size
        if not 0 <= i < self.size:
            raise IndexError(f"index {index} is out of range for a data set of {self.size} samples")
        return torch.Generator().manual_seed((self.seed * _SEED_STRIDE + i) % _SEED_MOD)

    def _set_generator(self) -> torch.Generator:
        # The seed just below item 0's: no item of this set can have it (that would take
        # 2**32 - 1 items), so per-set draws never repeat an item's numbers.
        return torch.Generator().manual_seed((self.seed * _SEED_STRIDE - 1) % _SEED_MOD)

    def _make(self, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def __getitem__(self, index: Any) -> tuple[torch.Tensor, torch.Tensor]:
        item = self._make(self._generator(index))
        if self.latency_ms:
            time.sleep(self.latency_ms / 1000.0)
        if self.transform_cost_ms:
            burn_cpu(self.transform_cost_ms)
        return item


class SyntheticImages(_Synthetic):
    """Random float32 images with random int64 labels.

    Args:
        size: Number of samples.
        shape: One image's ``(channels, height, width)``.
        num_classes: Labels are drawn from ``range(num_classes)``.
        transform_cost_ms: CPU milliseconds spent per sample (emulated decode/augment).
        latency_ms: Milliseconds slept per sample (emulated slow storage).
        seed: Selects the data; item ``i`` depends only on ``seed`` and ``i``.
    """

    def __init__(
        self,
        size: int = 2048,
        shape: Sequence[int] = (3, 32, 32),
        num_classes: int = 10,
        transform_cost_ms: float = 0.0,
        latency_ms: float = 0.0,
        seed: int = 0,
    ):
        super().__init__(size, transform_cost_ms, latency_ms, seed)
        # YAML gives a list; anything that is not three positive sizes is a spec error.
        bad = isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence) or len(shape) != 3
        if bad or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in shape):
            raise WorkloadError(
                f"data.args.shape must be 3 positive integers [channels, height, width], got {shape!r}"
            )
        self.shape = tuple(shape)
        self.num_classes = _int(num_classes, "num_classes", 1)
        self.num_outputs = self.num_classes

    def _make(self, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(self.shape, generator=g, dtype=torch.float32)
        y = torch.randint(self.num_classes, (), generator=g, dtype=torch.int64)
        return x, y


class SyntheticTokens(_Synthetic):
    """Random token sequences for next-token prediction.

    Item ``i`` is ``seq_len + 1`` tokens; the input is all but the last and the target
    all but the first, so the target is the input shifted by one.

    Args:
        size: Number of sequences.
        seq_len: Length of the input and of the target.
        vocab_size: Tokens are drawn from ``range(vocab_size)``.
        transform_cost_ms: CPU milliseconds spent per sample (emulated tokenization).
        latency_ms: Milliseconds slept per sample (emulated slow storage).
        seed: Selects the data; item ``i`` depends only on ``seed`` and ``i``.
    """

    def __init__(
        self,
        size: int = 2048,
        seq_len: int = 64,
        vocab_size: int = 256,
        transform_cost_ms: float = 0.0,
        latency_ms: float = 0.0,
        seed: int = 0,
    ):
        super().__init__(size, transform_cost_ms, latency_ms, seed)
        self.seq_len = _int(seq_len, "seq_len", 1)
        self.vocab_size = _int(vocab_size, "vocab_size", 1)

    def _make(self, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.randint(self.vocab_size, (self.seq_len + 1,), generator=g, dtype=torch.int64)
        return tokens[:-1].clone(), tokens[1:].clone()


class SyntheticTabular(_Synthetic):
    """Rows of float32 features with a target that a model can learn.

    The target is a fixed function of the features (a random linear map, drawn once per
    ``seed``), so the training loss falls as it would on real data.

    Args:
        size: Number of rows.
        features: Values per row.
        num_classes: Classes for ``task="classification"``.
        task: ``"classification"`` (int64 label) or ``"regression"`` (float32 ``[1]``).
        transform_cost_ms: CPU milliseconds spent per sample (emulated feature work).
        latency_ms: Milliseconds slept per sample (emulated slow storage).
        seed: Selects the data; item ``i`` depends only on ``seed`` and ``i``.
    """

    TASKS = ("classification", "regression")

    def __init__(
        self,
        size: int = 4096,
        features: int = 32,
        num_classes: int = 10,
        task: str = "classification",
        transform_cost_ms: float = 0.0,
        latency_ms: float = 0.0,
        seed: int = 0,
    ):
        super().__init__(size, transform_cost_ms, latency_ms, seed)
        self.features = _int(features, "features", 1)
        self.num_classes = _int(num_classes, "num_classes", 1)
        if task not in self.TASKS:
            raise WorkloadError(f"data.args.task must be one of {', '.join(self.TASKS)}, got {task!r}")
        self.task = task
        self.num_outputs = self.num_classes if task == "classification" else 1
        g = self._set_generator()
        self.weight = torch.randn(self.features, self.num_outputs, generator=g) / math.sqrt(self.features)

    def _make(self, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(self.features, generator=g, dtype=torch.float32)
        score = x @ self.weight
        if self.task == "classification":
            return x, score.argmax()
        return x, score + 0.1 * torch.randn(1, generator=g)


BUILTIN_DATA = {
    "synthetic-images": SyntheticImages,
    "synthetic-tokens": SyntheticTokens,
    "synthetic-tabular": SyntheticTabular,
}


def build_dataset(name: str, args: Mapping[str, Any]) -> Dataset:
    """Build a built-in data set by name, reporting bad arguments against ``data.args``.

    Args:
        name: A key of ``BUILTIN_DATA``.
        args: Keyword arguments from the spec.

    Returns:
        The data set.

    Raises:
        WorkloadError: Unknown name, unknown argument or invalid value.
    """
    if name not in BUILTIN_DATA:
        raise WorkloadError(f"data.name {name!r} is not a built-in data set ({', '.join(BUILTIN_DATA)})")
    cls = BUILTIN_DATA[name]
    check_kwargs(cls, args, "data.args", name)
    return cls(**args)
