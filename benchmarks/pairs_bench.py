#!/usr/bin/env python3
"""Draft-model pairs of the example world in every engine: the reference, vLLM ``draft_model``, transformers ``assistant_model``.

On the 16 held-out prompts x 32 tokens, k = 3, float32 reference and transformers on the CPU, vLLM's CPU build
(bf16), one vLLM engine host for every engine. The pairs:

* ``same tokenizer``: ``draft-lm-padded`` after ``specfmt pad-vocab`` (2048 rows, the verifier's);
* ``own BPE``: ``draft-lm-bpe`` (a byte-level BPE of its own, 1024 tokens): vLLM with ``use_heterogeneous_vocab``
  (token-level intersection), transformers with ``assistant_tokenizer`` (through text);
* ``permuted ids``: the same-tokenizer draft with its ids permuted consistently (``tests/pairs.py``): vLLM and
  transformers as users start them (no flag: they feed the draft the verifier's ids), then vLLM with
  ``use_heterogeneous_vocab``;
* ``padded``: ``draft-lm-padded`` as it is (2112 rows): what vLLM says.

Each row: acceptance per position, mean acceptance length (per drafted step), drafts, and whether the greedy
tokens equal the verifier alone (vLLM: its own verifier-alone run; transformers: the reference's greedy path).

Usage::

    nice -n 10 flock /tmp/specfmt-vllm.lock python benchmarks/pairs_bench.py [--json benchmarks/pairs_bench.results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORLD = ROOT / "examples" / "world"
sys.path.insert(0, str(ROOT / "tests"))


def rates(run) -> list[float]:
    d = run.num_drafts
    return [round(a / d, 4) if d else 0.0 for a in run.accepted_per_position]


def row(pair: str, engine: str, how: str, run, exact: bool | None, note: str = "") -> dict:
    out = {"pair": pair, "engine": engine, "how": how, "acceptance_rate_per_position": rates(run),
           "mean_acceptance_length": round(run.mean_acceptance_length, 4), "num_drafts": run.num_drafts, "exact": exact}
    if note:
        out["note"] = note
    print(f"{pair:16s} {engine:12s} {how:48s} AL {out['mean_acceptance_length']:.3f} {out['acceptance_rate_per_position']} exact={exact}", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "pairs_bench.results.json"))
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("-k", type=int, default=3)
    args = ap.parse_args()

    import torch
    import transformers

    from pairs import BPE, PADDED, VERIFIER, fixed, permuted
    from specfmt.errors import VLLMRunError
    from specfmt.methods import ReferenceContext, resolve
    from specfmt.methods.draft_lm import DraftChain, fixed_k
    from specfmt.sources.placement import Placement
    from specfmt.sources.verifier import Verifier
    from specfmt.validation import vllm_run
    from specfmt.validation.acceptance import run_chains
    from specfmt.validation.hf_assisted import assisted
    from specfmt.validation.prompts import load_prompts

    t0 = time.time()
    k, n = args.k, args.max_tokens
    ver = Verifier.load(str(VERIFIER))
    placement = Placement()
    prompts = load_prompts(str(WORLD / "prompts.jsonl"), ver.tokenizer()).ids
    model = ver.load_model(placement)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        same = fixed(Path(tmp))
        perm, _ = permuted(same, Path(tmp) / "draft-lm-permuted")
        methods = {"same tokenizer": resolve(str(same)), "own BPE": resolve(str(BPE)), "permuted ids": resolve(str(perm))}
        ctx = ReferenceContext(ver, model, placement)
        # the reference: each pair as vLLM serves it (the permuted one both ways)
        proposers = {name: m.proposer(m.readings(ctx)[0], ctx) for name, m in methods.items()}
        proposers["permuted ids, read as the verifier's"] = DraftChain(methods["permuted ids"].model(placement), None)
        bpe = methods["own BPE"]
        proposers["own BPE, through text"] = bpe.proposer(bpe.readings(ctx)[1], ctx)  # transformers' mapping, in the reference
        refs = dict(zip(proposers, run_chains(model, prompts, list(proposers.values()), k, n)))
        greedy = refs["same tokenizer"].token_ids
        for name, res in refs.items():
            pair = name.split(",")[0]
            how = ("verifier ids fed as they are (no mapping)" if "read as" in name else "through text (decode, re-encode), as transformers maps"
                   if "through text" in name else "token-level intersection" if methods[pair].pair(ver).heterogeneous else "one tokenizer")
            rows.append(row(pair, "reference", how, res, res.token_ids == greedy))
        # transformers
        for name, m in methods.items():
            if m.transformers_refusal(ver):
                draft = m.model(placement)
                fixed_k(draft.generation_config, k)
                kwargs, how = {"assistant_model": draft}, "assistant_model, equal sizes: the verifier's ids (as users run it)"
            else:
                kwargs = m.generate_kwargs(ver, placement, k)
                how = "assistant_tokenizer (through text)" if "assistant_tokenizer" in kwargs else "assistant_model"
            run = assisted(model, prompts, n, kwargs)
            rows.append(row(name, "transformers", how, run, run.token_ids == greedy))
        # vLLM, one engine host
        max_len = vllm_run.context_limit(prompts, n, k)
        with vllm_run.engines():
            alone = vllm_run.generate(str(VERIFIER), prompts, max_tokens=n, max_model_len=max_len)
            engines = [(name, m.vllm_engine(ver.name_or_path, None, k).speculative_config) for name, m in methods.items()]
            plain = dict(engines[-1][1])
            plain.pop("use_heterogeneous_vocab", None)
            engines.insert(2, ("permuted ids", plain))
            for name, spec in engines:
                run = vllm_run.generate(ver.name_or_path, prompts, max_tokens=n, max_model_len=max_len, speculative_config=spec)
                how = "use_heterogeneous_vocab" if spec.get("use_heterogeneous_vocab") else "draft_model (as users start it)" if name == "permuted ids" else "draft_model"
                rows.append(row(name, f"vLLM {run.vllm_version}", how, run, run.token_ids == alone.token_ids, note=f"dtype {run.dtype}"))
            try:
                vllm_run.generate(ver.name_or_path, prompts[:1], max_tokens=4, max_model_len=max_len,
                                  speculative_config={"method": "draft_model", "model": str(PADDED), "num_speculative_tokens": k})
                refusal = "served (unexpected)"
            except VLLMRunError as e:
                refusal = e.message.split(" | ")[0]
        print(f"padded: {refusal}")
    result = {"machine": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
              "transformers": transformers.__version__, "vllm": alone.vllm_version, "date": str(date.today()),
              "loadavg": list(os.getloadavg()), "prompts": len(prompts), "max_tokens": n, "k": k, "rows": rows,
              "padded_in_vllm": refusal, "seconds": round(time.time() - t0)}
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.json} in {result['seconds']} s")


if __name__ == "__main__":
    main()
