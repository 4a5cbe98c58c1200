"""The P-EAGLE draft as a ``torch.nn.Module``: EAGLE-3's and ``mask_hidden`` (:mod:`specfmt.algorithms.peagle`
says what it computes and where from).

This module imports torch at its top; :mod:`specfmt.algorithms.peagle` imports it only when a draft runs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .eagle3_nn import Eagle3Draft


class PEagleDraft(Eagle3Draft):
    """The P-EAGLE draft: :class:`~specfmt.algorithms.eagle3_nn.Eagle3Draft` and ``mask_hidden``
    [1, 1, n_aux·H_t], the tap states every parallel (mask) position reads."""

    def __init__(self, cfg: dict[str, Any]):
        super().__init__(cfg)
        width = self.fc.in_features  # n_aux·H_t
        self.mask_hidden = nn.Parameter(torch.randn(1, 1, width))  # speculators PEagleDraftModel: torch.randn
        self.mask_token_id = int(cfg["mask_token_id"])

    def mask_features(self) -> "torch.Tensor":
        """[H] ``combine(mask_hidden)``: the hidden input of every mask position (vLLM's
        ``parallel_drafting_hidden_state_tensor``, ``combine_hidden_states(mask_hidden)``)."""
        return self.combine(self.mask_hidden.reshape(1, -1))[0]


__all__ = ["PEagleDraft"]
