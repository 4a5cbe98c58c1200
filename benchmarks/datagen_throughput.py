#!/usr/bin/env python3
"""Hidden-state generation throughput (issue 26): vLLM's ``extract_hidden_states`` against the transformers
forward, and against vLLM's own prefill without extraction.

The verifier is the random Llama of ``scale_bench.py`` (``--size``, default ``0.7b``: H = 2048, 16 layers,
GQA 32/4, V = 2048, 0.71 B parameters), written by :func:`scale_bench.write_random_verifier`. The samples
are ``--prompts`` random token sequences of ``--tokens`` tokens (seeded; the same in every mode), the layers
the EAGLE-3 reference taps and the last layer L (``specfmt.algorithms.eagle3.default_taps`` + [L]: what
``specfmt datagen`` and speculators store). Each mode runs in a child process of its own, after a warm-up
of two samples (the engine's start is not timed):

* ``vllm``: :class:`specfmt.datagen.vllm_engine.VllmEngine` (vLLM's CPU build: specfmt's connector), every
  file written and placed;
* ``vllm-prefill``: the same ``vllm.LLM`` settings without the speculative method and the connector,
  ``max_tokens=1`` on the same prompts: the prefill the extraction rides on (the ratio's denominator);
* ``transformers``: ``AutoModelForCausalLM`` forward with ``output_hidden_states`` and a hook for layer L,
  ``--hf-batch`` samples a pass, each sample's tensors written with ``safetensors`` like vLLM's files.

Tokens/s are prompt tokens over the timed wall time. Bytes per token: the files' sizes on disk over the
tokens, beside what the tensors need (``n_layers * H * itemsize + 8`` for the int64 token id). vLLM's engine
core runs in the benchmark's process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) and every child gets
``OMP_NUM_THREADS`` = the machine's cores (vLLM's CPU build otherwise drops to 1 thread "for serving").
Usage::

    python benchmarks/datagen_throughput.py [--size 0.7b] [--prompts 32] [--tokens 512] [--dtype float32]
        [--modes vllm,vllm-prefill,transformers] [--profile] [--json benchmarks/datagen_throughput.results.json]

``--profile`` runs the timed vLLM extraction under cProfile and records, per function, the seconds of the
verifier's forward (the prefill's own work) and of what extraction adds (:data:`PROFILED`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scale_bench import SIZES, write_random_verifier  # this folder is on sys.path

REPO = Path(__file__).resolve().parents[1]
MODES = ("vllm", "vllm-prefill", "transformers")
ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}


def samples(n: int, tokens: int, vocab: int, seed: int = 0) -> list[tuple[int, list[int]]]:
    """``n`` random samples of ``tokens`` ids in [3, vocab) (past the example tokenizer's special ids)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return [(i, torch.randint(3, vocab, (tokens,), generator=g).tolist()) for i in range(n)]


def layers_of(verifier: Path) -> list[int]:
    from specfmt.algorithms.eagle3 import default_taps

    L = json.loads((verifier / "config.json").read_text())["num_hidden_layers"]
    return default_taps(L) + [L]


#: ``--profile``: what the extraction adds to the prefill, by function (cumulative seconds under cProfile)
PROFILED = {"verifier forward": ("models/llama.py", "forward", 406), "aux states into the hidden-state cache": ("gpu_model_runner.py", "propose_draft_token_ids", None),
            "gathering each request's rows": ("example_hidden_states_connector.py", "extract_from_kv_cache", None),
            "writing the files": ("cpu_connector.py", "write_hidden_states", None)}


def run_vllm(verifier: Path, work: Path, data, warm, layers, dtype: str, tokens: int, profile: dict | None = None) -> float:
    from specfmt.datagen.vllm_engine import VllmEngine

    engine = VllmEngine(verifier, dtype=dtype, max_model_len=tokens + 16, batch_size=len(data))
    try:
        list(engine.extract(warm, layers, work / "warm"))
        if profile is not None:
            import cProfile
            import pstats

            prof = cProfile.Profile()
            prof.enable()
        t0 = time.perf_counter()
        n = len(list(engine.extract(data, layers, work / "out")))
        dt = time.perf_counter() - t0
        if profile is not None:
            prof.disable()
            stats = pstats.Stats(prof).stats  # {(file, line, name): (cc, nc, tt, ct, callers)}
            for label, (file, name, line) in PROFILED.items():
                profile[label] = round(sum(v[3] for (f, ln, fn), v in stats.items()
                                           if f.endswith(file) and fn == name and (line is None or ln == line)), 3)
    finally:
        engine.close()
    assert n == len(data)
    return dt


def run_prefill(verifier: Path, data, warm, dtype: str, tokens: int) -> float:
    from vllm import LLM, SamplingParams

    llm = LLM(model=str(verifier), dtype=dtype, max_model_len=tokens + 16, enforce_eager=True, enable_prefix_caching=False,
              disable_log_stats=True, seed=0, gpu_memory_utilization=0.2)
    params = SamplingParams(max_tokens=1, temperature=0.0)
    llm.generate([{"prompt_token_ids": ids} for _, ids in warm], params, use_tqdm=False)
    t0 = time.perf_counter()
    llm.generate([{"prompt_token_ids": ids} for _, ids in data], params, use_tqdm=False)
    return time.perf_counter() - t0


def run_transformers(verifier: Path, work: Path, data, warm, layers, dtype: str, batch: int) -> float:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(verifier), dtype=getattr(torch, dtype)).eval()
    last: list[torch.Tensor] = []
    model.model.layers[-1].register_forward_hook(lambda m, i, o: last.append(o[0] if isinstance(o, tuple) else o))
    L = len(model.model.layers)

    def extract(items, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        for s in range(0, len(items), batch):
            chunk = items[s:s + batch]
            last.clear()
            with torch.no_grad():
                hs = model.model(torch.tensor([ids for _, ids in chunk]), output_hidden_states=True).hidden_states
            stacked = torch.stack([hs[l] if l < L else last[0] for l in layers], dim=2)  # [B, T, n, H]
            for b, (index, ids) in enumerate(chunk):
                part = folder / f"hs_{index}.safetensors.part"
                save_file({"hidden_states": stacked[b].contiguous(), "token_ids": torch.tensor(ids)}, str(part))
                os.replace(part, folder / f"hs_{index}.safetensors")

    extract(warm, work / "warm")
    t0 = time.perf_counter()
    extract(data, work / "out")
    return time.perf_counter() - t0


def child(mode: str, verifier: Path, work: Path, n: int, tokens: int, dtype: str, hf_batch: int, profile: bool = False) -> dict:
    """One mode, in this process: its timed seconds, tokens/s and the bytes of the files it wrote."""
    import torch

    vocab = json.loads((verifier / "config.json").read_text())["vocab_size"]
    data, warm, layers = samples(n, tokens, vocab), samples(2, tokens, vocab, seed=1), layers_of(verifier)
    prof: dict | None = {} if profile else None
    if mode == "vllm":
        seconds = run_vllm(verifier, work, data, warm, layers, dtype, tokens, prof)
    elif mode == "vllm-prefill":
        seconds = run_prefill(verifier, data, warm, dtype, tokens)
    else:
        seconds = run_transformers(verifier, work, data, warm, layers, dtype, hf_batch)
    files = sorted((work / "out").glob("hs_*.safetensors")) if mode != "vllm-prefill" else []
    H = json.loads((verifier / "config.json").read_text())["hidden_size"]
    out = {"mode": mode, "seconds": round(seconds, 2), "tokens": n * tokens, "tokens_per_s": round(n * tokens / seconds, 1),
           "torch_threads": torch.get_num_threads(), "layers": layers, **({"profile_seconds": prof} if prof else {})}
    if files:
        assert len(files) == n, f"{mode} wrote {len(files)} files for {n} samples"
        size = sum(f.stat().st_size for f in files)
        out.update(file_bytes=size, bytes_per_token=round(size / (n * tokens), 1),
                   tensor_bytes_per_token=len(layers) * H * ITEMSIZE[dtype] + 8)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", default="0.7b", choices=list(SIZES))
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--dtype", default="float32", choices=list(ITEMSIZE))
    ap.add_argument("--hf-batch", type=int, default=4, help="samples per transformers forward pass")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--profile", action="store_true", help="vllm mode: run the timed extraction under cProfile and record what it adds")
    ap.add_argument("--json", default=None, help="write the results here (after each mode)")
    ap.add_argument("--child", nargs=3, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.child[0], Path(args.child[1]), Path(args.child[2]), args.prompts, args.tokens,
                                           args.dtype, args.hf_batch, args.profile)), flush=True)
        return
    import torch
    import transformers
    import vllm

    cores = os.cpu_count() or 1
    meta = {"date": time.strftime("%Y-%m-%d", time.gmtime()), "machine": platform.machine(), "cpus": cores, "device": "cpu (no GPU)",
            "python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__, "vllm": vllm.__version__,
            "options": {k: v for k, v in vars(args).items() if k not in ("json", "child")}}
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        shape = SIZES[args.size]
        verifier = write_random_verifier(Path(tmp) / "verifier", *shape) if shape else REPO / "examples" / "world" / "verifier"
        env = {**os.environ, "OMP_NUM_THREADS": str(cores), "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TOKENIZERS_PARALLELISM": "false"}
        for mode in args.modes.split(","):
            work = Path(tmp) / mode
            work.mkdir()
            proc = subprocess.run([sys.executable, __file__, "--child", mode, str(verifier), str(work), "--prompts", str(args.prompts),
                                   "--tokens", str(args.tokens), "--dtype", args.dtype, "--hf-batch", str(args.hf_batch)]
                                  + (["--profile"] if args.profile else []),
                                  capture_output=True, text=True, env=env)
            lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
            if proc.returncode or not lines:
                sys.exit(f"{mode} failed:\n{proc.stderr[-3000:]}")
            row = {**json.loads(lines[-1][len("RESULT "):]), "size": args.size, "loadavg": [round(x, 2) for x in os.getloadavg()]}
            rows.append(row)
            print(f"{mode:13s} {row['tokens_per_s']:9.1f} tokens/s ({row['seconds']} s)"
                  + (f", {row['bytes_per_token']} bytes/token on disk (tensors: {row['tensor_bytes_per_token']})" if "file_bytes" in row else ""), flush=True)
            by = {r["mode"]: r for r in rows}
            if "vllm" in by and "vllm-prefill" in by:
                meta["extraction_over_prefill"] = round(by["vllm"]["tokens_per_s"] / by["vllm-prefill"]["tokens_per_s"], 3)
            if "vllm" in by and "transformers" in by:
                meta["vllm_over_transformers"] = round(by["vllm"]["tokens_per_s"] / by["transformers"]["tokens_per_s"], 3)
            if args.json:
                Path(args.json).write_text(json.dumps({"meta": meta, "results": rows}, indent=2) + "\n")
            import shutil

            shutil.rmtree(work, ignore_errors=True)
    for key in ("extraction_over_prefill", "vllm_over_transformers"):
        if key in meta:
            print(f"{key}: {meta[key]}")


if __name__ == "__main__":
    main()
