#!/usr/bin/env python3
"""The real-config corpus converted in full: ``specfmt convert --from ...`` then ``specfmt validate``
on every record of ``tests/data/real_configs`` whose expected outcome is a conversion.

``tests/test_real_configs.py`` runs every record through inspect, ``--from auto``, the planned
conversion with all its checks, and ``validate`` on the planned output; it runs the two whole
commands on two records only. This benchmark runs the whole commands on all of them, to measure
what that costs: the weights are zero-filled sparse files of the published shapes
(``tests/sparse_weights.py``), so the figures are those of hashing and copying gigabytes of
zeros (read from page-cache holes) -- the convert's sha256 of every source file, its NaN/Inf
scan and its copy -- not of a disk. Each command runs in its own process; wall time and peak RSS
(``ru_maxrss`` of the child) are recorded, the output deleted after each record.

Usage::

    python benchmarks/real_configs_bench.py [--records SLUG,...] [--workdir DIR] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).with_name("real_configs_bench.results.json")
sys.path.insert(0, str(REPO / "tests"))


def timed(cmd: list[str]) -> tuple[float, float, int, str]:
    """``(wall s, child peak RSS MiB, exit code, stderr tail)`` of one command in its own process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # the largest child so far (KiB)
    return wall, max(rss, before) / 1024, p.returncode, (p.stderr or p.stdout)[-300:]


def main() -> None:
    import real_configs as rc
    from sparse_weights import nbytes

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", default="")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--json", default=str(RESULTS))
    args = ap.parse_args()
    slugs = [s for s in rc.RECORDS if rc.load(s)["expect"]["outcome"] == "converted" and (not args.records or s in args.records.split(","))]
    work = Path(args.workdir or tempfile.mkdtemp(prefix="specfmt-corpus-bench-"))
    rows = []
    for slug in slugs:
        rec = rc.load(slug)
        root = work / slug
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        src, ver = rc.build(slug, root)
        size = sum(nbytes(s, d) for s, d in rc.tensors_of(rec).values())
        specfmt = [sys.executable, "-m", "specfmt"]
        tap_ids = ["--tap-ids", rec["expect"]["tap_ids"]] if rec["expect"].get("tap_ids") else []
        tap_ids += ["--mask-token-id", str(rec["expect"]["mask_token_flag"])] if rec["expect"].get("mask_token_flag") is not None else []
        c = timed([*specfmt, "convert", "--from", rec["expect"]["from"], str(src), "-o", str(root / "out"), "--verifier", str(ver), *tap_ids])
        v = timed([*specfmt, "validate", str(root / "out"), "--verifier", str(ver)])
        rows.append({"record": slug, "source_bytes": size, "convert_s": round(c[0], 2), "convert_rss_mib": round(c[1]), "convert_rc": c[2],
                     "validate_s": round(v[0], 2), "validate_rc": v[2], "error": "" if c[2] == 0 and v[2] == 0 else c[3] + v[3]})
        print(json.dumps(rows[-1]), flush=True)
        shutil.rmtree(root)
    total = {"records": len(rows), "source_gb": round(sum(r["source_bytes"] for r in rows) / 1e9, 2),
             "convert_s": round(sum(r["convert_s"] for r in rows), 1), "validate_s": round(sum(r["validate_s"] for r in rows), 1),
             "max_convert_rss_mib": max((r["convert_rss_mib"] for r in rows), default=0), "failures": sum(bool(r["error"]) for r in rows)}
    out = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()}, "total": total, "rows": rows}
    Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(total))


if __name__ == "__main__":
    main()
