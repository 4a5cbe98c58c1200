"""`specfmt convert --from eagle3`: every source layout, exactness, refusals, atomic output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from builders import eagle3_config, eagle3_tensors, write_safeailab, write_specforge, write_speculators_eagle3, write_verifier
from conftest import load_out, run_cli, tree_digest
from specfmt.convert import convert
from specfmt.converters import Options
from specfmt.errors import ConversionError, InputError, OutputExistsError
from specfmt.validation.static import validate_static






# --------------------------------------------------------------------------- layouts


#: how SpecForge sources are read here: SGLang's layer-output tap ids (converters/eagle3.py read_taps)
SGLANG_TAPS = Options(tap_ids="layer-output")


def test_safeailab_layout_converts_exactly(tmp_path, verifier):
    src = write_safeailab(tmp_path / "src")
    before = tree_digest(src)
    res = convert("eagle3", str(src), tmp_path / "out", str(verifier))
    cfg, out = load_out(tmp_path / "out")

    source = torch.load(src / "pytorch_model.bin", weights_only=True)
    assert set(out) == {k.replace("midlayer.", "layers.0.") for k in source}
    for k, t in source.items():
        o = out[k.replace("midlayer.", "layers.0.")]
        assert o.dtype == t.dtype and torch.equal(o, t), k
    assert tree_digest(src) == before  # SRC never modified

    assert "model_type" not in cfg  # vLLM routes to the speculators loader only without it
    assert cfg["speculators_model_type"] == "eagle3"
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]  # (2, N//2, N-3), N=8
    assert cfg["norm_before_residual"] is False
    assert cfg["draft_vocab_size"] == 128
    assert cfg["speculators_config"]["verifier"]["name_or_path"] == str(verifier.resolve())
    tlc = cfg["transformer_layer_config"]
    assert tlc["vocab_size"] == 256 and tlc["hidden_size"] == 64 and tlc["num_hidden_layers"] == 1
    assert tlc["rope_theta"] == 10000.0  # the draft's own default, not the verifier's 500000
    assert tlc["max_position_embeddings"] == 4096  # raised to the verifier's context
    prov = cfg["specfmt"]
    assert prov["source"]["layout"] == "safeailab"
    assert set(prov["source"]["files"]) == {"config.json", "pytorch_model.bin"}
    assert len(prov["tensors"]["renamed"]) == 10 and sorted(prov["tensors"]["kept"]) == ["d2t", "fc.weight", "lm_head.weight", "norm.weight", "t2d"]
    assert any("tap layers" in n for n in res.plan.notes)
    assert validate_static(tmp_path / "out").ok


@pytest.mark.parametrize("shards", [1, 3])
def test_specforge_layout_reads_nested_taps_and_shards(tmp_path, verifier, shards):
    src = write_specforge(tmp_path / "src", taps=(1, 4, 6), shards=shards)
    convert("eagle3", str(src), tmp_path / "out", str(verifier), opts=SGLANG_TAPS)
    cfg, out = load_out(tmp_path / "out")
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 5, 7]  # SGLang's layer outputs 1, 4, 6
    assert cfg["dtype"] == "bfloat16" and out["fc.weight"].dtype == torch.bfloat16
    assert cfg["specfmt"]["source"]["layout"] == "specforge"
    if shards > 1:
        assert "model.safetensors.index.json" not in cfg["specfmt"]["source"]["files"]
        assert len([f for f in cfg["specfmt"]["source"]["files"] if f.endswith(".safetensors")]) == 3
    assert validate_static(tmp_path / "out").ok


def test_target_hidden_size_with_own_embedding(tmp_path):
    verifier = write_verifier(tmp_path / "v", hidden=96)
    src = write_specforge(tmp_path / "src", target_hidden=96, embed=True)
    convert("eagle3", str(src), tmp_path / "out", str(verifier), opts=SGLANG_TAPS)
    cfg, out = load_out(tmp_path / "out")
    assert cfg["target_hidden_size"] == 96
    assert list(out["fc.weight"].shape) == [64, 3 * 96]
    assert list(out["embed_tokens.weight"].shape) == [256, 64]
    assert validate_static(tmp_path / "out").ok


def test_target_hidden_size_without_embedding_is_refused(tmp_path):
    verifier = write_verifier(tmp_path / "v", hidden=96)
    src = write_specforge(tmp_path / "src", target_hidden=96, embed=False)
    with pytest.raises(ConversionError, match="needs its own embed_tokens"):
        convert("eagle3", str(src), tmp_path / "out", str(verifier))
    assert not (tmp_path / "out").exists()


def test_full_vocabulary_without_d2t(tmp_path, verifier):
    src = write_safeailab(tmp_path / "src", draft_vocab=256)
    convert("eagle3", str(src), tmp_path / "out", str(verifier))
    cfg, out = load_out(tmp_path / "out")
    assert cfg["draft_vocab_size"] == 256 and "d2t" not in out and "t2d" not in out
    assert validate_static(tmp_path / "out").ok


def test_modelopt_multilayer_midlayer_i(tmp_path, verifier):
    src = write_specforge(tmp_path / "src", layers=2)
    convert("eagle3", str(src), tmp_path / "out", str(verifier), opts=SGLANG_TAPS)
    cfg, out = load_out(tmp_path / "out")
    assert cfg["transformer_layer_config"]["num_hidden_layers"] == 2
    assert list(out["layers.1.self_attn.q_proj.weight"].shape) == [64, 64]  # H wide after layer 0
    assert list(out["layers.0.self_attn.q_proj.weight"].shape) == [64, 128]  # 2H for layer 0
    assert validate_static(tmp_path / "out").ok


def test_multimodal_verifier_text_config(tmp_path):
    verifier = write_verifier(tmp_path / "v", text_config=True)
    src = write_safeailab(tmp_path / "src")
    convert("eagle3", str(src), tmp_path / "out", str(verifier))
    cfg, _ = load_out(tmp_path / "out")
    assert cfg["speculators_config"]["verifier"]["architectures"] == ["LlavaForConditionalGeneration"]


# --------------------------------------------------------------------------- options


def test_aux_layers_option_and_conflicts(tmp_path, verifier):
    src = write_safeailab(tmp_path / "src")
    convert("eagle3", str(src), tmp_path / "a", str(verifier), opts=Options(aux_layers=[1, 3, 6], speculative_tokens=5))
    cfg, _ = load_out(tmp_path / "a")
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 3, 6]
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 5
    with pytest.raises(ConversionError, match="must lie in"):
        convert("eagle3", str(src), tmp_path / "b", str(verifier), opts=Options(aux_layers=[1, 3, 8]))
    sf = write_specforge(tmp_path / "sf", taps=(1, 4, 6))
    with pytest.raises(ConversionError, match="contradicts"):
        convert("eagle3", str(sf), tmp_path / "c", str(verifier), opts=Options(aux_layers=[1, 4, 6], tap_ids="layer-output"))
    assert not (tmp_path / "b").exists() and not (tmp_path / "c").exists()


def test_specforge_tap_ids_need_their_convention(tmp_path, verifier):
    """eagle_config ids are SGLang's layer outputs or vLLM's layer inputs and the file does not say
    which (converters/eagle3.py read_taps): refused naming both readings until --tap-ids (or an
    --aux-layers equal to one reading) picks one; the reading is noted."""
    sf = write_specforge(tmp_path / "sf", taps=(1, 4, 5))
    with pytest.raises(ConversionError) as e:
        convert("eagle3", str(sf), tmp_path / "out", str(verifier))
    line = e.value.one_line()
    assert "eagle_config.eagle_aux_hidden_state_layer_ids [1, 4, 5]: SGLang/SpecForge read layer outputs (vLLM ids [2, 5, 6]), " \
           "vLLM reads layer inputs ([1, 4, 5]); pass --tap-ids layer-output or --tap-ids layer-input" in line
    assert "validate --run" in line and "\n" not in line and not (tmp_path / "out").exists()
    for i, (opts, taps) in enumerate([(Options(tap_ids="layer-output"), [2, 5, 6]), (Options(tap_ids="layer-input"), [1, 4, 5]),
                                      (Options(aux_layers=[2, 5, 6]), [2, 5, 6]), (Options(aux_layers=[1, 4, 5]), [1, 4, 5])]):
        res = convert("eagle3", str(sf), tmp_path / f"out{i}", str(verifier), opts=opts)
        assert load_out(tmp_path / f"out{i}")[0]["eagle_aux_hidden_state_layer_ids"] == taps
        reading = "layer-output" if taps == [2, 5, 6] else "layer-input"
        assert any(f"[1, 4, 5] read as {reading.replace('-', ' ')}s (--tap-ids {reading}): vLLM tap ids {taps}" in n for n in res.plan.notes)
    with pytest.raises(ConversionError, match=r"--aux-layers \[2, 4, 5\] is neither"):
        convert("eagle3", str(sf), tmp_path / "x", str(verifier), opts=Options(aux_layers=[2, 4, 5]))
    with pytest.raises(InputError, match="--tap-ids must be layer-output or layer-input"):
        convert("eagle3", str(sf), tmp_path / "x", str(verifier), opts=Options(tap_ids="output"))
    # a research config's top-level ids are read the same way
    top = write_safeailab(tmp_path / "top")
    cfg = json.loads((top / "config.json").read_text())
    (top / "config.json").write_text(json.dumps({**cfg, "eagle_aux_hidden_state_layer_ids": [1, 4, 5]}))
    with pytest.raises(ConversionError, match=r"^eagle_aux_hidden_state_layer_ids \[1, 4, 5\]: SGLang"):
        convert("eagle3", str(top), tmp_path / "x", str(verifier))
    convert("eagle3", str(top), tmp_path / "top-out", str(verifier), opts=SGLANG_TAPS)
    assert load_out(tmp_path / "top-out")[0]["eagle_aux_hidden_state_layer_ids"] == [2, 5, 6]
    assert not (tmp_path / "x").exists()


def test_tap_ids_with_a_source_whose_convention_is_fixed(tmp_path, verifier):
    """No ids (SafeAILab: the default (2, N//2, N-3)) and a speculators config (vLLM's convention by
    definition) are converted as before; a --tap-ids they cannot honour is refused."""
    sa = write_safeailab(tmp_path / "sa")
    with pytest.raises(ConversionError, match="--tap-ids layer-output says how to read the source's tap ids, but its config names none"):
        convert("eagle3", str(sa), tmp_path / "x", str(verifier), opts=SGLANG_TAPS)
    spec = write_speculators_eagle3(tmp_path / "spec", str(verifier), style="modelopt")
    convert("speculators", str(spec), tmp_path / "a", str(verifier), opts=Options(tap_ids="layer-input"))
    assert load_out(tmp_path / "a")[0]["eagle_aux_hidden_state_layer_ids"] == [1, 4, 5]
    with pytest.raises(ConversionError, match="--tap-ids layer-output contradicts the speculators format"):
        convert("speculators", str(spec), tmp_path / "x", str(verifier), opts=SGLANG_TAPS)
    assert not (tmp_path / "x").exists()


def test_dtype_cast(tmp_path, verifier):
    src = write_safeailab(tmp_path / "src")
    convert("eagle3", str(src), tmp_path / "out", str(verifier), opts=Options(dtype="float32"))
    cfg, out = load_out(tmp_path / "out")
    assert cfg["dtype"] == "float32" and out["fc.weight"].dtype == torch.float32
    assert out["d2t"].dtype == torch.int64 and out["t2d"].dtype == torch.bool
    src_fc = torch.load(src / "pytorch_model.bin", weights_only=True)["fc.weight"]
    assert torch.equal(out["fc.weight"], src_fc.float())


def test_dry_run_writes_nothing(tmp_path, verifier):
    src = write_safeailab(tmp_path / "src")
    r = run_cli("convert", "--from", "eagle3", str(src), "-o", str(tmp_path / "out"), "--verifier", str(verifier), "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "midlayer.self_attn.q_proj.weight" in r.stdout and "layers.0.self_attn.q_proj.weight" in r.stdout
    assert '"eagle_aux_hidden_state_layer_ids"' in r.stdout
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- exactness


def test_unexpected_tensor_fails_with_list(tmp_path, verifier):
    src = write_safeailab(tmp_path / "src")
    sd = torch.load(src / "pytorch_model.bin", weights_only=True)
    sd["mystery.weight"] = torch.zeros(3, dtype=torch.float16)
    sd["midlayer.extra_norm.weight"] = torch.zeros(64, dtype=torch.float16)
    torch.save(sd, src / "pytorch_model.bin")
    r = run_cli("convert", "--from", "eagle3", str(src), "-o", str(tmp_path / "out"), "--verifier", str(verifier))
    assert r.returncode == 2
    assert "mystery.weight" in r.stderr and "layers.0.extra_norm.weight" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("drop", ["midlayer.self_attn.k_proj.weight", "norm.weight", "d2t"])
def test_missing_tensor_fails_with_list(tmp_path, verifier, drop):
    src = write_safeailab(tmp_path / "src")
    sd = torch.load(src / "pytorch_model.bin", weights_only=True)
    del sd[drop]
    if drop == "d2t":
        del sd["t2d"]
    torch.save(sd, src / "pytorch_model.bin")
    with pytest.raises(ConversionError) as e:
        convert("eagle3", str(src), tmp_path / "out", str(verifier))
    assert "missing" in str(e.value) and drop.replace("midlayer.", "layers.0.") in str(e.value)
    assert not (tmp_path / "out").exists()
    assert not list(tmp_path.glob(".out.specfmt-*"))


def test_shape_mismatch_fails(tmp_path, verifier):
    src = write_safeailab(tmp_path / "src")
    sd = torch.load(src / "pytorch_model.bin", weights_only=True)
    sd["midlayer.mlp.up_proj.weight"] = torch.zeros(95, 64, dtype=torch.float16)
    torch.save(sd, src / "pytorch_model.bin")
    with pytest.raises(ConversionError, match=r"wrong shape: layers.0.mlp.up_proj.weight: \[95, 64\], expected \[96, 64\]"):
        convert("eagle3", str(src), tmp_path / "out", str(verifier))


def test_broken_vocab_map_and_nan_are_refused(tmp_path, verifier):
    src = write_safeailab(tmp_path / "src")
    sd = torch.load(src / "pytorch_model.bin", weights_only=True)
    sd["d2t"] = sd["d2t"] + torch.arange(128)  # absolute ids written where offsets belong
    torch.save(sd, src / "pytorch_model.bin")
    with pytest.raises(ConversionError, match="vocabulary map"):
        convert("eagle3", str(src), tmp_path / "out", str(verifier))
    src2 = write_safeailab(tmp_path / "src2")
    sd = torch.load(src2 / "pytorch_model.bin", weights_only=True)
    sd["fc.weight"][0, 0] = float("nan")
    torch.save(sd, src2 / "pytorch_model.bin")
    with pytest.raises(ConversionError, match="fc.weight has 1 NaN/Inf"):
        convert("eagle3", str(src2), tmp_path / "out", str(verifier))
    assert not (tmp_path / "out").exists()
    assert not list(tmp_path.glob(".out.specfmt-*"))


def test_wrong_verifier_is_refused(tmp_path):
    src = write_safeailab(tmp_path / "src")
    with pytest.raises(ConversionError, match="vocab_size 256 differs"):
        convert("eagle3", str(src), tmp_path / "out", str(write_verifier(tmp_path / "v1", vocab=512)))
    with pytest.raises(ConversionError, match="hidden size of 64"):
        convert("eagle3", str(src), tmp_path / "out", str(write_verifier(tmp_path / "v2", hidden=128)))


def test_unknown_eagle_config_field_is_refused(tmp_path, verifier):
    src = write_specforge(tmp_path / "src")
    cfg = json.loads((src / "config.json").read_text())
    cfg["eagle_config"]["parallel_draft_step"] = 4
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConversionError, match="parallel_draft_step"):
        convert("eagle3", str(src), tmp_path / "out", str(verifier))


def test_training_leftovers_are_dropped_with_reason(tmp_path, verifier):
    src = tmp_path / "src"
    src.mkdir()
    sd = eagle3_tensors()
    sd["target_model.lm_head.weight"] = torch.zeros(256, 64, dtype=torch.float16)
    torch.save(sd, src / "pytorch_model.bin")
    (src / "config.json").write_text(json.dumps(eagle3_config()))
    convert("eagle3", str(src), tmp_path / "out", str(verifier))
    cfg, out = load_out(tmp_path / "out")
    assert "target_model.lm_head.weight" not in out
    assert "verifier" in cfg["specfmt"]["tensors"]["dropped"]["target_model.lm_head.weight"]


def test_pickle_that_runs_code_is_refused(tmp_path, verifier):
    src = write_safeailab(tmp_path / "src")
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    torch.save({"fc.weight": Evil()}, src / "pytorch_model.bin")
    r = run_cli("convert", "--from", "eagle3", str(src), "-o", str(tmp_path / "out"), "--verifier", str(verifier))
    assert r.returncode == 2 and "refused to load a pickle" in r.stderr and "Traceback" not in r.stderr
    assert not marker.exists() and not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- output folder


def test_output_folder_rules(tmp_path, verifier):
    src = write_safeailab(tmp_path / "src")
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("user data")
    with pytest.raises(OutputExistsError):
        convert("eagle3", str(src), out, str(verifier))
    assert (out / "keep.txt").read_text() == "user data"
    convert("eagle3", str(src), out, str(verifier), force=True)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    with pytest.raises(InputError, match="the output folder lies inside SRC"):
        convert("eagle3", str(src), src / "converted", str(verifier))
    empty = tmp_path / "empty"
    empty.mkdir()
    convert("eagle3", str(src), empty, str(verifier))  # an empty folder is fine
    assert (empty / "model.safetensors").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_relative_verifier_path_is_written_absolute(tmp_path):
    write_verifier(tmp_path / "ver")
    write_safeailab(tmp_path / "src")
    r = subprocess.run([sys.executable, "-m", "specfmt", "convert", "--from", "eagle3", "src", "-o", "out", "--verifier", "ver"], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["speculators_config"]["verifier"]["name_or_path"] == str((tmp_path / "ver").resolve())


# --------------------------------------------------------------------------- Hub ids (offline, from the cache)


def _fake_hub_cache(cache: Path, repo_id: str, files: dict[str, bytes]) -> None:
    """The layout huggingface_hub's cache uses: models--OWNER--NAME/{refs/main, snapshots/SHA/...}."""
    sha = "0123456789abcdef0123456789abcdef01234567"
    root = cache / ("models--" + repo_id.replace("/", "--"))
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(sha)
    snap = root / "snapshots" / sha
    snap.mkdir(parents=True)
    for name, data in files.items():
        (snap / name).write_bytes(data)


def test_hub_ids_resolve_offline_from_cache(tmp_path):
    cache = tmp_path / "hub"
    v = write_verifier(tmp_path / "v")
    s = write_safeailab(tmp_path / "s")
    _fake_hub_cache(cache, "acme/verifier-8l", {"config.json": (v / "config.json").read_bytes()})
    _fake_hub_cache(cache, "acme/eagle3-draft", {f.name: f.read_bytes() for f in s.iterdir()})
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache)}
    r = run_cli("convert", "--from", "eagle3", "acme/eagle3-draft", "-o", str(tmp_path / "out"), "--verifier", "acme/verifier-8l", env=env)
    assert r.returncode == 0, r.stderr
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["speculators_config"]["verifier"]["name_or_path"] == "acme/verifier-8l"
    assert cfg["specfmt"]["source"]["name_or_path"] == "acme/eagle3-draft"
    r = run_cli("convert", "--from", "eagle3", "acme/not-cached", "-o", str(tmp_path / "out2"), "--verifier", "acme/verifier-8l", env=env)
    assert r.returncode == 2 and "not in the local Hugging Face cache" in r.stderr and "HF_HUB_OFFLINE" in r.stderr


def test_full_vocabulary_identity_map_is_dropped_nonidentity_refused(tmp_path, verifier):
    src = tmp_path / "src"
    src.mkdir()
    sd = eagle3_tensors(draft_vocab=256)
    sd["d2t"] = torch.zeros(256, dtype=torch.int64)
    sd["t2d"] = torch.ones(256, dtype=torch.bool)
    torch.save(sd, src / "pytorch_model.bin")
    (src / "config.json").write_text(json.dumps(eagle3_config(draft_vocab=256)))
    convert("eagle3", str(src), tmp_path / "out", str(verifier))
    cfg, out = load_out(tmp_path / "out")
    assert "d2t" not in out and "identity" in cfg["specfmt"]["tensors"]["dropped"]["d2t"]
    sd["d2t"][5] = 1
    torch.save(sd, src / "pytorch_model.bin")
    with pytest.raises(ConversionError, match="not the identity"):
        convert("eagle3", str(src), tmp_path / "out2", str(verifier))


def test_four_taps_write_num_aux_hidden_states(tmp_path, verifier):
    src = write_specforge(tmp_path / "src", taps=(1, 3, 5, 7))
    convert("eagle3", str(src), tmp_path / "out", str(verifier), opts=Options(tap_ids="layer-input"))
    cfg, _ = load_out(tmp_path / "out")
    assert cfg["transformer_layer_config"]["num_aux_hidden_states"] == 4


def test_rotary_cache_is_dropped_only_when_it_matches_rope_theta(tmp_path, verifier):
    src = tmp_path / "src"
    src.mkdir()
    sd = eagle3_tensors()
    d = 32  # hidden 64 / 2 heads
    sd["midlayer.self_attn.rotary_emb.inv_freq"] = 1.0 / (10000.0 ** (torch.arange(0, d, 2).float() / d))
    torch.save(sd, src / "pytorch_model.bin")
    (src / "config.json").write_text(json.dumps(eagle3_config()))
    convert("eagle3", str(src), tmp_path / "out", str(verifier))
    cfg, out = load_out(tmp_path / "out")
    assert "layers.0.self_attn.rotary_emb.inv_freq" not in out
    assert "midlayer.self_attn.rotary_emb.inv_freq" in cfg["specfmt"]["tensors"]["dropped"]
    (src / "config.json").write_text(json.dumps(eagle3_config(rope_theta=500000.0)))
    with pytest.raises(ConversionError, match="does not match rope_theta=500000.0"):
        convert("eagle3", str(src), tmp_path / "out2", str(verifier))
