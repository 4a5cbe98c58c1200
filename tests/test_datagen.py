"""``specfmt datagen`` with the transformers engine (no vLLM): the engine's layers, the pipeline's resume, checks,
interruption and sharding, and the command end to end on examples/world."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from specfmt.cli import app
from specfmt.datagen import pipeline as dg
from specfmt.datagen.chat import read_samples
from specfmt.datagen.hf_engine import TransformersEngine
from specfmt.datagen.layout import check_sample, existing_samples, hidden_states_folder, read_manifest, read_preprocessed, sample_path
from specfmt.errors import DataInterrupted, InputError, VLLMRunError
from specfmt.sources.verifier import Verifier
from speculators_env import spec_env  # noqa: F401  (fixture)
from specfmt.datagen.chat import assistant_rows

real_find_spec = importlib.util.find_spec
WORLD = Path(__file__).resolve().parents[1] / "examples" / "world" / "verifier"
TEMPLATE = ("{% for m in messages %}<|bos|>{{ m['role'] }}\n{{ m['content'] }}<|eos|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|bos|>assistant\n{% endif %}")
CONV = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "Sort a list."},
        {"role": "assistant", "content": "Use sorted(xs)."}, {"role": "user", "content": "In place?"},
        {"role": "assistant", "content": "Call xs.sort() instead."}]


@pytest.fixture(scope="module")
def verifier(tmp_path_factory) -> Path:
    """The world's verifier with a chat template."""
    d = tmp_path_factory.mktemp("verifier")
    for f in WORLD.iterdir():
        shutil.copy(f, d / f.name)
    cfg = json.loads((WORLD / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": TEMPLATE}))
    return d


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("data") / "d.jsonl"
    lines = [{"text": f"def f{i}(x):\n    return x * {i}\n" * (i + 1)} for i in range(4)] + [{"messages": CONV}]
    p.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return p


def _req(verifier, data, out, **kw) -> dg.DatagenRequest:
    return dg.DatagenRequest(verifier=str(verifier), data=[str(data)], output=str(out), seq_len=kw.pop("seq_len", 64),
                             engine=kw.pop("engine", "transformers"), **kw)


@pytest.mark.parametrize("world", ["world", "world-qwen3"])
def test_engine_layers_are_the_residual_stream_and_the_last_before_the_norm(world):
    """Layer l < L is transformers' ``hidden_states[l]``; layer L, once the verifier's final norm is applied, is
    ``hidden_states[L]`` (transformers' last entry is after the norm), and differs from it before."""
    v = Verifier.load(str(WORLD.parents[1] / world / "verifier"))
    n, h = v.info.num_hidden_layers, v.info.hidden_size
    eng = TransformersEngine(v)
    ids = [0, 17, 300, 41, 9, 1200, 5]
    hs = eng.forward(ids, [0, 2, n - 1, n])
    model = v.load_model()
    with torch.no_grad():
        ref = model.get_decoder()(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states
    assert hs.shape == (7, 4, h) and hs.dtype == torch.float32
    for j, l in enumerate([0, 2, n - 1]):
        assert torch.equal(hs[:, j], ref[l][0])
    with torch.no_grad():
        assert torch.allclose(model.get_decoder().norm(hs[:, 3]), ref[n][0], atol=1e-5)
    assert (hs[:, 3] - ref[n][0]).abs().max() > 0.1
    with pytest.raises(InputError, match=rf"must be in \[0, {n}\]"):
        eng.forward(ids, [2, n + 1])


@pytest.mark.parametrize("n, max_samples, world", [(10, None, 3), (7, 5, 2), (3, None, 4), (100, 64, 7), (0, None, 2), (11, 11, 1)])
def test_shards_partition_the_samples(n, max_samples, world):
    shards = [dg.shard_indices(n, max_samples, world, r) for r in range(world)]
    assert [i for s in shards for i in s] == list(range(min(n, max_samples or n)))
    assert max(map(len, shards)) - min(map(len, shards)) <= 1


SPEC_SHARDS = r"""
import json, sys
from speculators.data_generation.offline import get_indices_to_process
cases = json.loads(sys.argv[1])
print("REPORT " + json.dumps([get_indices_to_process(n, m, [], w, r) for n, m, w, r in cases]))
"""


def test_shards_equal_speculators_get_indices_to_process(spec_env):
    cases = [(n, m, w, r) for n, m, w in [(10, None, 3), (7, 5, 2), (3, None, 4), (100, 64, 7), (11, 11, 1)] for r in range(w)]
    r = spec_env.run("-c", SPEC_SHARDS, json.dumps(cases))
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("REPORT ")), None)
    assert line is not None, r.stderr[-3000:]
    assert json.loads(line[len("REPORT "):]) == [list(dg.shard_indices(n, m, w, rk)) for n, m, w, rk in cases]


def expected_rows(tok, lines: list[dict], seq_len: int) -> list[tuple[list[int], list[int]]]:
    """The rows :func:`data` should make, tokenized here rather than by the pipeline's reader: a text row is BOS, the
    text and EOS (as ``specfmt train`` reads text), every token trained on; a conversation makes one row per assistant
    turn j > 0, the turns up to j rendered with :data:`TEMPLATE`'s own format, trained on from the end of the turns before
    it plus the assistant header (what the generation prompt renders) to its end."""
    def enc(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False)

    rows = []
    for line in lines:
        if "text" in line:
            ids = [tok.bos_token_id] + enc(line["text"]) + [tok.eos_token_id]
            rows.append((ids[:seq_len], [1] * len(ids[:seq_len])))
            continue
        turns = line["messages"]
        for j, turn in enumerate(turns):
            if turn["role"] != "assistant" or j == 0:
                continue
            history = "".join(f"<|bos|>{t['role']}\n{t['content']}<|eos|>\n" for t in turns[:j])
            prompt = enc(history + "<|bos|>assistant\n")
            full = enc(history + f"<|bos|>assistant\n{turn['content']}<|eos|>\n")[:seq_len]
            rows.append((full, [0] * len(prompt) + [1] * (len(full) - len(prompt))))
    return rows


def test_cli_end_to_end_resume_and_speculators_reads_it(spec_env, verifier, data, tmp_path):
    out = tmp_path / "out"
    args = ["datagen", "-o", out, "--verifier", verifier, "--data", data, "--engine", "transformers", "--seq-len", "64"]
    r = CliRunner().invoke(app, [str(a) for a in args], terminal_width=200)
    assert r.exit_code == 0, r.output
    assert "6 samples, layers [2, 4, 5, 8]; this run made 6 hidden-state files with transformers (0 already in place)" in r.output
    assert "bytes per token" in r.output and "hidden states 6/6" in r.output and "tok/s" in r.output  # progress lines off a terminal
    from transformers import AutoTokenizer

    lines = [json.loads(line) for line in data.read_text().splitlines()]
    want = expected_rows(AutoTokenizer.from_pretrained(str(verifier)), lines, 64)
    samples = read_preprocessed(out)
    assert [(list(s.input_ids), list(s.loss_mask)) for s in samples] == want
    assert len(want) == 6 and sum(1 for _, m in want if 0 in m) == 2  # four text rows, the two assistant rows
    folder = hidden_states_folder(out)
    assert existing_samples(folder) == list(range(6))
    for i, s in enumerate(samples):
        check_sample(sample_path(folder, i), i, s.input_ids, 4, 128)
    m = read_manifest(out)
    assert (m.layers, m.engine, m.dtype, m.samples, m.files, m.seq_len) == ([2, 4, 5, 8], "transformers", "float32", 6, 6, 64)
    # resume: a truncated file is made again, the others are left alone
    p1 = sample_path(folder, 1)
    good = p1.read_bytes()
    p1.write_bytes(good[:-9])
    os.utime(sample_path(folder, 0), (1, 1))
    r = CliRunner().invoke(app, [str(a) for a in args], terminal_width=200)
    assert r.exit_code == 0, r.output
    assert "resuming: 5 of this run's 6 samples are in place" in r.output and "made 1 hidden-state files" in r.output
    assert p1.read_bytes() == good and sample_path(folder, 0).stat().st_mtime == 1
    # speculators 0.9 reads it as its trainer does
    rep = spec_env.run("-c", SPEC_READS, out)
    line = next((ln for ln in rep.stdout.splitlines() if ln.startswith("REPORT ")), None)
    assert line is not None, rep.stderr[-3000:]
    rows = json.loads(line[len("REPORT "):])["rows"]
    assert [(x["ids"], x["mask"], x["shape"]) for x in rows] == [(ids, mask, [len(ids), 4, 128]) for ids, mask in want]


def test_interrupt_leaves_whole_files_and_the_rerun_finishes(verifier, data, tmp_path, monkeypatch):
    real = TransformersEngine.extract

    def two_then_ctrl_c(self, samples, layers, folder):
        for k, item in enumerate(real(self, samples, layers, folder)):
            yield item
            if k == 1:
                raise KeyboardInterrupt

    monkeypatch.setattr(TransformersEngine, "extract", two_then_ctrl_c)
    out = tmp_path / "out"
    with pytest.raises(DataInterrupted, match="interrupted after 2 of 6 samples") as e:
        dg.run_datagen(_req(verifier, data, out))
    assert e.value.exit_code == 130 and e.value.done == 2
    r = CliRunner().invoke(app, ["datagen", "-o", str(out), "--verifier", str(verifier), "--data", str(data), "--engine", "transformers",
                                 "--seq-len", "64"], terminal_width=200)  # the command: one line, exit 130, and it resumed
    assert r.exit_code == 130 and "specfmt: error: interrupted after 2 of 4 samples; every file in place is whole" in r.output, r.output
    assert "run the same command again to resume" in r.output and "resuming: 2 of this run's 6 samples" in r.output
    for i in (2, 3):  # back to the state of the first interruption
        sample_path(hidden_states_folder(out), i).unlink()
    folder = hidden_states_folder(out)
    assert existing_samples(folder) == [0, 1] and sorted(p.name for p in folder.iterdir()) == ["hs_0.safetensors", "hs_1.safetensors"]
    m = read_manifest(out)  # written first, with what the data is made from; the figures come at the end of a run
    assert (m.files, m.engine, m.dtype_option, m.layers, m.seq_len) == (0, "", "auto", [2, 4, 5, 8], 64)
    monkeypatch.setattr(TransformersEngine, "extract", real)
    res = dg.run_datagen(_req(verifier, data, out))
    assert (res.resumed, res.made) == (2, 4) and existing_samples(folder) == list(range(6)) and read_manifest(out).files == 6


def test_a_bad_file_is_an_error_naming_the_sample_and_is_removed(verifier, data, tmp_path, monkeypatch):
    real = TransformersEngine.forward

    def nan_in_sample_3(self, ids, layers):
        hs = real(self, ids, layers)
        if len(ids) == len(read_samples([str(data)], self.verifier.tokenizer(), 64).samples[3]):
            hs[1, 0, 5] = float("nan")
        return hs

    monkeypatch.setattr(TransformersEngine, "forward", nan_in_sample_3)
    out = tmp_path / "out"
    with pytest.raises(InputError, match=r"sample 3: hidden_states holds 1 NaN or Inf values \(the file was removed\)"):
        dg.run_datagen(_req(verifier, data, out))
    assert existing_samples(hidden_states_folder(out)) == [0, 1, 2]


def test_ranks_share_the_output_and_options_are_checked(verifier, data, tmp_path, monkeypatch):
    out = tmp_path / "out"
    r0 = dg.run_datagen(_req(verifier, data, out, world_size=2, rank=1, max_samples=5))
    assert list(r0.shard) == [3, 4] and existing_samples(hidden_states_folder(out)) == [3, 4]
    r1 = dg.run_datagen(_req(verifier, data, out, world_size=2, rank=0, max_samples=5))
    assert list(r1.shard) == [0, 1, 2] and existing_samples(hidden_states_folder(out)) == [0, 1, 2, 3, 4]
    other = tmp_path / "other.txt"
    other.write_text("x = 1\n")
    with pytest.raises(InputError, match=r"made from other inputs \(--data of other content\)"):
        dg.run_datagen(_req(verifier, other, out))
    with pytest.raises(InputError, match=r"made from other inputs \(--seq-len 64 there, 32 here\)"):
        dg.run_datagen(_req(verifier, data, out, seq_len=32))
    with pytest.raises(InputError, match=r"made from other inputs \(--layers 2,4,5,8 there, 1,8 here\)"):
        dg.run_datagen(_req(verifier, data, out, layers=[1, 8]))
    with pytest.raises(InputError, match=r"made from other inputs \(--dtype auto there, float32 here\)"):
        dg.run_datagen(_req(verifier, data, out, dtype="float32"))
    with pytest.raises(InputError, match=r"unknown dtype 'float64' \[--dtype\]; choose auto, float32, bfloat16, float16"):
        dg.run_datagen(_req(verifier, data, out, dtype="float64"))
    with pytest.raises(InputError, match=r"--rank 2 must be in \[0, --world-size 2\)"):
        dg.run_datagen(_req(verifier, data, out, world_size=2, rank=2))
    with pytest.raises(InputError, match="--seq-len 2048: the verifier has 2048 positions and vLLM needs one after the sample; give --seq-len 2047"):
        dg.run_datagen(_req(verifier, data, tmp_path / "o2", seq_len=2048))
    monkeypatch.setattr(dg, "VLLM_ENGINE", "specfmt.datagen._no_such_engine")
    with pytest.raises(InputError, match="--engine vllm cannot start: No module named 'specfmt.datagen._no_such_engine'"):
        dg.make_engine("vllm", Verifier.load(str(verifier)), 1)
    eng, notes = dg.make_engine("auto", Verifier.load(str(verifier)), 1)
    assert eng.name == "transformers" and "vLLM is not available" in notes[0]
    with pytest.raises(InputError, match="one device; --tensor-parallel-size 2 needs --engine vllm"):
        dg.make_engine("transformers", Verifier.load(str(verifier)), 2)


SPEC_READS = r"""
import json, sys
from pathlib import Path
from datasets import load_from_disk
from speculators.data_generation.offline import check_hidden_states, find_corrupt_hidden_state_indices, get_existing_hidden_state_indices
from hs_connectors import FileTransfer
root = Path(sys.argv[1])
ds = load_from_disk(str(root))
ds.set_format(type="torch")
t = FileTransfer(root / "hidden_states")
out = {"columns": sorted(ds.column_names), "seq_len": list(ds.with_format(None)["seq_len"]), "rows": []}
for i in range(len(ds)):
    hs = t.get_cached(i)
    check_hidden_states(hs, ds[i]["input_ids"].tolist())
    out["rows"].append({"ids": ds[i]["input_ids"].tolist(), "mask": ds[i]["loss_mask"].tolist(), "shape": list(hs["hidden_states"].shape)})
existing = get_existing_hidden_state_indices(root / "hidden_states")
out["corrupt"] = sorted(find_corrupt_hidden_state_indices(root / "hidden_states", existing))
print("REPORT " + json.dumps(out))
"""


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


def test_rows_equal_speculators_prepare_data(spec_env, verifier, tmp_path):
    """speculators 0.9's ``_preprocess_batch`` (what ``build_speculator_training_dataset`` maps; its ``/render`` call answered by the same template through
    transformers, as vLLM renders it) makes the same rows, masks and seq_len, including the skip and cut at a short window."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(verifier))
    sharegpt = [{"from": {"user": "human", "assistant": "gpt"}.get(t["role"], t["role"]), "value": t["content"]} for t in CONV]
    convs = [CONV, sharegpt, CONV[1:3]]
    for seq_len in (512, 30):
        r = spec_env.run("-c", SPEC_PREPROCESS, verifier, json.dumps(convs), seq_len)
        line = next((ln for ln in r.stdout.splitlines() if ln.startswith("REPORT ")), None)
        assert line is not None, r.stderr[-3000:]
        theirs = json.loads(line[len("REPORT "):])
        ours = [s for c in convs for s in assistant_rows(tok, c, seq_len)[0]]
        assert len(ours) == 5 if seq_len == 512 else 0 < len(ours) < 5
        assert theirs["input_ids"] == [list(s.input_ids) for s in ours]
        assert theirs["loss_mask"] == [list(s.loss_mask) for s in ours]
        assert theirs["seq_len"] == [len(s) for s in ours]


def test_auto_falls_back_to_transformers_when_vllm_cannot_run_the_verifier(verifier, data, tmp_path, monkeypatch):
    """``--engine auto`` with a vLLM engine that fails at its start: a note, and the transformers forward makes every file;
    ``--engine vllm`` with the same engine fails."""
    (tmp_path / "broken_vllm_engine.py").write_text(
        "class VllmEngine:\n    name = 'vllm'\n    def __init__(self, verifier, **kw):\n        self.kw = kw\n"
        "    def extract(self, samples, layers, folder):\n        raise RuntimeError('Unsupported CPU attention configuration')\n        yield\n"
        "    def close(self):\n        pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(dg, "VLLM_ENGINE", "broken_vllm_engine")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else real_find_spec(name, *a))
    res = dg.run_datagen(_req(verifier, data, tmp_path / "out", engine="auto"))
    assert res.engine == "transformers" and res.made == 6
    assert res.notes == ["vLLM could not run the verifier (RuntimeError: Unsupported CPU attention configuration); using the transformers forward"]
    assert read_manifest(tmp_path / "out").engine == "transformers"
    with pytest.raises(VLLMRunError, match=r"vLLM failed after 0 samples \(RuntimeError: Unsupported CPU attention configuration\)"):
        dg.run_datagen(_req(verifier, data, tmp_path / "out2", engine="vllm"))
