"""``specfmt push`` of a folder that is not a draft, and the model card's serve section (issue 23,
items 3b and 6), without a Hub: everything here happens before the network (``plan_push``) or in
``--dry-run``.

The card is read back as a reader would: each release's paragraph and ``vllm serve`` line are
parsed out of the Markdown and compared with :func:`specfmt.serving.serve_command` for that release
and the config.json that is uploaded.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import WORLD, run_cli
from specfmt.convert import convert
from specfmt.errors import InputError
from specfmt.hub.card import render_card
from specfmt.hub.push import plan_push
from specfmt.sources.resolve import is_hub_id
from specfmt.serving import CHECKED_RELEASES, GPU_BUILD, serve_command

VERIFIER = str((WORLD / "verifier").resolve())
REPO = "me/test-draft"


@pytest.fixture(scope="module")
def drafts(tmp_path_factory) -> dict[str, Path]:
    """The example EAGLE-3 and Medusa drafts, converted against the local example verifier."""
    root = tmp_path_factory.mktemp("drafts")
    convert("eagle3", str(WORLD / "eagle3-safeailab"), root / "eagle3", VERIFIER)
    convert("medusa", str(WORLD / "medusa-legacy"), root / "medusa", VERIFIER)
    return {"eagle3": root / "eagle3", "medusa": root / "medusa"}


# --------------------------------------------------------------------------- not a draft (3b)


def _not_drafts(tmp_path: Path) -> dict[str, tuple[Path, list[str]]]:
    """Folders push must refuse, with what the refusal must say: ``name -> (folder, [words])``."""
    empty = tmp_path / "empty"
    empty.mkdir()
    plain = tmp_path / "plain-config"
    plain.mkdir()
    (plain / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return {
        "eagle3 research draft": (WORLD / "eagle3-safeailab", ["this folder is an EAGLE-3 research draft (safeailab layout)",
                                                              f"`specfmt convert --from eagle3 {WORLD / 'eagle3-safeailab'} -o OUT --verifier VERIFIER`, then push OUT"]),
        "medusa research draft": (WORLD / "medusa-legacy", ["this folder is a Medusa research draft (legacy-trainer layout)", "specfmt convert --from medusa"]),
        "no config": (empty, ["this folder is not one (it has no config.json)", "specfmt convert -o"]),
        "a config of nothing known": (plain, ["this folder is not one (its config.json has no speculators_config)"]),
    }


@pytest.mark.parametrize("flags", [{}, {"validate": False}, {"verifier_id": "me/v"}, {"validate": False, "verifier_id": "me/v"}],
                         ids=["plain", "no-validate", "verifier-id", "no-validate+verifier-id"])
def test_push_of_a_folder_that_is_not_a_draft_says_what_it_is_whatever_the_flags(tmp_path, flags):
    for name, (folder, words) in _not_drafts(tmp_path).items():
        with pytest.raises(InputError) as e:
            plan_push(folder, "me/x", **flags)
        line = e.value.one_line()
        assert line.startswith("push uploads a draft in the speculators format; this folder is "), (name, line)
        for w in words:
            assert w in line, (name, w, line)
        assert "local path (None)" not in line


def test_the_issue_command_is_one_line_not_a_traceback(tmp_path):
    """``HF_HUB_OFFLINE=1 specfmt push examples/world/verifier --repo-id me/x --verifier-id me/v --no-validate`` (KeyError before).
    A causal LM is a draft model since issue 36: checked against its verifier (unreachable here: one line), or, with
    --no-validate, planned with a card that says the pair was not checked."""
    for extra, code, words in ((["--no-validate"], 2, "specfmt: error:"), ([], 2, "the pair fails its checks: verifier"),
                               (["--no-validate", "--dry-run"], 0, "not checked: the verifier me/v cannot be read")):
        r = run_cli("push", WORLD / "verifier", "--repo-id", "me/x", "--verifier-id", "me/v", *extra, env={"HF_HUB_OFFLINE": "1"})
        assert r.returncode == code and "Traceback" not in r.stderr, r.stderr
        lines = [ln for ln in r.stderr.splitlines() if ln.startswith("specfmt: error:")]
        assert len(lines) == (1 if code else 0) and words in r.stderr + r.stdout, (extra, r.stderr, r.stdout[-500:])


# --------------------------------------------------------------------------- the card's serve section (6)


def serve_section(card: str) -> dict[str, tuple[str, str | None]]:
    """What the card says for each checked release: ``release -> (statement, vllm serve line or None)``.

    The section is the text between ``## Serve it with vLLM`` and the next ``## ``; each statement
    is a paragraph ``vLLM A: ...`` or ``vLLM A-B: ...``, followed by at most one ``bash`` block.
    A release claimed twice or a ``vllm serve`` line outside a statement fails.
    """
    body = card.split("## Serve it with vLLM", 1)[1].split("\n## ", 1)[0]
    said: dict[str, tuple[str, str | None]] = {}
    current: list[str] = []
    lines = body.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        m = re.match(r"vLLM (\d+\.\d+\.\d+)(?:-(\d+\.\d+\.\d+))?: (.+)$", line)
        if m:
            lo, hi = m.group(1), m.group(2) or m.group(1)
            current = [r for r in CHECKED_RELEASES if CHECKED_RELEASES.index(lo) <= CHECKED_RELEASES.index(r) <= CHECKED_RELEASES.index(hi)]
            for r in current:
                assert r not in said, f"release {r} stated twice"
                said[r] = (m.group(3), None)
        elif line == "```bash":
            code = lines[i + 1]
            assert lines[i + 2] == "```" and current, f"a serve line outside a release's statement: {code}"
            for r in current:
                assert said[r][1] is None
                said[r] = (said[r][0], code)
            current = []
            i += 2
        elif "vllm serve" in line and not line.startswith("Checked against"):
            raise AssertionError(f"a serve line outside a release's statement: {line}")
        i += 1
    return said


def assert_card_agrees_with_serving(card: str, uploaded: dict, repo_id: str) -> None:
    """Every checked release is stated once, with serve_command's line for the uploaded config and a
    reason that holds for its verifier."""
    verifier = uploaded["speculators_config"]["verifier"]["name_or_path"]
    said = serve_section(card)
    assert sorted(said) == sorted(CHECKED_RELEASES), said
    for release, (statement, line) in said.items():
        want = serve_command(uploaded, repo_id, release, distribution=GPU_BUILD)  # a card is read on any machine: the GPU build's `vllm serve`
        if want is None:
            assert line is None and statement.startswith("cannot serve it"), (release, statement)
            continue
        assert line == want.line, (release, line, want.line)
        if want.form == "auto":
            assert statement.startswith("no speculative-decoding flags are needed") and f"serves the verifier {verifier} " in statement, statement
        else:
            assert statement.startswith("the explicit form, because ") and ("local path" in statement) == (not is_hub_id(verifier)), statement
    flags = len(re.findall(r"no speculative-decoding flags", card, flags=re.I))
    assert flags == len({line for s, line in said.values() if s.startswith("no speculative-decoding flags")}), card
    if is_hub_id(verifier):
        assert "local path" not in card


def test_card_with_verifier_id_names_the_uploaded_verifier_and_needs_no_flags(drafts):
    """The issue's case: a local verifier, ``--verifier-id me/verifier``; the card said `vllm serve` needs no
    flags and then that later releases need the explicit form "because the verifier is a local path"."""
    plan = plan_push(drafts["eagle3"], REPO, verifier_id="me/verifier", validate=False)
    assert plan.config["speculators_config"]["verifier"]["name_or_path"] == "me/verifier"
    assert_card_agrees_with_serving(plan.card, plan.config, REPO)
    said = serve_section(plan.card)
    assert {line for _, line in said.values()} == {f"vllm serve {REPO}"}  # every checked release auto-detects a Hub id


def test_card_of_medusa_says_which_releases_cannot_serve_it(drafts):
    plan = plan_push(drafts["medusa"], REPO, verifier_id="me/verifier", validate=False)
    assert_card_agrees_with_serving(plan.card, plan.config, REPO)
    said = serve_section(plan.card)
    assert said["0.33.0"][1] is None and "removed Medusa" in said["0.33.0"][0]
    assert said["0.32.0"][1] == f"vllm serve {REPO}"


def test_card_with_a_local_verifier_gives_the_explicit_form_where_it_is_needed(drafts):
    """render_card as push would call it had the config kept its local verifier path (push refuses that upload)."""
    cfg = json.loads((drafts["eagle3"] / "config.json").read_text())
    card = render_card(cfg, repo_id=REPO, verifier=VERIFIER, figures=None, license=None, weights=[("model.safetensors", 1)], folder=drafts["eagle3"])
    assert_card_agrees_with_serving(card, cfg, REPO)
    said = serve_section(card)
    assert said["0.32.0"][1] == f"vllm serve {REPO}" and said["0.33.0"][1].startswith(f"vllm serve {VERIFIER} --speculative-config ")


def test_card_with_a_hub_id_that_is_also_a_folder_here_gives_that_reason(drafts, tmp_path, monkeypatch):
    """vLLM 0.33 refuses a Hub-id-shaped verifier that exists as a path: the card's reason is that, not a "local path"."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "me" / "verifier").mkdir(parents=True)
    plan = plan_push(drafts["eagle3"], REPO, verifier_id="me/verifier", validate=False)
    assert_card_agrees_with_serving(plan.card, plan.config, REPO)
    assert "also exists as a path" in serve_section(plan.card)["0.33.0"][0]


def test_dry_run_prints_the_card_derived_from_the_uploaded_config(drafts, tmp_path):
    """The command of the issue, end to end: ``push ... --verifier-id me/verifier --dry-run``."""
    r = run_cli("push", drafts["eagle3"], "--repo-id", REPO, "--verifier-id", "me/verifier", "--dry-run", "--no-validate",
                env={"HF_HUB_OFFLINE": "1", "HF_TOKEN": ""})
    assert r.returncode == 0, r.stderr
    card = r.stdout.split("model card (generated):", 1)[1].rsplit("dry run: nothing uploaded", 1)[0]
    cfg = json.loads((drafts["eagle3"] / "config.json").read_text())
    cfg["speculators_config"]["verifier"]["name_or_path"] = "me/verifier"
    assert_card_agrees_with_serving(card, cfg, REPO)


# --------------------------------------------------------------------------- figures of more than one run


def _validation(date: str, source: str, count: int, tokens: int, k: int, rates: list[float]) -> dict:
    """A validation.json as `validate --run` writes it: both parts measured in one run on these conditions."""
    part = {"acceptance_rate_per_position": rates, "mean_acceptance_length": 1 + sum(rates), "num_drafts": 10 * count}
    return {"specfmt_version": "0.1.0", "date": f"{date}T10:00:00+00:00", "passed": True, "num_speculative_tokens": k, "max_tokens": tokens,
            "prompts": {"source": f"/data/{source}", "count": count, "tokens": 7 * count, "digest": f"sha256:{source}{count}"},
            "reference": {**part, "dtype": "float32"}, "vllm": {**part, "engine": "vllm 0.32.0", "dtype": "bfloat16"}, "kept": {}}


def _kept_vllm(now: dict, earlier: dict) -> dict:
    """``now`` after `validate --run --no-vllm` kept ``earlier``'s vLLM part (its figures, and its conditions under
    ``kept.vllm`` as :func:`specfmt.validation.run.keep_earlier` records them)."""
    from specfmt.validation.run import _conditions

    return {**now, "vllm": earlier["vllm"], "kept": {"vllm": _conditions(earlier)}}


def _acceptance(card: str) -> str:
    return card.split("## Acceptance", 1)[1].split("## Provenance", 1)[0]


def _row(text: str, label: str) -> list[str]:
    line = next(l for l in text.splitlines() if l.startswith(f"| {label} |" if label else "| |"))
    return [c.strip() for c in line.strip("|").split("|")][1:]


def test_card_states_each_columns_own_conditions_when_a_part_is_kept_from_another_run(drafts):
    """vLLM's figures kept from an earlier run of 4 prompts x 24 tokens at k=2 beside a new reference of 3 prompts
    x 16 tokens at k=3: each column says its own date, prompts, tokens and k; no line puts both under one run's."""
    cfg = json.loads((drafts["eagle3"] / "config.json").read_text())
    earlier = _validation("2025-06-01", "world.jsonl", 4, 24, 2, [0.5, 0.25])
    now = _validation("2025-06-02", "three.jsonl", 3, 16, 3, [0.6, 0.3, 0.1])
    card = _acceptance(render_card(cfg, repo_id=REPO, verifier="me/verifier", figures=_kept_vllm(now, earlier), license=None,
                                   weights=[("model.safetensors", 1)], folder=drafts["eagle3"]))
    assert _row(card, "")[:2] == ["reference (float32)", "vllm 0.32.0 (bfloat16)"]
    assert _row(card, "measured") == ["2025-06-02 (specfmt 0.1.0)", "2025-06-01 (specfmt 0.1.0, kept)"]
    assert _row(card, "prompts") == ["3 from `three.jsonl`", "4 from `world.jsonl`"]
    assert _row(card, "tokens per prompt") == ["16", "24"] and _row(card, "speculative tokens") == ["3", "2"]
    assert _row(card, "acceptance rate, position 3") == ["0.100", "-"] and _row(card, "acceptance rate, position 2") == ["0.300", "0.250"]
    assert _row(card, "**mean acceptance length**") == ["**2.000**", "**1.750**"] and _row(card, "drafts") == ["30", "40"]
    assert "the vLLM figures are kept from an earlier run" in card and "different prompts, tokens or k: each states its own" in card
    assert "prompts from" not in card.replace("| 3 from", "").replace("| 4 from", "")  # no single prompts line over both columns
    # kept on the same prompts, tokens and k: the line says so, the dates still differ per column
    same = _acceptance(render_card(cfg, repo_id=REPO, verifier="me/verifier", figures=_kept_vllm(now, {**earlier, **{k: now[k] for k in (
        "prompts", "max_tokens", "num_speculative_tokens")}}), license=None, weights=[("model.safetensors", 1)], folder=drafts["eagle3"]))
    assert "on the same prompts, tokens and k, on the date it states" in same
    assert _row(same, "measured") == ["2025-06-02 (specfmt 0.1.0)", "2025-06-01 (specfmt 0.1.0, kept)"]
    # one run: one line, no condition rows
    single = _acceptance(render_card(cfg, repo_id=REPO, verifier="me/verifier", figures=now, license=None, weights=[("model.safetensors", 1)],
                                     folder=drafts["eagle3"]))
    assert "(specfmt 0.1.0, 2025-06-02): 3 prompts from `three.jsonl`, 16 tokens each, 3 speculative tokens, greedy." in single
    assert "| measured |" not in single and "| prompts |" not in single


def _provenance(card: str) -> str:
    return card.split("## Provenance", 1)[1]


def test_card_states_the_training_coverage_and_the_heldout_evaluation_the_draft_was_kept_by(drafts):
    """A trained draft's card carries what its provenance says about training (issue 27): the verifier's top-1
    coverage by the draft vocabulary and the held-out evaluation whose weights were kept; without them, neither line."""
    cfg = json.loads((drafts["eagle3"] / "config.json").read_text())
    train = {"algorithm": "eagle3", "steps": 1500, "tokens": 3_072_000, "top1_agreement": [0.61, 0.42, 0.3],
             "draft_vocab_coverage": [0.9731, 0.9731, 0.9731],
             "heldout": {"share": 0.05, "evaluations": 6, "kept_by": "best",
                         "kept": {"step": 1250, "loss": 7.1, "top1_agreement": [0.5, 0.25, 0.125], "estimated_acceptance_length": 1.6406}}}
    cfg["specfmt"]["train"] = train

    def provenance() -> str:
        return _provenance(render_card(cfg, repo_id=REPO, verifier="me/verifier", figures=None, license=None,
                                       weights=[("model.safetensors", 1)], folder=drafts["eagle3"]))

    text = provenance()
    assert "1500 steps, 3,072,000 tokens, top-1 agreement with the verifier 0.610 / 0.420 / 0.300." in text
    assert "The draft vocabulary holds the verifier's top-1 at 97.3% of the training positions." in text
    assert ("5% of the documents were held out and evaluated 6 times; the draft holds the best evaluation's weights (step 1250): "
            "held-out top-1 agreement 0.500 / 0.250 / 0.125, estimated acceptance length 1.641.") in text
    train["heldout"]["kept_by"] = "last"
    assert "the draft holds the last step's weights (step 1250)" in provenance()
    train["heldout"] = None
    del train["draft_vocab_coverage"]
    text = provenance()
    assert "held out" not in text and "draft vocabulary holds" not in text and "top-1 agreement with the verifier 0.610" in text


# --------------------------------------------------------------------------- both engines (issue 39)


def _card(folder: Path) -> str:
    cfg = json.loads((folder / "config.json").read_text())
    return render_card(cfg, repo_id=REPO, verifier="me/verifier", figures=None, license=None, weights=[("model.safetensors", 1)], folder=folder)


def test_the_card_of_a_draft_sglang_runs_gives_the_export_and_sglangs_line(drafts):
    card = _card(drafts["eagle3"])
    block = card.split("## Serve it with SGLang", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0].strip().splitlines()
    assert block[0] == f"specfmt export --to sglang {REPO} -o test-draft-sglang"
    assert block[1].startswith("python3 -m sglang.launch_server --model-path me/verifier --speculative-algorithm EAGLE3 "
                               "--speculative-draft-model-path test-draft-sglang")
    assert "## Serve it with vLLM" in card


def test_the_card_of_a_draft_sglang_does_not_serve_says_why(drafts):
    section = _card(drafts["medusa"]).split("## Serve it with SGLang", 1)[1]
    assert "refuses it" in section and "no Medusa" in section and "sglang.launch_server" not in section
