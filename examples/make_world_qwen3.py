#!/usr/bin/env python3
"""Build the specfmt "Qwen3 world": a tiny Qwen3 verifier and an EAGLE-3 draft with a Qwen3 layer.

The second model family of the example world (issue #18): speculators 0.9 trains EAGLE-3
drafts with a Qwen3 decoder layer (q/k RMSNorm per head) and vLLM serves them as
``Eagle3Qwen3ForCausalLM``. Everything comes from the same corpus, tokenizer, seeds and
helpers as ``examples/make_world.py`` (imported, not copied). The output folder (default
``examples/world-qwen3``) holds:

* ``verifier/``            a small ``Qwen3ForCausalLM`` (float32 safetensors, q/k norms) with
                           the shipped world's byte-level BPE tokenizer (copied from
                           ``examples/world/verifier``), started from the Llama world's
                           verifier weights (q/k norms at 1) and trained like it, briefly.
* ``eagle3-speculators/``  an EAGLE-3 draft with one Qwen3 decoder layer, started from the Llama
                           world's EAGLE-3 draft (q/k norms at 1) and trained against the frozen
                           verifier by specfmt's trainer (``specfmt.training.pipeline.train_draft``,
                           what ``specfmt train eagle3 --init`` runs), with the EAGLE-3 reference
                           norm flags (all false; see :data:`DRAFT_FLAGS`) and speculators'
                           sliding-window-2048 draft layer; saved exactly as speculators 0.9
                           ``save_pretrained`` writes it (``Eagle3SpeculatorConfig`` fields,
                           ``auto_map`` + ``config.py``, ``embed_tokens.weight`` in the file).
* ``prompts.jsonl``        the held-out prompts of ``examples/world`` (same files, same cut).
* ``README.md``, ``world.json``  what is here and the measured figures.

Usage::

    python examples/make_world_qwen3.py [--out examples/world-qwen3] [--steps 200] [--draft-steps 400]
    python examples/make_world_qwen3.py --drafts-only    # keep the verifier, retrain the draft
    python examples/make_world_qwen3.py --record OUT/validation.json   # store a validate --run's figures

Needs ``examples/world`` (the Llama world it starts from).

Deterministic for a given Python / torch / tokenizers version and thread count (one), as
``make_world.py``.
"""
from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_world as mw  # noqa: E402  (the Llama world's corpus, tokenizer, trainers)

HERE = Path(__file__).resolve().parent
SHIPPED_TOKENIZER = HERE / "world" / "verifier"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
#: the source of speculators 0.9.0's ``models/eagle3/config.py``, which its ``save_pretrained``
#: copies next to every config.json (``auto_map``); vendored so the world builds offline
SPECULATORS_CONFIG_PY = HERE / "vendor" / "speculators-0.9.0-eagle3-config.py"
SPECULATORS_VERSION = "0.9.0"
TRANSFORMERS_VERSION = "5.19.0"  # what speculators 0.9.0's save_pretrained records (the installed transformers)
RMS_EPS = 1e-6                   # Qwen3's default
SLIDING_WINDOW = 2048            # ``speculators train --sliding-window`` default: every draft layer sliding
VERIFIER_STEPS = 200
VERIFIER_LR = 1e-3
DRAFT_STEPS = 400
#: warm starts: the Llama world's verifier and EAGLE-3 draft have the same shapes; the Qwen3
#: q/k norms (and anything else they lack) start at their initialisation (norms = 1)
LLAMA_VERIFIER = HERE / "world" / "verifier" / "model.safetensors"
LLAMA_DRAFT = HERE / "world" / "eagle3-safeailab"
DRAFT_DIR = "eagle3-speculators"
MANIFEST = "world.json"
THREADS = 1
#: the draft's norm flags: the EAGLE-3 reference forward pass (SafeAILab ``cnets.py``), which the
#: Llama draft it starts from was trained with; ``speculators train`` writes them with
#: ``--no-norm-before-residual --no-input-norm --no-norm-output`` (its sample
#: ``eagle3-qwen3-plain``; its defaults for eagle3 are all three true, ``train/config/schema.py``)
DRAFT_FLAGS = {"norm_before_residual": False, "norm_before_fc": False, "norm_output": False}


def verifier_config():
    """The Qwen3 verifier: the Llama world's shapes, Qwen3's q/k norms and eps."""
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=mw.VOCAB, hidden_size=mw.HIDDEN, intermediate_size=mw.INTERMEDIATE, num_hidden_layers=mw.N_LAYERS,
        num_attention_heads=mw.N_HEADS, num_key_value_heads=mw.N_KV_HEADS, head_dim=mw.HEAD_DIM, hidden_act="silu",
        max_position_embeddings=mw.MAX_POS, initializer_range=0.02, rms_norm_eps=RMS_EPS,
        rope_parameters={"rope_type": "default", "rope_theta": mw.ROPE_THETA}, tie_word_embeddings=False,
        bos_token_id=mw.BOS_ID, eos_token_id=mw.EOS_ID, pad_token_id=mw.PAD_ID, attention_bias=False,
        use_sliding_window=False, use_cache=True, dtype="float32", architectures=["Qwen3ForCausalLM"],
    )


def draft_layer_config(verifier_dir: Path) -> dict:
    """``transformer_layer_config`` as ``speculators train --draft-arch qwen3`` builds it
    (``train/cli.py::create_transformer_layer_config``: the verifier's shapes, sliding window on
    every layer, the verifier's ``rope_parameters``) and its config serialises it (``to_diff_dict``)."""
    from transformers import AutoConfig, Qwen3Config

    v = AutoConfig.from_pretrained(verifier_dir)
    cfg = Qwen3Config(
        vocab_size=v.vocab_size, hidden_size=v.hidden_size, intermediate_size=v.intermediate_size, num_hidden_layers=1,
        num_attention_heads=v.num_attention_heads, num_key_value_heads=v.num_key_value_heads, hidden_act="silu",
        max_position_embeddings=v.max_position_embeddings, initializer_range=v.initializer_range,
        rms_norm_eps=v.rms_norm_eps, head_dim=v.head_dim, tie_word_embeddings=False, sliding_window=SLIDING_WINDOW,
        use_sliding_window=True, layer_types=["sliding_attention"],
    )
    cfg.rope_parameters = dict(v.rope_parameters)
    tlc = cfg.to_diff_dict()
    tlc.pop("transformers_version")  # speculators' files record it once, at the top level
    return tlc


def speculators_config(verifier_dir: Path, taps: list[int], draft_vocab: int, dtype: str = "float32") -> dict:
    """config.json of an EAGLE-3 draft as speculators 0.9.0 writes it (``Eagle3SpeculatorConfig``,
    ``save_pretrained``: sorted keys, ``auto_map``, ``transformers_version``)."""
    return {
        "architectures": ["Eagle3DraftModel"],
        "auto_map": {"": "config.Eagle3SpeculatorConfig"},
        "draft_vocab_size": draft_vocab,
        "dtype": dtype,
        "eagle_aux_hidden_state_layer_ids": taps,
        "embed_requires_grad": False,
        "fc_norm": False,
        **DRAFT_FLAGS,
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"accept_tolerance": 0.0, "proposal_type": "greedy", "speculative_tokens": 3, "verifier_accept_k": 1}],
            "verifier": {"architectures": ["Qwen3ForCausalLM"], "name_or_path": "../verifier"},
        },
        "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION,
        "target_hidden_size": None,
        "tie_word_embeddings": False,
        "transformer_layer_config": draft_layer_config(verifier_dir),
        "transformers_version": TRANSFORMERS_VERSION,
    }


def save_speculators(cfg: dict, tensors: dict, out_dir: Path, config_py: Path = SPECULATORS_CONFIG_PY) -> None:
    """Write the draft as speculators 0.9.0's ``Eagle3DraftModel.save_pretrained``: ``config.json``
    (``json.dumps(indent=2, sort_keys=True)`` + newline, as transformers' ``to_json_file``),
    ``config.py``, and ``model.safetensors`` with ``{"format": "pt"}`` metadata holding every
    state-dict tensor but ``verifier_lm_head`` / ``verifier_norm`` (``_keys_to_ignore_on_save``),
    ``embed_tokens.weight`` included, in the config's dtype."""
    from safetensors.torch import save_file

    dtype = getattr(torch, cfg["dtype"])
    sd = {n: (t.to(dtype) if t.is_floating_point() else t).contiguous() for n, t in sorted(tensors.items())}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    shutil.copyfile(config_py, out_dir / "config.py")
    save_file(sd, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    for p in out_dir.iterdir():  # speculators writes 0600; make the world readable
        p.chmod(0o644)


def start_draft(verifier_dir: Path, train_paths: list[Path], out_dir: Path) -> dict[str, str]:
    """The draft training starts from, in the speculators layout: specfmt's EAGLE-3 initialisation
    (``Eagle3.new_draft``: ``d2t``/``t2d`` from the training data, ``lm_head`` from the verifier's
    rows) on the speculators config, then every tensor the Llama world's EAGLE-3 draft has (read
    with ``specfmt``'s eagle3 converter; same shapes, same corpus, hence the same ``d2t``/``t2d``),
    plus the verifier's embedding (``embed_tokens.weight``). Returns where each tensor came from."""
    from specfmt.algorithms import get
    from specfmt.convert import load_draft
    from specfmt.training.data import read_documents
    from specfmt.sources.verifier import Verifier

    verifier = Verifier.load(str(verifier_dir))
    docs = read_documents([str(p) for p in train_paths], verifier.tokenizer())
    N = verifier.info.num_hidden_layers
    cfg = speculators_config(verifier_dir, [2, N // 2, N - 3], mw.DRAFT_VOCAB)
    torch.manual_seed(mw.SEED + 5)
    tensors, _ = get("eagle3").new_draft(cfg, verifier, docs.ids)
    llama = load_draft(str(LLAMA_DRAFT), source_format="eagle3", verifier=verifier).tensors
    assert torch.equal(llama["d2t"], tensors["d2t"]) and torch.equal(llama["t2d"], tensors["t2d"])
    origin = {}
    for name in sorted(tensors):
        if name in llama:
            assert llama[name].shape == tensors[name].shape, name
            tensors[name] = llama[name].float() if llama[name].is_floating_point() else llama[name]
        origin[name] = "Llama world draft" if name in llama else "new (norm = 1)"
    tensors["embed_tokens.weight"] = verifier.embedding().float()
    origin["embed_tokens.weight"] = "verifier embedding"
    save_speculators(cfg, tensors, out_dir)
    return origin


def make_draft(out: Path, train_paths: list[Path], steps: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        origin = start_draft(out / "verifier", train_paths, tmp / "init")
        print("draft start:", {n: o for n, o in origin.items() if o != "Llama world draft"})
        cfg = json.loads((tmp / "init" / "config.json").read_text())
        stats, t = mw.train_draft("eagle3", tmp / "trained", out / "verifier", train_paths, steps, init=str(tmp / "init"))
    save_speculators(cfg, t, out / DRAFT_DIR)
    stats["start"] = origin
    stats["heldout"] = mw.heldout_acceptance(out, DRAFT_DIR, "speculators")  # convert --from speculators, reference run
    return stats


# --------------------------------------------------------------------------- the P-EAGLE draft (issue 25)

PEAGLE_DIR = "peagle-speculators"
#: the source of speculators 0.9.0's ``models/peagle/config.py`` (``PEagleSpeculatorConfig``), which its
#: ``save_pretrained`` copies next to a P-EAGLE config.json; vendored so the world builds offline
SPECULATORS_PEAGLE_CONFIG_PY = HERE / "vendor" / "speculators-0.9.0-peagle-config.py"
SPECULATORS_DFLASH_CONFIG_PY = HERE / "vendor" / "speculators-0.9.0-dflash-config.py"
PEAGLE_MASK_TOKEN = mw.PAD_ID    # a token the corpus never holds: the parallel positions' input (vLLM's pard_token)
PEAGLE_K = 3                     # depths trained and served: the verified pass and k-1 = 2 mask positions
PEAGLE_STEPS = 600
PEAGLE_CHUNKS = 512              # training windows of PEAGLE_SEQ tokens, the verifier's states computed once
PEAGLE_SEQ = 128
PEAGLE_BATCH = 8
PEAGLE_LR = 1e-3


def peagle_config(eagle3_cfg: dict) -> dict:
    """config.json of a P-EAGLE draft as speculators 0.9.0 writes it (``PEagleSpeculatorConfig(Eagle3SpeculatorConfig)``,
    ``models/peagle/config.py``): the EAGLE-3 draft's fields, ``speculators_model_type`` / ``algorithm`` ``peagle``,
    ``architectures`` ``["PEagleDraftModel"]`` (the class that saves it, as ``Eagle3DraftModel`` for EAGLE-3), ``mask_token_id``, and its default ``embed_requires_grad: true``."""
    cfg = json.loads(json.dumps(eagle3_cfg))
    cfg.update(architectures=["PEagleDraftModel"], auto_map={"": "config.PEagleSpeculatorConfig"}, embed_requires_grad=True,
               mask_token_id=PEAGLE_MASK_TOKEN, speculators_model_type="peagle")
    cfg["speculators_config"]["algorithm"] = "peagle"
    return cfg


def peagle_mask(T: int, k: int) -> torch.Tensor:
    """[S, S] attention (True = attend), S = T + T·(k-1): T verified positions (causal), then for each anchor a
    its k-1 mask positions (depth d = 1..k-1), which see the verified positions <= a and the depths <= d of
    their own anchor -- speculators' ``create_peagle_mask_mod`` (``models/peagle/attention.py``), which is what
    vLLM's parallel drafting computes at the last verified position (k-1 ``pard_token`` slots appended)."""
    m = k - 1
    S = T + T * m
    anchor = torch.cat([torch.arange(T), torch.arange(T).repeat_interleave(m)])
    depth = torch.cat([torch.zeros(T, dtype=torch.long), torch.arange(1, k).repeat(T)])
    verified = torch.arange(S) < T
    q_a, k_a, q_d, k_d = anchor[:, None], anchor[None, :], depth[:, None], depth[None, :]
    sees_verified = verified[None, :] & (k_a <= q_a)
    sees_own = ~verified[None, :] & ~verified[:, None] & (k_a == q_a) & (k_d <= q_d)
    return sees_verified | sees_own


def _peagle_data(verifier_dir: Path, train: dict, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(ids [C, L], aux [C, L, n_aux·H], labels [C, L])`` for PEAGLE_CHUNKS windows of the training text (seeded),
    the verifier's tap states and its greedy token at each position as a draft-vocabulary id (-100 outside it)."""
    cfg = json.loads((verifier_dir.parent / DRAFT_DIR / "config.json").read_text())
    ids, aux, greedy = _verifier_windows(verifier_dir, train, cfg["eagle_aux_hidden_state_layer_ids"])
    to_draft = torch.full((len(_vocab(verifier_dir)),), -100, dtype=torch.long)
    to_draft[targets] = torch.arange(len(targets))
    return ids, aux, to_draft[greedy]


def _vocab(verifier_dir: Path) -> range:
    return range(json.loads((verifier_dir / "config.json").read_text())["vocab_size"])


def _verifier_windows(verifier_dir: Path, train: dict, taps: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(ids [C, L], aux [C, L, n_aux·H], greedy [C, L])``: PEAGLE_CHUNKS windows of PEAGLE_SEQ tokens of the training
    text (seeded), the verifier's states at ``taps`` (HF ``hidden_states`` ids) and its greedy token after each position."""
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    tok = Tokenizer.from_file(str(verifier_dir / "tokenizer.json"))
    stream = torch.tensor([t for d in mw.encode_docs(tok, train) for t in d])
    g = torch.Generator().manual_seed(mw.SEED + 25)
    starts = torch.randint(0, len(stream) - PEAGLE_SEQ, (PEAGLE_CHUNKS,), generator=g)
    ids = torch.stack([stream[s:s + PEAGLE_SEQ] for s in starts.tolist()])
    verifier = AutoModelForCausalLM.from_pretrained(str(verifier_dir), dtype=torch.float32).eval()
    aux, greedy = [], []
    with torch.no_grad():
        for row in ids.split(8):
            out = verifier(row, output_hidden_states=True)
            aux.append(torch.cat([out.hidden_states[t] for t in taps], dim=-1))
            greedy.append(out.logits.argmax(-1))
    return ids, torch.cat(aux), torch.cat(greedy)


def fit_peagle(cfg: dict, tensors: dict, verifier_dir: Path, train: dict, steps: int) -> tuple[dict, dict]:
    """Train the P-EAGLE draft's parallel positions: start from the world's EAGLE-3 draft, ``mask_hidden`` at the mean
    tap state of the training windows, then ``steps`` AdamW steps (lr PEAGLE_LR, cosine) of cross-entropy against
    the frozen verifier's greedy tokens at every verified position (depth 0: the token after next) and at each mask
    position (depth d at anchor a: the token a+d+2), one pass per window under :func:`peagle_mask`, every draft
    tensor trained but the embedding (the verifier's). specfmt's module (``specfmt.algorithms.peagle_nn``) runs it.
    Returns ``(figures, tensors)``."""
    from specfmt.algorithms import get

    t0 = time.time()
    width = len(cfg["eagle_aux_hidden_state_layer_ids"]) * cfg["transformer_layer_config"]["hidden_size"]
    draft = get("peagle").module(cfg, {**{n: t.clone() for n, t in tensors.items()}, "mask_hidden": torch.zeros(1, 1, width)})
    embed = tensors["embed_tokens.weight"]
    ids, aux, labels = _peagle_data(verifier_dir, train, draft.target_ids())
    with torch.no_grad():
        draft.mask_hidden.copy_(aux.mean(dim=(0, 1)).reshape(1, 1, -1))
    T, m = PEAGLE_SEQ - 1, PEAGLE_K - 1
    mask, positions = peagle_mask(T, PEAGLE_K), torch.cat([torch.arange(T), (torch.arange(T)[:, None] + torch.arange(1, PEAGLE_K)).flatten()])
    # targets: verified position i -> the verifier's token at i+1; anchor a, depth d -> at a+1+d (beyond the window: none)
    at = torch.cat([torch.arange(T) + 1, (torch.arange(T)[:, None] + 1 + torch.arange(1, PEAGLE_K)).flatten()])
    inside = at < PEAGLE_SEQ
    depth = torch.cat([torch.zeros(T, dtype=torch.long), torch.arange(1, PEAGLE_K).repeat(T)])
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=PEAGLE_LR, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * s / steps)))
    g = torch.Generator().manual_seed(mw.SEED + 26)
    hits = torch.zeros(PEAGLE_K)
    seen = torch.zeros(PEAGLE_K)
    for step in range(steps):
        rows = torch.randint(0, PEAGLE_CHUNKS, (PEAGLE_BATCH,), generator=g)
        tok_in = torch.cat([ids[rows, 1:], torch.full((PEAGLE_BATCH, T * m), PEAGLE_MASK_TOKEN)], dim=1)
        hidden = torch.cat([draft.combine(aux[rows, :T]), draft.mask_features().expand(PEAGLE_BATCH, T * m, -1)], dim=1)
        logits, _, _ = draft(embed[tok_in], hidden, positions, mask=mask)
        y = torch.where(inside, labels[rows][:, at.clamp(max=PEAGLE_SEQ - 1)], -100)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step >= steps - 50:
            ok = (logits.argmax(-1) == y) & (y >= 0)
            for d in range(PEAGLE_K):
                hits[d] += ok[:, depth == d].sum()
                seen[d] += (y[:, depth == d] >= 0).sum()
        if step % 50 == 0 or step == steps - 1:
            print(f"peagle step {step}: loss {loss.item():.3f}")
    out = {n: t.detach().clone() for n, t in draft.state_dict().items()}
    out["embed_tokens.weight"] = embed
    print("peagle accuracy per depth (last 50 steps):", (hits / seen.clamp(min=1)).tolist())
    return {"steps": steps, "windows": PEAGLE_CHUNKS, "window": PEAGLE_SEQ, "batch": PEAGLE_BATCH, "lr": PEAGLE_LR,
            "seconds": round(time.time() - t0), "accuracy": [round(x, 3) for x in (hits / seen.clamp(min=1)).tolist()]}, out


def save_peagle(cfg: dict, tensors: dict, out_dir: Path) -> None:
    """As speculators 0.9.0's ``PEagleDraftModel.save_pretrained``: :func:`save_speculators` with the P-EAGLE config class's source."""
    save_speculators(cfg, tensors, out_dir, config_py=SPECULATORS_PEAGLE_CONFIG_PY)


def make_peagle(out: Path, train: dict, steps: int) -> dict:
    """The P-EAGLE draft ``OUT/peagle-speculators`` from ``OUT/eagle3-speculators`` (left as it is), and its held-out figures."""
    from safetensors.torch import load_file

    eagle3 = json.loads((out / DRAFT_DIR / "config.json").read_text())
    cfg = peagle_config(eagle3)
    tensors = load_file(str(out / DRAFT_DIR / "model.safetensors"))
    stats, trained = fit_peagle(cfg, tensors, out / "verifier", train, steps)
    shutil.rmtree(out / PEAGLE_DIR, ignore_errors=True)
    save_peagle(cfg, trained, out / PEAGLE_DIR)
    stats["mask_token_id"] = PEAGLE_MASK_TOKEN
    stats["heldout"] = mw.heldout_acceptance(out, PEAGLE_DIR, "speculators")
    return stats


# --------------------------------------------------------------------------- the DFlash draft (issue 25)

DFLASH_DIR = "dflash-speculators"
DFLASH_BLOCK = 4                 # the anchor and 3 mask slots: k = 3, as the other drafts
DFLASH_TAPS = [2, 4, 6]          # HF hidden_states ids (vLLM reads the output of layer id - 1)
DFLASH_STEPS = 1000              # specfmt train dflash (issue 38); the plain loop below was 400 steps
DFLASH_LR = 3e-3                 # the plain loop's (fit_dflash); specfmt train dflash: DFLASH_TRAIN_LR
DFLASH_TRAIN_LR = 2e-2           # with Muon on the matrices (as speculators trains DFlash; specfmt train dflash --optimizer muon)
DFLASH_BATCH, DFLASH_SEQ = 8, 256  # the EAGLE-3 drafts' budget per step (DRAFT_BATCH x DRAFT_SEQ)


def dflash_config(verifier_dir: Path) -> dict:
    """config.json of a DFlash draft as speculators 0.9.0 writes it (``DFlashSpeculatorConfig``, ``models/dflash/config.py``;
    ``architectures`` the class that saves it): one Qwen3 layer of the verifier's shapes (full attention: DFlash's block
    sees itself both ways), the full vocabulary (the verifier's ``lm_head``; nothing of it saved), block DFLASH_BLOCK."""
    from transformers import AutoConfig, Qwen3Config

    v = AutoConfig.from_pretrained(verifier_dir)
    layer = Qwen3Config(
        vocab_size=v.vocab_size, hidden_size=v.hidden_size, intermediate_size=v.intermediate_size, num_hidden_layers=1,
        num_attention_heads=v.num_attention_heads, num_key_value_heads=v.num_key_value_heads, hidden_act="silu",
        max_position_embeddings=v.max_position_embeddings, initializer_range=v.initializer_range, rms_norm_eps=v.rms_norm_eps,
        head_dim=v.head_dim, tie_word_embeddings=False)
    layer.rope_parameters = dict(v.rope_parameters)
    tlc = layer.to_diff_dict()
    tlc.pop("transformers_version")
    return {
        "architectures": ["DFlashDraftModel"], "auto_map": {"": "config.DFlashSpeculatorConfig"},
        "aux_hidden_state_layer_ids": DFLASH_TAPS, "block_size": DFLASH_BLOCK, "draft_vocab_size": v.vocab_size, "dtype": "float32",
        "mask_token_id": PEAGLE_MASK_TOKEN, "sample_from_anchor": False, "sliding_window_non_causal": True,
        "speculators_config": {
            "algorithm": "dflash", "default_proposal_method": "greedy",
            "proposal_methods": [{"accept_tolerance": 0.0, "proposal_type": "greedy", "speculative_tokens": DFLASH_BLOCK - 1, "verifier_accept_k": 1}],
            "verifier": {"architectures": ["Qwen3ForCausalLM"], "name_or_path": "../verifier"},
        },
        "speculators_model_type": "dflash", "speculators_version": SPECULATORS_VERSION, "target_hidden_size": None,
        "tie_word_embeddings": False, "transformer_layer_config": tlc, "transformers_version": TRANSFORMERS_VERSION,
    }


def dflash_mask(L: int, anchors: torch.Tensor, B: int) -> torch.Tensor:
    """[n·B, L + n·B] attention (True = attend) of n blocks over a window's L context positions and the blocks: block p
    sees the context positions before p and its own B positions, both ways -- speculators' ``create_anchor_block_mask_mod``
    (``models/dflash/attention.py``), one block per anchor as vLLM's ``DFlashProposer`` runs it."""
    n = len(anchors)
    q_anchor = anchors.repeat_interleave(B)
    sees_context = torch.arange(L)[None, :] < q_anchor[:, None]
    sees_block = torch.arange(n).repeat_interleave(B)[:, None] == torch.arange(n).repeat_interleave(B)[None, :]
    return torch.cat([sees_context, sees_block], dim=1)


def fit_dflash(cfg: dict, verifier_dir: Path, train: dict, steps: int) -> tuple[dict, dict]:
    """Train the DFlash draft from its initialisation (normal(0, 0.02), norms 1; seeded) with specfmt's module
    (``specfmt.algorithms.dflash_nn.DFlashDraft``, the reference's layers): per step, PEAGLE_BATCH windows of the
    training text, every anchor p >= 1 of each in one pass under :func:`dflash_mask` (context: the positions before p;
    block: token p and the mask token at p+1..p+B-1, non-causal), cross-entropy of slot j against the frozen verifier's
    greedy token after position p+j-1; the verifier's embedding and ``lm_head``, frozen. AdamW lr DFLASH_LR, cosine.
    Returns ``(figures, tensors)``."""
    from safetensors.torch import load_file

    from specfmt.algorithms import get

    t0 = time.time()
    torch.manual_seed(mw.SEED + 27)
    draft = get("dflash").module(cfg)
    with torch.no_grad():
        for n, p in draft.named_parameters():
            p.copy_(torch.ones_like(p) if n.endswith("norm.weight") else 0.02 * torch.randn_like(p))
    vt = load_file(str(verifier_dir / "model.safetensors"))
    embed, head = vt["model.embed_tokens.weight"], vt["lm_head.weight"]
    ids, aux, greedy = _verifier_windows(verifier_dir, train, DFLASH_TAPS)
    B, L = DFLASH_BLOCK, PEAGLE_SEQ
    opt = torch.optim.AdamW(draft.parameters(), lr=DFLASH_LR, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * s / steps)))
    g = torch.Generator().manual_seed(mw.SEED + 28)
    hits, seen = torch.zeros(B - 1), torch.zeros(B - 1)
    P = torch.arange(1, L - B + 1)  # every anchor with a context: blocks at p .. p+B-1, all in one pass
    mask, block_pos = dflash_mask(L, P, B), (P[:, None] + torch.arange(B)).flatten()
    key_pos = torch.cat([torch.arange(L), block_pos])
    slot = torch.arange(B).repeat(len(P))
    target_at = (P[:, None] + torch.arange(B) - 1).flatten()  # slot j >= 1 of anchor p: the verifier's token after p+j-1
    for step in range(steps):
        rows = torch.randint(0, PEAGLE_CHUNKS, (PEAGLE_BATCH,), generator=g)
        tok = torch.where(slot == 0, ids[rows][:, (P[:, None] + 0 * torch.arange(B)).flatten()], PEAGLE_MASK_TOKEN)
        x, context = embed[tok], draft.context(aux[rows])
        for layer in draft.layers:  # DFlashDraft.forward with every anchor's block in one pass (its _block_attend, this mask)
            x = x + draft._block_attend(layer.self_attn, layer.input_layernorm(x), context, block_pos, key_pos, mask)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        logits = draft.logits(draft.norm(x[:, slot > 0]), head)
        y = greedy[rows][:, target_at[slot > 0]]
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step >= steps - 50:
            ok = (logits.argmax(-1) == y).view(PEAGLE_BATCH, len(P), B - 1)
            hits += ok.sum((0, 1))
            seen += ok.shape[0] * ok.shape[1]
        if step % 50 == 0 or step == steps - 1:
            print(f"dflash step {step}: loss {loss.item():.3f}")
    print("dflash accuracy per slot (last 50 steps):", (hits / seen).tolist())
    out = {n: t.detach().clone() for n, t in draft.state_dict().items()}
    return {"steps": steps, "windows": PEAGLE_CHUNKS, "window": L, "batch": PEAGLE_BATCH, "anchors": len(P), "lr": DFLASH_LR,
            "seconds": round(time.time() - t0), "accuracy": [round(x, 3) for x in (hits / seen).tolist()]}, out


def train_dflash(cfg: dict, verifier_dir: Path, train: dict, steps: int) -> tuple[dict, dict]:
    """Train the DFlash draft with ``specfmt train dflash`` (``train_draft``; speculators 0.9's objective: 512 anchors per step,
    D-PACE weights, cross-entropy) over the world's training files, DFLASH_BATCH x DFLASH_SEQ tokens per step, the shape of
    ``cfg`` (block DFLASH_BLOCK, one Qwen3 layer, taps DFLASH_TAPS, mask token PEAGLE_MASK_TOKEN, its non-causal block: the
    shipped draft predates ``--block-mask causal``'s default), lr DFLASH_TRAIN_LR, the trainer's defaults otherwise.
    Returns ``(figures, tensors)``."""
    import tempfile

    from safetensors.torch import load_file

    from specfmt.training.loop import TrainOptions
    from specfmt.training.pipeline import TrainRequest, train_draft

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    with tempfile.TemporaryDirectory() as tmp:
        req = TrainRequest(out=str(Path(tmp) / "dflash"), verifier=str(verifier_dir), algorithm="dflash", data=[str(stdlib / n) for n in sorted(train)],
                           device="cpu", validate=False, block_size=cfg["block_size"], layers=cfg["transformer_layer_config"]["num_hidden_layers"],
                           taps=cfg["aux_hidden_state_layer_ids"], mask_token=cfg["mask_token_id"], block_mask="non-causal")
        opts = TrainOptions(steps=steps, batch_size=DFLASH_BATCH, seq_len=DFLASH_SEQ, lr=DFLASH_TRAIN_LR, optimizer="muon", seed=mw.SEED,
                            save_every=0)
        res = train_draft(req, opts, log=lambda step, loss, acc: print(f"dflash step {step}: loss {loss:.3f}") if step % 100 == 0 else None)
        tensors = load_file(str(Path(tmp) / "dflash" / "model.safetensors"))
    s = res.stats
    figures = {"trainer": "specfmt train dflash", "steps": steps, "batch": DFLASH_BATCH, "window": DFLASH_SEQ, "lr": DFLASH_TRAIN_LR,
               "optimizer": opts.optimizer, "seconds": round(s.seconds), "accuracy": [round(a, 3) for a in s.accuracy]}
    if s.kept is not None:
        figures["kept"] = s.kept.to_json()
    return figures, {n: t for n, t in tensors.items() if n in {k for k in get_dflash_names(cfg)}}


def get_dflash_names(cfg: dict) -> set[str]:
    """The tensors speculators saves for ``cfg`` (the module's state dict: no embedding, no lm_head at the full vocabulary)."""
    from specfmt.algorithms import get

    return set(get("dflash").module(cfg).state_dict())


def make_dflash(out: Path, train: dict, steps: int, plain: bool = False) -> dict:
    """The DFlash draft ``OUT/dflash-speculators`` (saved as speculators 0.9.0's ``DFlashDraftModel.save_pretrained``: no
    ``embed_tokens``, no ``lm_head`` at the full vocabulary) and its held-out figures: trained by ``specfmt train dflash``
    (:func:`train_dflash`), or by the plain loop of issue 25 (:func:`fit_dflash`, ``plain``)."""
    cfg = dflash_config(out / "verifier")
    stats, trained = fit_dflash(cfg, out / "verifier", train, steps) if plain else train_dflash(cfg, out / "verifier", train, steps)
    shutil.rmtree(out / DFLASH_DIR, ignore_errors=True)
    save_speculators(cfg, trained, out / DFLASH_DIR, config_py=SPECULATORS_DFLASH_CONFIG_PY)
    stats["mask_token_id"] = PEAGLE_MASK_TOKEN
    stats["heldout"] = mw.heldout_acceptance(out, DFLASH_DIR, "speculators")
    return stats


def record_validation(out: Path, validation: Path, key: str = "validate_run") -> None:
    """Copy the figures of a ``specfmt validate OUT --run`` (its ``validation.json``, vLLM run
    included) into ``world.json`` under ``key`` (``validate_run``; the P-EAGLE draft's: ``peagle_validate_run``)."""
    v = json.loads(validation.read_text())
    keep = ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "accepted_per_position", "acceptance_rate_per_position",
            "mean_acceptance_length", "engine", "device", "dtype")
    manifest = json.loads((out / MANIFEST).read_text())
    manifest[key] = {
        "k": v.get("num_speculative_tokens"), "max_tokens": v.get("max_tokens"), "prompts": (v.get("prompts") or {}).get("count"),
        "passed": v.get("passed"),
        "checks": {c["name"]: c["status"] for c in v["checks"]},
        "reference": {k: x for k, x in (v.get("reference") or {}).items() if k in keep},
        "vllm": {k: x for k, x in (v.get("vllm") or {}).items() if k in keep or k in ("method", "draft_class", "form", "command", "parallel_drafting")},
        "variants": v.get("variants"),
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


def write_readme(out: Path, manifest: dict) -> None:
    v, d = manifest["verifier"], manifest["draft"]
    h = d["heldout"]
    size = {name: mw.dir_size(out / name) for name in ("verifier", DRAFT_DIR)}
    mb = lambda n: f"{n / 1e6:.2f} MB"  # noqa: E731
    fmt = lambda xs: ", ".join(f"{x:.3f}" for x in xs)  # noqa: E731
    tensors = sorted(json.loads((out / DRAFT_DIR / "model.safetensors").read_bytes()[8:8 + int.from_bytes(
        (out / DRAFT_DIR / "model.safetensors").read_bytes()[:8], "little")]))
    tensors = [t for t in tensors if t != "__metadata__"]
    cfg = json.loads((out / DRAFT_DIR / "config.json").read_text())
    run = manifest.get("validate_run")
    if run:
        ref, vl = run["reference"], run["vllm"]
        gaps = [abs(a - b) for a, b in zip(ref["acceptance_rate_per_position"], vl["acceptance_rate_per_position"])]
        run_text = f"""`specfmt convert --from auto` then `specfmt validate OUT --run` ({run['prompts']} held-out prompts x
{run['max_tokens']} tokens, k = {run['k']}); vLLM started as `vllm serve OUT` with no speculative flags
(it attaches the draft as `Eagle3Qwen3ForCausalLM`):

| | reference ({ref.get('engine', 'transformers')}, {ref.get('dtype')}) | {vl.get('engine', 'vLLM')} CPU ({vl.get('dtype')}) |
|---|---|---|
| mean acceptance length | **{ref['mean_acceptance_length']:.3f}** | **{vl['mean_acceptance_length']:.3f}** |
| acceptance rate per position | {fmt(ref['acceptance_rate_per_position'])} | {fmt(vl['acceptance_rate_per_position'])} |
| drafts | {ref['num_drafts']} | {vl['num_drafts']} |

Largest per-position gap {max(gaps):.3f} (tolerance 0.1). Checks: {', '.join(f'{k} {x}' for k, x in run['checks'].items())}.
Misreadings tried by the reference: {'; '.join(f"{x['reading']} -> {x['mean_acceptance_length']:.3f}" for x in run['variants'] or [])}."""
    else:
        run_text = "Not recorded yet: run `examples/quickstart-qwen3.sh`, then `python examples/make_world_qwen3.py --record OUT/validation.json`."
    text = f"""# specfmt example world: Qwen3

The second model family of the example world (issue #18): a small Qwen3 verifier and an
EAGLE-3 draft with a Qwen3 decoder layer (q/k RMSNorm per head, speculators 0.9's
default draft layer), saved exactly as speculators 0.9 writes it. Run it end to end
(convert, validate against vLLM, serve) with:

    examples/quickstart-qwen3.sh

Regenerate it (seeded, CPU, {THREADS} thread) with:

    python examples/make_world_qwen3.py            # --steps {manifest['verifier_steps']} --draft-steps {d['steps']}
    python examples/make_world_qwen3.py --drafts-only   # keep the verifier; retrain the draft

It reuses `examples/make_world.py`'s corpus (the Python standard library's source), held-out
prompts, tokenizer and trainers. Generated with Python {'.'.join(map(str, sys.version_info[:3]))}, torch {torch.__version__}.

## Contents

| path | what | size |
|---|---|---|
| `verifier/` | `Qwen3ForCausalLM` + the shipped world's byte-level BPE tokenizer | {mb(size['verifier'])} |
| `{DRAFT_DIR}/` | EAGLE-3 draft, one Qwen3 decoder layer, speculators 0.9 layout | {mb(size[DRAFT_DIR])} |
| `prompts.jsonl` | the {sum(1 for _ in open(out / 'prompts.jsonl'))} held-out prompts of `examples/world` | {(out / 'prompts.jsonl').stat().st_size / 1e3:.1f} kB |
| `world.json` | the figures below, as the generator measured them | |

Whole world: {mb(mw.dir_size(out))} (limit 15 MB).

### `verifier/`

* `Qwen3ForCausalLM`, float32 `model.safetensors`, {v['params']:,} parameters: the Llama
  world's shapes (vocab {mw.VOCAB}, hidden {mw.HIDDEN}, intermediate {mw.INTERMEDIATE}, {mw.N_LAYERS} layers,
  {mw.N_HEADS} heads / {mw.N_KV_HEADS} KV heads, head_dim {mw.HEAD_DIM}) with Qwen3's per-head q/k RMSNorm
  (`self_attn.{{q,k}}_norm.weight` [{mw.HEAD_DIM}]) and rms_norm_eps {RMS_EPS:g}.
* Started from the Llama world's verifier weights (same names and shapes; the 16 q/k norms
  start at 1), then trained {manifest['verifier_steps']} steps (AdamW, peak lr {manifest.get('verifier_lr', VERIFIER_LR):g}, warmup + cosine,
  batch {mw.BATCH} x {mw.SEQ_LEN} tokens) on the same {len(mw.TRAIN_FILES)} stdlib modules, {v['train_seconds']:.0f} s.
  A warm start, because the 2-core machine it was built on was shared by four jobs: a
  verifier step took 1.2-2.3 s on one thread (13.5 s on two) against the Llama world's 0.26 s.
* Losses (nats/token): train **{v['train_loss']:.3f}**, held-out **{v['heldout_loss']:.3f}**.

### `{DRAFT_DIR}/`

What speculators 0.9.0's `Eagle3DraftModel.save_pretrained` writes (compared field by field
and tensor by tensor with drafts speculators 0.9.0 itself saved, and loaded back by it):

* `config.json`: `Eagle3SpeculatorConfig` (`speculators_model_type: eagle3`,
  `speculators_version: {cfg['speculators_version']}`, `architectures: ["Eagle3DraftModel"]`,
  `auto_map: {{"": "config.Eagle3SpeculatorConfig"}}`), keys sorted; `transformer_layer_config`
  is a `Qwen3Config` diff dict as `speculators train --draft-arch qwen3` builds it (sliding window
  {SLIDING_WINDOW} on its one layer, `layer_types: ["sliding_attention"]`); taps
  `eagle_aux_hidden_state_layer_ids: {cfg['eagle_aux_hidden_state_layer_ids']}`, `draft_vocab_size: {cfg['draft_vocab_size']}`,
  `norm_before_residual / norm_before_fc / norm_output: {str(cfg['norm_before_residual']).lower()} / {str(cfg['norm_before_fc']).lower()} / {str(cfg['norm_output']).lower()}`
  (the EAGLE-3 reference forward pass; `speculators train --no-norm-before-residual
  --no-input-norm --no-norm-output`), the verifier as `../verifier`.
* `config.py`: the source of speculators' `models/eagle3/config.py` (vendored in
  `examples/vendor/`), which `save_pretrained` copies next to every config.
* `model.safetensors` (float32, metadata `{{"format": "pt"}}`): {', '.join(f'`{t}`' for t in tensors)}.
  `embed_tokens.weight` is the verifier's embedding (speculators saves it; it is frozen).
* Training (`specfmt.training.pipeline.train_draft`, what `specfmt train eagle3 --init` runs):
  started from the Llama world's EAGLE-3 draft (its tensors, read by specfmt's eagle3
  converter; the q/k norms at 1), then {d['steps']} steps of {mw.DRAFT_BATCH} x {mw.DRAFT_SEQ} tokens,
  AdamW lr {mw.DRAFT_LR:g}, training-time test over 3 steps, {d['seconds']} s; top-1 agreement with the
  verifier over the last 50 steps, per position: {fmt(d['accuracy'])}.
* Held-out reference run (`specfmt convert --from speculators`, float32, k = 3, 32 tokens per
  prompt): mean acceptance length **{h['mean_acceptance_length']:.3f}**, acceptance rate per position
  {fmt(h['acceptance_rate_per_position'])} ({h['num_drafts']} drafts).

## In vLLM

{run_text}
"""
    (out / "README.md").write_text(text + peagle_readme(out, manifest) + dflash_readme(manifest))


def peagle_readme(out: Path, manifest: dict) -> str:
    """The README's P-EAGLE section ("" before ``--peagle`` has built the draft)."""
    p = manifest.get("peagle")
    if not p:
        return ""
    fmt = lambda xs: ", ".join(f"{x:.3f}" for x in xs)  # noqa: E731
    h, e3 = p["heldout"], manifest["draft"]["heldout"]
    run = manifest.get("peagle_validate_run")
    if run:
        ref, vl = run["reference"], run["vllm"]
        gaps = [abs(a - b) for a, b in zip(ref["acceptance_rate_per_position"], vl["acceptance_rate_per_position"])]
        served = f"""`specfmt validate {PEAGLE_DIR}-converted --run` ({run['prompts']} held-out prompts x {run['max_tokens']} tokens, k = {run['k']});
vLLM started as `vllm serve OUT` ({vl.get('form')} form) read the config as `PeagleQwen3ForCausalLM` (its registry
builds `{vl.get('draft_class')}`), method `{vl.get('method')}`, `parallel_drafting: {str(vl.get('parallel_drafting', False)).lower()}`:

| | reference ({ref.get('dtype')}) | {vl.get('engine', 'vLLM')} CPU ({vl.get('dtype')}) |
|---|---|---|
| mean acceptance length | **{ref['mean_acceptance_length']:.3f}** | **{vl['mean_acceptance_length']:.3f}** |
| acceptance rate per position | {fmt(ref['acceptance_rate_per_position'])} | {fmt(vl['acceptance_rate_per_position'])} |
| drafts | {ref['num_drafts']} | {vl['num_drafts']} |

Largest per-position gap {max(gaps):.3f} (tolerance 0.1). Checks: {', '.join(f'{k} {x}' for k, x in run['checks'].items())}.
Readings tried by the reference: {'; '.join(f"{x['reading']} -> {x['mean_acceptance_length']:.3f}" for x in run['variants'] or [])}."""
    else:
        served = "Not recorded yet: `specfmt validate OUT --run` on the converted draft, then `python examples/make_world_qwen3.py --record-peagle OUT/validation.json`."
    return f"""
## `{PEAGLE_DIR}/`: a P-EAGLE draft (issue 25)

Built with `python examples/make_world_qwen3.py --peagle` (the verifier and `{DRAFT_DIR}/` are kept as they are).

* Saved as speculators 0.9.0's `PEagleDraftModel.save_pretrained` writes it: `config.json` is the EAGLE-3
  draft's with `speculators_model_type: peagle`, `architectures: ["PEagleDraftModel"]`,
  `auto_map: {{"": "config.PEagleSpeculatorConfig"}}`, `embed_requires_grad: true` (its default) and
  `mask_token_id: {p['mask_token_id']}` (the `<|pad|>` token, which the corpus never holds; vLLM's `pard_token`);
  `config.py` is speculators' `models/peagle/config.py` (vendored in `examples/vendor/`); `model.safetensors`
  holds the EAGLE-3 tensors and `mask_hidden` [1, 1, 384].
* Not trained by speculators' trainer (it reads hidden states that a vLLM server generates,
  `speculators/data_generation/vllm_client.py`, and sets its device to `cuda` when no accelerator is present,
  `train/trainer.py`). Trained here instead with specfmt's P-EAGLE module (`specfmt.algorithms.peagle_nn`):
  started from `{DRAFT_DIR}/`, `mask_hidden` at the mean tap state, then {p['steps']} steps of {p['batch']} windows x
  {p['window']} tokens ({p['windows']} windows of the training text), AdamW lr {p['lr']:g}, cross-entropy against the
  frozen verifier's greedy tokens at every verified position and at the {PEAGLE_K - 1} mask positions of every
  anchor (speculators' COD mask, `models/peagle/attention.py`), {p['seconds']} s; top-1 agreement over the last 50
  steps per depth: {fmt(p['accuracy'])}.
* Held-out reference run (k = 3, 32 tokens per prompt, parallel drafting): mean acceptance length
  **{h['mean_acceptance_length']:.3f}**, per position {fmt(h['acceptance_rate_per_position'])} (the EAGLE-3 draft,
  drafting sequentially: {e3['mean_acceptance_length']:.3f}). P-EAGLE trades acceptance for one draft pass per step.

### In vLLM

{served}
"""


def dflash_readme(manifest: dict) -> str:
    """The README's DFlash section ("" before ``--dflash`` has built the draft)."""
    p = manifest.get("dflash")
    if not p:
        return ""
    fmt = lambda xs: ", ".join(f"{x:.3f}" for x in xs)  # noqa: E731
    h, run = p["heldout"], manifest.get("dflash_validate_run")
    served = "Not recorded yet: `python examples/make_world_qwen3.py --record-dflash OUT/validation.json`."
    if run:
        ref, vl = run["reference"], run["vllm"]
        gaps = [abs(a - b) for a, b in zip(ref["acceptance_rate_per_position"], vl["acceptance_rate_per_position"])]
        served = f"""`specfmt validate OUT --run` ({run['prompts']} held-out prompts x {run['max_tokens']} tokens, k = {run['k']}); vLLM started
as `vllm serve OUT` ({vl.get('form')} form) attached `{vl.get('draft_class')}`, method `{vl.get('method')}`:
reference (float32) mean acceptance length **{ref['mean_acceptance_length']:.3f}** (per position {fmt(ref['acceptance_rate_per_position'])}),
{vl.get('engine')} CPU ({vl.get('dtype')}) **{vl['mean_acceptance_length']:.3f}** (per position {fmt(vl['acceptance_rate_per_position'])});
largest per-position gap {max(gaps):.3f} (tolerance 0.1). Checks: {', '.join(f'{k} {x}' for k, x in run['checks'].items())}."""
    if p.get("trainer"):
        trained = (f"""Trained by `{p['trainer']}` (speculators 0.9's DFlash objective: anchor blocks, D-PACE weights, cross-entropy; issue
38) from a new draft over the world's training files: {p['steps']} steps of {p['batch']} windows x {p['window']} tokens, 512
anchors per step, {p['optimizer']} lr {p['lr']:g}, {p['seconds']} s; top-1 agreement over the last 50 steps per slot:
{fmt(p['accuracy'])}.""")
    else:
        trained = (f"""Trained from its initialisation with specfmt's DFlash module (`specfmt.algorithms.dflash_nn`): {p['steps']} steps of
{p['batch']} windows x {p['window']} tokens, every one of {p['anchors']} anchors per window in one pass (speculators' anchor-block
mask), AdamW lr {p['lr']:g}, {p['seconds']} s; top-1 agreement over the last 50 steps per slot: {fmt(p['accuracy'])}.""")
    old = manifest.get("dflash_plain_loop")
    plain_line = (f""" The plain loop of issue 25 (`--dflash-plain`: every anchor of 8 windows x 128 tokens, AdamW,
{old['steps']} steps) reached {old['heldout']['mean_acceptance_length']:.3f}.""" if old and p.get("trainer") else "")
    return f"""
## `{DFLASH_DIR}/`: a DFlash draft (issues 25, 38)

Built with `python examples/make_world_qwen3.py --dflash` (everything else is kept as it is). One Qwen3 layer of the
verifier's shapes drafting a block of {DFLASH_BLOCK} (the anchor and {DFLASH_BLOCK - 1} mask slots, non-causal) over the taps
`aux_hidden_state_layer_ids: {DFLASH_TAPS}` (vLLM reads the outputs of layers {[t - 1 for t in DFLASH_TAPS]}), mask token
{p['mask_token_id']}, the verifier's embedding and `lm_head` (full vocabulary: speculators saves neither). Saved as speculators
0.9.0's `DFlashDraftModel.save_pretrained` writes it (`config.py`: its `models/dflash/config.py`, vendored). {trained}
Held-out reference run (k = 3): mean acceptance length **{h['mean_acceptance_length']:.3f}**, per position
{fmt(h['acceptance_rate_per_position'])}.{plain_line}

### In vLLM

{served}
"""


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(HERE / "world-qwen3"), help="output folder (default: examples/world-qwen3)")
    ap.add_argument("--steps", type=int, default=VERIFIER_STEPS, help="verifier training steps")
    ap.add_argument("--draft-steps", type=int, default=DRAFT_STEPS, help="EAGLE-3 draft training steps")
    ap.add_argument("--drafts-only", action="store_true", help="keep the verifier and prompts in --out; retrain the draft")
    ap.add_argument("--record", metavar="VALIDATION_JSON", help="store the figures of a `specfmt validate OUT --run` "
                    "(OUT/validation.json) in world.json and rewrite README.md")
    ap.add_argument("--record-peagle", metavar="VALIDATION_JSON", help="as --record, for the P-EAGLE draft's validate --run")
    ap.add_argument("--record-dflash", metavar="VALIDATION_JSON", help="as --record, for the DFlash draft's validate --run")
    ap.add_argument("--readme-only", action="store_true", help="rewrite README.md from world.json")
    ap.add_argument("--peagle", action="store_true", help="keep the verifier and the EAGLE-3 draft in --out; (re)build the P-EAGLE draft")
    ap.add_argument("--dflash", action="store_true", help="keep the verifier and the other drafts in --out; (re)build the DFlash draft")
    ap.add_argument("--dflash-steps", type=int, default=DFLASH_STEPS, help="DFlash training steps")
    ap.add_argument("--dflash-plain", action="store_true", help="with --dflash: the plain loop of issue 25 (fit_dflash), not specfmt train dflash")
    ap.add_argument("--peagle-steps", type=int, default=PEAGLE_STEPS, help="P-EAGLE training steps")
    args = ap.parse_args(argv)

    t_start = time.time()
    mw.seed_everything()
    # One thread: on a shared 2-core machine two spinning threads per process measured 13.5 s per
    # verifier step against 1.2-2.3 s with one.
    torch.set_num_threads(THREADS)
    out = Path(args.out)
    if args.record or args.record_peagle or args.record_dflash or args.readme_only:
        if args.record_dflash:
            record_validation(out, Path(args.record_dflash), "dflash_validate_run")
        if args.record:
            record_validation(out, Path(args.record))
        if args.record_peagle:
            record_validation(out, Path(args.record_peagle), "peagle_validate_run")
        write_readme(out, json.loads((out / MANIFEST).read_text()))
        return
    train, heldout = mw.build_corpus()
    if args.dflash:
        manifest = json.loads((out / MANIFEST).read_text())
        manifest.pop("dflash_validate_run", None)  # measured on the previous DFlash draft
        if manifest.get("dflash", {}).get("trainer") is None and "dflash" in manifest:  # the plain loop's draft: kept for comparison
            manifest["dflash_plain_loop"] = manifest["dflash"]
        manifest["dflash"] = make_dflash(out, train, args.dflash_steps, plain=args.dflash_plain)
        (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        write_readme(out, manifest)
        return
    if args.peagle:
        manifest = json.loads((out / MANIFEST).read_text())
        manifest.pop("peagle_validate_run", None)  # measured on the previous P-EAGLE draft
        manifest["peagle"] = make_peagle(out, train, args.peagle_steps)
        (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        write_readme(out, manifest)
        return
    if args.drafts_only:
        manifest = json.loads((out / MANIFEST).read_text())
    else:
        if out.exists():
            shutil.rmtree(out)
        (out / "verifier").mkdir(parents=True)
        mw.write_prompts(out / "prompts.jsonl", mw.make_prompts(heldout))
        for name in TOKENIZER_FILES:
            shutil.copyfile(SHIPPED_TOKENIZER / name, out / "verifier" / name)
        from safetensors.torch import load_file
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(out / "verifier" / "tokenizer.json"))
        stats = mw.train_verifier(mw.encode_docs(tok, train), mw.encode_docs(tok, heldout), args.steps, out / "verifier",
                                  cfg=verifier_config(), init=load_file(str(LLAMA_VERIFIER)), lr=VERIFIER_LR)
        manifest = {"verifier_steps": args.steps, "verifier_lr": VERIFIER_LR, "verifier": {k: v for k, v in stats.items() if k != "embed"}}
        (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    train_paths = [stdlib / n for n in sorted(train)]
    shutil.rmtree(out / DRAFT_DIR, ignore_errors=True)
    manifest.pop("validate_run", None)  # measured on the previous draft
    manifest["draft"] = make_draft(out, train_paths, args.draft_steps)
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    write_readme(out, manifest)
    print(f"wrote {out} ({mw.dir_size(out) / 1e6:.2f} MB) in {time.time() - t_start:.0f}s")


if __name__ == "__main__":
    main()
