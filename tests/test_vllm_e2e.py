"""The converted example loads in a real vLLM engine exactly as `vllm serve OUT` would.

No speculative config is given: vLLM must find the draft, its verifier and the
proposal method in OUT/config.json alone. Greedy output with the draft attached
must equal the verifier alone, and the spec-decode counters must show drafts.
"""

from __future__ import annotations

import json

import pytest

from conftest import REPO
from specfmt.convert import convert
from specfmt.vllm_run import generate, vllm_available

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed")]

WORLD = REPO / "examples" / "world"


def test_converted_example_is_served_by_vllm_with_no_speculative_config(tmp_path):
    out = tmp_path / "eagle3-specfmt"
    convert("eagle3", str(WORLD / "eagle3-safeailab"), out, str(WORLD / "verifier"))
    prompts = [json.loads(line)["prompt"] for line in (WORLD / "prompts.jsonl").read_text().splitlines()[:4]]

    with_draft = generate(str(out), prompts, max_tokens=24)
    alone = generate(str(WORLD / "verifier"), prompts, max_tokens=24)

    assert with_draft.speculative_method == "eagle3"
    assert alone.speculative_method is None and alone.num_drafts == 0
    assert with_draft.token_ids == alone.token_ids  # speculative decoding is exact
    assert all(len(t) == 24 for t in with_draft.token_ids)
    k = json.loads((out / "config.json").read_text())["speculators_config"]["proposal_methods"][0]["speculative_tokens"]
    assert with_draft.num_drafts > 0
    assert with_draft.num_draft_tokens == k * with_draft.num_drafts
    assert len(with_draft.accepted_per_position) == k
