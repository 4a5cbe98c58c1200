"""The EAGLE-3 draft as a ``torch.nn.Module``: the one forward pass the reference proposer, the trainer
and ``validate --run`` share (:mod:`specfmt.algorithms.eagle3` says what it computes and where from).

This module imports torch at its top; :mod:`specfmt.algorithms.eagle3` imports it only when a draft runs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from . import layers
from .nn_layers import Decoder, Layer, RMSNorm


class Eagle3Draft(Decoder):
    """The EAGLE-3 draft (:func:`specfmt.algorithms.eagle3.draft_module` says what it computes); its
    state-dict names are the specfmt tensor names. A variant's draft subclasses it."""

    def __init__(self, cfg: dict[str, Any]):
        super().__init__()
        tlc = cfg["transformer_layer_config"]
        self.cfg = cfg
        H = tlc["hidden_size"]
        Ht = cfg.get("target_hidden_size") or H
        n_aux = len(cfg["eagle_aux_hidden_state_layer_ids"])
        eps = tlc.get("rms_norm_eps", 1e-6)  # transformers LlamaConfig default, which vLLM reads too; the schema does not require it
        self.eps = eps
        self.taps = list(cfg["eagle_aux_hidden_state_layer_ids"])
        self.norm_before_residual = bool(cfg.get("norm_before_residual"))
        self.norm_output = bool(cfg.get("norm_output"))
        if cfg.get("norm_before_fc"):
            self.input_norm = RMSNorm(n_aux * Ht, eps)
        if cfg.get("fc_norm"):
            self.fc_norm = nn.ModuleList([RMSNorm(Ht, eps) for _ in range(n_aux)])
        self.fc = nn.Linear(n_aux * Ht, H, bias=False)
        self.layers = nn.ModuleList([Layer(tlc, i == 0) for i in range(tlc["num_hidden_layers"])])
        layers.set_windows(self.layers, tlc)
        self.norm = RMSNorm(H, eps)
        V, Vd = tlc["vocab_size"], cfg["draft_vocab_size"]
        self.lm_head = nn.Linear(H, Vd, bias=False)
        if Vd != V:
            self.register_buffer("d2t", torch.zeros(Vd, dtype=torch.long))
            self.register_buffer("t2d", torch.zeros(V, dtype=torch.bool))
        self.embed_tokens = None
        self._init_rope(tlc)

    # -- pieces ---------------------------------------------------------
    def combine(self, aux: "torch.Tensor") -> "torch.Tensor":
        """[..., n_aux·H_t] verifier tap states -> [..., H] (``combine_hidden_states``)."""
        if hasattr(self, "input_norm"):
            aux = self.input_norm(aux)
        if hasattr(self, "fc_norm"):
            chunks = aux.chunk(len(self.fc_norm), dim=-1)
            aux = torch.cat([n(c) for n, c in zip(self.fc_norm, chunks)], dim=-1)
        return self.fc(aux)

    def target_ids(self) -> "torch.Tensor":
        """[Vd] verifier id of each draft id: ``i + d2t[i]`` (EAGLE-3 ``cnets.py``; vLLM ``compute_logits``)."""
        base = torch.arange(self.lm_head.out_features, device=self.lm_head.weight.device)
        return base + self.d2t if hasattr(self, "d2t") else base

    def forward(self, embeds, hidden, positions, past=None, mask=None, rows=None):
        """One draft pass.

        Args:
            embeds: [B, T, H] token embeddings (of the token after each position).
            hidden: [B, T, H] per position: ``combine(taps)`` for verified positions, the
                draft's own fed-back state for drafted ones.
            positions: [T] rotary positions.
            past: per layer, a list of (k, v) [B, n_kv, T', hd] from earlier passes that
                these queries may also attend to (training-time test); None for none.
            mask: [T, T'+T] boolean attention mask (True = attend); None = causal.
            rows: several sequences laid one after another (B = 1, :class:`~specfmt.algorithms.layers.Rows`),
                each with its own KV cache, instead of ``past`` and ``mask``; the logits and
                feedback then come for each row's last position only ([1, rows, .]).

        Returns:
            ``(logits [B, T, Vd], feedback [B, T, H], kv)``: draft-vocabulary logits, the
            state fed back for the next drafted position (the pre-norm output, or the
            normed one with ``norm_output``), and this pass's (k, v) per layer.
        """
        if mask is None and not past and rows is None:
            T = embeds.shape[1]
            mask = torch.ones(T, T, dtype=torch.bool, device=embeds.device).tril()
        past = past or [[] for _ in self.layers]
        kv = []
        x = hidden
        for i, layer in enumerate(self.layers):
            if layer.first:
                e = layer.input_layernorm(embeds)
                if self.norm_before_residual:
                    x = layer.hidden_norm(x)
                    residual = x
                else:
                    residual = x
                    x = layer.hidden_norm(x)
                x = torch.cat([e, x], dim=-1)
            else:
                residual = x
                x = layer.input_layernorm(x)
            a, new = self._attend(layer.self_attn, x, positions, past[i], mask, rows, i)
            kv.append(new)
            x = residual + a
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        if rows is not None:
            x = x[:, rows.ends()]
        normed = self.norm(x)
        return self.lm_head(normed), (normed if self.norm_output else x), kv


__all__ = ["Eagle3Draft"]
