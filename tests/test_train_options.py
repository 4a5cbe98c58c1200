"""``specfmt train eagle3``'s options for a new draft (issue 27): ``--vocab-from``, the EAGLE-3.1 norms,
``--lm-head``, ``--ttt-decay``: parsed and refused, written into the config and the provenance, and what they do."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import WORLD
from specfmt.algorithms.eagle3 import COVERAGE_WARN, Eagle3, Eagle3Options
from specfmt.errors import InputError
from specfmt.format.draft import Draft
from specfmt.training.data import VerifierTop1
from specfmt.training.loop import TrainOptions
from specfmt.training.pipeline import TrainRequest, train_draft

VERIFIER = WORLD / "verifier"
algo = Eagle3()


@pytest.mark.parametrize("given, message", [
    ({"norm_before_fc": True, "fc_norm": True}, "--norm-before-fc and --fc-norm are exclusive"),
    ({"vocab_from": "text"}, "--vocab-from must be verifier or data"),
    ({"lm_head": "tied"}, "--lm-head must be trained or frozen"),
    ({"ttt_decay": 0.0}, "--ttt-decay must be in (0, 1]"),
    ({"ttt_decay": 1.5}, "--ttt-decay must be in (0, 1]"),
])
def test_bad_values_are_refused_in_one_line(given, message):
    with pytest.raises(InputError) as e:
        algo.parse_options(given, init=False)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_new_draft_options_are_refused_with_init_and_the_vocabulary_default_follows_the_data():
    for flag, key in (("--norm-before-fc", "norm_before_fc"), ("--fc-norm", "fc_norm"), ("--norm-output", "norm_output")):
        with pytest.raises(InputError, match=f"{flag} shapes a new draft"):
            algo.parse_options({key: True}, init=True)
    # --lm-head, --ttt-decay and --vocab-from also apply to an --init draft
    opts = algo.parse_options({"lm_head": "frozen", "ttt_decay": 1.0, "vocab_from": "verifier"}, init=True)
    assert (opts.lm_head, opts.ttt_decay) == ("frozen", 1.0)
    settle = algo.settle_options
    assert settle(Eagle3Options(), counts_only=False, init=False).vocab_from == "verifier"  # a new draft
    assert settle(Eagle3Options(), counts_only=False, init=True).vocab_from == "data"  # an --init draft's map, as cnets.py built it
    assert settle(Eagle3Options(), counts_only=True, init=False).vocab_from == "data"  # hidden-states data: token_freq.pt
    assert settle(Eagle3Options(vocab_from="data"), counts_only=False, init=False).vocab_from == "data"
    with pytest.raises(InputError, match="--vocab-from verifier needs the token ids of --data"):
        settle(Eagle3Options(vocab_from="verifier"), counts_only=True, init=False)
    with pytest.raises(InputError, match="--vocab-from verifier"):  # before anything is read
        train_draft(TrainRequest("unused", str(VERIFIER), algorithm="eagle3", hidden_states="nowhere", vocab_from="verifier"), TrainOptions())


def test_a_new_drafts_config_carries_each_norm_flag():
    from specfmt.sources.verifier import Verifier

    verifier = Verifier.load(str(VERIFIER))
    keys = ("norm_before_fc", "fc_norm", "norm_output")
    for on in (None, *keys):
        shape = algo.new_shape(Eagle3Options(**({on: True} if on else {})))
        cfg = algo.new_config(verifier, shape)
        assert {k: cfg[k] for k in keys} == {k: k == on for k in keys}
        specs = algo.expected_tensors(cfg)
        assert ("input_norm.weight" in specs) is (on == "norm_before_fc") and ("fc_norm.0.weight" in specs) is (on == "fc_norm")


class _Fake:
    """A verifier over V = 6 that predicts ``(id + 1) % V`` at every position (its logits are one-hot rows)."""

    V = 6

    def __init__(self):
        self.embed = torch.nn.Embedding(self.V, self.V)
        self.embed.weight.data = torch.eye(self.V)
        self.head = torch.nn.Linear(self.V, self.V, bias=False)
        self.head.weight.data = torch.roll(torch.eye(self.V), 1, dims=0)  # logits[j] = x[j - 1]

    def get_decoder(self):
        def run(input_ids, output_hidden_states, use_cache):
            return type("Out", (), {"last_hidden_state": self.embed(input_ids), "hidden_states": None})

        return run

    def get_input_embeddings(self):
        return self.embed

    def get_output_embeddings(self):
        return self.head


def test_vocab_from_verifier_counts_the_verifiers_top1_not_the_text_and_reports_coverage():
    # the text is mostly 0s: by frequency the vocabulary is {0, 1}; the verifier predicts id + 1 after each token
    docs = [[0, 0, 0, 0, 0, 3, 0, 0], [4, 0, 0, 0, 1]]
    loads = []
    top1 = VerifierTop1(lambda: loads.append(1) or _Fake(), docs, seq_len=4, batch=2)
    assert loads == []  # nothing runs before the counts are read
    # the training windows of 4 over the stream 0 0 0 0 | 0 3 0 0 | 4 0 0 0 1 (Windows: n = (13 - 4) // 4 = 2);
    # positions 1..3 of each predict id + 1: [0 0 0] -> 1 1 1, [3 0 0] -> 4 1 1
    assert dict(top1) == {1: 5, 4: 1} and loads == [1]
    text_vocab = {0, 3}  # the text's most frequent ids after each document's first (cnets.py)
    cfg = {"transformer_layer_config": {"vocab_size": 6}, "draft_vocab_size": 2}
    draft = Draft(cfg, {})
    filled = algo.fill_vocab_map(draft, top1)
    assert set(draft.tensors["t2d"].nonzero().flatten().tolist()) == {1, 4} != text_vocab
    assert "covering 100.0% of them (verifier top-1 coverage)" in filled["d2t"] and top1.notes == []
    # a vocabulary of one id covers 5 of the 6 positions: 83.3 %, below the threshold, warned about (not refused)
    low = VerifierTop1(lambda: _Fake(), docs, seq_len=4, batch=2)
    draft.tensors = {}
    cfg["draft_vocab_size"] = 1
    filled = algo.fill_vocab_map(draft, low)
    assert "covering 83.3%" in filled["d2t"] and COVERAGE_WARN > 0.834
    assert len(low.notes) == 1 and low.notes[0].startswith("warning: the draft vocabulary covers 83.3%")
    # a vocabulary larger than the ids the verifier predicts is filled by the text's frequency (cnets.py counts)
    draft.tensors = {}
    cfg["draft_vocab_size"] = 3
    filled = algo.fill_vocab_map(draft, VerifierTop1(lambda: _Fake(), docs, seq_len=4, batch=2))
    assert set(draft.tensors["t2d"].nonzero().flatten().tolist()) == {0, 1, 4} and "1 ids it never predicts" in filled["d2t"]


def test_frozen_lm_head_stays_bit_identical_is_out_of_the_optimizer_and_the_choices_are_recorded(tmp_path, monkeypatch):
    optimised: list[list[tuple[int, ...]]] = []  # the shapes of the parameters each optimizer is given
    real = torch.optim.AdamW

    def adamw(params, **kw):
        params = list(params)
        optimised.append([tuple(p.shape) for p in params])
        return real(params, **kw)

    monkeypatch.setattr(torch.optim, "AdamW", adamw)
    data = tmp_path / "data.txt"
    data.write_text((WORLD / "prompts.jsonl").read_text() * 2)
    req = TrainRequest(str(tmp_path / "out"), str(VERIFIER), algorithm="eagle3", data=[str(data)], validate=False, device="cpu",
                       draft_vocab=256, lm_head="frozen", norm_output=True, ttt_decay=1.0)
    res = train_draft(req, TrainOptions(steps=3, batch_size=2, seq_len=64, lr=1e-2, optimizer="adamw", save_every=0))  # Muon's split: test_train_optimizer.py
    assert "lm_head.weight" not in res.trained and "fc.weight" in res.trained
    assert len(optimised) == 1 and (256, 128) not in optimised[0] and (128, 384) in optimised[0]  # lm_head [Vd, H] out, fc in
    out = load_file(str(tmp_path / "out" / "model.safetensors"))
    head = load_file(str(VERIFIER / "model.safetensors"))["lm_head.weight"]
    assert torch.equal(out["lm_head.weight"], head[out["t2d"]])  # the verifier's rows, untouched by 3 steps at lr 1e-2
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    train = cfg["specfmt"]["train"]
    assert {k: train["options"][k] for k in ("vocab_from", "lm_head", "norm_output", "ttt_decay")} == \
        {"vocab_from": "verifier", "lm_head": "frozen", "norm_output": True, "ttt_decay": 1.0}
    assert cfg["norm_output"] is True
    assert "the verifier's top-1 predictions over the training positions, covering" in train["filled"]["d2t"]
