"""Hugging Face training code as it is, for docs/your-code.md's Hugging Face spec (``your_code_hf.py:...``).

* ``tiny_bert``: a ``BertForSequenceClassification`` built from a small ``BertConfig``
  (random weights, nothing downloaded); called as ``model(**batch)``, it returns an output
  whose ``.loss`` trainopt backpropagates (``loss: model``);
* ``reviews``: a ``datasets.Dataset`` of tokenized sentences of unequal length, in torch
  format (``torch_reviews``: the same as a plain torch data set);
* ``collate``: ``DataCollatorWithPadding``, padding each batch to its longest sentence.

The tokenizer is a word-level ``tokenizers`` model over an in-memory vocabulary, wrapped
in ``PreTrainedTokenizerFast``: no network, no files.
"""

from __future__ import annotations

import random

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    DataCollatorWithPadding,
    PreTrainedTokenizerFast,
)

WORDS = ("good bad fine great poor slow fast long short warm cold bright dark plain rich thin "
         "film book song plot cast story scene actor voice music ending start middle twist").split()
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]


def tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer over ``WORDS``, built in memory."""
    vocab = {token: i for i, token in enumerate(SPECIALS + list(WORDS))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="[PAD]", unk_token="[UNK]",
                                   cls_token="[CLS]", sep_token="[SEP]")


TOKENIZER = tokenizer()
# The collate function the spec names: ``data.collate: "your_code_hf.py:collate"``.
collate = DataCollatorWithPadding(TOKENIZER, return_tensors="pt")


def tiny_bert(hidden: int = 32, layers: int = 2, heads: int = 2, num_labels: int = 2,
              max_len: int = 128) -> BertForSequenceClassification:
    """A small BERT classifier from a config: random weights, nothing downloaded."""
    config = BertConfig(vocab_size=TOKENIZER.vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=heads, intermediate_size=hidden * 2, max_position_embeddings=max_len,
                        num_labels=num_labels, pad_token_id=TOKENIZER.pad_token_id)
    return BertForSequenceClassification(config)


def _sentences(size: int, max_words: int, seed: int) -> tuple[list[str], list[int]]:
    rng = random.Random(seed)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, max_words))) for _ in range(size)]
    labels = [rng.randint(0, 1) for _ in range(size)]
    return texts, labels


def reviews(size: int = 256, max_words: int = 24, seed: int = 0):
    """A ``datasets.Dataset`` of ``{input_ids, attention_mask, labels}`` in torch format, unpadded."""
    import datasets

    texts, labels = _sentences(size, max_words, seed)
    encoded = TOKENIZER(texts, truncation=True, max_length=126)
    data = datasets.Dataset.from_dict({**encoded, "labels": labels})
    data.set_format("torch", columns=["input_ids", "attention_mask", "labels"])
    return data


class TorchReviews(torch.utils.data.Dataset):
    """The same items as a plain torch data set of dicts of tensors."""

    def __init__(self, size: int = 256, max_words: int = 24, seed: int = 0):
        texts, labels = _sentences(size, max_words, seed)
        encoded = TOKENIZER(texts, truncation=True, max_length=126)
        self.items = [
            {"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask), "labels": torch.tensor(label)}
            for ids, mask, label in zip(encoded["input_ids"], encoded["attention_mask"], labels)
        ]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return self.items[i]


def torch_reviews(**kwargs) -> TorchReviews:
    return TorchReviews(**kwargs)
