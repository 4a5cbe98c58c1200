"""The v1 JSON Schema, generated from the typed configs.

``schemas/config-v1.schema.json`` is :func:`generate_schema` of the registered config classes
(:data:`specfmt.format.config.CONFIGS`), written by ``python3 -m specfmt.algorithms.schema``
(that module knows the algorithms; this one takes them as an argument);
``tests/test_config_types.py`` checks that the committed file is what the classes generate.
Its shape: the shared top level (:class:`~specfmt.format.config.SpeculatorConfig`), then one
``if speculators_model_type == NAME then $defs[NAME]`` branch per algorithm, that branch being
what the algorithm's class says beyond the shared one (its fields, the fields it requires, its
``not``), with ``speculators_config.algorithm`` equal to its name and, for a draft vLLM picks by
architecture, ``architectures`` pinned.
"""

from __future__ import annotations

import json
from typing import Any

from .config import SpeculatorConfig
from .model import SchemaBuilder

#: the schema's ``$id``: one per format version (:data:`specfmt.FORMAT_VERSION`)
SCHEMA_ID = "urn:specfmt:schema:speculators-config:v1"
SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
SCHEMA_TITLE = "specfmt v1: a speculator checkpoint's config.json (vLLM speculators format)"


def generate_schema(configs: list[type[SpeculatorConfig]]) -> dict[str, Any]:
    """The v1 JSON Schema of a set of algorithm config classes.

    Args:
        configs: the algorithms' classes (subclasses of
            :class:`~specfmt.format.config.SpeculatorConfig`), in the order their branches are
            written; each has its ``name``.

    Returns:
        The schema: ``$schema``, ``$id``, the top level (``speculators_model_type`` one of the
        names), ``allOf`` of one ``if``/``then`` per algorithm and the ``$defs`` they use.
    """
    b = SchemaBuilder()
    top = b.model_node(SpeculatorConfig)
    kind = top["properties"]["speculators_model_type"]
    del kind["type"]  # the names say it: one message for a wrong value, as in v1
    kind["enum"] = [c.name for c in configs]
    branches = []
    for cls in configs:
        branch = b.difference(cls, SpeculatorConfig, always=("architectures",) if cls.pin_architecture else ())
        props = branch.setdefault("properties", {})
        props["speculators_config"] = {"properties": {"algorithm": {"const": cls.name}}}
        if cls.pin_architecture:
            props["architectures"] = {"const": [cls.architecture]}
        b.defs[cls.name] = branch
        branches.append({"if": {"properties": {"speculators_model_type": {"const": cls.name}}, "required": ["speculators_model_type"]},
                         "then": b.ref(cls.name)})
    return {"$schema": SCHEMA_DIALECT, "$id": SCHEMA_ID, "title": SCHEMA_TITLE, **top, "allOf": branches, "$defs": b.defs}


def schema_text(schema: dict[str, Any]) -> str:
    """The schema as the committed file holds it (two-space indent, a final newline)."""
    return json.dumps(schema, indent=2) + "\n"
