"""The example world's draft-model pairs as the tests use them (issue 36).

* :func:`fixed`: the world's ``draft-lm-padded`` after ``specfmt pad-vocab`` (the verifier's 2048 rows), made once
  per session into a cache folder;
* :func:`permuted`: that draft with its ids permuted consistently -- the tokenizer's token -> id map, the embedding
  rows, the output-head rows and the special-token ids move together -- so that it is the same model in another id
  space: the same vocabulary size as the verifier, another tokenizer.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from conftest import WORLD

PADDED, BPE = WORLD / "draft-lm-padded", WORLD / "draft-lm-bpe"
VERIFIER = WORLD / "verifier"


def fixed(root: Path) -> Path:
    """The padded draft with the verifier's rows (``pad_vocab``), written under ``root`` once."""
    from specfmt.methods.padding import pad_vocab

    out = root / "draft-lm-fixed"
    if not (out / "model.safetensors").is_file():
        pad_vocab(str(PADDED), str(VERIFIER), out)
    return out


def permuted(src: Path, out: Path, seed: int = 0) -> tuple[Path, list[int]]:
    """``src`` (a draft with the verifier's tokenizer and rows) with every id i moved to ``perm[i]``: tokenizer.json's
    vocabulary and added tokens, the post-processor's special ids, the config's and generation config's special ids,
    and the rows of ``embed_tokens`` and ``lm_head``. Returns ``(out, perm)``."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(src, out)
    tok = json.loads((out / "tokenizer.json").read_text())
    n = len(tok["model"]["vocab"])
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    tok["model"]["vocab"] = {t: perm[i] for t, i in tok["model"]["vocab"].items()}
    for added in tok["added_tokens"]:
        added["id"] = perm[added["id"]]
    for special in (tok.get("post_processor") or {}).get("special_tokens", {}).values():
        special["ids"] = [perm[i] for i in special["ids"]]
    (out / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))
    for name in ("config.json", "generation_config.json"):
        cfg = json.loads((out / name).read_text())
        for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
            if isinstance(cfg.get(key), int):
                cfg[key] = perm[cfg[key]]
        cfg.pop("specfmt", None)
        (out / name).write_text(json.dumps(cfg, indent=2))
    tensors = load_file(str(out / "model.safetensors"))
    index = torch.tensor(perm)
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        moved = torch.empty_like(tensors[name])
        moved[index] = tensors[name]  # row i goes to perm[i]
        tensors[name] = moved
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out, perm
