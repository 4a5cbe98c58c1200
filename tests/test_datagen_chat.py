"""Chat data with an assistant-only loss mask (specfmt/datagen/chat.py), against the rendered template and against
speculators 0.9's own ``prepare-data`` preprocessing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specfmt.datagen.chat import assistant_rows, read_samples
from specfmt.errors import InputError
from speculators_env import spec_env  # noqa: F401  (fixture)

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


SPEC_PREPROCESS = r"""
import json, sys
from transformers import AutoTokenizer
import speculators.data_generation.preprocessing as pre
tok = AutoTokenizer.from_pretrained(sys.argv[1])
def render(endpoint, messages, *, add_generation_prompt, tools=None, chat_template_kwargs=None, truncate_prompt_tokens=None,
           truncation_side=None, **kw):
    # vLLM's /render: the chat template, tokenized without added special tokens, cut on the right
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    return tok.encode(text, add_special_tokens=False)[:truncate_prompt_tokens]
pre.render_conversation = render
convs = json.loads(sys.argv[2])
# the batch function build_speculator_training_dataset maps over the dataset (its dataset.map is left out: datasets'
# fingerprinting cannot pickle in the forked env)
out = pre._preprocess_batch({"conversations": convs}, False, "http://unused", int(sys.argv[3]))
print("REPORT " + json.dumps({"input_ids": [t.tolist() for t in out["input_ids"]], "loss_mask": [t.tolist() for t in out["loss_mask"]],
                              "seq_len": out["seq_len"]}))
"""


def test_rows_equal_speculators_prepare_data(spec_env, tok, tmp_path):
    """speculators 0.9's ``_preprocess_batch`` (what ``build_speculator_training_dataset`` maps; its ``/render`` call answered by the same template through
    transformers, as vLLM renders it) makes the same rows, masks and seq_len, including the skip and cut at a short window."""
    tok.save_pretrained(str(tmp_path / "tok"))
    sharegpt = [{"from": {"user": "human", "assistant": "gpt"}.get(t["role"], t["role"]), "value": t["content"]} for t in CONV]
    convs = [CONV, sharegpt, CONV[1:3]]
    for seq_len in (512, 30):
        r = spec_env.run("-c", SPEC_PREPROCESS, tmp_path / "tok", json.dumps(convs), seq_len)
        line = next((ln for ln in r.stdout.splitlines() if ln.startswith("REPORT ")), None)
        assert line is not None, r.stderr[-3000:]
        theirs = json.loads(line[len("REPORT "):])
        ours = [s for c in convs for s in assistant_rows(tok, c, seq_len)[0]]
        assert len(ours) == 5 if seq_len == 512 else 0 < len(ours) < 5
        assert theirs["input_ids"] == [list(s.input_ids) for s in ours]
        assert theirs["loss_mask"] == [list(s.loss_mask) for s in ours]
        assert theirs["seq_len"] == [len(s) for s in ours]
