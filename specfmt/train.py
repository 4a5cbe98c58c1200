"""Training drafts against a frozen verifier: EAGLE-3, EAGLE-1 and Medusa.

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

EAGLE-1 (Li et al., "EAGLE: Speculative Sampling Requires Rethinking Feature Uncertainty",
2024; ``eagle/train/main.py``): position t reads the embedding of token t+1 and the verifier's
last hidden state at t (with uniform noise, the paper's data augmentation); the loss is
``SmoothL1(f_t, h_{t+1}) + 0.1 · CE(lm_head(f_t), p_{t+1})`` with the verifier's head and
next-token distribution p.

Medusa (Cai et al., "Medusa: Simple LLM Inference Acceleration Framework with Multiple
Decoding Heads", 2024; ``medusa/train/train_legacy.py``): head i at position t reads the
verifier's last hidden state h_t and learns the verifier's distribution at t+i+1 (the token
i+2 places after the one h_t predicts; self-distillation, as Medusa-2 ``--self-distill``),
weighted ``0.8**i``.

:func:`fit` runs any of them: AdamW (0.9, 0.95), linear warmup and cosine decay to 10 %,
gradients clipped at 0.5, batches from :class:`specfmt.train_data.Windows` (a function of
the step, so ``--resume`` continues bit for bit), the verifier's features computed on the
fly or read from a :class:`specfmt.train_data.FeatureCache`, and several processes through
``torch.distributed`` (``torchrun``; the objective is wrapped in
``DistributedDataParallel``).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from .errors import InputError, SpecfmtError

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
        accuracy: per draft position (EAGLE-3 TTT step, Medusa head; EAGLE-1 has one), the
            share of counted positions where the draft's top token equals the verifier's
            (last 50 steps, all ranks).
        resumed_from: the step a resumed run started at (0: from the start).
    """

    steps: int = 0
    tokens: int = 0
    seconds: float = 0.0
    loss: float = float("nan")
    accuracy: list[float] = field(default_factory=list)
    resumed_from: int = 0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def estimated_acceptance_length(self) -> float:
        """``1 + a1 + a1·a2 + ...`` from the per-position top-1 agreement: a rough running estimate."""
        return acceptance_estimate(self.accuracy)


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


def acceptance_estimate(accuracy: list[float]) -> float:
    """``1 + a1 + a1·a2 + ...``: the mean acceptance length if position j were accepted with
    probability a_j once every earlier one was (a rough guide, not a measurement)."""
    total, run = 1.0, 1.0
    for a in accuracy:
        run *= a
        total += run
    return total


def eagle1_loss(draft, embed: "torch.Tensor", head: Callable, ids: "torch.Tensor", last: "torch.Tensor", noise: float = 0.0,
                generator: "torch.Generator | None" = None):
    """EAGLE-1 loss of one batch: ``SmoothL1(f_t, h_{t+1}) + 0.1 · CE(head(f_t), softmax(head(h_{t+1})))``.

    Args:
        draft: an :func:`specfmt.reference.Eagle1Draft` (train mode).
        embed: [V, H] the (frozen) embedding the draft reads.
        head: the verifier's ``lm_head`` (frozen): [..., H] -> [..., V].
        ids: [B, T] token ids.
        last: [B, T, H] the verifier's last hidden state (after its final norm).
        noise: half-width of the uniform noise added to the input features (EAGLE's
            augmentation against its own feature errors at inference); 0 for none.
        generator: the noise's random generator (seeded per step by :func:`fit`).

    Returns:
        ``(loss, [correct], [counted])``.
    """
    import torch
    import torch.nn.functional as F

    L = ids.shape[1] - 1
    h = last[:, :-1]
    if noise:
        h = h + (torch.rand(h.shape, generator=generator, device="cpu").to(h.device, h.dtype) * 2 - 1) * noise
    f, _ = draft(embed[ids[:, 1:]], h, torch.arange(L, device=ids.device))
    target = last[:, 1:]
    with torch.no_grad():
        p = head(target).float().softmax(-1)
    logits = head(f).float()
    loss = F.smooth_l1_loss(f.float(), target.float()) + 0.1 * -(p * logits.log_softmax(-1)).sum(-1).mean()
    correct = int((logits.argmax(-1) == p.argmax(-1)).sum())
    return loss, [correct], [p.shape[0] * p.shape[1]]


def medusa_loss(heads, last: "torch.Tensor", logits: "torch.Tensor", train: list[int]):
    """Medusa loss of one batch: head i at position t against the verifier's distribution at t+i+1, weight ``0.8**i``.

    Args:
        heads: a :func:`specfmt.reference.MedusaHeads` (train mode).
        last: [B, T, H] the verifier's last hidden state.
        logits: [B, T, V] the verifier's logits (``lm_head(last)``).
        train: the heads to train; the others are run without gradients, for the figures.

    Returns:
        ``(loss, correct per head, counted per head)``.
    """
    import contextlib

    import torch

    K = len(heads.blocks)
    loss = torch.zeros((), device=last.device)
    correct, counted = [0] * K, [0] * K
    for i in range(K):
        n = last.shape[1] - (i + 1)
        if n <= 0:
            continue
        p = logits[:, i + 1:].float().softmax(-1)
        with contextlib.nullcontext() if i in train else torch.no_grad():
            out = heads.head(i, last[:, :n]).float()
        if i in train:
            loss = loss + (0.8 ** i) * -(p * out.log_softmax(-1)).sum(-1).mean()
        correct[i] = int((out.argmax(-1) == p.argmax(-1)).sum())
        counted[i] = p.shape[0] * p.shape[1]
    return loss, correct, counted


@dataclass
class TrainOptions:
    """Hyper-parameters of :func:`fit` (the ``specfmt train`` flags).

    Attributes:
        steps: optimizer steps.
        batch_size: windows per step and process (B).
        seq_len: tokens per window (T).
        lr: peak learning rate.
        warmup: warmup steps (None: 5 % of ``steps``, at least 1).
        ttt_steps: EAGLE-3 drafting steps unrolled in training-time test.
        noise: EAGLE-1 input feature noise (uniform half-width).
        seed: seeds the windows, the noise and a new draft's initialisation.
        save_every: steps between saved training states (0: only at the end or on Ctrl-C).
    """

    steps: int = 500
    batch_size: int = 8
    seq_len: int = 256
    lr: float = 1e-3
    warmup: int | None = None
    ttt_steps: int = 3
    noise: float = 0.0
    seed: int = 0
    save_every: int = 100

    def warmup_steps(self) -> int:
        return self.warmup if self.warmup is not None else max(1, self.steps // 20)


class TrainInterrupted(SpecfmtError):
    """Training stopped by the user (Ctrl-C); the state was saved for ``--resume``."""

    exit_code = 130


STATE_FILE = "state.pt"


def _objective(algorithm: str, draft, embed, head, opts: TrainOptions, medusa_train: list[int]):
    """The loss of one batch as an ``nn.Module`` (what ``DistributedDataParallel`` wraps)."""
    import torch
    from torch import nn

    class Objective(nn.Module):
        def __init__(self):
            super().__init__()
            self.draft = draft
            self._frozen = (embed, head)  # a tuple: not registered, never synchronised or trained

        def forward(self, ids, aux, last, step: int):
            embed, head = self._frozen
            if algorithm == "eagle3":
                with torch.no_grad():
                    logits = head(last)
                return eagle3_ttt_loss(self.draft, embed, ids, aux, logits, opts.ttt_steps)
            if algorithm == "eagle":
                g = torch.Generator().manual_seed(opts.seed * 7919 + step)
                return eagle1_loss(self.draft, embed, head, ids, last, opts.noise, g)
            with torch.no_grad():
                logits = head(last)
            return medusa_loss(self.draft, last, logits, medusa_train)

    return Objective()


def fit(
    algorithm: str,
    draft,
    verifier,
    windows,
    opts: TrainOptions,
    *,
    embed: "torch.Tensor | None" = None,
    cache=None,
    state_dir: str | Path | None = None,
    resume: bool = False,
    fingerprint: dict[str, Any] | None = None,
    medusa_train: list[int] | None = None,
    log: Callable[[int, float, list[float]], None] | None = None,
) -> TrainStats:
    """Train ``draft`` in place against the frozen ``verifier``.

    Args:
        algorithm: ``eagle3``, ``eagle`` or ``medusa``.
        draft: the module (:mod:`specfmt.reference`), on the verifier's device; only its
            parameters with ``requires_grad`` are trained.
        verifier: a transformers causal LM, eval mode, no gradients.
        windows: :class:`specfmt.train_data.Windows` (this process's rank and world size).
        opts: :class:`TrainOptions`.
        embed: [V, H] the embedding the draft reads (default: the verifier's).
        cache: a complete :class:`specfmt.train_data.FeatureCache` for ``windows`` (which
            must then be fixed), or None to run the verifier every step.
        state_dir: where the training state (weights, optimizer, step) is saved every
            ``opts.save_every`` steps and on Ctrl-C; None: never.
        resume: continue from the state in ``state_dir``.
        fingerprint: what the run is (options, data, verifier); a resumed state must match.
        medusa_train: Medusa heads to train (default: all).
        log: called on the main process as ``log(step, loss, accuracy_per_position)`` after
            every step.

    Returns:
        :class:`TrainStats` (figures summed over processes).

    Raises:
        InputError: ``resume`` without a saved state, or a state of another run.
        TrainInterrupted: Ctrl-C; the state of the last finished step was saved.
    """
    import torch
    import torch.distributed as dist

    from .train_data import verifier_features

    distributed = dist.is_available() and dist.is_initialized()
    rank = dist.get_rank() if distributed else 0
    device = next(draft.parameters()).device
    head = verifier.get_output_embeddings()
    embed = (embed if embed is not None else verifier.get_input_embeddings().weight).detach().to(device)
    taps = list(getattr(draft, "taps", [])) if algorithm == "eagle3" else []
    K = len(draft.blocks) if algorithm == "medusa" else 0
    medusa_train = list(range(K)) if medusa_train is None else medusa_train
    positions = opts.ttt_steps if algorithm == "eagle3" else K if algorithm == "medusa" else 1
    obj = _objective(algorithm, draft, embed, head, opts, medusa_train)
    model = obj
    if distributed:
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(obj, device_ids=[device.index] if device.type == "cuda" else None)
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=opts.lr, betas=(0.9, 0.95), weight_decay=0.0)
    state_path = Path(state_dir) / STATE_FILE if state_dir else None
    fingerprint = fingerprint or {}

    stats = TrainStats()
    recent: list[tuple[float, list[int], list[int]]] = []
    start = 0
    if resume:
        if state_path is None or not state_path.is_file():
            raise InputError(f"--resume: no saved training state at {state_path}", hint="run without --resume to start from step 0")
        state = torch.load(state_path, map_location=device, weights_only=True)
        if state.get("fingerprint") != fingerprint:
            old = state.get("fingerprint") or {}
            diff = sorted(k for k in set(old) | set(fingerprint) if old.get(k) != fingerprint.get(k))
            raise InputError(f"the saved state at {state_path} is of another run (differs in: {', '.join(diff)})",
                             hint="resume with the same options, or start over without --resume")
        draft.load_state_dict(state["draft"])
        opt.load_state_dict(state["optimizer"])
        start = stats.resumed_from = int(state["step"])
        recent = [(float(a), list(b), list(c)) for a, b, c in state["recent"]]

    def save(step: int) -> None:
        if state_path is None or rank != 0:
            return
        state_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = state_path.with_suffix(".tmp")
        torch.save({"step": step, "draft": draft.state_dict(), "optimizer": opt.state_dict(), "recent": recent,
                    "fingerprint": fingerprint}, tmp)
        os.replace(tmp, state_path)

    verifier.eval()
    draft.train()
    t0 = time.perf_counter()
    done = start
    try:
        for step in range(start, opts.steps):
            ids = windows.ids(step).to(device)
            if cache is not None:
                aux, last = cache.get([i for _, i in windows.indices(step)])
                aux, last = (aux.to(device) if aux is not None else None), last.to(device)
            else:
                aux, last = verifier_features(verifier, ids, taps)
            for g in opt.param_groups:
                g["lr"] = warmup_cosine(step, opts.steps, opts.warmup_steps(), opts.lr)
            loss, correct, counted = model(ids, aux, last, step)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 0.5)
            opt.step()
            figures = torch.tensor([loss.item(), *correct, *counted], dtype=torch.float64)
            if distributed:  # NCCL reduces device tensors only
                figures = figures.to(device)
                dist.all_reduce(figures)
                figures = figures.cpu()
                figures[0] /= dist.get_world_size()
            c = [int(x) for x in figures[1:1 + positions]]
            n = [int(x) for x in figures[1 + positions:]]
            recent = (recent + [(float(figures[0]), c, n)])[-50:]
            stats.steps += 1
            stats.tokens += ids.numel() * (dist.get_world_size() if distributed else 1)
            done = step + 1
            if log and rank == 0:
                log(step, recent[-1][0], [a / max(b, 1) for a, b in zip(c, n)])
            if opts.save_every and done % opts.save_every == 0 and done < opts.steps:
                save(done)
    except KeyboardInterrupt:
        save(done)
        raise TrainInterrupted(f"interrupted after step {done} of {opts.steps}",
                               hint=f"the state is saved in {state_dir}; continue with the same command and --resume" if state_path else None) from None
    save(done)
    stats.seconds = time.perf_counter() - t0
    if recent:
        stats.loss = sum(r[0] for r in recent) / len(recent)
        stats.accuracy = [sum(r[1][s] for r in recent) / max(1, sum(r[2][s] for r in recent)) for s in range(positions)]
    draft.eval()
    return stats


__all__ = ["STATE_FILE", "TrainInterrupted", "TrainOptions", "TrainStats", "acceptance_estimate", "eagle1_loss", "eagle3_ttt_loss",
           "fit", "medusa_loss", "ttt_mask", "warmup_cosine"]
