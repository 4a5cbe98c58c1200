#!/usr/bin/env python3
"""What a draft vocabulary's coverage of the verifier's top-1 costs in acceptance, on the example world.

The shipped EAGLE-1 draft of ``examples/world`` proposes over the whole vocabulary (Vd = V = 2048). Here its
proposals are restricted to a draft vocabulary (the argmax over the allowed ids only, as an EAGLE-3 draft
with that vocabulary would propose), and its held-out acceptance is measured as
``examples/make_world.heldout_acceptance`` does (``validate_run``, reference run, k = 3, 32 tokens per prompt,
the 16 held-out prompts, no vLLM). The vocabularies: the Vd most frequent of the verifier's top-1 predictions
over the training positions (``specfmt train eagle3 --vocab-from verifier``:
:class:`specfmt.training.data.VerifierTop1`, windows of 256 tokens over ``make_world.TRAIN_FILES``) for
decreasing Vd, and the 1024 most frequent tokens of the training text (``--vocab-from data``). Each row gives
the coverage of the verifier's top-1 over the training positions (what ``specfmt train`` reports and warns on)
and the held-out AL. ``specfmt.algorithms.eagle3.COVERAGE_WARN`` is chosen from this table.

Usage::

    python benchmarks/vocab_coverage.py [--json benchmarks/vocab_coverage.results.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORLD = ROOT / "examples" / "world"
SIZES = (2048, 1536, 1024, 896, 768, 640, 512, 384, 256)


def restricted(allowed):
    """Patch EAGLE-1's reference chain to propose the best id among ``allowed`` (None: all)."""
    import torch

    from specfmt.algorithms import eagle

    def step(self, draft, embeds, hidden, positions, rows):
        features, kv = draft(embeds, hidden, positions, rows=rows)
        head = self.lm_head.to(features.device, features.dtype)
        logits = features[0] @ head.T
        if allowed is not None:
            logits = logits.masked_fill(~allowed.to(logits.device), float("-inf"))
        return [int(x) for x in logits.argmax(-1)], features, kv

    eagle._Eagle1Chain.step = step
    return torch


def heldout_al(draft: Path) -> float:
    from specfmt.validation.run import validate_run

    run = validate_run(draft, prompts=str(WORLD / "prompts.jsonl"), max_tokens=32, num_speculative_tokens=3, use_vllm=False, write=False)
    return run.reference["mean_acceptance_length"], run.reference["acceptance_rate_per_position"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    import torch
    from transformers import AutoModelForCausalLM

    sys.path.insert(0, str(ROOT / "examples"))
    import make_world

    from specfmt.algorithms.eagle3 import vocab_map
    from specfmt.convert import convert
    from specfmt.sources.verifier import Verifier
    from specfmt.training.data import VerifierTop1, read_documents

    torch.set_num_threads(2)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    paths = [str(stdlib / n) for n in make_world.TRAIN_FILES if (stdlib / n).is_file()]
    verifier = Verifier.load(str(WORLD / "verifier"))
    docs = read_documents(paths, verifier.tokenizer())
    model = AutoModelForCausalLM.from_pretrained(str(WORLD / "verifier"), dtype=torch.float32).eval()
    t0 = time.time()
    top1 = dict(VerifierTop1(lambda: model, docs.ids, 256, 8))
    count_s = time.time() - t0
    V, total = 2048, sum(top1.values())
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        draft = convert("eagle", str(WORLD / "eagle-safeailab"), Path(tmp) / "draft", str(WORLD / "verifier")).out
        # the verifier predicts fewer distinct ids than V: the sizes above that have no top-1 vocabulary
        cases = [(f"verifier top-1, Vd = {vd}", vd, top1) for vd in SIZES if vd == V or vd <= len(top1)]
        cases += [("text frequency, Vd = 1024", 1024, docs.ids)]
        for label, vd, source in cases:
            if vd == V:
                allowed = None
                cov = 1.0
            else:
                _, t2d, _ = vocab_map(source, V, vd)
                allowed = t2d
                cov = sum(c for t, c in top1.items() if t2d[t]) / total
            restricted(allowed)
            al, per_pos = heldout_al(draft)
            rows.append({"vocabulary": label, "draft_vocab": vd, "top1_coverage": round(cov, 4), "heldout_al": round(al, 3),
                         "per_position": [round(x, 3) for x in per_pos]})
            print(f"{label:28s} coverage {cov:6.1%}  AL {al:.3f}  {per_pos}", flush=True)
    result = {"machine": platform.platform(), "python": platform.python_version(), "date": time.strftime("%Y-%m-%d"),
              "training_positions": total, "top1_count_seconds": round(count_s, 1), "rows": rows}
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
