"""A small GPT for the GPT workload: pre-norm transformer blocks, causal self-attention, learned
positions, tied input and output embeddings; and its AdamW groups and LR schedule.

The sizes come from ``PRESETS`` (``tiny`` for tests, ``small`` for CPU runs, ``25m`` and
``100m`` for benchmarks) or from explicit numbers. The parameter names put every transformer
block under ``blocks.<i>.``, the unit that sharded training gathers together
(``dyntrain.elastic.sharding.owners.group_units``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from dyntrain.errors import ConfigError


@dataclass(frozen=True)
class GPTConfig:
    """The shape of a GPT; validated on construction.

    Args:
        n_layer: Transformer blocks.
        n_head: Attention heads per block; must divide ``d_model``.
        d_model: Width of the residual stream (the MLP is 4x as wide).
        seq_len: The longest sequence (learned positions).
        vocab: Tokens (256: bytes).
        dropout: Dropout on the embeddings, the attention weights and each block's outputs.

    Raises:
        ConfigError: A size below 1, ``n_head`` not dividing ``d_model``, or ``dropout`` outside
            [0, 1).
    """

    n_layer: int
    n_head: int
    d_model: int
    seq_len: int
    vocab: int = 256
    dropout: float = 0.0

    def __post_init__(self) -> None:
        for name in ("n_layer", "n_head", "d_model", "seq_len", "vocab"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.d_model % self.n_head:
            raise ConfigError(f"n_head {self.n_head} does not divide d_model {self.d_model}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"dropout must be in [0, 1), got {self.dropout}")

    def parameters(self) -> int:
        """The model's parameter count (the tied embedding counted once)."""
        d = self.d_model
        block = 12 * d * d + 4 * d  # qkv, proj, two MLP matrices; two LayerNorms
        return self.n_layer * block + (self.vocab + self.seq_len) * d + 2 * d


# name -> (n_layer, n_head, d_model)
PRESETS: dict[str, tuple[int, int, int]] = {
    "tiny": (2, 4, 128),  # ~0.45M parameters: tests
    "small": (4, 4, 256),  # ~3.3M: a CPU run
    "25m": (8, 8, 512),  # ~25M: benchmarks
    "100m": (14, 12, 768),  # ~100M: benchmarks
}


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention in which a position sees only itself and earlier positions."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head, self.dropout = cfg.n_head, cfg.dropout
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.n_head, d // self.n_head).transpose(1, 2)
                   for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class MLP(nn.Module):
    """Two linear layers with a GELU between, 4x wider inside."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.up = nn.Linear(cfg.d_model, 4 * cfg.d_model, bias=False)
        self.down = nn.Linear(4 * cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    """A pre-norm transformer block: ``x + attn(ln1(x))``, then ``x + mlp(ln2(x))``."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attn(self.ln1(x)))
        return x + self.drop(self.mlp(self.ln2(x)))


class GPT(nn.Module):
    """Token and learned position embeddings, ``n_layer`` blocks, a final LayerNorm, and logits
    from the token embedding itself (tied weights: one tensor, ``tok.weight``).

    Initialised as GPT-2: weights normal(0, 0.02), the projections that write into the residual
    stream scaled down by ``sqrt(2 * n_layer)``.

    Args:
        cfg: The model's shape.
    """

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Parameter(torch.zeros(cfg.seq_len, cfg.d_model))
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * cfg.n_layer) if name.endswith(
                    ("attn.proj.weight", "mlp.down.weight")) else 0.02
                nn.init.normal_(p, mean=0.0, std=std)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits (batch x time x vocab) for token ids ``idx`` (batch x time)."""
        t = idx.shape[1]
        if t > self.cfg.seq_len:
            raise ValueError(f"a sequence of {t} tokens is longer than seq_len "
                             f"{self.cfg.seq_len}")
        x = self.drop(self.tok(idx) + self.pos[:t])
        for block in self.blocks:
            x = block(x)
        return F.linear(self.ln_f(x), self.tok.weight)


def adamw_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """AdamW parameter groups: weight decay on matrices and embeddings, none on LayerNorm
    parameters (anything of fewer than two dimensions).

    Args:
        model: Its trainable parameters are grouped.
        weight_decay: The decayed group's weight decay.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


class WarmupCosineLR(torch.optim.lr_scheduler.LRScheduler):
    """Linear warmup to each group's LR over ``warmup_steps``, then cosine decay to
    ``min_ratio`` of it at ``total_steps``; one value per optimizer step, a pure function of the
    step (its state is plain numbers: it travels in checkpoints and state hand-overs).

    Optimizer step ``s`` (0-based) uses ``lr * (s + 1) / warmup_steps`` during the warmup.

    Args:
        optimizer: The optimizer whose groups it sets.
        warmup_steps: Steps of linear warmup (0: none).
        total_steps: Steps of the whole run; the decay ends there.
        min_ratio: The final LR as a fraction of the peak.

    Raises:
        ConfigError: A negative warmup, ``total_steps`` below 1, or ``min_ratio`` outside
            [0, 1].
    """

    def __init__(self, optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int,
                 min_ratio: float = 0.1) -> None:
        if warmup_steps < 0 or total_steps < 1 or not 0.0 <= min_ratio <= 1.0:
            raise ConfigError(f"warmup steps {warmup_steps} (>= 0), total steps {total_steps} "
                              f"(>= 1) or minimum LR ratio {min_ratio} (in [0, 1]) out of range")
        self.warmup_steps, self.total_steps, self.min_ratio = warmup_steps, total_steps, min_ratio
        super().__init__(optimizer)

    def factor(self, step: int) -> float:
        """The LR of optimizer step ``step`` as a fraction of the peak.

        Args:
            step: Steps applied before this one.
        """
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        span = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / span)
        return self.min_ratio + (1.0 - self.min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    def get_lr(self) -> list[float]:
        return [base * self.factor(self.last_epoch) for base in self.base_lrs]
