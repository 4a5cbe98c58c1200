"""``specfmt regenerate``: the verifier rewrites every assistant turn (specfmt/datagen/regenerate.py).

The logic (turn order, resume, interruption, bad input) runs against a scripted completer; one vLLM
run (a ``specfmt regenerate`` child process: one engine start for the module) proves that greedy
regeneration is transformers' greedy ``generate`` on the same rendered prompt, token for token."""

import json
import shutil
from pathlib import Path

import pytest

from conftest import REPO, run_cli
from specfmt.datagen.regenerate import Settings, run
from specfmt.errors import DataInterrupted, InputError, OutputExistsError

WORLD = REPO / "examples" / "world"
TEMPLATE = ("{% for m in messages %}<|bos|>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|bos|>assistant: {% endif %}")


@pytest.fixture(scope="module")
def chat_verifier(tmp_path_factory) -> Path:
    """A copy of the example verifier (which has no chat template) with a small chat template."""
    v = tmp_path_factory.mktemp("regen") / "verifier"
    shutil.copytree(WORLD / "verifier", v)
    cfg = json.loads((v / "tokenizer_config.json").read_text())
    (v / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": TEMPLATE}))
    return v


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


CHATS = [
    {"messages": [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "def split(s):"},
                  {"role": "assistant", "content": "OLD ANSWER"}, {"role": "user", "content": "import os"}]},
    {"prompt": "class Template:"},
    {"text": "for line in lines:", "id": "third"},
]


class Scripted:
    """A completer that answers with the prompt's last 3 tokens, and records every prompt it saw."""

    def __init__(self, stop_after: int | None = None):
        self.prompts: list[list[int]] = []
        self.calls = 0
        self.stop_after = stop_after

    def __call__(self, prompts):
        self.calls += 1
        if self.stop_after is not None and self.calls > self.stop_after:
            raise KeyboardInterrupt
        self.prompts += [ids for ids, _ in prompts]
        return [(ids[-3:], False) for ids, _ in prompts]


def regen(verifier, data, out, scripted, **kw):
    return run(str(verifier), str(data), str(out), kw.pop("settings", Settings()), completer=lambda: scripted, **kw)


def test_every_assistant_turn_is_regenerated_given_the_regenerated_history(tmp_path, chat_verifier):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(chat_verifier))
    data = write_jsonl(tmp_path / "in.jsonl", CHATS)
    s = Scripted()
    figures = regen(chat_verifier, data, tmp_path / "out.jsonl", s)
    assert figures == {"written": 3, "skipped": 0, "generated_tokens": 4 * 3, "truncated_turns": 0}
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    first = rows[0]["messages"]
    assert [m["role"] for m in first] == ["system", "user", "assistant", "user", "assistant"]
    assert "OLD ANSWER" not in json.dumps(rows)
    # the second turn's prompt holds the first turn's regenerated answer, not the original one
    want = tok.apply_chat_template(first[:4], add_generation_prompt=True, tokenize=False)
    assert s.prompts[3] == tok.encode(want, add_special_tokens=False)
    assert first[2]["content"] == tok.decode(s.prompts[0][-3:], skip_special_tokens=True)
    assert rows[1]["messages"][0] == {"role": "user", "content": "class Template:"} and rows[2]["primary_id"] == "third"


def test_the_output_is_training_data(tmp_path, chat_verifier):
    from transformers import AutoTokenizer

    from specfmt.training.data import read_documents

    data = write_jsonl(tmp_path / "in.jsonl", CHATS)
    regen(chat_verifier, data, tmp_path / "out.jsonl", Scripted())
    docs = read_documents([str(tmp_path / "out.jsonl")], AutoTokenizer.from_pretrained(str(chat_verifier)))
    assert len(docs.ids) == 3 and docs.chat


def test_without_a_chat_template_prompts_are_continued_as_text(tmp_path):
    data = write_jsonl(tmp_path / "in.jsonl", [{"prompt": "def f(x):"}])
    regen(WORLD / "verifier", data, tmp_path / "out.jsonl", Scripted())
    row = json.loads((tmp_path / "out.jsonl").read_text())
    assert set(row) == {"text", "primary_id"} and row["text"].startswith("def f(x):") and len(row["text"]) > len("def f(x):")
    bad = write_jsonl(tmp_path / "chat.jsonl", [CHATS[0]])
    with pytest.raises(InputError, match="no chat template") as e:
        regen(WORLD / "verifier", bad, tmp_path / "out2.jsonl", Scripted())
    assert e.value.where == f"{bad}:1"


def test_resume_skips_done_conversations_and_refuses_other_settings(tmp_path, chat_verifier):
    data = write_jsonl(tmp_path / "in.jsonl", CHATS)
    out = tmp_path / "out.jsonl"
    regen(chat_verifier, data, out, Scripted(), limit=2)
    head = out.read_text()
    with pytest.raises(OutputExistsError, match="the output file exists"):
        regen(chat_verifier, data, out, Scripted())
    with pytest.raises(InputError, match="other settings"):
        regen(chat_verifier, data, out, Scripted(), resume=True, settings=Settings(max_tokens=7))
    s = Scripted()
    assert regen(chat_verifier, data, out, s, resume=True)["skipped"] == 2
    assert s.calls == 1 and out.read_text().startswith(head) and len(out.read_text().splitlines()) == 3
    full = tmp_path / "full.jsonl"
    regen(chat_verifier, data, full, Scripted())
    assert full.read_text() == out.read_text()
    built = []
    assert run(str(chat_verifier), str(data), str(out), Settings(), resume=True, completer=lambda: built.append(1))["written"] == 0
    assert built == []  # nothing left: no engine is started


def test_ctrl_c_leaves_whole_lines_and_resume_finishes_the_same(tmp_path, chat_verifier):
    data = write_jsonl(tmp_path / "in.jsonl", CHATS)
    out = tmp_path / "out.jsonl"
    with pytest.raises(DataInterrupted, match="interrupted after 1 of 3"):
        regen(chat_verifier, data, out, Scripted(stop_after=2), batch=1)  # conversation 1 needs 2 calls, 2 the 3rd
    assert len(out.read_text().splitlines()) == 1 and out.read_text().endswith("\n")
    with open(out, "a") as f:
        f.write('{"messages": [{"role": "user", "con')  # a line torn by a crash mid-write
    regen(chat_verifier, data, out, Scripted(), resume=True, batch=1)
    full = tmp_path / "full.jsonl"
    regen(chat_verifier, data, full, Scripted())
    assert out.read_text() == full.read_text()


@pytest.mark.parametrize("row, what", [
    ("{not json", "line is not JSON"),
    ({"txt": "x"}, r"each line needs \{\"text\": ...\} \(or \"prompt\"\), or chat \{\"messages\": \[...\]\}; this one has 'txt'"),
    ({"messages": [{"role": "robot", "content": "x"}]}, r"messages\[0\] needs a role"),
    ({"messages": [{"role": "system", "content": "x"}]}, "no user turn"),
    ({"prompt": "class Template:"}, "the same conversation"),
])
def test_bad_lines_are_named(tmp_path, chat_verifier, row, what):
    data = write_jsonl(tmp_path / "in.jsonl", [{"prompt": "class Template:"}, row])
    before = data.read_bytes()
    with pytest.raises(InputError, match=what) as e:
        regen(chat_verifier, data, tmp_path / "out.jsonl", Scripted())
    assert e.value.where == f"{data}:2" and data.read_bytes() == before and not (tmp_path / "out.jsonl").exists()


def test_the_command_reports_bad_input_in_one_line(tmp_path, chat_verifier):
    from typer.testing import CliRunner

    from specfmt.cli import app

    data = write_jsonl(tmp_path / "in.jsonl", [{"prompt": "x"}, {"txt": "x"}])
    r = CliRunner().invoke(app, ["regenerate", "--verifier", str(chat_verifier), "--data", str(data), "--out", str(tmp_path / "out.jsonl")], terminal_width=400)
    assert r.exit_code == 2 and r.output.strip().splitlines() == [
        f'specfmt: error: each line needs {{"text": ...}} (or "prompt"), or chat {{"messages": [...]}}; this one has \'txt\' [{data}:2]']
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.vllm
def test_greedy_regeneration_is_the_verifiers_greedy_generate(tmp_path, chat_verifier):
    """One vLLM engine: the command regenerates 3 conversations (3 turns; the first conversation, done by a previous
    run, is kept); each regenerated turn equals transformers' greedy ``generate`` on the same rendered prompt."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    data = write_jsonl(tmp_path / "in.jsonl", CHATS + [{"prompt": "import re"}])  # 5 turns
    out = tmp_path / "out.jsonl"
    regen(chat_verifier, data, out, Scripted(), limit=1, settings=Settings(max_tokens=16), dtype="float32")
    done = out.read_text()
    r = run_cli("regenerate", "--verifier", chat_verifier, "--data", data, "--out", out, "--max-tokens", "16", "--max-model-len", "256", "--resume",
                "--dtype", "float32")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "wrote 3 conversations (1 already done)" in " ".join(r.stdout.split())
    text = out.read_text()
    assert text.startswith(done)  # the done conversation is kept as it was, not regenerated
    tok = AutoTokenizer.from_pretrained(str(chat_verifier))
    model = AutoModelForCausalLM.from_pretrained(str(chat_verifier), dtype=torch.float32).eval()
    turns = 0
    for line in text.splitlines()[1:]:
        msgs = json.loads(line)["messages"]
        for i in [i for i, m in enumerate(msgs) if m["role"] == "assistant"]:
            prompt = tok.encode(tok.apply_chat_template(msgs[:i], add_generation_prompt=True, tokenize=False), add_special_tokens=False)
            with torch.no_grad():
                ids = model.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False, eos_token_id=tok.eos_token_id)[0, len(prompt):]
            assert msgs[i]["content"] == tok.decode(ids.tolist(), skip_special_tokens=True), (line, i)
            turns += 1
    assert turns == 3
    prov = json.loads((tmp_path / "out.jsonl.provenance.json").read_text())
    assert prov["complete"] and prov["settings"] == {"temperature": 0.0, "max_tokens": 16}


def test_ctrl_c_while_the_engine_starts_is_an_interruption(tmp_path, chat_verifier):
    def interrupted():
        raise KeyboardInterrupt

    data = write_jsonl(tmp_path / "in.jsonl", CHATS)
    with pytest.raises(DataInterrupted, match="interrupted after 0 of 3"):
        run(str(chat_verifier), str(data), str(tmp_path / "out.jsonl"), Settings(), completer=interrupted)
    assert not (tmp_path / "out.jsonl").exists()


# --------------------------------------------------------------------------- the output file (issue 35)


@pytest.mark.parametrize("where,words", [("verifier/regen.jsonl", "the output file lies inside --verifier"),
                                         ("in.jsonl", "the output file is --data"), ("box", "the output file contains --data")])
def test_regenerate_never_writes_into_an_input(tmp_path, chat_verifier, where, words):
    """The issue's ``regenerate -o VERIFIER/regen.jsonl`` wrote its record into the verifier: now one line, before the
    tokenizer is read, and nothing written."""
    from typer.testing import CliRunner

    from specfmt.cli import app
    from test_outputs import snapshot

    ws = tmp_path / "ws"
    shutil.copytree(chat_verifier, ws / "verifier")
    (ws / "box").mkdir()
    data = write_jsonl(ws / "box" / "in.jsonl", CHATS)
    out = ws / "box" / where if where == "in.jsonl" else ws / where
    before = snapshot(ws)
    r = CliRunner().invoke(app, ["regenerate", "--verifier", str(ws / "verifier"), "--data", str(data), "-o", str(out)], terminal_width=400)
    lines = r.output.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith(f"specfmt: error: {words} "), r.output
    assert snapshot(ws) == before


def test_resume_continues_only_its_own_output(tmp_path, chat_verifier):
    """``--resume`` continues an output this command wrote from this input, nothing else: a file with no record, a record
    another tool wrote, a line that is not one of this input's conversations (a foreign id, no ``primary_id``: was a
    KeyError traceback) are each one line, and leave the files as they were."""
    data = write_jsonl(tmp_path / "in.jsonl", CHATS)
    out = tmp_path / "out.jsonl"
    record = tmp_path / "out.jsonl.provenance.json"

    def refused(error, match):
        before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
        with pytest.raises(error, match=match):
            regen(chat_verifier, data, out, Scripted(), resume=True)
        assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before

    out.write_text('{"text": "someone else\'s", "primary_id": "third"}\n')
    refused(OutputExistsError, "the output file has no .provenance.json record: it is not the output of an earlier specfmt regenerate run")
    record.write_text(json.dumps({"tool": "another tool"}))
    refused(OutputExistsError, "out.jsonl.provenance.json exists and is not a record specfmt regenerate wrote")
    out.unlink()
    refused(OutputExistsError, "out.jsonl.provenance.json exists and is not a record specfmt regenerate wrote")  # no output: the record is not ours
    record.unlink()
    regen(chat_verifier, data, out, Scripted(), limit=1)
    good = out.read_text()
    for line, why in (('{"messages": [], "primary_id": "not-in-the-input"}', "is not in --data"), ('{"messages": []}', "has no primary_id"),
                      ("[1, 2]", "has no primary_id"), (good.strip(), "is there twice")):
        out.write_text(good + line + "\n")
        refused(InputError, rf"line 2 of the output is not a conversation this run writes \({why}\)")
    out.write_text(good)
    assert regen(chat_verifier, data, out, Scripted(), resume=True)["skipped"] == 1  # its own output: continued


def test_the_output_and_its_record_follow_the_umask(tmp_path, chat_verifier):
    """Files as ``open()`` makes them: 0666 & ~umask (umask 002: 0664; the output was opened 0644)."""
    import os
    import stat

    data = write_jsonl(tmp_path / "in.jsonl", CHATS)
    old = os.umask(0o002)
    try:
        regen(chat_verifier, data, tmp_path / "out.jsonl", Scripted())
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.glob("out.jsonl*")}
    assert modes == {"out.jsonl": 0o664, "out.jsonl.provenance.json": 0o664}
