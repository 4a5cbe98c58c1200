#!/usr/bin/env python3
"""Real scale: ``validate --run --no-vllm`` and ``train`` on random-weight Llama verifiers of growing size.

The benchmark writes each verifier itself (random weights, the example world's tokenizer and
vocabulary, V = 2048) with :func:`write_random_verifier`, at the sizes of :data:`SIZES`:

* ``shipped``: the example world's own verifier (8 layers, H = 128, 2.1 M parameters);
* ``250m``: H = 1024, 20 layers (about 0.24 B parameters);
* ``0.7b``: H = 2048, 16 layers, GQA 32/4 heads (0.71 B parameters; not in the default ``--sizes``:
  ``memory_bench.py`` measures where ``validate --run`` spends its memory on it);
* ``1b``: H = 2048, 22 layers, GQA 32/4 heads (about 0.98 B parameters, TinyLlama's shape with V = 2048).

For each size, in child processes of their own (so each peak RSS is that command's alone):

* ``validate``: ``specfmt validate DRAFT --run --no-vllm`` of a new EAGLE-3 draft for it
  (``specfmt train eagle3 --dry-run``), on the first ``--prompts`` shipped prompts x ``--max-tokens``;
  also the two costs the reference run is built from, timed in the same child on the same model:
  one greedy generation with the KV cache plus one forward pass over prompt + continuation
  (issue 19's target: the run costs at most 1.5x that);
* ``train``: ``specfmt train eagle3`` for ``--steps`` steps of ``--batch-size`` x ``--seq-len`` tokens
  of the example world's training files, no validation.

Reported: wall time, tokens/s (validate: generated tokens over the reference run's time; train:
trained tokens over the time between the first and last step callbacks), peak RSS (``ru_maxrss`` of
the child) against the bound ``1.2 x verifier bytes + 1 GiB`` (train: plus draft and AdamW state,
4 x draft bytes). Usage::

    python benchmarks/scale_bench.py [--sizes shipped,250m,1b] [--prompts 16] [--max-tokens 8] [--steps 4] [--json out.json]
    python benchmarks/scale_bench.py --device cuda --verifier-dtype bfloat16 --sizes 8b   # on a GPU
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

from train_bench import train_files  # the example world's training files (this folder is on sys.path)

REPO = Path(__file__).resolve().parents[1]
WORLD = REPO / "examples" / "world"
GiB = 2**30

#: name -> (hidden, layers, intermediate, heads, kv heads); None: the shipped verifier itself
SIZES: dict[str, tuple[int, int, int, int, int] | None] = {
    "shipped": None,
    "250m": (1024, 20, 2816, 16, 4),
    "0.7b": (2048, 16, 5632, 32, 4),
    "1b": (2048, 22, 5632, 32, 4),
    "8b": (4096, 32, 14336, 32, 8),  # Llama-3-8B's shape with V = 2048 (GPU only)
}


def write_random_verifier(folder: Path, hidden: int, layers: int, intermediate: int, heads: int, kv_heads: int, *,
                          seed: int = 0, dtype: str = "float32") -> Path:
    """A Llama verifier with random weights (N(0, 0.02), norms 1) and the example world's tokenizer.

    The tensors are drawn one at a time into a dict and written as one safetensors file, so
    building it costs one copy of the weights in memory.

    Args:
        folder: where to write (config.json, model.safetensors, tokenizer files).
        hidden / layers / intermediate / heads / kv_heads: the Llama shape (head_dim = hidden / heads).
        dtype: the stored dtype (``float32`` or ``bfloat16``).

    Returns:
        ``folder``.
    """
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(WORLD / "verifier" / f, folder / f)
    cfg = json.loads((WORLD / "verifier" / "config.json").read_text())
    hd = hidden // heads
    cfg.update(hidden_size=hidden, num_hidden_layers=layers, intermediate_size=intermediate, num_attention_heads=heads,
               num_key_value_heads=kv_heads, head_dim=hd, dtype=dtype)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    V = cfg["vocab_size"]
    g = torch.Generator().manual_seed(seed)
    dt = getattr(torch, dtype)

    def r(*shape):
        return (torch.randn(*shape, generator=g) * 0.02).to(dt)

    t = {"model.embed_tokens.weight": r(V, hidden), "lm_head.weight": r(V, hidden), "model.norm.weight": torch.ones(hidden, dtype=dt)}
    for i in range(layers):
        p = f"model.layers.{i}."
        t.update({p + "input_layernorm.weight": torch.ones(hidden, dtype=dt), p + "post_attention_layernorm.weight": torch.ones(hidden, dtype=dt),
                  p + "self_attn.q_proj.weight": r(heads * hd, hidden), p + "self_attn.k_proj.weight": r(kv_heads * hd, hidden),
                  p + "self_attn.v_proj.weight": r(kv_heads * hd, hidden), p + "self_attn.o_proj.weight": r(hidden, heads * hd),
                  p + "mlp.gate_proj.weight": r(intermediate, hidden), p + "mlp.up_proj.weight": r(intermediate, hidden),
                  p + "mlp.down_proj.weight": r(hidden, intermediate)})
    save_file(t, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def weight_bytes(folder: Path, dtype: str | None = None) -> int:
    """Bytes of the weights in ``folder`` (all safetensors files), counted in ``dtype`` when given
    (the run dtype; the bound is ``1.2 x`` this ``+ 1 GiB``)."""
    from safetensors import safe_open

    size = {"float32": 4, "bfloat16": 2, "float16": 2}
    total = 0
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            for n in st.keys():
                sl = st.get_slice(n)
                numel = 1
                for d in sl.get_shape():
                    numel *= d
                total += numel * (size[dtype] if dtype else {"F32": 4, "BF16": 2, "F16": 2}.get(sl.get_dtype(), 4))
    return total


def peak_rss(cmd: list[str], env: dict | None = None, timeout: float | None = None) -> tuple[subprocess.CompletedProcess, int, float]:
    """Run ``cmd`` in a fresh wrapper process whose only child it is; returns ``(process, peak RSS in bytes, wall seconds)``.

    The peak is ``getrusage(RUSAGE_CHILDREN).ru_maxrss`` read by the wrapper after the command
    exits: the largest resident set the command reached (Linux reports KiB).
    """
    wrapper = ("import resource, subprocess, sys, time, json; t = time.perf_counter(); "
               "p = subprocess.run(sys.argv[1:]); "
               "print('PEAK_RSS', json.dumps([p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024, time.perf_counter() - t]), file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", wrapper, *cmd], capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=timeout)
    line = [ln for ln in proc.stderr.splitlines() if ln.startswith("PEAK_RSS ")][-1]
    code, rss, wall = json.loads(line[len("PEAK_RSS "):])
    proc.returncode = code
    return proc, int(rss), float(wall)


def specfmt(*args: str) -> list[str]:
    return [sys.executable, "-m", "specfmt", *map(str, args)]


def reference_costs(verifier: str, prompts: str, n_prompts: int, max_tokens: int, k: int, device: str, dtype: str) -> dict:
    """In one child: one greedy generation (KV cache) of ``max_tokens + k`` tokens per prompt plus one forward
    pass over prompt + continuation -- the verifier work the reference run cannot avoid (issue 19's yardstick)."""
    import torch

    from specfmt.sources.placement import resolve_placement
    from specfmt.validation.acceptance import _greedy_tail, verifier_states
    from specfmt.validation.prompts import load_prompts
    from specfmt.sources.verifier import Verifier

    ver = Verifier.load(verifier)
    model = ver.load_model(resolve_placement(device, dtype))
    ids = load_prompts(prompts, ver.tokenizer()).ids[:n_prompts]
    t0 = time.perf_counter()
    paths = [_greedy_tail(model, p, max_tokens + k) for p in ids]
    t1 = time.perf_counter()
    for p, path in zip(ids, paths):
        verifier_states(model, p + path)
    t2 = time.perf_counter()
    return {"generate_seconds": round(t1 - t0, 2), "forward_seconds": round(t2 - t1, 2), "threads": torch.get_num_threads()}


def run_size(name: str, tmp: Path, args) -> dict:
    dims = SIZES[name]
    t0 = time.perf_counter()
    if dims is None:
        ver = WORLD / "verifier"
    else:
        ver = write_random_verifier(tmp / f"verifier-{name}", *dims)
    build_s = time.perf_counter() - t0
    vbytes = weight_bytes(ver, args.verifier_dtype or ("float32" if args.device == "cpu" else "bfloat16"))
    row: dict = {"size": name, "params": weight_bytes(ver, "float32") // 4, "verifier_bytes": vbytes, "build_seconds": round(build_s, 1)}
    dev = ["--device", args.device] + (["--verifier-dtype", args.verifier_dtype] if args.verifier_dtype else [])
    # a new EAGLE-3 draft for it (initialised, not trained): what validate --run runs
    draft = tmp / f"draft-{name}"
    proc = subprocess.run(specfmt("train", "eagle3", "--verifier", ver, "-o", draft, "--dry-run", "--no-validate", "--force"),
                          capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"{name}: the draft was not built:\n{proc.stderr[-2000:]}")
    dbytes = weight_bytes(draft)
    row["draft_bytes"] = dbytes
    prompts = tmp / "prompts.jsonl"
    prompts.write_text("".join((WORLD / "prompts.jsonl").read_text().splitlines(keepends=True)[:args.prompts]))
    proc, rss, wall = peak_rss(specfmt("validate", draft, "--run", "--no-vllm", "--prompts", prompts, "--max-tokens", args.max_tokens,
                                       "--json", *dev))
    if proc.returncode not in (0, 1):
        sys.exit(f"{name}: validate --run failed:\n{proc.stderr[-2000:]}")
    res = json.loads((draft / "validation.json").read_text())
    tokens = res["reference"]["num_drafts"] and res["prompts"]["count"] * res["max_tokens"]
    row["validate"] = {"wall_seconds": round(wall, 1), "peak_rss": rss, "bound": int(1.2 * vbytes + GiB), "tokens": tokens,
                       "tokens_per_second": round(tokens / wall, 2), "device": res["reference"]["device"], "dtype": res["reference"]["dtype"],
                       "reference_seconds": res["reference"].get("seconds")}
    costs = subprocess.run([sys.executable, __file__, "--costs", str(ver), str(prompts), str(args.prompts), str(args.max_tokens), "3",
                            args.device, args.verifier_dtype or ""], capture_output=True, text=True)
    if costs.returncode == 0:
        y = row["validate"]["yardstick"] = json.loads(costs.stdout.strip().splitlines()[-1])
        ref = row["validate"]["reference_seconds"] or {}
        if ref:  # issue 19's target: the reference run costs at most 1.5 x (one generation + one forward)
            row["validate"]["reference_over_yardstick"] = round((ref["verifier"] + ref["drafts"]) / (y["generate_seconds"] + y["forward_seconds"]), 2)
    # train: a few steps of a new EAGLE-3 draft
    out = tmp / f"trained-{name}"
    t_proc, t_rss, t_wall = peak_rss(specfmt("train", "eagle3", "--verifier", ver, "-o", out, "--force", "--no-validate", *[x for f in train_files() for x in ("--data", f)],
                                             "--steps", args.steps, "--batch-size", args.batch_size, "--seq-len", args.seq_len,
                                             "--save-every", 0, *dev))
    if t_proc.returncode:
        sys.exit(f"{name}: train failed:\n{t_proc.stderr[-2000:]}")
    prov = json.loads((out / "config.json").read_text())["specfmt"]["train"]  # the trainer's provenance
    tbytes = weight_bytes(out, "float32")
    row["train"] = {"wall_seconds": round(t_wall, 1), "peak_rss": t_rss, "bound": int(1.2 * vbytes + GiB + 4 * tbytes),
                    "tokens_per_second": prov.get("tokens_per_second"), "train_seconds": prov.get("seconds"), "tokens": prov.get("tokens"),
                    "summary": next((ln for ln in t_proc.stdout.splitlines() if ln.startswith("trained")), "")}
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="shipped,250m,1b")
    ap.add_argument("--prompts", type=int, default=16, help="shipped prompts (of 16) validate --run uses")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--verifier-dtype", default=None)
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--costs", nargs=7, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.costs:
        v, p, n, m, k, d, dt = args.costs
        print(json.dumps(reference_costs(v, p, int(n), int(m), int(k), d, dt or None)))
        return
    import torch

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.sizes.split(","):
            rows.append(run_size(name, Path(tmp), args))
            r = rows[-1]
            v, t = r["validate"], r["train"]
            print(f"{name}: {r['params'] / 1e6:,.0f} M params, {r['verifier_bytes'] / GiB:.2f} GiB | validate {v['wall_seconds']} s, "
                  f"peak {v['peak_rss'] / GiB:.2f} GiB (bound {v['bound'] / GiB:.2f}), reference {v.get('reference_seconds')} s, "
                  f"yardstick {v.get('yardstick')}, ratio {v.get('reference_over_yardstick')} | "
                  f"train {t['wall_seconds']} s, {t['tokens_per_second']} tok/s, peak {t['peak_rss'] / GiB:.2f} GiB (bound {t['bound'] / GiB:.2f})",
                  flush=True)
            shutil.rmtree(Path(tmp) / f"verifier-{name}", ignore_errors=True)
    meta = {"date": time.strftime("%Y-%m-%d", time.gmtime()), "python": platform.python_version(), "torch": torch.__version__,
            "cpus": os.cpu_count(), "machine": platform.machine(), "device": args.device, "loadavg": os.getloadavg(),
            "options": {k: v for k, v in vars(args).items() if k not in ("json", "costs")}}
    print()
    print("| verifier | params | bytes | validate wall (s) | reference: verifier + drafts (s) | yardstick: generate + forward (s) | ratio | "
          "validate peak RSS / bound (GiB) | train tokens/s | train wall (s) | train peak RSS / bound (GiB) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        v, t, y = r["validate"], r["train"], r["validate"].get("yardstick") or {}
        rs = v.get("reference_seconds") or {}
        print(f"| {r['size']} | {r['params'] / 1e6:,.1f} M | {r['verifier_bytes'] / GiB:.2f} GiB | {v['wall_seconds']} | "
              f"{rs.get('verifier')} + {rs.get('drafts')} | {y.get('generate_seconds')} + {y.get('forward_seconds')} | {v.get('reference_over_yardstick')} | "
              f"{v['peak_rss'] / GiB:.2f} / {v['bound'] / GiB:.2f} | "
              f"{t['tokens_per_second']} | {t['wall_seconds']} | {t['peak_rss'] / GiB:.2f} / {t['bound'] / GiB:.2f} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "results": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
