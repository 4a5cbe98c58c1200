"""Converted checkpoints load in a real vLLM engine exactly as `vllm serve OUT` would.

No speculative config is given: vLLM must find the draft, its verifier and the
proposal method in OUT/config.json alone. Greedy output with the draft attached
must equal the verifier alone, the spec-decode counters must show drafts, and the
draft module vLLM built must hold the converted tensors (probed inside vLLM's worker).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from builders import write_eagle1
from conftest import E2E_TOKENS, WORLD, assert_served, renamed, research_tensors
from specfmt.convert import convert
from specfmt.validation.vllm_run import generate

pytestmark = pytest.mark.vllm  # needs vLLM installed: conftest fails these tests when it is not


def _served(out: Path, prompts, alone, method: str, source: dict):
    """``vllm serve OUT`` served the draft exactly (``assert_served``: tokens, drafts, every weight vLLM holds equal to
    the file's element by element, and the file's to ``source``, the research tensors under their specfmt names)."""
    held = out.parent / f"{out.name}.held.safetensors"
    return assert_served(generate(str(out), prompts, max_tokens=E2E_TOKENS, dump_draft=str(held)), alone, out, method, E2E_TOKENS, held,
                         source=source)


def _eagle1_source(src: Path) -> dict:
    """An EAGLE-1 source's tensors under specfmt's names, ``fc.bias`` folded as the draft computes with it: layer 0 has no
    input norm, so ``W_{q,k,v}·(fc(u) + b) = W_{q,k,v}·fc(u) + W_{q,k,v}·b`` and the residual's ``b`` joins o_proj's output."""
    sd = research_tensors(src)
    b = sd.pop("fc.bias", None)
    if b is not None:
        for x in "qkv":
            w = sd[f"layers.0.self_attn.{x}_proj.weight"]
            sd[f"layers.0.self_attn.{x}_proj.bias"] = (w.double() @ b.double()).to(w.dtype)
        sd["layers.0.self_attn.o_proj.bias"] = b
    return sd


def _held(out: Path) -> dict[str, torch.Tensor]:
    """The draft's tensors as vLLM held them (written by ``_served``)."""
    from safetensors.torch import load_file

    return load_file(str(out.parent / f"{out.name}.held.safetensors"))


def _tensor(folder: Path, name: str) -> torch.Tensor:
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        return f.get_tensor(name)


def test_eagle3_example_is_served(tmp_path, world_prompts, verifier_alone):
    out = tmp_path / "eagle3-specfmt"
    convert("eagle3", str(WORLD / "eagle3-safeailab"), out, str(WORLD / "verifier"))
    source = renamed(research_tensors(WORLD / "eagle3-safeailab"), [(r"midlayer\.(.+)", r"layers.0.\1")])
    run = _served(out, world_prompts, verifier_alone, "eagle3", source)
    assert run.draft_class == "Eagle3LlamaForCausalLM"


def _eagle1_for_world(folder: Path, *, embed: torch.Tensor | None = None) -> Path:
    src = write_eagle1(folder, hidden=128, vocab=2048, inter=384, heads=4, kv_heads=2, dtype=torch.float32, seed=3)
    if embed is not None:
        sd = torch.load(src / "pytorch_model.bin", weights_only=True)
        sd["embed_tokens.weight"] = embed
        torch.save(sd, src / "pytorch_model.bin")
    return src


def test_eagle1_with_fc_bias_is_served_with_the_folded_biases(tmp_path, world_prompts, verifier_alone):
    """vLLM builds q/k/v and o_proj biases for attention_bias and loads the folded values;
    the draft's own (distinct) embed_tokens copy is the one vLLM uses."""
    src = _eagle1_for_world(tmp_path / "src")
    out = tmp_path / "eagle1-specfmt"
    convert("eagle", str(src), out, str(WORLD / "verifier"))
    run = _served(out, world_prompts, verifier_alone, "eagle", _eagle1_source(src))
    assert run.draft_class == "EagleLlamaForCausalLM"
    held = _held(out)
    qkv = torch.cat([_tensor(out, f"layers.0.self_attn.{x}_proj.bias") for x in "qkv"])
    assert torch.equal(held["model.layers.0.self_attn.qkv_proj.bias"], qkv.to(held["model.layers.0.self_attn.qkv_proj.bias"].dtype))
    o = _tensor(out, "layers.0.self_attn.o_proj.bias")
    assert torch.equal(held["model.layers.0.self_attn.o_proj.bias"], o.to(held["model.layers.0.self_attn.o_proj.bias"].dtype))
    assert "model.fc.bias" not in run.draft_parameters
    assert run.draft_shares == {"embed_tokens": False, "lm_head": True}
    emb = _tensor(out, "embed_tokens.weight")
    assert torch.equal(held["model.embed_tokens.weight"], emb.to(held["model.embed_tokens.weight"].dtype))


def test_eagle1_embed_copy_equal_to_the_verifiers_is_shared(tmp_path, world_prompts, verifier_alone):
    with safe_open(str(WORLD / "verifier" / "model.safetensors"), framework="pt") as f:
        emb = f.get_tensor("model.embed_tokens.weight")
    src = _eagle1_for_world(tmp_path / "src", embed=emb.to(torch.float32))
    out = tmp_path / "eagle1-specfmt"
    convert("eagle", str(src), out, str(WORLD / "verifier"))
    run = _served(out, world_prompts, verifier_alone, "eagle", _eagle1_source(src))
    assert run.draft_shares["embed_tokens"] is True


def test_upgraded_speculators_trainer_eagle3_is_served(tmp_path, world_prompts, verifier_alone):
    """speculators 0.8 trainer style: 4 taps, norm_before_fc, norm_output, its own embedding."""
    from builders import write_speculators_eagle3

    src = write_speculators_eagle3(tmp_path / "src", str((WORLD / "verifier").resolve()), style="trainer-0.8", hidden=128, vocab=2048, draft_vocab=1024, inter=384, heads=4, kv_heads=2)
    out = tmp_path / "upgraded"
    convert("speculators", str(src), out, str(WORLD / "verifier"))
    run = _served(out, world_prompts, verifier_alone, "eagle3", research_tensors(src))  # speculators names are specfmt's
    assert run.draft_linear_shapes["model.fc"] == [128, 4 * 128]  # fc sized for the 4 taps
    assert run.draft_shares["embed_tokens"] is False


def test_upgraded_speculators_eagle1_without_bias_is_served(tmp_path, world_prompts, verifier_alone):
    from builders import write_speculators_eagle

    src = write_speculators_eagle(tmp_path / "src", str((WORLD / "verifier").resolve()), fusion_bias=False, hidden=128, vocab=2048, inter=384, heads=4, kv_heads=2)
    out = tmp_path / "upgraded"
    convert("speculators", str(src), out, str(WORLD / "verifier"))
    run = _served(out, world_prompts, verifier_alone, "eagle", renamed(research_tensors(src), [(r"fusion_fc\.(.+)", r"fc.\1"), (r"transformer\.(.+)", r"layers.0.\1")]))
    assert not any(n.endswith(".bias") for n in run.draft_parameters)
    assert run.draft_shares == {"embed_tokens": True, "lm_head": True}  # no copy in the file: the verifier's
