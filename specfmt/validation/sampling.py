"""Acceptance under sampling (``validate --run --temperature T``): the reference's expected acceptance, computed
exactly as vLLM's rejection sampler defines it, and its agreement with vLLM's measured acceptance.

**vLLM's rule** (``vllm/v1/sample/rejection_sampler.py``, ``rejection_random_sample_kernel``; the draft sampling
method ``draft_sample_method`` in ``vllm/config/speculative.py``, ``greedy`` by default). The verifier's probabilities
``p = softmax(logits / T)`` (top-k/top-p not used here). A draft token ``x`` drafted greedily -- the default for
every model-based method, and what n-gram and suffix decoding propose, which have no draft probabilities -- is
accepted with probability ``p(x)`` (the kernel's ``NO_DRAFT_PROBS``: the draft probability is taken as 1); a token
sampled from the draft's ``q`` with ``min(1, p(x) / q(x))`` (Leviathan et al. 2023, arXiv 2211.17192; Chen et al.
2023, arXiv 2302.01318). On a rejection the token comes from ``max(p - q, 0)`` normalised (for a greedy draft: ``p``
without ``x``); after k acceptances the bonus token from ``p``.

**What follows for a greedy draft.** The output is distributed as sampling from the verifier alone (the point of
the rule), and a drafted ``x`` ends up in the output exactly when it is accepted: a rejection never resamples ``x``.
So a run is a path sampled from the verifier (:func:`sampled_walk`), and a step's accepted tokens are the drafted
tokens that agree with it, as in the greedy loop (:func:`~specfmt.validation.acceptance.run_chains`). The drafts
along the path depend on the path only, so each proposer is simulated against it exactly as vLLM would run it.

**The expected acceptance, exactly.** At a step whose draft is ``d_1..d_m`` after the sequence ``s``, position ``i``
is accepted with probability ``E_i = p_1(d_1) * ... * p_i(d_i)``, where ``p_j`` is the verifier's distribution after
``s + d_1..d_{j-1}``. Up to the first draft token that leaves the path these are the path's own states; past it they
need the verifier over the drafted tokens, computed in one batched pass per run (:class:`ExpectedAcceptance`). The
figures add ``E_i`` over the steps (``expected_accepted_per_position``) where the greedy loop adds 0 or 1; they are
averaged over ``len(seeds)`` sampled paths per prompt. The realized count of the same paths is kept beside them
(``accepted_per_position``): its average is the same, with a larger variance.

**Agreement with vLLM** (:func:`agreement`). vLLM runs the same prompts at T, once per seed (its paths are other
samples than the reference's: the two agree in distribution, not token by token). Each figure is a ratio over the
runs (a run: one prompt, one seed): a position's acceptance rate per verifier pass, ``sum_u A_u / sum_u S_u`` over the
runs' accepted counts ``A_u`` and steps ``S_u``. Its standard error is the ratio estimator's (delta method; Cochran,
Sampling Techniques, 3rd ed., section 6.4): ``SE^2 = n / (n - 1) * sum_u (A_u - R S_u)^2 / (sum_u S_u)^2`` over the
``n`` runs. The runs of different prompts have different means, so this overstates the error (it counts the spread
between prompts too): the test is conservative. The two figures agree when their gap is at most
:data:`Z` standard errors of the difference, ``sqrt(SE_ref^2 + SE_vllm^2)`` (a two-sided false alarm of 0.27 % per
figure when they agree).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .acceptance import ChainResult, input_device, run_chains, verifier_states

if TYPE_CHECKING:  # pragma: no cover
    from ..algorithms.reference import Proposer, VerifierStates
    from .vllm_run import VLLMRun

#: standard errors of the difference within which the reference and vLLM agree (two-sided, 99.73 %)
Z = 3.0
#: sequences of one verifier pass over drafted tokens (the expected acceptance off the path)
BATCH = 16


def sampled_path(model: Any, prompt: list[int], n: int, temperature: float, seed: int) -> tuple[list[int], "VerifierStates"]:
    """``n`` tokens sampled from the verifier after ``prompt`` at ``temperature`` (a ``torch.Generator`` seeded with
    ``seed``, KV cache), and its states over prompt + path (one pass, as :func:`~specfmt.validation.acceptance.greedy_path`).

    Raises:
        ValueError: ``temperature`` is not above 0.
    """
    import torch

    if not temperature > 0:
        raise ValueError(f"temperature {temperature}: a sampled path needs a temperature above 0")
    dev = input_device(model)
    gen = torch.Generator(device="cpu").manual_seed(int(seed))
    out: list[int] = []
    with torch.no_grad():
        step = model(input_ids=torch.tensor([list(prompt)], device=dev), use_cache=True)
        while True:
            probs = torch.softmax(step.logits[0, -1].float().cpu() / temperature, dim=-1)
            out.append(int(torch.multinomial(probs, 1, generator=gen)))
            if len(out) == n:
                break
            step = model(input_ids=torch.tensor([[out[-1]]], device=dev), past_key_values=step.past_key_values, use_cache=True)
    return out, verifier_states(model, list(prompt) + out)


def sampled_walk(temperature: float, seeds: list[int], per_prompt: int):
    """A :data:`~specfmt.validation.acceptance.Walk` over prompts repeated once per seed (``index // per_prompt`` is
    the prompt, ``seeds[index % per_prompt]`` its seed): :func:`sampled_path`."""
    def walk(model: Any, prompt: list[int], n: int, index: int):
        return sampled_path(model, prompt, n, temperature, seeds[index % per_prompt])

    return walk


@dataclass
class SampledResult:
    """The reference at a temperature, for one proposer: the realized figures of its sampled paths (``chain``) and
    the expected ones.

    Attributes:
        chain: the loop's figures on the sampled paths (realized acceptance; ``steps`` every verifier pass).
        temperature / seeds: how the paths were sampled (each prompt once per seed).
        expected_accepted_per_position: [k] the sum over the steps of ``E_i`` (module docstring).
        runs: per run (prompt-major, then seed): ``{"steps", "expected": [k], "accepted": [k]}``.
    """

    chain: ChainResult
    temperature: float
    seeds: list[int]
    expected_accepted_per_position: list[float] = field(default_factory=list)
    runs: list[dict[str, Any]] = field(default_factory=list)

    @property
    def expected_rate_per_step(self) -> list[float]:
        """Expected acceptance rate of each position per verifier forward pass (every step)."""
        s = self.chain.steps
        return [e / s if s else 0.0 for e in self.expected_accepted_per_position]

    @property
    def expected_tokens_per_step(self) -> float:
        """Expected tokens per verifier forward pass: ``1 + sum_i E_i / steps``."""
        return 1.0 + sum(self.expected_rate_per_step)

    def expected_chain(self) -> ChainResult:
        """The run shaped as a :class:`~specfmt.validation.acceptance.ChainResult` whose accepted counts are the
        expectations (floats): its ``mean_acceptance_length`` and rates are then the expected ones (the steps, drafts
        and tokens are the sampled paths')."""
        from dataclasses import replace

        return replace(self.chain, accepted_per_position=list(self.expected_accepted_per_position),
                       num_accepted_tokens=sum(self.expected_accepted_per_position))

    def to_json(self) -> dict[str, Any]:
        return {"temperature": self.temperature, "seeds": list(self.seeds), **self.chain.to_json(),
                "expected_accepted_per_position": [round(e, 4) for e in self.expected_accepted_per_position],
                "expected_rate_per_step": [round(r, 4) for r in self.expected_rate_per_step],
                "expected_tokens_per_step": round(self.expected_tokens_per_step, 4)}


class ExpectedAcceptance:
    """The :data:`~specfmt.validation.acceptance.Observe` of a sampled run: each step's ``E_i`` (module docstring),
    from the path's logits up to the first drafted token off the path, and from one batched verifier pass over the
    drafted tokens past it (:meth:`finish`)."""

    def __init__(self, model: Any, k: int, temperature: float, proposers: int, runs: int) -> None:
        self.model, self.k, self.t = model, k, temperature
        self.expected = [[[0.0] * k for _ in range(runs)] for _ in range(proposers)]
        self.accepted = [[[0] * k for _ in range(runs)] for _ in range(proposers)]
        self.steps = [[0] * runs for _ in range(proposers)]
        #: (proposer, run, tokens to run, first logit row, the draft tokens scored there, the product so far)
        self._off: list[tuple[int, int, list[int], int, list[int], float, int]] = []

    def _probs(self, logits: Any, ids: list[int]) -> list[float]:
        import torch

        p = torch.softmax(logits.float() / self.t, dim=-1)
        return p[torch.arange(len(ids)), torch.tensor(ids)].tolist()

    def __call__(self, which: int, run: int, tokens: list[int], states: "VerifierStates", draft: list[int], a: int) -> None:
        self.steps[which][run] += 1
        for i in range(a):
            self.accepted[which][run][i] += 1
        if not draft:
            return
        L, m = len(tokens), len(draft)
        on = min(m, a + 1)  # d_1..d_{a+1} are scored at positions of the path (their prefixes are on it)
        probs = self._probs(states.logits[L - 1: L - 1 + on], draft[:on])
        prod = 1.0
        for i, p in enumerate(probs):
            prod *= p
            self.expected[which][run][i] += prod
        if on < m:  # d_{a+2}..d_m follow d_{a+1}, which left the path: the verifier over s + d_1..d_{m-1}
            self._off.append((which, run, list(tokens) + draft[:m - 1], L + a, draft[on:], prod, on))

    def finish(self) -> None:
        """Score the drafted tokens off the path (batches of :data:`BATCH` sequences, right-padded: a causal model's
        rows are not changed by what follows them)."""
        import torch

        dev = input_device(self.model)
        for start in range(0, len(self._off), BATCH):
            part = self._off[start:start + BATCH]
            width = max(len(q[2]) for q in part)
            ids = torch.zeros((len(part), width), dtype=torch.long)
            for r, q in enumerate(part):
                ids[r, :len(q[2])] = torch.tensor(q[2])
            with torch.no_grad():
                logits = self.model(input_ids=ids.to(dev), use_cache=False).logits
            for r, (which, run, _, row, ids_off, prod, on) in enumerate(part):
                for j, p in enumerate(self._probs(logits[r, row: row + len(ids_off)], ids_off)):
                    prod *= p
                    self.expected[which][run][on + j] += prod
        self._off = []


def run_sampled(model: Any, prompts: list[list[int]], proposers: list["Proposer"], k: int, max_tokens: int, temperature: float,
                seeds: list[int]) -> list[SampledResult]:
    """The reference at ``temperature``: every prompt once per seed, a path sampled from the verifier, each proposer
    simulated against it, its expected acceptance computed exactly (module docstring).

    Args:
        model: the verifier (transformers causal LM, eval mode).
        prompts: prompt token ids.
        proposers: greedy drafts (:data:`~specfmt.algorithms.reference.Proposer`), each returning at most k ids.
        k: speculative tokens per step.
        max_tokens: tokens per run.
        temperature: above 0.
        seeds: one sampled path per prompt and seed.

    Returns:
        One :class:`SampledResult` per proposer.

    Raises:
        ValueError: ``temperature`` not above 0, no seeds, or a proposer returned more than k ids.
    """
    if not temperature > 0 or not seeds:
        raise ValueError("a sampled run needs a temperature above 0 and at least one seed")
    runs = [p for p in prompts for _ in seeds]
    observe = ExpectedAcceptance(model, k, temperature, len(proposers), len(runs))
    chains = run_chains(model, runs, proposers, k, max_tokens, walk=sampled_walk(temperature, list(seeds), len(seeds)), observe=observe)
    observe.finish()
    out = []
    for w, chain in enumerate(chains):
        expected = [sum(observe.expected[w][r][i] for r in range(len(runs))) for i in range(k)]
        per_run = [{"steps": observe.steps[w][r], "expected": observe.expected[w][r], "accepted": observe.accepted[w][r]} for r in range(len(runs))]
        out.append(SampledResult(chain, temperature, list(seeds), expected, per_run))
    return out


# --------------------------------------------------------------------------- agreement


def ratio_and_se(accepted: list[float], steps: list[int]) -> tuple[float, float]:
    """``(R, SE)``: the ratio ``sum A_u / sum S_u`` over runs and its standard error (delta method, module docstring).

    Args:
        accepted: per run, the accepted count (or its expectation) of one position, or of all positions together.
        steps: per run, its verifier passes.
    """
    total = sum(steps)
    if not total:
        return 0.0, 0.0
    r = sum(accepted) / total
    n = len(steps)
    if n < 2:
        return r, float("inf")
    ss = sum((a - r * s) ** 2 for a, s in zip(accepted, steps))
    return r, (n / (n - 1) * ss) ** 0.5 / total


def vllm_runs(run: "VLLMRun", k: int) -> list[dict[str, Any]]:
    """vLLM's runs as the reference's ``runs``: per request, its steps and the steps that accepted position i
    (from the tokens each step yielded, ``VLLMRun.step_tokens``: ``1 + accepted``; a last step cut at ``max_tokens``
    counts what it kept)."""
    out = []
    for steps in run.step_tokens:
        decode = steps[1:]
        out.append({"steps": len(decode), "accepted": [sum(1 for n in decode if n - 1 > i) for i in range(k)]})
    return out


@dataclass
class Agreement:
    """The reference's expected acceptance against vLLM's measured one, per position and over all positions.

    Attributes:
        rows: ``{"figure", "reference", "reference_se", "vllm", "vllm_se", "gap", "tolerance", "ok"}`` per position
            (``position 1`` ...), then ``tokens per step`` (1 + the sum of the rates).
        z: the standard errors allowed (:data:`Z`).
    """

    rows: list[dict[str, Any]]
    z: float = Z

    @property
    def ok(self) -> bool:
        return all(r["ok"] for r in self.rows)

    def to_json(self) -> dict[str, Any]:
        return {"z": self.z, "ok": self.ok, "rows": self.rows}


def agreement(ref: SampledResult, run: "VLLMRun", k: int, z: float = Z) -> Agreement:
    """Compare the reference's expected rates per verifier pass with vLLM's measured ones (module docstring).

    vLLM's figure is its counters' (``accepted_per_position`` over :attr:`VLLMRun.steps`); its standard error comes
    from its runs (:func:`vllm_runs`); the reference's from its runs' expectations.
    """
    v_runs = vllm_runs(run, k)
    v_steps = [r["steps"] for r in v_runs]
    r_steps = [r["steps"] for r in ref.runs]
    rows = []
    per_pos_v = list(run.accepted_per_position) + [0] * (k - len(run.accepted_per_position))
    for i in range(k + 1):
        if i < k:
            figure = f"position {i + 1}"
            r_acc = [u["expected"][i] for u in ref.runs]
            v_acc = [u["accepted"][i] for u in v_runs]
            v_point = per_pos_v[i] / run.steps if run.steps else 0.0
        else:
            figure = "tokens per step"
            r_acc = [sum(u["expected"]) for u in ref.runs]
            v_acc = [sum(u["accepted"]) for u in v_runs]
            v_point = sum(per_pos_v) / run.steps if run.steps else 0.0
        r_point, r_se = ratio_and_se(r_acc, r_steps)
        _, v_se = ratio_and_se(v_acc, v_steps)
        tol = z * (r_se ** 2 + v_se ** 2) ** 0.5
        base = 1.0 if i == k else 0.0
        rows.append({"figure": figure, "reference": round(base + r_point, 4), "reference_se": round(r_se, 4), "vllm": round(base + v_point, 4),
                     "vllm_se": round(v_se, 4), "gap": round(abs(v_point - r_point), 4), "tolerance": round(tol, 4),
                     "ok": abs(v_point - r_point) <= tol})
    return Agreement(rows, z)


__all__ = ["Agreement", "BATCH", "ExpectedAcceptance", "SampledResult", "Z", "agreement", "ratio_and_se", "run_sampled", "sampled_path",
           "sampled_walk", "vllm_runs"]
