"""``specfmt train``: every fill-in, the three trainers, data formats, the feature cache, resume, dry runs and torchrun.

All runs use the example world's verifier (H=128, V=2048, 8 layers) and a few of the
standard-library files it was trained on as data, with small batches.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from builders import eagle1_config, eagle1_tensors, eagle3_config, eagle3_tensors
from builders_medusa import write_legacy, write_v2
from conftest import WORLD, tree_digest
from safetensors.torch import load_file
from typer.testing import CliRunner

from specfmt.cli import app
from specfmt.errors import InputError, OutputExistsError, SpecfmtError
from specfmt.errors import TrainInterrupted
from specfmt.training.loop import TrainOptions
from specfmt.algorithms.eagle3 import vocab_map
from specfmt.training.data import FeatureCache, Windows, read_documents, verifier_features
from specfmt.training.pipeline import TrainRequest, state_dir, train_draft
from specfmt.validation.static import validate_static

runner = CliRunner()
WORLD_SHAPE = dict(hidden=128, vocab=2048, inter=384, heads=4, kv_heads=2)
SMALL = dict(steps=6, batch_size=2, seq_len=64, lr=3e-3, save_every=0)


@pytest.fixture(scope="module")
def verifier(tmp_path_factory) -> Path:
    """A private copy of the example verifier (weights and tokenizer)."""
    dst = tmp_path_factory.mktemp("verifier") / "verifier"
    shutil.copytree(WORLD / "verifier", dst)
    return dst


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """Three stdlib files the example verifier was trained on, as one text file."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    text = "\n".join((stdlib / n).read_text(encoding="utf-8") for n in ("argparse.py", "ast.py", "typing.py"))
    path = tmp_path_factory.mktemp("data") / "corpus.txt"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory) -> Path:
    """argparse.py alone (25k tokens, 1,124 distinct ids: enough for a 1,024-id draft vocabulary), for tests that train
    a few steps several times: the draft vocabulary's count runs the verifier over every token of the data each time
    (4.7 s on the three files, once per training)."""
    path = tmp_path_factory.mktemp("small-data") / "corpus.txt"
    path.write_text((Path(sysconfig.get_paths()["stdlib"]) / "argparse.py").read_text(encoding="utf-8"), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def tokenizer(verifier):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(verifier))


@pytest.fixture(scope="module")
def hf_verifier(verifier):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(verifier), dtype=torch.float32).eval()


def _train(out: Path, verifier: Path, corpus: Path | None, algorithm: str | None = "eagle3", *, log=None, opts=None, **kw):
    req = TrainRequest(out=str(out), verifier=str(verifier), algorithm=algorithm, data=[str(corpus)] if corpus else [],
                       validate=kw.pop("validate", False), device="cpu", **kw)
    return train_draft(req, TrainOptions(**{**SMALL, **(opts or {})}), log=log)


@dataclass
class CliResult:
    exit_code: int
    output: str


def _invoke(args: list[str]) -> CliResult:
    """``specfmt ARGS`` in-process, with :func:`specfmt.cli.main`'s handling of user errors (one line, exit 2)."""
    r = runner.invoke(app, [str(a) for a in args], terminal_width=200)
    if isinstance(r.exception, SpecfmtError):
        return CliResult(r.exception.exit_code, r.output + r.exception.one_line())
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    return CliResult(r.exit_code, r.output)


def _cli(*args) -> CliResult:
    return _invoke(["train", *args])


def _verifier_tensor(verifier: Path, name: str) -> torch.Tensor:
    return load_file(str(verifier / "model.safetensors"))[name]


# --------------------------------------------------------------------------- fill-ins


def test_fill_builds_d2t_t2d_from_corpus_frequencies_for_an_eagle3_draft_without_them(tmp_path, verifier, corpus, tokenizer):
    src = tmp_path / "src"
    src.mkdir()
    sd = eagle3_tensors(**WORLD_SHAPE, draft_vocab=1024)
    del sd["d2t"], sd["t2d"]
    torch.save(sd, src / "pytorch_model.bin")
    (src / "config.json").write_text(json.dumps(eagle3_config(**WORLD_SHAPE, draft_vocab=1024)))
    before = tree_digest(src)
    # converting alone refuses: the map is missing
    res = _invoke(["convert", "--from", "eagle3", src, "-o", tmp_path / "plain", "--verifier", verifier])
    assert res.exit_code == 2 and "missing: d2t" in res.output
    # filling without data says what to pass
    res = _cli("fill", src, "-o", tmp_path / "nodata", "--verifier", verifier)
    assert res.exit_code == 2 and "--data" in res.output and not (tmp_path / "nodata").exists()

    res = _cli("fill", src, "-o", tmp_path / "out", "--verifier", verifier, "--data", corpus, "--no-validate")
    assert res.exit_code == 0, res.output
    out = load_file(str(tmp_path / "out" / "model.safetensors"))
    docs = read_documents([str(corpus)], tokenizer)
    d2t, t2d, _ = vocab_map(docs.ids, 2048, 1024)
    assert torch.equal(out["d2t"], d2t) and torch.equal(out["t2d"], t2d)
    # cnets.py scandata: the most frequent ids, ascending, as offsets
    counts = torch.bincount(torch.tensor([t for d in docs.ids for t in d[1:]]), minlength=2048)
    assert counts[t2d].min() >= counts[~t2d].max()
    assert torch.equal(torch.arange(1024) + d2t, t2d.nonzero().squeeze(1))
    # every other tensor is the source's, renamed
    assert torch.equal(out["layers.0.self_attn.q_proj.weight"].float(), sd["midlayer.self_attn.q_proj.weight"].float())
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert set(cfg["specfmt"]["train"]["filled"]) == {"d2t", "t2d"} and cfg["specfmt"]["train"]["trained"] == []
    assert cfg["specfmt"]["source"]["format"] == "eagle3"
    assert validate_static(tmp_path / "out").ok
    assert tree_digest(src) == before


def test_fill_embed_copies_the_verifiers_embedding_into_eagle1_and_eagle3_drafts(tmp_path, verifier):
    embed = _verifier_tensor(verifier, "model.embed_tokens.weight")
    e1 = tmp_path / "e1"
    e1.mkdir()
    torch.save(eagle1_tensors(**WORLD_SHAPE, embed=False, fc_bias=False), e1 / "pytorch_model.bin")
    (e1 / "config.json").write_text(json.dumps(eagle1_config(**WORLD_SHAPE, bias=False)))
    e3 = tmp_path / "e3"
    e3.mkdir()
    torch.save(eagle3_tensors(**WORLD_SHAPE, draft_vocab=1024), e3 / "pytorch_model.bin")
    (e3 / "config.json").write_text(json.dumps(eagle3_config(**WORLD_SHAPE, draft_vocab=1024)))
    for src, fmt in ((e1, "eagle"), (e3, "eagle3")):
        res = _cli("fill", src, "--from", fmt, "-o", tmp_path / f"{fmt}-out", "--verifier", verifier, "--embed", "--no-validate", "--dtype", "float16")
        assert res.exit_code == 0, res.output
        out = load_file(str(tmp_path / f"{fmt}-out" / "model.safetensors"))
        assert torch.equal(out["embed_tokens.weight"], embed.to(torch.float16))
        assert validate_static(tmp_path / f"{fmt}-out").ok
    # a second fill finds the embedding present and refuses, writing nothing
    res = _cli("fill", tmp_path / "eagle-out", "-o", tmp_path / "again", "--verifier", verifier, "--embed")
    assert res.exit_code == 2 and "already has embed_tokens" in res.output and not (tmp_path / "again").exists()


def test_fill_gives_shared_head_medusa_its_own_lm_heads_and_adds_heads(tmp_path, verifier):
    head = _verifier_tensor(verifier, "lm_head.weight")
    v2 = write_v2(tmp_path / "v2", heads=2, hidden=128, vocab=2048, dtype=torch.float32)
    res = _cli("fill", v2, "--from", "medusa", "-o", tmp_path / "own", "--verifier", verifier, "--lm-heads", "--no-validate")
    assert res.exit_code == 0, res.output
    out = load_file(str(tmp_path / "own" / "model.safetensors"))
    assert "lm_head.weight" not in out
    assert all(torch.equal(out[f"lm_heads.{i}.weight"], head) for i in range(2))
    cfg = json.loads((tmp_path / "own" / "config.json").read_text())
    assert cfg["original_lm_head"] is False and cfg["num_heads"] == 2 and validate_static(tmp_path / "own").ok

    legacy = write_legacy(tmp_path / "legacy", heads=2, hidden=128, vocab=2048, dtype=torch.float32)
    src = load_file(str(legacy / "medusa_lm_head.safetensors"))
    res = _cli("fill", legacy, "--from", "medusa", "-o", tmp_path / "grown", "--verifier", verifier, "--heads", "4", "--no-validate")
    assert res.exit_code == 0, res.output
    out = load_file(str(tmp_path / "grown" / "model.safetensors"))
    cfg = json.loads((tmp_path / "grown" / "config.json").read_text())
    assert cfg["num_heads"] == 4 and cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 4
    for i in (0, 1):  # the old heads, unchanged
        assert torch.equal(out[f"blocks.{i}.layers.0.weight"], src[f"{i}.0.linear.weight"])
        assert torch.equal(out[f"lm_heads.{i}.weight"], src[f"{i}.1.weight"])
    for i in (2, 3):  # new heads: zero blocks, the verifier's head
        assert not out[f"blocks.{i}.layers.0.weight"].any() and not out[f"blocks.{i}.layers.0.bias"].any()
        assert torch.equal(out[f"lm_heads.{i}.weight"], head)
    assert validate_static(tmp_path / "grown").ok
    res = _cli("fill", tmp_path / "grown", "-o", tmp_path / "shrunk", "--verifier", verifier, "--heads", "3")
    assert res.exit_code == 2 and "only added" in res.output


def test_training_new_medusa_heads_leaves_the_existing_heads_untouched(tmp_path, verifier, corpus):
    legacy = write_legacy(tmp_path / "legacy", heads=2, hidden=128, vocab=2048, dtype=torch.float32)
    src = load_file(str(legacy / "medusa_lm_head.safetensors"))
    res = _train(tmp_path / "out", verifier, corpus, "medusa", init=str(legacy), heads=3)
    out = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert set(res.trained) == {"blocks.2.layers.0.weight", "blocks.2.layers.0.bias", "lm_heads.2.weight"}
    assert torch.equal(out["blocks.0.layers.0.weight"], src["0.0.linear.weight"])
    assert torch.equal(out["lm_heads.1.weight"], src["1.1.weight"])
    assert out["blocks.2.layers.0.weight"].any()  # trained away from its zero start
    assert len(res.stats.accuracy) == 3  # figures for every head, the frozen ones too


# --------------------------------------------------------------------------- training


@pytest.mark.parametrize("algorithm", ["eagle3", "eagle", "medusa"])
def test_training_raises_top1_agreement_with_the_verifier(tmp_path, verifier, corpus, algorithm):
    curve: list[list[float]] = []
    kw = {"draft_vocab": 1024} if algorithm == "eagle3" else {}
    res = _train(tmp_path / "out", verifier, corpus, algorithm, log=lambda s, loss, acc: curve.append(acc),
                 opts={"steps": 80, "batch_size": 4, "seq_len": 128, "save_every": 0}, **kw)
    first = sum(a[0] for a in curve[:5]) / 5
    assert res.stats.accuracy[0] > first + 0.1, (first, res.stats.accuracy)
    assert validate_static(res.out).ok
    cfg = json.loads((res.out / "config.json").read_text())
    assert cfg["specfmt"]["train"]["steps"] == 80 and cfg["specfmt"]["source"]["format"] == "specfmt-train"


def test_training_ends_with_a_validation_run_written_to_validation_json(tmp_path, verifier, corpus):
    res = _cli("eagle3", "-o", tmp_path / "out", "--verifier", verifier, "--data", corpus, "--draft-vocab", "1024",
               "--steps", "4", "--batch-size", "2", "--seq-len", "64")
    assert res.exit_code == 0, res.output
    assert "reference" in res.output and "mean acceptance length" in res.output
    v = json.loads((tmp_path / "out" / "validation.json").read_text())
    assert v["passed"] and v["reference"]["num_drafts"] > 0 and v["vllm"] is None


def test_same_seed_same_draft_and_resume_continues_bit_for_bit(tmp_path, verifier, small_corpus):
    corpus = small_corpus
    opts = {"steps": 6, "save_every": 2}
    a = _train(tmp_path / "a", verifier, corpus, draft_vocab=1024, opts=opts)
    b = _train(tmp_path / "b", verifier, corpus, draft_vocab=1024, opts=opts)
    ta, tb = load_file(str(a.out / "model.safetensors")), load_file(str(b.out / "model.safetensors"))
    assert all(torch.equal(ta[n], tb[n]) for n in ta)

    def stop_after_3(step, loss, acc):
        if step == 2:
            raise KeyboardInterrupt

    with pytest.raises(TrainInterrupted, match="after step 3"):
        _train(tmp_path / "c", verifier, corpus, draft_vocab=1024, opts=opts, log=stop_after_3)
    assert not (tmp_path / "c").exists() and (state_dir(tmp_path / "c") / "state.pt").is_file()
    with pytest.raises(InputError, match="differs in: options"):
        _train(tmp_path / "c", verifier, corpus, draft_vocab=1024, opts={**opts, "lr": 1e-4}, resume=True)
    c = _train(tmp_path / "c", verifier, corpus, draft_vocab=1024, opts=opts, resume=True)
    assert c.stats.resumed_from == 3 and c.stats.steps == 3
    tc = load_file(str(c.out / "model.safetensors"))
    assert all(torch.equal(ta[n], tc[n]) for n in ta)
    assert not state_dir(tmp_path / "c").exists()
    with pytest.raises(InputError, match="no saved training state"):
        _train(tmp_path / "d", verifier, corpus, draft_vocab=1024, opts=opts, resume=True)


def test_dry_run_writes_an_initialised_draft_that_validates(tmp_path, verifier, corpus):
    res = _cli("eagle3", "-o", tmp_path / "out", "--verifier", verifier, "--data", corpus, "--draft-vocab", "1024", "--dry-run", "--no-validate")
    assert res.exit_code == 0, res.output
    assert "initialised, not trained" in res.output
    t = load_file(str(tmp_path / "out" / "model.safetensors"))
    head = _verifier_tensor(verifier, "lm_head.weight")
    assert torch.equal(t["lm_head.weight"], head[t["t2d"]])  # the verifier's rows of the draft vocabulary
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["specfmt"]["train"]["dry_run"] and cfg["specfmt"]["train"]["trained"] == []
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    assert validate_static(tmp_path / "out").ok


def test_output_folder_is_never_half_written_and_bad_options_fail_first(tmp_path, verifier, corpus):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("keep")
    with pytest.raises(OutputExistsError):
        _train(tmp_path / "taken", verifier, corpus, draft_vocab=1024)
    assert (tmp_path / "taken" / "x").read_text() == "keep"
    legacy = write_legacy(tmp_path / "legacy", heads=2, hidden=128, vocab=2048, dtype=torch.float32)
    before = tree_digest(legacy)
    with pytest.raises(InputError, match="the output folder is --init"):  # --force never replaces the --init draft itself
        _train(legacy, verifier, corpus, "medusa", init=str(legacy), heads=3, force=True)
    assert tree_digest(legacy) == before
    res = _cli("eagle3", "-o", tmp_path / "o", "--verifier", verifier, "--steps", "3")
    assert res.exit_code == 2 and "training needs data" in res.output
    res = _cli("eagle", "-o", tmp_path / "o", "--verifier", verifier, "--data", corpus, "--draft-vocab", "10")
    assert res.exit_code == 2 and "EAGLE-3" in res.output
    res = _cli("eagle3", "-o", tmp_path / "o", "--verifier", verifier, "--data", corpus, "--aux-layers", "2,9,4")
    assert res.exit_code == 2 and "tap layer ids" in res.output
    assert not (tmp_path / "o").exists()


# --------------------------------------------------------------------------- data


def test_data_reads_text_jsonl_and_chat_messages(tmp_path, verifier, tokenizer):
    (tmp_path / "a.txt").write_text("def f(x):\n    return x\n")
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "import os\n"}) + "\n\n" + json.dumps({"text": "x = 1\n"}) + "\n")
    docs = read_documents([str(tmp_path / "a.txt"), str(tmp_path / "b.jsonl")], tokenizer)
    assert docs.ids[0] == tokenizer.encode("def f(x):\n    return x\n") + [tokenizer.eos_token_id]
    assert len(docs.ids) == 3 and docs.ids[2][0] == tokenizer.bos_token_id and not docs.chat

    chat = tmp_path / "chat.jsonl"
    chat.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}) + "\n")
    with pytest.raises(InputError, match=r"no chat template.*chat.jsonl:1"):
        read_documents([str(chat)], tokenizer)
    tokenizer.chat_template = "{% for m in messages %}<|bos|>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    try:
        docs = read_documents([str(chat)], tokenizer)
    finally:
        tokenizer.chat_template = None
    assert docs.chat and docs.ids[0] == tokenizer.encode("<|bos|>user: hi\n<|bos|>assistant: hello\n", add_special_tokens=False) + [1]

    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "ok"}) + "\n{not json\n")
    with pytest.raises(InputError, match=r"bad.jsonl:2"):
        read_documents([str(bad)], tokenizer)
    (tmp_path / "c.jsonl").write_text(json.dumps({"input": "x"}) + "\n")
    with pytest.raises(InputError, match=r"each line needs \{\"text\": \.\.\.\}.*this one has 'input'.*c.jsonl:1"):
        read_documents([str(tmp_path / "c.jsonl")], tokenizer)
    with pytest.raises(InputError, match="not found"):
        read_documents([str(tmp_path / "missing.txt")], tokenizer)


def test_windows_are_a_function_of_the_step_and_split_between_ranks():
    docs = [list(range(1000))]
    w = Windows(docs, 16, 4, seed=3)
    again = Windows(docs, 16, 4, seed=3)
    assert torch.equal(w.ids(5), again.ids(5)) and torch.equal(w.ids(200), again.ids(200))  # epoch 200*4 // 61 > 1
    # one epoch visits every window once
    seen = [i for s in range(w.n // 4) for _, i in w.indices(s)]
    assert len(set(seen)) == len(seen)
    r0, r1 = Windows(docs, 16, 4, 3, world=2, rank=0), Windows(docs, 16, 4, 3, world=2, rank=1)
    assert not set(r0.indices(0)) & set(r1.indices(0))
    assert [x for s in range(3) for x in r0.indices(s) + r1.indices(s)] == [x for s in range(6) for x in w.indices(s)]
    with pytest.raises(InputError, match="--seq-len"):
        Windows([[1, 2, 3]], 16, 4, 0)


def test_feature_cache_holds_exactly_the_verifiers_features_and_is_reused(tmp_path, verifier, corpus, tokenizer, hf_verifier, monkeypatch):
    docs = read_documents([str(corpus)], tokenizer)
    w = Windows(docs.ids, 64, 2, 0, fixed=True)
    key = {"data": w.digest(), "taps": [2, 4, 5]}
    cache = FeatureCache(tmp_path / "cache", key)
    cache.build(w, hf_verifier, [2, 4, 5], "cpu")
    assert cache.complete
    idx = [i for _, i in w.indices(7)]
    aux, last = cache.get(idx)
    want_aux, want_last = verifier_features(hf_verifier, w.ids(7), [2, 4, 5])
    assert torch.equal(aux, want_aux) and torch.equal(last, want_last)
    with pytest.raises(InputError, match="differs in: taps"):
        FeatureCache(tmp_path / "cache", {**key, "taps": [1, 2, 3]})

    # a training run with --cache builds it once; the second run never calls the verifier and trains the same draft
    a = _train(tmp_path / "a", verifier, corpus, draft_vocab=1024, cache=str(tmp_path / "c2"))
    import specfmt.training.data as td

    def no_verifier(*a, **k):
        raise AssertionError("the verifier ran although the cache was complete")

    monkeypatch.setattr(td, "verifier_features", no_verifier)
    b = _train(tmp_path / "b", verifier, corpus, draft_vocab=1024, cache=str(tmp_path / "c2"))
    ta, tb = load_file(str(a.out / "model.safetensors")), load_file(str(b.out / "model.safetensors"))
    assert all(torch.equal(ta[n], tb[n]) for n in ta)


# --------------------------------------------------------------------------- several processes


#: two processes average their gradients: their draft is the one-process draft on the same global batch, up to the
#: order of float32 sums (measured: at most 2.4e-7 apart with the full vocabulary; without the averaging 6e-3 apart;
#: with a draft vocabulary and each process dividing by its own count, 4e-3 apart). With AdamW: torch's Muon, EAGLE-3's
#: default since issue 38, orthogonalises each update in bfloat16 (``torch/optim/_muon.py``, ``grad.bfloat16()``), which
#: turns those float32 differences into 4e-3; and at lr 1e-3, where these were measured (AdamW's first steps move a weight
#: by about lr whatever the gradient's size, so a sum rounded the other way moves it by up to 2 lr)
DDP_ATOL = 1e-5


@pytest.mark.parametrize("draft_vocab", [None, 1024], ids=["full-vocabulary", "draft-vocab-1024"])
def test_torchrun_trains_on_two_processes_with_ddp(tmp_path, verifier, corpus, draft_vocab):
    """Two processes of 2 windows a step train the draft one process trains on the same 4 windows a step
    (``Windows`` deals rank r of step s the windows (2s + r)·2 ...): DDP averages the two gradients, and each
    process divides its sum of losses by the count of counted positions over both, halved
    (``loop.global_normaliser``). With a draft vocabulary (``--draft-vocab 1024``) the processes count different
    numbers of positions (those whose verifier token is outside the draft vocabulary are masked), so a mean of
    each process's own mean is not the one-process mean. The top-1 agreement recorded is counted over both
    processes' positions, as one process counts it. torchrun picks a free port (``--standalone``)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    vocab = ["--draft-vocab", str(draft_vocab)] if draft_vocab else []
    common = ["--verifier", str(verifier), "--data", str(corpus), "--steps", "4", "--seq-len", "64", "--device", "cpu", "--no-validate",
              "--optimizer", "adamw", "--lr", "1e-3", *vocab]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "specfmt", "train", "eagle3",
           "-o", str(tmp_path / "out"), "--batch-size", "2", *common]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    train = cfg["specfmt"]["train"]
    assert train["processes"] == 2 and train["tokens"] == 4 * 2 * 2 * 64
    assert cfg["draft_vocab_size"] == (draft_vocab or 2048)
    assert validate_static(tmp_path / "out").ok
    assert proc.stdout.count("wrote ") == 1  # process 0 alone writes
    one = _cli("eagle3", "-o", tmp_path / "one", "--batch-size", "4", *common)
    assert one.exit_code == 0, one.output
    two, single = load_file(str(tmp_path / "out" / "model.safetensors")), load_file(str(tmp_path / "one" / "model.safetensors"))
    assert set(two) == set(single)
    start = json.loads((tmp_path / "one" / "config.json").read_text())["specfmt"]["train"]
    assert start["processes"] == 1 and start["tokens"] == train["tokens"]
    if draft_vocab:  # the same vocabulary map (built from the same data): the processes differ only in how they count
        assert torch.equal(two["d2t"], single["d2t"]) and torch.equal(two["t2d"], single["t2d"])
    for name, t in single.items():
        torch.testing.assert_close(two[name], t, rtol=0, atol=DDP_ATOL, msg=lambda m, n=name: f"{n}: {m}")
    # the figures are counted over both processes' positions (process 0's alone would give another ratio)
    assert train["top1_agreement"] == start["top1_agreement"], (train["top1_agreement"], start["top1_agreement"])
