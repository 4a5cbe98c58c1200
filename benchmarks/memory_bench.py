#!/usr/bin/env python3
"""Where ``validate --run --no-vllm`` spends its memory, on a random verifier of real size (issue 23, item 12).

For each stored dtype of the verifier (``--stored``: float32, and bfloat16 as most Hub checkpoints
are stored), the benchmark writes a random Llama verifier of ``--size`` (default ``0.7b``: H = 2048,
16 layers, GQA 32/4 heads, V = 2048, 0.71 B parameters; :data:`scale_bench.SIZES`) and a new EAGLE-3
draft for it (``specfmt train eagle3 --dry-run``), then, each in a child of its own:

* **peak**: ``/usr/bin/time -v specfmt validate DRAFT --run --no-vllm --prompts P --max-tokens N
  --device cpu``, its "Maximum resident set size" (where ``/usr/bin/time`` is missing, the child's
  ``ru_maxrss``, the same figure), against issue 19's bound ``1.2 x the verifier's bytes in its run
  dtype (float32) + 1 GiB``;
* **phases** (``--phases``): the same run in process, its resident set sampled every 5 ms and the
  largest sample kept per phase (the imports and static checks, the verifier's load, the draft's
  tensors and readings, the verifier's passes, the draft simulation), split into anonymous memory and
  file pages (``RssAnon`` / ``RssFile`` of ``/proc/self/status``: a memory-mapped file's pages count
  once read).

``--code DIR`` (repeatable) measures the specfmt package in ``DIR`` (first on ``PYTHONPATH``), e.g. a
worktree of an older commit, beside the installed one, so a before/after pair comes from one run.
Memory does not depend on how busy the machine is; the wall times recorded are not benchmarks.
Usage::

    python benchmarks/memory_bench.py [--size 0.7b] [--stored float32,bfloat16] [--prompts examples/world/prompts.jsonl]
        [--max-tokens 32] [--code /tmp/old-specfmt] [--no-phases] [--json benchmarks/memory_bench.results.json [--append]]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scale_bench import SIZES, GiB, peak_rss, weight_bytes, write_random_verifier  # this folder is on sys.path

REPO = Path(__file__).resolve().parents[1]

#: the phases of the in-process profile, in order: (label, the function whose call starts it, the label after it returns)
PHASES = [
    ("verifier load", "specfmt.sources.verifier|specfmt.verifier:Verifier.load_model", "draft tensors and readings"),
    ("verifier passes", "specfmt.validation.acceptance:greedy_path", "draft simulation"),
]


def _status() -> dict[str, int]:
    """``VmRSS``, ``RssAnon``, ``RssFile`` of this process, in bytes."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile"):
                out[key] = int(value.split()[0]) * 1024
    return out


def profile(draft: str, prompts: str, max_tokens: int) -> dict:
    """In this process: ``validate_run(draft, use_vllm=False)`` with its resident set sampled every 5 ms;
    returns the largest sample of each phase (bytes) and the run's mean acceptance length."""
    import importlib
    import threading

    phase = ["imports and static checks"]
    peaks: dict[str, dict[str, int]] = {}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            s, p = _status(), phase[0]
            if p not in peaks or s["VmRSS"] > peaks[p]["VmRSS"]:
                peaks[p] = s
            time.sleep(0.005)

    threading.Thread(target=sample, daemon=True).start()
    try:
        from specfmt.sources.placement import resolve_placement
    except ImportError:  # --code of a commit before the packages were layered (issue 24)
        from specfmt.placement import resolve_placement
    from specfmt.validation.run import validate_run

    for label, where, after in PHASES:
        modules, attr = where.split(":")
        for module in modules.split("|"):  # the first that imports: the module moved (issue 24)
            try:
                owner = importlib.import_module(module)
                break
            except ImportError:
                continue
        *path, name = attr.split(".")
        for part in path:
            owner = getattr(owner, part)
        real = getattr(owner, name)

        def wrapped(*a, _real=real, _label=label, _after=after, **kw):
            phase[0] = _label
            try:
                return _real(*a, **kw)
            finally:
                phase[0] = _after

        setattr(owner, name, wrapped)
    res = validate_run(draft, prompts=prompts, max_tokens=max_tokens, use_vllm=False, write=False, placement=resolve_placement("cpu"))
    done.set()
    time.sleep(0.02)
    return {"phases": [{"phase": p, "rss": s["VmRSS"], "anon": s["RssAnon"], "file": s["RssFile"]} for p, s in peaks.items()],
            "mean_acceptance_length": (res.reference or {}).get("mean_acceptance_length")}


def max_rss(cmd: list[str], env: dict) -> tuple[int, str, int]:
    """``(peak RSS in bytes, how it was measured, exit code)`` of ``cmd`` run as a child."""
    time_v = shutil.which("time", path="/usr/bin")
    if time_v:
        proc = subprocess.run([time_v, "-v", *cmd], capture_output=True, text=True, env={**os.environ, **env})
        m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)
        if m:
            return int(m.group(1)) * 1024, "/usr/bin/time -v", proc.returncode
    proc, rss, _ = peak_rss(cmd, env=env)
    return rss, "ru_maxrss", proc.returncode


def commit_of(folder: Path) -> str | None:
    """The git commit checked out in ``folder`` (``+dirty`` with uncommitted changes to tracked files), or None."""
    head = subprocess.run(["git", "-C", str(folder), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if head.returncode:
        return None
    dirty = subprocess.run(["git", "-C", str(folder), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True).stdout.strip()
    return head.stdout.strip() + ("+dirty" if dirty else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", default="0.7b", choices=[s for s, d in SIZES.items() if d])
    ap.add_argument("--stored", default="float32,bfloat16", help="the verifier's stored dtypes (it runs in float32)")
    ap.add_argument("--prompts", default=str(REPO / "examples" / "world" / "prompts.jsonl"))
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--code", action="append", default=[], help="also measure the specfmt package in this folder")
    ap.add_argument("--no-phases", action="store_true", help="only the peaks, no in-process profile")
    ap.add_argument("--json", default=None, help="write the results here (after each measurement)")
    ap.add_argument("--append", action="store_true", help="add to the results already in --json (each row keeps its options)")
    ap.add_argument("--profile", nargs=3, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.profile:
        print(json.dumps(profile(args.profile[0], args.profile[1], int(args.profile[2]))))
        return
    import torch
    import transformers

    import specfmt

    installed = Path(specfmt.__file__).resolve().parents[1]
    codes = [(f"installed ({commit_of(installed)})", None)] + [(f"{Path(c).resolve()} ({commit_of(Path(c))})", str(Path(c).resolve())) for c in args.code]
    options = {k: v for k, v in vars(args).items() if k not in ("json", "profile", "append")}
    meta = {"date": time.strftime("%Y-%m-%d", time.gmtime()), "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "safetensors": __import__("safetensors").__version__, "cpus": os.cpu_count(),
            "machine": platform.machine()}
    rows = json.loads(Path(args.json).read_text())["results"] if args.append and args.json and Path(args.json).is_file() else []
    with tempfile.TemporaryDirectory() as tmp:
        for stored in args.stored.split(","):
            t0 = time.perf_counter()
            ver = write_random_verifier(Path(tmp) / f"verifier-{stored}", *SIZES[args.size], dtype=stored)
            draft = Path(tmp) / f"draft-{stored}"
            proc = subprocess.run([sys.executable, "-m", "specfmt", "train", "eagle3", "--verifier", str(ver), "-o", str(draft),
                                   "--dry-run", "--no-validate"], capture_output=True, text=True)
            if proc.returncode:
                sys.exit(f"the draft was not built:\n{proc.stderr[-2000:]}")
            B = weight_bytes(ver, "float32")
            base = {"size": args.size, "stored": stored, "params": B // 4, "verifier_bytes": B, "verifier_file_bytes": weight_bytes(ver),
                    "draft_bytes": weight_bytes(draft), "bound": int(1.2 * B + GiB), "build_seconds": round(time.perf_counter() - t0, 1)}
            for code_name, code in codes:
                env = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(os.cpu_count()))}
                if code:
                    env["PYTHONPATH"] = code
                row = {**base, "code": code_name, "options": options}
                t0 = time.perf_counter()
                # -P: `-m` would put the working folder (this repository) first on sys.path, before PYTHONPATH's --code
                rss, how, rc = max_rss([sys.executable, "-P", "-m", "specfmt", "validate", str(draft), "--run", "--no-vllm", "--prompts", args.prompts,
                                        "--max-tokens", str(args.max_tokens), "--device", "cpu"], env)
                if rc not in (0, 1):
                    sys.exit(f"validate --run failed ({code_name}, stored {stored}), exit {rc}")
                row.update(peak_rss=rss, measured_by=how, within_bound=rss <= row["bound"], wall_seconds=round(time.perf_counter() - t0, 1))
                if not args.no_phases:
                    prof = subprocess.run([sys.executable, __file__, "--profile", str(draft), args.prompts, str(args.max_tokens)],
                                          capture_output=True, text=True, env={**os.environ, **env})
                    if prof.returncode:
                        sys.exit(f"the profile failed:\n{prof.stderr[-2000:]}")
                    row.update(json.loads(prof.stdout.strip().splitlines()[-1]))
                row["loadavg"] = os.getloadavg()
                rows.append(row)
                if args.json:
                    Path(args.json).write_text(json.dumps({"meta": meta, "results": rows}, indent=2) + "\n")
                print(f"{args.size} stored {stored}, {code_name}: peak {rss / GiB:.2f} GiB ({how}), bound {row['bound'] / GiB:.2f} GiB "
                      f"(verifier {B / GiB:.2f} GiB in float32)", flush=True)
                for p in row.get("phases", []):
                    print(f"    {p['phase']:28s} {p['rss'] / GiB:5.2f} GiB  (anon {p['anon'] / GiB:5.2f}, file pages {p['file'] / GiB:5.2f})", flush=True)
            shutil.rmtree(ver, ignore_errors=True)


if __name__ == "__main__":
    main()
