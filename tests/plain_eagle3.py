"""Greedy speculative decoding with an EAGLE-3 draft, written out step by step for the tests.

The shipped worlds' figures (``world.json``) were recorded by specfmt's own reference run
(:mod:`specfmt.validation.acceptance`, the EAGLE-3 module of :mod:`specfmt.algorithms.eagle3`), so
comparing ``validate --run`` with them only detects change. This module shares no code with
specfmt: the verifier is transformers' model, and the draft's forward pass is written here in
plain torch from the research description (SafeAILab/EAGLE ``eagle/traineagle3/cnets.py``, vLLM
``llama_eagle3.py`` / ``qwen3_eagle3.py``):

* taps: the verifier's residual stream entering layers ``taps`` (transformers' ``hidden_states[l]``),
  concatenated and projected by ``fc`` to H;
* the draft's layer reads ``cat(rms(embed(token after the position)), rms(h))`` (2H wide), with
  ``h`` as the residual (``norm_before_residual`` false); Llama attention (Qwen3: q and k RMS-normed
  per head before rope), SwiGLU MLP; ``lm_head(rms(x))`` gives draft-vocabulary logits and draft id
  i proposes verifier id ``i + d2t[i]``;
* a drafted position reads the draft's own pre-norm output at the position before it instead of
  ``fc(taps)``;
* the loop: the verifier's first token comes from the prompt; then, until ``max_tokens`` tokens are
  generated, the draft proposes k tokens, the verifier scores the sequence plus the proposal in one
  pass (no cache), ``d_i`` is accepted while it equals the verifier's greedy token at its place, and
  the accepted tokens plus the verifier's next one are appended (the last step may run past
  ``max_tokens``; its accepted tokens count, as vLLM counts them).

No KV cache anywhere: every pass runs the whole sequence again. Slow, and obviously right.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass

import torch


def rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Llama's rotary embedding (rotate_half) of ``x`` [heads, T, d] at ``positions`` [T]."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    angles = positions.double()[:, None] * inv[None, :]
    cos, sin = torch.cat([angles, angles], -1).cos().to(x.dtype), torch.cat([angles, angles], -1).sin().to(x.dtype)
    rotated = torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1)
    return x * cos + rotated * sin


@dataclass
class PlainEagle3:
    """One EAGLE-3 draft layer. ``w`` maps short names (``q``, ``k``, ``v``, ``o``, ``gate``, ``up``, ``down``,
    ``input_norm``, ``hidden_norm``, ``post_norm``, ``q_norm``, ``k_norm`` (Qwen3 only), ``fc``, ``norm``,
    ``lm_head``, ``d2t``, ``embed``) to tensors."""

    w: dict[str, torch.Tensor]
    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    theta: float

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``embeds``, ``hidden`` [T, H] -> (draft-vocabulary logits [T, Vd], pre-norm output [T, H]), causal."""
        w, T, d = self.w, embeds.shape[0], self.head_dim
        x = torch.cat([rms(embeds, w["input_norm"], self.eps), rms(hidden, w["hidden_norm"], self.eps)], -1)
        q = (x @ w["q"].T).view(T, self.heads, d)
        k = (x @ w["k"].T).view(T, self.kv_heads, d)
        v = (x @ w["v"].T).view(T, self.kv_heads, d).transpose(0, 1)
        if "q_norm" in w:
            q, k = rms(q, w["q_norm"], self.eps), rms(k, w["k_norm"], self.eps)
        q, k = rope(q.transpose(0, 1), positions, self.theta), rope(k.transpose(0, 1), positions, self.theta)
        group = self.heads // self.kv_heads
        k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
        scores = (q @ k.transpose(1, 2)) / math.sqrt(d)
        scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        attn = (scores.softmax(-1) @ v).transpose(0, 1).reshape(T, self.heads * d)
        x = hidden + attn @ w["o"].T
        y = rms(x, w["post_norm"], self.eps)
        x = x + (torch.nn.functional.silu(y @ w["gate"].T) * (y @ w["up"].T)) @ w["down"].T
        return rms(x, w["norm"], self.eps) @ w["lm_head"].T, x

    def propose(self, tokens: list[int], taps: torch.Tensor, k: int) -> list[int]:
        """k verifier ids after ``tokens`` (ending with the verifier's newest token); ``taps`` [len(tokens) - 1, n·H_t]
        are the verifier's tap states over ``tokens[:-1]``."""
        n = len(tokens) - 1
        ids = list(tokens[1:])  # position j reads the token after it
        hidden = taps @ self.w["fc"].T
        out: list[int] = []
        for _ in range(k):
            logits, pre = self.forward(self.w["embed"][torch.tensor(ids)], hidden, torch.arange(len(ids)))
            draft_id = int(logits[-1].argmax())
            out.append(draft_id + int(self.w["d2t"][draft_id]))
            ids.append(out[-1])
            hidden = torch.cat([hidden, pre[-1:]])  # the next position reads this one's own output
        assert len(ids) == n + k
        return out


@contextmanager
def one_thread():
    """torch on one thread inside the block. The passes here are of a 2M-parameter model over < 100 tokens: on the
    2-core CI machine with other work running, two threads made them 20x slower (170 s against 8 s for the world)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


@torch.no_grad()
def speculative_figures(verifier, draft: PlainEagle3, prompts: list[list[int]], taps: list[int], k: int, max_tokens: int) -> dict:
    """Greedy speculative decoding of ``max_tokens`` per prompt: the figures vLLM counts (``num_drafts``,
    ``num_draft_tokens``, ``num_accepted_tokens``, ``accepted_per_position``) and the tokens."""
    drafts = accepted = 0
    per_position = [0] * k
    outputs = []
    for prompt in prompts:
        seq = list(prompt)
        seq.append(int(verifier(torch.tensor([seq])).logits[0, -1].argmax()))
        generated = 1
        while generated < max_tokens:
            states = verifier(torch.tensor([seq[:-1]]), output_hidden_states=True).hidden_states
            proposal = draft.propose(seq, torch.cat([states[l][0] for l in taps], -1), k)
            greedy = verifier(torch.tensor([seq + proposal])).logits[0, len(seq) - 1:].argmax(-1).tolist()  # k + 1 tokens
            a = 0
            while a < k and proposal[a] == greedy[a]:
                a += 1
            drafts += 1
            accepted += a
            for i in range(a):
                per_position[i] += 1
            seq += proposal[:a] + [greedy[a]]
            generated += a + 1
        outputs.append(seq[len(prompt):len(prompt) + max_tokens])
    return {"k": k, "prompts": len(prompts), "tokens": len(prompts) * max_tokens, "num_drafts": drafts, "num_draft_tokens": k * drafts,
            "num_accepted_tokens": accepted, "accepted_per_position": per_position,
            "acceptance_rate_per_position": [round(c / drafts, 4) for c in per_position],
            "mean_acceptance_length": round(1 + accepted / drafts, 4), "token_ids": outputs}
