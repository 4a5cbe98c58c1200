#!/usr/bin/env python3
"""Build the specfmt "example world": a tiny verifier LM plus an EAGLE-3 draft.

Everything is generated from text that exists on every machine (the Python
standard library's own source files), with fixed seeds, on CPU, in a few
minutes.  The output folder (default ``examples/world``) holds:

* ``verifier/``         a small Llama-architecture causal LM (float32
                        safetensors) with its own byte-level BPE tokenizer,
                        loadable with ``AutoModelForCausalLM`` /
                        ``AutoTokenizer`` and by vLLM (standard Llama layout).
* ``eagle3-safeailab/`` an EAGLE-3 draft head for that verifier, saved exactly
                        in the SafeAILab/EAGLE research layout
                        (``pytorch_model.bin`` + plain ``config.json``),
                        trained against the frozen verifier with specfmt's
                        EAGLE-3 trainer (training-time test); its ``d2t``/``t2d``
                        vocab map is built from the training corpus the same way
                        ``eagle/traineagle3/cnets.py::scandata`` does.
* ``prompts.jsonl``     prompts cut from held-out stdlib files (never trained on).
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
DRAFT_STEPS = 1500
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
                   out_dir: Path) -> dict:
    """Train the tiny Llama verifier on the token stream and save it."""
    from transformers import LlamaForCausalLM

    from specfmt.train import warmup_cosine

    torch.manual_seed(SEED)
    cfg = verifier_config()
    model = LlamaForCausalLM(cfg).float()
    # Unit-variance token embeddings (instead of the HF default std 0.02) let the
    # token signal dominate the residual stream of this narrow 8-layer model
    # from step 0; measured: ~1 nat lower loss after 150 steps, ~0.3 after 600.
    with torch.no_grad():
        model.get_input_embeddings().weight.normal_(0.0, 1.0)
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
        lr=LR, betas=(0.9, 0.95), eps=1e-8,
    )
    warmup = max(1, steps // 20)

    def lr_at(step: int) -> float:  # linear warmup, cosine decay to 10%
        return warmup_cosine(step, steps, warmup, LR)

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


def build_vocab_map(train_docs: list[list[int]], vocab: int = VOCAB,
                    draft_vocab: int = DRAFT_VOCAB) -> tuple[torch.Tensor, torch.Tensor, float]:
    """d2t / t2d exactly as SafeAILab eagle/traineagle3/cnets.py::scandata builds them.

    Token frequencies are counted (Counter, in corpus order) over every trained-on
    position, i.e. each document's ids after its leading <|bos|> (the reference's
    loss_mask zeroes position 0); the draft_vocab most common ids, sorted
    ascending, are ``used_tokens``.
    """
    token_dict = collections.Counter()
    for doc in train_docs:
        token_dict.update(doc[1:])
    total_frequency = sum(token_dict.values())
    top_n = token_dict.most_common(draft_vocab)
    ratio = sum(freq for _, freq in top_n) / total_frequency
    used_tokens = sorted(key for key, _ in top_n)
    assert len(used_tokens) == draft_vocab, "corpus has fewer distinct tokens than the draft vocab"
    d2t = torch.tensor([used_tokens[i] - i for i in range(len(used_tokens))], dtype=torch.int64)
    used = set(used_tokens)
    t2d = torch.tensor([i in used for i in range(vocab)], dtype=torch.bool)
    assert int(t2d.sum()) == draft_vocab
    assert torch.equal(torch.arange(draft_vocab) + d2t, t2d.nonzero().squeeze())
    print(f"draft vocab: top {draft_vocab} tokens cover {ratio:.2%} of training positions")
    return d2t, t2d, ratio


def draft_config() -> dict:
    """The specfmt-style EAGLE-3 config the trainer builds the draft from (1 layer, verifier shapes)."""
    return {
        "speculators_model_type": "eagle3",
        "transformer_layer_config": {
            "vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": INTERMEDIATE,
            "num_hidden_layers": 1, "num_attention_heads": N_HEADS, "num_key_value_heads": N_KV_HEADS,
            "head_dim": HIDDEN // N_HEADS, "rms_norm_eps": RMS_EPS, "rope_theta": ROPE_THETA,
            "attention_bias": False, "mlp_bias": False,
        },
        "draft_vocab_size": DRAFT_VOCAB,
        "eagle_aux_hidden_state_layer_ids": [2, N_LAYERS // 2, N_LAYERS - 3],  # the reference default
        "norm_before_residual": False,  # SafeAILab cnets.py: residual = hidden, then hidden_norm
    }


def make_eagle3_draft(d2t: torch.Tensor, t2d: torch.Tensor, out_dir: Path, verifier_dir: Path,
                      train_docs: list[list[int]], steps: int) -> dict:
    """Train an EAGLE-3 draft for the verifier and write it in the SafeAILab research layout.

    Training-time test over 3 steps (``specfmt.train.train_eagle3``), the verifier frozen,
    batch 8 x 256 tokens of the training corpus, AdamW lr 3e-3 with warmup and cosine decay.
    """
    from transformers import AutoModelForCausalLM

    from specfmt.reference import Eagle3Draft
    from specfmt.train import train_eagle3, windows

    torch.manual_seed(SEED + 3)
    verifier = AutoModelForCausalLM.from_pretrained(verifier_dir, dtype=torch.float32).eval()
    draft = Eagle3Draft(draft_config())
    draft.d2t.copy_(d2t)
    draft.t2d.copy_(t2d)

    def log(step: int, loss: float, acc: list[float]) -> None:
        if (step + 1) % 100 == 0 or step == 0:
            print(f"  draft step {step + 1:4d}/{steps}  loss {loss:.3f}  top-1 agreement per TTT step "
                  f"{' '.join(f'{a:.2f}' for a in acc)}", flush=True)

    stats = train_eagle3(draft, verifier, windows(train_docs, DRAFT_SEQ, DRAFT_BATCH, SEED + 4), steps=steps,
                         lr=DRAFT_LR, ttt_steps=3, log=log)
    print(f"draft: {stats.steps} steps, {stats.tokens:,} tokens in {stats.seconds:.0f}s; "
          f"top-1 agreement {[round(a, 3) for a in stats.accuracy]}")

    # Same key order as the reference Model's state_dict (frozen target model and
    # embed_tokens excluded, as save_16bit_model(exclude_frozen_parameters=True) does).
    state = draft.state_dict()
    order = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
             "mlp.up_proj", "mlp.down_proj", "hidden_norm", "input_layernorm", "post_attention_layernorm"]
    sd = collections.OrderedDict()
    for m in order:
        sd[f"midlayer.{m}.weight"] = state[f"layers.0.{m}.weight"].to(torch.float16).clone()
    for n in ("norm.weight", "fc.weight", "lm_head.weight"):
        sd[n] = state[n].to(torch.float16).clone()
    sd["d2t"] = d2t.to(torch.int64).clone()
    sd["t2d"] = t2d.to(torch.bool).clone()

    out_dir.mkdir(parents=True, exist_ok=True)
    torch.save(dict(sd), out_dir / "pytorch_model.bin")
    config = {
        "architectures": ["LlamaForCausalLM"],
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "hidden_act": "silu",
        "hidden_size": HIDDEN,
        "initializer_range": 0.02,
        "intermediate_size": INTERMEDIATE,
        "max_position_embeddings": MAX_POS,
        "model_type": "llama",
        "num_attention_heads": N_HEADS,
        "num_key_value_heads": N_KV_HEADS,
        "num_hidden_layers": 1,
        "pad_token_id": PAD_ID,
        "rms_norm_eps": RMS_EPS,
        "tie_word_embeddings": False,
        "torch_dtype": "float16",
        "transformers_version": "4.28.1",
        "use_cache": True,
        "vocab_size": VOCAB,
        "draft_vocab_size": DRAFT_VOCAB,
    }
    with open(out_dir / "config.json", "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    return {"steps": stats.steps, "tokens": stats.tokens, "seconds": round(stats.seconds), "accuracy": [round(a, 3) for a in stats.accuracy]}


def heldout_acceptance(out: Path, prompts: list[dict]) -> dict:
    """The reference run of the trained draft on the held-out prompts (k=3, 32 tokens each)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specfmt.acceptance import run_chain
    from specfmt.reference import Eagle3Draft, eagle3_proposer

    verifier = AutoModelForCausalLM.from_pretrained(out / "verifier", dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(out / "verifier")
    sd = torch.load(out / "eagle3-safeailab" / "pytorch_model.bin", weights_only=True)
    draft = Eagle3Draft(draft_config(), {n.replace("midlayer.", "layers.0."): t for n, t in sd.items()}).eval()
    ids = [tok.encode(p["prompt"]) for p in prompts]
    res = run_chain(verifier, ids, eagle3_proposer(draft, verifier.get_input_embeddings().weight.detach()), 3, 32)
    print(f"held-out reference run: mean acceptance length {res.mean_acceptance_length:.3f}, "
          f"per position {[round(r, 3) for r in res.acceptance_rate_per_position]}")
    return res.to_json()


def dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def write_readme(out: Path, stats: dict, train: dict, heldout: dict, prompts: list,
                 ratio: float, steps: int, draft: dict) -> None:
    sizes = {name: dir_size(out / name) for name in ("verifier", "eagle3-safeailab")}
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    files = [f for f in files if f != "README.md"] + ["README.md"]
    per_file_counts = " / ".join(str(N_PROMPTS // len(heldout) + (1 if i < N_PROMPTS % len(heldout) else 0))
                                 for i in range(len(heldout)))
    mb = lambda n: f"{n / 1e6:.2f} MB" if n >= 100_000 else f"{n / 1e3:.1f} kB"  # noqa: E731
    py = f"{sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro}"
    text = f"""# specfmt example world

A tiny, fully synthetic speculative-decoding setup that every test and example
can use offline. Regenerate it with:

    python examples/make_world.py            # --out examples/world --steps {steps} --draft-steps {draft['steps']}
    python examples/make_world.py --drafts-only   # keep the verifier; retrain the drafts

The script is seeded and CPU-only (2 threads, a few minutes). It is
deterministic for a given Python version: the corpus is the Python standard
library's own source, which changes a little between CPython releases. This
copy was generated with Python {py}, torch {torch.__version__}.

## Contents

| path | what | size |
|---|---|---|
| `verifier/` | Llama-architecture causal LM + byte-level BPE tokenizer | {mb(sizes['verifier'])} |
| `eagle3-safeailab/` | EAGLE-3 draft in the SafeAILab/EAGLE research layout | {mb(sizes['eagle3-safeailab'])} |
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
* Held-out files (not used for the tokenizer, the verifier, or the draft vocab):
  {', '.join(f'`{n}`' for n in sorted(heldout))}.
* `--drafts-only` keeps this verifier and rewrites only the drafts; the verifier's
  figures above are carried over from `{MANIFEST}`.

### `eagle3-safeailab/`

Saved exactly as SafeAILab's `eagle/traineagle3/main.py` does
(`save_16bit_model(..., exclude_frozen_parameters=True)`):

* `pytorch_model.bin`: `torch.save` of a flat state dict, no key prefix,
  float16 weights: `midlayer.self_attn.{{q,k,v,o}}_proj.weight`
  (q/k/v take 2H = {2 * HIDDEN} inputs), `midlayer.mlp.{{gate,up,down}}_proj.weight`,
  `midlayer.{{hidden_norm,input_layernorm,post_attention_layernorm}}.weight`,
  `fc.weight` [{HIDDEN}, {3 * HIDDEN}], `norm.weight`, `lm_head.weight`
  [{DRAFT_VOCAB}, {HIDDEN}], plus `d2t` (int64 [{DRAFT_VOCAB}]) and `t2d` (bool
  [{VOCAB}]). No `embed_tokens.weight`: the reference borrows the verifier's.
* `config.json`: plain LlamaConfig-style dump with `num_hidden_layers: 1` and
  `draft_vocab_size: {DRAFT_VOCAB}`; no aux-layer ids, so the reference's default
  taps (2, N//2, N-3) = (2, 4, 5) apply for the {N_LAYERS}-layer verifier.
* The weights are **trained** against the frozen verifier with `specfmt.train.train_eagle3`
  (EAGLE-3 training-time test over 3 steps; {draft['steps']} steps of {DRAFT_BATCH} x {DRAFT_SEQ}
  training tokens, AdamW lr {DRAFT_LR:g}, {draft['seconds']} s on 2 CPU threads). Top-1
  agreement with the verifier over the last 50 steps, per TTT step:
  {', '.join(f'{a:.3f}' for a in draft['accuracy'])}.
* On the held-out prompts (k = 3, 32 tokens each, `specfmt.reference` run in float32):
  mean acceptance length **{draft['heldout']['mean_acceptance_length']:.3f}**, acceptance rate per
  position {', '.join(f'{a:.3f}' for a in draft['heldout']['acceptance_rate_per_position'])}
  ({draft['heldout']['num_drafts']} drafts).
* `d2t`/`t2d` are real: built like `cnets.py::scandata` from token counts over
  the training corpus; the top {DRAFT_VOCAB} tokens cover {ratio:.1%} of training
  positions. `d2t[i] = used_tokens[i] - i`, `t2d[t] = t in used_tokens`.

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
    ap.add_argument("--drafts-only", action="store_true",
                    help="keep the verifier, tokenizer and prompts in --out; retrain and rewrite the drafts")
    args = ap.parse_args(argv)

    t_start = time.time()
    seed_everything()
    out = Path(args.out)
    train, heldout = build_corpus()
    if args.drafts_only:
        from transformers import AutoTokenizer

        manifest = json.loads((out / MANIFEST).read_text())
        tok = AutoTokenizer.from_pretrained(out / "verifier")._tokenizer
        prompts = [json.loads(line) for line in (out / "prompts.jsonl").read_text().splitlines()]
        stats = manifest["verifier"]
        steps = manifest["verifier_steps"]
        shutil.rmtree(out / "eagle3-safeailab", ignore_errors=True)
    else:
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        prompts = make_prompts(heldout)
        with open(out / "prompts.jsonl", "w") as f:
            for p in prompts:
                f.write(json.dumps(p) + "\n")
        tok = train_tokenizer(train, out / "verifier")
    train_docs = encode_docs(tok, train)
    if not args.drafts_only:
        heldout_docs = encode_docs(tok, heldout)
        stats = train_verifier(train_docs, heldout_docs, args.steps, out / "verifier")
        stats = {k: v for k, v in stats.items() if k != "embed"}
        steps = args.steps
    d2t, t2d, ratio = build_vocab_map(train_docs)
    draft_stats = make_eagle3_draft(d2t, t2d, out / "eagle3-safeailab", out / "verifier", train_docs, args.draft_steps)
    draft_stats["heldout"] = heldout_acceptance(out, prompts)
    (out / MANIFEST).write_text(json.dumps({"verifier_steps": steps, "verifier": stats, "draft": draft_stats}, indent=2) + "\n")
    write_readme(out, stats, train, heldout, prompts, ratio, steps, draft_stats)

    print(f"wrote {out} ({dir_size(out) / 1e6:.2f} MB) in {time.time() - t_start:.0f}s")


if __name__ == "__main__":
    main()
