#!/usr/bin/env python3
"""EAGLE-3 drafts of 1, 2 and 3 decoder layers on the example world: at an equal step budget and at an equal wall-clock
budget, each measured by the reference and served by vLLM (issue 38).

What is run, and how:

* **Training**: ``benchmarks/trainer_vs_speculators.py`` trains every draft (specfmt only, the shared hidden states of the
  world's 45 training files, ``--specfmt-option layers=L``, the learning rate and optimizer given here, every other option
  ``specfmt train eagle3``'s default), so each run is also a run of that harness's results file.
  * equal steps: ``--steps`` for L = 1, 2, 3;
  * equal wall clock: the 3-layer draft's ``--steps`` steps of training time, spent by the 1- and 2-layer drafts: their
    steps are ``--steps`` times the 3-layer draft's seconds per step over their own, rounded to 10. The seconds per step
    come from :func:`step_seconds` (each draft trained a few dozen steps on one thread, the three in turn, twice), not
    from the equal-step runs, whose times carry whatever else the machine ran then (``--calibrate-steps``).
* **Measurement** of each draft:
  * the reference AL on the larger held-out set (``prompts-heldout.jsonl``, 719 prompts x 32 tokens, k = 3), from the harness;
  * ``validate_run`` with vLLM on the world's 16 held-out prompts: vLLM's AL, ``vllm_exact`` (greedy output equal to the
    verifier alone) and ``agreement`` (vLLM's per-position acceptance within 0.1 of the reference's);
  * the draft's cost: its parameters (without ``d2t``/``t2d``) and the time of one drafting pass of the draft module over
    a 256-token window on one thread (the median of 20, after 3 not timed), beside the verifier's own forward pass.

Results go to ``draft_layers.results.json`` as each measurement ends; ``docs/measured.md`` renders them. Usage::

    nice -n 10 python benchmarks/draft_layers.py [--steps 1500] [--lr 2e-2] [--optimizer muon]   # vLLM under the flock
    python benchmarks/draft_layers.py --calibrate-only ...              # the seconds per step alone (an idle machine)
    python benchmarks/draft_layers.py --wall-clock-only --layers 1 ...  # one equal wall-clock run (two at once: --json apart)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = HERE / "draft_layers.results.json"
#: the lock every vLLM engine on this shared machine takes (``flock /tmp/specfmt-vllm.lock``); training runs without it
VLLM_LOCK = "/tmp/specfmt-vllm.lock"
sys.path.insert(0, str(HERE))

import trainer_vs_speculators as tvs  # noqa: E402


def _harness(args: argparse.Namespace, layers: int, steps: int) -> None:
    cmd = [sys.executable, str(HERE / "trainer_vs_speculators.py"), "--trainers", "specfmt", "--steps", str(steps), "--lrs", f"{args.lr:g}",
           "--threads", "1", "--prompts", tvs.LARGE_PROMPTS, "--json", str(args.harness_json),
           "--specfmt-option", f"optimizer={args.optimizer}", *(["--specfmt-option", f"layers={layers}"] if layers > 1 else [])]
    subprocess.run(cmd, check=True)


def _run(args: argparse.Namespace, layers: int, steps: int) -> dict:
    """The harness's record of the specfmt run with ``layers`` at ``steps`` (the newest of this lr and optimizer)."""
    results = json.loads(Path(args.harness_json).read_text())
    found = [r for r in results["runs"].values() if r["trainer"] == "specfmt" and r["world"] == "world" and r["steps"] == steps
             and r["lr"] == args.lr and r.get("seed", tvs.SEED) == tvs.SEED and r.get("optimizer") == args.optimizer
             and _layers_of(r) == layers and tvs.figures_on(r, tvs.LARGE_PROMPTS)]
    if not found:
        sys.exit(f"no harness run with {layers} layers at {steps} steps")
    return found[-1]


def _layers_of(run: dict) -> int:
    """The draft layers of a harness run: its ``layers=`` option, else 1 (``specfmt train eagle3``'s default; the 1-layer
    draft is the trainer benchmark's own run)."""
    given = [o.split("=", 1)[1] for o in run["options"] if o.startswith("layers=")]
    return int(given[0]) if given else 1


def step_seconds(args: argparse.Namespace, layers: list[int], world: Path) -> dict:
    """Seconds per training step of each draft (``specfmt train eagle3 --hidden-states``, the harness's data and options, one
    thread): ``--calibrate-steps`` steps of each, the first 10 not timed, the drafts in turn and the whole round twice, the
    lower of each draft's two figures (what another job on the machine can only slow)."""
    import tempfile

    work = Path("~/.cache/specfmt/bench/trainer_vs_speculators").expanduser() / world.name
    data = work / "data-256-verifier"
    facts = json.loads(Path(args.harness_json).read_text())["data"][f"{world.name}|verifier"]
    seen: dict[int, list[float]] = {n: [] for n in layers}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(2):
            for n in layers:
                spec = tvs.train_spec(world, data, facts, Path(tmp) / f"d{n}", steps=args.calibrate_steps, lr=args.lr, batch=8, seq_len=256,
                                      seed=tvs.SEED, threads=1, warmup=10, draft_vocab=1024,
                                      options=[f"optimizer={args.optimizer}", *([f"layers={n}"] if n > 1 else [])])
                figures, _ = tvs.train_one("specfmt", spec, work)
                seen[n].append(8 * 256 / figures["tokens_per_second"])
                print(f"{n} layer(s): {seen[n][-1]:.3f} s per step", flush=True)
    return {"steps": args.calibrate_steps, "seconds_per_step": {str(n): round(min(v), 4) for n, v in seen.items()},
            "all": {str(n): [round(x, 4) for x in v] for n, v in seen.items()}, "loadavg": round(os.getloadavg()[0], 2),
            "date": time.strftime("%Y-%m-%d")}


def draft_cost(draft: Path, world: Path) -> dict:
    """Parameters of the draft and one drafting pass of its module over a 256-token window, one thread (ms, median of 20),
    beside the verifier's forward pass over the same window."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from specfmt.algorithms import get

    torch.set_num_threads(1)
    cfg = json.loads((draft / "config.json").read_text())
    tensors = {}
    for f in sorted(draft.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    module = get("eagle3").module(cfg, {n: t.float() for n, t in tensors.items()}).eval()
    params = sum(t.numel() for n, t in tensors.items() if n not in ("d2t", "t2d"))
    H = cfg["transformer_layer_config"]["hidden_size"]
    verifier = AutoModelForCausalLM.from_pretrained(str(world / "verifier"), dtype=torch.float32).eval()
    T = 256
    e, h, pos = torch.randn(1, T, H), torch.randn(1, T, H), torch.arange(T)

    def median_ms(fn) -> float:
        with torch.no_grad():
            for _ in range(3):
                fn()
            times = []
            for _ in range(20):
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1000)
        return round(statistics.median(times), 2)

    ids = torch.randint(0, verifier.config.vocab_size, (1, T))
    return {"params": params, "draft_pass_ms": median_ms(lambda: module(e, h, pos)),
            "verifier_pass_ms": median_ms(lambda: verifier(ids)), "window": T, "loadavg": round(os.getloadavg()[0], 2)}


def served(draft: Path, world: Path) -> dict:
    """``validate_run`` with vLLM on the world's 16 held-out prompts: AL both ways and the checks that say it is served right."""
    import fcntl

    from specfmt.validation.run import validate_run

    with open(VLLM_LOCK, "a") as lock:  # one vLLM engine at a time on a shared machine (what `flock` takes)
        fcntl.flock(lock, fcntl.LOCK_EX)
        run = validate_run(str(draft), prompts=str(world / tvs.SMALL_PROMPTS), max_tokens=32, num_speculative_tokens=3, use_vllm=True,
                           write=False)
    checks = {c.name: c.status for c in run.report.checks}
    return {"reference_al": round(run.reference["mean_acceptance_length"], 4) if run.reference else None,
            "vllm_al": round(run.vllm["mean_acceptance_length"], 4) if run.vllm else None,
            "checks": {k: checks.get(k) for k in ("vllm", "vllm_exact", "agreement", "vllm_weights")}}


def main() -> None:
    from specfmt.training.loop import TrainOptions

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--lr", type=float, default=TrainOptions().resolved("eagle3").lr)
    ap.add_argument("--optimizer", default=TrainOptions().resolved("eagle3").optimizer)
    ap.add_argument("--layers", default="1,2,3")
    ap.add_argument("--harness-json", default=str(tvs.RESULTS))
    ap.add_argument("--json", default=str(RESULTS))
    ap.add_argument("--no-vllm", action="store_true")
    ap.add_argument("--calibrate-steps", type=int, default=60, help="steps per draft in the seconds-per-step calibration")
    ap.add_argument("--calibrate-only", action="store_true", help="measure the seconds per step, record them and stop")
    ap.add_argument("--wall-clock-only", action="store_true", help="the equal wall-clock runs alone (the calibration recorded)")
    args = ap.parse_args()
    world = REPO / "examples" / "world"
    path = Path(args.json)
    out = json.loads(path.read_text()) if path.is_file() else {"runs": {}}
    out["meta"] = {"steps": args.steps, "lr": args.lr, "optimizer": args.optimizer, "date": time.strftime("%Y-%m-%d")}
    layers = [int(x) for x in args.layers.split(",")]

    def record(budget: str, n: int, steps: int) -> None:
        key = f"{budget}|{n}"
        rec = out["runs"].get(key, {})
        r = _run(args, n, steps)
        rec.update({"budget": budget, "layers": n, "steps": steps, "train_seconds": r["train_seconds"], "tokens_per_second": r["tokens_per_second"],
                    "load_average": r.get("load_average"), "al_heldout": tvs.figures_on(r, tvs.LARGE_PROMPTS)["al"],
                    "al_small": r["reference"]["al"], "draft": r["draft"]})
        if "cost" not in rec:
            rec["cost"] = draft_cost(Path(r["draft"]), world)
        if not args.no_vllm and "served" not in rec:
            rec["served"] = served(Path(r["draft"]), world)
        out["runs"][key] = rec
        path.write_text(json.dumps(out, indent=2) + "\n")
        print(json.dumps(rec), flush=True)

    if args.calibrate_only or "calibration" not in out:
        out["calibration"] = step_seconds(args, [1, 2, 3], world)
        path.write_text(json.dumps(out, indent=2) + "\n")
        if args.calibrate_only:
            return
    if not args.wall_clock_only:
        for n in layers:
            _harness(args, n, args.steps)
            record("steps", n, args.steps)
    per_step = {int(n): v for n, v in out["calibration"]["seconds_per_step"].items()}
    top = max(per_step)
    for n in layers:
        if n == top:
            continue
        steps = int(round(args.steps * per_step[top] / per_step[n], -1))
        _harness(args, n, steps)
        record("wall clock", n, steps)


if __name__ == "__main__":
    main()
