"""The reference decoder layers as ``torch.nn.Module`` classes: what the EAGLE drafts are built of.

This module imports torch at its top; the algorithm modules import it only inside the functions that
run a draft, so that importing specfmt never imports torch. The classes are module-level, so that a
draft class may subclass them (``class Eagle3Draft(Decoder)``; a variant's draft subclasses that).

Conventions are transformers' Llama ones: rope by ``rotate_half``, RMSNorm computed in float32 or
wider, grouped-query attention by repeating the KV heads; the Qwen3 family adds an RMSNorm over each
head's q and k before rope (:mod:`specfmt.algorithms.layers`). Shapes: B batch, T positions, H hidden
size, nH / nKV attention / KV heads, hd head dim.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .layers import family_of, rms_norm


class RMSNorm(nn.Module):
    """Llama RMSNorm over the last n features (:func:`specfmt.algorithms.layers.rms_norm`); ``weight`` [n]."""

    def __init__(self, n: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


class Attention(nn.Module):
    """The projections of one attention block: ``q_proj`` [nH·hd, in], ``k_proj``/``v_proj`` [nKV·hd, in],
    ``o_proj`` [H, nH·hd] (biases with ``bias``), and the Qwen3 family's ``q_norm``/``k_norm`` [hd]. The
    attention itself is :meth:`Decoder._attend` (it needs the draft's rope and caches)."""

    def __init__(self, in_width: int, H: int, nH: int, nKV: int, hd: int, bias: bool, qk_norm: bool = False, eps: float = 1e-6):
        super().__init__()
        self.nH, self.nKV, self.hd = nH, nKV, hd
        self.q_proj = nn.Linear(in_width, nH * hd, bias=bias)
        self.k_proj = nn.Linear(in_width, nKV * hd, bias=bias)
        self.v_proj = nn.Linear(in_width, nKV * hd, bias=bias)
        self.o_proj = nn.Linear(nH * hd, H, bias=bias)
        if qk_norm:  # Qwen3: RMSNorm over each head's d features, before rope
            self.q_norm = RMSNorm(hd, eps)
            self.k_norm = RMSNorm(hd, eps)
        self.window: int | None = None  # a sliding-window layer sees the last `window` positions (set_windows)


class MLP(nn.Module):
    """The SwiGLU MLP: ``down_proj(silu(gate_proj(x)) * up_proj(x))``, [..., H] -> [..., H]."""

    def __init__(self, H: int, inter: int, bias: bool):
        super().__init__()
        self.gate_proj = nn.Linear(H, inter, bias=bias)
        self.up_proj = nn.Linear(H, inter, bias=bias)
        self.down_proj = nn.Linear(inter, H, bias=bias)

    def forward(self, x):
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    """One draft decoder layer of ``tlc`` (a ``transformer_layer_config``): attention, MLP and norms.

    Args:
        tlc: the decoder's fields (``hidden_size``, heads, ``head_dim``, ``intermediate_size``, biases, family).
        first: EAGLE-3's layer 0: its attention reads 2H features and it has ``hidden_norm``.
        input_norm: False for EAGLE-1's layer 0, whose input norm is an identity (no weight).
    """

    def __init__(self, tlc: dict[str, Any], first: bool, input_norm: bool = True):
        super().__init__()
        H, eps = tlc["hidden_size"], tlc.get("rms_norm_eps", 1e-6)
        nH, nKV = tlc["num_attention_heads"], tlc.get("num_key_value_heads") or tlc["num_attention_heads"]
        hd = tlc.get("head_dim") or H // nH
        self.first = first
        self.self_attn = Attention(2 * H if first else H, H, nH, nKV, hd, bool(tlc.get("attention_bias")), family_of(tlc).qk_norm, eps)
        self.mlp = MLP(H, tlc["intermediate_size"], bool(tlc.get("mlp_bias")))
        self.input_layernorm = RMSNorm(H, eps) if input_norm else nn.Identity()
        if first:
            self.hidden_norm = RMSNorm(H, eps)
        self.post_attention_layernorm = RMSNorm(H, eps)


class Decoder(nn.Module):
    """Rotary embedding and attention shared by the EAGLE drafts (transformers' Llama conventions)."""

    def _init_rope(self, tlc: dict[str, Any]) -> None:
        H = tlc["hidden_size"]
        hd = tlc.get("head_dim") or H // tlc["num_attention_heads"]
        theta = float((tlc.get("rope_parameters") or {}).get("rope_theta", tlc.get("rope_theta", 10000.0)))
        self.register_buffer("inv_freq", 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)), persistent=False)

    def _rope(self, x, positions):
        # x [B, n, T, hd]; rotate_half convention of transformers' Llama
        freqs = positions.to(torch.float64)[:, None] * self.inv_freq[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        half = x.shape[-1] // 2
        rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rot * sin

    def _attend(self, attn, x, positions, past, mask, rows=None, layer=0):
        """Attention of ``x`` [B, T, in] at ``positions`` [T]; returns ``(output [B, T, H], new)``.

        Without ``rows``: the queries see the keys of ``past`` (blocks of (k, v) [B, n_kv, T', hd],
        every block at ``positions``: the training-time test) and their own, as ``mask``
        [T, T'+T] says; ``new`` is their (k, v). With ``rows`` (:class:`~specfmt.algorithms.layers.Rows`, B = 1): the T
        positions are several sequences' new positions one after another; each attends to its
        own KV cache (``rows.past[r][layer]``) and its own new keys, causally by position;
        ``new`` is one (k, v) per row."""
        B, T, _ = x.shape
        q = attn.q_proj(x).view(B, T, attn.nH, attn.hd)
        k = attn.k_proj(x).view(B, T, attn.nKV, attn.hd)
        if hasattr(attn, "q_norm"):
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = attn.v_proj(x).view(B, T, attn.nKV, attn.hd).transpose(1, 2)
        q, k = self._rope(q, positions), self._rope(k, positions)
        if rows is None:
            o = self._sdpa(attn, q, torch.cat([p[0] for p in past] + [k], dim=2), torch.cat([p[1] for p in past] + [v], dim=2),
                           positions, positions.repeat(len(past) + 1), mask)
            new = (k, v)
        else:
            outs, new, at = [], [], 0
            for row_past, kpos, n in zip(rows.past, rows.key_positions, rows.lengths):
                part = slice(at, at + n)
                ks, vs = k[:, :, part], v[:, :, part]
                cached = row_past[layer] if row_past else []
                keys, vals = torch.cat([b[0] for b in cached] + [ks], dim=2), torch.cat([b[1] for b in cached] + [vs], dim=2)
                outs.append(self._sdpa(attn, q[:, :, part], keys, vals, positions[part], kpos, kpos[None, :] <= positions[part, None]))
                new.append((ks, vs))
                at += n
            o = torch.cat(outs, dim=2)
        return attn.o_proj(o.transpose(1, 2).reshape(B, T, attn.nH * attn.hd)), new

    def _sdpa(self, attn, q, keys, vals, positions, key_positions, mask):
        """Scaled dot-product attention of queries at ``positions`` over keys at ``key_positions``
        (``mask`` True = attend; a sliding-window layer also drops keys ``window`` or more behind)."""
        if attn.window is not None:  # key j is seen from query i while i - j < window (transformers, vLLM)
            mask = mask & ((positions[:, None] - key_positions[None, :]) < attn.window)
        rep = attn.nH // attn.nKV
        return nn.functional.scaled_dot_product_attention(q, keys.repeat_interleave(rep, 1), vals.repeat_interleave(rep, 1), attn_mask=mask)


__all__ = ["MLP", "Attention", "Decoder", "Layer", "RMSNorm"]
