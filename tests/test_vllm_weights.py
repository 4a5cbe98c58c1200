"""`validate --run`'s ``vllm_weights`` check, fed dumps built by hand (no engine): what vLLM holds is compared
with the file element by element. A transposed square block or k and v swapped inside ``qkv_proj`` keep every
shape, sum and absolute sum (what the check compared before), and fail now."""

from __future__ import annotations

import pytest
import torch

from specfmt.algorithms import get
from specfmt.validation.weights import file_names, vllm_weight_mismatches

H, KV, V, VD = 32, 16, 70, 40


def _randn(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 0.05


@pytest.fixture()
def medusa():
    """A Medusa file (float32) and what vLLM's CPU build holds for it in bfloat16: blocks as plain parameters,
    the heads as parameters and applied (names as vLLM 0.32 dumps them)."""
    file = {}
    for i in range(2):
        file[f"blocks.{i}.layers.0.weight"] = _randn(H, H, seed=i)
        file[f"blocks.{i}.layers.0.bias"] = _randn(H, seed=10 + i)
        file[f"lm_heads.{i}.weight"] = _randn(V, H, seed=20 + i)
    held = {n: t.to(torch.bfloat16) for n, t in file.items()}
    held.update({f"lm_heads.{i}.applied": file[f"lm_heads.{i}.weight"].to(torch.bfloat16) for i in range(2)})
    return file, held


@pytest.fixture()
def eagle3():
    """An EAGLE-3 file (float16) and what vLLM's CPU build holds: repacked linear layers read as ``.applied``,
    merged qkv and gate_up, ``d2t`` as ``draft_id_to_target_id``, the embedding shared with the verifier."""
    f = {"fc.weight": _randn(H, 3 * H, seed=1), "lm_head.weight": _randn(VD, H, seed=2), "norm.weight": 1 + _randn(H, seed=3),
         "layers.0.hidden_norm.weight": 1 + _randn(H, seed=4), "layers.0.input_layernorm.weight": 1 + _randn(H, seed=5),
         "layers.0.post_attention_layernorm.weight": 1 + _randn(H, seed=6),
         "layers.0.self_attn.q_proj.weight": _randn(H, 2 * H, seed=7), "layers.0.self_attn.k_proj.weight": _randn(KV, 2 * H, seed=8),
         "layers.0.self_attn.v_proj.weight": _randn(KV, 2 * H, seed=9), "layers.0.self_attn.o_proj.weight": _randn(H, H, seed=10),
         "layers.0.mlp.gate_proj.weight": _randn(48, H, seed=11), "layers.0.mlp.up_proj.weight": _randn(48, H, seed=12),
         "layers.0.mlp.down_proj.weight": _randn(H, 48, seed=13)}
    file = {n: t.half() for n, t in f.items()}
    file["d2t"] = torch.randint(0, 20, (VD,), generator=torch.Generator().manual_seed(14))
    file["t2d"] = torch.zeros(V, dtype=torch.bool)
    bf = {n: t.to(torch.bfloat16) for n, t in file.items() if t.is_floating_point()}
    a = "model.layers.0."
    held = {"model.fc.applied": bf["fc.weight"], "lm_head.weight": bf["lm_head.weight"], "lm_head.applied": bf["lm_head.weight"],
            "model.norm.weight": bf["norm.weight"], f"{a}hidden_norm.weight": bf["layers.0.hidden_norm.weight"],
            f"{a}input_layernorm.weight": bf["layers.0.input_layernorm.weight"],
            f"{a}post_attention_layernorm.weight": bf["layers.0.post_attention_layernorm.weight"],
            f"{a}self_attn.qkv_proj.applied": torch.cat([bf[f"layers.0.self_attn.{p}_proj.weight"] for p in "qkv"]),
            f"{a}self_attn.o_proj.applied": bf["layers.0.self_attn.o_proj.weight"],
            f"{a}mlp.gate_up_proj.applied": torch.cat([bf["layers.0.mlp.gate_proj.weight"], bf["layers.0.mlp.up_proj.weight"]]),
            f"{a}mlp.down_proj.applied": bf["layers.0.mlp.down_proj.weight"], "draft_id_to_target_id": file["d2t"].clone()}
    embed = _randn(V, H, seed=15)  # the verifier's, float32 in its file
    held["model.embed_tokens.weight"] = held["model.embed_tokens.applied"] = embed.to(torch.bfloat16)
    return file, held, embed


def _check(file, held, embed=None, shares=None):
    algo = get("eagle3")
    return vllm_weight_mismatches(held, file, shares=shares or {}, verifier=(lambda m: {"embed_tokens": embed}[m]),
                                  aliases=algo.vllm_aliases, not_held=algo.vllm_not_held)


def _sums(held: dict) -> dict:
    """What the check compared before: per tensor, its shape, sum and absolute sum."""
    return {n: (list(t.shape), float(t.double().sum()), float(t.double().abs().sum())) for n, t in held.items()}


def test_a_transposed_medusa_block_keeps_its_sums_and_fails(medusa):
    file, held = medusa
    ok = vllm_weight_mismatches(held, file)
    assert ok.ok and ok.held == 8 and ok.file_tensors == 6 and ok.dtype == "bfloat16", ok.problems
    bad = dict(held, **{"blocks.1.layers.0.weight": held["blocks.1.layers.0.weight"].T.contiguous()})
    assert _sums(bad) == _sums(held)  # square: shape, sum and |sum| are the block's own
    found = vllm_weight_mismatches(bad, file).problems
    assert len(found) == 1 and found[0].startswith("blocks.1.layers.0.weight: ") and "differ from the file's rounded to bfloat16" in found[0]


def test_k_and_v_swapped_inside_qkv_keep_their_sums_and_fail(eagle3):
    file, held, embed = eagle3
    shares = {"embed_tokens": True, "lm_head": False}
    ok = _check(file, held, embed, shares)
    assert ok.ok, ok.problems
    assert ok.shared == ["embed_tokens"] and ok.file_tensors == len(file) - 1  # every file tensor held but t2d
    name = "model.layers.0.self_attn.qkv_proj.applied"
    q, k, v = held[name].split([H, KV, KV])
    bad = dict(held, **{name: torch.cat([q, v, k])})
    assert _sums(bad) == _sums(held)
    found = _check(file, bad, embed, shares).problems
    assert [f.split(" (rows")[0] for f in found] == ["layers.0.self_attn.k_proj.weight", "layers.0.self_attn.v_proj.weight"], found
    assert f"(rows {H}-{H + KV - 1} of vLLM's {name})" in found[0]


def test_the_rule_is_one_rounding_to_the_served_dtype(eagle3):
    """Exact after rounding: the file's float16 rounded to bfloat16 is what vLLM holds, bit for bit; one unit in the
    last place anywhere fails, and so does the unrounded value."""
    file, held, embed = eagle3
    shares = {"embed_tokens": True}
    w = held["model.norm.weight"].clone()
    w[3] = torch.nextafter(w[3:4], torch.tensor([9.0], dtype=w.dtype))[0]
    found = _check(file, dict(held, **{"model.norm.weight": w}), embed, shares).problems
    assert found == ["norm.weight: 1 of 32 elements differ from the file's rounded to bfloat16 (max |diff| 0.00781) (vLLM's model.norm.weight)"]
    # held in float32 (a float32 serving): the float16 file's values exactly, not their bfloat16 rounding
    wide = dict(held, **{"model.fc.applied": file["fc.weight"].float()})
    assert _check(file, wide, embed, shares).ok
    assert not _check(file, dict(held, **{"model.fc.applied": file["fc.weight"].to(torch.bfloat16).float()}), embed, shares).ok


def test_shared_modules_are_the_verifiers_and_the_files_copy_must_be_too(eagle3):
    file, held, embed = eagle3
    other = embed.clone()
    other[0, 0] += 1
    found = _check(file, held, other, {"embed_tokens": True}).problems
    assert found and all("vLLM shares the verifier's embed_tokens, but holds other values" in f for f in found)
    # the file's own copy of a module vLLM shares is compared with the verifier's
    mine = dict(file, **{"embed_tokens.weight": other})
    found = _check(mine, held, embed, {"embed_tokens": True}).problems
    assert found == ["embed_tokens.weight: vLLM uses the verifier's embed_tokens in its place, and the file's differs: 1 of 2240 "
                     "elements differ from the file's rounded to bfloat16 (max |diff| 0.999)"]
    assert _check(dict(file, **{"embed_tokens.weight": embed}), held, embed, {"embed_tokens": True}).ok
    # not shared: the embedding is the draft's own, and the file has none
    found = _check(file, held, embed, {"embed_tokens": False}).problems
    assert found == ["embed_tokens.weight: not in the file; vLLM keeps its initial value"]


def test_missing_unheld_and_padded_tensors(eagle3):
    file, held, embed = eagle3
    shares = {"embed_tokens": True}
    gone = {n: t for n, t in file.items() if n != "layers.0.self_attn.v_proj.weight"}
    assert _check(gone, held, embed, shares).problems == ["layers.0.self_attn.v_proj.weight: not in the file; vLLM keeps its initial value"]
    # a file tensor vLLM holds no copy of fails, except what the algorithm says vLLM does not keep (t2d)
    unheld = {n: t for n, t in held.items() if not n.startswith("model.norm")}
    assert _check(file, unheld, embed, shares).problems == ["norm.weight: in the file, but vLLM holds no copy of it"]
    assert "t2d" in get("eagle3").vllm_not_held and "t2d" not in {n for h in held for n in file_names(h, get("eagle3").vllm_aliases)[1]}
    # vLLM pads a head's rows to a multiple of 64 with zeros: the file's rows, then zeros
    pad = torch.cat([held["lm_head.weight"], torch.zeros(64 - VD, H, dtype=torch.bfloat16)])
    assert _check(file, dict(held, **{"lm_head.weight": pad}), embed, shares).ok
    pad[-1, 0] = 1
    assert _check(file, dict(held, **{"lm_head.weight": pad}), embed, shares).problems == [f"lm_head.weight: vLLM's padding rows {VD}-63 are not zero"]
    # d2t is compared as integers: an offset off by one fails
    d2t = held["draft_id_to_target_id"].clone()
    d2t[5] += 1
    assert _check(file, dict(held, **{"draft_id_to_target_id": d2t}), embed, shares).problems == \
        ["d2t: 1 of 40 elements differ from the file's (max |diff| 1) (vLLM's draft_id_to_target_id)"]


def test_the_dump_is_read_from_the_engines_file(medusa, tmp_path):
    from safetensors.torch import save_file

    file, held = medusa
    save_file(held, tmp_path / "held.safetensors")
    assert vllm_weight_mismatches(tmp_path / "held.safetensors", file).ok
    save_file(dict(held, **{"blocks.0.layers.0.bias": -held["blocks.0.layers.0.bias"]}), tmp_path / "bad.safetensors")
    assert [f.split(":")[0] for f in vllm_weight_mismatches(str(tmp_path / "bad.safetensors"), file).problems] == ["blocks.0.layers.0.bias"]


def test_a_multi_layer_eagle3_draft_is_not_failed_for_the_hidden_norms_vllm_never_reads():
    """Issue 38: vLLM 0.30-0.33 give every EAGLE-3 draft layer a ``hidden_norm`` and read only the first layer's
    (``llama_eagle3.py``); a 2-layer draft served right (vLLM AL 2.70 against the reference's 2.66, tokens equal the
    verifier's) failed ``vllm_weights`` with "layers.1.hidden_norm.weight: not in the file". The first layer's is compared
    as before."""
    n0, n1 = torch.randn(4), torch.randn(4)
    file = {"layers.0.hidden_norm.weight": n0}
    held = {"model.layers.0.hidden_norm.weight": n0.clone(), "model.layers.1.hidden_norm.weight": torch.ones(4),
            "model.layers.12.hidden_norm.weight": torch.ones(4)}
    only = get("eagle3").vllm_only
    assert vllm_weight_mismatches(held, file, vllm_only=only).problems == []
    assert vllm_weight_mismatches(held, file).problems == ["layers.1.hidden_norm.weight: not in the file; vLLM keeps its initial value",
                                                          "layers.12.hidden_norm.weight: not in the file; vLLM keeps its initial value"]
    held["model.layers.0.hidden_norm.weight"] = n1  # the first layer's is still compared
    assert len(vllm_weight_mismatches(held, file, vllm_only=only).problems) == 1
