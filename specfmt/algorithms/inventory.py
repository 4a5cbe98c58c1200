"""Tensors against the table their config's algorithm implies: checks shared by ``convert`` (before
anything is written), the trainer and ``validate`` (after).

Each function returns a list of one-line problems; an empty list means the check holds.
"""

from __future__ import annotations

from typing import Any

from ..checkpoint.dtypes import TORCH_TO_ST, kind_of
from ..checkpoint.reader import TensorInfo
from . import of


def inventory_problems(cfg: dict[str, Any], shapes: dict[str, tuple[tuple[int, ...], str]]) -> dict[str, list[str]]:
    """Compare tensors against the names, shapes and kinds the config implies.

    Args:
        cfg: a schema-valid config.
        shapes: ``{name: (shape, safetensors dtype code)}`` of the tensors present.

    Returns:
        ``{"missing": [...], "unexpected": [...], "shape": [...], "dtype": [...]}``,
        each a list of one-line problems.
    """
    spec = of(cfg).expected_tensors(cfg)
    out: dict[str, list[str]] = {"missing": [], "unexpected": [], "shape": [], "dtype": []}
    for name, s in spec.items():
        if s.required and name not in shapes:
            out["missing"].append(name + (f" ({s.why})" if s.why else ""))
    for name, (shape, code) in sorted(shapes.items()):
        s = spec.get(name)
        if s is None:
            out["unexpected"].append(name)
            continue
        if tuple(shape) != s.shape:
            out["shape"].append(f"{name}: {list(shape)}, expected {list(s.shape)}")
        if kind_of(code) != s.kind:
            out["dtype"].append(f"{name}: {code}, expected {s.kind}")
    if "d2t" in shapes and "t2d" not in shapes or "t2d" in shapes and "d2t" not in shapes:
        out["missing"].append("d2t and t2d come together; only one is present")
    return out


def float_dtype_problems(cfg: dict[str, Any], infos: dict[str, TensorInfo]) -> list[str]:
    """All floating tensors share one dtype, and it is the config's ``dtype`` (``torch_dtype`` in older files)."""
    floats = sorted({i.dtype for i in infos.values() if kind_of(i.dtype) == "float"})
    want = TORCH_TO_ST.get(cfg.get("dtype") or cfg.get("torch_dtype") or "")
    problems = []
    if len(floats) > 1:
        problems.append(f"floating tensors mix dtypes {floats}")
    if want and floats and floats != [want]:
        problems.append(f"config dtype is {cfg.get('dtype') or cfg.get('torch_dtype')} but tensors are {floats}")
    return problems
