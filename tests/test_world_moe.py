"""The MoE world (``examples/world-moe``, issue 38): a ``Qwen3MoeForCausalLM`` verifier (4 experts, 2 per token, in
every layer) and the EAGLE-3 draft specfmt made for it end to end, ``datagen`` with vLLM's CPU engine, ``train eagle3
--hidden-states`` and ``validate --run`` with vLLM (``examples/make_world_moe.py``, figures in its ``world.json``).

* the world is within its size budget and its verifier is a mixture of experts in every layer;
* the reference run of the shipped draft reproduces world.json, far above the same draft with random weights;
* the chain runs again here, on the command line at a test's budget: ``datagen --engine vllm`` over a few samples of the
  training files, ``train eagle3 --init`` the shipped draft ``--hidden-states`` for a few steps, ``validate --run`` with
  vLLM: greedy output equal to the verifier alone, vLLM's acceptance per position within 0.1 of the reference's, and
  clearly above a random draft.

That vLLM's MoE hidden states equal transformers' is ``test_datagen_vllm.py``'s (the world is one of its worlds).
"""

from __future__ import annotations

import json
import sys

import pytest
import torch
from safetensors.torch import load_file

from conftest import REPO, run_cli
from world_qwen3 import K, MAX_TOKENS, random_like, tensor_names

WORLD = REPO / "examples" / "world-moe"
MANIFEST = json.loads((WORLD / "world.json").read_text())
DRAFT = WORLD / "eagle3-specfmt"
#: the chain's budget: samples through vLLM, fine-tuning steps
SAMPLES, STEPS = 24, 8
FIGURES = ("num_drafts", "num_accepted_tokens", "acceptance_rate_per_position", "mean_acceptance_length")


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """The shipped draft as a user serves it: ``convert --from auto`` against the world's verifier where it lies."""
    out = tmp_path_factory.mktemp("moeworld") / "draft"
    r = run_cli("convert", "--from", "auto", DRAFT, "-o", out, "--verifier", WORLD / "verifier")
    assert r.returncode == 0, r.stderr
    return out


@pytest.fixture(scope="module")
def random_reference(converted, tmp_path_factory):
    """The reference AL of the converted draft with every tensor but ``d2t``/``t2d`` random (seed 0)."""
    rnd = random_like(converted, tmp_path_factory.mktemp("moerandom") / "draft", "eagle3", keep=("d2t", "t2d"))
    return _reference(rnd)["mean_acceptance_length"]


def _reference(folder) -> dict:
    from specfmt.validation.run import validate_run

    res = validate_run(folder, prompts=str(WORLD / "prompts.jsonl"), max_tokens=MAX_TOKENS, num_speculative_tokens=K, use_vllm=False, write=False)
    assert res.report.ok, res.report.to_json()
    return res.reference


def test_world_is_small_and_its_verifier_is_a_mixture_of_experts_in_every_layer():
    assert sum(p.stat().st_size for p in WORLD.rglob("*") if p.is_file()) < 15e6  # the Qwen3 world's budget
    cfg = json.loads((WORLD / "verifier" / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3MoeForCausalLM"] and cfg["num_local_experts"] == 4 and cfg["num_experts_per_tok"] == 2
    assert cfg["decoder_sparse_step"] == 1 and cfg["mlp_only_layers"] == []
    names = tensor_names(WORLD / "verifier" / "model.safetensors")
    n = cfg["num_hidden_layers"]
    assert {f"model.layers.{i}.mlp.gate.weight" for i in range(n)} <= names  # the router
    assert {f"model.layers.{i}.mlp.experts.{e}.{p}_proj.weight" for i in range(n) for e in range(4) for p in ("gate", "up", "down")} <= names
    assert not any(".mlp.gate_proj." in x for x in names)  # no dense MLP anywhere
    draft = json.loads((DRAFT / "config.json").read_text())
    assert draft["speculators_config"]["verifier"] == {"name_or_path": "../verifier", "architectures": ["Qwen3MoeForCausalLM"]}
    assert MANIFEST["draft"]["datagen"]["engine"] == "vllm" and draft["specfmt"]["train"]["steps"] == MANIFEST["draft"]["train"]["steps"]


def test_reference_figures_are_the_worlds_and_far_above_a_random_draft(converted, random_reference):
    got = _reference(converted)
    want = MANIFEST["draft"]["validation"]["reference"]
    assert {k: got[k] for k in FIGURES} == {k: want[k] for k in FIGURES}
    assert got["mean_acceptance_length"] >= 2.0 and random_reference <= 1.05
    assert MANIFEST["draft"]["validation"]["checks"]["vllm_exact"] == "pass"


@pytest.mark.vllm
def test_datagen_train_and_validate_run_with_vllm_on_the_moe_verifier(converted, random_reference, tmp_path):
    """The world's chain on the command line: vLLM extracts the MoE verifier's hidden states, specfmt trains on them, and
    ``validate --run`` serves the draft in vLLM beside the verifier alone."""
    sys.path.insert(0, str(REPO / "examples"))
    import make_world_moe as moe  # noqa: E402

    from specfmt.validation.run import validate_run

    train, _ = moe.mw.build_corpus()
    assert moe.chunks_file(train, tmp_path / "train.jsonl", SAMPLES) == SAMPLES
    hs, out = tmp_path / "hs", tmp_path / "draft"
    r = run_cli("datagen", "-o", hs, "--verifier", WORLD / "verifier", "--data", tmp_path / "train.jsonl", "--engine", "vllm",
                "--seq-len", moe.SEQ_LEN, "--dtype", "float32")
    assert r.returncode == 0, r.stderr[-3000:]
    made = json.loads((hs / "specfmt_datagen.json").read_text())
    assert made["engine"] == "vllm" and made["samples"] == SAMPLES and made["layers"] == [2, 4, 5, 8]
    r = run_cli("train", "eagle3", "-o", out, "--verifier", WORLD / "verifier", "--init", converted, "--hidden-states", hs,
                "--steps", STEPS, "--batch-size", 4, "--seq-len", moe.SEQ_LEN, "--lr", "1e-4", "--device", "cpu", "--no-validate")
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads((out / "config.json").read_text())["specfmt"]["train"]["steps"] == STEPS
    before, after = load_file(str(converted / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert sorted(before) == sorted(after) and not torch.equal(before["fc.weight"], after["fc.weight"])  # trained on vLLM's features
    res = validate_run(out, prompts=str(WORLD / "prompts.jsonl"), max_tokens=MAX_TOKENS, num_speculative_tokens=K, min_acceptance_length=1.8,
                       write=False, free_methods=False)
    st = {c.name: c.status for c in res.report.checks}
    assert res.report.ok, res.report.to_json()
    assert all(st[n] == "pass" for n in ("reference", "vllm", "vllm_exact", "vllm_weights", "agreement", "acceptance")), st
    ref, vl = res.reference, res.vllm
    assert vl["method"] == "eagle3" and vl["draft_class"] == "Eagle3LlamaForCausalLM"
    assert max(abs(a - b) for a, b in zip(ref["acceptance_rate_per_position"], vl["acceptance_rate_per_position"])) <= 0.1
    assert vl["mean_acceptance_length"] >= random_reference + 0.8
    print(f"\nMoE chain: reference {ref['mean_acceptance_length']} {ref['acceptance_rate_per_position']}; vLLM {vl['mean_acceptance_length']} "
          f"{vl['acceptance_rate_per_position']}; random draft (reference) {random_reference}")
