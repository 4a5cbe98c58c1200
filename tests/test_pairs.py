"""Draft-model pairs (issue 36) without vLLM: the pair checks, the padding fix, the reference against transformers,
serve-command and push --dry-run, on the example world's two draft models and the permuted pair built here.
vLLM's side: tests/test_vllm_pairs.py (engines) and tests/test_vllm_matrix.py (each release's own code)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import WORLD, run_cli, tree_digest
from pairs import BPE, PADDED, VERIFIER, fixed, permuted


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("pairs")


@pytest.fixture(scope="module")
def same(root) -> Path:
    """The padded draft after pad-vocab: one tokenizer, the verifier's 2048 rows."""
    return fixed(root)


@pytest.fixture(scope="module")
def perm(root, same) -> Path:
    return permuted(same, root / "draft-lm-permuted")[0]


def checks(folder: Path, verifier: Path | None = VERIFIER) -> dict:
    from specfmt.methods import resolve

    rep = resolve(str(folder)).static_checks(None if verifier is None else str(verifier))
    return {c.name: c for c in rep.checks}


# --------------------------------------------------------------------------- the world's draft models


def test_the_worlds_draft_models_are_small_llamas_with_their_tokenizers():
    """``examples/make_pairs.py``'s output as its README section and pairs.json say."""
    from safetensors import safe_open

    figures = json.loads((WORLD / "pairs.json").read_text())
    for folder, rows, tokens in ((PADDED, 2112, 2048), (BPE, 1024, 1024)):
        names = sorted(p.name for p in folder.iterdir())
        assert names == ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"], names
        cfg = json.loads((folder / "config.json").read_text())
        assert (cfg["vocab_size"], cfg["num_hidden_layers"], cfg["hidden_size"], cfg["head_dim"]) == (rows, 2, 64, 32)  # vLLM's CPU attention: head_dim >= 32
        assert len(json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"]) == tokens
        with safe_open(str(folder / "model.safetensors"), "pt") as f:
            assert {f.get_slice(n).get_dtype() for n in f.keys()} == {"BF16"} and f.get_slice("lm_head.weight").get_shape() == [rows, 64]
        assert sum(p.stat().st_size for p in folder.iterdir()) < 1e6 and figures[folder.name]["vocab_size"] == rows
    assert (PADDED / "tokenizer.json").read_bytes() == (VERIFIER / "tokenizer.json").read_bytes()
    readme = (WORLD / "README.md").read_text()
    assert "### Draft-model pairs (`examples/make_pairs.py`)" in readme and all(label in readme for label in figures["measured"])


# --------------------------------------------------------------------------- the pair checks


def test_the_same_tokenizer_pair_passes_every_check(same):
    got = checks(same)
    assert {n: c.status for n, c in got.items() if c.status not in ("pass", "skip")} == {}, {n: c.summary for n, c in got.items()}
    assert got["intersection"].status == "skip" and got["chat_template"].status == "skip"
    assert "vLLM 0.30.0-0.33.0 serve it as draft_model" in got["engines"].summary and "generate(assistant_model=D)" in got["engines"].summary
    # c: the draft reads about an eighth of the verifier's parameters per pass
    assert "12.5 % of a verifier pass" in got["cost"].summary or "12.4 % of a verifier pass" in got["cost"].summary, got["cost"].summary


def test_the_padded_draft_fails_vocab_size_with_the_fix_in_one_line():
    got = checks(PADDED)
    assert got["tokenizer"].status == "pass"  # one tokenizer: only the rows differ
    c = got["vocab_size"]
    assert c.status == "fail" and "padding-only difference: draft 2112 rows, verifier 2048" in c.summary
    assert f"fix: `specfmt pad-vocab {PADDED} --verifier {VERIFIER}" in c.summary and "\n" not in c.summary
    assert got["engines"].status == "warn" and "cannot serve it" in got["engines"].summary  # transformers runs it through text


def test_the_permuted_pair_is_refused_statically_in_one_line(perm):
    """Same vocabulary size, another id space: vLLM and transformers would serve it without a word."""
    got = checks(perm)
    c = got["tokenizer"]
    assert c.status == "fail" and "\n" not in c.summary
    assert c.summary.startswith("the draft's ids are not the verifier's (") and "without a word" in c.summary and "use_heterogeneous_vocab" in c.summary
    assert got["vocab_size"].status == "warn" and got["special_tokens"].status == "skip"
    r = run_cli("validate", perm, "--verifier", VERIFIER)
    assert r.returncode == 1 and "Traceback" not in r.stderr and "validation failed" in r.stdout


def test_the_bpe_pair_is_served_through_the_intersection_vllms_own_class_computes():
    from transformers import AutoTokenizer

    from specfmt.methods.vocab import _vllm_like, intersection

    got = checks(BPE)
    assert got["tokenizer"].status == "warn" and "use_heterogeneous_vocab" in got["tokenizer"].summary
    assert got["vocab_size"].status == "pass" and got["engines"].status == "pass"
    assert "with use_heterogeneous_vocab" in got["engines"].summary and "assistant_tokenizer=TD" in got["engines"].summary
    vtok, dtok = AutoTokenizer.from_pretrained(VERIFIER), AutoTokenizer.from_pretrained(BPE)
    theirs, ours = intersection(vtok, dtok, 2048, 1024), _vllm_like(vtok, dtok, 2048, 1024)
    assert theirs.source.startswith("vllm ") and ours.source == "specfmt"
    assert (theirs.target_to_draft, theirs.draft_to_target, theirs.size, theirs.draft_unk) == (ours.target_to_draft, ours.draft_to_target, ours.size, ours.draft_unk)
    assert 100 < theirs.size < 1024 and theirs.draft_unk == dtok.unk_token_id
    assert f"{theirs.size} tokens shared" in got["intersection"].summary and "computed by vllm" in got["intersection"].summary
    assert "% of the prompts'" in got["intersection"].summary and "AssistantToTargetTranslator" in got["intersection"].summary


def test_a_draft_model_without_a_verifier_says_so():
    got = checks(BPE, None)
    assert got["verifier"].status == "fail" and "pass --verifier" in got["verifier"].summary
    assert all(c.status == "skip" for n, c in got.items() if n not in ("draft", "verifier"))


# --------------------------------------------------------------------------- the padding fix


def test_pad_vocab_keeps_every_other_tensor_and_records_what_it_did(same):
    import torch
    from safetensors.torch import load_file

    before, after = load_file(str(PADDED / "model.safetensors")), load_file(str(same / "model.safetensors"))
    assert set(before) == set(after)
    changed = {n for n in before if not (before[n].shape == after[n].shape and torch.equal(before[n], after[n]))}
    assert changed == {"model.embed_tokens.weight", "lm_head.weight"}
    for n in changed:
        assert after[n].shape == (2048, 64) and after[n].dtype == before[n].dtype and torch.equal(after[n], before[n][:2048])
    cfg = json.loads((same / "config.json").read_text())
    rec = cfg["specfmt"]["pad_vocab"]
    assert cfg["vocab_size"] == 2048 and rec["rows"] == [2112, 2048] and rec["tokenizer_length"] == 2048 and rec["dropped_rows"] == "2048..2111"
    assert rec["source_files"]["model.safetensors"] and rec["verifier"] == str(VERIFIER.resolve())
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (same / name).read_bytes() == (PADDED / name).read_bytes(), name


def test_no_padded_id_is_ever_proposed(root, same):
    """The other direction, built from the world: the verifier padded to 2112 rows (``pad_vocab`` with the roles
    swapped), then the fixed draft padded up to it. Every padded output row is a copy of the pad token's: at every
    position of the prompts and for 20,000 random hidden states, a padded id's logit equals the pad token's exactly
    and the argmax is a real id; the padded draft proposes what it proposed before."""
    import torch
    from transformers import AutoModelForCausalLM

    from specfmt.methods.padding import pad_vocab

    big = root / "verifier-2112"
    res = pad_vocab(str(VERIFIER), str(PADDED), big)  # the world verifier with 64 padding rows, for this test only
    assert res.rows == (2048, 2112) and res.record["added_embedding_rows"] == "zeros"
    up = root / "draft-2112"
    res = pad_vocab(str(same), str(big), up)
    assert res.rows == (2048, 2112) and res.source_row == 2  # <|pad|>
    a = AutoModelForCausalLM.from_pretrained(same).float().eval()
    b = AutoModelForCausalLM.from_pretrained(up).float().eval()
    head = b.get_output_embeddings().weight
    assert torch.equal(head[2048:], head[2].expand(64, -1)) and torch.equal(head[:2048], a.get_output_embeddings().weight)
    h = torch.randn(20000, 64, generator=torch.Generator().manual_seed(0)) * 10
    logits = h @ head.T
    assert torch.equal(logits[:, 2048:], logits[:, 2:3].expand(-1, 64)) and int(logits.argmax(-1).max()) < 2048
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(same)
    with torch.no_grad():
        for line in (WORLD / "prompts.jsonl").read_text().splitlines():
            ids = torch.tensor([tok.encode(json.loads(line)["prompt"])])
            la, lb = a(input_ids=ids).logits[0], b(input_ids=ids).logits[0]
            assert int(lb.argmax(-1).max()) < 2048 and torch.equal(lb.argmax(-1), la.argmax(-1))


def test_pad_vocab_refuses_what_padding_cannot_fix_in_one_line(root, same):
    before = tree_digest(WORLD)
    for args, words in ((["pad-vocab", same, "--verifier", VERIFIER, "-o", root / "x"], "nothing to pad"),
                        (["pad-vocab", BPE, "--verifier", VERIFIER, "-o", root / "x"], "a tokenizer of its own"),
                        (["pad-vocab", PADDED, "--verifier", VERIFIER, "-o", PADDED / "inside"], "the output folder lies inside DRAFT"),
                        (["pad-vocab", WORLD / "eagle3-safeailab", "--verifier", VERIFIER, "-o", root / "x"], "pad-vocab rewrites a draft model")):
        r = run_cli(*args)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        (line,) = r.stderr.strip().splitlines()
        assert words in line, line
    assert tree_digest(WORLD) == before and not (root / "x").exists()


# --------------------------------------------------------------------------- the reference and transformers


@pytest.mark.parametrize("name", ["same", "bpe"])
def test_the_reference_and_transformers_agree_and_equal_the_verifier_alone(name, same):
    """4 world prompts x 24 tokens, k = 3, no vLLM: the reference chain and transformers' assisted generation (k fixed) give
    the verifier's greedy tokens; for one tokenizer their acceptance per position agrees within the tolerance; for two,
    transformers maps through text and the difference is measured, reported as a warning with its reason."""
    from specfmt.methods import resolve
    from specfmt.validation.method_run import run_method

    prompts = Path(same).parent / "prompts4.jsonl"
    prompts.write_text("".join(line + "\n" for line in (WORLD / "prompts.jsonl").read_text().splitlines()[:4]))
    res = run_method(resolve(str(same if name == "same" else BPE)), verifier=str(VERIFIER), prompts=str(prompts), max_tokens=24, use_vllm=False,
                     write=False)
    got = {c.name: c for c in res.report.checks}
    for check in ("reference", "transformers", "transformers_exact"):
        assert got[check].status == "pass", (check, got[check].summary)
    assert got["vllm"].status == "skip" and res.transformers["num_drafts"] > 0 and res.reference["num_drafts"] > 0
    assert res.transformers["call"].count("num_assistant_tokens_schedule = \"constant\"") == 1
    if name == "same":
        assert got["transformers_agreement"].status == "pass", got["transformers_agreement"].summary
        assert res.reference["acceptance_rate_per_position"][0] > 0.2  # a trained draft, not noise (measured 0.303)
        assert res.method["pair"]["relation"] == "same" and res.method["cost"]["parallel"] is False
    else:
        assert got["transformers_agreement"].status in ("pass", "warn")
        if got["transformers_agreement"].status == "warn":
            assert "through text" in got["transformers_agreement"].summary
        assert "assistant_tokenizer" in res.transformers["mapping"] and 0 < res.method["greedy_tokens_inside_intersection"] < 1


# --------------------------------------------------------------------------- serve-command and push


def test_serve_command_prints_the_pair_line_for_each_engine(same):
    from specfmt.serving import LAUNCHERS, installed_distribution

    head = " ".join(LAUNCHERS[(installed_distribution() or ("vllm",))[0]])
    r = run_cli("serve-command", same, "--verifier", VERIFIER, "--vllm-version", "0.32.0")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    spec = {"method": "draft_model", "model": str(same.resolve()), "num_speculative_tokens": 3}
    assert r.stdout.strip() == f"{head} {VERIFIER.resolve()} --speculative-config '{json.dumps(spec)}'"
    r = run_cli("serve-command", BPE, "--verifier", VERIFIER, "--vllm-version", "0.30.0")
    assert r.returncode == 0 and '"use_heterogeneous_vocab": true' in r.stdout
    r = run_cli("serve-command", BPE, "--verifier", VERIFIER, "--engine", "transformers")
    assert r.returncode == 0 and "assistant_tokenizer=assistant_tokenizer" in r.stdout and "num_assistant_tokens = 3" in r.stdout
    compile(r.stdout, "generate_call", "exec")  # the printed call is Python
    r = run_cli("serve-command", PADDED, "--verifier", VERIFIER)
    assert r.returncode == 2 and r.stdout == "" and "cannot serve this draft model (llama) pair" in r.stderr and "specfmt pad-vocab" in r.stderr
    r = run_cli("serve-command", same)
    assert r.returncode == 2 and "names no verifier" in r.stderr


def test_push_dry_run_of_a_draft_model_names_its_verifier_the_relation_the_padding_and_the_acceptance(root, same, tmp_path):
    import shutil

    from specfmt.hub.method_push import plan
    from specfmt.methods import resolve
    from specfmt.validation.method_run import run_method

    folder = tmp_path / "draft"
    shutil.copytree(same, folder)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(line + "\n" for line in (WORLD / "prompts.jsonl").read_text().splitlines()[:2]))
    run_method(resolve(str(folder)), verifier=str(VERIFIER), prompts=str(prompts), max_tokens=12, use_vllm=False)  # writes validation.json
    with pytest.raises(Exception, match="local verifier"):
        plan(folder, "me/draft")
    p = plan(folder, "me/draft", verifier_id="specfmt-test/tiny-verifier")
    card = p.card
    assert p.verifier == "specfmt-test/tiny-verifier" and "base_model: specfmt-test/tiny-verifier" in card and "draft-model" in card
    assert "one tokenizer, the same vocabulary size" in card and "## Padding" in card and "from 2112 to 2048 rows" in card
    assert '"method": "draft_model", "model": "me/draft"' in card and "vllm serve specfmt-test/tiny-verifier" in card
    import transformers

    assert "assistant_model=assistant" in card and f"| transformers {transformers.__version__} (float32) |" in card
    assert "**mean acceptance length**" in card
    assert {f.path_in_repo for f in p.files} >= {"config.json", "model.safetensors", "tokenizer.json", "validation.json", "README.md"}
    r = run_cli("push", folder, "--repo-id", "me/draft", "--verifier-id", "specfmt-test/tiny-verifier", "--dry-run", env={"HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0 and "dry run: nothing uploaded" in r.stdout and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("draft, warned", [
    ({"model_type": "qwen3", "sliding_window": 64, "use_sliding_window": True}, True),
    ({"model_type": "qwen3", "sliding_window": 64}, False),  # Qwen3Config's switch defaults to false: no window kept
    ({"model_type": "qwen3", "sliding_window": 64, "use_sliding_window": False}, False),
    ({"model_type": "llama", "sliding_window": 64}, True),  # LlamaConfig has no switch: the window as written
])
def test_the_pair_window_check_reads_the_window_its_config_class_keeps(draft, warned):
    """``sliding_window``: the draft's window as transformers' config class keeps it (``layers.kept_window``), which is the
    window vLLM applies; a Qwen3 draft without ``use_sliding_window`` attends in full, so there is nothing to warn of."""
    from types import SimpleNamespace

    from specfmt.methods.pair import _shape_checks
    from specfmt.validation.report import PASS, WARN, Report

    cost = SimpleNamespace(draft_parameters=1, verifier_parameters=10, ratio=0.1, per_step=lambda k: 0.3)
    lm = SimpleNamespace(config={**draft, "max_position_embeddings": 512}, cost=lambda ver: cost, default_k=lambda: 3)
    ver = SimpleNamespace(text_config={"model_type": "qwen3", "max_position_embeddings": 512})
    rep = Report("draft")
    _shape_checks(rep, lm, ver)
    assert rep.check("sliding_window").status == (WARN if warned else PASS), rep.check("sliding_window")
