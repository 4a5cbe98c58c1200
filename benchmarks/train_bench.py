#!/usr/bin/env python3
"""Training throughput of ``specfmt train`` on the example world: tokens per second and peak memory.

Each case runs in its own child process (so peak RSS is that case's alone) through
``specfmt.training.pipeline.train_draft``, exactly what ``specfmt train`` runs, on the training files
of the example world (the Python standard library sources ``examples/make_world.py`` lists):

* ``eagle3``: a new EAGLE-3 draft (Vd = 1024, training-time test over 3 steps);
* ``eagle``: a new EAGLE-1 draft;
* ``medusa``: 3 new Medusa heads;
* ``eagle3 + cache (build)`` / ``eagle3 + cache (read)``: the same EAGLE-3 run with
  ``--cache``, first filling the cache, then reading it (the verifier does not run).

Throughput counts the steps after the first ``--warmup`` ones (trained tokens / wall time
between step callbacks); peak RSS is the child's ``ru_maxrss``. Usage::

    python benchmarks/train_bench.py [--steps 40] [--batch-size 8] [--seq-len 256] [--device cpu] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORLD = REPO / "examples" / "world"
CASES = ["eagle3", "eagle", "medusa", "eagle3-cache-build", "eagle3-cache-read"]
#: each algorithm's own options in the benchmark (``specfmt train ALGO --draft-vocab 1024`` / ``--heads 3``)
OPTIONS = {"eagle3": {"draft_vocab": 1024}, "medusa": {"heads": 3}}


def train_files() -> list[str]:
    sys.path.insert(0, str(REPO / "examples"))
    from make_world import TRAIN_FILES

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return [str(stdlib / n) for n in TRAIN_FILES if (stdlib / n).is_file()]


def child(case: str, steps: int, batch: int, seq_len: int, warmup: int, device: str, cache: str) -> dict:
    import torch

    from specfmt.training.loop import TrainOptions
    from specfmt.training.pipeline import TrainRequest, train_draft

    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
    algo = case.split("-")[0]
    stamps: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        req = TrainRequest(out=str(Path(tmp) / "out"), verifier=str(WORLD / "verifier"), algorithm=algo, data=train_files(),
                           options=OPTIONS.get(algo), device=device,
                           cache=cache if "cache" in case else None, validate=False)
        t0 = time.perf_counter()
        res = train_draft(req, TrainOptions(steps=steps, batch_size=batch, seq_len=seq_len, lr=3e-3, save_every=0),
                          log=lambda s, loss, acc: stamps.append(time.perf_counter()))
        wall = time.perf_counter() - t0
    timed = len(stamps) - 1 - warmup
    seconds = stamps[-1] - stamps[warmup]
    return {
        "case": case, "device": device, "steps": steps, "batch": batch, "seq_len": seq_len,
        "tokens_per_second": round(timed * batch * seq_len / seconds, 1),
        "seconds_per_step": round(seconds / timed, 4),
        "wall_seconds": round(wall, 1),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "cuda_peak_mib": round(torch.cuda.max_memory_allocated() / 2**20, 1) if device.startswith("cuda") else None,
        "trained_tensors": len(res.trained),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--warmup", type=int, default=5, help="steps not timed")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--cache-dir", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.steps, args.batch_size, args.seq_len, args.warmup, args.device, args.cache_dir)))
        return

    import torch

    rows = []
    with tempfile.TemporaryDirectory() as cache:
        for case in args.cases.split(","):
            cmd = [sys.executable, __file__, "--child", case, "--steps", str(args.steps), "--batch-size", str(args.batch_size),
                   "--seq-len", str(args.seq_len), "--warmup", str(args.warmup), "--device", args.device, "--cache-dir", str(Path(cache) / "c")]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                sys.exit(f"{case} failed:\n{proc.stderr[-3000:]}")
            rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            r = rows[-1]
            print(f"{case:22s} {r['tokens_per_second']:>10,.0f} tokens/s  {r['seconds_per_step']:.3f} s/step  "
                  f"peak RSS {r['peak_rss_mib']:,.0f} MiB  wall {r['wall_seconds']:.0f} s", flush=True)
    print()
    print(f"| case | tokens/s | s/step ({args.batch_size} x {args.seq_len}) | peak RSS (MiB) | wall (s, {args.steps} steps + setup) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['case']} | {r['tokens_per_second']:,.0f} | {r['seconds_per_step']:.3f} | {r['peak_rss_mib']:,.0f} | {r['wall_seconds']:.0f} |")
    meta = {"python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count(), "machine": platform.machine(),
            "threads": int(os.environ.get("BENCH_THREADS", "2"))}
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "results": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
