"""The bookkeeping of ``benchmarks/trainer_vs_speculators.py`` that decides whether its comparison is fair: both
trainers must take the same draft vocabulary from the one ``token_freq.pt``, and speculators' step times must be read
from its log. The benchmark itself (minutes per run) is not a test."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import trainer_vs_speculators as bench  # noqa: E402

from specfmt.algorithms.eagle3 import vocab_map  # noqa: E402


def test_the_written_counts_give_specfmt_the_vocabulary_speculators_builds(tmp_path):
    """Ties: speculators takes the lower id (``build_vocab_mappings_from_distribution`` sorts by (-count, id)); specfmt
    keeps the dict's order, so the harness writes the counts in speculators' order and both pick ids 1 and 3 of the
    tied 5, 1, 3; zero counts fill the rest from id 0 up, as speculators fills."""
    counts = {5: 3, 1: 3, 7: 9, 2: 0, 3: 3, 0: 0, 4: 1, 6: 0}
    assert vocab_map(counts, 8, 3)[1].nonzero().flatten().tolist() == [1, 5, 7]  # as read, specfmt would take 5 and 1
    torch.save(bench.ordered_counts(counts), tmp_path / "token_freq.pt")
    for vd, ids in ((3, [1, 3, 7]), (6, [0, 1, 3, 4, 5, 7])):
        d2t, used = bench.expected_vocab(tmp_path, vd)
        assert used == ids
        s_d2t, s_t2d, _ = vocab_map(torch.load(tmp_path / "token_freq.pt", weights_only=True), 8, vd)
        assert s_d2t.tolist() == d2t and s_t2d.nonzero().flatten().tolist() == ids


def test_speculators_step_times_are_read_from_its_metric_log():
    log = ("  profile/fetch_ms=133.864,\n  profile/step_ms=1.01e+04,\n x\n  profile/step_ms=2.33e+03,\n"
           "  profile/step_ms=812.5,\n")
    assert bench._speculators_profile(log) == [10100.0, 2330.0, 812.5]


def test_the_paired_bootstrap_is_the_difference_of_pooled_acceptance_lengths_and_brackets_it():
    """AL = 1 + accepted / drafts pooled over the prompts; a draft against itself differs by exactly 0 in every
    resampling; one that accepts one more token on every prompt is ahead in every resampling."""
    a = [(10, 5), (8, 8), (12, 3), (9, 0)]
    b = [(10, 6), (8, 9), (12, 4), (9, 1)]
    same = bench.paired_bootstrap(a, a, resamples=500)
    assert same == {"difference": 0.0, "low": 0.0, "high": 0.0, "prompts": 4, "resamples": 500}
    ahead = bench.paired_bootstrap(b, a, resamples=500)
    assert ahead["difference"] == round((1 + 20 / 39) - (1 + 16 / 39), 4)
    assert 0 < ahead["low"] <= ahead["difference"] <= ahead["high"]


def test_a_harness_saving_its_older_copy_of_a_run_keeps_the_fields_another_added(tmp_path):
    """Two harnesses on one results file: one adds vLLM's figure to a run; the other, holding the run as it was when
    it started, saves a new run of its own. The file keeps both the new run and the vLLM figure."""
    path = tmp_path / "results.json"
    run = {"trainer": "speculators", "reference": {"al": 2.4}}
    bench._save(path, {"runs": {"a": dict(run)}})
    bench._save(path, {"runs": {"a": {**run, "vllm": {"al": 2.43}}}})
    bench._save(path, {"runs": {"a": dict(run), "b": {"trainer": "specfmt"}}})
    saved = json.loads(path.read_text())["runs"]
    assert saved == {"a": {**run, "vllm": {"al": 2.43}}, "b": {"trainer": "specfmt"}}


def _run(trainer, steps, lr, seed, rows, optimizer=None, options=(), schedule=None):
    rec = {"world": "world", "trainer": trainer, "steps": steps, "lr": lr, "seed": seed, "options": list(options),
           "reference": {"al": 0.0}, "evals": {bench.LARGE_PROMPTS: {"al": bench._al(rows), "rows": rows}}}
    if optimizer:
        rec["optimizer"] = optimizer
    if schedule:
        rec["schedule"] = schedule
    return rec


def test_settings_take_three_seeds_and_the_best_mean_and_the_paired_interval_resamples_prompts_for_both():
    """Of two specfmt settings with three seeds, the one with the higher mean wins even where another setting has a better
    single run; a setting with two seeds does not count; the paired interval of two means brackets their difference."""
    good = [[4, 2]] * 30
    runs = {f"m{s}": _run("specfmt", 1500, 0.02, s, [[4, 2 + (s == 1237)]] * 30, "muon") for s in (1237, 1238, 1239)}
    runs |= {f"a{s}": _run("specfmt", 1500, 0.01, s, good if s != 1238 else [[4, 4]] * 30, "adamw") for s in (1237, 1238, 1239)}
    runs |= {f"x{s}": _run("specfmt", 1500, 0.05, s, [[4, 4]] * 30, "muon") for s in (1237, 1238)}  # two seeds only
    runs |= {f"o{s}": _run("specfmt", 1500, 0.05, s, [[4, 4]] * 30, "muon", ["layers=2"]) for s in (1237, 1238, 1239)}  # other options
    runs |= {f"s{s}": _run("speculators", 1500, 0.03, s, [[4, 1 + s % 2]] * 30) for s in (1237, 1238, 1239)}
    results = {"runs": runs}
    assert bench.defaults_from_results(results) == {"optimizer": "adamw", "lr": 0.01, "schedule": "cosine", "prompts": bench.LARGE_PROMPTS}  # mean AL 1.667 against 1.583 (muon, whose seed 1237 alone is best)
    h = bench.head_to_head(results)["1500"]
    assert h["specfmt"]["lr"] == 0.01 and h["speculators"]["optimizer"] == "muon" and h["speculators"]["schedule"] == "linear"
    assert h["paired"]["low"] <= h["paired"]["difference"] <= h["paired"]["high"] and h["paired"]["seeds"] == [3, 3]
    assert h["paired"]["difference"] == round(bench.seed_mean(runs_of(results, "a"), bench.LARGE_PROMPTS)
                                              - bench.seed_mean(runs_of(results, "s"), bench.LARGE_PROMPTS), 4)
    assert "vllm" not in h  # vLLM measured none of the six drafts
    # vLLM's figures of the six drafts on the larger set: the same settings (chosen by the reference), compared by vLLM
    for key in [f"a{s}" for s in (1237, 1238, 1239)] + [f"s{s}" for s in (1237, 1238, 1239)]:
        rows = [[4, 1]] * 30 if key.startswith("a") else [[4, 3]] * 30
        runs[key][f"vllm:{bench.LARGE_PROMPTS}"] = {"al": bench._al(rows), "rows": rows}
    v = bench.head_to_head(results)["1500"]["vllm"]
    assert v["specfmt"]["seeds"] == [1.25] * 3 and v["speculators"]["mean"] == 1.75
    assert v["paired"]["difference"] == -0.5 == v["paired"]["low"] == v["paired"]["high"]  # every prompt alike


def test_train_eagle3_defaults_are_the_benchmarks_winner_at_the_readmes_budget():
    """``specfmt train eagle3``'s ``--lr``, ``--optimizer`` and ``--schedule`` (the API's and the CLI's) are what the recorded results file
    says wins at 1,500 steps: a later run of the benchmark that changes the winner fails this test until they follow."""
    from typer.testing import CliRunner

    from specfmt.cli import app
    from specfmt.training.loop import DEFAULT_LR, DEFAULT_SCHEDULE, TrainOptions

    won = bench.defaults_from_results(json.loads(bench.RESULTS.read_text()), 1500)
    opts = TrainOptions().resolved("eagle3")
    assert {"optimizer": opts.optimizer, "lr": opts.lr, "schedule": opts.schedule} == {k: won[k] for k in ("optimizer", "lr", "schedule")}
    assert TrainOptions().resolved("medusa").lr == DEFAULT_LR and TrainOptions(lr=3e-3).resolved("eagle3").lr == 3e-3
    assert TrainOptions().resolved("medusa").schedule == DEFAULT_SCHEDULE and TrainOptions(schedule="cosine").resolved("eagle3").schedule == "cosine"
    shown = CliRunner().invoke(app, ["train", "eagle3", "--help"], env={"COLUMNS": "200"}).output
    for flag in ("lr", "schedule"):
        assert f"[default: {won[flag]}]" in shown.split(f"--{flag}", 1)[1].split("--", 1)[0]


def test_train_dflash_defaults_are_the_benchmarks_winner_on_the_qwen3_world():
    """``specfmt train dflash``'s ``--lr`` and ``--optimizer`` are the recorded results' winner at 500 steps on the Qwen3 world
    (the runs with the default causal block); the other algorithms keep theirs."""
    from specfmt.training.loop import TrainOptions

    won = bench.defaults_from_results(json.loads(bench.RESULTS.read_text()), 500, world="world-qwen3", algorithm="dflash")
    opts = TrainOptions().resolved("dflash")
    assert {"optimizer": opts.optimizer, "lr": opts.lr, "schedule": opts.schedule} == {k: won[k] for k in ("optimizer", "lr", "schedule")}
    assert won["prompts"] == bench.LARGE_PROMPTS


def test_a_speculators_run_given_its_adamw_is_not_counted_as_its_default_muon():
    runs = {f"s{s}": _run("speculators", 1500, 0.03, s, [[4, 2]] * 30) for s in (1237, 1238)}
    runs["a"] = _run("speculators", 1500, 0.03, 1239, [[4, 0]] * 30, options=["--optimizer adamw"])
    found = bench.settings({"runs": runs}, bench.LARGE_PROMPTS)
    assert sorted((k[2], len(v)) for k, v in found.items()) == [("adamw", 1), ("muon", 2)]


def test_a_runs_schedule_is_its_own_field_and_runs_before_the_option_were_cosine():
    """specfmt's runs that record no schedule were cosine (the only one before ``--schedule``); one given
    ``schedule=linear`` and one that records the linear default are one setting, apart from the cosine runs of the same
    rate; speculators' runs are its linear default unless given ``--scheduler-type``."""
    runs = {"old": _run("specfmt", 1500, 0.03, 1237, [[4, 2]] * 30, "muon"),
            "given": _run("specfmt", 1500, 0.03, 1238, [[4, 2]] * 30, "muon", ['schedule="linear"']),
            "recorded": _run("specfmt", 1500, 0.03, 1239, [[4, 2]] * 30, "muon", schedule="linear"),
            "spec": _run("speculators", 1500, 0.03, 1237, [[4, 2]] * 30),
            "spec-cos": _run("speculators", 1500, 0.03, 1238, [[4, 2]] * 30, options=["--scheduler-type cosine"])}
    found = bench.settings({"runs": runs}, bench.LARGE_PROMPTS)
    assert sorted((k[0], k[5], len(v)) for k, v in found.items()) == [("specfmt", "cosine", 1), ("specfmt", "linear", 2),
                                                                      ("speculators", "cosine", 1), ("speculators", "linear", 1)]


def runs_of(results, prefix):
    return [r for k, r in results["runs"].items() if k.startswith(prefix)]


def test_the_lean_reference_run_is_validate_runs_reference(tmp_path):
    """The larger set is measured by the reference run alone (no misreadings): its figures, prompt by prompt, are what
    ``validate_run`` measures for the draft as written."""
    from specfmt.convert import convert
    from specfmt.validation.run import validate_run

    shipped = REPO / "examples" / "world"
    world = tmp_path / "world"  # the example world's verifier and 4 of its held-out prompts
    world.mkdir()
    (world / "verifier").symlink_to(shipped / "verifier")
    (world / "p.jsonl").write_text("".join((shipped / "prompts.jsonl").read_text().splitlines(keepends=True)[:4]))
    draft = convert("eagle3", str(shipped / "eagle3-safeailab"), tmp_path / "d", str(shipped / "verifier")).out
    lean = bench.reference_only(Path(draft), world, "p.jsonl@12")
    full = validate_run(str(draft), prompts=str(world / "p.jsonl"), max_tokens=12, num_speculative_tokens=3, use_vllm=False, write=False)
    assert lean["al"] == round(full.reference["mean_acceptance_length"], 4) and lean["al"] > 1.2
    assert lean["rows"] == [[p["drafts"], p["accepted"]] for p in full.diagnosis["per_prompt"]] and len(lean["rows"]) == 4
    assert bench.prompt_set("prompts-heldout.jsonl@128") == ("prompts-heldout.jsonl", 128) and bench.prompt_set("x.jsonl") == ("x.jsonl", 32)


def test_the_recorded_head_to_head_is_what_the_recorded_runs_give():
    """The docs render the results file's ``head_to_head``; harnesses that save together (or one started with older code)
    can leave it stale, so it must equal what :func:`head_to_head` computes from the recorded runs now."""
    results = json.loads(bench.RESULTS.read_text())
    assert results["head_to_head"] == bench.head_to_head(results)
