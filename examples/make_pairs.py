#!/usr/bin/env python3
"""Add the example world's draft-model pairs: two small causal LMs trained as drafts of the world's verifier.

* ``draft-lm-padded/``  the verifier's tokenizer, saved with padding rows: ``vocab_size`` 2112, 64 rows past the
                        tokenizer's 2048 tokens (as trainers that reserve rows for added tokens save a model). vLLM
                        refuses it beside the 2048-row verifier (``verify_equal_vocab_size_if_draft_model``);
                        ``specfmt pad-vocab`` makes the rows the verifier's. Trained on the verifier's tokenization
                        of the world's training files (next-token loss; the padding rows are never a target).
* ``draft-lm-bpe/``     a tokenizer of its own: another byte-level BPE (1024 tokens, other special tokens) trained on
                        the same files; the draft is trained on its own tokenization (plain next-token loss). vLLM
                        serves the pair with ``use_heterogeneous_vocab`` (token-level intersection), transformers with
                        ``assistant_tokenizer`` (through text).

Both are Llama decoders of 2 layers, hidden 64, two heads of 32 (vLLM's CPU attention needs head_dim >= 32), saved
in bfloat16 with their tokenizers, about 0.4-0.7 MB each. Seeded and CPU-only; a couple of minutes on 2 threads::

    nice -n 10 python examples/make_pairs.py [--out examples/world]

It reads the world's verifier, tokenizer and training files (``examples/make_world.py``) and writes the two folders,
``pairs.json`` (the figures) and the pairs' section of the world's README.md.
"""
from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_world as world  # noqa: E402

SEED = world.SEED + 36
PADDED, BPE = "draft-lm-padded", "draft-lm-bpe"
PAD_ROWS = 64            # rows past the tokenizer's length in the padded draft
BPE_VOCAB = 1024
BPE_SPECIALS = ["<s>", "</s>", "<pad>", "<unk>"]  # another family's names and order
HIDDEN, INTER, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 64, 192, 2, 2, 1, 32
STEPS = {PADDED: 500, BPE: 500}
SEQ, BATCH, LR = 128, 8, 3e-3
MANIFEST = "pairs.json"
README_BEGIN, README_END = "<!-- pairs: begin (examples/make_pairs.py) -->", "<!-- pairs: end -->"


def draft_config(vocab: int, bos: int, eos: int, pad: int):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=vocab, hidden_size=HIDDEN, intermediate_size=INTER, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                       num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM, hidden_act="silu", max_position_embeddings=world.MAX_POS,
                       initializer_range=0.02, rms_norm_eps=world.RMS_EPS, rope_parameters={"rope_type": "default", "rope_theta": world.ROPE_THETA},
                       tie_word_embeddings=False, bos_token_id=bos, eos_token_id=eos, pad_token_id=pad, attention_bias=False, mlp_bias=False,
                       use_cache=True, dtype="bfloat16", architectures=["LlamaForCausalLM"])


def bpe_tokenizer(train: dict[str, str], out_dir: Path):
    """Another byte-level BPE: 1024 tokens, ``<s>``/``</s>``/``<pad>``/``<unk>``, ``<s>`` prepended."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=BPE_VOCAB, min_frequency=3, special_tokens=BPE_SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([train[k] for k in sorted(train, reverse=True)], trainer=trainer)
    assert tok.get_vocab_size() == BPE_VOCAB, tok.get_vocab_size()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 0)])
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>",
                                 model_max_length=world.MAX_POS, clean_up_tokenization_spaces=False)
    out_dir.mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(out_dir)
    cfg_path = out_dir / "tokenizer_config.json"  # the public class name, as make_world.py writes the verifier's
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return tok


def stream_of(tok, train: dict[str, str], bos: int, eos: int) -> torch.Tensor:
    return torch.tensor([t for name in sorted(train) for t in [bos, *tok.encode(train[name], add_special_tokens=False).ids, eos]], dtype=torch.long)


def train(model, stream: torch.Tensor, steps: int, log: str = "") -> dict:
    """AdamW, warmup + cosine, the next-token loss on random windows of ``stream``."""
    from specfmt.training.loop import warmup_cosine

    torch.manual_seed(SEED)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator().manual_seed(SEED)
    hi = stream.numel() - (SEQ + 1)
    model.train()
    t0, running = time.time(), []
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = warmup_cosine(step, steps, max(1, steps // 20), LR)
        chunk = torch.stack([stream[s:s + SEQ + 1] for s in torch.randint(0, hi, (BATCH,), generator=gen).tolist()])
        logits = model(input_ids=chunk[:, :-1]).logits.float()
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), chunk[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        running.append(loss.item())
        if (step + 1) % 100 == 0 or step == 0:
            print(f"  {log} step {step + 1:4d}/{steps}  loss {sum(running) / len(running):.3f}  ({time.time() - t0:.0f}s)", flush=True)
            running = []
    model.eval()
    return {"steps": steps, "seconds": round(time.time() - t0), "batch": f"{BATCH} x {SEQ}", "lr": LR}


@torch.no_grad()
def heldout_loss(model, stream: torch.Tensor, vocab: int) -> float:
    n = (stream.numel() - 1) // SEQ
    chunks = torch.stack([stream[i * SEQ:i * SEQ + SEQ + 1] for i in range(n)])
    logits = model(input_ids=chunks[:, :-1]).logits.float()[..., :vocab]
    return float(F.cross_entropy(logits.reshape(-1, vocab), chunks[:, 1:].reshape(-1)))


def save(model, tokenizer_from: Path | None, out_dir: Path) -> None:
    model.to(torch.bfloat16).save_pretrained(out_dir, safe_serialization=True)
    if tokenizer_from is not None:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copyfile(tokenizer_from / name, out_dir / name)
    for p in out_dir.iterdir():
        p.chmod(0o644)


def build(out: Path) -> dict:
    from transformers import AutoTokenizer, LlamaForCausalLM

    world.seed_everything(SEED)
    train_docs, heldout_docs = world.build_corpus()
    vtok = AutoTokenizer.from_pretrained(out / "verifier")._tokenizer
    figures: dict = {}

    for name in (PADDED, BPE):
        shutil.rmtree(out / name, ignore_errors=True)
    # the verifier's tokenizer, 64 padding rows
    stream = stream_of(vtok, train_docs, world.BOS_ID, world.EOS_ID)
    torch.manual_seed(SEED)
    padded = LlamaForCausalLM(draft_config(world.VOCAB + PAD_ROWS, world.BOS_ID, world.EOS_ID, world.PAD_ID)).float()
    stats = train(padded, stream, STEPS[PADDED], log=PADDED)
    stats["heldout_loss"] = round(heldout_loss(padded, stream_of(vtok, heldout_docs, world.BOS_ID, world.EOS_ID), world.VOCAB), 3)
    save(padded, out / "verifier", out / PADDED)
    figures[PADDED] = {**stats, "parameters": sum(p.numel() for p in padded.parameters()), "vocab_size": world.VOCAB + PAD_ROWS,
                       "objective": "next-token cross-entropy"}
    # its own BPE; the next-token loss on its own tokenization
    (out / BPE).mkdir(parents=True)
    btok = bpe_tokenizer(train_docs, out / BPE)
    bstream = stream_of(btok, train_docs, 0, 1)
    torch.manual_seed(SEED + 1)
    bpe = LlamaForCausalLM(draft_config(BPE_VOCAB, 0, 1, 2)).float()
    stats = train(bpe, bstream, STEPS[BPE], log=BPE)
    stats["heldout_loss"] = round(heldout_loss(bpe, stream_of(btok, heldout_docs, 0, 1), BPE_VOCAB), 3)
    save(bpe, None, out / BPE)
    figures[BPE] = {**stats, "parameters": sum(p.numel() for p in bpe.parameters()), "vocab_size": BPE_VOCAB, "objective": "next-token cross-entropy",
                    "train_tokens": int(bstream.numel()), "verifier_train_tokens": int(stream.numel())}
    return figures


def readme_section(out: Path, figures: dict) -> str:
    mb = lambda p: f"{sum(f.stat().st_size for f in p.iterdir()) / 1e6:.2f} MB"  # noqa: E731
    p, b = figures[PADDED], figures[BPE]
    measured = figures.get("measured", {})
    rows = "".join(f"| {k} | {v} |\n" for k, v in measured.items())
    return f"""{README_BEGIN}
### Draft-model pairs (`examples/make_pairs.py`)

Two small causal LMs trained as drafts of the verifier (vLLM `draft_model`, transformers `assistant_model`):
Llama decoders of {LAYERS} layers, hidden {HIDDEN}, {HEADS} heads of {HEAD_DIM}, bfloat16, with their tokenizers.

| path | what | size |
|---|---|---|
| `{PADDED}/` | the verifier's tokenizer, `vocab_size` {p['vocab_size']} ({PAD_ROWS} padding rows past its {world.VOCAB} tokens); next-token loss, {p['steps']} steps of {p['batch']} tokens; held-out loss {p['heldout_loss']} nats/token over the verifier's ids | {mb(out / PADDED)} |
| `{BPE}/` | a byte-level BPE of its own ({BPE_VOCAB} tokens, `<s>` `</s>` `<pad>` `<unk>`), next-token loss on its own tokenization, {b['steps']} steps of {b['batch']} tokens; held-out loss {b['heldout_loss']} nats/token over its ids ({b['train_tokens']:,} training tokens against the verifier's {b['verifier_train_tokens']:,}) | {mb(out / BPE)} |

vLLM 0.30-0.33 refuse `{PADDED}` beside the verifier (vocabulary sizes {p['vocab_size']} and {world.VOCAB});
`specfmt pad-vocab examples/world/{PADDED} --verifier examples/world/verifier -o OUT` removes the padding rows
(the other tensors stay byte for byte). `{BPE}` is served through the token-level intersection
(`use_heterogeneous_vocab`). Figures measured by `examples/make_pairs.py` (reference run, float32, the 16 held-out
prompts x 32 tokens, k = 3):

| pair | mean acceptance length (reference) |
|---|---|
{rows}{README_END}
"""


def write_readme(out: Path, figures: dict) -> None:
    path = out / "README.md"
    text = path.read_text()
    section = readme_section(out, figures)
    if README_BEGIN in text:
        head, rest = text.split(README_BEGIN, 1)
        text = head + section + rest.split(README_END, 1)[1].lstrip("\n")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text)


def measure(out: Path) -> dict:
    """The reference run of each pair on the held-out prompts (the padded draft after ``pad-vocab``)."""
    import tempfile

    from specfmt.methods.padding import pad_vocab
    from specfmt.validation.method_run import validate

    got = {}
    with tempfile.TemporaryDirectory() as tmp:
        fixed = Path(tmp) / "padded-fixed"
        pad_vocab(str(out / PADDED), str(out / "verifier"), fixed)
        for label, folder in ((f"`{PADDED}` after `pad-vocab`", fixed), (f"`{BPE}` (token-level intersection)", out / BPE)):
            run = validate(folder, verifier=str(out / "verifier"), prompts=str(out / "prompts.jsonl"), max_tokens=32, num_speculative_tokens=3,
                           use_vllm=False, use_transformers=False, write=False)
            ref = run.reference or {}
            got[label] = f"{ref.get('mean_acceptance_length', float('nan')):.3f} (per position {', '.join(f'{a:.3f}' for a in ref.get('acceptance_rate_per_position', []))})"
            print(f"{label}: {got[label]}")
    return got


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "world"), help="the world folder (default: examples/world)")
    ap.add_argument("--no-measure", action="store_true", help="train and save only; keep the figures of pairs.json")
    ap.add_argument("--measure-only", action="store_true", help="keep the drafts and their training figures; measure them again")
    args = ap.parse_args(argv)
    out = Path(args.out)
    t0 = time.time()
    figures = json.loads((out / MANIFEST).read_text()) if args.measure_only else build(out)
    if not args.no_measure:
        figures["measured"] = measure(out)
    elif (out / MANIFEST).is_file():
        figures["measured"] = json.loads((out / MANIFEST).read_text()).get("measured", {})
    (out / MANIFEST).write_text(json.dumps(figures, indent=2) + "\n")
    write_readme(out, figures)
    print(f"wrote {out / PADDED}, {out / BPE} in {time.time() - t0:.0f}s; {math.fsum(world.dir_size(out / n) for n in (PADDED, BPE)) / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
