"""Built-in models: ResNet-18/50, an MLP and a small GPT, written with plain torch.nn.

They stand in for the common shapes of training work (convolutions, dense layers,
attention) so a search can run without any user code. Initialization draws from the
global torch RNG only, so a model is the same whenever the caller seeds torch first.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from trainopt.contract.reference import WorkloadError

__all__ = ["ResNet", "MLP", "GPT", "resnet18", "resnet50", "mlp", "gpt", "BUILTIN_MODELS"]

# Up to this image side the ImageNet stem (7x7 stride 2 + max-pool) would shrink a
# 32 px image to 8 px before the first block, so small images get the CIFAR stem.
SMALL_IMAGE_SIDE = 64


def _positive_int(value, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise WorkloadError(f"model.args.{key} must be a positive integer, got {value!r}")
    return value


def _shape(value, key: str, dims: int | None = None) -> tuple[int, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise WorkloadError(f"model.args.{key} must be a list of positive integers, got {value!r}")
    if dims is not None and len(value) != dims:
        raise WorkloadError(f"model.args.{key} must have {dims} entries, got {list(value)!r}")
    return tuple(_positive_int(v, key) for v in value)


def _conv3x3(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, kernel_size=3, stride=stride, padding=1, bias=False)


def _conv1x1(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, kernel_size=1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with a residual connection (ResNet-18/34)."""

    expansion = 1

    def __init__(self, cin: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = _conv3x3(cin, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = _conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = _shortcut(cin, planes * self.expansion, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.downsample(x))


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3, 1x1 expand (by 4) with a residual connection (ResNet-50+).

    The stride sits on the 3x3 convolution, as in torchvision's ResNet v1.5.
    """

    expansion = 4

    def __init__(self, cin: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = _conv1x1(cin, planes)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = _conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = _conv1x1(planes, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = _shortcut(cin, planes * self.expansion, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + self.downsample(x))


def _shortcut(cin: int, cout: int, stride: int) -> nn.Module:
    if stride == 1 and cin == cout:
        return nn.Identity()
    return nn.Sequential(_conv1x1(cin, cout, stride), nn.BatchNorm2d(cout))


class ResNet(nn.Module):
    """A standard ResNet whose stem fits the input size.

    Args:
        block: ``BasicBlock`` or ``Bottleneck``.
        layers: Blocks per stage, e.g. ``(2, 2, 2, 2)``.
        num_classes: Output width of the classifier.
        width: Channels of the first stage (64 in the standard model); later stages
            double it.
        input_shape: One sample's ``(channels, height, width)``.
    """

    def __init__(self, block, layers: Sequence[int], num_classes: int, width: int, input_shape: Sequence[int]):
        super().__init__()
        channels, height, side_w = input_shape
        if min(height, side_w) <= SMALL_IMAGE_SIDE:
            self.conv1 = _conv3x3(channels, width)
            self.maxpool: nn.Module = nn.Identity()
        else:
            self.conv1 = nn.Conv2d(channels, width, kernel_size=7, stride=2, padding=3, bias=False)
            self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        stages = []
        cin = width
        for i, blocks in enumerate(layers):
            planes = width * 2**i
            stage = []
            for j in range(blocks):
                stage.append(block(cin, planes, stride=2 if (i > 0 and j == 0) else 1))
                cin = planes * block.expansion
            stages.append(nn.Sequential(*stage))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes)
        # torchvision's initialization, so the training dynamics match the usual model.
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def _resnet(block, layers, num_classes, width, input_shape) -> ResNet:
    shape = _shape(input_shape, "input_shape", dims=3)
    return ResNet(block, layers, _positive_int(num_classes, "num_classes"), _positive_int(width, "width"), shape)


def resnet18(num_classes: int = 10, width: int = 64, input_shape: Sequence[int] = (3, 224, 224)) -> ResNet:
    """ResNet-18 (BasicBlock, 2-2-2-2).

    Args:
        num_classes: Output width of the classifier.
        width: Channels of the first stage; 64 is the standard model.
        input_shape: One sample's ``(channels, height, width)``; sides up to 64 px get
            a 3x3 stride-1 stem without max-pool, larger ones the 7x7 stride-2 stem.

    Returns:
        The model.
    """
    return _resnet(BasicBlock, (2, 2, 2, 2), num_classes, width, input_shape)


def resnet50(num_classes: int = 10, width: int = 64, input_shape: Sequence[int] = (3, 224, 224)) -> ResNet:
    """ResNet-50 (Bottleneck with expansion 4, 3-4-6-3); arguments as ``resnet18``.

    Returns:
        The model.
    """
    return _resnet(Bottleneck, (3, 4, 6, 3), num_classes, width, input_shape)


class MLP(nn.Module):
    """Flatten, ``layers`` hidden Linear+ReLU layers, then a Linear classifier.

    Args:
        in_features: Number of input values per sample.
        hidden: Width of each hidden layer.
        layers: Number of hidden layers (0 gives a linear model).
        num_classes: Output width.
    """

    def __init__(self, in_features: int, hidden: int, layers: int, num_classes: int):
        super().__init__()
        parts: list[nn.Module] = [nn.Flatten()]
        width = in_features
        for _ in range(layers):
            parts += [nn.Linear(width, hidden), nn.ReLU(inplace=True)]
            width = hidden
        parts.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def mlp(input_shape: Sequence[int] = (32,), hidden: int = 256, layers: int = 2, num_classes: int = 10) -> MLP:
    """A multi-layer perceptron over the flattened input.

    Args:
        input_shape: One sample's input shape (any rank; it is flattened).
        hidden: Width of each hidden layer.
        layers: Number of hidden layers.
        num_classes: Output width (1 for a scalar regression).

    Returns:
        The model.
    """
    shape = _shape(input_shape, "input_shape")
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 0:
        raise WorkloadError(f"model.args.layers must be an integer >= 0, got {layers!r}")
    return MLP(math.prod(shape), _positive_int(hidden, "hidden"), layers, _positive_int(num_classes, "num_classes"))


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention where each position sees only earlier ones."""

    def __init__(self, n_embd: int, n_head: int, dropout: float):
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)
        self.dropout = dropout
        self.resid_drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        # The fused kernel is what current training code uses; the knobs should be
        # measured against it, not against a hand-written softmax(QK^T)V.
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        return self.resid_drop(self.proj(y))


class Block(nn.Module):
    """Pre-LayerNorm transformer block: attention then a 4x GELU MLP, each residual."""

    def __init__(self, n_embd: int, n_head: int, dropout: float):
        super().__init__()
        self.ln1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout)
        self.ln2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd), nn.Dropout(dropout)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """A GPT-style decoder; ``forward(idx [B, T])`` returns logits ``[B, T, vocab_size]``.

    Args:
        vocab_size: Number of token ids.
        seq_len: Longest sequence (size of the learned position table).
        n_layer: Number of transformer blocks.
        n_head: Attention heads per block; must divide ``n_embd``.
        n_embd: Embedding width.
        dropout: Dropout probability used while training.
    """

    def __init__(self, vocab_size: int, seq_len: int, n_layer: int, n_head: int, n_embd: int, dropout: float):
        super().__init__()
        self.seq_len = seq_len
        self.tok_emb = nn.Embedding(vocab_size, n_embd)
        self.pos_emb = nn.Embedding(seq_len, n_embd)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(n_embd, n_head, dropout) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = self.tok_emb.weight  # tied, as in GPT-2
        # GPT-2's initialization; residual projections are scaled down with depth so
        # the residual stream's variance does not grow with the number of blocks.
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
        for block in self.blocks:
            nn.init.normal_(block.attn.proj.weight, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))
            nn.init.normal_(block.mlp[2].weight, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        if t > self.seq_len:
            raise ValueError(f"sequence length {t} exceeds the model's seq_len {self.seq_len}")
        pos = torch.arange(t, device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def gpt(
    vocab_size: int = 256, seq_len: int = 64, n_layer: int = 2, n_head: int = 4, n_embd: int = 128, dropout: float = 0.0
) -> GPT:
    """A small GPT-style language model.

    Args:
        vocab_size: Number of token ids.
        seq_len: Longest sequence the model accepts.
        n_layer: Number of transformer blocks.
        n_head: Attention heads; must divide ``n_embd``.
        n_embd: Embedding width.
        dropout: Dropout probability in [0, 1).

    Returns:
        The model.
    """
    sizes = {"vocab_size": vocab_size, "seq_len": seq_len, "n_layer": n_layer, "n_head": n_head, "n_embd": n_embd}
    for key, value in sizes.items():
        _positive_int(value, key)
    if n_embd % n_head:
        raise WorkloadError(f"model.args.n_embd ({n_embd}) must be a multiple of model.args.n_head ({n_head})")
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
        raise WorkloadError(f"model.args.dropout must be a number in [0, 1), got {dropout!r}")
    return GPT(vocab_size, seq_len, n_layer, n_head, n_embd, float(dropout))


BUILTIN_MODELS = {"resnet18": resnet18, "resnet50": resnet50, "mlp": mlp, "gpt": gpt}
