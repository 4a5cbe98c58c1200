"""``specfmt datagen``'s output folder (issue 35): new, empty, or the output of an earlier datagen run with the same inputs,
which the run continues keeping nothing it has not checked; anything else is refused in one line before anything is read.

The refusals come before the verifier's weights are read, so each costs milliseconds; the continued runs use the
transformers engine on three 16-token samples of the example world's verifier."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from conftest import WORLD
from specfmt.cli import app
from specfmt.datagen.layout import MANIFEST, TOKEN_FREQ, hidden_states_folder, read_manifest, read_preprocessed, token_frequencies
from test_outputs import snapshot

runner = CliRunner()
ROWS = [{"text": f"def f{i}(x):\n    return x * {i} + {i * i}\n"} for i in range(3)]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    """The example verifier and the data, shared by the module's tests (never written: the tests check they are not)."""
    root = tmp_path_factory.mktemp("inputs")
    shutil.copytree(WORLD / "verifier", root / "V")
    (root / "data").mkdir()
    (root / "data" / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return root


@pytest.fixture(scope="module")
def made(inputs, tmp_path_factory) -> Path:
    """One datagen output of ``inputs`` (three samples), made once; a test continues a copy of it."""
    out = tmp_path_factory.mktemp("made") / "out"
    r = datagen(inputs, out)
    assert r.exit_code == 0, r.output
    return out


@pytest.fixture
def ws(tmp_path, inputs) -> Path:
    """A workspace of its own: the verifier and the data, and a converted-draft stand-in (any folder that is not datagen's)."""
    shutil.copytree(inputs, tmp_path, dirs_exist_ok=True)
    shutil.copytree(WORLD / "eagle3-safeailab", tmp_path / "draft")
    return tmp_path


def datagen(ws: Path, out: Path, *extra: str, data: Path | None = None):
    args = ["datagen", "--verifier", ws / "V", "--data", data or ws / "data" / "d.jsonl", "-o", out, "--engine", "transformers", "--seq-len", "16",
            *extra]
    return runner.invoke(app, [str(a) for a in args], terminal_width=400)


def one_line(r) -> str:
    lines = r.output.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("specfmt: error: "), r.output
    return lines[0]


@pytest.mark.parametrize("where,words", [
    ("V", "the output folder is --verifier"),  # the command: datagen -o VERIFIER
    ("V/sub", "the output folder lies inside --verifier"),
    ("data", "the output folder contains --data"),  # the folder holding --data
])
def test_datagen_never_writes_into_an_input(ws, where, words):
    before = snapshot(ws)
    line = one_line(datagen(ws, ws / where))
    assert line.startswith(f"specfmt: error: {words} "), line
    assert snapshot(ws) == before  # the verifier and the data byte-identical, nothing added


@pytest.mark.parametrize("leave", ["a converted draft", "token_freq.pt", "state.json", "stray file"])
def test_a_folder_datagen_did_not_make_is_refused(ws, leave):
    """The issue's stale files: a token_freq.pt that was kept and reported as written (train then failed with an
    UnpicklingError traceback), a foreign state.json (a KeyError traceback). Now: one line, and the folder is left as it was."""
    out = ws / "draft" if leave == "a converted draft" else ws / "out"
    if leave != "a converted draft":
        out.mkdir()
        body = {"token_freq.pt": b"not a torch file", "state.json": json.dumps({"something": "else"}).encode(), "stray file": b"x"}[leave]
        (out / leave).write_bytes(body)
    before = snapshot(ws)
    line = one_line(datagen(ws, out))
    assert line == (f"specfmt: error: the output folder is not empty and holds no datagen output (no {MANIFEST}) [{out}]; "
                    "give a new or empty -o; datagen continues only the output of an earlier datagen run"), line
    assert snapshot(ws) == before


@pytest.mark.parametrize("manifest,why", [("[]", "not a JSON object"), ('{"verifier": 1}', "missing"), ("{", "Expecting"),
                                          (json.dumps({"verifier": "v", "layers": "2,4", "hidden_size": 128, "engine": "", "seq_len": 16,
                                                       "dtype": "x", "samples": 1, "tokens": 1}), "a wrong type: layers")])
def test_a_malformed_manifest_is_one_line(ws, manifest, why):
    out = ws / "out"
    out.mkdir()
    (out / MANIFEST).write_text(manifest)
    before = snapshot(ws)
    line = one_line(datagen(ws, out))
    assert "the datagen manifest is malformed" in line and why in line, line
    assert snapshot(ws) == before


def test_a_continued_output_keeps_nothing_it_has_not_checked(inputs, made, tmp_path):
    """A datagen output made by an earlier run, then tampered with: a stale token_freq.pt is written again from the
    dataset, a hidden-states file of other token ids is made again, a killed run's temporary file is removed; the files
    that are right are kept as they are. What the run leaves trains: ``train --hidden-states`` reads its token counts."""
    from specfmt.training.hsdata import hidden_state_documents

    out = tmp_path / "out"
    shutil.copytree(made, out)
    folder = hidden_states_folder(out)
    kept = (folder / "hs_0.safetensors").read_bytes()
    (out / TOKEN_FREQ).write_bytes(b"stale")
    shutil.copy(folder / "hs_0.safetensors", folder / "hs_1.safetensors")  # whole, readable, of another sample
    (out / f"{TOKEN_FREQ}.999999999.tmp").write_bytes(b"left by a killed run")
    os.utime(folder / "hs_2.safetensors", (1, 1))
    r = datagen(inputs, out)
    assert r.exit_code == 0, r.output
    assert "resuming: 2 of this run's 3 samples are in place" in r.output and "made 1 hidden-state files" in r.output, r.output
    samples = read_preprocessed(out)
    assert torch.load(out / TOKEN_FREQ, weights_only=True) == token_frequencies(samples)
    assert load_file(str(folder / "hs_1.safetensors"))["token_ids"].tolist() == list(samples[1].input_ids)
    assert (folder / "hs_0.safetensors").read_bytes() == kept and (folder / "hs_2.safetensors").stat().st_mtime == 1
    assert not (out / f"{TOKEN_FREQ}.999999999.tmp").exists()
    assert hidden_state_documents(out).ids == token_frequencies(samples)
    m = read_manifest(out)
    assert (m.files, m.engine, m.samples) == (3, "transformers", 3)


def test_a_continued_output_needs_the_same_inputs(inputs, made, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(made, out)
    other = tmp_path / "d.jsonl"
    other.write_text("".join(json.dumps(r) + "\n" for r in ROWS[::-1]))  # same size, other content
    before = snapshot(tmp_path)
    line = one_line(datagen(inputs, out, data=other))
    assert line == (f"specfmt: error: the output folder holds datagen output made from other inputs (--data of other content) [{out}]; "
                    "give a new -o, or the options of the run that made it"), line
    line = one_line(datagen(inputs, out, "--layers", "1,8"))
    assert "made from other inputs (--layers 2,4,5,8 there, 1,8 here)" in line, line
    assert snapshot(tmp_path) == before


def test_train_reads_a_token_freq_that_is_no_torch_file_as_one_line(inputs, made, tmp_path):
    """``train --hidden-states`` on data whose token_freq.pt is not a torch file: one line (was an UnpicklingError traceback)."""
    out = tmp_path / "out"
    shutil.copytree(made, out)
    (out / TOKEN_FREQ).write_bytes(b"not a torch file")
    r = runner.invoke(app, ["train", "eagle3", "--verifier", str(inputs / "V"), "--hidden-states", str(out), "-o", str(tmp_path / "trained"),
                            "--steps", "1", "--no-validate", "--device", "cpu"], terminal_width=400)
    lines = r.output.strip().splitlines()  # a status line ("reading the hidden-states data"), then the error
    assert r.exit_code == 2 and "Traceback" not in r.output and [x for x in lines if x.startswith("specfmt: error:")] == lines[-1:], r.output
    assert lines[-1].startswith("specfmt: error: token_freq.pt does not load as a torch-saved {token id: count} dict (UnpicklingError)"), r.output
    assert not (tmp_path / "trained").exists()


def test_a_file_where_the_output_folder_goes_is_refused(ws):
    (ws / "file").write_text("x")
    line = one_line(datagen(ws, ws / "file"))
    assert line.startswith("specfmt: error: the output path exists and is a file"), line
    save_file({"x": torch.zeros(1)}, str(ws / "plain.safetensors"))  # a path under a file
    assert one_line(datagen(ws, ws / "plain.safetensors" / "out")).startswith("specfmt: error: the output path lies under a file")
