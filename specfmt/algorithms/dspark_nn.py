"""DSpark's two heads as ``torch.nn.Module`` s, and its sequential drafting inside a block
(:mod:`specfmt.algorithms.dspark` says what the draft is and where each rule comes from).

A DSpark draft is a DFlash draft (one parallel, non-causal pass over a block: its backbone gives a
hidden state [H] and draft logits [Vd] per block slot) plus:

* ``markov_head``: a low-rank logit bias from the token before each slot: ``markov_w1`` [V, r]
  (an embedding over the verifier vocabulary) and ``markov_w2`` [Vd, r] (to the draft vocabulary).
  ``vanilla``: bias = ``markov_w2(markov_w1[prev])``. ``gated`` and ``rnn`` (speculators only; vLLM
  0.30-0.33 builds ``vanilla`` alone) add ``gate_proj`` [r, H + r] and ``joint_proj`` [3r, 2r + H].
* ``confidence_head.proj`` [1, H (+ r)]: the per-slot acceptance logit, over the slot's hidden state
  (and its Markov embedding with ``confidence_head_with_markov``). It never changes a drafted token.

Because each slot's bias depends on the token drafted at the slot before, drafting is sequential inside
the block: the first slot conditions on the block's anchor (the last verified token), every later slot on
the token just drafted (as a verifier id: a draft id mapped through ``d2t``). Sources: speculators 0.9
``models/dspark/model_definitions.py`` (``MarkovHead``, ``ConfidenceHead``), ``models/dspark/core.py``
(``prev_token_ids``: slot k conditions on the token at the position before the one it predicts);
vLLM 0.32 ``v1/worker/gpu/spec_decode/dspark/speculator.py`` (``_sample_sequential``: ``prev`` starts at
the anchor and becomes each sampled, target-mapped token) and ``model_executor/models/qwen3_dspark.py``.

This module imports torch at its top; :mod:`specfmt.algorithms.dspark` imports it only when a draft runs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .dflash_nn import DFlashDraft

#: the Markov head variants speculators 0.9 trains (``DSparkSpeculatorConfig.markov_head_type``)
HEAD_TYPES = ("vanilla", "gated", "rnn")


class MarkovHead(nn.Module):
    """The sequential logit bias (speculators ``MarkovHead``; tensor names as saved under ``markov_head.``).

    Args:
        vocab: V, the verifier vocabulary ``markov_w1`` embeds.
        draft_vocab: Vd, the draft vocabulary the bias adds onto.
        rank: r (``markov_rank``), > 0.
        hidden: H, the draft's hidden size (``gated``, ``rnn``).
        head_type: one of :data:`HEAD_TYPES`.

    Raises:
        ValueError: ``rank`` <= 0 or an unknown ``head_type`` (as speculators' own class).
    """

    def __init__(self, vocab: int, draft_vocab: int, rank: int, hidden: int, head_type: str = "vanilla"):
        super().__init__()
        if rank <= 0 or head_type not in HEAD_TYPES:
            raise ValueError(f"a Markov head needs markov_rank > 0 and a type in {HEAD_TYPES}, not {rank}, {head_type!r}")
        self.head_type, self.rank = head_type, rank
        self.markov_w1 = nn.Embedding(vocab, rank)
        self.markov_w2 = nn.Linear(rank, draft_vocab, bias=False)
        if head_type == "gated":
            self.gate_proj = nn.Linear(hidden + rank, rank)
        elif head_type == "rnn":
            self.joint_proj = nn.Linear(2 * rank + hidden, 3 * rank)

    def start(self, n: int, like: torch.Tensor) -> torch.Tensor:
        """The recurrent state before a block's first slot: zeros [n, r] (read by ``rnn`` only)."""
        return like.new_zeros(n, self.rank)

    def step(self, prev: torch.Tensor, hidden: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One slot: ``prev`` [n] verifier ids, ``hidden`` [n, H], ``state`` [n, r] ->
        (bias [n, Vd], the Markov embedding [n, r], the next state [n, r])."""
        emb = self.markov_w1(prev.long()).to(self.markov_w2.weight.dtype)
        if self.head_type == "vanilla":
            return self.markov_w2(emb), emb, state
        hidden = hidden.to(emb.dtype)
        if self.head_type == "gated":
            gate = torch.sigmoid(self.gate_proj(torch.cat([hidden, emb], dim=-1)))
            return self.markov_w2(gate * emb), emb, state
        gate_raw, cand_raw, out_raw = self.joint_proj(torch.cat([state, emb, hidden], dim=-1)).chunk(3, dim=-1)
        gate = torch.sigmoid(gate_raw)
        state = gate * state + (1.0 - gate) * torch.tanh(cand_raw)
        return self.markov_w2(torch.tanh(out_raw)), emb, state


class ConfidenceHead(nn.Module):
    """The acceptance-probability head (speculators ``ConfidenceHead``; vLLM ``DSparkConfidenceHead``):
    ``proj`` [1, H (+ r)] with a bias; the logit of slot i is ``proj([hidden_i (, markov_embedding_i)])``."""

    def __init__(self, width: int, with_markov: bool):
        super().__init__()
        self.with_markov = with_markov
        self.proj = nn.Linear(width, 1)

    def forward(self, hidden: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        """``hidden`` [n, H], ``emb`` [n, r] -> logits [n]."""
        x = torch.cat([hidden, emb.to(hidden.dtype)], dim=-1) if self.with_markov else hidden
        return self.proj(x).squeeze(-1)


def heads(cfg: dict[str, Any]) -> nn.ModuleDict:
    """The DSpark heads of a DSpark config (keys ``markov_head``, ``confidence_head`` when enabled), as the
    speculators ``DSparkDraftModel`` builds them: V = ``transformer_layer_config.vocab_size``,
    Vd = ``draft_vocab_size`` (V when null), H = ``transformer_layer_config.hidden_size``, r = ``markov_rank``.

    Raises:
        ValueError: ``markov_rank`` <= 0 or an unknown ``markov_head_type`` (:class:`MarkovHead`).
    """
    tlc = cfg["transformer_layer_config"]
    V, H, r = tlc["vocab_size"], tlc["hidden_size"], int(cfg["markov_rank"])
    out = nn.ModuleDict({"markov_head": MarkovHead(V, cfg.get("draft_vocab_size") or V, r, H, cfg.get("markov_head_type", "vanilla"))})
    if cfg.get("enable_confidence_head"):
        with_markov = bool(cfg.get("confidence_head_with_markov"))
        out["confidence_head"] = ConfidenceHead(H + (r if with_markov else 0), with_markov)
    return out


class DSparkDraft(DFlashDraft):
    """The DSpark draft: :class:`~specfmt.algorithms.dflash_nn.DFlashDraft` and :func:`heads` (``markov_head``,
    ``confidence_head``); state-dict names are the specfmt tensor names (speculators ``DSparkDraftModel``'s)."""

    def __init__(self, cfg: dict[str, Any], own_head: bool | None = None):
        super().__init__(cfg, own_head)
        built = heads(cfg)
        self.markov_head = built["markov_head"]
        self.confidence_head = built["confidence_head"] if "confidence_head" in built else None


def draft_block(markov: MarkovHead, base: torch.Tensor, hidden: torch.Tensor, anchor: torch.Tensor,
                targets: torch.Tensor | None = None, given: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Greedy sequential drafting of n blocks of m slots (vLLM ``DSparkSpeculator._sample_sequential``).

    Args:
        markov: the draft's Markov head.
        base: [n, m, Vd] the backbone's draft logits of each predicting slot.
        hidden: [n, m, H] the backbone's (final-norm) hidden state of each predicting slot.
        anchor: [n] the verifier id each block starts from (the last verified token).
        targets: [Vd] the verifier id of each draft id (``i + d2t[i]``), None for a full vocabulary.
        given: [n, m] verifier ids to condition on instead of the drafted ones (teacher forcing, as
            speculators' training forward does); None drafts greedily.

    Returns:
        (tokens [n, m] verifier ids, logits [n, m, Vd] with the bias, Markov embeddings [n, m, r]).
    """
    prev, state = anchor, markov.start(base.shape[0], base)
    tokens, logits, embs = [], [], []
    for i in range(base.shape[1]):
        bias, emb, state = markov.step(prev, hidden[:, i], state)
        out = base[:, i] + bias
        ids = out.argmax(-1)
        tok = ids if targets is None else targets.to(ids.device)[ids]
        tokens.append(tok)
        logits.append(out)
        embs.append(emb)
        prev = tok if given is None else given[:, i]
    return torch.stack(tokens, 1), torch.stack(logits, 1), torch.stack(embs, 1)


__all__ = ["HEAD_TYPES", "ConfidenceHead", "DSparkDraft", "MarkovHead", "draft_block", "heads"]
