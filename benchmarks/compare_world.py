#!/usr/bin/env python3
"""Which method to serve on the example world: ``specfmt compare`` on every draft the world ships, its draft LMs, n-gram
and suffix decoding, greedy and at T = 1 (issue 37).

    nice -n 10 flock /tmp/specfmt-vllm.lock python benchmarks/compare_world.py
        [--temperatures 0 1] [--seeds 0 1 2 3] [--max-tokens 32] [--no-vllm]

The drafts are converted from their research layouts into a temporary folder (``specfmt convert``); a draft LM of the
world (``examples/world/draft-lm-*``, ``examples/make_pairs.py``) is taken as it is, the padded one after
``specfmt pad-vocab`` (vLLM refuses its vocabulary size otherwise). Suffix decoding needs arctic-inference: it is built
for this interpreter as the tests build it (``tests/arctic_env.py``); if it cannot be, its row says why.

Writes ``benchmarks/compare_world.results.json`` (every row of every temperature, the machine, the date, the load) and
``docs/img/compare-world-t<T>.png`` (acceptance per position per method); ``docs/measured.md`` renders the table.
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
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WORLD = REPO / "examples" / "world"
#: the world's drafts in their research layouts: (label, folder, --from)
DRAFTS = [("EAGLE-3", "eagle3-safeailab", "eagle3"), ("EAGLE-1", "eagle-safeailab", "eagle"), ("Medusa", "medusa-legacy", "medusa")]


def _arctic() -> str:
    """Make arctic-inference importable here and in vLLM's engines (``tests/arctic_env.py``); '' or why it cannot."""
    sys.path.insert(0, str(REPO / "tests"))
    try:
        import arctic_env

        env = arctic_env.arctic_env()
    except Exception as e:  # noqa: BLE001 - the suffix row then says why
        return f"{type(e).__name__}: {str(e)[-400:]}"
    sys.path.insert(0, str(env.root))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(env.root), os.environ.get("PYTHONPATH", "")])
    return ""


def _methods(tmp: Path) -> list[tuple[str, str]]:
    """``(label, what compare is given)`` for every draft of the world, converted where needed."""
    out = []
    for label, folder, fmt in DRAFTS:
        dst = tmp / folder
        subprocess.run([sys.executable, "-m", "specfmt", "convert", "--from", fmt, str(WORLD / folder), "-o", str(dst), "--verifier",
                        str(WORLD / "verifier")], check=True, capture_output=True)
        out.append((label, str(dst)))
    for lm in sorted(WORLD.glob("draft-lm-*")):
        cfg = json.loads((lm / "config.json").read_text())
        if cfg.get("vocab_size") != json.loads((WORLD / "verifier" / "config.json").read_text())["vocab_size"] and (lm / "tokenizer.json").read_bytes() == (WORLD / "verifier" / "tokenizer.json").read_bytes():
            dst = tmp / f"{lm.name}-fixed"
            subprocess.run([sys.executable, "-m", "specfmt", "pad-vocab", str(lm), "--verifier", str(WORLD / "verifier"), "-o", str(dst)],
                           check=True, capture_output=True)
            out.append((f"draft LM ({lm.name}, pad-vocab)", str(dst)))
        else:
            out.append((f"draft LM ({lm.name})", str(lm)))
    return out + [("n-gram", "ngram"), ("suffix decoding", "suffix")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--no-vllm", action="store_true")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "compare_world.results.json"))
    args = ap.parse_args()

    arctic = _arctic()
    from specfmt.cli.compare import plot
    from specfmt.methods import resolve
    from specfmt.validation import vllm_run
    from specfmt.validation.compare import compare

    results = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
               "python": platform.python_version(), "command": "python benchmarks/compare_world.py " + " ".join(sys.argv[1:]),
               "arctic_inference_build": arctic or "built from the sdist (tests/arctic_env.py)", "runs": []}
    with tempfile.TemporaryDirectory(prefix="compare-world-") as tmp:
        labelled = _methods(Path(tmp))
        labels = {ref: label for label, ref in labelled}
        with vllm_run.engines():
            for t in args.temperatures:
                load0 = os.getloadavg()
                t0 = time.time()
                res = compare(str(WORLD / "verifier"), [resolve(ref) for _, ref in labelled], prompts=str(WORLD / "prompts.jsonl"),
                              max_tokens=args.max_tokens, temperature=t, seeds=args.seeds, use_vllm=not args.no_vllm)
                data = res.to_json()
                for m in data["methods"]:
                    m["label"] = labels.get(m["method"], m["method"])
                    m["method"] = m["label"] if m["method"].startswith(tmp) else m["method"].replace(str(REPO) + "/", "")
                data["verifier"] = "examples/world/verifier"
                data["prompts"]["source"] = "examples/world/prompts.jsonl"
                data.update(seconds=round(time.time() - t0, 1), load_average=[round(x, 1) for x in (*load0, *os.getloadavg())])
                results["runs"].append(data)
                png = REPO / "docs" / "img" / f"compare-world-t{t:g}.png"
                png.parent.mkdir(parents=True, exist_ok=True)
                plot(data, png)
                print(f"T = {t:g}: {data['seconds']} s", flush=True)
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
