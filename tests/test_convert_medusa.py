"""`specfmt convert --from medusa`: every source layout, exactness, refusals, nothing written on error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from builders import write_verifier
from builders_medusa import (
    medusa_heads,
    write_full,
    write_legacy,
    write_v01,
    write_v2,
    write_verifier_weights,
)
from conftest import load_out, run_cli, tree_digest
from safetensors.torch import load_file, save_file
from specfmt.converters import Options

from specfmt.convert import convert
from specfmt.errors import ConversionError
from specfmt.validation.static import validate_static






def vllm_name(src_name: str) -> str:
    """The reference key -> vLLM's parameter name (docs/design/research-formats.md §5.4)."""
    parts = src_name.removeprefix("medusa_head.").split(".")
    if parts[2] == "linear":
        return f"blocks.{parts[0]}.layers.{parts[1]}.{parts[3]}"
    return f"lm_heads.{parts[0]}.weight"


def assert_heads_exact(source: dict[str, torch.Tensor], out: dict[str, torch.Tensor]) -> None:
    for k, t in source.items():
        o = out[vllm_name(k)]
        assert o.dtype == t.dtype and torch.equal(o, t), k


def assert_consistent(cfg: dict, out: dict[str, torch.Tensor], *, K: int, L: int, bias: bool, shared_head: bool) -> None:
    """The config describes what the tensors hold, at top level and in transformer_layer_config alike."""
    assert cfg["model_type"] == "medusa" and cfg["architectures"] == ["MedusaModel"]
    assert cfg["speculators_model_type"] == "medusa" and cfg["speculators_config"]["algorithm"] == "medusa"
    assert cfg["num_heads"] == K == cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"]
    assert cfg["num_hidden_layers"] == L and cfg["medusa_fc_bias"] is bias and cfg["original_lm_head"] is shared_head
    assert cfg["truncated_vocab_size"] == cfg["vocab_size"]
    for key, val in cfg["transformer_layer_config"].items():
        assert cfg[key] == val, key
    # vLLM's MedusaConfig renames any key holding "num" with "heads"/"layers"
    assert [k for k in cfg if "num" in k and ("heads" in k or "layers" in k)] == ["num_heads", "num_hidden_layers"]
    assert sum(n.startswith("blocks.") and n.endswith(".weight") for n in out) == K * L
    assert sum(n.startswith("lm_heads.") for n in out) == (0 if shared_head else K)
    assert ("lm_head.weight" in out) is shared_head


# --------------------------------------------------------------------------- layouts


def test_v01_pickle_converts_exactly_and_trusts_the_weights_over_the_config(tmp_path, verifier):
    src = write_v01(tmp_path / "src", config_heads=2, heads=5)
    before = tree_digest(src)
    res = convert("medusa", str(src), tmp_path / "out", str(verifier))
    cfg, out = load_out(tmp_path / "out")

    source = torch.load(src / "medusa_lm_head.pt", weights_only=True)
    assert set(out) == {vllm_name(k) for k in source}
    assert_heads_exact(source, out)
    assert tree_digest(src) == before
    assert_consistent(cfg, out, K=5, L=1, bias=True, shared_head=False)
    assert cfg["hidden_size"] == 64 and cfg["vocab_size"] == 256 and cfg["dtype"] == "bfloat16"
    assert any("medusa_num_heads=2" in n and "5 heads" in n for n in res.plan.notes)
    assert cfg["specfmt"]["source"]["layout"] == "v0.1"
    assert set(cfg["specfmt"]["source"]["files"]) == {"config.json", "medusa_lm_head.pt"}
    assert validate_static(tmp_path / "out").ok


@pytest.mark.parametrize("prefix", ["", "medusa_head."])
def test_legacy_trainer_safetensors_with_and_without_prefix(tmp_path, verifier, prefix):
    src = write_legacy(tmp_path / "src", heads=3, prefix=prefix, dtype=torch.float16)
    convert("medusa", str(src), tmp_path / "out", str(verifier))
    cfg, out = load_out(tmp_path / "out")
    assert_heads_exact(load_file(str(src / "medusa_lm_head.safetensors")), out)
    assert_consistent(cfg, out, K=3, L=1, bias=True, shared_head=False)
    assert cfg["dtype"] == "float16" and cfg["specfmt"]["source"]["layout"] == "legacy-trainer"
    assert validate_static(tmp_path / "out").ok


@pytest.mark.parametrize("shards", [1, 2])
def test_v2_heads_get_the_verifiers_lm_head_bit_for_bit(tmp_path, shards):
    verifier = write_verifier_weights(tmp_path / "verifier", shards=shards)
    src = write_v2(tmp_path / "src", heads=3, layers=1)
    v_before = tree_digest(verifier)
    convert("medusa", str(src), tmp_path / "out", str(verifier))
    cfg, out = load_out(tmp_path / "out")

    assert_heads_exact(load_file(str(src / "medusa_lm_head.safetensors")), out)
    assert_consistent(cfg, out, K=3, L=1, bias=True, shared_head=True)
    v_sd = {}
    for f in verifier.glob("*.safetensors"):
        v_sd.update(load_file(str(f)))
    assert out["lm_head.weight"].dtype == v_sd["lm_head.weight"].dtype
    assert torch.equal(out["lm_head.weight"], v_sd["lm_head.weight"])
    assert "lm_head.weight" in cfg["specfmt"]["tensors"]["derived"]
    assert cfg["specfmt"]["source"]["layout"] == "v2"
    assert tree_digest(verifier) == v_before
    assert validate_static(tmp_path / "out").ok


def test_v2_heads_with_a_sharded_hub_verifier_need_only_the_lm_head_shard(tmp_path):
    verifier = write_verifier_weights(tmp_path / "verifier", shards=2)
    index = json.loads((verifier / "model.safetensors.index.json").read_text())
    shard = index["weight_map"]["lm_head.weight"]
    # the Hub cache after `hf_hub_download` of config.json, the index and the one shard holding lm_head.weight
    sha = "0123456789abcdef0123456789abcdef01234567"
    root = tmp_path / "hub" / "models--acme--verifier"
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(sha)
    (root / "snapshots" / sha).mkdir(parents=True)
    for name in ("config.json", "model.safetensors.index.json", shard):
        (root / "snapshots" / sha / name).write_bytes((verifier / name).read_bytes())
    src = write_v2(tmp_path / "src")
    r = run_cli("convert", "--from", "medusa", str(src), "-o", str(tmp_path / "out"), "--verifier", "acme/verifier", env={"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub")})
    assert r.returncode == 0, r.stderr
    _, out = load_out(tmp_path / "out")
    assert torch.equal(out["lm_head.weight"], load_file(str(verifier / shard))["lm_head.weight"])


def test_v2_heads_with_tied_verifier_use_its_embedding(tmp_path):
    verifier = write_verifier_weights(tmp_path / "verifier", tied=True)
    src = write_v2(tmp_path / "src", heads=2, layers=2)
    convert("medusa", str(src), tmp_path / "out", str(verifier))
    cfg, out = load_out(tmp_path / "out")
    assert_consistent(cfg, out, K=2, L=2, bias=True, shared_head=True)
    assert torch.equal(out["lm_head.weight"], load_file(str(verifier / "model.safetensors"))["model.embed_tokens.weight"])
    assert "model.embed_tokens.weight" in cfg["specfmt"]["tensors"]["derived"]["lm_head.weight"]


def test_v2_needs_the_verifiers_weights(tmp_path, verifier):
    src = write_v2(tmp_path / "src")
    with pytest.raises(ConversionError, match="use the verifier's lm_head"):
        convert("medusa", str(src), tmp_path / "out", str(verifier))  # config.json only
    assert not (tmp_path / "out").exists()


def test_medusa2_full_model_extracts_the_heads(tmp_path, verifier):
    src = write_full(tmp_path / "src", heads=4, shards=2)
    before = tree_digest(src)
    res = convert("medusa", str(src), tmp_path / "out", str(verifier))
    cfg, out = load_out(tmp_path / "out")

    source = {}
    for f in sorted(src.glob("pytorch_model-*.bin")):
        source.update(torch.load(f, weights_only=True))
    heads = {k: v for k, v in source.items() if k.startswith("medusa_head.")}
    base = sorted(k for k in source if not k.startswith("medusa_head."))
    assert set(out) == {vllm_name(k) for k in heads}
    assert_heads_exact(heads, out)
    assert_consistent(cfg, out, K=4, L=1, bias=True, shared_head=False)
    dropped = cfg["specfmt"]["tensors"]["dropped"]
    assert sorted(dropped) == base and "lm_head.weight" in base
    assert all("verifier" in why for why in dropped.values())
    assert cfg["specfmt"]["source"]["layout"] == "medusa-1.0"
    assert {f for f in cfg["specfmt"]["source"]["files"] if f.endswith(".bin")} == {"pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin"}
    assert any("Medusa-2" in n for n in res.plan.notes)
    assert tree_digest(src) == before
    assert validate_static(tmp_path / "out").ok


@pytest.mark.parametrize("layers", [0, 2])
def test_heads_with_no_or_several_blocks(tmp_path, verifier, layers):
    src = write_legacy(tmp_path / "src", heads=2, layers=layers)
    convert("medusa", str(src), tmp_path / "out", str(verifier))
    cfg, out = load_out(tmp_path / "out")
    assert_heads_exact(load_file(str(src / "medusa_lm_head.safetensors")), out)
    assert_consistent(cfg, out, K=2, L=layers, bias=layers > 0, shared_head=False)
    assert validate_static(tmp_path / "out").ok


def test_heads_without_biases_write_medusa_fc_bias_false(tmp_path, verifier):
    src = write_legacy(tmp_path / "src", bias=False)
    convert("medusa", str(src), tmp_path / "out", str(verifier))
    cfg, out = load_out(tmp_path / "out")
    assert_consistent(cfg, out, K=3, L=1, bias=False, shared_head=False)
    assert not [n for n in out if n.endswith(".bias")]


# --------------------------------------------------------------------------- options


def test_fewer_speculative_tokens_keep_the_first_heads(tmp_path, verifier):
    src = write_v01(tmp_path / "src", heads=5)
    convert("medusa", str(src), tmp_path / "out", str(verifier), opts=Options(speculative_tokens=2))
    cfg, out = load_out(tmp_path / "out")
    assert_consistent(cfg, out, K=2, L=1, bias=True, shared_head=False)
    source = torch.load(src / "medusa_lm_head.pt", weights_only=True)
    assert_heads_exact({k: v for k, v in source.items() if int(k.split(".")[0]) < 2}, out)
    dropped = cfg["specfmt"]["tensors"]["dropped"]
    assert sorted(dropped) == sorted(k for k in source if int(k.split(".")[0]) >= 2)
    assert all("--speculative-tokens 2" in why for why in dropped.values())
    assert validate_static(tmp_path / "out").ok


def test_mixed_dtypes_need_dtype(tmp_path, verifier):
    src = tmp_path / "src"
    src.mkdir()
    sd = medusa_heads(heads=2, dtype=torch.float16)
    sd["1.1.weight"] = sd["1.1.weight"].to(torch.float32)
    save_file(sd, str(src / "medusa_lm_head.safetensors"))
    (src / "config.json").write_text(json.dumps({"medusa_num_heads": 2, "medusa_num_layers": 1}))
    with pytest.raises(ConversionError, match="mix floating dtypes"):
        convert("medusa", str(src), tmp_path / "out", str(verifier))
    assert not (tmp_path / "out").exists()
    convert("medusa", str(src), tmp_path / "out", str(verifier), opts=Options(dtype="float32"))
    cfg, out = load_out(tmp_path / "out")
    assert cfg["dtype"] == "float32" and {t.dtype for t in out.values()} == {torch.float32}
    assert torch.equal(out["blocks.0.layers.0.weight"], sd["0.0.linear.weight"].float())
    assert torch.equal(out["lm_heads.1.weight"], sd["1.1.weight"])


def test_v2_heads_and_verifier_head_in_different_dtypes_need_dtype(tmp_path):
    verifier = write_verifier_weights(tmp_path / "verifier", dtype=torch.float32)
    src = write_v2(tmp_path / "src", dtype=torch.bfloat16)
    with pytest.raises(ConversionError, match=r"verifier's lm_head mix floating dtypes \['BF16', 'F32'\]"):
        convert("medusa", str(src), tmp_path / "out", str(verifier))
    convert("medusa", str(src), tmp_path / "out", str(verifier), opts=Options(dtype="bfloat16"))
    cfg, out = load_out(tmp_path / "out")
    assert cfg["dtype"] == "bfloat16" and out["lm_head.weight"].dtype == torch.bfloat16 and validate_static(tmp_path / "out").ok


# --------------------------------------------------------------------------- refusals: nothing written, source untouched


def _edit_pickle(src: Path, fn) -> None:
    sd = torch.load(src / "medusa_lm_head.pt", weights_only=True)
    fn(sd)
    torch.save(sd, src / "medusa_lm_head.pt")


def _without(*names):
    def fn(sd):
        for n in names:
            del sd[n]
    return fn


def _renumber_head(old: int, new: int):
    def fn(sd):
        for k in [k for k in sd if k.startswith(f"{old}.")]:
            sd[f"{new}." + k.split(".", 1)[1]] = sd.pop(k)
    return fn


REFUSALS = {
    "hidden size differs from the verifier": ({"verifier_hidden": 96}, None, None, r"width 64 but the verifier's hidden_size is 96"),
    "vocabulary differs from the verifier": ({"verifier_vocab": 512}, None, None, r"over 256 tokens but the verifier's vocab_size is 512"),
    "one head lacks its bias": ({}, _without("3.0.linear.bias"), None, r"lacks tensors .*: 3\.0\.linear\.bias"),
    "one head lacks its lm_head": ({}, _without("1.1.weight"), None, r"lacks tensors .*: 1\.1\.weight"),
    "gap in the head numbering": ({}, _renumber_head(4, 6), None, r"head\(s\) \[4, 5\] are missing"),
    "more speculative tokens than heads": ({}, None, Options(speculative_tokens=6), r"--speculative-tokens 6 asks for more heads than the 5"),
    "config claims more heads than the weights": ({"config_heads": 7}, None, None, r"medusa_num_heads=7 but the weights hold only 5"),
    "config layers differ from the weights": ({"config_layers": 2}, None, None, r"medusa_num_layers=2 but the weights hold 1"),
    "per-head Linear at another depth": ({}, lambda sd: sd.__setitem__("2.3.weight", sd.pop("2.1.weight")), None, r"different depths \[1, 3\]"),
    "unknown tensor": ({}, lambda sd: sd.__setitem__("0.1.bias", torch.zeros(256, dtype=torch.bfloat16)), None, r"not part of the medusa layout: 0\.1\.bias"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_refusals_write_nothing(tmp_path, case):
    kw, edit, opts, message = REFUSALS[case]
    verifier = write_verifier(tmp_path / "verifier", hidden=kw.get("verifier_hidden", 64), vocab=kw.get("verifier_vocab", 256))
    src = write_v01(tmp_path / "src", config_heads=kw.get("config_heads", 2), heads=5)
    if "config_layers" in kw:
        cfg = json.loads((src / "config.json").read_text())
        cfg["medusa_num_layers"] = kw["config_layers"]
        (src / "config.json").write_text(json.dumps(cfg))
    if edit:
        _edit_pickle(src, edit)
    before = tree_digest(src)
    with pytest.raises(ConversionError, match=message):
        convert("medusa", str(src), tmp_path / "out", str(verifier), opts=opts)
    assert not (tmp_path / "out").exists()
    assert not list(tmp_path.glob(".out.specfmt-*"))
    assert tree_digest(src) == before


def test_v2_with_zero_layers_is_refused(tmp_path):
    verifier = write_verifier_weights(tmp_path / "verifier")
    src = write_v2(tmp_path / "src", layers=0)
    before = tree_digest(src)
    with pytest.raises(ConversionError, match="no parameters at all"):
        convert("medusa", str(src), tmp_path / "out", str(verifier))
    assert not (tmp_path / "out").exists() and tree_digest(src) == before


def test_v2_config_with_per_head_linears_is_refused_and_v1_without_them(tmp_path, verifier):
    src = write_legacy(tmp_path / "src")
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, "version": "2"}))
    with pytest.raises(ConversionError, match="says version 2 .* per-head Linears"):
        convert("medusa", str(src), tmp_path / "out", str(verifier))
    v2 = write_v2(tmp_path / "v2")
    (v2 / "config.json").write_text(json.dumps({k: v for k, v in json.loads((v2 / "config.json").read_text()).items() if k != "version"}))
    with pytest.raises(ConversionError, match='no per-head Linear .* "version": "2"'):
        convert("medusa", str(v2), tmp_path / "out", str(verifier))
    assert not (tmp_path / "out").exists()


def test_cli_error_is_one_line_with_exit_2(tmp_path, verifier):
    src = write_v01(tmp_path / "src")
    _edit_pickle(src, _without("0.0.linear.bias"))
    r = run_cli("convert", "--from", "medusa", str(src), "-o", str(tmp_path / "out"), "--verifier", str(verifier))
    assert r.returncode == 2
    assert "0.0.linear.bias" in r.stderr and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_cli_converts_and_prints_the_note(tmp_path, verifier):
    src = write_v01(tmp_path / "src")
    r = run_cli("convert", "--from", "medusa", str(src), "-o", str(tmp_path / "out"), "--verifier", str(verifier))
    assert r.returncode == 0, r.stderr
    assert "medusa_num_heads=2" in r.stderr and "v0.1" in r.stdout
    assert validate_static(tmp_path / "out").ok
