"""Medusa heads as a ``torch.nn.Module``: the one forward pass the reference proposer, the trainer and
``validate --run`` share (:mod:`specfmt.algorithms.medusa` says what it computes and where from).

This module imports torch at its top; :mod:`specfmt.algorithms.medusa` imports it only when heads run.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class MedusaHeads(nn.Module):
    """K Medusa heads of L residual blocks each; state-dict names are the specfmt tensor names
    (``blocks.{i}.layers.{j}.*``, ``lm_heads.{i}.weight`` or the shared ``lm_head.weight``).

    Args:
        cfg: the fields ``hidden_size`` H, ``vocab_size`` V, ``num_heads`` K, ``num_hidden_layers`` L,
            ``medusa_fc_bias`` and ``original_lm_head`` (a specfmt medusa ``config.json`` has them).
    """

    def __init__(self, cfg: dict[str, Any]):
        super().__init__()
        self.cfg = cfg
        H, V, K, L = cfg["hidden_size"], cfg["vocab_size"], cfg["num_heads"], cfg["num_hidden_layers"]
        bias = bool(cfg["medusa_fc_bias"])
        self.blocks = nn.ModuleList()
        for _ in range(K):
            block = nn.Module()
            block.layers = nn.ModuleList([nn.Linear(H, H, bias=bias) for _ in range(L)])
            self.blocks.append(block)
        if cfg["original_lm_head"]:
            self.lm_head = nn.Linear(H, V, bias=False)
        else:
            self.lm_heads = nn.ModuleList([nn.Linear(H, V, bias=False) for _ in range(K)])

    def head(self, i: int, h):
        """Head i on [..., H] verifier features -> [..., V] logits of the token i+2 places ahead."""
        x = h
        for lin in self.blocks[i].layers:
            x = x + nn.functional.silu(lin(x))
        return (self.lm_head if hasattr(self, "lm_head") else self.lm_heads[i])(x)

    def forward(self, h):
        """[..., H] -> [K, ..., V]: every head's logits."""
        return torch.stack([self.head(i, h) for i in range(len(self.blocks))])


__all__ = ["MedusaHeads"]
