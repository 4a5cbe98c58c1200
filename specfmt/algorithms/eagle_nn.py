"""The EAGLE-1/2 (and HASS) draft as a ``torch.nn.Module``: the one forward pass the reference proposer,
the trainer, ``validate --run`` and the converters' checks share (:mod:`specfmt.algorithms.eagle` says
what it computes and where from).

This module imports torch at its top; :mod:`specfmt.algorithms.eagle` imports it only when a draft runs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from . import layers
from .nn_layers import Decoder, Layer


class Eagle1Draft(Decoder):
    """The EAGLE-1 draft: ``x = fc(cat([embed, h], -1))``, then Llama layers, layer 0 without its input
    norm; its state-dict names are the specfmt tensor names.

    Args:
        cfg: the decoder's Llama fields (a specfmt eagle ``config.json``: they are at its top level).
        fc_bias: ``fc`` has a bias [H], as research checkpoints of the Vicuna/LLaMA-2 generation do; the
            format has none (the converters fold it into the layers' biases, exactly).
    """

    def __init__(self, cfg: dict[str, Any], fc_bias: bool = False):
        super().__init__()
        self.cfg = cfg
        H = cfg["hidden_size"]
        self.fc = nn.Linear(2 * H, H, bias=fc_bias)
        self.layers = nn.ModuleList([Layer(cfg, False, input_norm=i > 0) for i in range(cfg["num_hidden_layers"])])
        layers.set_windows(self.layers, cfg)
        self.embed_tokens = None
        self._init_rope(cfg)

    def forward(self, embeds, hidden, positions, past=None, mask=None, rows=None):
        """One draft pass.

        Args:
            embeds: [B, T, H] token embeddings (of the token after each position).
            hidden: [B, T, H] per position: the verifier's last hidden state (after its final norm) for
                verified positions, the draft's own fed-back feature for drafted ones.
            positions: [T] rotary positions.
            past / mask: as :meth:`specfmt.algorithms.nn_layers.Decoder._attend` (None: causal, no past).
            rows: several sequences laid one after another (B = 1, :class:`~specfmt.algorithms.layers.Rows`),
                each with its own KV cache; the features then come for each row's last position only.

        Returns:
            ``(features [B, T, H], kv)``: the draft's output features (logits are the verifier's
            ``lm_head(features)``) and this pass's (k, v) per layer.
        """
        if mask is None and not past and rows is None:
            T = embeds.shape[1]
            mask = torch.ones(T, T, dtype=torch.bool, device=embeds.device).tril()
        past = past or [[] for _ in self.layers]
        x = self.fc(torch.cat([embeds, hidden], dim=-1))
        kv = []
        for i, layer in enumerate(self.layers):
            a, new = self._attend(layer.self_attn, layer.input_layernorm(x), positions, past[i], mask, rows, i)
            kv.append(new)
            x = x + a
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        if rows is not None:
            x = x[:, rows.ends()]
        return x, kv


__all__ = ["Eagle1Draft"]
