"""The MoE world (``examples/world-moe``, issue 38): a small ``Qwen3MoeForCausalLM`` verifier and its EAGLE-3 draft.

* the world is what ``examples/make_world_moe.py`` says: a mixture-of-experts verifier within its size budget, a draft
  whose recorded ``validate --run`` (vLLM included) passed every check, clearly above a random draft;
* end to end, in one test marked ``vllm``: ``specfmt datagen`` with vLLM's CPU engine on the MoE verifier, ``specfmt train
  eagle3 --hidden-states`` from that output (the shipped draft trained further, a few steps), and ``specfmt validate --run``
  with the reference and vLLM: greedy output equal to the verifier alone, acceptance agreeing with the reference, clearly
  above the random draft.
"""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import pytest

from conftest import REPO, run_cli
from specfmt.validation import vllm_run
from specfmt.validation.run import validate_run

WORLD = REPO / "examples" / "world-moe"
MANIFEST = json.loads((WORLD / "world.json").read_text())
DRAFT = WORLD / "eagle3-specfmt"


def test_the_verifier_is_a_small_mixture_of_experts_and_the_draft_passed_validate_run_with_vllm():
    cfg = json.loads((WORLD / "verifier" / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3MoeForCausalLM"] and cfg["model_type"] == "qwen3_moe"
    assert (cfg["num_experts"], cfg["num_experts_per_tok"]) == (4, 2) and cfg["decoder_sparse_step"] == 1 and not cfg["mlp_only_layers"]
    assert sum(p.stat().st_size for p in WORLD.rglob("*") if p.is_file()) < 15e6  # the stated budget
    v = MANIFEST["draft"]["validation"]
    assert MANIFEST["draft"]["datagen"]["engine"] == "vllm"
    assert all(s == "pass" for n, s in v["checks"].items() if n not in ("acceptance",)), v["checks"]
    rnd = MANIFEST["draft"]["random_reference"]["mean_acceptance_length"]
    assert v["reference"]["mean_acceptance_length"] >= rnd + 0.5 and v["vllm"]["mean_acceptance_length"] >= rnd + 0.5


@pytest.mark.vllm
def test_datagen_train_validate_with_vllm_on_the_moe_verifier(tmp_path):
    """datagen (vLLM) -> train eagle3 (--init the shipped draft, --hidden-states, 4 steps) -> validate --run (vLLM)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    data = tmp_path / "data.jsonl"
    text = (stdlib / "argparse.py").read_text(encoding="utf-8")
    data.write_text("".join(json.dumps({"text": text[i * 1000:(i + 1) * 1000]}) + "\n" for i in range(4)))
    hs = tmp_path / "hs"
    r = run_cli("datagen", "-o", hs, "--verifier", WORLD / "verifier", "--data", data, "--engine", "vllm", "--seq-len", 256,
                "--dtype", "float32")
    assert r.returncode == 0, r.stderr[-3000:]
    manifest = json.loads((hs / "specfmt_datagen.json").read_text())
    assert manifest["engine"] == "vllm" and manifest["samples"] == 4
    out = tmp_path / "draft"
    r = run_cli("train", "eagle3", "-o", out, "--verifier", WORLD / "verifier", "--init", DRAFT, "--hidden-states", hs, "--steps", 4,
                "--batch-size", 4, "--seq-len", 256, "--lr", 1e-3, "--device", "cpu", "--no-validate")
    assert r.returncode == 0, r.stderr[-3000:]
    with vllm_run.engines():  # the suite's shared engine host when one is open
        res = validate_run(str(out), prompts=str(WORLD / "prompts.jsonl"), max_tokens=32, num_speculative_tokens=3, write=False)
    checks = {c.name: c.status for c in res.report.checks}
    assert res.report.ok and all(checks[n] == "pass" for n in ("reference", "vllm", "vllm_exact", "agreement", "vllm_weights")), checks
    gaps = [abs(a - b) for a, b in zip(res.reference["acceptance_rate_per_position"], res.vllm["acceptance_rate_per_position"])]
    assert max(gaps) <= 0.1
    rnd = MANIFEST["draft"]["random_reference"]["mean_acceptance_length"]
    assert res.vllm["mean_acceptance_length"] >= rnd + 0.5 and res.reference["mean_acceptance_length"] >= rnd + 0.5
