"""Drafts in the specfmt format for the SGLang export tests: the world's EAGLE-3 and EAGLE-1 drafts converted, and
variants of them with random weights (every parameter distinct, norms included, so that a swapped or unfilled
tensor shows in an element-by-element comparison)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from specfmt.algorithms import get
from specfmt.convert import convert
from specfmt.draft import read_draft, save_draft
from specfmt.format.draft import Draft

REPO = Path(__file__).resolve().parents[1]
WORLD = REPO / "examples" / "world"
VERIFIER = WORLD / "verifier"


def world_eagle3(out: Path) -> Path:
    """The world's EAGLE-3 draft (SafeAILab layout, ``examples/world/eagle3-safeailab``) converted to specfmt."""
    convert("eagle3", str(WORLD / "eagle3-safeailab"), out, str(VERIFIER))
    return out


def variant(base: Path, out: Path, *, seed: int = 0, tlc: dict | None = None, tensors: dict | None = None, **fields) -> Path:
    """A specfmt EAGLE-3 draft shaped like ``base`` with ``fields`` (top level) and ``tlc`` (decoder) changed, its
    tensors drawn at random (``d2t``/``t2d`` kept from ``base`` when the vocabularies agree), then ``tensors`` set."""
    src = read_draft(base)
    cfg = json.loads(json.dumps(src.config))
    cfg.pop("specfmt")
    cfg.update(fields)
    cfg["transformer_layer_config"].update(tlc or {})
    gen = torch.Generator().manual_seed(seed)
    made = get("eagle3").module(cfg).state_dict()
    drawn = {n: (torch.randn(t.shape, generator=gen) * 0.1).to(torch.float16) if t.is_floating_point() else t.clone() for n, t in made.items()}
    for name in ("d2t", "t2d"):
        if name in drawn and name in src.tensors and src.tensors[name].shape == drawn[name].shape:
            drawn[name] = src.tensors[name].clone()
    drawn.update(tensors or {})
    save_draft(out, Draft(cfg, drawn), train={"note": "a test variant with random weights"})
    return out


def verifier_embedding() -> torch.Tensor:
    """The world verifier's input embedding [V, H_t]."""
    from safetensors.torch import load_file

    return load_file(str(VERIFIER / "model.safetensors"))["model.embed_tokens.weight"]


def world_eagle1(out: Path, *, fc_bias: bool = False, seed: int = 0) -> Path:
    """The world's EAGLE-1 draft (SafeAILab layout, ``examples/world/eagle-safeailab``) converted to specfmt, without its
    ``embed_tokens.weight`` (the world's copy is the float32 verifier's rounded to float16, which SGLang would replace with
    the verifier's own values: ``export`` refuses it). ``fc_bias``: a HASS source, its random ``fc.bias`` folded by
    ``convert --from hass`` into layer 0's q/k/v/o biases (``attention_bias: true``)."""
    src = WORLD / "eagle-safeailab"
    if fc_bias:
        sd = torch.load(src / "pytorch_model.bin", weights_only=True)
        sd["fc.bias"] = (torch.randn(sd["fc.weight"].shape[0], generator=torch.Generator().manual_seed(seed)) * 0.5).to(sd["fc.weight"].dtype)
        src = out.parent / f"{out.name}-source"
        src.mkdir(parents=True)
        torch.save(sd, src / "pytorch_model.bin")
        cfg = json.loads((WORLD / "eagle-safeailab" / "config.json").read_text())
        cfg.pop("bias")
        (src / "config.json").write_text(json.dumps(cfg))
    converted = out.parent / f"{out.name}-converted"
    convert("hass" if fc_bias else "eagle", str(src), converted, str(VERIFIER))
    d = read_draft(converted)
    cfg = json.loads(json.dumps(d.config))
    cfg.pop("specfmt")
    save_draft(out, Draft(cfg, {n: t for n, t in d.tensors.items() if n != "embed_tokens.weight"}), train={"note": "the world's EAGLE-1 draft, its embedding copy left out"})
    return out


def eagle1_variant(base: Path, out: Path, *, seed: int = 0, tensors: dict | None = None, **fields) -> Path:
    """A specfmt EAGLE-1 draft shaped like ``base`` with top-level decoder ``fields`` changed (the decoder config too), its
    tensors drawn at random, then ``tensors`` set."""
    src = read_draft(base)
    cfg = json.loads(json.dumps(src.config))
    cfg.pop("specfmt")
    cfg.update(fields)
    cfg["transformer_layer_config"].update(fields)
    gen = torch.Generator().manual_seed(seed)
    made = get("eagle").module(cfg).state_dict()
    drawn = {n: (torch.randn(t.shape, generator=gen) * 0.1).to(torch.float16) for n, t in made.items() if "rotary" not in n}
    drawn.update(tensors or {})
    save_draft(out, Draft(cfg, drawn), train={"note": "a test variant with random weights"})
    return out


WORLD_QWEN3 = REPO / "examples" / "world-qwen3"
QWEN3_VERIFIER = WORLD_QWEN3 / "verifier"


def world_dflash(out: Path) -> Path:
    """The Qwen3 world's DFlash draft (speculators' own layout, ``examples/world-qwen3/dflash-speculators``) converted to specfmt."""
    convert("auto", str(WORLD_QWEN3 / "dflash-speculators"), out, str(QWEN3_VERIFIER))
    return out


def dflash_variant(base: Path, out: Path, algorithm: str = "dflash", *, seed: int = 0, k: int | None = None, tensors: dict | None = None,
                   tlc: dict | None = None, **fields) -> Path:
    """A specfmt draft of ``algorithm`` (``dflash``, ``dflash2`` or ``dspark``) shaped like the DFlash draft ``base`` with its
    own ``fields`` (top level) and ``tlc`` (decoder) set, k = ``k`` (default: base's), every tensor drawn at random (norms
    around 1), then ``tensors`` set."""
    from specfmt.converters.dflash import as_variant

    src = read_draft(base)
    cfg = json.loads(json.dumps(src.config))
    cfg.pop("specfmt")
    cfg["transformer_layer_config"].update(tlc or {})
    if k is not None:
        cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] = k
    if algorithm != "dflash":
        cfg = as_variant(cfg, fields, get(algorithm).config)
    else:
        cfg.update(fields)
    gen = torch.Generator().manual_seed(seed)
    made = get(algorithm).module(cfg).state_dict()
    drawn = {n: (1 + 0.1 * torch.randn(t.shape, generator=gen) if n.endswith("norm.weight") else 0.1 * torch.randn(t.shape, generator=gen))
             if t.is_floating_point() else t.clone() for n, t in made.items() if "rotary" not in n}
    drawn.update(tensors or {})
    save_draft(out, Draft(cfg, drawn), train={"note": "a test variant with random weights"})
    return out
