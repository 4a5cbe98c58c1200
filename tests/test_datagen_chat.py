"""Chat data with an assistant-only loss mask (specfmt/datagen/chat.py), against the rendered template. The comparison
with speculators 0.9's own ``prepare-data`` preprocessing is in tests/test_datagen.py (one speculators env per module)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specfmt.datagen.chat import assistant_rows, read_samples
from specfmt.errors import InputError

WORLD = Path(__file__).resolve().parents[1] / "examples" / "world" / "verifier"
TEMPLATE = ("{% for m in messages %}<|bos|>{{ m['role'] }}\n{{ m['content'] }}<|eos|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|bos|>assistant\n{% endif %}")
CONV = [{"role": "system", "content": "You write Python."},
        {"role": "user", "content": "Sort a list."},
        {"role": "assistant", "content": "Use sorted(xs)."},
        {"role": "user", "content": "In place?"},
        {"role": "assistant", "content": "Call xs.sort() instead."}]


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    t = AutoTokenizer.from_pretrained(str(WORLD))
    t.chat_template = TEMPLATE
    return t


def _text(tok, ids):
    return tok.decode(ids, skip_special_tokens=False)


def test_loss_mask_covers_exactly_each_assistant_turn(tok):
    """A system turn and two assistant turns: two rows; row j is the template's render of the turns up to assistant
    turn j, and its masked tokens spell exactly that turn's content and the template's close of the turn."""
    rows, unsupervised, skipped = assistant_rows(tok, CONV, 512)
    assert (len(rows), unsupervised, skipped) == (2, 0, 0)
    for row, upto, answer in zip(rows, (3, 5), ("Use sorted(xs).", "Call xs.sort() instead.")):
        assert _text(tok, row.input_ids) == tok.apply_chat_template(CONV[:upto], tokenize=False)
        first = row.loss_mask.index(1)
        assert set(row.loss_mask[first:]) == {1} and set(row.loss_mask[:first]) == {0}  # one span, at the end
        assert _text(tok, row.input_ids[first:]) == answer + "<|eos|>\n"
        assert _text(tok, row.input_ids[:first]).endswith("<|bos|>assistant\n")
    assert "Use sorted(xs)." in _text(tok, rows[1].input_ids[:rows[1].loss_mask.index(1)])  # turn 1 is context in row 2


def test_cut_to_seq_len_skips_and_drops_as_speculators(tok):
    full = len(assistant_rows(tok, CONV, 512)[0][1].input_ids)
    prompt2 = len(tok.encode(tok.apply_chat_template(CONV[:4], tokenize=False, add_generation_prompt=True), add_special_tokens=False))
    rows, unsupervised, skipped = assistant_rows(tok, CONV, prompt2)  # the second prompt fills the window: skipped
    assert len(rows) == 1 and skipped == 1 and unsupervised == 0
    rows, _, _ = assistant_rows(tok, CONV, full - 2)
    assert len(rows[1].input_ids) == full - 2 and rows[1].loss_mask[-1] == 1


def test_read_samples_text_and_chat(tok, tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"text": "x = 1\n" * 200}) + "\n" + json.dumps({"messages": CONV}) + "\n")
    out = read_samples([str(data)], tok, 128)
    assert len(out.samples) == 3 and out.chat and str(data) in out.files and out.skipped_turns == 0
    assert len(out.samples[0]) == 128 and set(out.samples[0].loss_mask) == {1} and out.samples[0].input_ids[0] == tok.bos_token_id
    assert out.samples[1:] == assistant_rows(tok, CONV, 128)[0]
    tok2 = type(tok).from_pretrained(str(WORLD))  # no template
    with pytest.raises(InputError, match=r"no chat template \[.*d.jsonl:2\]"):
        read_samples([str(data)], tok2, 16)
    data.write_text(json.dumps({"messages": [{"role": "robot", "content": "x"}]}) + "\n")
    with pytest.raises(InputError, match="turn 0 has role 'robot'"):
        read_samples([str(data)], tok, 16)
