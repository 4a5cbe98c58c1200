"""Draft-model pairs in vLLM's CPU build (issue 36), lean: three engine starts in the session's engine host.

* the same-tokenizer pair (``draft-lm-padded`` after ``pad-vocab``) through ``validate --run`` (``run_method``: the pair
  and the verifier alone): vLLM's ``draft_model`` serves what it refused before the fix (the refusal itself is each
  release's own code in ``tests/test_vllm_matrix.py``), greedy output equal to the verifier alone, acceptance per position
  within the tolerance of the reference and of transformers;
* the own-BPE pair with ``use_heterogeneous_vocab`` (one engine, beside the session's ``verifier_alone``): it runs on the
  CPU build, its tokens equal the verifier alone, and its acceptance agrees with the reference, which maps tokens through
  the same token-level intersection.

The permuted pair's acceptance in vLLM, and every pair on the 16 prompts, are ``benchmarks/pairs_bench.py``'s.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import E2E_TOKENS, WORLD
from pairs import BPE, VERIFIER, fixed

pytestmark = pytest.mark.vllm


def test_the_fixed_pair_runs_in_every_engine_and_they_agree(tmp_path_factory):
    from specfmt.methods import resolve
    from specfmt.validation.method_run import run_method

    root = tmp_path_factory.mktemp("vllm-pairs")
    same = fixed(root)
    prompts = root / "prompts4.jsonl"
    prompts.write_text("".join(line + "\n" for line in (WORLD / "prompts.jsonl").read_text().splitlines()[:4]))
    res = run_method(resolve(str(same)), verifier=str(VERIFIER), prompts=str(prompts), max_tokens=E2E_TOKENS, write=False)
    got = {c.name: c for c in res.report.checks}
    failed = {n: c.summary for n, c in got.items() if c.status == "fail"}
    assert not failed, failed
    for name in ("vllm", "vllm_exact", "agreement", "transformers", "transformers_exact", "transformers_agreement"):
        assert got[name].status == "pass", (name, got[name].summary)
    assert res.vllm["method"] == "draft_model" and res.vllm["speculative_config"] == {"method": "draft_model", "model": str(same), "num_speculative_tokens": 3}
    assert res.vllm["num_drafts"] > 0 and res.vllm["acceptance_rate_per_position"][0] > 0.2  # measured 0.303; a draft of the wrong id space: about 0
    print(f"\nfixed pair, 4 prompts x {E2E_TOKENS}: reference {res.reference['acceptance_rate_per_position']}, vLLM {res.vllm['acceptance_rate_per_position']}, "
          f"transformers {res.transformers['acceptance_rate_per_position']}")


def test_the_bpe_pair_runs_with_the_token_level_intersection_on_the_cpu_build(world_prompts, verifier_alone):
    from transformers import AutoTokenizer

    from specfmt.methods import ReferenceContext, resolve
    from specfmt.sources.placement import Placement
    from specfmt.sources.verifier import Verifier
    from specfmt.validation.acceptance import run_chains
    from specfmt.validation.run import agreement_tolerance
    from specfmt.validation.vllm_run import generate

    ver = Verifier.load(str(VERIFIER))
    method = resolve(str(BPE))
    engine = method.vllm_engine(ver.name_or_path, None, 3)
    assert engine.speculative_config["use_heterogeneous_vocab"] is True
    run = generate(engine.model, world_prompts, max_tokens=E2E_TOKENS, speculative_config=engine.speculative_config)
    assert run.speculative_method == "draft_model" and run.num_drafts > 0
    assert run.token_ids == verifier_alone.token_ids  # lossless with two tokenizers too
    tok = AutoTokenizer.from_pretrained(VERIFIER)
    ids = [tok.encode(p) for p in world_prompts]  # as vLLM encodes a text prompt
    ctx = ReferenceContext(ver, ver.load_model(Placement()), Placement())
    ref = run_chains(ctx.model, ids, [method.proposer(method.readings(ctx)[0], ctx)], 3, E2E_TOKENS)[0]
    gaps = [abs(a / run.num_drafts - b / ref.num_drafts) for a, b in zip(run.accepted_per_position, ref.accepted_per_position)]
    print(f"\nBPE pair, 4 prompts x {E2E_TOKENS}: reference {[round(a / ref.num_drafts, 3) for a in ref.accepted_per_position]}, "
          f"vLLM {[round(a / run.num_drafts, 3) for a in run.accepted_per_position]}")
    assert max(gaps) <= agreement_tolerance(0.1, "float32", run.dtype), gaps
