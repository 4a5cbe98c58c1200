#!/usr/bin/env python3
"""Build the MoE world (``examples/world-moe``, issue 38): a small Qwen3-MoE verifier and an EAGLE-3 draft trained for it
end to end with specfmt: ``datagen`` -> ``train eagle3`` -> ``validate --run`` with vLLM.

* ``verifier/``  ``Qwen3MoeForCausalLM``: the Qwen3 world's shapes (hidden 128, 8 layers, 4 heads of 32, 2 KV heads,
  vocabulary 2048, the example world's tokenizer) with every MLP a mixture of NUM_EXPERTS experts of MOE_INTER, TOP_K
  per token (``norm_topk_prob``). Trained on the example world's 45 training files, warm-started from the Qwen3 world's
  verifier (embedding, attention with its q/k norms, norms, ``lm_head``; the router and the experts new).
  **Size budget**: the world folder under 15 MB, as the Qwen3 world's (float32 verifier 10 MB, the draft about 1.6 MB).
* **datagen**: ``specfmt datagen`` with vLLM's CPU engine (it serves ``Qwen3MoeForCausalLM``: its fused-MoE layer has a
  CPU path, ``vllm/model_executor/layers/fused_moe/experts/cpu_moe.py``), over the training files cut into chunks of
  CHUNK_CHARS characters (one sample each), at the EAGLE-3 taps and the last layer; not shipped (regenerate with this script).
* ``eagle3-specfmt/``  ``specfmt train eagle3 --hidden-states`` (one layer, draft vocabulary 1024 from the data's
  ``token_freq.pt``, ``specfmt train``'s defaults otherwise), DRAFT_STEPS steps of 8 x 256 tokens.
* ``prompts.jsonl``, ``prompts-heldout.jsonl``: the example world's held-out prompts (``make_world.make_prompts``,
  ``tile_prompts``).
* ``world.json``: the figures (verifier losses, the draft's training, ``validate --run`` with vLLM); ``README.md`` from them.

Usage::

    python examples/make_world_moe.py [--out examples/world-moe] [--steps 600] [--draft-steps 600]   # vLLM runs under flock
    python examples/make_world_moe.py --draft-only      # keep the verifier; datagen, train and validate again
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import make_world as mw  # noqa: E402

QWEN3_VERIFIER = HERE / "world-qwen3" / "verifier" / "model.safetensors"
TOKENIZER = HERE / "world" / "verifier"
NUM_EXPERTS, TOP_K, MOE_INTER = 4, 2, 128
VERIFIER_STEPS, VERIFIER_LR = 600, 1e-3
DRAFT_STEPS, DRAFT_VOCAB, DRAFT_LR = 600, 1024, 2e-2
CHUNK_CHARS = 1000
SEQ_LEN = 256
DRAFT_DIR = "eagle3-specfmt"
MANIFEST = "world.json"
SIZE_BUDGET = 15e6


def verifier_config():
    """The MoE verifier: the Qwen3 world's shapes with a mixture of experts in every layer."""
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(
        vocab_size=mw.VOCAB, hidden_size=mw.HIDDEN, intermediate_size=mw.INTERMEDIATE, moe_intermediate_size=MOE_INTER,
        num_experts=NUM_EXPERTS, num_experts_per_tok=TOP_K, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
        num_hidden_layers=mw.N_LAYERS, num_attention_heads=mw.N_HEADS, num_key_value_heads=mw.N_KV_HEADS, head_dim=mw.HEAD_DIM,
        hidden_act="silu", max_position_embeddings=mw.MAX_POS, initializer_range=0.02, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": mw.ROPE_THETA}, tie_word_embeddings=False,
        bos_token_id=mw.BOS_ID, eos_token_id=mw.EOS_ID, pad_token_id=mw.PAD_ID, attention_bias=False, use_sliding_window=False,
        use_cache=True, dtype="float32", architectures=["Qwen3MoeForCausalLM"], output_router_logits=False,
    )


def make_verifier(out: Path, train: dict, heldout: dict, steps: int) -> dict:
    """Train and save the MoE verifier (``make_world.train_verifier``), tokenizer copied from the example world."""
    from safetensors.torch import load_file
    from tokenizers import Tokenizer

    (out / "verifier").mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(TOKENIZER / name, out / "verifier" / name)
    tok = Tokenizer.from_file(str(out / "verifier" / "tokenizer.json"))
    init = {n: t for n, t in load_file(str(QWEN3_VERIFIER)).items() if ".mlp." not in n}  # the dense MLPs have no place here
    stats = mw.train_verifier(mw.encode_docs(tok, train), mw.encode_docs(tok, heldout), steps, out / "verifier", cfg=verifier_config(),
                              init=init, lr=VERIFIER_LR)
    return {k: v for k, v in stats.items() if k != "embed"}


def chunks_file(train: dict, path: Path, limit: int | None = None) -> int:
    """The training text as jsonl samples of about CHUNK_CHARS characters (whole lines), the first ``limit`` only when given;
    how many."""
    n = 0
    with open(path, "w") as f:
        for name in sorted(train):
            text, part = train[name], ""
            for line in text.splitlines(keepends=True):
                part += line
                if len(part) >= CHUNK_CHARS and (limit is None or n < limit):
                    f.write(json.dumps({"text": part}) + "\n")
                    n, part = n + 1, ""
            if part.strip() and (limit is None or n < limit):
                f.write(json.dumps({"text": part}) + "\n")
                n += 1
    return n


#: every vLLM engine on this shared machine runs under this lock, one at a time (the project's rule)
VLLM_LOCK = "/tmp/specfmt-vllm.lock"


def specfmt(*args: str, engine: bool = False) -> float:
    """Run ``specfmt ARGS`` (this interpreter's; ``engine``: it starts vLLM, so under :data:`VLLM_LOCK`); its wall time."""
    t0 = time.time()
    lock = ["flock", VLLM_LOCK] if engine and shutil.which("flock") else []
    subprocess.run([*lock, sys.executable, "-m", "specfmt", *map(str, args)], check=True)
    return round(time.time() - t0, 1)


def make_draft(out: Path, train: dict, steps: int, samples: int | None = None, draft_vocab: int = DRAFT_VOCAB) -> dict:
    """datagen (vLLM) -> train eagle3 -> validate --run (vLLM): the draft in ``OUT/eagle3-specfmt`` and its figures."""
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        n = chunks_file(train, tmp / "train.jsonl", samples)
        hs = tmp / "hs"
        datagen_s = specfmt("datagen", "-o", hs, "--verifier", out / "verifier", "--data", tmp / "train.jsonl", "--engine", "vllm",
                            "--seq-len", SEQ_LEN, "--dtype", "float32", engine=True)
        manifest = json.loads((hs / "specfmt_datagen.json").read_text())
        manifest["verifier"] = "verifier"  # the world's, wherever it lies
        shutil.rmtree(out / DRAFT_DIR, ignore_errors=True)
        train_s = specfmt("train", "eagle3", "-o", out / DRAFT_DIR, "--verifier", out / "verifier", "--hidden-states", hs,
                          "--steps", steps, "--batch-size", 8, "--seq-len", SEQ_LEN, "--lr", DRAFT_LR, "--optimizer", "muon", "--draft-vocab", draft_vocab,
                          "--seed", mw.SEED, "--device", "cpu", "--no-validate")
        relocatable(out / DRAFT_DIR)
        served = tmp / "served"  # as a user serves it: converted against the world's verifier where it lies
        specfmt("convert", "--from", "auto", out / DRAFT_DIR, "-o", served, "--verifier", out / "verifier")
        validate_s = specfmt("validate", served, "--run", "--prompts", out / "prompts.jsonl", "--max-tokens", 32, engine=True)
        full = json.loads((served / "validation.json").read_text())
        rnd = random_reference(out, served)
    keep = ("num_drafts", "num_accepted_tokens", "acceptance_rate_per_position", "mean_acceptance_length", "engine", "dtype", "method",
            "draft_class", "form")
    v = {"passed": full.get("passed"), "checks": {c["name"]: c["status"] for c in full["checks"]},
         "reference": {k: x for k, x in (full.get("reference") or {}).items() if k in keep},
         "vllm": {k: x for k, x in (full.get("vllm") or {}).items() if k in keep}}
    return {"random_reference": rnd, "datagen": {"engine": "vllm", "samples": n, "seconds": datagen_s, "manifest": manifest},
            "train": {"steps": steps, "batch": 8, "seq_len": SEQ_LEN, "lr": DRAFT_LR, "draft_vocab": draft_vocab, "seconds": train_s},
            "validate_seconds": validate_s, "validation": v}


def relocatable(draft: Path) -> None:
    """The draft's verifier as ``../verifier`` (the world's, relative to the draft), as the Qwen3 world's drafts name it:
    the folder then works wherever the repository lies, read as speculators' layout (specfmt's own format takes an
    absolute path or a Hub id only), and ``specfmt convert --from auto DRAFT -o OUT --verifier V`` serves it."""
    path = draft / "config.json"
    cfg = json.loads(path.read_text())
    cfg["speculators_config"]["verifier"]["name_or_path"] = "../verifier"
    cfg["specfmt"]["source"]["name_or_path"] = "../verifier"
    cfg["specfmt"]["train"]["data"] = {Path(k).name: v for k, v in cfg["specfmt"]["train"]["data"].items()}  # a temporary folder's
    path.write_text(json.dumps(cfg, indent=2) + "\n")


def random_reference(out: Path, served: Path) -> dict:
    """The reference run of the draft with every tensor but ``d2t``/``t2d`` drawn by specfmt's initialisation (seed 0):
    what "clearly above a random draft" is measured against."""
    from safetensors.torch import load_file, save_file

    from specfmt.algorithms import get
    from specfmt.validation.run import validate_run

    with tempfile.TemporaryDirectory() as tmp:
        rnd = Path(tmp) / "random"
        shutil.copytree(served, rnd)
        (rnd / "validation.json").unlink(missing_ok=True)
        cfg = json.loads((rnd / "config.json").read_text())
        torch.manual_seed(0)
        init = get("eagle3").module(cfg).state_dict()
        for f in rnd.glob("*.safetensors"):
            t = load_file(str(f))
            save_file({n: (x if n in ("d2t", "t2d") else init[n]).contiguous() for n, x in t.items()}, str(f))
        run = validate_run(str(rnd), prompts=str(out / "prompts.jsonl"), max_tokens=32, num_speculative_tokens=3, use_vllm=False, write=False)
    return {k: run.reference[k] for k in ("mean_acceptance_length", "acceptance_rate_per_position")}


def write_readme(out: Path, m: dict) -> None:
    """The world's README (``README.md`` in ``out``) from ``world.json``."""
    v, d = m["verifier"], m["draft"]
    val, rnd = d["validation"], d["random_reference"]
    fmt = lambda xs: ", ".join(f"{x:.3f}" for x in xs)  # noqa: E731
    ref, vl = val["reference"], val["vllm"]
    text = f"""# The MoE world (issue 38)

Built by `python examples/make_world_moe.py` ({m['bytes'] / 1e6:.2f} MB; budget {SIZE_BUDGET / 1e6:.0f} MB). Everything else in the
examples is dense; this world proves that specfmt generates data from, trains against, validates against and serves with a
mixture-of-experts verifier.

| path | what |
| --- | --- |
| `verifier/` | `Qwen3MoeForCausalLM`: hidden 128, 8 layers, 4 heads of 32 (2 KV heads), every MLP {m['experts']} experts of {m['moe_intermediate_size']} with {m['top_k']} per token, vocabulary 2048 (the example world's tokenizer); warm-started from the Qwen3 world's verifier (embedding, attention, norms, `lm_head`), the router and experts new; {m['verifier_steps']} steps, lr {m['verifier_lr']:g}: training loss {v['train_loss']:.3f}, held-out {v['heldout_loss']:.3f} |
| `eagle3-specfmt/` | an EAGLE-3 draft: `specfmt datagen` with vLLM's CPU engine ({d['datagen']['samples']} samples of the training files, {d['datagen']['seconds']:.0f} s), then `specfmt train eagle3 --hidden-states` ({d['train']['steps']} steps of {d['train']['batch']} x {d['train']['seq_len']} tokens, Muon, lr {d['train']['lr']:g}, draft vocabulary {d['train']['draft_vocab']}, {d['train']['seconds']:.0f} s) |
| `prompts.jsonl`, `prompts-heldout.jsonl` | the example world's held-out prompts |
| `world.json` | the figures |

The draft names its verifier `../verifier`, as the Qwen3 world's drafts do, so the folder works wherever the repository lies;
`specfmt convert --from auto eagle3-specfmt -o OUT --verifier verifier` makes the copy that vLLM serves. `specfmt validate OUT --run`
(16 held-out prompts x 32 tokens, k = 3): reference (float32) mean acceptance length
**{ref['mean_acceptance_length']:.3f}** (per position {fmt(ref['acceptance_rate_per_position'])}); vLLM's CPU engine
({vl.get('draft_class')}, method {vl.get('method')}) **{vl['mean_acceptance_length']:.3f}** (per position
{fmt(vl['acceptance_rate_per_position'])}); checks: {', '.join(f'{k} {x}' for k, x in val['checks'].items())}. The same draft
with random weights (its `d2t`/`t2d` kept): {rnd['mean_acceptance_length']:.3f}.
"""
    (out / "README.md").write_text(text)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(HERE / "world-moe"))
    ap.add_argument("--steps", type=int, default=VERIFIER_STEPS, help="verifier training steps")
    ap.add_argument("--draft-steps", type=int, default=DRAFT_STEPS)
    ap.add_argument("--draft-only", action="store_true", help="keep the verifier and prompts in --out")
    ap.add_argument("--datagen-samples", type=int, default=None, help="hidden states of the first N samples only (a quick check)")
    ap.add_argument("--draft-vocab", type=int, default=DRAFT_VOCAB)
    args = ap.parse_args(argv)
    t0 = time.time()
    mw.seed_everything()
    torch.set_num_threads(1)
    out = Path(args.out)
    train, heldout = mw.build_corpus()
    if args.draft_only:
        manifest = json.loads((out / MANIFEST).read_text())
    else:
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        mw.write_prompts(out / "prompts.jsonl", mw.make_prompts(heldout))
        mw.write_prompts(out / mw.HELDOUT_PROMPTS, mw.tile_prompts(heldout))
        manifest = {"verifier_steps": args.steps, "verifier_lr": VERIFIER_LR, "experts": NUM_EXPERTS, "top_k": TOP_K,
                    "moe_intermediate_size": MOE_INTER, "verifier": make_verifier(out, train, heldout, args.steps)}
        (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    manifest["draft"] = make_draft(out, train, args.draft_steps, args.datagen_samples, args.draft_vocab)
    manifest["bytes"] = mw.dir_size(out)
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    write_readme(out, manifest)
    assert manifest["bytes"] < SIZE_BUDGET, f"the MoE world is {manifest['bytes'] / 1e6:.1f} MB, over its {SIZE_BUDGET / 1e6:.0f} MB budget"
    print(f"wrote {out} ({manifest['bytes'] / 1e6:.2f} MB) in {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
