"""The DFlash2 draft as a ``torch.nn.Module`` (:mod:`specfmt.algorithms.dflash2` says what it computes and where from).

This module imports torch at its top; :mod:`specfmt.algorithms.dflash2` imports it only when a draft runs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .dflash_nn import DFlashDraft


class GroupedConv(nn.Module):
    """A pair of grouped causal convolutions inside the block (speculators ``GroupedDynamicCausalConv``; vLLM ``DFlashGroupedConv``):
    ``base_kernel`` [2, K, H] (input side, output side) plus a per-token delta ``kernel_projection`` [2·K·H/g, H]."""

    def __init__(self, hidden: int, taps: int, group: int):
        super().__init__()
        self.taps, self.group, self.groups = taps, group, hidden // group
        self.base_kernel = nn.Parameter(torch.zeros(2, taps, hidden))
        self.kernel_projection = nn.Linear(hidden, 2 * taps * self.groups, bias=False)

    def _conv(self, x: torch.Tensor, delta: torch.Tensor, side: int) -> torch.Tensor:
        """``x`` [n, S, H] one block per row (slot s at block position s), ``delta`` [n, S, K, H/g] -> [n, S, H]:
        out[s] = sum over taps t <= s of x[s - t] * (base_kernel[side, t] + delta[s, t])."""
        n, S, H = x.shape
        blocks = x.view(n, S, self.groups, self.group)
        out = torch.zeros_like(blocks)
        for t in range(min(self.taps, S)):
            coef = self.base_kernel[side, t].view(1, 1, self.groups, self.group) + delta[:, t:, t, :, None]
            out[:, t:] = out[:, t:] + blocks[:, :S - t] * coef
        return out.view(n, S, H)

    def prepare(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The sublayer's input convolved, and the output side's delta kernel [n, S, K, H/g]."""
        k = self.kernel_projection(x).view(*x.shape[:-1], 2, self.taps, self.groups)
        return self._conv(x, k[..., 0, :, :], 0), k[..., 1, :, :]

    def finish(self, x: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        """The sublayer's output convolved with the delta :meth:`prepare` returned."""
        return self._conv(x, delta, 1)


class CandidateSelector(nn.Module):
    """The bilinear reranker (speculators and vLLM ``CandidateSelector``): ``predecessor_codebook`` and ``successor_codebook``
    [V, r], ``hidden_projection`` [r, H]; the score of candidate c after token p at hidden h is
    ``unary[c] + sum(predecessor[p] * hidden_projection(h) * successor[c])``."""

    def __init__(self, vocab: int, hidden: int, rank: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.predecessor_codebook = nn.Parameter(torch.zeros(vocab, rank))
        self.successor_codebook = nn.Parameter(torch.zeros(vocab, rank))
        self.hidden_projection = nn.Linear(hidden, rank, bias=False)

    def walk(self, unary: torch.Tensor, hidden: torch.Tensor, anchor: int) -> tuple[list[int], torch.Tensor]:
        """Greedy drafting of one block's m slots (vLLM ``DFlash2Speculator``'s selector walk at temperature 0): ``unary``
        [m, V], ``hidden`` [m, H] -> (the m tokens, the m reranked scores [m, top_k]); the first slot's predecessor is the anchor,
        each later slot's the token chosen before it."""
        cand = unary.topk(self.top_k, dim=-1).indices
        ctx = self.hidden_projection(hidden)
        prev, tokens, scores = anchor, [], []
        for i in range(unary.shape[0]):
            s = unary[i, cand[i]] + (self.predecessor_codebook[prev] * ctx[i]) @ self.successor_codebook[cand[i]].T
            prev = int(cand[i, int(s.argmax())])
            tokens.append(prev)
            scores.append(s)
        return tokens, torch.stack(scores)


class DFlash2Draft(DFlashDraft):
    """The DFlash2 draft: :class:`~specfmt.algorithms.dflash_nn.DFlashDraft` with ``attention_conv`` and ``mlp_conv`` in every
    layer and a ``candidate_selector``; state-dict names are speculators' ``DFlash2DraftModel``'s."""

    def __init__(self, cfg: dict[str, Any], own_head: bool | None = None):
        super().__init__(cfg, own_head)
        tlc = cfg["transformer_layer_config"]
        H, K, g = tlc["hidden_size"], int(cfg["conv_kernel_size"]), int(cfg["conv_group_size"])
        for layer in self.layers:
            layer.attention_conv, layer.mlp_conv = GroupedConv(H, K, g), GroupedConv(H, K, g)
        self.candidate_selector = CandidateSelector(tlc["vocab_size"], H, int(cfg["selector_rank"]), int(cfg["selector_top_k"]))

    def _block_layer(self, layer, x, context, block_positions, key_positions, mask):
        """DFlash's layer with each sublayer's input and output convolved inside the block
        (speculators ``Qwen3DFlash2DecoderLayer.forward``)."""
        a, kernel = layer.attention_conv.prepare(layer.input_layernorm(x))
        a = self._block_attend(layer.self_attn, a, context, block_positions, key_positions, mask)
        x = x + layer.attention_conv.finish(a, kernel)
        m, kernel = layer.mlp_conv.prepare(layer.post_attention_layernorm(x))
        return x + layer.mlp_conv.finish(layer.mlp(m), kernel)


__all__ = ["CandidateSelector", "DFlash2Draft", "GroupedConv"]
