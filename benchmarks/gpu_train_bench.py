#!/usr/bin/env python3
"""On a GPU: specfmt's EAGLE-3 trainer against speculators 0.9's in bf16 on a real-size verifier, tokens/s and peak memory
(issue 38). Run by ``benchmarks/gpu_bundle.sh --bench`` on the lent machine; its figures go in the docs only when measured.

What it runs:

* **The verifier**: a Llama of a real size (``--size``: ``1b`` = Llama-3.2-1B's shapes, H 2048, 16 layers, 32/8 heads,
  intermediate 8192, vocabulary 128,256; ``8b`` = Llama-3.1-8B's), random bf16 weights (no Hub on the lent machine), the
  example world's tokenizer (its ids are < 2048, inside the vocabulary). Throughput and memory depend on the shapes, not on
  what the weights say.
* **The data**: the example world's training files cut into ``--seq-len`` windows (``--samples`` of them), their hidden states
  extracted once in bf16 on the GPU (``trainer_vs_speculators.prepare_data``: specfmt's datagen transformers engine) in
  speculators' layout; ``token_freq.pt`` from the verifier's top-1.
* **The trainers**, one after the other on the same data (``trainer_vs_speculators.train_one``): ``specfmt train eagle3
  --hidden-states --device cuda --verifier-dtype bfloat16`` (bf16 autocast over float32 master weights) and ``python -m
  speculators.train --hidden-states-dtype bfloat16`` (its autocast, float32 master weights), one EAGLE-3 layer, draft
  vocabulary 32,000, ``--batch-size`` x ``--seq-len`` tokens per step, ``--steps`` steps; each trainer's defaults otherwise.
* **Figures**: tokens/s after the first 5 steps (specfmt: its step callbacks; speculators: its profiler's ``step_ms``), and
  peak GPU memory: ``nvidia-smi``'s largest ``used_memory`` of the trainer's processes, polled every 0.2 s, for both;
  specfmt's ``torch.cuda.max_memory_allocated`` beside it.

Writes ``gpu_train_bench.results.json`` (or ``--json``). ``--device cpu --size tiny`` runs the same path on the CPU at a toy
size (a check of the script, no figures). Usage::

    python benchmarks/gpu_train_bench.py [--size 1b] [--steps 60] [--batch-size 4] [--seq-len 2048] [--samples 256]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

import trainer_vs_speculators as tvs  # noqa: E402

#: steps of each trainer before the timed ones
WARMUP = 5

SIZES = {
    "tiny": dict(hidden_size=128, num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2, head_dim=32, intermediate_size=384,
                 vocab_size=2048),
    "1b": dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, head_dim=64, intermediate_size=8192,
               vocab_size=128256),
    "8b": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, head_dim=128, intermediate_size=14336,
               vocab_size=128256),
}


def make_world(root: Path, size: str, dtype: str) -> Path:
    """``root/world``: a random-weight Llama verifier of ``size`` with the example world's tokenizer, and the world's prompts."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    world = root / "world"
    if (world / "verifier" / "config.json").is_file():
        return world
    (world / "verifier").mkdir(parents=True, exist_ok=True)
    cfg = LlamaConfig(**SIZES[size], max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False,
                      bos_token_id=0, eos_token_id=1, pad_token_id=2, dtype=dtype, architectures=["LlamaForCausalLM"])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, dtype))
    model.save_pretrained(world / "verifier")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(REPO / "examples" / "world" / "verifier" / name, world / "verifier" / name)
    shutil.copyfile(REPO / "examples" / "world" / "prompts.jsonl", world / "prompts.jsonl")
    return world


class GpuPeak:
    """The largest ``used_memory`` (MiB) nvidia-smi reports for any process while the block runs (one job on the GPU)."""

    def __init__(self):
        self.peak, self._stop = 0, threading.Event()

    def _poll(self) -> None:
        while not self._stop.is_set():
            r = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                               capture_output=True, text=True)
            for line in r.stdout.splitlines():
                parts = [x.strip() for x in line.split(",")]
                if len(parts) == 2 and parts[1].isdigit():
                    self.peak = max(self.peak, int(parts[1]))
            self._stop.wait(0.2)

    def __enter__(self):
        self._t = threading.Thread(target=self._poll, daemon=True)
        if shutil.which("nvidia-smi"):
            self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._t.is_alive():
            self._t.join()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="1b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--samples", type=int, default=256)
    ap.add_argument("--draft-vocab", type=int, default=32000)
    ap.add_argument("--lr", type=float, default=None, help="both trainers' rate (default: specfmt's default)")
    ap.add_argument("--trainers", default="specfmt,speculators")
    ap.add_argument("--work", default="~/.cache/specfmt/bench/gpu_train_bench")
    ap.add_argument("--json", default=str(HERE / "gpu_train_bench.results.json"))
    args = ap.parse_args()
    if args.steps < WARMUP + 2:  # the timed steps are those after the warm-up; one alone times nothing
        ap.error(f"--steps must be at least {WARMUP + 2}: the first {WARMUP} are warm-up, not timed")
    import torch

    from specfmt.training.loop import TrainOptions

    gpu = args.device.startswith("cuda")
    dtype = "bfloat16" if gpu else "float32"
    work = Path(args.work).expanduser().resolve() / args.size  # absolute: speculators' trainer runs in another directory
    world = make_world(work, args.size, dtype)
    data = work / f"data-{args.seq_len}"
    facts = tvs.prepare_data(world, data, args.seq_len, "verifier", args.samples, device=args.device, dtype=dtype)
    lr = args.lr if args.lr is not None else TrainOptions().resolved("eagle3").lr
    out = {"meta": {"size": args.size, "shapes": SIZES[args.size], "device": args.device, "dtype": dtype, "steps": args.steps,
                    "batch": args.batch_size, "seq_len": args.seq_len, "draft_vocab": min(args.draft_vocab, SIZES[args.size]["vocab_size"]),
                    "lr": lr, "gpu": torch.cuda.get_device_name(0) if gpu and torch.cuda.is_available() else None,
                    "torch": torch.__version__, "python": platform.python_version(), "date": time.strftime("%Y-%m-%d"), "data": facts},
           "runs": {}}
    for trainer in args.trainers.split(","):
        spec = tvs.train_spec(world, data, facts, work / "runs" / trainer, steps=args.steps, lr=lr, options=[], batch=args.batch_size,
                              seq_len=args.seq_len, seed=tvs.SEED, threads=os.cpu_count() or 1, warmup=WARMUP, draft_vocab=out["meta"]["draft_vocab"],
                              device=args.device, verifier_dtype=dtype if gpu else None, hs_dtype=dtype if gpu else None)
        (work / "runs" / trainer).mkdir(parents=True, exist_ok=True)
        with GpuPeak() as peak:
            figures, _ = tvs.train_one(trainer, spec, work)
        figures["peak_gpu_used_mib"] = peak.peak
        out["runs"][trainer] = figures
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
        print(trainer, json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
