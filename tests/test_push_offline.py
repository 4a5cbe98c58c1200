"""Honest cards and an offline ``push --dry-run`` (issue 35, item 7). No Hub: the tests run offline (conftest)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import WORLD
from specfmt.checkpoint.files import weight_file_digests
from specfmt.cli import app
from specfmt.convert import convert

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> Path:
    """The example draft (its verifier a local folder) with a passed validation.json for its files, measured with the
    tiny local verifier (written here, not run: its figures are what a run writes)."""
    out = tmp_path_factory.mktemp("card") / "draft"
    convert("eagle3", str(WORLD / "eagle3-safeailab"), out, str(WORLD / "verifier"))
    figures = {"num_drafts": 230, "num_draft_tokens": 690, "num_accepted_tokens": 281, "accepted_per_position": [147, 82, 52],
               "acceptance_rate_per_position": [0.639, 0.356, 0.226], "mean_acceptance_length": 2.222, "dtype": "float32"}
    (out / "validation.json").write_text(json.dumps({
        "specfmt_version": "0.1.0", "date": "2026-01-01T00:00:00+00:00", "checkpoint": str(out), "verifier": str((WORLD / "verifier").resolve()),
        "passed": True, "num_speculative_tokens": 3, "max_tokens": 32, "prompts": {"source": "prompts.jsonl", "count": 16, "tokens": 400, "digest": "sha256:x"},
        "reference": figures, "vllm": None, "variants": [], "likely_causes": [], "kept": {}, "checks": [], "files": weight_file_digests(out)}))
    return out


def _push(*args: str):
    r = CliRunner().invoke(app, ["push", *args, "--dry-run", "--json"], env={"HF_HUB_OFFLINE": "1"})
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    return r.exit_code, json.loads(r.stdout)


def test_dry_run_works_offline_and_says_what_it_could_not_check(measured):
    """Item 7: without --no-validate, `push --dry-run --verifier-id ID` failed offline (the verifier check could not
    reach ID) with a hint to run `specfmt validate FOLDER`, which passes. Now the plan is made; the check it could not
    make is listed with why, and the draft is checked against the verifier its config names instead."""
    code, plan = _push(str(measured), "--repo-id", "me/draft", "--verifier-id", LLAMA)
    assert code == 0 and plan["ok"] and plan["error"] is None, plan
    not_checked = {n["check"]: n["why"] for n in plan["not_checked"]}
    assert LLAMA in not_checked["verifier"] and "cannot be reached" in not_checked["verifier"], not_checked
    checks = {c["name"]: c["status"] for c in plan["checks"]}
    assert checks["verifier"] == "pass"  # against the local verifier config.json names
    assert any("not checked" in line for line in plan["remote"])  # the Hub side, offline: said, not raised


@pytest.mark.parametrize("validate", [True, False])
def test_the_card_names_the_verifier_its_figures_were_measured_with(measured, validate):
    """Item 7: with --verifier-id the card showed acceptance measured on the tiny local verifier under
    `base_model: meta-llama/Llama-3.1-8B-Instruct`, with no caveat (with --no-validate too)."""
    code, plan = _push(str(measured), "--repo-id", "me/draft", "--verifier-id", LLAMA, *([] if validate else ["--no-validate"]))
    assert code == 0, plan
    card = plan["card"]
    assert f"base_model: {LLAMA}" in card and "**2.222**" in card
    acceptance = card[card.index("## Acceptance"):card.index("## Provenance")]
    assert "**Measured with another verifier than this card's base model**: a local folder `verifier`" in acceptance, acceptance
    assert acceptance.index("another verifier") < acceptance.index("**2.222**")


def test_figures_measured_with_the_base_model_say_so(measured, tmp_path):
    import shutil

    d = tmp_path / "draft"
    shutil.copytree(measured, d)
    v = json.loads((d / "validation.json").read_text())
    (d / "validation.json").write_text(json.dumps({**v, "verifier": LLAMA}))
    code, plan = _push(str(d), "--repo-id", "me/draft", "--verifier-id", LLAMA, "--no-validate")
    assert code == 0 and f"Measured with this card's base model, [{LLAMA}]" in plan["card"]
