"""`validate --run`'s diagnosis (issue 27): the verifier's greedy tokens outside the draft vocabulary, acceptance per
prompt, and the training log's per-position figures beside the measured ones. One reference run (the example world's
EAGLE-3 draft with its vocabulary made to miss a token the verifier emits), no vLLM."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch
from rich.console import Console
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from conftest import WORLD
from specfmt.algorithms import get
from specfmt.algorithms.base import Variant
from specfmt.algorithms.eagle3 import vocab_map_problems
from specfmt.cli import app
from specfmt.cli.common import diagnosis_tables
from specfmt.convert import convert
from specfmt.sources.verifier import Verifier
from specfmt.validation.acceptance import greedy_path
from specfmt.validation.diagnosis import COVERAGE_HINT, hint, training_log, vocab_coverage
from specfmt.validation.run import VALIDATION_FILE, validate_run

PROMPTS, TOKENS = 3, 16
#: what the modified draft's provenance says the trainer measured per position
LOGGED = [0.625, 0.25, 0.125]


def _missing(used: list[int], greedy: Counter, vocab_size: int) -> tuple[int, int]:
    """``(X, Y)``: X the most frequent greedy token in the draft vocabulary (more frequent than any greedy token already
    outside it, so it tops the offenders once left out), Y an id outside it that the verifier never emits here."""
    inside = set(used)
    before = max((c for t, c in greedy.items() if t not in inside), default=0)
    x, count = max(((t, c) for t, c in greedy.items() if t in inside), key=lambda tc: (tc[1], -tc[0]))
    assert count > before, "the world's greedy path has no token to leave out that would top the offenders"
    y = next(t for t in range(vocab_size) if t not in inside and t not in greedy)
    return x, y


@pytest.fixture(scope="module")
def missing_one(tmp_path_factory) -> dict:
    """The shipped EAGLE-3 draft whose draft vocabulary swaps X (a token of the verifier's greedy path) for an unused
    id Y, the map kept consistent (lm_head's rows follow their ids), with a training log in its provenance; its run."""
    base = tmp_path_factory.mktemp("diag")
    convert("eagle3", str(WORLD / "eagle3-safeailab"), base / "orig", str(WORLD / "verifier"))
    prompts = base / "prompts.jsonl"
    prompts.write_text("\n".join((WORLD / "prompts.jsonl").read_text().splitlines()[:PROMPTS]) + "\n")
    # the hand count: the verifier's greedy tokens, decoded here with its own cache (not the run's code)
    ver = Verifier.load(str(WORLD / "verifier"))
    tok, model = ver.tokenizer(), ver.load_model()
    texts = [json.loads(line)["prompt"] for line in prompts.read_text().splitlines()]
    greedy = Counter(t for text in texts for t in greedy_path(model, tok.encode(text), TOKENS)[0][:TOKENS])
    t = load_file(str(base / "orig" / "model.safetensors"))
    used = (torch.arange(t["d2t"].numel()) + t["d2t"]).tolist()
    x, y = _missing(used, greedy, t["t2d"].numel())
    new = sorted(set(used) - {x} | {y})
    rows = {i: t["lm_head.weight"][n] for n, i in enumerate(used)}
    rows[y] = rows.pop(x)
    t["lm_head.weight"] = torch.stack([rows[i] for i in new])
    t["d2t"] = torch.tensor(new, dtype=torch.int64) - torch.arange(len(new))
    t["t2d"] = torch.zeros_like(t["t2d"])
    t["t2d"][new] = True
    assert not vocab_map_problems(t["d2t"], t["t2d"], 2048, 1024)
    folder = base / "missing"
    folder.mkdir()
    cfg = json.loads((base / "orig" / "config.json").read_text())
    cfg["specfmt"]["train"] = {"top1_agreement": LOGGED}
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    save_file(t, str(folder / "model.safetensors"))
    with pytest.MonkeyPatch.context() as mp:  # the diagnosis reads the draft as written: its misreadings are not simulated
        mp.setattr(type(get("eagle3")), "readings", lambda self, cfg, n: [Variant(None, "as written", cfg)])
        res = validate_run(folder, verifier=ver, prompts=str(prompts), max_tokens=TOKENS, use_vllm=False)
    return {"res": res, "x": x, "text": tok.decode([x]), "greedy": greedy, "new": set(new), "folder": folder, "decode": lambda i: tok.decode([i])}


def test_a_token_left_out_of_the_draft_vocabulary_is_counted_and_tops_the_offenders(missing_one):
    res, greedy, new = missing_one["res"], missing_one["greedy"], missing_one["new"]
    assert res.report.ok, res.report.to_json()
    cov = res.diagnosis["vocab_coverage"]
    outside = sum(c for t, c in greedy.items() if t not in new)
    assert cov["tokens"] == PROMPTS * TOKENS == sum(greedy.values())
    assert cov["outside"] == outside and cov["share_outside"] == round(outside / (PROMPTS * TOKENS), 4)
    assert cov["draft_vocab_size"] == 1024 and cov["vocab_size"] == 2048
    top = cov["offenders"][0]
    assert (top["id"], top["text"], top["count"]) == (missing_one["x"], missing_one["text"], greedy[missing_one["x"]])
    # the whole list, from the hand count: every greedy token outside the new vocabulary, most frequent first (ties: lower id)
    missed = sorted(((t, c) for t, c in greedy.items() if t not in new), key=lambda tc: (-tc[1], tc[0]))[:10]
    assert cov["offenders"] == [{"id": t, "text": missing_one["decode"](t), "count": c} for t, c in missed] and missed
    # this case shows the hint: more than COVERAGE_HINT of the greedy tokens are outside (here 5 of 48, 10.4 %)
    assert outside / (PROMPTS * TOKENS) > COVERAGE_HINT
    assert res.diagnosis["hint"].startswith(f"the draft vocabulary misses {100 * outside / (PROMPTS * TOKENS):.1f} % of the verifier's greedy tokens")


def test_per_prompt_figures_sum_to_the_run_and_are_written(missing_one):
    res = missing_one["res"]
    per = res.diagnosis["per_prompt"]
    assert [p["index"] for p in per] == list(range(PROMPTS))
    assert sum(p["drafts"] for p in per) == res.reference["num_drafts"]
    assert sum(p["accepted"] for p in per) == res.reference["num_accepted_tokens"]
    assert all(p["mean_acceptance_length"] == round(1 + p["accepted"] / p["drafts"], 4) for p in per)
    assert per[0]["prompt"] == res.prompts.texts[0][:60]
    assert sum(p["outside"] for p in per) == res.diagnosis["vocab_coverage"]["outside"]
    written = json.loads((missing_one["folder"] / VALIDATION_FILE).read_text())
    assert written["diagnosis"] == json.loads(json.dumps(res.diagnosis))


def test_the_training_log_is_shown_beside_the_measured_acceptance(missing_one):
    res = missing_one["res"]
    assert res.diagnosis["training_log"] == [{"key": "specfmt.train.top1_agreement", "label": "training top-1 agreement", "per_position": LOGGED}]
    console = Console(width=200, record=True)
    for shown in diagnosis_tables(res):
        console.print(shown)
    text = console.export_text()
    rates = res.reference["acceptance_rate_per_position"]
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in text.splitlines() if line.count("│") == 4]
    for i, (rate, logged) in enumerate(zip(rates, LOGGED)):
        assert [str(i + 1), f"{rate:.3f}", f"{logged:.3f}"] in rows, text
    assert repr(missing_one["text"]) in text and "lowest acceptance" in text


def test_training_log_reads_documented_keys_only_and_shows_n_a_without_them():
    assert training_log({"specfmt": {"source": {}}}) == []
    assert training_log({"specfmt": {"train": {"top1_agreement": None}}}) == []
    assert training_log({"specfmt": {"train": {"top1_agreement": ["x"], "accuracy": [0.5]}}}) == []
    assert training_log({}) == []
    # what specfmt train writes (docs/format.md): the all-position and in-vocabulary figures, and the kept checkpoint's held-out ones
    train = {"top1_agreement": [0.5, 0.25], "top1_agreement_conditional": [0.6, 0.3], "heldout": {"kept": {"top1_agreement": [0.4, 0.2]}}}
    assert [(r["key"], r["per_position"]) for r in training_log({"specfmt": {"train": train}})] == [
        ("specfmt.train.top1_agreement", [0.5, 0.25]), ("specfmt.train.top1_agreement_conditional", [0.6, 0.3]),
        ("specfmt.train.heldout.kept.top1_agreement", [0.4, 0.2])]


def test_a_draft_over_the_whole_vocabulary_reports_no_coverage_loss():
    eagle1 = get("eagle")
    assert eagle1.proposable_ids({}, {}) is None
    eagle3 = get("eagle3")
    full = {"draft_vocab_size": 2048, "transformer_layer_config": {"vocab_size": 2048}}
    assert eagle3.proposable_ids(full, {}) is None
    cov = vocab_coverage([[5, 7, 7], [2047]], None, 2048, decode=str)
    assert cov == {"draft_vocab_size": 2048, "vocab_size": 2048, "tokens": 4, "outside": 0, "share_outside": 0.0, "offenders": []}
    assert hint(cov) is None
    part = vocab_coverage([[5, 7, 7], [2047]], [5, 2047], 2048)
    assert (part["outside"], part["share_outside"], part["offenders"]) == (2, 0.5, [{"id": 7, "text": None, "count": 2}])
    assert "--vocab-from verifier" in hint(part)


def test_cli_prints_the_diagnosis_and_n_a_for_a_draft_without_a_training_log(missing_one, tmp_path):
    folder = tmp_path / "nolog"
    folder.mkdir()
    cfg = json.loads((missing_one["folder"] / "config.json").read_text())
    del cfg["specfmt"]["train"]
    (folder / "config.json").write_text(json.dumps(cfg))
    (folder / "model.safetensors").write_bytes((missing_one["folder"] / "model.safetensors").read_bytes())
    prompts = tmp_path / "one.jsonl"
    prompts.write_text((WORLD / "prompts.jsonl").read_text().splitlines()[0] + "\n")
    r = CliRunner().invoke(app, ["validate", str(folder), "--run", "--no-vllm", "--prompts", str(prompts), "--max-tokens", "8"], terminal_width=200)
    assert r.exit_code == 0, r.output
    assert "n/a" in r.output and "greedy tokens" in r.output and "lowest acceptance" in r.output
