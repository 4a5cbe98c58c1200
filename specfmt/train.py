"""Training drafts against a frozen verifier.

EAGLE-3 with training-time test (Li et al., "EAGLE-3: Scaling up Inference Acceleration of
Large Language Models via Training-Time Test", 2025; SafeAILab ``eagle/traineagle3/cnets.py``):
the draft is unrolled over ``ttt_steps`` drafting steps. Step 0 reads the verifier's tap
states; step s reads, at position t, the state the draft itself fed back at position t-1
in step s-1, and attends to what a chain started at position t-s would see at inference
-- the verifier-fed keys of positions <= t-s and its own keys of steps 1..s. So step s
learns to propose draft position s+1 exactly as vLLM runs it.

The loss at each step is the cross-entropy against the verifier's next-token distribution
restricted to the draft vocabulary (``target[..., t2d]``, softmax), counted where the
verifier's top token is in the draft vocabulary (``cnets.py``). Step losses are summed
with weights ``0.8**s`` as the reference does.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator

if TYPE_CHECKING:  # pragma: no cover
    import torch


@dataclass
class TrainStats:
    """Figures of one training run.

    Attributes:
        steps: optimizer steps.
        tokens: positions trained on (batch x window per step, all steps).
        seconds: wall time.
        loss: mean loss of the last 50 steps.
        accuracy: per TTT step, the share of counted positions where the draft's top id
            equals the verifier's top token (last 50 steps): a running acceptance estimate.
    """

    steps: int = 0
    tokens: int = 0
    seconds: float = 0.0
    loss: float = float("nan")
    accuracy: list[float] = field(default_factory=list)


def ttt_mask(L: int, s: int, device=None) -> "torch.Tensor":
    """[L, (s+1)·L] attention mask of TTT step s: query t sees step-0 keys u <= t-s and step-j key t-s+j."""
    import torch

    t = torch.arange(L, device=device)[:, None]
    u = torch.arange(L, device=device)[None, :]
    blocks = [u <= t - s] + [u == t - s + j for j in range(1, s + 1)]
    return torch.cat(blocks, dim=1)


def eagle3_ttt_loss(draft, embed: "torch.Tensor", ids: "torch.Tensor", aux: "torch.Tensor", target_logits: "torch.Tensor", ttt_steps: int):
    """Loss of one batch, unrolled over ``ttt_steps`` drafting steps.

    Args:
        draft: an :func:`specfmt.reference.Eagle3Draft` (train mode).
        embed: [V, H] the (frozen) token embedding the draft reads.
        ids: [B, T] token ids.
        aux: [B, T, n_aux·H_t] the verifier's tap states at each position.
        target_logits: [B, T, V] the verifier's logits at each position.
        ttt_steps: drafting steps to unroll (the k the draft will serve with).

    Returns:
        ``(loss, correct, counted)``: the weighted loss (scalar), and per step the number of
        counted positions whose top draft id is the verifier's top token, and of counted positions.
    """
    import torch

    L = ids.shape[1] - 1  # position t reads ids[t+1]; its target is the verifier's logits at t+1
    e = embed[ids[:, 1:]]
    hidden = draft.combine(aux[:, :-1])
    tgt = target_logits[:, 1:]
    targets = draft.target_ids()
    tgt_draft = tgt[..., targets]
    top = tgt.argmax(-1)
    in_vocab = torch.zeros(tgt.shape[-1], dtype=torch.bool, device=ids.device)
    in_vocab[targets] = True
    keep = in_vocab[top]
    tp = tgt_draft.float().softmax(-1)
    tgt_top_draft = tgt_draft.argmax(-1)
    positions = torch.arange(L, device=ids.device)
    past = [[] for _ in draft.layers]
    loss = torch.zeros((), device=ids.device)
    correct, counted = [], []
    for s in range(ttt_steps):
        mask = ttt_mask(L, s, ids.device)
        logits, feedback, kv = draft(e, hidden, positions, past=past, mask=mask)
        valid = keep.clone()
        valid[:, :s] = False
        n = valid.sum().clamp(min=1)
        ce = -(tp * logits.float().log_softmax(-1)).sum(-1)
        loss = loss + (0.8 ** s) * (ce * valid).sum() / n
        correct.append(int(((logits.argmax(-1) == tgt_top_draft) & valid).sum()))
        counted.append(int(valid.sum()))
        for i, (k, v) in enumerate(kv):
            past[i].append((k, v))
        hidden = torch.cat([torch.zeros_like(feedback[:, :1]), feedback[:, :-1]], dim=1)
    return loss, correct, counted


def warmup_cosine(step: int, steps: int, warmup: int, peak: float) -> float:
    """Learning rate at ``step`` (0-based) of ``steps``: linear warmup over ``warmup`` steps to
    ``peak``, then cosine decay to 10 % of ``peak``."""
    if step < warmup:
        return peak * (step + 1) / warmup
    p = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))


def windows(docs: list[list[int]], length: int, batch: int, seed: int) -> Iterator["torch.Tensor"]:
    """Endless [batch, length] windows drawn uniformly from the concatenated documents (seeded)."""
    import torch

    stream = torch.tensor([t for d in docs for t in d])
    if stream.numel() <= length:
        raise ValueError(f"the training text has {stream.numel()} tokens; a window needs more than {length}")
    g = torch.Generator().manual_seed(seed)
    while True:
        starts = torch.randint(0, stream.numel() - length, (batch,), generator=g)
        yield torch.stack([stream[i:i + length] for i in starts.tolist()])


def train_eagle3(
    draft,
    verifier,
    batches: Iterator["torch.Tensor"],
    *,
    steps: int,
    lr: float = 1e-3,
    warmup: int = 50,
    ttt_steps: int = 3,
    embed: "torch.Tensor | None" = None,
    log: Callable[[int, float, list[float]], None] | None = None,
) -> TrainStats:
    """Train an EAGLE-3 draft with the verifier frozen (AdamW, linear warmup, cosine decay to 10 %).

    Args:
        draft: an :func:`specfmt.reference.Eagle3Draft`; trained in place.
        verifier: a transformers causal LM; run without gradients.
        batches: [B, T] token windows.
        steps: optimizer steps.
        embed: [V, H] the embedding the draft reads (default: the verifier's input embedding).
        log: called as ``log(step, loss, accuracy_per_ttt_step)`` after every step.

    Returns:
        :class:`TrainStats`.
    """
    import torch

    embed = (embed if embed is not None else verifier.get_input_embeddings().weight).detach()
    verifier.eval()
    draft.train()
    opt = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=lr, betas=(0.9, 0.95), weight_decay=0.0)

    stats = TrainStats()
    recent: list[tuple[float, list[int], list[int]]] = []
    t0 = time.perf_counter()
    for step in range(steps):
        ids = next(batches)
        with torch.no_grad():
            out = verifier(input_ids=ids, output_hidden_states=True, use_cache=False)
            aux = torch.cat([out.hidden_states[j] for j in draft.taps], dim=-1)
        loss, correct, counted = eagle3_ttt_loss(draft, embed, ids, aux, out.logits, ttt_steps)
        for g in opt.param_groups:
            g["lr"] = warmup_cosine(step, steps, warmup, lr)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 0.5)
        opt.step()
        recent = (recent + [(loss.item(), correct, counted)])[-50:]
        stats.steps += 1
        stats.tokens += ids.numel()
        if log:
            log(step, recent[-1][0], [c / max(n, 1) for c, n in zip(correct, counted)])
    stats.seconds = time.perf_counter() - t0
    stats.loss = sum(r[0] for r in recent) / len(recent)
    stats.accuracy = [sum(r[1][s] for r in recent) / max(1, sum(r[2][s] for r in recent)) for s in range(ttt_steps)]
    draft.eval()
    return stats


__all__ = ["TrainStats", "eagle3_ttt_loss", "train_eagle3", "ttt_mask", "warmup_cosine", "windows"]
