#!/usr/bin/env python3
"""Build the specfmt "example world": a tiny verifier LM plus EAGLE-3, EAGLE-1 and Medusa drafts.

Everything is generated from text that exists on every machine (the Python
standard library's own source files), with fixed seeds, on CPU, in a few
minutes.  The output folder (default ``examples/world``) holds:

* ``verifier/``         a small Llama-architecture causal LM (float32
                        safetensors) with its own byte-level BPE tokenizer,
                        loadable with ``AutoModelForCausalLM`` /
                        ``AutoTokenizer`` and by vLLM (standard Llama layout).
* ``eagle3-safeailab/`` an EAGLE-3 draft for that verifier in the SafeAILab/EAGLE
                        research layout (``pytorch_model.bin`` + plain ``config.json``);
                        its ``d2t``/``t2d`` come from the training corpus as
                        ``eagle/traineagle3/cnets.py::scandata`` builds them.
* ``eagle-safeailab/``  an EAGLE-1 draft in the SafeAILab layout (LLaMA3 repositories).
* ``medusa-legacy/``    three Medusa heads in the Medusa legacy-trainer layout.

                        All three are trained against the frozen verifier with
                        specfmt's trainer (``specfmt.training.pipeline.train_draft``, what
                        ``specfmt train`` runs).
* ``prompts.jsonl``     prompts cut from held-out stdlib files (never trained on).
* ``prompts-heldout.jsonl`` the held-out files tiled into disjoint prompts: the larger set
                        benchmarks compare drafts on (``--heldout-prompts-only`` writes it alone).
* ``README.md``         what is here, sizes, the measured losses.

Usage::

    python examples/make_world.py [--out examples/world] [--steps 700] [--draft-steps 1500]
    python examples/make_world.py --drafts-only     # keep the verifier, retrain the drafts

The result is deterministic for a given Python version (the stdlib sources,
and hence the corpus, differ slightly between CPython releases) and the same
torch / tokenizers versions.
"""
from __future__ import annotations

import argparse
import collections
import json
import math
import random
import shutil
import sys
import sysconfig
import time
from pathlib import Path

import torch
import torch.nn.functional as F

SEED = 1234

# --- corpus -----------------------------------------------------------------

# Pure-Python stdlib modules present on CPython 3.10 - 3.13 (sorted).  Missing
# files are skipped so the script still runs on other versions.
TRAIN_FILES = sorted([
    "argparse.py", "ast.py", "base64.py", "bisect.py", "calendar.py", "cmd.py",
    "collections/__init__.py", "configparser.py", "contextlib.py", "copy.py",
    "csv.py", "dataclasses.py", "difflib.py", "email/message.py", "enum.py",
    "fractions.py", "functools.py", "getopt.py", "glob.py", "gzip.py",
    "heapq.py", "html/parser.py", "http/client.py", "ipaddress.py",
    "json/__init__.py", "json/decoder.py", "json/encoder.py",
    "logging/__init__.py", "numbers.py", "operator.py", "pprint.py",
    "queue.py", "random.py", "sched.py", "shutil.py", "statistics.py",
    "string.py", "tempfile.py", "threading.py", "tokenize.py", "traceback.py",
    "typing.py", "urllib/parse.py", "warnings.py", "weakref.py",
])
HELDOUT_FILES = sorted(["fnmatch.py", "shlex.py", "textwrap.py"])

# --- tokenizer / model shapes -------------------------------------------------

SPECIAL_TOKENS = ["<|bos|>", "<|eos|>", "<|pad|>"]  # ids 0, 1, 2
BOS_ID, EOS_ID, PAD_ID = 0, 1, 2
VOCAB = 2048
HIDDEN = 128
INTERMEDIATE = 384
N_LAYERS = 8
N_HEADS = 4
N_KV_HEADS = 2
HEAD_DIM = 32          # vLLM's CPU attention rejects head_dim < 32
MAX_POS = 2048
ROPE_THETA = 10000.0
RMS_EPS = 1e-5
DRAFT_VOCAB = 1024
DRAFT_STEPS = 1500     # EAGLE-3
EAGLE1_STEPS = 1000
MEDUSA_STEPS = 600
MEDUSA_HEADS = 3
EAGLE1_NOISE = 0.1     # EAGLE-1 feature noise (uniform half-width), the paper's augmentation
#: algorithm -> (folder, ``specfmt convert --from``)
DRAFT_DIRS = {"eagle3": ("eagle3-safeailab", "eagle3"), "eagle": ("eagle-safeailab", "eagle"), "medusa": ("medusa-legacy", "medusa")}
MANIFEST = "world.json"  # the generator's own figures, so --drafts-only can rewrite the README
DRAFT_SEQ = 256
DRAFT_BATCH = 8
DRAFT_LR = 3e-3

SEQ_LEN = 128
BATCH = 16
LR = 3e-3
DEFAULT_STEPS = 700
N_PROMPTS = 16
EVAL_CHUNKS = 256      # eval windows of SEQ_LEN tokens (the held-out set has fewer)


def seed_everything(seed: int = SEED) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True, warn_only=True)


def read_text(path: Path) -> str:
    # Normalise line endings so the corpus does not depend on the platform.
    return path.read_text(encoding="utf-8").replace("\r\n", "\n")


def build_corpus(stdlib: Path | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """Return ({name: text} for training files, {name: text} for held-out files)."""
    stdlib = Path(stdlib or sysconfig.get_paths()["stdlib"])
    train, heldout = {}, {}
    for names, dest in ((TRAIN_FILES, train), (HELDOUT_FILES, heldout)):
        for name in names:
            p = stdlib / name
            if p.is_file():
                dest[name] = read_text(p)
            else:
                print(f"  (skipping missing stdlib file {name})")
    if not train or not heldout:
        sys.exit(f"no usable stdlib sources under {stdlib}")
    print(f"corpus: {len(train)} training files ({sum(map(len, train.values())):,} chars), "
          f"{len(heldout)} held-out files ({sum(map(len, heldout.values())):,} chars)")
    return train, heldout


def make_prompts(heldout: dict[str, str], n: int = N_PROMPTS, seed: int = SEED) -> list[dict]:
    """Cut n snippets (100-300 chars, whole lines) from the held-out sources."""
    rng = random.Random(seed)
    names = sorted(heldout)
    per_file = [n // len(names) + (1 if i < n % len(names) else 0) for i in range(len(names))]
    prompts = []
    for name, k in zip(names, per_file):
        lines = heldout[name].splitlines(keepends=True)
        starts = [i for i, ln in enumerate(lines) if ln.strip()]
        rng.shuffle(starts)
        got, seen = 0, set()
        for s in starts:
            text = ""
            for ln in lines[s:]:
                if len(text) + len(ln) > 300:
                    break
                text += ln
                if len(text) >= 100:
                    break
            if 100 <= len(text) <= 300 and text not in seen:
                seen.add(text)
                prompts.append({"prompt": text})
                got += 1
                if got == k:
                    break
        assert got == k, f"only {got} prompts from {name}"
    return prompts


#: the larger held-out prompt set (``tile_prompts``): benchmarks that compare drafts measure on it (issue 38)
HELDOUT_PROMPTS = "prompts-heldout.jsonl"


def tile_prompts(heldout: dict[str, str], lo: int = 30, hi: int = 300) -> list[dict]:
    """The held-out sources tiled into disjoint prompts, in file order: from the first non-blank line, whole lines up to
    ``lo``..``hi`` characters (as :func:`make_prompts` cuts them, shorter); the next prompt starts on the line after. A line
    that cannot start such a prompt (a block longer than ``hi``) is skipped. Every prompt is other text, so the per-prompt
    acceptance figures are as independent as the sources allow (the benchmarks' paired bootstrap resamples them).

    Sized by the paired difference of two drafts' AL over the prompts (issue 38, docs/commands/validate.md): for two EAGLE-3
    drafts of the trainer benchmark (Muon, 150 steps, lr 1e-2 and 3e-2) its per-prompt standard deviation was 0.61 on the
    first tiling (312 prompts of at least 100 characters, 32 tokens each: a 95 % half-width of 0.068), so a half-width under
    0.05 needs (1.96 x 0.61 / 0.05)^2 = 574 prompts. 64 tokens per prompt did not narrow it (0.078: the two drafts part
    further down a longer continuation). Prompts of at least 30 characters tile the three files (Python 3.11) into 719."""
    prompts = []
    for name in sorted(heldout):
        lines = heldout[name].splitlines(keepends=True)
        i = 0
        while i < len(lines):
            text, j = "", i
            while lines[i].strip() and j < len(lines) and len(text) + len(lines[j]) <= hi:
                text += lines[j]
                j += 1
                if len(text) >= lo:
                    break
            if lo <= len(text) <= hi:
                prompts.append({"prompt": text})
                i = j
            else:
                i += 1
    return prompts


def write_prompts(path: Path, prompts: list[dict]) -> None:
    with open(path, "w") as f:
        for p in prompts:
            f.write(json.dumps(p) + "\n")


def train_tokenizer(train: dict[str, str], out_dir: Path):
    """Train a byte-level BPE (vocab 2048) and save it as a PreTrainedTokenizerFast."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([train[k] for k in sorted(train)], trainer=trainer)
    assert tok.get_vocab_size() == VOCAB, tok.get_vocab_size()
    for i, t in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(t) == i, (t, tok.token_to_id(t))
    # Llama-style: prepend <|bos|> when add_special_tokens=True.
    tok.post_processor = processors.TemplateProcessing(
        single="<|bos|> $A", pair="<|bos|> $A <|bos|> $B",
        special_tokens=[("<|bos|>", BOS_ID)],
    )
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|bos|>", eos_token="<|eos|>", pad_token="<|pad|>",
        model_max_length=MAX_POS,
        clean_up_tokenization_spaces=False,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    hf_tok.save_pretrained(out_dir)
    # transformers 5 records its internal class name ("TokenizersBackend"), which
    # transformers 4.x (e.g. inside vLLM) cannot resolve; name the public class
    # instead. Both major versions load it via AutoTokenizer.
    cfg_path = out_dir / "tokenizer_config.json"
    tok_cfg = json.loads(cfg_path.read_text())
    tok_cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg_path.write_text(json.dumps(tok_cfg, indent=2, sort_keys=True) + "\n")
    return tok


def encode_docs(tok, docs: dict[str, str]) -> list[list[int]]:
    """Each document -> [bos] + ids + [eos], in sorted-name order."""
    out = []
    for name in sorted(docs):
        ids = tok.encode(docs[name], add_special_tokens=False).ids
        out.append([BOS_ID] + ids + [EOS_ID])
    return out


def verifier_config():
    from transformers import LlamaConfig

    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=N_LAYERS,
        num_attention_heads=N_HEADS,
        num_key_value_heads=N_KV_HEADS,
        head_dim=HEAD_DIM,
        hidden_act="silu",
        max_position_embeddings=MAX_POS,
        initializer_range=0.02,
        rms_norm_eps=RMS_EPS,
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
        tie_word_embeddings=False,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        attention_bias=False,
        mlp_bias=False,
        use_cache=True,
        dtype="float32",
        architectures=["LlamaForCausalLM"],
    )
    return cfg


@torch.no_grad()
def eval_loss(model, stream: torch.Tensor, max_chunks: int = 256) -> float:
    """Mean next-token loss over the first max_chunks non-overlapping 128-token windows."""
    model.eval()
    n = min((stream.numel() - 1) // SEQ_LEN, max_chunks)
    total, count = 0.0, 0
    for b in range(0, n, BATCH):
        idx = torch.arange(b, min(b + BATCH, n)) * SEQ_LEN
        chunk = torch.stack([stream[i:i + SEQ_LEN + 1] for i in idx.tolist()])
        logits = model(input_ids=chunk[:, :-1]).logits
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), chunk[:, 1:].reshape(-1), reduction="sum")
        total += loss.item()
        count += chunk[:, 1:].numel()
    model.train()
    return total / count


def train_verifier(train_docs: list[list[int]], heldout_docs: list[list[int]], steps: int,
                   out_dir: Path, cfg=None, init: dict | None = None, lr: float = LR) -> dict:
    """Train the tiny verifier on the token stream and save it: the Llama of :func:`verifier_config`,
    or ``cfg``'s architecture (``examples/make_world_qwen3.py`` passes a ``Qwen3Config``), starting
    from ``init`` (a state dict; tensors it lacks keep their initialisation) when given."""
    from transformers import AutoModelForCausalLM

    from specfmt.training.loop import warmup_cosine

    torch.manual_seed(SEED)
    cfg = cfg if cfg is not None else verifier_config()
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).float()
    # Unit-variance token embeddings (instead of the HF default std 0.02) let the
    # token signal dominate the residual stream of this narrow 8-layer model
    # from step 0; measured: ~1 nat lower loss after 150 steps, ~0.3 after 600.
    with torch.no_grad():
        model.get_input_embeddings().weight.normal_(0.0, 1.0)
    if init is not None:
        missing, unexpected = model.load_state_dict(init, strict=False)
        assert not unexpected, unexpected
        print(f"verifier: started from the given weights; initialised as new: {len(missing)} tensors")
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"verifier: {n_params:,} parameters")

    stream = torch.tensor([t for d in train_docs for t in d], dtype=torch.long)
    ho_stream = torch.tensor([t for d in heldout_docs for t in d], dtype=torch.long)
    print(f"tokens: train {stream.numel():,}, held-out {ho_stream.numel():,}")

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr, betas=(0.9, 0.95), eps=1e-8,
    )
    warmup = max(1, steps // 20)

    def lr_at(step: int) -> float:  # linear warmup, cosine decay to 10%
        return warmup_cosine(step, steps, warmup, lr)

    gen = torch.Generator().manual_seed(SEED)
    hi = stream.numel() - (SEQ_LEN + 1)
    t0 = time.time()
    running, last_avg = [], float("nan")
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        starts = torch.randint(0, hi, (BATCH,), generator=gen)
        chunk = torch.stack([stream[s:s + SEQ_LEN + 1] for s in starts.tolist()])
        logits = model(input_ids=chunk[:, :-1]).logits
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), chunk[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        running.append(loss.item())
        if (step + 1) % 50 == 0 or step == 0:
            avg = last_avg = sum(running) / len(running)
            running = []
            print(f"  step {step + 1:4d}/{steps}  loss {avg:.4f}  lr {lr_at(step):.2e}  "
                  f"({time.time() - t0:.0f}s)", flush=True)
    train_time = time.time() - t0

    train_loss = eval_loss(model, stream, EVAL_CHUNKS)
    heldout_loss = eval_loss(model, ho_stream, EVAL_CHUNKS)
    print(f"final: train loss {train_loss:.4f} (eval, first {EVAL_CHUNKS * SEQ_LEN:,} training tokens; "
          f"last-50-step running avg {last_avg:.4f}), held-out loss {heldout_loss:.4f} "
          f"(uniform = ln {VOCAB} = {math.log(VOCAB):.4f}); training took {train_time:.0f}s")

    model.generation_config.bos_token_id = BOS_ID
    model.generation_config.eos_token_id = EOS_ID
    model.generation_config.pad_token_id = PAD_ID
    model.save_pretrained(out_dir, safe_serialization=True)
    for p in out_dir.iterdir():  # safetensors writes 0600; make the world readable
        p.chmod(0o644)
    return {"train_loss": train_loss, "heldout_loss": heldout_loss, "last_avg": last_avg, "train_seconds": train_time,
            "params": n_params, "train_tokens": stream.numel(), "heldout_tokens": ho_stream.numel(),
            "embed": model.get_input_embeddings().weight.detach().clone()}


def train_draft(algorithm: str, out: Path, verifier_dir: Path, data: list[Path], steps: int, **kw) -> tuple[dict, dict]:
    """Train a new draft with ``specfmt.training.pipeline.train_draft`` (the ``specfmt train`` pipeline) into a specfmt folder."""
    from specfmt.training.loop import TrainOptions
    from specfmt.training.pipeline import TrainRequest, train_draft as run

    opts = TrainOptions(steps=steps, batch_size=DRAFT_BATCH, seq_len=DRAFT_SEQ, lr=DRAFT_LR, seed=SEED + 3, save_every=0)
    # kw: the algorithm's own options (EAGLE-3 draft_vocab, EAGLE-1 noise, ...; ttt_steps keeps its default 3)
    req = TrainRequest(out=str(out), verifier=str(verifier_dir), algorithm=algorithm, data=[str(d) for d in data],
                       device="cpu", validate=False, force=True, options=kw)

    def log(step: int, loss: float, acc: list[float]) -> None:
        if (step + 1) % 100 == 0 or step == 0:
            print(f"  {algorithm} step {step + 1:4d}/{steps}  loss {loss:.3f}  top-1 agreement per position "
                  f"{' '.join(f'{a:.2f}' for a in acc)}", flush=True)

    res = run(req, opts, log=log, status=lambda m: print(f"  {m}"))
    s = res.stats
    print(f"{algorithm}: {s.steps} steps, {s.tokens:,} tokens in {s.seconds:.0f}s; top-1 agreement {[round(a, 3) for a in s.accuracy]}")
    for name, how in res.filled.items():
        if name in ("d2t",):
            print(f"  {name}: {how}")
    stats = {"steps": s.steps, "tokens": s.tokens, "seconds": round(s.seconds), "accuracy": [round(a, 3) for a in s.accuracy]}
    if "d2t" in res.filled:  # EAGLE-3: how the draft vocabulary was chosen, with its coverage
        stats["vocab"] = res.filled["d2t"]
    if s.kept is not None:  # a held-out split: the weights written are those of its best evaluation
        stats["kept"] = s.kept.to_json()
    return stats, {n: t for n, t in res.draft.tensors.items()}


def llama_dump(layers: int, **extra) -> dict:
    """A plain LlamaConfig-style config.json of a draft decoder (what the EAGLE repositories ship)."""
    return {
        "architectures": ["LlamaForCausalLM"], "bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "hidden_act": "silu",
        "hidden_size": HIDDEN, "initializer_range": 0.02, "intermediate_size": INTERMEDIATE, "max_position_embeddings": MAX_POS,
        "model_type": "llama", "num_attention_heads": N_HEADS, "num_key_value_heads": N_KV_HEADS, "num_hidden_layers": layers,
        "pad_token_id": PAD_ID, "rms_norm_eps": RMS_EPS, "tie_word_embeddings": False, "torch_dtype": "float16",
        "transformers_version": "4.28.1", "use_cache": True, "vocab_size": VOCAB, **extra,
    }


def write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n")


def save_eagle3(t: dict, out_dir: Path) -> None:
    """The SafeAILab EAGLE-3 layout (``save_16bit_model(..., exclude_frozen_parameters=True)``)."""
    order = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
             "mlp.up_proj", "mlp.down_proj", "hidden_norm", "input_layernorm", "post_attention_layernorm"]
    sd = collections.OrderedDict()
    for m in order:
        sd[f"midlayer.{m}.weight"] = t[f"layers.0.{m}.weight"].to(torch.float16).clone()
    for n in ("norm.weight", "fc.weight", "lm_head.weight"):
        sd[n] = t[n].to(torch.float16).clone()
    sd["d2t"] = t["d2t"].to(torch.int64).clone()
    sd["t2d"] = t["t2d"].to(torch.bool).clone()
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.save(dict(sd), out_dir / "pytorch_model.bin")
    write_json(out_dir / "config.json", llama_dump(1, draft_vocab_size=DRAFT_VOCAB))


def save_eagle1(t: dict, out_dir: Path) -> None:
    """The SafeAILab EAGLE-1 layout of the LLaMA3 repositories: ``pytorch_model.bin`` with ``fc.weight``
    (no bias, config ``bias: false``), ``layers.0.*`` without ``input_layernorm``, and the
    copy of the verifier's ``embed_tokens.weight``."""
    sd = collections.OrderedDict((n, v.to(torch.float16).clone()) for n, v in sorted(t.items()))
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.save(dict(sd), out_dir / "pytorch_model.bin")
    write_json(out_dir / "config.json", llama_dump(1, bias=False, rope_theta=ROPE_THETA))


def save_medusa(t: dict, out_dir: Path, heads: int, layers: int) -> None:
    """The Medusa legacy-trainer layout (``train_legacy.py``): ``medusa_lm_head.safetensors`` with
    ``{i}.{j}.linear.{weight,bias}`` (ResBlocks) and ``{i}.{L}.weight`` (the head's own lm_head)."""
    from safetensors.torch import save_file

    sd = {}
    for i in range(heads):
        for j in range(layers):
            sd[f"{i}.{j}.linear.weight"] = t[f"blocks.{i}.layers.{j}.weight"]
            sd[f"{i}.{j}.linear.bias"] = t[f"blocks.{i}.layers.{j}.bias"]
        sd[f"{i}.{layers}.weight"] = t[f"lm_heads.{i}.weight"]
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file({n: v.to(torch.float16).contiguous() for n, v in sd.items()}, str(out_dir / "medusa_lm_head.safetensors"), metadata={"format": "pt"})
    write_json(out_dir / "config.json", {"base_model_name_or_path": "../verifier", "medusa_num_heads": heads,
                                         "medusa_num_layers": layers, "transformers_version": "4.31.0"})


def heldout_acceptance(out: Path, name: str, fmt: str) -> dict:
    """Convert a research-layout draft with ``specfmt convert`` and measure it on the held-out prompts
    (``validate_run``: reference run in float32, k = 3, 32 tokens per prompt, no vLLM)."""
    import tempfile

    from specfmt.convert import convert
    from specfmt.validation.run import validate_run

    with tempfile.TemporaryDirectory() as tmp:
        res = convert(fmt, str(out / name), Path(tmp) / "draft", str(out / "verifier"))
        run = validate_run(res.out, prompts=str(out / "prompts.jsonl"), max_tokens=32, num_speculative_tokens=3, use_vllm=False, write=False)
    assert run.report.ok, [c for c in run.report.checks if c.status == "fail"]
    ref = run.reference
    print(f"held-out reference run of {name}: mean acceptance length {ref['mean_acceptance_length']:.3f}, "
          f"per position {ref['acceptance_rate_per_position']}")
    keys = ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "accepted_per_position", "acceptance_rate_per_position", "mean_acceptance_length")
    return {"k": 3, "prompts": len(run.prompts.ids), "tokens": run.max_tokens * len(run.prompts.ids), **{k: ref[k] for k in keys}}


def make_drafts(out: Path, train_paths: list[Path], steps: dict[str, int], only: list[str] | None = None,
                kept: dict | None = None) -> dict:
    """Train the drafts (``only``: these algorithms; the others' files and ``kept`` figures stay) with the specfmt
    trainer and save them in their research layouts."""
    import tempfile

    only = list(DRAFT_DIRS) if only is None else only
    figures = {a: f for a, f in (kept or {}).items() if a not in only}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if "eagle3" in only:
            # without EAGLE-3.1's norms (a new draft's default): SafeAILab's layout has no place for them
            stats, t = train_draft("eagle3", tmp / "eagle3", out / "verifier", train_paths, steps["eagle3"], draft_vocab=DRAFT_VOCAB,
                                   norm_before_fc=False, norm_output=False)
            save_eagle3(t, out / "eagle3-safeailab")
            figures["eagle3"] = stats
        if "eagle" in only:
            stats, t = train_draft("eagle", tmp / "eagle", out / "verifier", train_paths, steps["eagle"], noise=EAGLE1_NOISE)
            save_eagle1(t, out / "eagle-safeailab")
            figures["eagle"] = stats
        if "medusa" in only:
            stats, t = train_draft("medusa", tmp / "medusa", out / "verifier", train_paths, steps["medusa"], heads=MEDUSA_HEADS)
            save_medusa(t, out / "medusa-legacy", MEDUSA_HEADS, 1)
            figures["medusa"] = stats
    for algo in only:
        name, fmt = DRAFT_DIRS[algo]
        figures[algo]["heldout"] = heldout_acceptance(out, name, fmt)
    return {a: figures[a] for a in DRAFT_DIRS}


def dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def write_readme(out: Path, stats: dict, train: dict, heldout: dict, prompts: list, steps: int, drafts: dict) -> None:
    names = ["verifier"] + [d for d, _ in DRAFT_DIRS.values()]
    sizes = {name: dir_size(out / name) for name in names}
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    files = [f for f in files if f != "README.md"] + ["README.md"]
    per_file_counts = " / ".join(str(N_PROMPTS // len(heldout) + (1 if i < N_PROMPTS % len(heldout) else 0))
                                 for i in range(len(heldout)))
    mb = lambda n: f"{n / 1e6:.2f} MB" if n >= 100_000 else f"{n / 1e3:.1f} kB"  # noqa: E731
    py = f"{sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro}"
    e3, e1, md = drafts["eagle3"], drafts["eagle"], drafts["medusa"]

    def kept(d: dict) -> str:
        if "kept" not in d:
            return ""
        k = d["kept"]
        return (f" (all positions); the weights written are step {k['step']}'s, the best by estimated acceptance length "
                f"({k['estimated_acceptance_length']:.3f}) on the training files held out (`--heldout`, 5 %; top-1 agreement "
                f"there {', '.join(f'{a:.3f}' for a in k['top1_agreement'])})")

    def figures(d: dict) -> str:
        h = d["heldout"]
        return (f"{d['steps']} steps of {DRAFT_BATCH} x {DRAFT_SEQ} training tokens, AdamW lr {DRAFT_LR:g}, {d['seconds']} s on "
                f"2 CPU threads; top-1 agreement with the verifier over the last 50 steps, per position: "
                f"{', '.join(f'{a:.3f}' for a in d['accuracy'])}{kept(d)}. On the held-out prompts (converted with "
                f"`specfmt convert`, reference run in float32, k = 3, 32 tokens each): mean acceptance length "
                f"**{h['mean_acceptance_length']:.3f}**, acceptance rate per position "
                f"{', '.join(f'{a:.3f}' for a in h['acceptance_rate_per_position'])} ({h['num_drafts']} drafts)")

    text = f"""# specfmt example world

A tiny, fully synthetic speculative-decoding setup that every test and example
can use offline: a verifier, three drafts trained for it with `specfmt train`'s
trainer and saved in their research layouts (the converters' inputs), and
held-out prompts. Regenerate it with:

    python examples/make_world.py            # --out examples/world --steps {steps} --draft-steps {e3['steps']}
    python examples/make_world.py --drafts-only   # keep the verifier; retrain the drafts

The script is seeded and CPU-only (2 threads, about 20 minutes). It is
deterministic for a given Python version: the corpus is the Python standard
library's own source, which changes a little between CPython releases. This
copy was generated with Python {py}, torch {torch.__version__}.

## Contents

| path | what | size |
|---|---|---|
| `verifier/` | Llama-architecture causal LM + byte-level BPE tokenizer | {mb(sizes['verifier'])} |
| `eagle3-safeailab/` | EAGLE-3 draft in the SafeAILab/EAGLE research layout | {mb(sizes['eagle3-safeailab'])} |
| `eagle-safeailab/` | EAGLE-1 draft in the SafeAILab/EAGLE (LLaMA3 repositories) layout | {mb(sizes['eagle-safeailab'])} |
| `medusa-legacy/` | 3 Medusa heads in the Medusa legacy-trainer layout | {mb(sizes['medusa-legacy'])} |
| `prompts.jsonl` | {len(prompts)} prompts cut from held-out stdlib files | {mb((out / 'prompts.jsonl').stat().st_size)} |

Files: {', '.join(f'`{f}`' for f in files)}.

### `verifier/`

* `LlamaForCausalLM`, float32 `model.safetensors`, {stats['params']:,} parameters:
  vocab {VOCAB}, hidden {HIDDEN}, intermediate {INTERMEDIATE}, {N_LAYERS} layers,
  {N_HEADS} attention heads / {N_KV_HEADS} KV heads, head_dim {HEAD_DIM}, RoPE theta
  {ROPE_THETA:g}, max positions {MAX_POS}, untied embeddings. Loads with
  `AutoModelForCausalLM.from_pretrained` and is a standard Llama layout for vLLM.
* Tokenizer: byte-level BPE trained with `tokenizers` (vocab {VOCAB}) saved as a
  `PreTrainedTokenizerFast` (`AutoTokenizer.from_pretrained`). Special tokens
  `<|bos|>`=0, `<|eos|>`=1, `<|pad|>`=2; encoding with special tokens prepends
  `<|bos|>`.
* Trained for {steps} steps (AdamW, peak lr {LR:g}, warmup + cosine, batch
  {BATCH} x {SEQ_LEN} tokens) on {len(train)} stdlib modules
  ({stats['train_tokens']:,} tokens; each file is `<|bos|> ... <|eos|>`).
* Token embeddings are initialised with std 1.0 (the other weights use the HF
  default, std 0.02); measured with the HF default instead: ~1 nat higher
  loss after 150 steps, ~0.3 nats higher after 600.
* Measured losses (nats/token; uniform would be ln {VOCAB} = {math.log(VOCAB):.2f}):
  train **{stats['train_loss']:.3f}** (eval mode, first
  {min(EVAL_CHUNKS * SEQ_LEN, stats['train_tokens']):,} training tokens; running
  average of the last 50 steps {stats['last_avg']:.3f}), held-out
  **{stats['heldout_loss']:.3f}** (the {min((stats['heldout_tokens'] - 1) // SEQ_LEN, EVAL_CHUNKS) * SEQ_LEN:,}
  tokens in whole {SEQ_LEN}-token windows of the held-out files).
* Held-out files (not used for the tokenizer, the verifier, or the drafts):
  {', '.join(f'`{n}`' for n in sorted(heldout))}.
* `--drafts-only` keeps this verifier and rewrites only the drafts; the verifier's
  figures above are carried over from `{MANIFEST}`.

### The drafts

All three are new drafts trained against the frozen verifier by
`specfmt.training.pipeline.train_draft` (what `specfmt train eagle3|eagle|medusa` runs) on
the training files as `--data`, then saved in their research layouts, float16,
exactly as the research trainers save them.

#### `eagle3-safeailab/`

* `pytorch_model.bin`: `torch.save` of a flat state dict, no key prefix
  (`save_16bit_model(..., exclude_frozen_parameters=True)`):
  `midlayer.self_attn.{{q,k,v,o}}_proj.weight` (q/k/v take 2H = {2 * HIDDEN} inputs),
  `midlayer.mlp.{{gate,up,down}}_proj.weight`,
  `midlayer.{{hidden_norm,input_layernorm,post_attention_layernorm}}.weight`,
  `fc.weight` [{HIDDEN}, {3 * HIDDEN}], `norm.weight`, `lm_head.weight`
  [{DRAFT_VOCAB}, {HIDDEN}], plus `d2t` (int64 [{DRAFT_VOCAB}]) and `t2d` (bool
  [{VOCAB}]). No `embed_tokens.weight`: the reference borrows the verifier's.
* `config.json`: plain LlamaConfig-style dump with `num_hidden_layers: 1` and
  `draft_vocab_size: {DRAFT_VOCAB}`; no aux-layer ids, so the reference's default
  taps (2, N//2, N-3) = (2, 4, 5) apply for the {N_LAYERS}-layer verifier.
* Training-time test over 3 steps: {figures(e3)}.
* `d2t`/`t2d` (`specfmt train eagle3 --vocab-from verifier`, the default): {e3['vocab']}.
  `d2t[i] = used_tokens[i] - i`, `t2d[t] = t in used_tokens`.

#### `eagle-safeailab/`

* `pytorch_model.bin`: `fc.weight` [{HIDDEN}, {2 * HIDDEN}] (no bias; `config.json`
  says `"bias": false`, as the LLaMA3 EAGLE repositories do), `layers.0.*` without
  `input_layernorm`, and `embed_tokens.weight` [{VOCAB}, {HIDDEN}] (the verifier's, frozen).
* Feature regression plus 0.1 x token loss, input feature noise U(-{EAGLE1_NOISE:g}, {EAGLE1_NOISE:g}): {figures(e1)}.

#### `medusa-legacy/`

* `medusa_lm_head.safetensors`: {MEDUSA_HEADS} heads of one ResBlock,
  `{{i}}.0.linear.{{weight,bias}}` and `{{i}}.1.weight` (each head's own lm_head,
  initialised from the verifier's); `config.json` with `medusa_num_heads` /
  `medusa_num_layers`.
* Self-distillation (head i learns the verifier's distribution i+1 positions on): {figures(md)}.

### `prompts.jsonl`

One JSON object per line, `{{"prompt": ...}}`: a 100-300 character whole-line
snippet of a held-out file, in file order {', '.join(f'`{n}`' for n in sorted(heldout))}
({per_file_counts} prompts each).
"""
    (out / "README.md").write_text(text)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "world"),
                    help="output folder (default: examples/world next to this script)")
    ap.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="verifier training steps")
    ap.add_argument("--draft-steps", type=int, default=DRAFT_STEPS, help="EAGLE-3 draft training steps")
    ap.add_argument("--eagle1-steps", type=int, default=EAGLE1_STEPS, help="EAGLE-1 draft training steps")
    ap.add_argument("--medusa-steps", type=int, default=MEDUSA_STEPS, help="Medusa heads training steps")
    ap.add_argument("--heldout-prompts-only", action="store_true",
                    help=f"write only {HELDOUT_PROMPTS}, the larger held-out prompt set, into --out (nothing trained)")
    ap.add_argument("--drafts-only", action="store_true",
                    help="keep the verifier, tokenizer and prompts in --out; retrain and rewrite the drafts")
    ap.add_argument("--drafts", default=",".join(DRAFT_DIRS),
                    help="with --drafts-only: the drafts to retrain, of " + ", ".join(DRAFT_DIRS) + " (the others and their figures stay)")
    args = ap.parse_args(argv)
    only = [d for d in args.drafts.split(",") if d]
    if set(only) - set(DRAFT_DIRS) or (not args.drafts_only and set(only) != set(DRAFT_DIRS)):
        ap.error(f"--drafts names of {', '.join(DRAFT_DIRS)}, and only with --drafts-only")

    t_start = time.time()
    seed_everything()
    out = Path(args.out)
    train, heldout = build_corpus()
    if args.heldout_prompts_only:
        write_prompts(out / HELDOUT_PROMPTS, tile_prompts(heldout))
        print(f"wrote {out / HELDOUT_PROMPTS}")
        return
    if args.drafts_only:
        from transformers import AutoTokenizer

        manifest = json.loads((out / MANIFEST).read_text())
        tok = AutoTokenizer.from_pretrained(out / "verifier")._tokenizer
        prompts = [json.loads(line) for line in (out / "prompts.jsonl").read_text().splitlines()]
        stats = manifest["verifier"]
        steps = manifest["verifier_steps"]
    else:
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        prompts = make_prompts(heldout)
        write_prompts(out / "prompts.jsonl", prompts)
        write_prompts(out / HELDOUT_PROMPTS, tile_prompts(heldout))
        tok = train_tokenizer(train, out / "verifier")
    train_docs = encode_docs(tok, train)
    if not args.drafts_only:
        heldout_docs = encode_docs(tok, heldout)
        stats = train_verifier(train_docs, heldout_docs, args.steps, out / "verifier")
        stats = {k: v for k, v in stats.items() if k != "embed"}
        steps = args.steps
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    train_paths = [stdlib / n for n in sorted(train)]
    for algo in only:
        shutil.rmtree(out / DRAFT_DIRS[algo][0], ignore_errors=True)
    kept = manifest["drafts"] if args.drafts_only else None
    draft_stats = make_drafts(out, train_paths, {"eagle3": args.draft_steps, "eagle": args.eagle1_steps, "medusa": args.medusa_steps},
                              only, kept)
    (out / MANIFEST).write_text(json.dumps({"verifier_steps": steps, "verifier": stats, "drafts": draft_stats}, indent=2) + "\n")
    write_readme(out, stats, train, heldout, prompts, steps, draft_stats)

    print(f"wrote {out} ({dir_size(out) / 1e6:.2f} MB) in {time.time() - t_start:.0f}s")


if __name__ == "__main__":
    main()
