"""One data-file format for every command that reads prompts or data (issue 35): ``validate --prompts``, ``train
--data``, ``datagen --data`` and ``regenerate --data`` read through :mod:`specfmt.sources.records`, so a line one
accepts, all accept, and a bad line is refused by all at the same ``file:line``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import WORLD
from specfmt.cli import app
from specfmt.errors import InputError
from specfmt.sources.records import read_records

TEMPLATE = "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"

#: one line of each kind the format has
LINES = [{"text": "def f(x):\n    return x"}, {"prompt": "class Template:"},
         {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}]},
         {"conversations": [{"from": "human", "value": "why?"}, {"from": "gpt", "value": "because"}], "id": "sharegpt-1"}]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(WORLD / "verifier"))
    tok.chat_template = TEMPLATE
    return tok


def _write(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _readers(tokenizer):
    """Every command's reader of a data file: (command, read(path))."""
    from specfmt.datagen.chat import read_samples
    from specfmt.datagen.regenerate import read_conversations
    from specfmt.training.data import read_documents
    from specfmt.validation.prompts import load_prompts

    return [("validate --prompts", lambda p: load_prompts(str(p), tokenizer).texts),
            ("train --data", lambda p: read_documents([str(p)], tokenizer).ids),
            ("datagen --data", lambda p: read_samples([str(p)], tokenizer, 64).samples),
            ("regenerate --data", lambda p: read_conversations(p, chat=True))]


def test_every_command_reads_every_kind_of_line(tmp_path, tokenizer):
    """Item 8: validate --prompts refused {"text": ...} lines that train, datagen and regenerate accept."""
    data = _write(tmp_path / "data.jsonl", LINES)
    for command, read in _readers(tokenizer):
        got = read(data)
        assert len(got) >= len(LINES), (command, got)  # datagen: a row per assistant turn


@pytest.mark.parametrize("row,says", [
    ('{"text": "a", ', "line is not JSON (Expecting property name enclosed in double quotes at column 15)"),
    ({"txt": "a"}, "each line needs"),
    (["text", "a"], "needs a JSON object"),
    ({"text": 3}, "'text' must be a string"),
    ({"messages": "hi"}, "'messages' must be a list"),
    ({"text": "a", "messages": []}, "both 'text' and 'messages'"),
])
def test_a_bad_line_is_refused_by_every_command_at_its_line(tmp_path, tokenizer, row, says):
    """Every reader refuses the same line with the same message at the same place, the column of a JSON error
    included (before: validate's JSON error dropped the position within the line)."""
    data = _write(tmp_path / "data.jsonl", [LINES[0], "", row])
    for command, read in _readers(tokenizer):
        with pytest.raises(InputError) as e:
            read(data)
        assert e.value.where == f"{data}:3" and says in e.value.message, (command, e.value.one_line())


def test_a_text_file_is_one_document_and_position_is_exact(tmp_path):
    (tmp_path / "doc.txt").write_text("one\r\ntwo\n")
    assert [(r.where, r.text) for r in read_records(tmp_path / "doc.txt")] == [(str(tmp_path / "doc.txt"), "one\ntwo\n")]
    (tmp_path / "bad.txt").write_bytes(b"ok\n\xff")
    with pytest.raises(InputError, match="not UTF-8 text .* at byte 3"):
        list(read_records(tmp_path / "bad.txt"))
    # a JSON string may hold U+2028 (a line break to str.splitlines, not to jsonl): the record stays whole
    (tmp_path / "u.jsonl").write_text(json.dumps({"text": "a\u2028b"}, ensure_ascii=False) + "\n" + json.dumps({"text": "c"}) + "\n")
    assert [(r.where.rsplit(":", 1)[1], r.text) for r in read_records(tmp_path / "u.jsonl")] == [("1", "a\u2028b"), ("2", "c")]


def test_validate_accepts_text_prompts_on_the_command_line(tmp_path, monkeypatch):
    """The command itself: `validate --run --prompts` with {"text": ...} lines reads them (it failed on main with
    'each line needs a "prompt" string'); nothing is run here (vLLM and the verifier stubbed out)."""
    from specfmt.validation import run as vr

    data = _write(tmp_path / "p.jsonl", [{"text": "def f(x):"}])
    vr.check_inputs(tmp_path, prompts=str(data), max_tokens=8, num_speculative_tokens=None, min_acceptance_length=None, tolerance=0.1,
                    use_vllm=False, timeout=10, write=False, tensor_parallel_size=1, gpu_memory_utilization=None)


def test_regenerate_keeps_the_inputs_id_and_fields(tmp_path):
    """Item 8: regenerate replaced the input's `id` with `primary_id`. The output line keeps the input's own fields
    (id, metadata) and adds the resume key."""
    from specfmt.datagen.regenerate import read_conversations

    data = _write(tmp_path / "in.jsonl", [{"id": "conv-7", "source": "sharegpt", "messages": [{"role": "user", "content": "hi"}]},
                                          {"prompt": "class A:", "meta": {"n": 1}}])
    convs = read_conversations(data, chat=True)
    for c in convs:
        c.answers = ["ok"]
    first, second = (c.record() for c in convs)
    assert first["id"] == "conv-7" and first["source"] == "sharegpt" and first["primary_id"] == "conv-7"
    assert first["messages"] == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]
    assert second["meta"] == {"n": 1} and second["primary_id"].startswith("hash_") and "prompt" not in second
