"""The article's optimizer (Nesterov SGD, weight decay optionally not on BatchNorm and biases)
and LARS (You et al. 2017) for very large batches."""

from __future__ import annotations

import torch
from torch import nn


def param_groups(model: nn.Module, weight_decay: float, decay_bn_and_bias: bool) -> list[dict]:
    """Two groups: weights of convolutions/linears, and BatchNorm parameters plus biases (no
    weight decay and no LARS scaling there unless ``decay_bn_and_bias``).

    Args:
        model: Its parameters that require a gradient are grouped.
        weight_decay: The first group's weight decay.
        decay_bn_and_bias: Put BatchNorm parameters and biases in the first group too.

    Returns:
        Parameter groups for a ``torch.optim.Optimizer``, each with a ``lars`` flag.
    """
    decay, no_decay = [], []
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            if not p.requires_grad:
                continue
            plain = isinstance(module, nn.modules.batchnorm._BatchNorm) or name == "bias"
            (no_decay if plain and not decay_bn_and_bias else decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay, "lars": True}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0, "lars": False})
    return groups


class LARS(torch.optim.Optimizer):
    """SGD with momentum whose step per layer is scaled by the trust ratio
    ``eta * |w| / (|g| + weight_decay * |w|)`` (You, Gitman, Ginsburg 2017). Groups with
    ``lars=False`` (BatchNorm, biases) take plain momentum SGD steps.

    Args:
        params: Parameters or parameter groups (``param_groups`` makes them).
        lr: The learning rate.
        momentum: Momentum factor.
        weight_decay: L2 weight decay, added to the gradient.
        eta: The trust coefficient.
        nesterov: Nesterov momentum.
    """

    def __init__(self, params, lr: float, momentum: float = 0.9, weight_decay: float = 0.0,
                 eta: float = 0.001, nesterov: bool = False) -> None:
        super().__init__(params, {"lr": lr, "momentum": momentum, "weight_decay": weight_decay,
                                  "eta": eta, "nesterov": nesterov, "lars": True})

    @torch.no_grad()
    def step(self, closure=None):
        """One optimizer step.

        Args:
            closure: Re-evaluates the model and returns the loss (optional).
        """
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            wd, mom, lr = group["weight_decay"], group["momentum"], group["lr"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                d = p.grad.add(p, alpha=wd) if wd else p.grad.clone()
                if group["lars"]:
                    w_norm, g_norm = torch.linalg.vector_norm(p), torch.linalg.vector_norm(p.grad)
                    trust = group["eta"] * w_norm / (g_norm + wd * w_norm)
                    d.mul_(torch.where((w_norm > 0) & (g_norm > 0), trust, 1.0))
                state = self.state[p]
                buf = state.get("momentum_buffer")
                if buf is None:
                    buf = state["momentum_buffer"] = d.clone()
                else:
                    buf.mul_(mom).add_(d)
                p.add_(d.add(buf, alpha=mom) if group["nesterov"] else buf, alpha=-lr)
        return loss
