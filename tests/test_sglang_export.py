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

from sglang_drafts import VERIFIER, variant, verifier_embedding, world_eagle3
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


def _round_trip(draft: Path, tmp: Path) -> tuple[dict, dict]:
    """Export ``draft``, convert the export back with ``--from auto``; both configs (provenance dropped) after
    asserting the tensors are the draft's, name for name, dtype for dtype, value for value."""
    exported = export(str(draft), tmp / "sglang").out
    back = tmp / "back"
    convert("auto", str(exported), back, str(VERIFIER))
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
