"""Converted Medusa heads load in a real vLLM engine exactly as `vllm serve OUT` would.

Two conversions for the shipped example verifier (H=128, V=2048): v0.1 heads (own
per-head lm_heads, biases, a config understating the heads) and version-2 heads (the
verifier's lm_head copied in, ``original_lm_head``). No speculative config is given:
vLLM must find the heads, the verifier and the method in OUT/config.json alone. The
heads are random, so acceptance is not asserted; greedy output must equal the verifier
alone (speculative decoding is exact), the counters must show drafts from every head, and
vLLM's Medusa module must hold every converted tensor -- biases included, which vLLM
silently drops without ``medusa_fc_bias`` (probed inside vLLM's worker).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from builders_medusa import write_v01, write_v2
from conftest import E2E_TOKENS, WORLD, assert_served, renamed, research_tensors
from safetensors.torch import load_file

from specfmt.convert import convert
from specfmt.validation.vllm_run import generate

pytestmark = pytest.mark.vllm  # needs vLLM installed: conftest fails these tests when it is not

SIZES = {"hidden": 128, "vocab": 2048, "dtype": torch.float32}  # examples/world/verifier/config.json


#: the reference ``medusa_head`` names -> specfmt's (vLLM's ``Medusa``): ``{i}.{j}.linear`` is block j of head i, the
#: head's last module its own lm_head (version 1)
MEDUSA_NAMES = [(r"(\d+)\.(\d+)\.linear\.(weight|bias)", r"blocks.\1.layers.\2.\3"), (r"(\d+)\.\d+\.weight", r"lm_heads.\1.weight")]


def _served_exactly(out: Path, prompts, alone, source: dict) -> None:
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["num_heads"] == cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"]
    held = out.parent / f"{out.name}.held.safetensors"
    run = assert_served(generate(str(out), prompts, max_tokens=E2E_TOKENS, dump_draft=str(held)), alone, out, "medusa", E2E_TOKENS, held,
                        source=source)
    assert run.draft_class == "Medusa"
    # vLLM's Medusa parameters are named as the converted tensors, biases included, and hold their values element by
    # element, rounded to the dtype vLLM serves in (bfloat16 for this float32 verifier on vLLM's CPU build): assert_served
    ours = load_file(str(out / "model.safetensors"))
    assert set(run.draft_parameters) == set(ours)
    assert set(ours) <= set(load_file(str(held)))
    for name, t in ours.items():
        assert run.draft_parameters[name] == list(t.shape), name


def test_v01_heads_are_served_by_vllm_with_no_speculative_config(tmp_path, world_prompts, verifier_alone):
    src = write_v01(tmp_path / "v01", config_heads=2, heads=3, seed=1, **SIZES)
    out = tmp_path / "v01-specfmt"
    convert("medusa", str(src), out, str(WORLD / "verifier"))
    _served_exactly(out, world_prompts, verifier_alone, renamed(research_tensors(src), MEDUSA_NAMES))


def test_v2_heads_are_served_with_the_verifiers_lm_head(tmp_path, world_prompts, verifier_alone):
    src = write_v2(tmp_path / "v2", heads=2, layers=2, seed=2, **SIZES)
    out = tmp_path / "v2-specfmt"
    convert("medusa", str(src), out, str(WORLD / "verifier"))
    assert json.loads((out / "config.json").read_text())["original_lm_head"] is True
    lm_head = load_file(str(WORLD / "verifier" / "model.safetensors"))["lm_head.weight"]
    _served_exactly(out, world_prompts, verifier_alone, {**renamed(research_tensors(src), MEDUSA_NAMES), "lm_head.weight": lm_head})
