"""`specfmt validate --run` with vLLM: the shipped example passes with vLLM and the reference
side by side, and a tensor vLLM leaves at its initial value is found inside vLLM's worker."""

from __future__ import annotations

import json
import re

import pytest
from safetensors.torch import load_file
from typer.testing import CliRunner

from conftest import WORLD
from specfmt.cli import app
from specfmt.convert import convert
from specfmt.serving import LAUNCHERS, installed_distribution
from specfmt.validation.run import VALIDATION_FILE, validate_run
from test_validate_run import TOKENS, broken, few_prompts  # noqa: F401  (fixture)

pytestmark = pytest.mark.vllm  # needs vLLM installed: conftest fails these tests when it is not


def launcher() -> str:
    """How the installed vLLM build starts its server: `vllm serve`, or the CPU build's module with --model."""
    return " ".join(LAUNCHERS[installed_distribution()[0]])


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    out = tmp_path_factory.mktemp("vrun") / "eagle3"
    convert("eagle3", str(WORLD / "eagle3-safeailab"), out, str(WORLD / "verifier"))
    return out


def test_example_passes_with_vllm_and_reference_side_by_side(example, few_prompts):  # noqa: F811
    r = CliRunner().invoke(app, ["validate", str(example), "--run", "--prompts", str(few_prompts), "--max-tokens", str(TOKENS),
                                 "--min-acceptance-length", "1.3"], terminal_width=200)
    assert r.exit_code == 0, r.output
    assert "reference (float32)" in r.output and "vLLM (bfloat16)" in r.output and "all checks passed" in r.output
    data = json.loads((example / VALIDATION_FILE).read_text())
    st = {c["name"]: c["status"] for c in data["checks"]}
    assert all(st[n] == "pass" for n in ("reference", "variants", "vllm", "vllm_exact", "vllm_weights", "agreement", "acceptance")), st
    ref, vl = data["reference"], data["vllm"]
    assert vl["method"] == "eagle3" and vl["draft_class"] == "Eagle3LlamaForCausalLM" and vl["engine"].startswith("vllm ")
    assert vl["form"] == "auto" and vl["command"] == f"{launcher()} {example}"  # vLLM 0.32 auto-detects the local verifier
    assert vl["num_drafts"] > 0 and vl["num_draft_tokens"] == 3 * vl["num_drafts"]
    gaps = [abs(a - b) for a, b in zip(ref["acceptance_rate_per_position"], vl["acceptance_rate_per_position"])]
    assert len(gaps) == 3 and max(gaps) <= 0.1
    assert vl["mean_acceptance_length"] > 1.3 and ref["mean_acceptance_length"] > 1.3  # trained: well above 1
    # every tensor vLLM holds, read back from its engine, is the file's element by element (the verifier's embedding,
    # which vLLM shares, is the verifier's); every file tensor is held but t2d
    weights = next(c for c in data["checks"] if c["name"] == "vllm_weights")
    n = len(load_file(str(example / "model.safetensors")))
    assert re.fullmatch(rf"the \d+ tensors vLLM holds for the draft equal the file's {n - 1} element by element \(rounded to bfloat16\); "
                        r"embed_tokens shared with the verifier, equal to its own; vLLM keeps no t2d", weights["summary"]), weights["summary"]


def test_tensor_missing_from_the_file_is_found_at_its_initial_value_inside_vllm(example, few_prompts, tmp_path):  # noqa: F811
    """vLLM loads the draft without a word. The static check names the tensor and stops the run before anything
    loads (issue 35); the probe of vLLM's worker, run on the same folder, names it too."""
    from specfmt.algorithms import get
    from specfmt.sources.verifier import Verifier
    from specfmt.validation import run as vr
    from specfmt.validation.prompts import load_prompts
    from specfmt.validation.report import Report

    folder = broken(example, tmp_path, tensors=lambda t: t.pop("layers.0.post_attention_layernorm.weight"))
    res = validate_run(folder, prompts=str(few_prompts), max_tokens=TOKENS)
    st = {c.name: c for c in res.report.checks}
    assert st["tensors"].status == "fail" and st["reference"].status == st["vllm"].status == "skip"
    assert res.causes == ["unloaded tensors"] and not res.report.ok
    # what the stop spares the user: vLLM serves it silently, the missing weight at its initial value
    ver = Verifier.load(str(WORLD / "verifier"))
    result = vr.RunResult(Report(str(folder)), k=3, max_tokens=TOKENS, prompts=load_prompts(str(few_prompts), ver.tokenizer()))
    cfg = json.loads((folder / "config.json").read_text())
    vr._vllm_checks(result, get("eagle3"), cfg, str(folder), ver, 3, None, vr._load_tensors(folder), 0.1, 900)
    st = {c.name: c for c in result.report.checks}
    assert st["vllm"].status == "pass", st["vllm"].summary
    assert st["vllm_weights"].status == "fail"
    assert st["vllm_weights"].details == ["layers.0.post_attention_layernorm.weight: not in the file; vLLM keeps its initial value"]


def test_where_the_release_refuses_the_local_verifier_the_explicit_form_runs(example, few_prompts, monkeypatch):  # noqa: F811
    """vLLM 0.33 refuses `vllm serve OUT` with a local verifier; validate --run then starts the verifier with the
    draft in an explicit speculative config, which the installed release runs as well (issue 17)."""
    import specfmt.serving

    monkeypatch.setattr(specfmt.serving, "installed_vllm", lambda: "0.33.0")
    res = validate_run(example, prompts=str(few_prompts), max_tokens=TOKENS, write=False)
    st = {c.name: (c.status, c.summary) for c in res.report.checks}
    assert res.report.ok, st
    assert res.vllm["form"] == "explicit" and res.vllm["method"] == "eagle3" and "explicit form" in st["vllm"][1]
    assert res.vllm["command"].startswith(f"{launcher()} {WORLD / 'verifier'} --speculative-config ")
