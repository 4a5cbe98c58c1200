"""The DFlash draft as a ``torch.nn.Module`` (:mod:`specfmt.algorithms.dflash` says what it computes and where from).

This module imports torch at its top; :mod:`specfmt.algorithms.dflash` imports it only when a draft runs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from . import layers
from .nn_layers import Decoder, Layer, RMSNorm


class DFlashDraft(Decoder):
    """The DFlash draft: ``fc`` [H, n_aux·H_t], ``hidden_norm`` [H], Qwen3 layers (:class:`~specfmt.algorithms.nn_layers.Layer`),
    ``norm`` [H], and ``lm_head`` [Vd, H] with ``d2t`` / ``t2d`` when it has a draft vocabulary; state-dict names
    are the specfmt tensor names. A variant's draft (DFlash2, DSpark) subclasses it.

    Args:
        cfg: a specfmt dflash ``config.json`` (dict).
        own_head: the draft has an ``lm_head`` of its own (default: when Vd < V; a full-vocabulary draft may
            ship one too). Without, :meth:`logits` needs the verifier's head.
    """

    def __init__(self, cfg: dict[str, Any], own_head: bool | None = None):
        super().__init__()
        tlc = cfg["transformer_layer_config"]
        self.cfg = cfg
        H, V, Vd = tlc["hidden_size"], tlc["vocab_size"], cfg["draft_vocab_size"]
        Ht = cfg.get("target_hidden_size") or H
        eps = tlc.get("rms_norm_eps", 1e-6)
        self.taps = list(cfg["aux_hidden_state_layer_ids"])
        self.mask_token_id = int(cfg["mask_token_id"])
        self.fc = nn.Linear(len(self.taps) * Ht, H, bias=False)
        self.hidden_norm = RMSNorm(H, eps)
        self.layers = nn.ModuleList([Layer(tlc, first=False) for _ in range(tlc["num_hidden_layers"])])
        layers.set_windows(self.layers, tlc)
        self.norm = RMSNorm(H, eps)
        self.lm_head = nn.Linear(H, Vd, bias=False) if (Vd < V if own_head is None else own_head) else None
        if Vd != V:
            self.register_buffer("d2t", torch.zeros(Vd, dtype=torch.long))
            self.register_buffer("t2d", torch.zeros(V, dtype=torch.bool))
        self.embed_tokens = None
        self._init_rope(tlc)

    def context(self, aux: "torch.Tensor") -> "torch.Tensor":
        """[..., n_aux·H_t] verifier tap states -> [..., H] ``hidden_norm(fc(aux))``, what every layer projects to context K/V
        (speculators ``_backbone_forward``; vLLM ``combine_hidden_states`` then ``precompute_and_store_context_kv``)."""
        return self.hidden_norm(self.fc(aux))

    def target_ids(self) -> "torch.Tensor":
        """[Vd] verifier id of each draft id: ``i + d2t[i]`` (vLLM ``DFlashQwen3ForCausalLM.compute_logits``)."""
        n = self.cfg["draft_vocab_size"]
        base = torch.arange(n, device=self.norm.weight.device)
        return base + self.d2t if hasattr(self, "d2t") else base

    def forward(self, block: "torch.Tensor", context: "torch.Tensor", context_positions: "torch.Tensor", block_positions: "torch.Tensor",
                causal: bool = False) -> "torch.Tensor":
        """One block pass: [B, S, H] the block's embeddings -> [B, S, H] its normed hidden states.

        Args:
            block: [B, S, H] embeddings of the anchor token and S - 1 mask tokens.
            context: [B, C, H] :meth:`context` of the verified positions the block sees (those before the anchor).
            context_positions: [C] their rotary positions; block_positions: [S] the block's (anchor, anchor + 1, ...).
            causal: each block position sees only the block positions up to itself (vLLM's causal DFlash layers),
                instead of the whole block.
        """
        S = block.shape[1]
        key_positions = torch.cat([context_positions, block_positions])
        mask = torch.ones(S, key_positions.numel(), dtype=torch.bool, device=block.device)
        if causal:
            mask[:, context_positions.numel():] = torch.ones(S, S, dtype=torch.bool, device=block.device).tril()
        x = block
        for layer in self.layers:
            x = self._block_layer(layer, x, context, block_positions, key_positions, mask)
        return self.norm(x)

    def logits(self, hidden: "torch.Tensor", head: "torch.Tensor | None" = None) -> "torch.Tensor":
        """[..., H] -> [..., Vd] with the draft's ``lm_head``, else ``head`` [V, H] (the verifier's; Vd = V)."""
        return self.lm_head(hidden) if self.lm_head is not None else hidden @ head.to(hidden.dtype).T

    def _block_layer(self, layer, x, context, block_positions, key_positions, mask):
        """One decoder layer of :meth:`forward`: [B, S, H] -> [B, S, H] (speculators ``Qwen3DFlashDecoderLayer``)."""
        x = x + self._block_attend(layer.self_attn, layer.input_layernorm(x), context, block_positions, key_positions, mask)
        return x + layer.mlp(layer.post_attention_layernorm(x))

    def _block_attend(self, attn, x, context, block_positions, key_positions, mask):
        """Attention of the block ``x`` [B, S, H] (after ``input_layernorm``) over the context's K/V (``k_proj`` / ``v_proj``
        of ``context``, not normed by ``input_layernorm``: speculators ``Qwen3DFlashAttention``) and its own."""
        B, S, _ = x.shape
        kv_in = torch.cat([context, x], dim=1)
        q = attn.q_proj(x).view(B, S, attn.nH, attn.hd)
        k = attn.k_proj(kv_in).view(B, -1, attn.nKV, attn.hd)
        if hasattr(attn, "q_norm"):
            q, k = attn.q_norm(q), attn.k_norm(k)
        v = attn.v_proj(kv_in).view(B, -1, attn.nKV, attn.hd).transpose(1, 2)
        q, k = self._rope(q.transpose(1, 2), block_positions), self._rope(k.transpose(1, 2), key_positions)
        o = self._sdpa(attn, q, k, v, block_positions, key_positions, mask)
        return attn.o_proj(o.transpose(1, 2).reshape(B, S, attn.nH * attn.hd))


__all__ = ["DFlashDraft"]
