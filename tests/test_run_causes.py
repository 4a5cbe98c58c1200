"""`validate --run` names the real cause, and only what the evidence points at (issue 35, items 4 and 6).

A static failure (a truncated weight file, a NaN weight) stops the run before the verifier loads, as one line
and exit 1; a draft that fails only ``--min-acceptance-length`` is called weak, with its training log; a cause
of vLLM or of another algorithm's misreading is never listed without the evidence for it. No vLLM: the
reference run only, on a few prompts."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from conftest import WORLD, first_world_prompts, world_eagle3
from specfmt.cli import app
from specfmt.validation.run import STATIC_CAUSES, WEAK_DRAFT, describe_causes, validate_run

#: a short run: 3 held-out prompts x 8 tokens
PROMPTS, TOKENS = 3, 8
#: what the weak draft's provenance says its trainer measured
LOGGED = [0.4375, 0.1875, 0.0625]


@pytest.fixture(scope="module")
def example(tmp_path_factory) -> Path:
    return world_eagle3(tmp_path_factory.mktemp("causes"))


@pytest.fixture(scope="module")
def prompts(tmp_path_factory) -> Path:
    return first_world_prompts(tmp_path_factory.mktemp("prompts") / "three.jsonl", PROMPTS)


@pytest.fixture
def loads(monkeypatch) -> list[str]:
    """Every load of the verifier's weights, recorded (the real load still happens)."""
    from specfmt.sources.verifier import Verifier

    calls: list[str] = []
    real = Verifier.load_model

    def load_model(self, placement=None):
        calls.append("load_model")
        return real(self, placement)

    monkeypatch.setattr(Verifier, "load_model", load_model)
    return calls


def _copy(example: Path, dst: Path) -> Path:
    shutil.copytree(example, dst)
    return dst


def _status(res) -> dict[str, str]:
    return {c.name: c.status for c in res.report.checks}


def test_a_truncated_weight_file_stops_the_run_in_one_line(example, prompts, tmp_path, loads):
    """Item 4: `validate TRUNC --run --no-vllm`, model.safetensors cut in half, ended in a SafetensorError traceback
    after the verifier had loaded. Now the failed `weights` check stops the run: no traceback, exit 1, the cause named."""
    trunc = _copy(example, tmp_path / "trunc")
    weights = trunc / "model.safetensors"
    os.truncate(weights, weights.stat().st_size // 2)
    r = CliRunner().invoke(app, ["validate", str(trunc), "--run", "--no-vllm", "--prompts", str(prompts), "--max-tokens", str(TOKENS)],
                           terminal_width=200)
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)  # main: SafetensorError
    assert r.exit_code == 1, r.output
    assert "Traceback" not in r.output and "validation failed" in r.output
    assert f"likely causes: {STATIC_CAUSES['weights'][0]}" in r.output
    assert loads == []  # the verifier's weights were never read
    data = json.loads((trunc / "validation.json").read_text())
    checks = {c["name"]: c for c in data["checks"]}
    assert checks["weights"]["status"] == "fail" and checks["reference"]["status"] == "skip"
    assert "static checks failed (weights)" in checks["reference"]["summary"]
    assert data["likely_causes"] == [STATIC_CAUSES["weights"][0]] and data["reference"] is None


def test_a_nan_weight_stops_the_run_and_is_named(example, prompts, tmp_path, loads):
    """Item 6: with a NaN weight the reference ran (86 s on a real draft), reported "pass" with AL 1.000, and the
    causes listed unloaded vLLM tensors (with --no-vllm), tap ids, norm order, the vocabulary map and Qwen3's q/k
    norms for a Llama draft. Now `finite` stops the run before the verifier loads, and NaN is the one cause."""
    nan = _copy(example, tmp_path / "nan")
    t = load_file(str(nan / "model.safetensors"))
    t["fc.weight"][0, 0] = math.nan
    save_file(t, str(nan / "model.safetensors"))
    res = validate_run(nan, prompts=str(prompts), max_tokens=TOKENS, use_vllm=False, write=False)
    st = _status(res)
    assert st["finite"] == "fail" and st["reference"] == st["variants"] == st["acceptance"] == "skip"
    assert res.reference is None and loads == []
    assert res.causes == [STATIC_CAUSES["finite"][0]]
    assert describe_causes(res) == [f"NaN/Inf weights ({STATIC_CAUSES['finite'][1]})"]


def test_a_weak_draft_is_called_weak_with_its_training_log(example, prompts, tmp_path):
    """Item 6: a draft that fails only --min-acceptance-length got every cause of every reading (unloaded vLLM
    tensors with --no-vllm, tap ids, norm order, the vocabulary map, Qwen3's q/k norms for a Llama draft). Now it
    is called weak, with what its provenance says training measured, and nothing else is named."""
    weak = _copy(example, tmp_path / "weak")
    cfg = json.loads((weak / "config.json").read_text())
    cfg["specfmt"]["train"] = {"algorithm": "eagle3", "steps": 5, "top1_agreement": LOGGED}
    (weak / "config.json").write_text(json.dumps(cfg, indent=2))
    r = CliRunner().invoke(app, ["validate", str(weak), "--run", "--no-vllm", "--prompts", str(prompts), "--max-tokens", str(TOKENS),
                                 "--min-acceptance-length", "3.5"], terminal_width=400)
    assert r.exit_code == 1, r.output
    data = json.loads((weak / "validation.json").read_text())
    checks = {c["name"]: c["status"] for c in data["checks"]}
    assert checks["variants"] == "pass" and checks["acceptance"] == "fail", checks
    assert data["likely_causes"] == [*WEAK_DRAFT]
    line = next(li for li in r.output.splitlines() if li.startswith("likely causes:"))
    assert line.startswith("likely causes: weak draft (") and "< 3.5" in line
    assert "training log (5 steps): training top-1 agreement 0.438 / 0.188 / 0.062" in line
    for other in ("unloaded tensors", "tap ids", "norm order", "vocab mapping", "q/k norms", "mask token"):
        assert other not in line, line


def test_a_weak_draft_without_a_training_log_says_so():
    from specfmt.validation.report import FAIL, PASS, Report
    from specfmt.validation.run import RunResult

    rep = Report("x")
    for name in ("reference", "variants"):
        rep.add(name, PASS, "")
    rep.add("acceptance", FAIL, "mean acceptance length 2.100 < 3.5")
    res = RunResult(rep, k=3, max_tokens=8, causes=[*WEAK_DRAFT], diagnosis={"training_log": [], "training_steps": None})
    assert describe_causes(res) == [f"weak draft ({WEAK_DRAFT['weak draft']}): mean acceptance length 2.100 < 3.5; "
                                    "its provenance records no training figures"]


def test_a_failure_nothing_points_at_names_no_cause(example, tmp_path):
    """The reference cannot run (the verifier's weights are gone): the run fails, and no cause is invented for it."""
    folder = _copy(example, tmp_path / "draft")
    ver = shutil.copytree(WORLD / "verifier", tmp_path / "verifier")
    (ver / "model.safetensors").unlink()
    res = validate_run(folder, verifier=str(ver), use_vllm=False, write=False)
    st = _status(res)
    assert st["reference"] == "fail" and not res.report.ok, res.report.to_json()
    assert res.causes == []


def test_a_static_failure_stops_the_run_whatever_the_check(example, tmp_path, loads):
    """Any failed static check (here `verifier`: a wider verifier) stops the run before loading, its cause named."""
    folder = _copy(example, tmp_path / "draft")
    ver = shutil.copytree(WORLD / "verifier", tmp_path / "verifier")
    c = json.loads((ver / "config.json").read_text())
    c["architectures"] = ["MistralForCausalLM"]
    (ver / "config.json").write_text(json.dumps(c))
    res = validate_run(folder, verifier=str(ver), use_vllm=False, write=False)
    st = _status(res)
    assert st["verifier"] == "fail" and st["reference"] == "skip" and loads == []
    assert res.causes == [STATIC_CAUSES["verifier"][0]]
