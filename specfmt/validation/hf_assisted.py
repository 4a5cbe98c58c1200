"""transformers' assisted generation, measured: ``model.generate(..., assistant_model=D)`` with per-position counts.

transformers runs a draft LM as an assistant (``generation/utils.py``, ``_assisted_decoding``): each step its
candidate generator proposes tokens (``get_candidates``), the verifier scores them in one pass, and the
generator is told how many matched (``update_candidate_strategy(input_ids, scores, num_matches)``). Those two
calls are the step's figures; :func:`assisted` records them by wrapping the candidate generator the model
builds (``_get_candidate_generator``), on this model object only, and changes nothing it computes.

What is fixed so that the figures compare with vLLM's and the reference's:

* k: ``num_assistant_tokens = k`` with the ``constant`` schedule and no confidence stop
  (:func:`specfmt.methods.draft_lm.fixed_k`; the defaults change k as the run goes);
* greedy, ``max_new_tokens`` tokens per prompt, no stop at eos (vLLM's ``ignore_eos``): ``eos_token_id`` None;
* one prompt at a time (transformers: "assisted generate is only supported for batch_size = 1").

transformers drafts from the prompt at its first step, where vLLM and the reference take the verifier's first
token from the prompt's pass alone; the figures are otherwise counted as theirs. With two tokenizers and
greedy decoding transformers maps through text (``AssistedCandidateGeneratorDifferentTokenizers``: the
verifier's tokens decoded and re-encoded with the draft's tokenizer, the draft's tokens decoded and re-encoded
with the verifier's), so a step can propose more or fewer than k verifier tokens.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any


@dataclass
class AssistedRun:
    """transformers' assisted generation over the prompts.

    Attributes:
        token_ids: generated ids per prompt.
        num_drafts: steps with candidates.
        num_draft_tokens: candidate tokens proposed (verifier ids).
        num_accepted_tokens: candidates accepted.
        accepted_per_position: steps in which candidate position i was accepted (as long as the longest proposal).
        steps: verifier forward passes.
        longest: the most candidates one step proposed (more than k happens with two tokenizers).
    """

    token_ids: list[list[int]] = field(default_factory=list)
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    steps: int = 0
    longest: int = 0

    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    def record(self, proposed: int, matched: int) -> None:
        """One step: ``proposed`` candidates, the first ``matched`` accepted."""
        self.steps += 1
        if proposed:
            self.num_drafts += 1
            self.num_draft_tokens += proposed
            self.longest = max(self.longest, proposed)
        self.num_accepted_tokens += matched
        if len(self.accepted_per_position) < matched:
            self.accepted_per_position += [0] * (matched - len(self.accepted_per_position))
        for i in range(matched):
            self.accepted_per_position[i] += 1


class _Counted:
    """A candidate generator whose ``get_candidates`` and ``update_candidate_strategy`` are counted into ``run``."""

    def __init__(self, inner: Any, run: AssistedRun) -> None:
        self._inner, self._run, self._proposed = inner, run, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def get_candidates(self, input_ids: Any, *args: Any, **kwargs: Any) -> Any:
        cand, logits = self._inner.get_candidates(input_ids, *args, **kwargs)
        self._proposed = int(cand.shape[1] - input_ids.shape[1])
        return cand, logits

    def update_candidate_strategy(self, input_ids: Any, scores: Any, num_matches: Any) -> Any:
        self._run.record(self._proposed, int(num_matches))
        return self._inner.update_candidate_strategy(input_ids, scores, num_matches)


def assisted(model: Any, prompts: list[list[int]], max_tokens: int, kwargs: dict[str, Any]) -> AssistedRun:
    """Greedy assisted generation of ``max_tokens`` per prompt, counted per step.

    Args:
        model: the verifier (transformers causal LM, eval mode).
        prompts: prompt token ids.
        max_tokens: tokens per prompt (no stop at eos).
        kwargs: the method's ``generate`` kwargs (:meth:`specfmt.methods.base.Transformers.generate_kwargs`).

    Returns:
        An :class:`AssistedRun`.
    """
    import torch

    run = AssistedRun()
    config = copy.deepcopy(model.generation_config)
    config.do_sample, config.max_new_tokens, config.min_new_tokens = False, max_tokens, None
    config.eos_token_id, config.max_length = None, None
    build = model._get_candidate_generator

    def counted(*args: Any, **kw: Any) -> Any:
        return _Counted(build(*args, **kw), run)

    dev = model.get_input_embeddings().weight.device
    model._get_candidate_generator = counted  # this object only; restored below
    try:
        with torch.no_grad():
            for ids in prompts:
                inputs = torch.tensor([ids], device=dev)
                out = model.generate(inputs, attention_mask=torch.ones_like(inputs), generation_config=config, **kwargs)
                run.token_ids.append(out[0, len(ids):].tolist())
    finally:
        del model._get_candidate_generator
    return run


__all__ = ["AssistedRun", "assisted"]
