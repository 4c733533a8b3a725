"""Training code of three shapes, as docs/your-code.md's specs name it (``your_code.py:...``).

* ``(input, target)`` pairs with a named loss: ``pairs`` and ``small_cnn``;
* ``loss: model``: ``tokens`` (sequences of unequal length), ``pad_collate`` (dict batches of
  ``input_ids``, ``attention_mask``, ``labels``) and ``classifier``, whose forward returns
  its own loss as a Hugging Face model does;
* ``step:``: ``scenes`` (nested dict batches with an image inside), ``scene_net`` and
  ``train_step(model, batch)``, the forward and loss of one batch.

Everything is synthetic and small, so each spec measures in seconds on a CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

# ---- (input, target) pairs ----------------------------------------------------------------------


class Pairs(Dataset):
    """``(image [3, side, side], label)`` pairs."""

    def __init__(self, size: int, side: int, num_classes: int):
        g = torch.Generator().manual_seed(0)
        self.images = torch.randn(size, 3, side, side, generator=g)
        self.labels = torch.randint(0, num_classes, (size,), generator=g)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        return self.images[i], self.labels[i]


def pairs(size: int = 256, side: int = 16, num_classes: int = 4) -> Pairs:
    return Pairs(size, side, num_classes)


def small_cnn(num_classes: int = 4, width: int = 8) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, num_classes)
    )


# ---- loss: model -----------------------------------------------------------------------------------


class Tokens(Dataset):
    """``{"input_ids": [n], "label": int}`` items, n from 4 to ``max_len``."""

    def __init__(self, size: int, vocab_size: int, max_len: int, num_classes: int):
        g = torch.Generator().manual_seed(0)
        self.items = []
        for _ in range(size):
            n = int(torch.randint(4, max_len + 1, (1,), generator=g))
            ids = torch.randint(1, vocab_size, (n,), generator=g)
            self.items.append({"input_ids": ids, "label": int(ids[:2].sum()) % num_classes})

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        return self.items[i]


def tokens(size: int = 256, vocab_size: int = 100, max_len: int = 32, num_classes: int = 2) -> Tokens:
    return Tokens(size, vocab_size, max_len, num_classes)


def pad_collate(items: list[dict]) -> dict:
    """Pad to the batch's longest sequence; the mask marks the real tokens."""
    longest = max(len(item["input_ids"]) for item in items)
    input_ids = torch.zeros(len(items), longest, dtype=torch.long)
    attention_mask = torch.zeros(len(items), longest, dtype=torch.long)
    for row, item in enumerate(items):
        n = len(item["input_ids"])
        input_ids[row, :n] = item["input_ids"]
        attention_mask[row, :n] = 1
    labels = torch.tensor([item["label"] for item in items])
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


@dataclass
class Output:
    loss: torch.Tensor | None
    logits: torch.Tensor


class Classifier(nn.Module):
    """Embedding, one self-attention block, mean pooling over the real tokens, a linear head."""

    def __init__(self, vocab_size: int, dim: int, num_classes: int):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, dim, padding_idx=0)
        self.attn = nn.MultiheadAttention(dim, num_heads=2, batch_first=True)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, input_ids, attention_mask, labels=None):
        h = self.embed(input_ids)
        attended, _ = self.attn(h, h, h, key_padding_mask=attention_mask == 0, need_weights=False)
        weights = attention_mask.unsqueeze(-1).to(attended.dtype)
        logits = self.head(((h + attended) * weights).sum(1) / weights.sum(1))
        loss = F.cross_entropy(logits, labels) if labels is not None else None
        return Output(loss, logits)


def classifier(vocab_size: int = 100, dim: int = 32, num_classes: int = 2) -> Classifier:
    return Classifier(vocab_size, dim, num_classes)


# ---- step ------------------------------------------------------------------------------------------


class Scenes(Dataset):
    """``{"image": {"pixels": [3, side, side]}, "meta": {"scale": [1]}, "label": int}`` items."""

    def __init__(self, size: int, side: int, num_classes: int):
        g = torch.Generator().manual_seed(0)
        self.pixels = torch.randn(size, 3, side, side, generator=g)
        self.scale = torch.rand(size, 1, generator=g)
        self.labels = torch.randint(0, num_classes, (size,), generator=g)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict:
        return {"image": {"pixels": self.pixels[i]}, "meta": {"scale": self.scale[i]}, "label": int(self.labels[i])}


def scenes(size: int = 256, side: int = 16, num_classes: int = 4) -> Scenes:
    return Scenes(size, side, num_classes)


class SceneNet(nn.Module):
    def __init__(self, num_classes: int, width: int):
        super().__init__()
        self.conv = nn.Conv2d(3, width, 3, padding=1)
        self.head = nn.Linear(width + 1, num_classes)

    def forward(self, pixels, scale):
        features = F.adaptive_avg_pool2d(F.relu(self.conv(pixels)), 1).flatten(1)
        return self.head(torch.cat([features, scale.to(features.dtype)], dim=1))


def scene_net(num_classes: int = 4, width: int = 8) -> SceneNet:
    return SceneNet(num_classes, width)


def train_step(model, batch):
    """The forward and loss of one batch; trainopt does backward, the optimizer step and the rest."""
    logits = model(batch["image"]["pixels"], batch["meta"]["scale"])
    return F.cross_entropy(logits, batch["label"])
