"""Trained and initialised drafts in vLLM: the example world's trained EAGLE-1 and Medusa drafts
agree with the reference run, a `specfmt train --dry-run` draft is served as is, and the
training example (examples/train.sh, shown in docs/commands/train.md) runs start to finish."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from conftest import E2E_TOKENS, REPO, WORLD
from specfmt.convert import convert
from specfmt.training.loop import TrainOptions
from specfmt.training.pipeline import TrainRequest, train_draft
from specfmt.validation.run import validate_run
from specfmt.validation.vllm_run import generate
from test_validate_run import TOKENS, few_prompts  # noqa: F401  (fixture)

pytestmark = pytest.mark.vllm  # needs vLLM installed: conftest fails these tests when it is not


@pytest.mark.parametrize("name,fmt", [("eagle-safeailab", "eagle"), ("medusa-legacy", "medusa")])
def test_trained_world_drafts_agree_with_the_reference_in_vllm(tmp_path, few_prompts, name, fmt):  # noqa: F811
    out = tmp_path / fmt
    convert(fmt, str(WORLD / name), out, str(WORLD / "verifier"))
    res = validate_run(out, prompts=str(few_prompts), max_tokens=TOKENS, num_speculative_tokens=3)
    st = {c.name: (c.status, c.summary) for c in res.report.checks}
    assert res.report.ok, st
    assert res.vllm["method"] == ("eagle" if fmt == "eagle" else "medusa")
    assert res.reference["mean_acceptance_length"] > 1.2 and res.vllm["mean_acceptance_length"] > 1.2  # trained, not random


def test_dry_run_draft_is_served_by_vllm_with_no_speculative_flags(tmp_path, world_prompts, verifier_alone):
    stdlib_file = __import__("argparse").__file__
    req = TrainRequest(out=str(tmp_path / "init"), verifier=str(WORLD / "verifier"), algorithm="eagle3", data=[stdlib_file],
                       draft_vocab=1024, dry_run=True, validate=False, device="cpu")
    res = train_draft(req, TrainOptions())
    assert res.trained == [] and res.stats is None
    run = generate(str(res.out), world_prompts, max_tokens=E2E_TOKENS)
    assert run.speculative_method == "eagle3" and run.num_drafts > 0
    assert run.token_ids == verifier_alone.token_ids


def test_readme_training_example_runs_start_to_finish(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path / "train")}
    proc = subprocess.run(["bash", str(REPO / "examples" / "train.sh")], capture_output=True, text=True, env=env, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "all checks passed" in proc.stdout
    v = json.loads((tmp_path / "train" / "eagle3" / "validation.json").read_text())
    assert v["passed"] and v["vllm"]["method"] == "eagle3"
    cfg = json.loads((tmp_path / "train" / "medusa-5-heads" / "config.json").read_text())
    assert cfg["num_heads"] == 5 and cfg["specfmt"]["train"]["trained"] == [
        "blocks.3.layers.0.weight", "blocks.3.layers.0.bias", "blocks.4.layers.0.weight", "blocks.4.layers.0.bias",
        "lm_heads.3.weight", "lm_heads.4.weight"]
    cfg = json.loads((tmp_path / "train" / "eagle3-with-embed" / "config.json").read_text())
    assert cfg["specfmt"]["train"]["filled"] == {"embed_tokens.weight": "the verifier's input embedding, copied"}
