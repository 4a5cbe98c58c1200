"""Greedy chain speculative decoding without vLLM: the reference acceptance figures.

The loop vLLM runs for chain drafts (EAGLE, EAGLE-3, Medusa with one candidate per
position), written out plainly so its figures can be compared with vLLM's counters:

1. the verifier has produced token ``x`` (greedy) after the sequence ``s``;
2. the draft proposes ``k`` tokens ``d_1..d_k`` after ``s + [x]`` (:data:`Proposer`);
3. the verifier scores ``s + [x] + d_1..d_k`` in one pass; ``d_i`` is accepted while it
   equals the verifier's greedy token at its position; the verifier's token after the
   last accepted one is the next ``x`` (the bonus token).

Per verification step ``a`` in ``[0, k]`` tokens are accepted. The figures:

* ``accepted_per_position[i]``: steps in which draft position ``i`` was accepted
  (vLLM's ``spec_decode_num_accepted_tokens_per_pos``);
* acceptance rate per position: that count over the number of steps (drafts);
* mean acceptance length: ``1 + accepted / drafts``, tokens per verification step
  counting the verifier's own token (vLLM's definition; EAGLE papers' tau).

The output tokens equal greedy decoding by the verifier alone, whatever the draft
proposes; :func:`run_chain` checks that as it goes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # pragma: no cover
    import torch


@dataclass
class VerifierStates:
    """One verifier forward pass over a token sequence of length T.

    Attributes:
        hidden: ``output_hidden_states`` of a transformers causal LM: N+1 tensors [T, H_t];
            ``hidden[j]`` is the residual stream entering decoder layer j (what vLLM taps
            for ``eagle_aux_hidden_state_layer_ids``) and ``hidden[N]`` is the last
            layer's output after the final norm (what EAGLE-1 and Medusa read).
        logits: [T, V].
    """

    hidden: list["torch.Tensor"]
    logits: "torch.Tensor"


#: ``propose(tokens, states, k) -> k draft token ids (verifier vocabulary)``.
#: ``tokens`` ends with the verifier's newest token x; ``states`` (:class:`VerifierStates`) covers
#: ``tokens[:-1]``. Each algorithm builds its own (:meth:`specfmt.algorithms.base.Algorithm.proposer`).
Proposer = Callable[[list[int], VerifierStates, int], list[int]]


@dataclass
class ChainResult:
    """Figures of one reference run (all prompts).

    Attributes:
        k: speculative tokens per step.
        prompts: number of prompts.
        tokens: generated tokens (all prompts).
        num_drafts: verification steps with a proposal.
        num_draft_tokens: ``k * num_drafts``.
        num_accepted_tokens: accepted draft tokens.
        accepted_per_position: [k] counts.
        token_ids: generated ids per prompt (equal to the verifier alone).
    """

    k: int
    prompts: int = 0
    tokens: int = 0
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    token_ids: list[list[int]] = field(default_factory=list)

    @property
    def acceptance_rate_per_position(self) -> list[float]:
        return [a / self.num_drafts if self.num_drafts else 0.0 for a in self.accepted_per_position]

    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    def to_json(self) -> dict[str, Any]:
        return {
            "k": self.k, "prompts": self.prompts, "tokens": self.tokens, "num_drafts": self.num_drafts,
            "num_draft_tokens": self.num_draft_tokens, "num_accepted_tokens": self.num_accepted_tokens,
            "accepted_per_position": list(self.accepted_per_position),
            "acceptance_rate_per_position": [round(r, 4) for r in self.acceptance_rate_per_position],
            "mean_acceptance_length": round(self.mean_acceptance_length, 4),
        }


def verifier_states(model: Any, tokens: list[int]) -> VerifierStates:
    """Run a transformers causal LM over ``tokens`` (one sequence, no cache)."""
    import torch

    with torch.no_grad():
        out = model(input_ids=torch.tensor([tokens]), output_hidden_states=True, use_cache=False)
    return VerifierStates([h[0] for h in out.hidden_states], out.logits[0])


def run_chain(model: Any, prompts: list[list[int]], propose: Proposer, k: int, max_tokens: int) -> ChainResult:
    """Greedy chain speculative decoding of ``max_tokens`` per prompt.

    Args:
        model: the verifier, a transformers causal LM (eval mode).
        prompts: prompt token ids.
        propose: the draft (:data:`Proposer`).
        k: speculative tokens per step.
        max_tokens: tokens generated per prompt (as vLLM's ``max_tokens`` with ``ignore_eos``).

    Returns:
        The figures; ``token_ids`` are the verifier's greedy tokens.

    Raises:
        ValueError: the proposer returned other than ``k`` ids.
    """
    res = ChainResult(k=k, accepted_per_position=[0] * k)
    for prompt in prompts:
        seq = list(prompt)
        states = verifier_states(model, seq)
        seq.append(int(states.logits[-1].argmax()))
        generated = 1
        while generated < max_tokens:
            draft = [int(t) for t in propose(seq, states, k)]
            if len(draft) != k:
                raise ValueError(f"the proposer returned {len(draft)} tokens, expected {k}")
            full = verifier_states(model, seq + draft)
            greedy = full.logits[len(seq) - 1:].argmax(-1).tolist()  # the verifier's token after seq, d_1, ..., d_k
            a = 0
            while a < k and draft[a] == greedy[a]:
                a += 1
            res.num_drafts += 1
            res.num_draft_tokens += k
            res.num_accepted_tokens += a
            for i in range(a):
                res.accepted_per_position[i] += 1
            new = draft[:a] + [greedy[a]]
            seq.extend(new)
            generated += len(new)
            states = VerifierStates([h[: len(seq) - 1] for h in full.hidden], full.logits[: len(seq) - 1])
        res.token_ids.append(seq[len(prompt): len(prompt) + max_tokens])
        res.tokens += max_tokens
        res.prompts += 1
    return res


__all__ = ["ChainResult", "Proposer", "VerifierStates", "run_chain", "verifier_states"]
