"""The v1 JSON Schema and the cross-field rules a schema cannot state.

The schema (``schemas/config-v1.schema.json``, draft 2020-12, shipped as ``specfmt.schemas``)
has one branch per algorithm; the rules that compare fields with each other live with each
algorithm (:meth:`specfmt.algorithms.base.Algorithm.config_violations`) and run here once the
schema holds.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any

from ..errors import ConfigSchemaError
from . import SCHEMA_FILE


@lru_cache(maxsize=1)
def load_schema() -> dict[str, Any]:
    """The v1 JSON Schema (draft 2020-12), read from the installed ``specfmt.schemas``."""
    text = resources.files("specfmt.schemas").joinpath(SCHEMA_FILE).read_text(encoding="utf-8")
    return json.loads(text)


def _json_path(parts) -> str:
    path = "$"
    for p in parts:
        path += f"[{p}]" if isinstance(p, int) else f".{p}"
    return path


def schema_violations(config: Any) -> list[tuple[str, str]]:
    """Every violation of the v1 schema and of the rules a schema cannot state.

    Args:
        config: a parsed ``config.json``.

    Returns:
        ``[(json_path, message), ...]`` sorted by path; empty when the config is valid.
        Paths look like ``$.speculators_config.proposal_methods[0].speculative_tokens``.
    """
    from jsonschema import Draft202012Validator

    validator = Draft202012Validator(load_schema(), format_checker=Draft202012Validator.FORMAT_CHECKER)
    out = []
    for err in validator.iter_errors(config):
        msg = err.message
        if err.validator == "not" and isinstance(err.validator_value, dict):
            msg = err.validator_value.get("description", msg)
        out.append((_json_path(err.absolute_path), msg))
    if not out and isinstance(config, dict):
        out.extend(_semantic_violations(config))
    return sorted(set(out))


def _semantic_violations(cfg: dict[str, Any]) -> list[tuple[str, str]]:
    """Cross-field rules of the format (only run once the schema holds): the proposal block's own
    consistency, then the algorithm's rules (:meth:`specfmt.algorithms.base.Algorithm.config_violations`)."""
    from ..algorithms import get

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
