"""Regenerated responses against the original text, on the example world (issue 26).

Two EAGLE-3 drafts for ``examples/world/verifier``, the same budget (steps x batch x seq len, seed, lr,
draft vocabulary size), trained with ``specfmt train eagle3``:

* **original**: the world's training text (the 45 stdlib modules ``examples/make_world.py`` trains on),
  cut into pieces of ``PIECE`` tokens, every ``STRIDE``-th piece kept, one jsonl ``{"text"}`` line each;
* **regenerated**: the same pieces' first ``PROMPT`` tokens as prompts, each continued by the verifier
  with ``specfmt regenerate`` (greedy, ``--max-tokens PIECE - PROMPT``; the world's verifier has no chat
  template, so the prompt is continued as plain text), one ``{"text": prompt + continuation}`` line each.

Both are measured with ``specfmt validate --run --no-vllm`` on the world's held-out prompts
(``examples/world/prompts.jsonl``, from files never trained on), k = 3, 32 tokens each, as the
world's README measures its drafts. Run: ``python benchmarks/regenerate_vs_original.py [--steps 100] [--reuse]``;
writes ``benchmarks/regenerate_vs_original.results.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORLD = REPO / "examples" / "world"
PIECE, PROMPT, STRIDE = 256, 64, 3  # every STRIDE-th piece (a third of the corpus): regeneration in minutes on 2 cores
BATCH, SEQ, LR, SEED, DRAFT_VOCAB = 8, 256, 3e-3, 1237, 1024  # make_world.py's draft settings (SEED + 3)


def specfmt(*args: str) -> tuple[str, float]:
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "specfmt", *map(str, args)], capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"specfmt {' '.join(map(str, args))} failed:\n{r.stderr[-3000:]}")
    return r.stdout, time.perf_counter() - t


def make_data(work: Path) -> dict:
    sys.path.insert(0, str(REPO / "examples"))
    from make_world import build_corpus
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(WORLD / "verifier"))
    train, _ = build_corpus()
    original, prompts = [], []
    for name, text in sorted(train.items()):
        ids = tok.encode(text, add_special_tokens=False)
        for i in range(0, len(ids) - PIECE + 1, PIECE * STRIDE):
            original.append({"text": tok.decode(ids[i:i + PIECE]), "id": f"{name}:{i}"})
            prompts.append({"prompt": tok.decode(ids[i:i + PROMPT]), "id": f"{name}:{i}"})
    for fname, rows in (("original.jsonl", original), ("prompts.jsonl", prompts)):
        (work / fname).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"pieces": len(original), "piece_tokens": PIECE, "prompt_tokens": PROMPT, "every_nth_piece": STRIDE}


def acceptance(draft: Path) -> dict:
    stdout, secs = specfmt("validate", draft, "--run", "--no-vllm", "--prompts", WORLD / "prompts.jsonl",
                           "--max-tokens", "32", "--num-speculative-tokens", "3", "--json")
    return {**figures(json.loads(stdout)), "validate_seconds": round(secs, 1)}


def figures(report: dict) -> dict:
    """The acceptance figures of a ``validate --run --json`` report: its reference run's scalars and
    short lists (per position), nothing bulky."""
    ref = report.get("reference") or {}
    return {f"reference.{k}": v for k, v in ref.items()
            if isinstance(v, (int, float, str)) or (isinstance(v, list) and len(v) <= 8 and all(isinstance(x, (int, float)) for x in v))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--work", default="/tmp/specfmt-regen-bench")
    ap.add_argument("--reuse", action="store_true", help="keep the regenerated data of an earlier run in --work")
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    res: dict = {"date": date.today().isoformat(), "machine": f"{platform.machine()}, 2 CPU cores (shared), no GPU",
                 "data": make_data(work), "budget": {"steps": args.steps, "batch_size": BATCH, "seq_len": SEQ, "lr": LR, "seed": SEED,
                                                     "draft_vocab": DRAFT_VOCAB}}
    regen, done = work / "regenerated.jsonl", work / "regeneration.json"
    if not (args.reuse and done.is_file()):  # --reuse: keep a finished regeneration of an earlier run (its figures in done)
        for p in (regen, regen.with_name(regen.name + ".provenance.json")):
            p.unlink(missing_ok=True)
        stdout, secs = specfmt("regenerate", "--verifier", WORLD / "verifier", "--data", work / "prompts.jsonl", "--out", regen,
                               "--max-tokens", PIECE - PROMPT, "--max-model-len", 512, "--batch-size", 256)
        prov = json.loads(regen.with_name(regen.name + ".provenance.json").read_text())
        done.write_text(json.dumps({"seconds": round(secs, 1), "settings": prov["settings"], "dtype": prov["dtype"], "mode": prov["mode"],
                                    **{k: prov[k] for k in ("conversations", "generated_tokens", "truncated_turns")}}))
    res["regeneration"] = json.loads(done.read_text())
    for name, data in (("original", work / "original.jsonl"), ("regenerated", regen)):
        out = work / f"draft-{name}"
        stdout, secs = specfmt("train", "eagle3", "--verifier", WORLD / "verifier", "--data", data, "--steps", args.steps,
                               "--batch-size", BATCH, "--seq-len", SEQ, "--lr", LR, "--seed", SEED, "--draft-vocab", DRAFT_VOCAB,
                               "--output", out, "--no-validate", "--force")
        res[name] = {"train_seconds": round(secs, 1), "train_summary": " ".join(stdout.split())[:300], **acceptance(out)}
        print(name, json.dumps(res[name])[:600], flush=True)
    Path(__file__).with_suffix(".results.json").write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
