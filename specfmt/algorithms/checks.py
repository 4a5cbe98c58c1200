"""Checks shared by ``convert`` (before anything is written), the trainer and ``validate`` (after):
tensors against the table their config's algorithm implies, and a config against the v1 schema
and its algorithm's cross-field rules.

Each ``*_problems`` / ``*_violations`` function returns a list of one-line problems; an empty
list means the check holds.
"""

from __future__ import annotations

from typing import Any

from ..checkpoint.dtypes import TORCH_TO_ST, kind_of
from ..checkpoint.reader import TensorInfo
from ..errors import ConfigSchemaError
from ..format.schema import json_schema_violations
from . import get, of


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


def schema_violations(config: Any) -> list[tuple[str, str]]:
    """Every violation of the v1 schema (:func:`specfmt.format.schema.json_schema_violations`) and
    of the rules a schema cannot state.

    Args:
        config: a parsed ``config.json``.

    Returns:
        ``[(json_path, message), ...]`` sorted by path; empty when the config is valid.
        Paths look like ``$.speculators_config.proposal_methods[0].speculative_tokens``.
    """
    out = json_schema_violations(config)
    if not out and isinstance(config, dict):
        out.extend(_semantic_violations(config))
    return sorted(set(out))


def _semantic_violations(cfg: dict[str, Any]) -> list[tuple[str, str]]:
    """Cross-field rules of the format (only run once the schema holds): the proposal block's own
    consistency, then the algorithm's rules (:meth:`specfmt.algorithms.base.Algorithm.config_violations`)."""
    out = []
    algo = cfg["speculators_model_type"]
    sc = cfg["speculators_config"]
    if sc["algorithm"] != algo:
        out.append(("$.speculators_config.algorithm", f"{sc['algorithm']!r} differs from speculators_model_type {algo!r}"))
    kinds = [m["proposal_type"] for m in sc["proposal_methods"]]
    if sc["default_proposal_method"] not in kinds:
        out.append(("$.speculators_config.default_proposal_method", f"{sc['default_proposal_method']!r} is not one of the proposal_methods {kinds}"))
    return out + get(algo).config_violations(cfg)


def validate_config(config: Any, where: str) -> None:
    """Raise :class:`ConfigSchemaError` listing every violation (with its JSON path).

    Args:
        config: a parsed ``config.json``.
        where: the file it came from, for the message.
    """
    violations = schema_violations(config)
    if violations:
        first = "; ".join(f"{p}: {m}" for p, m in violations[:3])
        more = f" (and {len(violations) - 3} more)" if len(violations) > 3 else ""
        raise ConfigSchemaError(
            f"config does not match the specfmt v1 schema: {first}{more}",
            violations,
            where=where,
            hint="run `specfmt validate` on the folder for the full list",
        )
