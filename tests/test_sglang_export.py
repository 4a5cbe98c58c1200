"""``specfmt export --to sglang`` without SGLang: what is written, each refusal and its reason, the round trip
through ``convert --from auto``, the serve line, and the promises every writing command keeps (nothing written
on a refusal, never over an input). SGLang's own code runs on the same exports in ``test_sglang_interop.py``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from sglang_drafts import QWEN3_VERIFIER, VERIFIER, dflash_variant, eagle1_variant, variant, verifier_embedding, world_dflash, world_eagle1, world_eagle3
from specfmt.algorithms import get, names
from specfmt.algorithms.sglang import RULES, TAP_RULES, sglang_tap_ids
from specfmt.cli import app
from specfmt.convert import convert
from specfmt.errors import ExportRefusal
from specfmt.export import export
from specfmt.serving import sglang_serve_command
from specfmt.sources.verifier import VerifierInfo

runner = CliRunner()


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    return world_eagle3(tmp_path_factory.mktemp("world") / "eagle3")


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


def _round_trip(draft: Path, tmp: Path, verifier: Path = VERIFIER, exported: Path | None = None) -> tuple[dict, dict]:
    """Export ``draft`` (unless ``exported`` is its export), convert the export back with ``--from auto``; both configs
    (provenance dropped) after asserting the tensors are the draft's, name for name, dtype for dtype, value for value."""
    exported = exported or export(str(draft), tmp / "sglang").out
    back = tmp / "back"
    convert("auto", str(exported), back, str(verifier))
    ours, theirs = _tensors(draft), _tensors(back)
    assert sorted(ours) == sorted(theirs)
    for name, t in ours.items():
        assert theirs[name].dtype == t.dtype and torch.equal(theirs[name], t), name
    a, b = (json.loads((f / "config.json").read_text()) for f in (draft, back))
    a.pop("specfmt"), b.pop("specfmt")
    return a, b


def test_the_world_draft_is_written_as_sglangs_eagle3_class_reads_it(world, tmp_path):
    out = export(str(world), tmp_path / "sglang").out
    cfg = json.loads((out / "config.json").read_text())
    names_written = set(_tensors(out))
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["model_type"] == "llama"
    assert cfg["draft_vocab_size"] == 1024 and "target_hidden_size" not in cfg  # null would size SGLang's fc from None
    assert cfg["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [1, 3, 4]}  # vLLM taps [2, 4, 5]; SGLang's Llama adds 1
    assert "t2d" not in names_written and "d2t" in names_written
    assert {n for n in names_written if n.startswith("midlayer.")} == {f"midlayer.{n[9:]}" for n in _tensors(world) if n.startswith("layers.0.")}
    prov = cfg["specfmt_export"]
    assert prov["engine_version"] == "0.5.23" and prov["speculative_algorithm"] == "EAGLE3" and prov["tap_ids"] == "layer-output"
    assert set(prov["source"]["files"]) == {"config.json", "model.safetensors"} and prov["tensors"]["dropped"].keys() == {"t2d"}


def test_the_world_draft_comes_back_tensor_for_tensor(world, tmp_path):
    a, b = _round_trip(world, tmp_path)
    assert a == b


@pytest.mark.parametrize("case", ["norm_before_fc", "fc_norm+norm_output", "full_vocab", "own_embedding"])
def test_every_variant_sglang_runs_comes_back_tensor_for_tensor(world, tmp_path, case):
    """EAGLE-3.1's norms (SGLang has all three), a full vocabulary (no d2t), the verifier's embedding carried."""
    kw = {"norm_before_fc": {"norm_before_fc": True}, "fc_norm+norm_output": {"fc_norm": True, "norm_output": True},
          "full_vocab": {"draft_vocab_size": 2048},
          "own_embedding": {"dtype": "float32", "tlc": {"dtype": "float32"}, "tensors": {"embed_tokens.weight": verifier_embedding()}}}[case]
    draft = variant(world, tmp_path / "draft", **kw)
    a, b = _round_trip(draft, tmp_path)
    assert a == b


def _refusal(draft: Path, tmp: Path, verifier: str | None = None) -> ExportRefusal:
    with pytest.raises(ExportRefusal) as e:
        export(str(draft), tmp / "out", verifier=verifier)
    assert not (tmp / "out").exists()
    return e.value


def test_norm_before_residual_true_is_refused_by_name(world, tmp_path):
    e = _refusal(variant(world, tmp_path / "d", norm_before_residual=True), tmp_path)
    assert e.reason == "norm_before_residual" and e.engine == "sglang"


def test_qwen3_draft_layers_are_refused_sglang_would_drop_their_qk_norms(world, tmp_path):
    assert _refusal(variant(world, tmp_path / "d", tlc={"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}), tmp_path).reason == "draft_layer"


def test_a_second_decoder_layer_is_refused(world, tmp_path):
    assert _refusal(variant(world, tmp_path / "d", tlc={"num_hidden_layers": 2}), tmp_path).reason == "layers"


def test_an_own_embedding_other_than_the_verifiers_is_refused(world, tmp_path):
    """SGLang's EAGLE worker replaces it with the verifier's when H = H_t (LlamaForCausalLM.set_embed)."""
    assert _refusal(variant(world, tmp_path / "d", tensors={"embed_tokens.weight": torch.ones(2048, 128)}), tmp_path).reason == "own_embedding"


def test_attention_bias_is_refused(world, tmp_path):
    assert _refusal(variant(world, tmp_path / "d", tlc={"attention_bias": True}), tmp_path).reason == "bias"


def _info(arch: str, layers: int = 8) -> VerifierInfo:
    return VerifierInfo(name_or_path="v", architectures=(arch,), hidden_size=128, vocab_size=2048, num_hidden_layers=layers, max_position_embeddings=None)


def test_taps_the_pr_25454_heuristic_would_misread_are_refused():
    """DeepSeek's rule adds 1 only when the first id is 1: vLLM taps starting at 1 have no ids it reads back."""
    with pytest.raises(ExportRefusal) as e:
        sglang_tap_ids([1, 4, 6], _info("DeepseekV3ForCausalLM"))
    assert e.value.reason == "taps"


@pytest.mark.parametrize("arch,taps,written", [("DeepseekV3ForCausalLM", [2, 4, 6], ([1, 3, 5], "layer-output")),
                                               ("DeepseekV3ForCausalLM", [3, 4, 6], ([3, 4, 6], "layer-input")),
                                               ("GptOssForCausalLM", [2, 4, 7], ([1, 3, 6], "layer-output")),
                                               ("LlamaForCausalLM", [0, 4, 7], None)])
def test_tap_ids_are_written_so_that_the_verifiers_own_rule_reads_back_the_taps(arch, taps, written):
    if written is None:  # tap 0 (the embedding output) has no layer-output id, and Llama always adds 1
        with pytest.raises(ExportRefusal):
            sglang_tap_ids(taps, _info(arch))
        return
    ids, convention = sglang_tap_ids(taps, _info(arch))
    assert (ids, convention) == written and RULES[TAP_RULES[arch][0]](ids, 8) == taps


def test_an_unchecked_verifier_architecture_is_refused(world, tmp_path):
    with pytest.raises(ExportRefusal) as e:
        sglang_tap_ids([2, 4, 5], _info("FalconForCausalLM"))
    assert e.value.reason == "verifier"


@pytest.mark.parametrize("name", [n for n in names() if get(n).sglang is None])
def test_every_algorithm_without_an_sglang_layout_says_why(name):
    assert get(name).sglang_unserved.startswith("SGLang 0.5.23")


def test_a_draft_sglang_does_not_serve_is_refused_with_the_reason(tmp_path):
    medusa = tmp_path / "medusa"
    convert("auto", str(VERIFIER.parent / "medusa-legacy"), medusa, str(VERIFIER))
    e = _refusal(medusa, tmp_path)
    assert e.reason == "unserved" and "Medusa" in e.message


def test_the_serve_line_names_eagle3_the_export_and_the_steps(world, tmp_path):
    out = export(str(world), tmp_path / "sglang").out
    line = sglang_serve_command(json.loads((out / "config.json").read_text()), str(out))
    argv = list(line.argv)
    assert argv[:3] == ["python3", "-m", "sglang.launch_server"]
    flag = lambda f: argv[argv.index(f) + 1]  # noqa: E731
    assert flag("--speculative-algorithm") == "EAGLE3" and flag("--speculative-draft-model-path") == str(out)
    assert flag("--model-path") == str(VERIFIER.resolve()) and (flag("--speculative-num-steps"), flag("--speculative-num-draft-tokens")) == ("3", "4")


def test_cli_export_then_serve_command_engine_sglang(world, tmp_path):
    out = tmp_path / "sglang"
    r = runner.invoke(app, ["export", str(world), "--to", "sglang", "-o", str(out)])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["serve-command", str(out), "--engine", "sglang"])
    assert r.exit_code == 0 and r.output.strip().startswith("python3 -m sglang.launch_server") and "--speculative-algorithm EAGLE3" in r.output


def test_serve_command_engine_sglang_on_a_specfmt_draft_says_to_export_first(world):
    r = runner.invoke(app, ["serve-command", str(world), "--engine", "sglang"])
    assert r.exit_code == 2 and "specfmt export --to sglang" in r.output


def test_cli_refusal_is_one_line_and_writes_nothing(world, tmp_path):
    draft = variant(world, tmp_path / "d", norm_before_residual=True)
    r = runner.invoke(app, ["export", str(draft), "--to", "sglang", "-o", str(tmp_path / "out")])
    assert r.exit_code == 2 and "norm_before_residual" in r.output and not (tmp_path / "out").exists()
    assert "Traceback" not in r.output


def test_the_output_may_not_lie_inside_the_draft(world):
    r = runner.invoke(app, ["export", str(world), "--to", "sglang", "-o", str(world / "sglang"), "--force"])
    assert r.exit_code == 2 and not (world / "sglang").exists()


def test_dry_run_writes_nothing(world, tmp_path):
    r = runner.invoke(app, ["export", str(world), "--to", "sglang", "--dry-run"])
    assert r.exit_code == 0 and "midlayer.self_attn.q_proj.weight" in r.output and "dry run: nothing written" in r.output


def test_sliding_window_eagle3_layers_are_refused(world, tmp_path):
    """SGLang sets a draft window only from --speculative-draft-window-size, for every layer."""
    draft = variant(world, tmp_path / "d", tlc={"layer_types": ["sliding_attention"], "sliding_window": 64, "use_sliding_window": True})
    assert _refusal(draft, tmp_path).reason == "sliding_window"


# --------------------------------------------------------------------------- EAGLE-1 (LlamaForCausalLMEagle)


@pytest.fixture(scope="module")
def eagle1(tmp_path_factory) -> Path:
    return world_eagle1(tmp_path_factory.mktemp("eagle1") / "eagle1")


@pytest.fixture(scope="module")
def hass(tmp_path_factory) -> Path:
    """The world's EAGLE-1 draft converted from a HASS source: its fc.bias folded into layer 0's q/k/v/o biases."""
    return world_eagle1(tmp_path_factory.mktemp("hass") / "hass", fc_bias=True)


def test_an_eagle1_draft_is_written_as_sglangs_llama_eagle_reads_it_with_a_zero_fc_bias(eagle1, tmp_path):
    out = export(str(eagle1), tmp_path / "sglang").out
    cfg, written, ours = json.loads((out / "config.json").read_text()), _tensors(out), _tensors(eagle1)
    assert cfg["architectures"] == ["LlamaForCausalLMEagle"] and cfg["model_type"] == "llama" and cfg["tie_word_embeddings"] is False
    assert set(written) == {*ours, "fc.bias"} and not written["fc.bias"].any() and written["fc.bias"].dtype == ours["fc.weight"].dtype
    assert all(torch.equal(written[n], t) for n, t in ours.items())
    prov = cfg["specfmt_export"]
    assert prov["speculative_algorithm"] == "EAGLE" and set(prov["tensors"]["derived"]) == {"fc.bias"} and prov["tensors"]["dropped"] == {}


@pytest.mark.parametrize("case", ["world", "hass", "two_layers", "own_embedding"])
def test_every_eagle1_draft_sglang_runs_comes_back_tensor_for_tensor(eagle1, hass, tmp_path, case):
    """The zero fc.bias is dropped on the way back (it adds nothing); a HASS draft's folded q/k/v/o biases are kept as they are."""
    draft = {"world": lambda: eagle1, "hass": lambda: hass,
             "two_layers": lambda: eagle1_variant(eagle1, tmp_path / "two", num_hidden_layers=2, seed=1),
             "own_embedding": lambda: eagle1_variant(eagle1, tmp_path / "own", dtype="float32", seed=2,
                                                     tensors={"embed_tokens.weight": verifier_embedding()})}[case]()
    a, b = _round_trip(draft, tmp_path)
    assert a == b


def test_the_eagle1_export_reads_back_without_asking_eagle_or_hass(hass, tmp_path):
    """Its zero fc.bias would otherwise make --from auto ask (HASS always saves fc.bias)."""
    from specfmt.detect import detect

    out = export(str(hass), tmp_path / "sglang").out
    found = detect(out)
    assert (found.format, found.layout, found.candidates) == ("eagle", "sglang-export", ["eagle"])


def test_an_edited_eagle1_export_with_a_nonzero_fc_bias_is_refused_on_the_way_back(eagle1, tmp_path):
    from safetensors.torch import save_file

    from specfmt.errors import ConversionError

    out = export(str(eagle1), tmp_path / "sglang").out
    t = _tensors(out)
    t["fc.bias"] = torch.ones_like(t["fc.bias"])
    save_file(t, str(out / "model.safetensors"))
    with pytest.raises(ConversionError, match="fc.bias is not all zeros"):
        convert("auto", str(out), tmp_path / "back", str(VERIFIER))


def test_an_eagle1_copy_of_the_verifiers_embedding_rounded_to_float16_is_refused(tmp_path):
    """The world's own copy is the float32 verifier's rounded to float16; SGLang's set_embed_and_head would give the draft the
    verifier's own values, which the draft does not compute with."""
    convert("eagle", str(VERIFIER.parent / "eagle-safeailab"), tmp_path / "d", str(VERIFIER))
    e = _refusal(tmp_path / "d", tmp_path)
    assert e.reason == "own_embedding" and "float16" in e.message


def test_eagle1_drafts_sglang_runs_otherwise_are_refused_by_reason(eagle1, tmp_path):
    assert _refusal(eagle1_variant(eagle1, tmp_path / "mlp", mlp_bias=True), tmp_path).reason == "bias"
    sliding = eagle1_variant(eagle1, tmp_path / "sw", layer_types=["sliding_attention"], sliding_window=64, use_sliding_window=True)
    assert _refusal(sliding, tmp_path).reason == "sliding_window"


@pytest.mark.parametrize("arch,reason", [("MiMoV2FlashForCausalLM", "verifier_state"), ("Step3p5ForCausalLM", "verifier_state"),
                                         ("FalconForCausalLM", "verifier")])
def test_an_eagle1_verifier_whose_class_feeds_another_state_or_was_not_read_is_refused(eagle1, arch, reason):
    """SGLang's EAGLE worker feeds the draft what the verifier class hands its logits processor: those two pass the state
    before the final norm (hidden_states_before_norm); an EAGLE-1 draft reads it after the norm."""
    from specfmt.algorithms.eagle import EagleConfig

    with pytest.raises(ExportRefusal) as e:
        get("eagle")._sglang_refusals(EagleConfig.of(json.loads((eagle1 / "config.json").read_text())), _info(arch))
    assert e.value.reason == reason


def test_the_eagle1_serve_line_names_eagle_the_export_and_the_steps(eagle1, tmp_path):
    out = export(str(eagle1), tmp_path / "sglang").out
    argv = list(sglang_serve_command(json.loads((out / "config.json").read_text()), str(out)).argv)
    flag = lambda f: argv[argv.index(f) + 1]  # noqa: E731
    assert flag("--speculative-algorithm") == "EAGLE" and (flag("--speculative-num-steps"), flag("--speculative-num-draft-tokens")) == ("3", "4")


def test_dry_run_names_the_tensor_made_for_sglang(eagle1):
    r = runner.invoke(app, ["export", str(eagle1), "--to", "sglang", "--dry-run"])
    assert r.exit_code == 0 and "(made) -> fc.bias" in r.output


# --------------------------------------------------------------------------- the DFLASH family (DFlashDraftModel, DFlash2DraftModel, DSparkDraftModel)


@pytest.fixture(scope="module")
def dflash(tmp_path_factory) -> Path:
    return world_dflash(tmp_path_factory.mktemp("dflash") / "dflash")


DFLASH2 = {"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 16, "selector_top_k": 8}
DSPARK = {"markov_rank": 16, "markov_head_type": "vanilla", "enable_confidence_head": True, "confidence_head_with_markov": True}


@pytest.fixture(scope="module")
def blocks(dflash, tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """Each DFLASH-family draft the tests export, and its export: ``{case: (draft, export)}``."""
    tmp = tmp_path_factory.mktemp("blocks")
    drafts = {"dflash": dflash,
              "two_layers": dflash_variant(dflash, tmp / "two", tlc={"num_hidden_layers": 2, "layer_types": ["full_attention"] * 2}),
              "dflash2": dflash_variant(dflash, tmp / "d2", "dflash2", **DFLASH2),
              "dspark": dflash_variant(dflash, tmp / "ds", "dspark", k=4, sample_from_anchor=True, **DSPARK),
              "dspark-bonus": dflash_variant(dflash, tmp / "dsb", "dspark", sample_from_anchor=False,
                                             **{**DSPARK, "enable_confidence_head": False, "confidence_head_with_markov": False})}
    return {case: (draft, export(str(draft), tmp / f"{case}-sglang").out) for case, draft in drafts.items()}


def test_the_world_dflash_draft_is_written_as_sglangs_dflash_class_reads_it(dflash, tmp_path):
    out = export(str(dflash), tmp_path / "sglang").out
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["model_type"] == "qwen3" and cfg["num_target_layers"] == 8
    assert cfg["dflash_config"] == {"block_size": 4, "mask_token_id": 2, "target_layer_ids": [1, 3, 5]}  # taps [2, 4, 6]: layer outputs
    assert set(_tensors(out)) == set(_tensors(dflash)) and cfg["specfmt_export"]["speculative_algorithm"] == "DFLASH"


@pytest.mark.parametrize("case", ["dflash", "two_layers", "dflash2", "dspark", "dspark-bonus"])
def test_every_block_draft_sglang_runs_comes_back_tensor_for_tensor(blocks, tmp_path, case):
    draft, exported = blocks[case]
    a, b = _round_trip(draft, tmp_path, QWEN3_VERIFIER, exported)
    assert a == b


@pytest.mark.parametrize("case,fields,top", [("dflash2", DFLASH2, {}),
                                             ("dspark", {"block_size": 4}, {**DSPARK, "sample_from_anchor": True}),
                                             ("dspark-bonus", {"block_size": 3}, {"sample_from_anchor": False, "markov_rank": 16})])
def test_each_variants_fields_are_written_where_sglang_reads_them(blocks, case, fields, top):
    """DFlash2's four fields inside dflash_config (parse_dflash_draft_config reads them nowhere else); DSpark's heads' fields and
    sample_from_anchor at the top level (build_markov_head, get_dspark_sample_from_anchor), and its block_size as SGLang's
    gamma: the tokens a block proposes (4 from the anchor's block of 4; 3 from a block of 4 without)."""
    cfg = json.loads((blocks[case][1] / "config.json").read_text())
    assert fields.items() <= cfg["dflash_config"].items() and top.items() <= cfg.items()


@pytest.mark.parametrize("case,k,line", [("dflash", 3, ("DFLASH", "4")), ("dflash2", 3, ("DFLASH", "4")), ("dspark", 4, ("DSPARK", "5")),
                                         ("dspark-bonus", 3, ("DSPARK", "4"))])
def test_the_block_serve_line_names_the_algorithm_and_the_verify_window(blocks, case, k, line):
    """DFLASH: --speculative-num-draft-tokens is the block (k + 1); DSPARK: gamma + 1 = k + 1, which its hook requires."""
    out = blocks[case][1]
    cfg = json.loads((out / "config.json").read_text())
    argv = list(sglang_serve_command(cfg, str(out)).argv)
    flag = lambda f: argv[argv.index(f) + 1]  # noqa: E731
    assert cfg["specfmt_export"]["speculative_tokens"] == k
    assert (flag("--speculative-algorithm"), flag("--speculative-num-draft-tokens")) == line
    assert flag("--model-path") == str(QWEN3_VERIFIER.resolve()) and "--speculative-num-steps" not in argv


def _refused_block(draft: Path, tmp: Path, verifier: str | None = None) -> str:
    return _refusal(draft, tmp, verifier).reason


def test_block_drafts_sglang_runs_otherwise_are_refused_by_reason(dflash, tmp_path):
    """Each rule of DFlashSGLang._sglang_refusals, by its reason."""
    v = lambda name, algo="dflash", **kw: dflash_variant(dflash, tmp_path / name, algo, **kw)  # noqa: E731
    V, H = 2048, 128
    d2t = {"d2t": torch.zeros(1024, dtype=torch.long), "t2d": torch.arange(V) < 1024}
    assert _refused_block(v("vocab", draft_vocab_size=1024, tensors=d2t), tmp_path) == "draft_vocab"
    assert _refused_block(v("head", tensors={"lm_head.weight": torch.randn(V, H)}), tmp_path) == "own_lm_head"
    assert _refused_block(v("embed", tensors={"embed_tokens.weight": torch.randn(V, H)}), tmp_path) == "own_embedding"
    assert _refused_block(v("anchor", k=4, sample_from_anchor=True), tmp_path) == "sample_from_anchor"
    assert _refused_block(v("sw", tlc={"layer_types": ["sliding_attention"], "sliding_window": 8, "use_sliding_window": True},
                            sliding_window_non_causal=True), tmp_path) == "sliding_window"
    assert _refused_block(v("bias", tlc={"attention_bias": True}), tmp_path) == "bias"
    assert _refused_block(v("act", tlc={"hidden_act": "gelu"}), tmp_path) == "activation"
    wide = v("wide", target_hidden_size=256, tensors={"fc.weight": torch.randn(H, 3 * 256), "embed_tokens.weight": torch.randn(V, H)})
    assert _refused_block(wide, tmp_path) == "target_hidden_size"
    ds = v("dspark-vocab", "dspark", draft_vocab_size=1024, tensors=d2t, k=4, sample_from_anchor=True, **DSPARK)
    assert _refused_block(ds, tmp_path) == "draft_vocab"


def test_a_qwen2_verifier_is_refused_for_a_block_draft(dflash):
    """Qwen2ForCausalLM has no set_dflash_layers_to_capture in SGLang 0.5.23: the DFLASH worker cannot tap it."""
    from specfmt.algorithms.dflash import DFlashConfig

    cfg = json.loads((dflash / "config.json").read_text())
    with pytest.raises(ExportRefusal) as e:
        get("dflash")._sglang_refusals(DFlashConfig.of(cfg), {}, _info("Qwen2ForCausalLM"))
    assert e.value.reason == "verifier"


def test_the_dspark_export_reads_back_as_dspark_and_dflash2_as_dflash2(blocks):
    """Both are DFlash's (z-lab's) layout too; the more specific converter's sglang-export layout wins."""
    from specfmt.detect import detect

    for case, fmt in (("dflash2", "dflash2"), ("dspark", "dspark"), ("dflash", "dflash")):
        found = detect(blocks[case][1])
        assert (found.format, found.layout) == (fmt, "sglang-export"), case
