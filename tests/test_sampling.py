"""Acceptance under sampling (issue 37): the reference's expected acceptance, exact per step, and its agreement with a
literal run of vLLM's rejection rule; the statistical tolerance; the speedup formula against hand computations."""

from __future__ import annotations

import json
import random

import pytest
import torch

from conftest import WORLD


@pytest.fixture(scope="module")
def verifier_model():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(WORLD / "verifier"), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def prompts():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(WORLD / "verifier"))
    return [tok.encode(json.loads(line)["prompt"])[:24] for line in (WORLD / "prompts.jsonl").read_text().splitlines()[:2]]


def _probs(model, tokens, t):
    with torch.no_grad():
        return torch.softmax(model(input_ids=torch.tensor([tokens])).logits[0].float() / t, dim=-1)


def test_expected_acceptance_is_the_product_of_the_verifiers_probabilities(verifier_model, prompts):
    """E_i = p_1(d_1) ... p_i(d_i), each p_j the verifier's distribution after the sequence and d_1..d_{j-1}: on the
    path where the draft follows it, past the first token that leaves it from the verifier over the drafted tokens."""
    from specfmt.validation.sampling import ExpectedAcceptance, sampled_path

    t = 0.8
    prompt = prompts[0]
    path, states = sampled_path(verifier_model, prompt, 8, t, seed=3)
    tokens = list(prompt) + path[:2]  # the draft sees the prompt and two tokens; the path goes on with path[2:]
    for draft, a in ((path[2:5], 3), ([path[2], (path[3] + 1) % 2048, 7], 1), ([(path[2] + 5) % 2048, 9, 11], 0)):
        obs = ExpectedAcceptance(verifier_model, 3, t, proposers=1, runs=1)
        obs(0, 0, tokens, states, draft, a)
        obs.finish()
        want, prod = [], 1.0
        for i, d in enumerate(draft):
            prod *= float(_probs(verifier_model, tokens + draft[:i], t)[-1, d])
            want.append(prod)
        assert obs.expected[0][0] == pytest.approx(want, rel=1e-4, abs=1e-7)
        assert obs.accepted[0][0] == [1] * a + [0] * (3 - a) and obs.steps[0][0] == 1


def _literal_rejection(model, prompt, propose, k, max_tokens, t, seed):
    """vLLM's rejection sampler written out (rejection_random_sample_kernel with no draft probabilities): a drafted x is
    accepted if u < p(x); a rejection samples from p without x; all accepted: the bonus token from p. Per-position
    accepted counts and steps of one run."""
    g = torch.Generator().manual_seed(seed)
    seq = list(prompt)
    seq.append(int(torch.multinomial(_probs(model, seq, t)[-1], 1, generator=g)))
    accepted, steps, produced = [0] * k, 0, 1
    while produced < max_tokens:
        draft = propose(seq, None, k)
        p = _probs(model, seq + draft, t)[len(seq) - 1:]  # p[j]: after seq + draft[:j]
        steps += 1
        out = []
        for j, x in enumerate(draft):
            if float(torch.rand((), generator=g)) < float(p[j, x]):
                out.append(x)
                accepted[j] += 1
                continue
            q = p[j].clone()
            q[x] = 0
            out.append(int(torch.multinomial(q / q.sum(), 1, generator=g)))
            break
        else:
            out.append(int(torch.multinomial(p[len(draft)], 1, generator=g)))
        seq += out
        produced += len(out)
    return accepted, steps


def test_expected_acceptance_agrees_with_vllms_rejection_rule_run_literally(verifier_model, prompts):
    """The reference's claim: at a temperature, a greedy draft's speculative sampling is the verifier's own sampling, a
    drafted token accepted exactly when the sampled path has it. Its expected rates per verifier pass must then agree,
    within the stated tolerance, with vLLM's rule run literally (other random draws, many seeds)."""
    from specfmt.methods import resolve
    from specfmt.validation.sampling import Z, ratio_and_se, run_sampled

    t, k, n, seeds = 1.0, 2, 10, list(range(16))
    ngram = resolve("ngram")
    propose = ngram.proposer(ngram.readings(None)[0], None)

    def greedy_self(tokens, states, kk):  # the verifier's own argmax as a greedy draft: accepted often, at T = 1 not always
        out = []
        for _ in range(kk):
            out.append(int(_probs(verifier_model, tokens + out, 1.0)[-1].argmax()))
        return out

    first = []
    for proposer in (greedy_self, propose):
        ref = run_sampled(verifier_model, prompts[:1], [proposer], k, n, t, seeds)[0]
        first.append(ref.expected_rate_per_step[0])
        lit = [_literal_rejection(verifier_model, p, proposer, k, n, t, 1000 + s) for p in prompts[:1] for s in seeds]
        steps_ref = [u["steps"] for u in ref.runs]
        steps_lit = [s for _, s in lit]
        for i in range(k):
            r, r_se = ratio_and_se([u["expected"][i] for u in ref.runs], steps_ref)
            v, v_se = ratio_and_se([a[i] for a, _ in lit], steps_lit)
            assert abs(r - v) <= Z * (r_se ** 2 + v_se ** 2) ** 0.5, (proposer, i, r, v, r_se, v_se)
        r_all, _ = ratio_and_se([sum(u["expected"]) for u in ref.runs], steps_ref)
        assert ref.expected_tokens_per_step == pytest.approx(1 + r_all)
    # the greedy self-draft is accepted far more often than n-gram: the test has the power to tell methods apart
    assert first[0] > 0.2 and first[0] > 3 * first[1]


def test_a_greedy_run_is_the_limit_of_sampling():
    """At a temperature near 0 the sampled path is the greedy path and the expected acceptance the greedy count."""
    from transformers import AutoModelForCausalLM

    from specfmt.methods import resolve
    from specfmt.validation.acceptance import run_chain
    from specfmt.validation.sampling import run_sampled

    model = AutoModelForCausalLM.from_pretrained(str(WORLD / "verifier"), dtype=torch.float32).eval()
    prompt = [[0, 5, 9, 300, 41, 5, 9, 300]]
    m = resolve("ngram")
    p = m.proposer(m.readings(None)[0], None)
    with torch.no_grad():
        greedy = run_chain(model, prompt, p, 3, 16)
        cold = run_sampled(model, prompt, [p], 3, 16, 1e-4, [0])[0]
    assert cold.chain.token_ids == greedy.token_ids
    assert cold.expected_accepted_per_position == pytest.approx(greedy.accepted_per_position, abs=1e-3)


def test_ratio_standard_error_by_hand():
    from specfmt.validation.sampling import ratio_and_se

    r, se = ratio_and_se([2, 4, 0], [4, 4, 2])
    assert r == pytest.approx(0.6)
    # residuals a - r s: -0.4, 1.6, -1.2; sum of squares 4.16; n/(n-1) = 1.5; sqrt(6.24) / 10
    assert se == pytest.approx(6.24 ** 0.5 / 10)
    assert ratio_and_se([1], [3]) == (pytest.approx(1 / 3), float("inf"))


def test_vllm_runs_are_read_from_each_steps_tokens():
    from specfmt.validation.sampling import vllm_runs
    from specfmt.validation.vllm_run import VLLMRun

    run = VLLMRun(token_ids=[], texts=[], step_tokens=[[1, 4, 1, 2, 3], [1, 1]])
    assert vllm_runs(run, 3) == [{"steps": 4, "accepted": [3, 2, 1]}, {"steps": 1, "accepted": [0, 0, 0]}]
    assert run.steps == 5


def test_speedup_against_a_hand_computation():
    """The world's EAGLE-3 draft as compare measured it: 2.2217 tokens per verifier pass, a chain of k = 3 passes of a
    draft reading 410,112 parameters against the verifier's 1,837,184. By hand: c = 410112 / 1837184 = 0.223229;
    one step costs 1 + 3 x 0.223229 = 1.669686 verifier passes; 2.2217 / 1.669686 = 1.330610. A parallel draft (Medusa
    heads, 835,968 parameters, 1.4538 tokens per pass) pays one pass: 1.4538 / (1 + 0.455027) = 0.999156."""
    from specfmt.methods.base import Cost
    from specfmt.validation.speedup import estimated_speedup, leviathan_speedup

    assert estimated_speedup(2.2217, Cost(410112, 1837184, False), 3) == pytest.approx(1.330610, abs=1e-6)
    assert estimated_speedup(1.4538, Cost(835968, 1837184, True), 3) == pytest.approx(0.999156, abs=1e-6)
    assert estimated_speedup(1.30, Cost(0, 1837184, True), 3) == pytest.approx(1.30)  # n-gram: free
    # the paper's closed form is the same formula with tau = (1 - a^(k+1)) / (1 - a): a = 0.8, k = 4, c = 0.05
    tau = (1 - 0.8 ** 5) / (1 - 0.8)
    assert leviathan_speedup(0.8, 4, 0.05) == pytest.approx(tau / 1.2) == pytest.approx(estimated_speedup(tau, Cost(5, 100, False), 4))
    assert leviathan_speedup(1.0, 3, 0.0) == 4.0
