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
import re
from functools import lru_cache
from importlib import resources
from typing import Any

from ..errors import Finding
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
    return sorted({(f.path, f.message) for f in json_schema_findings(config)})


def json_schema_findings(config: Any) -> list[Finding]:
    """:func:`json_schema_violations` as findings (:class:`~specfmt.errors.Finding`), one per violation (the same
    paths and messages), each with the config keys it concerns: those along its path, and those its
    rule names (an absent ``required`` key, reported at its parent object; a key ``additionalProperties:
    false`` refuses; a key a ``not: {required: [...]}`` rule forbids), and the JSON Schema keyword as
    :attr:`~specfmt.errors.Finding.kind`.

    Args:
        config: a parsed ``config.json``.

    Returns:
        The findings sorted by path and message, without duplicates; empty when the config is valid.
    """
    from jsonschema import Draft202012Validator

    validator = Draft202012Validator(load_schema(), format_checker=Draft202012Validator.FORMAT_CHECKER)
    out = {}
    for err in validator.iter_errors(config):
        msg = err.message
        if err.validator == "not" and isinstance(err.validator_value, dict):
            msg = err.validator_value.get("description", msg)
        path = _json_path(err.absolute_path)
        along = tuple(str(p) for p in err.absolute_path if not isinstance(p, int))  # the config's own keys, whatever they hold
        found = out.setdefault((path, msg), Finding.at(path, msg, kind=str(err.validator), named=_named_keys(err), along=along))
        if found.kind != err.validator:  # one message from two rules: keep every key either names
            out[(path, msg)] = Finding.at(path, msg, kind=found.kind, named=found.keys + _named_keys(err), along=along)
    return [out[k] for k in sorted(out)]


def _named_keys(err: Any) -> tuple[str, ...]:
    """The keys a JSON Schema error names beyond its path (a ``jsonschema.ValidationError``)."""
    inst, rule = err.instance, err.validator_value
    if not isinstance(inst, dict):
        return ()
    if err.validator == "required" and isinstance(rule, list):
        return tuple(k for k in rule if k not in inst)
    if err.validator == "additionalProperties" and rule is False:
        known = err.schema.get("properties", {})
        patterns = [re.compile(p) for p in err.schema.get("patternProperties", {})]
        return tuple(k for k in inst if k not in known and not any(p.search(k) for p in patterns))
    if err.validator == "not" and isinstance(rule, dict):
        named = [*rule.get("required", []), *(k for alt in rule.get("anyOf", []) if isinstance(alt, dict) for k in alt.get("required", []))]
        return tuple(k for k in named if k in inst)
    return ()
