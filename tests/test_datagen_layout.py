"""speculators 0.9's on-disk layout (specfmt/datagen/layout.py): written, read back, checked, and read by
speculators' own code."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import save_file

from specfmt.datagen.layout import (
    Manifest, Sample, check_sample, existing_samples, hidden_states_folder, read_manifest, read_preprocessed,
    sample_path, write_manifest, write_preprocessed, write_token_freq,
)
from specfmt.errors import InputError
from speculators_env import spec_env  # noqa: F401  (fixture)

SAMPLES = [Sample([1, 5, 7, 9], [0, 0, 1, 1]), Sample([1, 3, 3, 4, 2], [0, 1, 1, 1, 1]), Sample([8, 8], [1, 0])]
N_LAYERS, H = 4, 6


def _write_hs(folder, i, ids, hs=None):
    folder.mkdir(parents=True, exist_ok=True)
    hs = torch.randn(len(ids), N_LAYERS, H) if hs is None else hs
    save_file({"hidden_states": hs.contiguous(), "token_ids": torch.tensor(ids, dtype=torch.int64)}, str(sample_path(folder, i)))
    return sample_path(folder, i)


def test_preprocessed_token_freq_and_manifest_round_trip(tmp_path):
    write_preprocessed(SAMPLES, tmp_path)
    assert read_preprocessed(tmp_path) == SAMPLES
    freq = write_token_freq(SAMPLES, tmp_path / "token_freq.pt")
    assert freq == {7: 1, 9: 1, 3: 2, 4: 1, 2: 1, 8: 1}
    assert torch.load(tmp_path / "token_freq.pt", weights_only=True) == freq
    m = Manifest(verifier="v", layers=[1, 2, 4], hidden_size=H, engine="transformers", seq_len=8, dtype="float32", samples=3, tokens=11)
    write_manifest(tmp_path, m)
    assert read_manifest(tmp_path) == m
    assert read_manifest(tmp_path / "nowhere") is None
    with pytest.raises(InputError, match="already holds"):
        write_preprocessed(SAMPLES, tmp_path)
    assert not list(tmp_path.glob("*.tmp"))


def test_existing_samples_skips_truncated_and_foreign_files(tmp_path):
    folder = hidden_states_folder(tmp_path)
    for i, s in enumerate(SAMPLES):
        _write_hs(folder, i, s.input_ids)
    p = sample_path(folder, 1)
    p.write_bytes(p.read_bytes()[:-7])  # an interrupted copy
    (folder / "hs_x.safetensors").write_text("no")
    (folder / "notes.txt").write_text("no")
    assert existing_samples(folder) == [0, 2]
    assert existing_samples(tmp_path / "none") == []


@pytest.mark.parametrize("case, match", [
    ("ids", "sample 3: the file's token ids differ from the input ids at position 2"),
    ("short", "sample 3: the file's token ids differ .* position 3 \\(3 tokens in the file, 4 in the sample\\)"),
    ("shape", r"sample 3: hidden_states has shape \[4, 3, 6\], expected \[T, L, H\] = \[4, 4, 6\]"),
    ("nan", "sample 3: hidden_states holds 1 NaN or Inf"),
    ("inf", "sample 3: hidden_states holds 1 NaN or Inf"),
    ("key", "sample 3: the hidden-states file has no 'hidden_states' tensor"),
    ("truncated", "sample 3: the hidden-states file does not open"),
])
def test_check_sample_names_the_sample_and_the_fault(tmp_path, case, match):
    ids = [1, 5, 7, 9]
    good = _write_hs(tmp_path, 0, ids)
    assert check_sample(good, 0, ids, N_LAYERS, H) == 4
    hs = torch.randn(4, N_LAYERS, H)
    if case == "ids":
        p = _write_hs(tmp_path, 3, [1, 5, 8, 9])
    elif case == "short":
        p = _write_hs(tmp_path, 3, [1, 5, 7], hs[:3])
    elif case == "shape":
        p = _write_hs(tmp_path, 3, ids, hs[:, :3])
    elif case in ("nan", "inf"):
        hs[2, 1, 3] = math.nan if case == "nan" else math.inf
        p = _write_hs(tmp_path, 3, ids, hs)
    elif case == "key":
        p = sample_path(tmp_path, 3)
        save_file({"token_ids": torch.tensor(ids)}, str(p))
    else:
        p = _write_hs(tmp_path, 3, ids)
        p.write_bytes(p.read_bytes()[:-5])
    with pytest.raises(InputError, match=match) as e:
        check_sample(p, 3, ids, N_LAYERS, H)
    assert "\n" not in str(e.value)


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


def test_speculators_reads_what_specfmt_writes(spec_env, tmp_path):
    """speculators 0.9's ``load_from_disk`` (as ``ArrowDataset``), ``FileTransfer.get_cached``, ``check_hidden_states`` and
    ``find_corrupt_hidden_state_indices`` accept specfmt's output row for row."""
    write_preprocessed(SAMPLES, tmp_path)
    for i, s in enumerate(SAMPLES):
        _write_hs(hidden_states_folder(tmp_path), i, s.input_ids)
    r = spec_env.run("-c", SPEC_READS, tmp_path)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("REPORT ")), None)
    assert line is not None, r.stderr[-3000:]
    rep = json.loads(line[len("REPORT "):])
    assert rep["columns"] == ["input_ids", "loss_mask", "seq_len"] and rep["seq_len"] == [4, 5, 2] and rep["corrupt"] == []
    assert [(r["ids"], r["mask"]) for r in rep["rows"]] == [(list(s.input_ids), list(s.loss_mask)) for s in SAMPLES]
    assert [r["shape"] for r in rep["rows"]] == [[len(s), N_LAYERS, H] for s in SAMPLES]
