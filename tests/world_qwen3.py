"""What the Qwen3 world's tests share (``examples/world-qwen3``: test_world_qwen3.py, the EAGLE-3 draft;
test_world_qwen3_peagle.py and test_world_qwen3_dflash.py, its P-EAGLE and DFlash drafts): the world's paths
and figures, converting a draft, a random draft of the same shape, the reference run, and speculators 0.9
saving a draft again."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors import safe_open

from conftest import REPO, run_cli

WORLD = REPO / "examples" / "world-qwen3"
MANIFEST = json.loads((WORLD / "world.json").read_text())
#: the reference run's settings: k speculative tokens, the tokens generated per prompt
K, MAX_TOKENS = 3, 32


def tensor_names(path) -> set[str]:
    with safe_open(str(path), "pt") as f:
        return set(f.keys())


def convert_draft(draft: Path, out: Path) -> Path:
    """``specfmt convert --from auto DRAFT -o OUT --verifier`` the world's verifier; OUT."""
    r = run_cli("convert", "--from", "auto", draft, "-o", out, "--verifier", WORLD / "verifier")
    assert r.returncode == 0, r.stderr
    return out


def random_like(converted: Path, out: Path, algorithm: str, keep: tuple[str, ...] = ()) -> Path:
    """A copy of ``converted`` with every tensor but ``keep`` drawn by specfmt's module initialisation (seed 0);
    OUT."""
    from safetensors.torch import load_file, save_file

    from specfmt.algorithms import get

    shutil.copytree(converted, out)
    cfg = json.loads((out / "config.json").read_text())
    theirs = load_file(str(out / "model.safetensors"))
    torch.manual_seed(0)
    rand = get(algorithm).module(cfg).state_dict()
    save_file({n: (t if n in keep else rand[n]).contiguous() for n, t in theirs.items()}, str(out / "model.safetensors"))
    return out


def reference(folder):
    """``validate --run --no-vllm`` on the world's held-out prompts (k = :data:`K`, :data:`MAX_TOKENS` tokens each)."""
    from specfmt.validation.run import validate_run

    return validate_run(folder, prompts=str(WORLD / "prompts.jsonl"), max_tokens=MAX_TOKENS, num_speculative_tokens=K, use_vllm=False, write=False)


SAVE_AGAIN = """
import sys
from speculators import SpeculatorModel
m = SpeculatorModel.from_pretrained(sys.argv[1])
print(type(m).__name__, *(eval(e, {"m": m}) for e in sys.argv[3:]))
m.save_pretrained(sys.argv[2])
"""


def saves_again(spec_env, draft: Path, out: Path, *shown: str) -> list[str]:
    """speculators 0.9 loads ``draft`` (from its own folder: it resolves the verifier's relative path against the
    working directory) and saves it to ``out``; its config.json, config.py and model.safetensors must be
    ``draft``'s bytes. Returns what it printed, split: its model class, then each expression of ``shown``
    (Python over ``m``, the loaded model)."""
    r = spec_env.run("-c", SAVE_AGAIN, ".", out, *shown, cwd=draft)
    assert r.returncode == 0, r.stderr[-3000:]
    for name in ("config.json", "config.py", "model.safetensors"):
        assert (out / name).read_bytes() == (draft / name).read_bytes(), name
    return r.stdout.split()
