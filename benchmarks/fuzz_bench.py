"""Fuzz every command that reads a config or a folder, 10,000 examples each, and count the outcomes.

The inputs and the judgement are the CI fuzz test's (``tests/fuzz_targets.py``): checkpoint
folders of every layout with random edits, run in-process through ``inspect``, ``convert --from F``
(every F and ``auto``), ``validate``, ``upgrade``, ``push --dry-run`` and ``train ALGO --init``; and (issue 35)
``validate --run`` on damaged drafts, ``datagen`` on fuzzed ``--data`` files and on damaged existing outputs,
``regenerate`` on fuzzed ``--data`` files and ``train ALGO --hidden-states`` on damaged datagen folders, with no
model loaded and no engine started (``Entry.stubs``).
For each command the results file holds:

* ``examples``: inputs tried;
* ``ok`` / ``refused``: exit 0 or 1 / exit 2 with one ``specfmt: error:`` line;
* ``reached`` (``validate --run``): the run got past every check to the verifier's weights, where the fuzzer stops it;
* ``uncaught``: any other ending (an exception, a traceback) -- a bug;
* ``wrong``: what the command's own judgement found (``Entry.check``: datagen's output not what a fresh run
  writes, a stale file kept; ``validate --run`` loading the verifier after a static failure);
* ``left_behind``: refusals after which an output folder, anything beside it, or a temporary
  file or folder remained;
* ``inputs_modified``: runs after which the checkpoint, the verifier or the data file differed;
* ``removed_temporary`` (``datagen OUT``, when any): refusals that removed a killed run's temporary file
  (``NAME.PID.tmp``) from the existing output before refusing (never data; any other change is ``left_behind``);
* ``problems``: the first few problem cases, each with its :class:`fuzz_targets.Case` (paste it
  into ``FOUND`` in ``tests/test_fuzz.py`` once fixed).

Run (from the repository root; about 1-2 hours on 2 CPU cores)::

    python benchmarks/fuzz_bench.py                        # 10,000 per command -> benchmarks/fuzz_bench.results.json
    python benchmarks/fuzz_bench.py --examples 200 --only inspect --out /tmp/x.json
    python benchmarks/fuzz_bench.py --only 'datagen OUT' --append   # one command's row replaced in the results file
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
os.environ.setdefault("OMP_NUM_THREADS", "1")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=10_000, help="examples per command")
    ap.add_argument("--seed", type=int, default=2323)
    ap.add_argument("--only", action="append", help="a command of fuzz_targets.ENTRIES (repeatable; default: all)")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "fuzz_bench.results.json")
    ap.add_argument("--append", action="store_true",
                    help="keep the other commands already in --out (each command's row is one run; e.g. two --only halves run side by side)")
    args = ap.parse_args()

    import conftest  # noqa: F401  (offline Hub, a private HF cache: as in the tests)
    import hypothesis
    import torch
    from hypothesis import HealthCheck, Phase, given, seed, settings

    from fuzz_targets import ENTRIES, Fuzzer

    torch.set_num_threads(1)
    names = args.only or list(ENTRIES)
    unknown = [n for n in names if n not in ENTRIES]
    if unknown:
        ap.error(f"no fuzz entry {unknown} (known: {', '.join(ENTRIES)})")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "specfmt", "converters", "tests"], cwd=REPO, capture_output=True, text=True).stdout
    commit += "+changes" if dirty.strip() else ""
    fuzzer = Fuzzer(Path(tempfile.mkdtemp(prefix="specfmt-fuzz-bench-")))
    results: dict = {}
    for name in names:
        entry = ENTRIES[name]
        counts: Counter = Counter()
        problems: list[dict] = []
        t0 = time.perf_counter()

        @settings(max_examples=args.examples, deadline=None, database=None, suppress_health_check=list(HealthCheck), phases=[Phase.generate])
        @seed(args.seed)
        @given(case=fuzzer.strategy(entry))
        def run(case):
            outcome = fuzzer.run(entry, case)
            counts["examples"] += 1
            counts[outcome.kind] += 1
            counts["left_behind"] += bool(outcome.left_behind)
            counts["inputs_modified"] += bool(outcome.modified)
            counts["wrong"] += bool(outcome.wrong)
            counts["removed_temporary"] += bool(outcome.removed)
            if counts["examples"] % 1000 == 0:  # a long run shows where it is
                print(f"  {name}: {counts['examples']:,} examples, {time.perf_counter() - t0:,.0f} s, "
                      f"uncaught {counts['uncaught']}, wrong {counts['wrong']}", flush=True)
            if not outcome.clean and len(problems) < 20:
                problems.append({"case": repr(case), "kind": outcome.kind, "error": outcome.error, "left_behind": outcome.left_behind,
                                 "modified": outcome.modified, "wrong": outcome.wrong})

        run()
        seconds = time.perf_counter() - t0
        results[name] = {"examples": counts["examples"], "ok": counts["ok"], "refused": counts["refused"], "uncaught": counts["uncaught"],
                         "left_behind": counts["left_behind"], "inputs_modified": counts["inputs_modified"], "seconds": round(seconds, 1),
                         "reached": counts["reached"], "wrong": counts["wrong"], "commit": commit, "problems": problems,
                         **({"removed_temporary": counts["removed_temporary"]} if counts["removed_temporary"] else {})}
        print(f"{name}: {json.dumps({k: v for k, v in results[name].items() if k != 'problems'})}", flush=True)

    runs = [shlex.join(sys.argv[1:])]
    if args.append and args.out.is_file():
        earlier = json.loads(args.out.read_text())
        results = {**{k: v for k, v in earlier["commands"].items() if k not in results}, **results}
        runs = earlier.get("runs", [earlier["command"]]) + runs
    totals = {k: sum(r.get(k, 0) for r in results.values())
              for k in ("examples", "ok", "refused", "reached", "uncaught", "wrong", "left_behind", "inputs_modified")}
    report = {
        "what": "fuzzed checkpoint folders through every command that reads a config or a folder (tests/fuzz_targets.py)",
        "command": "python benchmarks/fuzz_bench.py " + shlex.join(sys.argv[1:]),
        "runs": runs,
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "hypothesis": hypothesis.__version__,
        "seed": args.seed,
        "examples_per_command": args.examples,
        "totals": totals,
        "commands": results,
    }
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(totals))


if __name__ == "__main__":
    main()
