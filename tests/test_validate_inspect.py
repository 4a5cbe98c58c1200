"""`specfmt validate` (static), `specfmt inspect`, the schema and the CLI's error contract."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from builders import eagle3_tensors, write_safeailab, write_specforge, write_verifier
from conftest import run_cli
from specfmt.convert import convert
from specfmt.detect import detect
from specfmt.errors import ConfigSchemaError, VersionError
from specfmt.algorithms import schema_violations, validate_config
from specfmt.format.versions import check_speculators_version
from specfmt.validation.static import validate_static




@pytest.fixture
def good(tmp_path) -> Path:
    v = write_verifier(tmp_path / "verifier")
    convert("eagle3", str(write_safeailab(tmp_path / "src")), tmp_path / "good", str(v))
    return tmp_path / "good"


def rewrite(folder: Path, edit_cfg=None, edit_tensors=None) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    if edit_cfg:
        edit_cfg(cfg)
        (folder / "config.json").write_text(json.dumps(cfg))
    if edit_tensors:
        with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
            sd = {k: f.get_tensor(k) for k in f.keys()}
        edit_tensors(sd)
        save_file(sd, str(folder / "model.safetensors"), metadata={"format": "pt"})


def statuses(rep) -> dict[str, str]:
    return {c.name: c.status for c in rep.checks}


def test_good_checkpoint_passes_every_check(good):
    rep = validate_static(good)
    assert rep.ok and set(statuses(rep).values()) == {"pass"}
    assert [c.name for c in rep.checks] == ["config", "schema", "version", "weights", "tensors", "dtypes", "finite", "vocab_map", "verifier", "serving"]


@pytest.mark.parametrize(
    "name, edit_cfg, edit_tensors, failing, text",
    [
        ("missing tensor", None, lambda sd: sd.pop("layers.0.hidden_norm.weight"), "tensors", "missing: layers.0.hidden_norm.weight"),
        ("extra tensor", None, lambda sd: sd.update({"layers.0.bogus.weight": torch.zeros(2, dtype=torch.float16)}), "tensors", "unexpected: layers.0.bogus.weight"),
        ("shape", None, lambda sd: sd.update({"norm.weight": torch.ones(63, dtype=torch.float16)}), "tensors", "norm.weight: [63], expected [64]"),
        ("nan", None, lambda sd: sd["fc.weight"].__setitem__((0, 0), float("inf")), "finite", "fc.weight: 1 NaN/Inf"),
        ("dtype mix", None, lambda sd: sd.update({"norm.weight": sd["norm.weight"].float()}), "dtypes", "mix dtypes"),
        ("d2t absolute ids", None, lambda sd: sd.update({"d2t": sd["d2t"] + torch.arange(128)}), "vocab_map", "outside the verifier vocabulary"),
        ("d2t not increasing", None, lambda sd: sd["d2t"].__setitem__(1, sd["d2t"][0] - 1), "vocab_map", "strictly increasing"),
        ("d2t outside vocab", None, lambda sd: sd["d2t"].__setitem__(127, 10_000), "vocab_map", "outside the verifier vocabulary"),
        ("t2d count", None, lambda sd: sd["t2d"].__setitem__(sd["t2d"].nonzero()[0, 0], False), "vocab_map", "marks 127 target ids"),
        ("tap out of range", lambda c: c.update(eagle_aux_hidden_state_layer_ids=[2, 4, 9]), None, "verifier", "tap layers [9]"),
        ("vocab vs verifier", lambda c: c["transformer_layer_config"].update(vocab_size=300), None, "tensors", "t2d"),
        ("model_type present", lambda c: c.update(model_type="llama"), None, "schema", "without a top-level model_type"),
        ("relative verifier", lambda c: c["speculators_config"]["verifier"].update(name_or_path="../verifier"), None, "schema", "name_or_path"),
        ("no norm_before_residual", lambda c: c.pop("norm_before_residual"), None, "schema", "'norm_before_residual' is a required property"),
        ("newer version", lambda c: c.update(speculators_version="7.0.0"), None, "version", "newer than this specfmt"),
    ],
)
def test_broken_checkpoints_fail_the_right_check(good, name, edit_cfg, edit_tensors, failing, text):
    rewrite(good, edit_cfg, edit_tensors)
    rep = validate_static(good)
    assert not rep.ok
    check = next(c for c in rep.checks if c.name == failing)
    assert check.status == "fail", (name, check)
    assert text in check.summary + " ".join(check.details), (name, check)


def test_older_version_is_recognised_as_warning(good):
    rewrite(good, lambda c: c.update(speculators_version="0.1.0.dev14"))
    rep = validate_static(good)
    assert statuses(rep)["version"] == "warn" and rep.ok


def test_schema_reports_json_paths():
    cfg = {"speculators_model_type": "eagle3", "speculators_version": "0.9.0", "transformer_layer_config": {"model_type": "llama"},
           "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy", "verifier": {"name_or_path": "a/b", "architectures": ["X"]},
                                  "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 0}]}}
    paths = {p for p, _ in schema_violations(cfg)}
    assert "$.speculators_config.proposal_methods[0].speculative_tokens" in paths
    assert "$.transformer_layer_config" in paths  # required sizes missing
    assert "$" in paths  # eagle3 fields missing
    with pytest.raises(ConfigSchemaError) as e:
        validate_config(cfg, "x/config.json")
    assert len(e.value.violations) == len(schema_violations(cfg))


def test_version_check():
    assert check_speculators_version("0.9.0").status == "current"
    assert check_speculators_version("0.9.1").status == "current"
    assert check_speculators_version("0.8.0.dev0").status == "older"
    assert check_speculators_version("0.1.0.dev14").status == "older"
    assert check_speculators_version("1.0.0").status == "newer"
    with pytest.raises(VersionError):
        check_speculators_version("not a version")
    with pytest.raises(VersionError):
        check_speculators_version(9)


def test_validate_cli_table_json_and_exit_codes(good):
    r = run_cli("validate", str(good))
    assert r.returncode == 0 and "all checks passed" in r.stdout
    r = run_cli("validate", str(good), "--json")
    data = json.loads(r.stdout)
    assert data["ok"] is True and len(data["checks"]) == 10  # the nine static checks and serving (issue 17)
    rewrite(good, edit_tensors=lambda sd: sd.pop("lm_head.weight"))
    r = run_cli("validate", str(good), "--json")
    assert r.returncode == 1 and json.loads(r.stdout)["ok"] is False
    r = run_cli("validate", str(good.parent / "nope"))
    assert r.returncode == 2 and r.stderr.startswith("specfmt: error:") and "Traceback" not in r.stderr


def test_validate_with_explicit_unreachable_verifier_fails(good, tmp_path):
    rep = validate_static(good, verifier=str(tmp_path / "missing-verifier"))
    assert statuses(rep)["verifier"] == "fail"
    rewrite(good, lambda c: c["speculators_config"]["verifier"].update(name_or_path="/nonexistent/verifier"))
    assert statuses(validate_static(good))["verifier"] == "skip"


def test_truncated_safetensors_is_a_clear_failure(good):
    data = (good / "model.safetensors").read_bytes()
    (good / "model.safetensors").write_bytes(data[: len(data) // 2])
    rep = validate_static(good)
    assert statuses(rep)["weights"] == "fail" and "not a valid safetensors file" in next(c.summary for c in rep.checks if c.name == "weights")


# --------------------------------------------------------------------------- inspect


def test_inspect_detects_layouts_from_tensors_not_architectures(tmp_path, good):
    sa = write_safeailab(tmp_path / "sa")
    sf = write_specforge(tmp_path / "sf", shards=2)
    # same tensors, misleading architectures: detection must not care
    cfg = json.loads((sa / "config.json").read_text())
    cfg["architectures"] = ["MedusaModel"]
    (sa / "config.json").write_text(json.dumps(cfg))
    assert (detect(sa).format, detect(sa).layout) == ("eagle3", "safeailab")
    assert (detect(sf).format, detect(sf).layout) == ("eagle3", "specforge")
    assert detect(good).format == "specfmt"

    eagle1 = tmp_path / "eagle1"
    eagle1.mkdir()
    save_file({"fc.weight": torch.zeros(8, 16), "fc.bias": torch.zeros(8), "layers.0.self_attn.q_proj.weight": torch.zeros(8, 8)}, str(eagle1 / "model.safetensors"))
    assert detect(eagle1).format == "eagle"

    medusa = tmp_path / "medusa"
    medusa.mkdir()
    torch.save({"0.0.linear.weight": torch.zeros(4, 4), "0.0.linear.bias": torch.zeros(4), "0.1.weight": torch.zeros(10, 4), "1.0.linear.weight": torch.zeros(4, 4)}, medusa / "medusa_lm_head.pt")
    d = detect(medusa)
    assert d.format == "medusa" and d.summary["heads"] == 2

    r = run_cli("inspect", str(sa))
    assert r.returncode == 0 and "eagle3" in r.stdout and "specfmt convert --from eagle3" in r.stdout


def test_cli_user_error_is_one_line_without_traceback(tmp_path):
    write_verifier(tmp_path / "v")
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text("{not json")
    torch.save(eagle3_tensors(), src / "pytorch_model.bin")
    r = run_cli("convert", "--from", "eagle3", str(src), "-o", str(tmp_path / "out"), "--verifier", str(tmp_path / "v"))
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "invalid JSON at line 1" in r.stderr and "config.json" in r.stderr
    r = run_cli("convert", "--from", "medusa9", str(src), "-o", str(tmp_path / "out"), "--verifier", str(tmp_path / "v"))
    assert r.returncode == 2 and "unknown source format 'medusa9'" in r.stderr and "eagle3" in r.stderr
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- eagle (EAGLE-1) branch of the format


@pytest.fixture
def eagle_out(tmp_path):
    from builders import write_eagle1

    v = write_verifier(tmp_path / "verifier")
    convert("eagle", str(write_eagle1(tmp_path / "src")), tmp_path / "out", str(v))
    return tmp_path / "out"


@pytest.mark.parametrize(
    "edit,path,text",
    [
        (lambda c: c.update(bias=True), "$", "attention_bias"),  # vLLM PR #9580
        (lambda c: c.pop("model_type"), "$", "model_type"),
        (lambda c: c.update(architectures=["LlamaForCausalLM"]), "$.architectures", ""),
        (lambda c: c["transformer_layer_config"].update(hidden_size=32), "$.transformer_layer_config.hidden_size", "differs from the top-level"),
    ],
)
def test_eagle_branch_rules(eagle_out, edit, path, text):
    cfg = json.loads((eagle_out / "config.json").read_text())
    assert schema_violations(cfg) == []
    edit(cfg)
    found = schema_violations(cfg)
    assert any(p == path and text in m for p, m in found), found


def test_eagle_output_with_a_leftover_fc_bias_fails_the_tensor_check(eagle_out):
    with safe_open(str(eagle_out / "model.safetensors"), framework="pt") as f:
        sd = {k: f.get_tensor(k) for k in f.keys()}
    sd["fc.bias"] = torch.zeros(64, dtype=torch.float16)  # vLLM's fc has no bias: silently dropped there
    save_file(sd, str(eagle_out / "model.safetensors"))
    rep = validate_static(eagle_out)
    tensors = next(c for c in rep.checks if c.name == "tensors")
    assert tensors.status == "fail" and "unexpected: fc.bias" in tensors.details


def test_medusa_branch_rules():
    cfg = {
        "speculators_model_type": "medusa", "speculators_version": "0.9.0", "model_type": "medusa", "architectures": ["MedusaModel"],
        "speculators_config": {"algorithm": "medusa", "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                               "default_proposal_method": "greedy", "verifier": {"name_or_path": "org/model", "architectures": ["LlamaForCausalLM"]}},
        "hidden_size": 64, "vocab_size": 256, "num_heads": 3, "num_hidden_layers": 1, "medusa_fc_bias": True,
        "original_lm_head": False, "truncated_vocab_size": 256,
        "transformer_layer_config": {"model_type": "medusa", "hidden_size": 64, "vocab_size": 256, "num_heads": 3, "num_hidden_layers": 1},
    }
    assert schema_violations(cfg) == []
    bad = json.loads(json.dumps(cfg))
    bad["speculators_config"]["proposal_methods"][0]["speculative_tokens"] = 5
    bad["medusa_num_heads"] = 2  # vLLM's MedusaConfig would rename it onto num_heads
    found = dict(schema_violations(bad))
    assert "vLLM builds one head per speculative token" in found["$.speculators_config.proposal_methods[0].speculative_tokens"]
    assert "renames" in found["$.medusa_num_heads"]
    bad = json.loads(json.dumps(cfg))
    del bad["medusa_fc_bias"]  # vLLM's default false would drop the biases silently
    assert any("medusa_fc_bias" in m for _, m in schema_violations(bad))


def test_inspect_eagle1_candidates(tmp_path):
    from builders import write_eagle1

    with_bias = detect(write_eagle1(tmp_path / "a"))
    without = detect(write_eagle1(tmp_path / "b", fc_bias=False))
    assert with_bias.format == "eagle" and with_bias.candidates == ["eagle", "hass"]
    assert without.candidates == ["eagle"] and "--from eagle " in without.convert_hint
