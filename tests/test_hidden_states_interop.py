"""Interop with speculators 0.9's trainer, both ways: speculators' trainer trains on hidden-states data in the
layout specfmt writes, and ``specfmt train --hidden-states`` trains on data in speculators' layout without
specfmt's manifest (as speculators' own data generation leaves it).

speculators' trainer is CUDA-only as released; the test runs its OWN patched copy of the package (copied to
tmp_path, put first on PYTHONPATH), each patch named in :data:`CPU_PATCHES`, with ``--draft-attn-impl sdpa``
and ``--loss-implementation eager`` (its flex-attention and fused loss need a GPU).
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from speculators_env import spec_env  # noqa: F401  (fixture)
from test_hidden_states_train import WORLD, write_hidden_states

#: (what, file, old text, new text): speculators 0.9.0's trainer on a machine without an accelerator
CPU_PATCHES = [
    ("Profiler.mark/now: torch.accelerator.synchronize() only when an accelerator is present (lines 80, 92)",
     "train/trainer.py", "torch.accelerator.synchronize()", "torch.accelerator.is_available() and torch.accelerator.synchronize()"),
    ("Trainer: the autocast device type falls back to cpu, not cuda, without an accelerator (line 228)",
     "train/trainer.py", 'acc.type if acc is not None else "cuda"', 'acc.type if acc is not None else "cpu"'),
    ("Trainer: the model and the batches go to the CPU, not to device index local_rank (cuda), without an accelerator",
     "train/trainer.py", ".to(self.local_rank", '.to(self.local_rank if torch.accelerator.is_available() else "cpu"'),
]


@pytest.fixture(scope="module")
def patched_speculators(spec_env, tmp_path_factory) -> Path:  # noqa: F811
    """A copy of speculators 0.9.0 with :data:`CPU_PATCHES` applied; each patch must match (it fails loudly otherwise)."""
    root = tmp_path_factory.mktemp("speculators-cpu")
    shutil.copytree(spec_env.root / "speculators", root / "speculators")
    for what, rel, old, new in CPU_PATCHES:
        p = root / "speculators" / rel
        text = p.read_text()
        assert old in text, f"patch no longer applies: {what}"
        p.write_text(text.replace(old, new))
    return root


def _samples(verifier_dir: Path, n: int = 6, T: int = 24) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(verifier_dir))
    text = (WORLD / "README.md").read_text()
    return [tok.encode(text[i * 200:(i + 1) * 200])[:T] for i in range(n)]


def test_speculators_trainer_trains_on_specfmt_data(spec_env, patched_speculators, tmp_path):  # noqa: F811
    """speculators' own trainer (``python -m speculators.train``, patched for the CPU) runs 2 steps of EAGLE-3
    on the example world's hidden states in the layout specfmt writes, and saves a checkpoint."""
    verifier = WORLD / "verifier"
    samples = _samples(verifier)
    masks = [[0] * 4 + [1] * (len(s) - 4) for s in samples]
    data = write_hidden_states(tmp_path / "data", verifier, samples, [2, 4, 5], masks)
    env = spec_env.environ(PYTHONPATH=os.pathsep.join([str(patched_speculators), str(spec_env.root)]))
    args = [sys.executable, "-m", "speculators.train", "--speculator-type", "eagle3", "--verifier-name-or-path", str(verifier),
            "--data-path", str(data), "--target-layer-ids", "2", "4", "5", "--num-layers", "1", "--draft-arch", "llama",
            "--draft-attn-impl", "sdpa", "--loss-implementation", "eager", "--hidden-states-dtype", "float32",
            "--total-seq-len", "48", "--train-data-ratio", "0.5", "--num-workers", "0", "--on-missing", "raise",
            "--epochs", "1", "--max-steps", "2", "--save-path", str(tmp_path / "ckpt"), "--log-dir", str(tmp_path / "logs")]
    r = subprocess.run(args, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    saved = [p for p in (tmp_path / "ckpt").rglob("*.safetensors")]
    assert saved, r.stderr[-2000:]


def test_specfmt_trains_on_speculators_layout(spec_env, tmp_path):  # noqa: F811
    """speculators' own ``prepare-data`` (pre-tokenized rows pass through without a server) writes the preprocessed
    dataset and ``token_freq.pt``; the hidden states are added as its data generation leaves them (``hs_{i}`` per
    row, no specfmt manifest); ``specfmt train eagle3 --hidden-states`` trains on it, its draft vocabulary the top
    of speculators' token frequencies, and refuses a draft whose taps the files do not hold."""
    import datasets

    from specfmt.sources.verifier import Verifier
    from specfmt.errors import InputError
    from specfmt.training.loop import TrainOptions
    from specfmt.training.pipeline import TrainRequest, train_draft
    from test_hidden_states_train import write_hs_files

    verifier = WORLD / "verifier"
    samples = _samples(verifier, n=8)
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"input_ids": s, "loss_mask": [0] * 3 + [1] * (len(s) - 3)}) + "\n" for s in samples))
    data = tmp_path / "data"
    r = spec_env.run("-m", "speculators", "prepare-data", "--model", str(verifier), "--data", str(rows), "--output", str(data),
                     "--seq-length", "32", "--no-skip-token-freq", "--num-preprocessing-workers", "1")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    theirs = [list(map(int, x)) for x in datasets.load_from_disk(str(data)).with_format(None)["input_ids"]]
    assert sorted(theirs) == sorted(samples)  # shuffled by prepare-data: hs_{i} follows its row order
    write_hs_files(Verifier.load(str(verifier)), data / "hidden_states", theirs, [2, 4, 5, 8])
    assert not (data / "specfmt_datagen.json").exists() and (data / "token_freq.pt").is_file()
    freq = torch.load(data / "token_freq.pt", weights_only=True)
    losses = []
    req = TrainRequest(str(tmp_path / "out"), str(verifier), algorithm="eagle3", device="cpu", validate=False, taps=[2, 4, 5],
                       draft_vocab=32, hidden_states=str(data))
    res = train_draft(req, TrainOptions(steps=3, batch_size=2, seq_len=32, seed=0, save_every=0),
                      log=lambda step, loss, acc: losses.append(loss))
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))
    used = sorted(t for t, _ in collections.Counter(freq).most_common(32))  # speculators' counts, ties in its file's order
    assert (torch.arange(32) + res.draft.tensors["d2t"]).tolist() == used
    assert res.draft.tensors["t2d"].sum() == 32
    with pytest.raises(InputError, match="hold 3 tap layers, the draft reads 2"):
        train_draft(TrainRequest(str(tmp_path / "out2"), str(verifier), algorithm="eagle3", device="cpu", validate=False, taps=[2, 4],
                                 hidden_states=str(data)), TrainOptions(steps=1, batch_size=1, seq_len=32, save_every=0))
