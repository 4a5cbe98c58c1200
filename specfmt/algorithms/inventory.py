"""Tensors against the table their config's algorithm implies: checks shared by ``convert`` (before
anything is written), the trainer and ``validate`` (after).

Each function returns a list of one-line problems (or of findings, :class:`~specfmt.errors.Finding`, which say
what each concerns); an empty list means the check holds.
"""

from __future__ import annotations

from typing import Any

from ..checkpoint.dtypes import TORCH_TO_ST, kind_of
from ..checkpoint.reader import TensorInfo
from ..errors import Finding
from . import of


#: the keys of :func:`inventory_problems` by the :attr:`~specfmt.errors.Finding.kind` of :func:`inventory_findings`
PROBLEM_KEYS = {"missing": "missing", "unexpected": "unexpected", "misshaped": "shape", "wrong_dtype": "dtype"}


def inventory_problems(cfg: dict[str, Any], shapes: dict[str, tuple[tuple[int, ...], str]]) -> dict[str, list[str]]:
    """Compare tensors against the names, shapes and kinds the config implies.

    Args:
        cfg: a schema-valid config.
        shapes: ``{name: (shape, safetensors dtype code)}`` of the tensors present.

    Returns:
        ``{"missing": [...], "unexpected": [...], "shape": [...], "dtype": [...]}``,
        each a list of one-line problems (the messages of :func:`inventory_findings`).
    """
    out: dict[str, list[str]] = {key: [] for key in PROBLEM_KEYS.values()}
    for f in inventory_findings(cfg, shapes):
        out[PROBLEM_KEYS[f.kind]].append(f.message)
    return out


def inventory_findings(cfg: dict[str, Any], shapes: dict[str, tuple[tuple[int, ...], str]]) -> list[Finding]:
    """:func:`inventory_problems` as findings (:class:`~specfmt.errors.Finding`), in the same order: each with
    its :attr:`~specfmt.errors.Finding.tensor` and its kind (``missing``, ``unexpected``, ``misshaped``,
    ``wrong_dtype``). When only one of ``d2t`` and ``t2d`` is present, the other is ``missing``.

    Args:
        cfg: a schema-valid config.
        shapes: ``{name: (shape, safetensors dtype code)}`` of the tensors present.
    """
    spec = of(cfg).expected_tensors(cfg)
    missing, other = [], []
    for name, s in spec.items():
        if s.required and name not in shapes:
            missing.append(Finding(name + (f" ({s.why})" if s.why else ""), tensor=name, kind="missing"))
    for name, (shape, code) in sorted(shapes.items()):
        s = spec.get(name)
        if s is None:
            other.append(Finding(name, tensor=name, kind="unexpected"))
            continue
        if tuple(shape) != s.shape:
            other.append(Finding(f"{name}: {list(shape)}, expected {list(s.shape)}", tensor=name, kind="misshaped"))
        if kind_of(code) != s.kind:
            other.append(Finding(f"{name}: {code}, expected {s.kind}", tensor=name, kind="wrong_dtype"))
    pair = [n for n in ("d2t", "t2d") if n in shapes]
    if len(pair) == 1:
        missing.append(Finding("d2t and t2d come together; only one is present", tensor="t2d" if pair == ["d2t"] else "d2t", kind="missing"))
    return missing + other


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
