"""n-gram and suffix decoding as proposal methods (issue 37): their reference proposers against vLLM's own proposer
classes, driven as vLLM's model runner drives them, and their figures counted per verifier pass over every step.
No engine starts here (tests/test_vllm_compare.py runs them in vLLM)."""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pytest

from arctic_env import arctic  # noqa: F401  (fixture)
from conftest import WORLD


def _fake_config(k: int, **spec):
    """What vLLM's NgramProposer and SuffixDecodingProposer read of a VllmConfig, and nothing else."""
    return SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=k, **spec),
                           model_config=SimpleNamespace(max_model_len=4096), scheduler_config=SimpleNamespace(max_num_seqs=8),
                           parallel_config=SimpleNamespace(tensor_parallel_size=1))


class _Batch:
    """The part of vLLM's InputBatch the suffix proposer reads: request ids, prompt lengths and the tokens so far."""

    def __init__(self, prompts: list[list[int]]):
        self.req_ids = [f"r{i}" for i in range(len(prompts))]
        self.req_id_to_index = {r: i for i, r in enumerate(self.req_ids)}
        self.num_prompt_tokens = np.array([len(p) for p in prompts])
        self.token_ids_cpu = np.zeros((len(prompts), 4096), dtype=np.int32)
        self.num_tokens_no_spec = np.array([len(p) for p in prompts])
        for i, p in enumerate(prompts):
            self.token_ids_cpu[i, :len(p)] = p

    def append(self, i: int, tokens: list[int]) -> None:
        n = self.num_tokens_no_spec[i]
        self.token_ids_cpu[i, n:n + len(tokens)] = tokens
        self.num_tokens_no_spec[i] = n + len(tokens)


def _sequences(rng: random.Random, n: int, alphabet: int, length: int) -> list[list[int]]:
    """Token streams with repeats (a small alphabet, and copied spans), where lookups find matches and ties."""
    out = []
    for _ in range(n):
        seq = [rng.randrange(alphabet) for _ in range(rng.randint(4, 12))]
        while len(seq) < length:
            if rng.random() < 0.5 and len(seq) > 4:
                s = rng.randrange(len(seq) - 3)
                seq += seq[s:s + rng.randint(2, 6)]
            else:
                seq.append(rng.randrange(alphabet))
        out.append(seq[:length])
    return out


def _lockstep(prompts, streams, propose_vllm, propose_ours, k, rng):
    """Advance every sequence side by side as vLLM's batch does: each round, each sequence gets 1 to k + 1 new tokens
    from its stream (what a verification step yields), then both proposers are asked; returns the proposals compared."""
    batch = _Batch(prompts)
    ours_tokens = [list(p) for p in prompts]
    states = [SimpleNamespace(source=1000 + i) for i in range(len(prompts))]
    pos = [0] * len(prompts)
    compared = nonempty = 0
    for step in range(12):
        sampled = []
        for i in range(len(prompts)):
            n = 1 if step == 0 else rng.randint(1, k + 1)  # the prefill yields one token, a verification step 1 to k + 1
            new = streams[i][pos[i]:pos[i] + n]
            pos[i] += n
            batch.append(i, new)
            ours_tokens[i] += new
            sampled.append(new)
        want = propose_vllm(batch, sampled)
        for i in range(len(prompts)):
            got = propose_ours(ours_tokens[i], states[i], k)
            assert got == [int(t) for t in want[i]], (i, ours_tokens[i][-12:], got, want[i])
            compared += 1
            nonempty += bool(got)
    return compared, nonempty


def test_ngram_reimplementation_is_vllms_lookup_on_random_sequences():
    """specfmt's re-implementation (used where vLLM does not import) returns what vLLM's numba function returns:
    longest match first, the earliest occurrence among equal ones, at most k tokens, none below prompt_lookup_min."""
    from specfmt.methods.ngram import longest_match_proposal, vllm_lookup

    found = vllm_lookup()
    assert found is not None and "ngram_proposer" in found[1]  # .ci/install installs vLLM: the reference is vLLM's code
    lookup = found[0]
    rng = random.Random(37)
    hits = 0
    for seq in _sequences(rng, 1500, 4, 40):
        cut = rng.randint(0, len(seq))
        mn = rng.randint(1, 3)
        mx = rng.randint(mn, 5)
        k = rng.randint(1, 5)
        want = lookup(seq[:cut], mn, mx, k)
        assert longest_match_proposal(seq[:cut], mn, mx, k) == want, (seq[:cut], mn, mx, k)
        hits += bool(want)
    assert hits > 500  # the sequences exercise matches, not only misses
    # the earliest occurrence wins among equally long matches (vLLM keeps the last reversed position, >=)
    assert longest_match_proposal([1, 2, 7, 1, 2, 8, 1, 2], 2, 4, 1) == [7] == lookup([1, 2, 7, 1, 2, 8, 1, 2], 2, 4, 1)


def test_ngram_proposer_is_vllms_proposer_class_step_by_step():
    """specfmt's NgramProposer, called per sequence as run_chains calls it, proposes what vLLM's NgramProposer.propose
    proposes for the batch (the class the engine builds, with a config reduced to what it reads)."""
    from vllm.v1.spec_decode.ngram_proposer import NgramProposer as VllmNgram

    from specfmt.methods import resolve

    k = 3
    method = resolve("ngram")
    theirs = VllmNgram(_fake_config(k, prompt_lookup_min=method.prompt_lookup_min, prompt_lookup_max=method.prompt_lookup_max))
    ours = method.proposer(method.readings(None)[0], None)
    rng = random.Random(5)
    streams = _sequences(rng, 6, 5, 80)
    prompts = [s[:10] for s in streams]
    streams = [s[10:] for s in streams]

    def vllm_side(batch, sampled):
        return theirs.propose(k, sampled, batch.num_tokens_no_spec.copy(), batch.token_ids_cpu)

    compared, nonempty = _lockstep(prompts, streams, vllm_side, ours, k, rng)
    assert compared == 72 and nonempty > 10


def test_suffix_proposer_is_vllms_proposer_class_step_by_step(arctic):
    """specfmt's SuffixProposer proposes what vLLM's SuffixDecodingProposer (over arctic-inference's SuffixDecodingCache)
    proposes, sequences advancing side by side: the prompt trees, the global tree of every request's output so far
    (concurrent requests see each other's tokens), the pattern of the last max_tree_depth tokens."""
    from vllm.v1.spec_decode.suffix_decoding import SuffixDecodingProposer

    from specfmt.methods import resolve

    k = 4
    method = resolve("suffix")
    assert method.runnable(method.static_checks(None)) is None
    spec = {key: v for key, v in method.method_config().items()}
    theirs = SuffixDecodingProposer(_fake_config(k, **spec))
    ours = method.proposer(method.readings(None)[0], None)
    rng = random.Random(11)
    streams = _sequences(rng, 5, 6, 80)
    prompts = [s[:12] for s in streams]
    streams = [s[12:] for s in streams]

    def vllm_side(batch, sampled):
        return theirs.propose(k, batch, sampled)

    compared, nonempty = _lockstep(prompts, streams, vllm_side, ours, k, rng)
    assert compared == 60 and nonempty > 10


def test_a_method_without_weights_is_named_by_its_builtin_name_and_served_on_the_verifier():
    from specfmt.methods import builtin_names, resolve
    from specfmt.serving import GPU_BUILD
    from specfmt.sources.verifier import Verifier

    assert {"ngram", "suffix"} <= set(builtin_names())
    ngram = resolve("ngram")
    run = ngram.vllm_engine(str(WORLD / "verifier"), "0.32.0", 3)
    assert run.model == str(WORLD / "verifier") and run.method == "ngram"
    assert run.speculative_config == {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    line = ngram.serve_command("0.32.0", verifier="org/verifier", distribution=GPU_BUILD)
    assert line.argv[:3] == ("vllm", "serve", "org/verifier") and '"method": "ngram"' in line.line
    ver = Verifier.load(str(WORLD / "verifier"))
    cost = ngram.cost(ver)
    assert cost.draft_parameters == 0 and cost.per_step(3) == 0.0 and cost.verifier_parameters > 1_000_000
    suffix = resolve("suffix").vllm_engine("V", None, 5).speculative_config
    assert suffix["method"] == "suffix" and suffix["suffix_decoding_max_tree_depth"] == 24 and suffix["num_speculative_tokens"] == 5


def test_suffix_decoding_without_arctic_inference_says_why_and_is_not_measured(monkeypatch):
    """On a machine without arctic-inference the method's one check fails with the reason and the fix, and validate
    --run / compare show that line instead of a number."""
    import builtins

    from specfmt.methods import resolve

    real = builtins.__import__

    def no_arctic(name, *a, **kw):
        if name.startswith("arctic_inference"):
            raise ModuleNotFoundError("No module named 'arctic_inference'")
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_arctic)
    m = resolve("suffix")
    rep = m.static_checks(None)
    why = m.runnable(rep)
    assert rep.check("method").status == "fail" and why and "arctic-inference==0.1.1" in why and "--no-build-isolation" in why


def test_ngram_reference_counts_every_verifier_pass():
    """On the world's prompts the n-gram reference drafts at some steps only: steps count every verifier pass, the
    tokens per pass divide by them, and the output is the verifier's greedy path."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specfmt.methods import resolve
    from specfmt.validation.acceptance import greedy_path, run_chain

    model = AutoModelForCausalLM.from_pretrained(str(WORLD / "verifier")).eval()
    tok = AutoTokenizer.from_pretrained(str(WORLD / "verifier"))
    import json

    prompts = [tok.encode(json.loads(line)["prompt"]) for line in (WORLD / "prompts.jsonl").read_text().splitlines()[:4]]
    m = resolve("ngram")
    with torch.no_grad():
        res = run_chain(model, prompts, m.proposer(m.readings(None)[0], None), 3, 24)
        paths = [greedy_path(model, p, 24)[0] for p in prompts]
    assert res.token_ids == paths
    assert 0 < res.num_drafts < res.steps  # some steps had no match
    assert res.num_draft_tokens <= 3 * res.num_drafts
    assert res.tokens_per_step == pytest.approx(1 + res.num_accepted_tokens / res.steps)
    assert res.tokens_per_step < res.mean_acceptance_length  # vLLM's per-drafted-step figure reads higher
    # every step yields 1 + accepted tokens: the prefill's token, then the steps (the last may overshoot max_tokens)
    assert res.steps + res.num_accepted_tokens + len(prompts) >= 24 * len(prompts)


def _chain(k: int, steps: int, accepted: list[int], drafts: int | None = None):
    from specfmt.validation.acceptance import ChainResult

    return ChainResult(k=k, steps=steps, num_drafts=steps if drafts is None else drafts, accepted_per_position=accepted,
                       num_accepted_tokens=sum(accepted))


def test_the_verdict_says_plainly_when_a_free_method_beats_the_draft():
    """By estimated speedup: a draft with more tokens per pass loses to n-gram when its drafting costs enough."""
    from specfmt.methods import resolve
    from specfmt.methods.base import Cost
    from specfmt.validation.beside import Companion, beside

    ngram, suffix = resolve("ngram"), resolve("suffix")
    free = [Companion(ngram, proposer=lambda t, s, k: [], cost=Cost(0, 1000, True)), Companion(suffix, why="arctic-inference is not importable")]
    draft = _chain(3, 100, [50, 20, 10])  # 1.8 tokens per pass
    ng = _chain(3, 120, [30, 20, 10], drafts=40)  # 1.5 tokens per pass, free
    out = beside(free, [ng], draft, Cost(200, 1000, False), 3, title="this EAGLE-3 draft")  # 1.8 / (1 + 3 x 0.2) = 1.125
    assert out["draft"]["tokens_per_step"] == 1.8 and out["draft"]["estimated_speedup"] == pytest.approx(1.125)
    row = out["methods"][0]
    assert row["tokens_per_step"] == 1.5 and row["estimated_speedup"] == 1.5 and row["drafted_steps"] == 40 and row["steps"] == 120
    assert out["methods"][1]["not_measured"] == "arctic-inference is not importable"
    assert out["verdict"][0].startswith("n-gram beats this EAGLE-3 draft on these prompts: estimated speedup 1.50x against 1.12x")
    assert out["verdict"][1] == "suffix decoding: not measured on this machine: arctic-inference is not importable"
    cheap = beside(free, [ng], draft, Cost(20, 1000, False), 3, title="this EAGLE-3 draft")  # 1.8 / 1.06 = 1.698
    assert cheap["verdict"][-1].startswith("this EAGLE-3 draft beats n-gram on these prompts: estimated speedup 1.70x against 1.50x")


def test_validate_run_shows_the_free_methods_beside_the_draft(tmp_path):
    """validate --run (reference only here) runs n-gram beside the world's EAGLE-3 draft on the same greedy paths, in the
    readings' pass; --no-free-methods turns it off."""
    import json as js

    from typer.testing import CliRunner

    from specfmt.cli import app
    from specfmt.convert import convert
    from specfmt.validation.run import validate_run

    out = tmp_path / "eagle3"
    convert("eagle3", str(WORLD / "eagle3-safeailab"), out, str(WORLD / "verifier"))
    few = tmp_path / "few.jsonl"
    few.write_text("\n".join((WORLD / "prompts.jsonl").read_text().splitlines()[:4]) + "\n")
    res = validate_run(out, prompts=str(few), max_tokens=24, use_vllm=False, write=False)
    b = res.to_json()["beside"]
    rows = {r["title"]: r for r in b["methods"]}
    assert set(rows) == {"n-gram", "suffix decoding"} and b["draft"]["steps"] == res.reference["num_drafts"]
    ng = rows["n-gram"]
    assert 0 < ng["drafted_steps"] < ng["steps"] and ng["tokens_per_step"] == pytest.approx(1 + sum(ng["rate_per_step"]), abs=2e-4)
    assert b["draft"]["cost"]["parallel"] is False and b["draft"]["estimated_speedup"] < b["draft"]["tokens_per_step"]
    assert any("n-gram" in line and "beats" in line for line in b["verdict"])
    r = CliRunner().invoke(app, ["validate", str(out), "--run", "--no-vllm", "--no-free-methods", "--prompts", str(few), "--max-tokens", "4",
                                 "--num-speculative-tokens", "1"])
    assert r.exit_code == 0, r.output
    assert "beside" not in js.loads((out / "validation.json").read_text()) and "beats" not in r.output
