"""The v1 JSON Schema, read back to validate.

The schema (``schemas/config-v1.schema.json``, draft 2020-12, shipped as ``specfmt.schemas``) is
generated from the typed configs (:mod:`specfmt.format.schema_gen`) and committed. Validation
reads the committed file with jsonschema (:func:`json_schema_violations`); the rules that compare
fields with each other live with each config class
(:meth:`~specfmt.format.config.SpeculatorConfig.violations`) and run, once the schema holds, in
:func:`specfmt.algorithms.schema_violations`.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any

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


def json_schema_violations(config: Any) -> list[tuple[str, str]]:
    """Every violation of the v1 JSON Schema alone (:func:`specfmt.algorithms.schema_violations`
    adds the cross-field rules a schema cannot state).

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
    return sorted(set(out))
