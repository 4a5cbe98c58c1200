"""Checks shared by ``convert`` (before anything is written) and ``validate`` (after).

Each function returns a list of one-line problems; an empty list means the check holds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .checkpoint import TORCH_TO_ST, TensorInfo, kind_of
from .format import expected_tensors

if TYPE_CHECKING:  # pragma: no cover
    import torch


def inventory_problems(cfg: dict, shapes: dict[str, tuple[tuple[int, ...], str]]) -> dict[str, list[str]]:
    """Compare tensors against the names, shapes and kinds the config implies.

    Args:
        cfg: a schema-valid config.
        shapes: ``{name: (shape, safetensors dtype code)}`` of the tensors present.

    Returns:
        ``{"missing": [...], "unexpected": [...], "shape": [...], "dtype": [...]}``,
        each a list of one-line problems.
    """
    spec = expected_tensors(cfg)
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


def float_dtype_problems(cfg: dict, infos: dict[str, TensorInfo]) -> list[str]:
    """All floating tensors share one dtype, and it is the config's ``dtype`` (``torch_dtype`` in older files)."""
    floats = sorted({i.dtype for i in infos.values() if kind_of(i.dtype) == "float"})
    want = TORCH_TO_ST.get(cfg.get("dtype") or cfg.get("torch_dtype") or "")
    problems = []
    if len(floats) > 1:
        problems.append(f"floating tensors mix dtypes {floats}")
    if want and floats and floats != [want]:
        problems.append(f"config dtype is {cfg.get('dtype') or cfg.get('torch_dtype')} but tensors are {floats}")
    return problems


def vocab_map_problems(d2t: "torch.Tensor", t2d: "torch.Tensor", vocab_size: int, draft_vocab_size: int) -> list[str]:
    """Consistency of an EAGLE-3 draft vocabulary map.

    ``d2t`` [Vd] int64 holds offsets (``target_id = draft_id + d2t[draft_id]``), ``t2d`` [V]
    bool marks the target ids in the draft vocabulary (SafeAILab/EAGLE
    ``traineagle3/cnets.py::scandata``). The rules:

    * ``t2d.sum() == Vd``;
    * ``arange(Vd) + d2t`` is strictly increasing, in ``[0, V)``, and equals the
      positions where ``t2d`` is true.
    """
    import torch

    problems = []
    if d2t.dtype != torch.int64:
        problems.append(f"d2t has dtype {d2t.dtype}, expected int64 offsets")
    if t2d.dtype != torch.bool:
        problems.append(f"t2d has dtype {t2d.dtype}, expected bool")
    if problems:
        return problems
    if d2t.shape != (draft_vocab_size,) or t2d.shape != (vocab_size,):
        return [f"d2t {list(d2t.shape)} / t2d {list(t2d.shape)} do not match Vd={draft_vocab_size}, V={vocab_size}"]
    n = int(t2d.sum())
    if n != draft_vocab_size:
        problems.append(f"t2d marks {n} target ids, but the draft vocabulary has {draft_vocab_size}")
    target = torch.arange(draft_vocab_size, dtype=torch.int64) + d2t
    if draft_vocab_size > 1 and not bool((target[1:] > target[:-1]).all()):
        problems.append("arange(Vd) + d2t is not strictly increasing (are these absolute ids instead of offsets?)")
    if bool((target < 0).any()) or bool((target >= vocab_size).any()):
        bad = int(((target < 0) | (target >= vocab_size)).sum())
        problems.append(f"{bad} draft ids map outside the verifier vocabulary [0, {vocab_size})")
    if not problems and not torch.equal(target, t2d.nonzero().flatten()):
        problems.append("arange(Vd) + d2t differs from the positions marked in t2d")
    return problems


def nonfinite_count(t: "torch.Tensor") -> int:
    """Number of NaN or ±Inf values in a floating tensor (0 for other dtypes)."""
    import torch

    if not t.is_floating_point():
        return 0
    return int((~torch.isfinite(t)).sum())
