#!/usr/bin/env python3
"""Conversion speed and memory: ``specfmt convert`` against ``speculators convert`` (0.9.0), with
the plain copy of the same bytes as the floor.

Inputs are shape-faithful random checkpoints, built once into ``--workdir`` (seeded):

* ``eagle3-8b-bin``: an EAGLE-3 draft shaped like ``yuhuili/EAGLE3-LLaMA3.1-Instruct-8B``
  (SafeAILab ``pytorch_model.bin``, fp16, 850 MB; its 591-byte config), verifier
  Llama-3.1-8B-Instruct (config only);
* ``eagle3-8b-st``: the same tensors as ``model.safetensors``;
* ``eagle3-8b-sharded``: the same tensors in two safetensors shards with an index;
* ``eagle3-70b``: an EAGLE-3 draft with its own embedding and ``target_hidden_size``, shaped
  like the Llama-3.3-70B one (H = 6144, target H = 8192, V = 128256, Vd = 32000; ``.bin``, fp16);
* ``medusa-7b``: 5 Medusa v0.1 heads (one block each, a per-head lm_head) for a 7B verifier
  (H = 4096, V = 32000; ``medusa_lm_head.pt``, fp16).

Each case runs each tool ``--runs`` times, alternating, every run in its own process after the
input was read once (warm page cache for all). Wall time is the process's; peak RSS its
``ru_maxrss``. The floor is ``shutil.copyfile`` of the case's weight files (same disk, warm).
Medians are reported; speculators supports EAGLE-3 only (its failure on the sharded input is
reported as it is). ``specfmt --help`` and ``specfmt inspect`` start-up times are measured too.

Usage::

    python benchmarks/convert_bench.py [--runs 3] [--install-speculators | --speculators-venv DIR]
                                       [--cases eagle3-8b-bin,...] [--workdir DIR] [--json OUT]

``--install-speculators`` creates ``WORKDIR/speculators-venv`` (``--system-site-packages``, so
it uses this machine's torch and transformers) and installs ``speculators==0.9.0`` there without
its torchvision/torchaudio dependencies, which conversion does not import.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).with_name("convert_bench.results.json")
SPECULATORS = "speculators==0.9.0"
#: speculators 0.9.0's requirements that its convert command imports (torch/transformers come from the system)
SPECULATORS_DEPS = ["loguru>=0.7.2,<=0.7.3", "hs-connectors==0.9.0", "datasets>=4.0.0,<=5.1.0", "openai>=2.0.0", "aiohttp",
                    "psutil", "protobuf", "pydantic>=2.0.0", "pydantic-settings>=2.0.0", "click"]

LLAMA31_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
              "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
              "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False,
              "torch_dtype": "bfloat16", "hidden_act": "silu"}
LLAMA33_70B = {**LLAMA31_8B, "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64}
VICUNA_7B = {**LLAMA31_8B, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
             "num_key_value_heads": 32, "vocab_size": 32000, "max_position_embeddings": 2048, "rope_theta": 10000.0, "torch_dtype": "float16"}
#: docs/design/research-formats.md §4.2: the 591-byte config of yuhuili/EAGLE3-LLaMA3.1-Instruct-8B
EAGLE3_8B_CONFIG = {"architectures": ["LlamaForCausalLM"], "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu",
                    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 2048,
                    "model_type": "llama", "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 1,
                    "pad_token_id": 0, "rms_norm_eps": 1e-05, "tie_word_embeddings": False, "torch_dtype": "float16",
                    "transformers_version": "4.28.1", "use_cache": True, "vocab_size": 128256, "draft_vocab_size": 32000}
EAGLE3_70B_CONFIG = {**EAGLE3_8B_CONFIG, "hidden_size": 6144, "intermediate_size": 16384, "num_attention_heads": 48,
                     "target_hidden_size": 8192}

CASES = {
    "eagle3-8b-bin": {"from": "eagle3", "verifier": LLAMA31_8B, "speculators": True},
    "eagle3-8b-st": {"from": "eagle3", "verifier": LLAMA31_8B, "speculators": True},
    "eagle3-8b-sharded": {"from": "eagle3", "verifier": LLAMA31_8B, "speculators": True},
    "eagle3-70b": {"from": "eagle3", "verifier": LLAMA33_70B, "speculators": True},
    "medusa-7b": {"from": "medusa", "verifier": VICUNA_7B, "speculators": False},
}


# --------------------------------------------------------------------------- inputs


def eagle3_tensors(cfg: dict, target_h: int, embed: bool, seed: int) -> dict:
    import torch

    g = torch.Generator().manual_seed(seed)
    H, I, V, Vd = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["draft_vocab_size"]
    hd = H // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd

    def w(*shape):
        return (torch.randn(*shape, generator=g) * 0.02).half()

    sd = {"midlayer.self_attn.q_proj.weight": w(q, 2 * H), "midlayer.self_attn.k_proj.weight": w(kv, 2 * H),
          "midlayer.self_attn.v_proj.weight": w(kv, 2 * H), "midlayer.self_attn.o_proj.weight": w(H, q),
          "midlayer.mlp.gate_proj.weight": w(I, H), "midlayer.mlp.up_proj.weight": w(I, H), "midlayer.mlp.down_proj.weight": w(H, I),
          "midlayer.input_layernorm.weight": torch.ones(H).half(), "midlayer.hidden_norm.weight": torch.ones(H).half(),
          "midlayer.post_attention_layernorm.weight": torch.ones(H).half(), "fc.weight": w(H, 3 * target_h),
          "norm.weight": torch.ones(H).half(), "lm_head.weight": w(Vd, H)}
    if embed:
        sd["embed_tokens.weight"] = w(V, H)
    used = torch.sort(torch.randperm(V, generator=g)[:Vd]).values
    sd["d2t"] = used - torch.arange(Vd)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[used] = True
    sd["t2d"] = t2d
    return sd


def medusa_tensors(heads: int, H: int, V: int, seed: int) -> dict:
    import torch

    g = torch.Generator().manual_seed(seed)
    sd = {}
    for i in range(heads):
        sd[f"{i}.0.linear.weight"] = (torch.randn(H, H, generator=g) * 0.02).half()
        sd[f"{i}.0.linear.bias"] = torch.zeros(H).half()
        sd[f"{i}.1.weight"] = (torch.randn(V, H, generator=g) * 0.02).half()
    return sd


def build_case(name: str, root: Path) -> Path:
    """Write the case's source folder and verifier folder (once); returns the case folder."""
    import torch
    from safetensors.torch import save_file

    case = root / name
    if (case / "done").is_file():
        return case
    shutil.rmtree(case, ignore_errors=True)
    src, ver = case / "src", case / "verifier"
    src.mkdir(parents=True)
    ver.mkdir()
    (ver / "config.json").write_text(json.dumps(CASES[name]["verifier"], indent=2))
    if name.startswith("eagle3-8b"):
        (src / "config.json").write_text(json.dumps(EAGLE3_8B_CONFIG))
        sd = eagle3_tensors(EAGLE3_8B_CONFIG, 4096, False, seed=8)
        if name == "eagle3-8b-bin":
            torch.save(sd, src / "pytorch_model.bin")
        elif name == "eagle3-8b-st":
            save_file(sd, str(src / "model.safetensors"), metadata={"format": "pt"})
        else:
            names = list(sd)
            half = {n for n in names if n.startswith("midlayer.mlp")}
            parts = {"model-00001-of-00002.safetensors": {n: sd[n] for n in names if n not in half},
                     "model-00002-of-00002.safetensors": {n: sd[n] for n in names if n in half}}
            for fname, part in parts.items():
                save_file(part, str(src / fname), metadata={"format": "pt"})
            index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in sd.values())},
                     "weight_map": {n: f for f, part in parts.items() for n in part}}
            (src / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    elif name == "eagle3-70b":
        (src / "config.json").write_text(json.dumps(EAGLE3_70B_CONFIG))
        torch.save(eagle3_tensors(EAGLE3_70B_CONFIG, 8192, True, seed=70), src / "pytorch_model.bin")
    elif name == "medusa-7b":
        (src / "config.json").write_text(json.dumps({"medusa_num_heads": 5, "medusa_num_layers": 1, "base_model_name_or_path": "lmsys/vicuna-7b-v1.3"}))
        torch.save(medusa_tensors(5, 4096, 32000, seed=7), src / "medusa_lm_head.pt")
    (case / "done").write_text("ok")
    return case


def weight_files(src: Path) -> list[Path]:
    return sorted(p for p in src.iterdir() if p.suffix in (".bin", ".pt", ".safetensors"))


def largest_tensor(src: Path) -> int:
    sys.path.insert(0, str(REPO))
    from specfmt.checkpoint import CheckpointReader

    with CheckpointReader(src, pickle_names=["medusa_lm_head.pt"]) as r:
        return max(i.nbytes for i in r.infos.values())


# --------------------------------------------------------------------------- timing


def timed(cmd: list[str], env: dict | None = None) -> dict:
    """Run ``cmd`` to completion: wall seconds, peak RSS (MiB) of the process, exit status, stderr tail.
    Dirty pages of earlier runs are written out first (``os.sync``), so no run pays for another's writeback."""
    os.sync()
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    err = p.stderr.read()
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    return {"wall_s": wall, "rss_mib": usage.ru_maxrss / 1024, "rc": p.returncode, "err": err.decode(errors="replace")[-600:]}


def warm(paths: list[Path]) -> None:
    for p in paths:
        with open(p, "rb") as f:
            while f.read(64 << 20):
                pass


def copy_floor(files: list[Path], out: Path, runs: int) -> float:
    times = []
    for _ in range(runs):
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        os.sync()
        t0 = time.perf_counter()
        for f in files:
            shutil.copyfile(f, out / f.name)
        times.append(time.perf_counter() - t0)
    shutil.rmtree(out, ignore_errors=True)
    return statistics.median(times)


def install_speculators(venv: Path) -> Path:
    if not (venv / "bin" / "speculators").exists():
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
        subprocess.run(pip + ["--no-deps", SPECULATORS], check=True)
        subprocess.run(pip + SPECULATORS_DEPS, check=True)
    return venv / "bin" / "speculators"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "specfmt-convert-bench")
    ap.add_argument("--speculators-venv", type=Path, default=None, help="a virtual environment with speculators 0.9.0 installed")
    ap.add_argument("--install-speculators", action="store_true", help="create WORKDIR/speculators-venv with speculators 0.9.0")
    ap.add_argument("--json", type=Path, default=RESULTS)
    ap.add_argument("--build", help=argparse.SUPPRESS)  # internal: build one case's input and exit
    args = ap.parse_args()

    root = args.workdir
    if args.build:
        build_case(args.build, root)
        return
    root.mkdir(parents=True, exist_ok=True)
    spec_bin = None
    if args.install_speculators:
        spec_bin = install_speculators(root / "speculators-venv")
    elif args.speculators_venv:
        spec_bin = args.speculators_venv / "bin" / "speculators"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    specfmt = [sys.executable, "-m", "specfmt"]
    results = {"machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
               "runs": args.runs, "speculators": SPECULATORS if spec_bin else None, "cases": {}}

    start = {"help": [timed(specfmt + ["--help"], env)["wall_s"] for _ in range(5)]}
    interp = statistics.median(start["help"])
    for name in args.cases.split(","):
        print(f"[{name}] building input ...", file=sys.stderr)
        # in a child: a fork of a parent that held GBs of tensors would report them as its own peak RSS
        subprocess.run([sys.executable, __file__, "--build", name, "--workdir", str(root)], check=True)
        case = root / name
        src, ver = case / "src", case / "verifier"
        files = weight_files(src)
        nbytes = sum(f.stat().st_size for f in files)
        warm(files)
        if name == "eagle3-8b-bin":
            start["inspect"] = [timed(specfmt + ["inspect", str(src)], env)["wall_s"] for _ in range(5)]
        # the start of this very command line up to its first check (a source that does not exist):
        # interpreter, imports and argument parsing, which "interpreter start excluded" leaves out
        start[name] = [timed(specfmt + ["convert", "--from", CASES[name]["from"], str(src) + "-missing", "-o", str(root / "x"),
                                        "--verifier", str(ver)], env)["wall_s"] for _ in range(5)]
        floor = copy_floor(files, root / "copy-out", args.runs)
        runs: dict[str, list[dict]] = {"specfmt": [], "speculators": []}
        tools = ["specfmt"] + (["speculators"] if spec_bin and CASES[name]["speculators"] else [])
        for i in range(args.runs):
            for tool in tools if i % 2 == 0 else tools[::-1]:
                out = root / f"out-{tool}"
                shutil.rmtree(out, ignore_errors=True)
                if tool == "specfmt":
                    cmd = specfmt + ["convert", "--from", CASES[name]["from"], str(src), "-o", str(out), "--verifier", str(ver)]
                else:
                    cmd = [str(spec_bin), "convert", str(src), "--algorithm", "eagle3", "--verifier", str(ver), "--output-path", str(out)]
                r = timed(cmd, env)
                print(f"[{name}] {tool} run {i + 1}: {r['wall_s']:.2f} s, {r['rss_mib']:.0f} MiB, rc {r['rc']}", file=sys.stderr)
                runs[tool].append(r)
                shutil.rmtree(out, ignore_errors=True)
        big = largest_tensor(src)
        row = {"input_bytes": nbytes, "largest_tensor_bytes": big, "copy_s": floor}
        for tool, rs in runs.items():
            if not rs:
                continue
            ok = [r for r in rs if r["rc"] == 0]
            row[tool] = {"ok": len(ok) == len(rs), "wall_s": statistics.median(r["wall_s"] for r in rs),
                         "rss_mib": statistics.median(r["rss_mib"] for r in rs),
                         "error": None if ok else rs[-1]["err"].strip().splitlines()[-1] if rs[-1]["err"].strip() else f"exit {rs[-1]['rc']}"}
        results["cases"][name] = row
    results["start_s"] = {k: statistics.median(v) for k, v in start.items()}
    results["help_s"] = interp
    report(results)
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.json}", file=sys.stderr)


def report(res: dict) -> None:
    """Print the table and the targets of issue 7."""
    print(f"{'case':<18} {'MB':>6} {'copy s':>7} {'specfmt s':>9} {'-start':>8} {'x copy':>6} {'RSS MiB':>8} {'limit':>6} "
          f"{'spec. s':>8} {'spec. MiB':>9}  speedup  RSS ratio")
    ok_all = True
    for name, row in res["cases"].items():
        s, p = row["specfmt"], row.get("speculators")
        net = s["wall_s"] - res["start_s"][name]
        limit = (row["largest_tensor_bytes"] + 400e6) / 2**20
        line = (f"{name:<18} {row['input_bytes'] / 1e6:>6.0f} {row['copy_s']:>7.2f} {s['wall_s']:>9.2f} {net:>8.2f} {net / row['copy_s']:>6.2f} "
                f"{s['rss_mib']:>8.0f} {limit:>6.0f}")
        if p and p["ok"]:
            line += f" {p['wall_s']:>8.2f} {p['rss_mib']:>9.0f}  {p['wall_s'] / s['wall_s']:>6.1f}x  {p['rss_mib'] / s['rss_mib']:>6.1f}x"
        elif p:
            line += f"  speculators failed: {p['error'][:60]}"
        print(line)
        ok = s["ok"] and net <= 3 * row["copy_s"] and s["rss_mib"] <= limit
        if name == "eagle3-8b-bin" and p and p["ok"]:
            ok = ok and s["wall_s"] * 5 <= p["wall_s"] and s["rss_mib"] * 4 <= p["rss_mib"]
        ok_all &= ok
    st = res["start_s"]
    print(f"start-up: specfmt --help {st['help']:.2f} s, specfmt inspect {st.get('inspect', float('nan')):.2f} s (target < 0.5 s); "
          "(-start) subtracts the same convert command's start-up, measured on a missing source")
    ok_all &= st["help"] < 0.5 and st.get("inspect", 0) < 0.5
    print("targets: " + ("all met" if ok_all else "NOT all met"))


if __name__ == "__main__":
    main()
