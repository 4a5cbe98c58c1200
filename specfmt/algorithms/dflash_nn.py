"""The DFlash draft as a ``torch.nn.Module`` (:mod:`specfmt.algorithms.dflash` says what it computes and where from).

This module imports torch at its top; :mod:`specfmt.algorithms.dflash` imports it only when a draft runs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from . import layers
from .nn_layers import Decoder, Layer, RMSNorm


def block_causal(cfg: dict[str, Any]) -> list[bool]:
    """Whether each draft layer reads the block causally (a slot sees the block's slots up to itself) rather than both ways:
    a sliding-window layer (``layer_types[i] == "sliding_attention"``) of a config with ``sliding_window_non_causal`` false.

    speculators 0.9 trains that mask (``models/dflash/attention.py::create_anchor_block_mask_mod``: full-attention layers always
    non-causal; its trainer's default is sliding-window layers with the flag false), and vLLM serves it
    (``update_dflash``: ``dflash_config.causal = not sliding_window_non_causal`` for every layer, which the schema makes the
    same thing: false is refused beside a full-attention layer, :data:`~specfmt.algorithms.dflash.CAUSAL_TRAP`; DSpark's
    reader, with no ``dflash_config``: ``qwen3_dflash.py::_dflash_layer_causal``, sliding-window layers causal). An absent
    flag is vLLM's default, true."""
    types = cfg["transformer_layer_config"].get("layer_types") or []
    causal = not cfg.get("sliding_window_non_causal", True)
    return [causal and i < len(types) and types[i] == "sliding_attention" for i in range(cfg["transformer_layer_config"]["num_hidden_layers"])]


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
        self.causal = block_causal(cfg)
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
                causal: bool | None = None) -> "torch.Tensor":
        """One block pass: [B, S, H] the block's embeddings -> [B, S, H] its normed hidden states.

        Args:
            block: [B, S, H] embeddings of the anchor token and S - 1 mask tokens.
            context: [B, C, H] :meth:`context` of the verified positions the block sees (those before the anchor).
            context_positions: [C] their rotary positions; block_positions: [S] the block's (anchor, anchor + 1, ...).
            causal: True: each block position sees only the block positions up to itself, in every layer; False: the whole
                block, in every layer; None: each layer as the config says (:func:`block_causal`).
        """
        S = block.shape[1]
        key_positions = torch.cat([context_positions, block_positions])
        both = torch.ones(S, key_positions.numel(), dtype=torch.bool, device=block.device)
        ahead = both.clone()
        ahead[:, context_positions.numel():] = torch.ones(S, S, dtype=torch.bool, device=block.device).tril()
        x = block
        for layer, c in zip(self.layers, self._causal(causal)):
            x = self._block_layer(layer, x, context, block_positions, key_positions, ahead if c else both)
        return self.norm(x)

    def _causal(self, causal: bool | None) -> list[bool]:
        """Each layer's block mask: ``causal`` for all, or the config's (:attr:`causal`) when None."""
        return self.causal if causal is None else [causal] * len(self.layers)

    def blocks(self, block: "torch.Tensor", context: "torch.Tensor", anchors: "torch.Tensor", causal: bool | None = None) -> "torch.Tensor":
        """Many blocks of many sequences in one pass, as speculators trains DFlash: [B, A, S, H] -> [B, A, S, H] normed states.

        Block a of sequence b is the anchor ``anchors[b, a]`` and S - 1 mask slots at positions anchor .. anchor + S - 1; it sees
        the context positions of its own sequence before its anchor, and its own S slots (all of them; up to itself with
        ``causal``): speculators ``models/dflash/attention.py`` ``create_anchor_block_mask_mod``, one block per anchor, with
        :meth:`forward`'s layers (the context's K/V from ``k_proj`` / ``v_proj`` of ``context``, ``k_norm`` and rope at its
        positions 0 .. T - 1).

        Args:
            block: [B, A, S, H] embeddings of each block's anchor token and its mask tokens.
            context: [B, T, H] :meth:`context` of every position of each sequence.
            anchors: [B, A] each block's anchor position (long).
            causal: as :meth:`forward`'s (None: each layer as the config says).
        """
        S, T = block.shape[2], context.shape[1]
        positions = anchors[..., None] + torch.arange(S, device=block.device)  # [B, A, S]
        sees = torch.arange(T, device=block.device)[None, None, :] < anchors[..., None]  # [B, A, T]: context before the anchor
        both = torch.ones(S, S, dtype=torch.bool, device=block.device)
        x = block
        for layer, c in zip(self.layers, self._causal(causal)):
            h = layer.input_layernorm(x)
            x = x + self._blocks_attend(layer.self_attn, h, context, positions, sees, both.tril() if c else both)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.norm(x)

    def _blocks_attend(self, attn, x, context, positions, sees, own):
        """Attention of :meth:`blocks`: ``x`` [B, A, S, H] (after ``input_layernorm``) over its sequence's context K/V [B, T]
        where ``sees`` [B, A, T], and over its own block's K/V where ``own`` [S, S]; a sliding-window layer also drops context
        keys ``window`` or more behind the query slot, as vLLM's sliding window does at serving (speculators' training mask
        counts from the anchor instead, ``kv_pos >= anchor - sliding_window``: up to ``S`` more context keys, which only a
        context longer than the window reaches; ``--block-mask causal`` writes the verifier's context as the window)."""
        B, A, S, _ = x.shape
        T = context.shape[1]
        rep = attn.nH // attn.nKV
        q = attn.q_proj(x).view(B, A, S, attn.nH, attn.hd)
        kc = attn.k_proj(context).view(B, T, attn.nKV, attn.hd)
        kb = attn.k_proj(x).view(B, A, S, attn.nKV, attn.hd)
        if hasattr(attn, "q_norm"):
            q, kc, kb = attn.q_norm(q), attn.k_norm(kc), attn.k_norm(kb)
        q, kb = self._rope_at(q, positions), self._rope_at(kb, positions)
        kc = self._rope_at(kc, torch.arange(T, device=x.device).expand(B, T))
        vc = attn.v_proj(context).view(B, T, attn.nKV, attn.hd).repeat_interleave(rep, 2)
        vb = attn.v_proj(x).view(B, A, S, attn.nKV, attn.hd).repeat_interleave(rep, 3)
        kc, kb = kc.repeat_interleave(rep, 2), kb.repeat_interleave(rep, 3)
        scale = attn.hd ** -0.5
        sc = torch.einsum("basnd,btnd->bnast", q, kc) * scale  # [B, nH, A, S, T]
        sb = torch.einsum("basnd,bakn d->bnask".replace(" ", ""), q, kb) * scale  # [B, nH, A, S, S]
        ctx_mask = sees[:, None, :, None, :]
        if attn.window is not None:
            behind = positions[..., None] - torch.arange(T, device=x.device)  # [B, A, S, T]
            ctx_mask = ctx_mask & (behind < attn.window)[:, None]
        neg = torch.finfo(sc.dtype).min
        scores = torch.cat([sc.masked_fill(~ctx_mask, neg), sb.masked_fill(~own, neg)], dim=-1)
        p = scores.softmax(-1)
        o = torch.einsum("bnast,btnd->basnd", p[..., :T], vc) + torch.einsum("bnask,bakn d->basnd".replace(" ", ""), p[..., T:], vb)
        return attn.o_proj(o.reshape(B, A, S, attn.nH * attn.hd))

    def _rope_at(self, x: "torch.Tensor", positions: "torch.Tensor") -> "torch.Tensor":
        """Rope (transformers' ``rotate_half``) of ``x`` [..., n, hd] at ``positions`` [...] (one position per head group)."""
        freqs = positions.to(torch.float64)[..., None] * self.inv_freq  # [..., hd/2]
        emb = torch.cat([freqs, freqs], dim=-1)[..., None, :]
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        half = x.shape[-1] // 2
        rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rot * sin

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


__all__ = ["DFlashDraft", "block_causal"]
