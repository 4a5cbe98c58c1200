"""Build the checkpoints of ``tests/data/real_configs`` on disk: the published config.json, weights
with the published names, shapes, dtypes and file format, and a config-only verifier folder.

Weights are zero-filled sparse files (:mod:`sparse_weights`): gigabytes that cost kilobytes. The
few tensors whose values matter hold real values: ``d2t``/``t2d`` a valid vocabulary map (draft
token i is target token ``round(i * V / Vd)``), nothing else (so an EAGLE-1 ``fc.bias`` is zero and
is dropped, not folded).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from sparse_weights import write_safetensors, write_torch_zip

DATA = Path(__file__).parent / "data" / "real_configs"
RECORDS = sorted(p.stem for p in DATA.glob("*.json"))


def load(slug: str) -> dict:
    return json.loads((DATA / f"{slug}.json").read_text())


def tensors_of(rec: dict) -> dict[str, tuple[list[int], str]]:
    """The record's tensor list, ``{e}`` expanded to one tensor per expert."""
    out = {}
    for name, (shape, dtype) in rec["weights"]["tensors"].items():
        for e in range(rec["weights"].get("experts", 1)) if "{e}" in name else [None]:
            out[name.replace("{e}", str(e)) if e is not None else name] = (shape, dtype)
    return out


def vocab_map_bytes(tensors: dict[str, tuple[list[int], str]]) -> dict[str, bytes]:
    """Values for ``d2t`` (offsets, int64 or int32 as listed) and ``t2d`` (bool mask), consistent."""
    if "d2t" not in tensors:
        return {}
    (vd,), d2t_dtype = tensors["d2t"]
    V = tensors["t2d"][0][0] if "t2d" in tensors else None
    V = V or vd * 4
    used = np.round(np.arange(vd) * (V / vd)).astype(np.int64)
    out = {"d2t": (used - np.arange(vd)).astype(np.int64 if d2t_dtype == "I64" else np.int32).tobytes()}
    if "t2d" in tensors:
        mask = np.zeros(V, dtype=np.bool_)
        mask[used] = True
        out["t2d"] = mask.tobytes()
    return out


def build(slug: str, root: Path) -> tuple[Path, Path]:
    """Write record ``slug`` under ``root``: ``(source folder, verifier folder)``. A verifier with
    built-in MTP layers is its own source."""
    rec = load(slug)
    src = root / "source"
    src.mkdir(parents=True)
    (src / "config.json").write_text(json.dumps(rec["config"], indent=2))
    tensors = tensors_of(rec)
    w = rec["weights"]
    data = vocab_map_bytes(tensors)
    if w["file"].endswith((".bin", ".pt")):
        write_torch_zip(src / w["file"], tensors, data)
    else:
        write_safetensors(src / w["file"], tensors, data)
    if w.get("sharded"):
        index = {"metadata": {}, "weight_map": {n: w["file"] for n in tensors}}
        (src / "model.safetensors.index.json").write_text(json.dumps(index))
    if rec["verifier"] is None:
        return src, src
    ver = root / "verifier"
    ver.mkdir()
    v = rec["verifier"]
    (ver / "config.json").write_text(json.dumps({"architectures": v["architectures"], "hidden_size": v["hidden_size"], "vocab_size": v["vocab_size"],
                                                 "num_hidden_layers": v["num_hidden_layers"], "max_position_embeddings": 8192}))
    return src, ver
