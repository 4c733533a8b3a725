"""A LightningModule as it is, for docs/your-code.md's Lightning spec (``your_code_lightning.py:...``).

``LitClassifier`` logs with ``self.log``, returns ``{"loss": ...}`` from ``training_step``,
takes AdamW and a per-step linear warm-up from ``configure_optimizers`` and its data from
``train_dataloader`` (sequences of unequal length, padded per batch by its collate
function). ``TokenData`` is the same data as a LightningDataModule. The rest are the
forms trainopt refuses, each with a one-line reason: manual optimization, two optimizers,
no ``training_step``. Everything is synthetic and small: a spec measures in seconds on a CPU.
"""

from __future__ import annotations

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Tokens(Dataset):
    """Token sequences of unequal length (4 to ``max_len``) with a class label each."""

    def __init__(self, size: int = 256, vocab_size: int = 100, max_len: int = 32, num_classes: int = 2,
                 long_item: int | None = None):
        g = torch.Generator().manual_seed(0)
        lengths = torch.randint(4, max_len + 1, (size,), generator=g)
        if long_item is not None:
            # One item far longer than the rest: what a batch-size probe must find.
            lengths[size // 2] = long_item
        self.items = [torch.randint(1, vocab_size, (int(n),), generator=g) for n in lengths]
        self.labels = torch.randint(0, num_classes, (size,), generator=g)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.items[i], "labels": self.labels[i]}


def pad(items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Pad a list of items to the longest: ``{input_ids, attention_mask, labels}``."""
    longest = max(len(item["input_ids"]) for item in items)
    ids = torch.zeros(len(items), longest, dtype=torch.long)
    mask = torch.zeros(len(items), longest, dtype=torch.long)
    for row, item in enumerate(items):
        n = len(item["input_ids"])
        ids[row, :n] = item["input_ids"]
        mask[row, :n] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.stack([item["labels"] for item in items])}


class LitClassifier(pl.LightningModule):
    """Mean-pooled embeddings and a linear head; AdamW with a linear warm-up stepped every optimizer step."""

    def __init__(self, vocab_size: int = 100, dim: int = 32, num_classes: int = 2, lr: float = 1e-3,
                 warmup_steps: int = 10, size: int = 256, max_len: int = 32, long_item: int | None = None):
        super().__init__()
        self.save_hyperparameters()
        self.embed = nn.Embedding(vocab_size, dim)
        self.body = nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, dim))
        self.head = nn.Linear(dim, num_classes)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        mask = attention_mask.unsqueeze(-1).to(self.embed.weight.dtype)
        pooled = (self.embed(input_ids) * mask).sum(1) / mask.sum(1).clamp(min=1)
        return self.head(self.body(pooled))

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> dict[str, torch.Tensor]:
        logits = self(batch["input_ids"], batch["attention_mask"])
        loss = F.cross_entropy(logits, batch["labels"])
        self.log("train_loss", loss, prog_bar=True)
        return {"loss": loss}

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
        warmup = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.1, total_iters=self.hparams.warmup_steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": warmup, "interval": "step", "frequency": 1}}

    def train_dataloader(self) -> DataLoader:
        data = Tokens(self.hparams.size, self.hparams.vocab_size, self.hparams.max_len, self.hparams.num_classes,
                      self.hparams.long_item)
        return DataLoader(data, batch_size=16, shuffle=True, collate_fn=pad)


def classifier(**kwargs) -> LitClassifier:
    """The model factory the spec names: ``model: {name: "your_code_lightning.py:classifier"}``."""
    return LitClassifier(**kwargs)


class TokenData(pl.LightningDataModule):
    """The same data as a LightningDataModule (``data: {datamodule: ...}``)."""

    def __init__(self, size: int = 256, vocab_size: int = 100, max_len: int = 32):
        super().__init__()
        self.size, self.vocab_size, self.max_len = size, vocab_size, max_len
        self.train: Tokens | None = None

    def setup(self, stage: str) -> None:
        self.train = Tokens(self.size, self.vocab_size, self.max_len)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train, batch_size=16, shuffle=True, collate_fn=pad)


def token_data(**kwargs) -> TokenData:
    """The data-module factory: ``data: {datamodule: "your_code_lightning.py:token_data"}``."""
    return TokenData(**kwargs)


# ---- what trainopt refuses, with the alternative named ------------------------------------------


class ManualClassifier(LitClassifier):
    """Manual optimization: the module steps its own optimizer, so trainopt's knobs could not apply."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.automatic_optimization = False


class TwoOptimizers(LitClassifier):
    """Two optimizers (a GAN's shape): one step of trainopt is one optimizer step."""

    def configure_optimizers(self):
        return [torch.optim.SGD(self.body.parameters(), lr=0.1), torch.optim.SGD(self.head.parameters(), lr=0.1)]


class NoStep(pl.LightningModule):
    """A LightningModule without training_step."""

    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(4, 2)


def manual(**kwargs) -> ManualClassifier:
    return ManualClassifier(**kwargs)


def two_optimizers(**kwargs) -> TwoOptimizers:
    return TwoOptimizers(**kwargs)


def no_step() -> NoStep:
    return NoStep()
