#!/usr/bin/env python3
"""Muon's Newton-Schulz orthogonalisation on this CPU: torch's bf16 function against specfmt's float32 products.

    python benchmarks/muon_cpu.py [--threads 1] [--repeats 5]

For each matrix that ``specfmt train eagle3`` gives Muon on the example world (the shipped EAGLE-3 draft's 2-D
weights, :func:`specfmt.training.optim.goes_to_muon`) and for a 512 x 1536 matrix (the 40-layer test
verifier's draft), times five iterations of ``torch/optim/_muon.py::_zeropower_via_newtonschulz`` and of
:func:`specfmt.training.muon.orthogonalize` (best of ``--repeats``), and how far each result is from the exact polar
factor. Writes ``benchmarks/muon_cpu.results.json``; ``docs/measured.md`` quotes it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DRAFT = REPO / "examples" / "world" / "eagle3-safeailab"
COEF, STEPS, EPS = (3.4445, -4.775, 2.0315), 5, 1e-7


def _best(fn, g, repeats: int) -> float:
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn(g, COEF, STEPS, EPS)
        out.append(time.perf_counter() - t)
    return min(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    import torch
    from torch.optim import _muon

    from specfmt.training.muon import orthogonalize
    from specfmt.training.optim import goes_to_muon

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    shapes: list[tuple[str, tuple[int, int]]] = []
    weights = torch.load(DRAFT / "pytorch_model.bin", map_location="cpu", weights_only=True)  # SafeAILab's layout
    shapes += [(name, tuple(w.shape)) for name, w in weights.items() if goes_to_muon(name, tuple(w.shape))]
    shapes.append(("40-layer test verifier's draft, 512 x 1536", (512, 1536)))
    rows = []
    for name, shape in shapes:
        g = torch.randn(*shape)
        u, _, vh = torch.linalg.svd(g.double(), full_matrices=False)
        polar = (u @ vh).float()
        row = {"matrix": name, "shape": list(shape)}
        for label, fn in (("torch_bf16", _muon._zeropower_via_newtonschulz), ("specfmt", orthogonalize)):
            row[f"{label}_s"] = round(_best(fn, g, args.repeats), 5)
            row[f"{label}_distance_to_polar"] = round(float((fn(g, COEF, STEPS, EPS).float() - polar).norm() / polar.norm()), 4)
        row["speedup"] = round(row["torch_bf16_s"] / row["specfmt_s"], 1)
        rows.append(row)
        print(f"{name:60s} {str(shape):12s} torch {row['torch_bf16_s']:.4f} s  specfmt {row['specfmt_s']:.4f} s  x{row['speedup']}")
    world = [r for r in rows if not r["matrix"].startswith("40-layer")]
    step = {k: round(sum(r[k] for r in world), 4) for k in ("torch_bf16_s", "specfmt_s")}
    print(f"the world EAGLE-3 draft's matrices, one optimizer step: torch {step['torch_bf16_s']} s, specfmt {step['specfmt_s']} s")
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("model name")),
               "") if Path("/proc/cpuinfo").exists() else ""
    out = {
        "machine": {"machine": cpu or platform.machine(), "threads": args.threads, "torch": torch.__version__,
                    "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"), "loadavg": list(os.getloadavg())},
        "ns_steps": STEPS, "repeats": args.repeats, "rows": rows, "world_eagle3_step": step,
    }
    (REPO / "benchmarks" / "muon_cpu.results.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
