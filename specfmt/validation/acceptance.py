"""Greedy chain speculative decoding without vLLM: the reference acceptance figures.

The loop vLLM runs for chain drafts (EAGLE, EAGLE-3, Medusa with one candidate per
position), written out plainly so its figures can be compared with vLLM's counters:

1. the verifier has produced token ``x`` (greedy) after the sequence ``s``;
2. the draft proposes ``k`` tokens ``d_1..d_k`` after ``s + [x]``
   (:data:`~specfmt.algorithms.reference.Proposer`);
3. the verifier scores ``s + [x] + d_1..d_k`` in one pass; ``d_i`` is accepted while it
   equals the verifier's greedy token at its position; the verifier's token after the
   last accepted one is the next ``x`` (the bonus token).

Per verification step ``a`` in ``[0, k]`` tokens are accepted. A proposal method may propose fewer than
``k`` tokens at a step, or none (n-gram finds no match, suffix decoding no continuation): a step without a
proposal is a verifier forward pass all the same, which yields the verifier's own token. The figures:

* ``accepted_per_position[i]``: steps in which draft position ``i`` was accepted
  (vLLM's ``spec_decode_num_accepted_tokens_per_pos``);
* acceptance rate per position: that count over the number of steps with a proposal (drafts);
* mean acceptance length: ``1 + accepted / drafts``, tokens per verification step with a proposal,
  counting the verifier's own token (vLLM's definition; EAGLE papers' tau);
* ``steps``: every verifier forward pass after the first token, those without a proposal included, and
  ``tokens_per_step`` = ``1 + accepted / steps``: what a method that drafts at some steps only must be
  compared by (vLLM's ``num_drafts`` counts the drafted steps alone). For a method that proposes at
  every step it equals the mean acceptance length.

The output tokens equal greedy decoding by the verifier alone, whatever the draft proposes.

**The verifier runs once per prompt.** Greedy verification is lossless, so the verifier's
tokens and states along the output do not depend on the draft: the tokens after ``s`` are the
verifier's greedy path, and ``d_i`` is accepted while it equals the path's token at its place.
:func:`run_chains` therefore generates the greedy path once (with a KV cache), takes every
hidden state and the logits in one forward pass over prompt + path (:func:`greedy_path`), and
then simulates each proposer against them, running only the draft. Positions where a drafted
token equals the greedy one see exactly the states of the greedy path, so the figures are the
loop's above; the alternative, a full verifier pass per verification step and per reading, cost
the example 7x8x(steps) passes (``validate --run --no-vllm`` took minutes where it now takes
seconds).

**The draft runs as vLLM runs it.** The EAGLE proposers (:class:`~specfmt.algorithms.reference.ChainDrafter`) keep a KV cache of
each sequence's verified positions (:class:`~specfmt.algorithms.reference.DraftCache`), so a proposal runs the positions verified
since the last one and one position per further drafted token, not the whole prefix k times; and
the prompts of a group advance side by side, one draft pass per round for all of them, so the
draft's weights are read once per round rather than once per prompt (a one-token pass is bound by
those reads). On a 1B verifier the draft simulation of a new draft's five readings then costs a tenth of
the verifier's passes (``benchmarks/scale_bench.py``; issue 19).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ..algorithms.reference import Proposer, VerifierStates


@dataclass
class ChainResult:
    """Figures of one reference run (all prompts).

    Attributes:
        k: speculative tokens per step.
        prompts: number of prompts.
        tokens: generated tokens (all prompts).
        num_drafts: verification steps with a proposal.
        num_draft_tokens: draft tokens proposed (``k * num_drafts`` for a method that always proposes k).
        steps: verifier forward passes after the first token, steps without a proposal included.
        num_accepted_tokens: accepted draft tokens.
        accepted_per_position: [k] counts.
        token_ids: generated ids per prompt (equal to the verifier alone).
        drafts_per_prompt: [prompts] verification steps with a proposal of each prompt, in prompt order (they sum to ``num_drafts``).
        accepted_per_prompt: [prompts] accepted draft tokens of each prompt (they sum to ``num_accepted_tokens``).
        verifier_seconds: wall time of the verifier's passes (:func:`greedy_path`, all prompts).
        draft_seconds: wall time of simulating this proposer against them.
    """

    k: int
    prompts: int = 0
    tokens: int = 0
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    steps: int = 0
    token_ids: list[list[int]] = field(default_factory=list)
    drafts_per_prompt: list[int] = field(default_factory=list)
    accepted_per_prompt: list[int] = field(default_factory=list)
    verifier_seconds: float = 0.0
    draft_seconds: float = 0.0

    @property
    def acceptance_rate_per_position(self) -> list[float]:
        return [a / self.num_drafts if self.num_drafts else 0.0 for a in self.accepted_per_position]

    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    @property
    def tokens_per_step(self) -> float:
        """Tokens per verifier forward pass, over every step (with a proposal or not): ``1 + accepted / steps``."""
        return 1.0 + self.num_accepted_tokens / self.steps if self.steps else 1.0

    def to_json(self) -> dict[str, Any]:
        return {
            "k": self.k, "prompts": self.prompts, "tokens": self.tokens, "num_drafts": self.num_drafts,
            "num_draft_tokens": self.num_draft_tokens, "num_accepted_tokens": self.num_accepted_tokens,
            "accepted_per_position": list(self.accepted_per_position),
            "acceptance_rate_per_position": [round(r, 4) for r in self.acceptance_rate_per_position],
            "mean_acceptance_length": round(self.mean_acceptance_length, 4),
            "steps": self.steps, "tokens_per_step": round(self.tokens_per_step, 4),
        }


def paired_difference_low(a: ChainResult, b: ChainResult, resamples: int = 2000, seed: int = 0) -> float | None:
    """The lower end of the 95 % interval of ``a``'s mean acceptance length minus ``b``'s, from a paired bootstrap over
    the prompts (both runs over the same prompts, resampled together; seeded, so a run gives the same answer again).
    None when either run lacks its per-prompt figures or they cover different prompts.

    A misreading that beats the checkpoint as written by chance on a few prompts has a low end at or below 0; one that
    reads the draft as it was trained is ahead on nearly every prompt (``benchmarks/trainer_vs_speculators.py`` sizes
    the same interval for two drafts: a per-prompt sd of the difference of about 0.6 on the example world).
    """
    import numpy as np

    n = len(a.drafts_per_prompt)
    if n == 0 or n != len(b.drafts_per_prompt) or n != len(a.accepted_per_prompt) or n != len(b.accepted_per_prompt):
        return None
    take = np.random.default_rng(seed).integers(0, n, size=(resamples, n))

    def al(r: ChainResult) -> "np.ndarray":
        drafts, accepted = np.asarray(r.drafts_per_prompt)[take].sum(1), np.asarray(r.accepted_per_prompt)[take].sum(1)
        return 1.0 + accepted / np.maximum(drafts, 1)

    return float(np.quantile(al(a) - al(b), 0.025))


def input_device(model: Any) -> Any:
    """Where a model's input ids go: the device of its input embedding (the first GPU of a
    ``device_map``; accelerate's hooks move activations between the devices after it)."""
    return model.get_input_embeddings().weight.device


def verifier_states(model: Any, tokens: list[int]) -> VerifierStates:
    """Run a transformers causal LM over ``tokens`` (one sequence, no cache).

    The states come back on one device, the logits' (a verifier spread over several GPUs with a
    ``device_map`` returns each layer's state on its own GPU; the drafts read them side by side),
    in the verifier's run dtype.
    """
    import torch

    with torch.no_grad():
        out = model(input_ids=torch.tensor([tokens], device=input_device(model)), output_hidden_states=True, use_cache=False)
    dev = out.logits.device
    return VerifierStates([h[0].to(dev) for h in out.hidden_states], out.logits[0])


def _greedy_tail(model: Any, tokens: list[int], n: int) -> list[int]:
    """``n`` greedy tokens after ``tokens``, decoded with the KV cache."""
    import torch

    dev = input_device(model)
    out: list[int] = []
    with torch.no_grad():
        step = model(input_ids=torch.tensor([tokens], device=dev), use_cache=True)
        for _ in range(n):
            out.append(int(step.logits[0, -1].argmax()))
            if len(out) == n:
                break
            step = model(input_ids=torch.tensor([[out[-1]]], device=dev), past_key_values=step.past_key_values, use_cache=True)
    return out


def greedy_path(model: Any, prompt: list[int], n: int) -> tuple[list[int], VerifierStates]:
    """The verifier's ``n`` greedy tokens after ``prompt``, and its states over prompt + path.

    The path is decoded with the KV cache, then the states come from one forward pass without
    cache over the whole sequence. Where that pass's argmax differs from the cached decode (a
    near tie, rounded apart), the pass wins: the path is re-decoded from there until every path
    token is the argmax the states give at its place, so the path and the states never disagree.

    Returns:
        ``(path, states)``: ``path`` [n] token ids; ``states`` over ``prompt + path``.
    """
    path = _greedy_tail(model, list(prompt), n)
    P = len(prompt)
    for _ in range(n + 1):
        states = verifier_states(model, list(prompt) + path)
        pred = states.logits[P - 1: P - 1 + n].argmax(-1).tolist()
        wrong = next((i for i, (a, b) in enumerate(zip(pred, path)) if a != b), None)
        if wrong is None:
            return path, states
        states = None  # not held through the next pass
        path = path[:wrong] + [pred[wrong]]
        path += _greedy_tail(model, list(prompt) + path, n - len(path))
    raise RuntimeError("the verifier's greedy path did not settle")  # pragma: no cover - n+1 passes always settle


def _asker(propose: Proposer) -> Callable[[list[tuple[list[int], VerifierStates]], int], list[list[int]]]:
    """How to ask ``propose`` for several sequences: in one call when it is a :class:`~specfmt.algorithms.reference.ChainDrafter`, else one call each."""
    many = getattr(propose, "propose_many", None)
    return many if many is not None else (lambda requests, k: [propose(t, s, k) for t, s in requests])


#: prompts simulated side by side at most (their verifier states are held together; a batched draft runs them in one pass)
GROUP = 16
#: what the held verifier states of a group may take (bytes); issue 19's memory bound leaves 1 GiB beside the verifier
STATES_BUDGET = 512 * 2**20


def group_size(model: Any, longest: int, budget: int = STATES_BUDGET) -> int:
    """Prompts whose verifier states fit ``budget`` together, between 1 and :data:`GROUP`.

    One prompt's states (:class:`VerifierStates`) are N+1 hidden states [T, H_t] and the logits
    [T, V] over its ``longest`` positions, in the verifier's run dtype: for an 8B Llama in bf16
    over 60 positions 32 MB (a group of 16), over 1,256 positions 660 MB (one at a time)."""
    cfg = model.config
    cfg = getattr(cfg, "text_config", None) or cfg
    width = (cfg.num_hidden_layers + 1) * cfg.hidden_size + cfg.vocab_size
    per_prompt = width * longest * model.get_input_embeddings().weight.element_size()
    return max(1, min(GROUP, budget // max(1, per_prompt)))


def _verify(res: ChainResult, draft: list[int], path: list[int], g: int, k: int) -> int:
    """One verification step of ``res``: ``draft`` (at most k ids; none: no proposal) against the greedy ``path`` at
    generated position ``g``; returns the accepted count and adds the step's figures.

    Raises:
        ValueError: more than k ids.
    """
    if len(draft) > k:
        raise ValueError(f"the proposer returned {len(draft)} tokens, at most {k} expected")
    a = 0
    while a < len(draft) and draft[a] == path[g + a]:
        a += 1
    res.steps += 1  # a verifier forward pass, with a proposal or not
    if draft:
        res.num_drafts += 1
        res.num_draft_tokens += len(draft)
    res.num_accepted_tokens += a
    for j in range(a):
        res.accepted_per_position[j] += 1
    return a


#: ``walk(model, prompt, n, index) -> (path, states)``: the verifier's n tokens after a prompt (``index``: its place in
#: the prompts given) and its states over prompt + path; :func:`greedy_path` by default, sampled ones at a temperature
#: (:func:`specfmt.validation.sampling.sampled_walk`)
Walk = Callable[[Any, list[int], int, int], "tuple[list[int], VerifierStates]"]
#: ``observe(proposer, prompt, tokens, states, draft, accepted)``: told of every verification step (the proposer's and
#: the prompt's index, the sequence the draft saw -- a list the loop extends afterwards: copy what is kept --, the
#: verifier's states over the path, the proposal, the tokens accepted)
Observe = Callable[[int, int, list[int], VerifierStates, list[int], int], None]


def _greedy_walk(model: Any, prompt: list[int], n: int, index: int) -> "tuple[list[int], VerifierStates]":
    return greedy_path(model, prompt, n)


def run_chains(model: Any, prompts: list[list[int]], proposers: list[Proposer], k: int, max_tokens: int,
               group: int | None = None, *, walk: Walk = _greedy_walk, observe: Observe | None = None) -> list[ChainResult]:
    """Greedy chain speculative decoding of ``max_tokens`` per prompt, for several drafts at once.

    The verifier runs once per prompt (:func:`greedy_path`, ``max_tokens + k`` tokens); each
    proposer is then simulated against the greedy path: the draft proposes ``k`` tokens after
    the sequence so far (with the verifier's states over it), ``d_i`` is accepted while it equals
    the path's token at its place, and the sequence moves on by the accepted tokens plus the
    verifier's own.

    Prompts are taken ``group`` at a time and their chains advance side by side (one group's verifier
    states are held at a time: a group's go before the next group's passes): each round asks a
    proposer for one proposal per unfinished prompt, in one call when it is a :class:`~specfmt.algorithms.reference.ChainDrafter`
    (the draft then reads its weights once per round for the whole group, not once per prompt; a
    single-token draft pass is bound by those reads). Each chain's figures are those of running it
    alone.

    Args:
        model: the verifier, a transformers causal LM (eval mode).
        prompts: prompt token ids.
        proposers: the drafts (:data:`Proposer`), e.g. the checkpoint and its misreadings.
        k: speculative tokens per step.
        max_tokens: tokens generated per prompt (as vLLM's ``max_tokens`` with ``ignore_eos``).
        group: prompts whose verifier states are held at once (default :func:`group_size`: as many
            as fit :data:`STATES_BUDGET`, at most :data:`GROUP`).
        walk: the verifier's path after each prompt (:data:`Walk`; default the greedy path). A path sampled from
            the verifier is the output of speculative sampling whatever a greedy draft proposes, and a drafted
            token is accepted exactly when it equals the path's token (:mod:`specfmt.validation.sampling`).
        observe: told of every step (:data:`Observe`), e.g. to compute its expected acceptance.

    Returns:
        One :class:`ChainResult` per proposer; ``token_ids`` are the verifier's tokens (greedy by default).

    Raises:
        ValueError: a proposer returned more than ``k`` ids.
    """
    import time

    results = [ChainResult(k=k, accepted_per_position=[0] * k) for _ in proposers]
    group = group or group_size(model, max(map(len, prompts), default=0) + max_tokens + k)
    for first in range(0, len(prompts), group):
        batch = prompts[first:first + group]
        t0 = time.perf_counter()
        walks = [walk(model, prompt, max_tokens + k, first + j) for j, prompt in enumerate(batch)]
        spent = time.perf_counter() - t0
        for which, (res, propose) in enumerate(zip(results, proposers)):
            res.verifier_seconds += spent
            many = _asker(propose)
            t0 = time.perf_counter()
            seqs = [list(prompt) + path[:1] for prompt, (path, _) in zip(batch, walks)]
            generated = [1] * len(batch)
            drafts, accepted = [0] * len(batch), [0] * len(batch)
            while True:
                active = [i for i, g in enumerate(generated) if g < max_tokens]
                if not active:
                    break
                proposals = many([(seqs[i], walks[i][1].prefix(len(seqs[i]) - 1)) for i in active], k)
                for i, draft in zip(active, proposals):
                    path, g = walks[i][0], generated[i]
                    draft = [int(t) for t in draft]
                    a = _verify(res, draft, path, g, k)
                    if observe is not None:
                        observe(which, first + i, seqs[i], walks[i][1], draft, a)
                    drafts[i] += 1 if len(draft) else 0
                    accepted[i] += a
                    seqs[i].extend(path[g: g + a + 1])  # the accepted tokens and the verifier's own
                    generated[i] = g + a + 1
            res.drafts_per_prompt += drafts
            res.accepted_per_prompt += accepted
            for path in [path for path, _ in walks]:  # (a loop variable would keep the last prompt's states)
                res.token_ids.append(path[:max_tokens])
                res.tokens += max_tokens
                res.prompts += 1
            res.draft_seconds += time.perf_counter() - t0
        del walks  # this group's states go before the next group's passes: one group's are held at a time
    return results


def run_chain(model: Any, prompts: list[list[int]], propose: Proposer, k: int, max_tokens: int) -> ChainResult:
    """:func:`run_chains` for one draft.

    Raises:
        ValueError: the proposer returned more than ``k`` ids.
    """
    return run_chains(model, prompts, [propose], k, max_tokens)[0]


__all__ = ["ChainResult", "Observe", "Walk", "greedy_path", "group_size", "input_device", "paired_difference_low", "run_chain", "run_chains",
           "verifier_states"]
