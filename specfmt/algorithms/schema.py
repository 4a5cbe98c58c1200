"""The v1 JSON Schema of the algorithms this specfmt knows, generated from their typed configs.

``schemas/config-v1.schema.json`` is this module's output, committed (and shipped as
``specfmt.schemas``); ``tests/test_config_types.py`` checks that it is current. After changing a
config class::

    python3 -m specfmt.algorithms.schema --write     # rewrite the committed file
    python3 -m specfmt.algorithms.schema --check     # exit 1 when the file is stale
    python3 -m specfmt.algorithms.schema             # print it
"""

from __future__ import annotations

import sys
from importlib import resources
from pathlib import Path
from typing import Any

from ..format import SCHEMA_FILE
from ..format.config import CONFIGS
from ..format.schema_gen import generate_schema, schema_text
from . import names


def generated() -> dict[str, Any]:
    """The schema of every registered algorithm's config, in registration order (EAGLE-3 first)."""
    assert list(CONFIGS) == names(), "every algorithm registers its config class"  # noqa: S101
    return generate_schema(list(CONFIGS.values()))


def committed_path() -> Path:
    """Where the schema file lives (the repository's ``schemas/`` in a development install)."""
    return Path(str(resources.files("specfmt.schemas").joinpath(SCHEMA_FILE)))


def main(argv: list[str]) -> int:
    """``--write``: rewrite the committed file; ``--check``: 1 when it differs from the generated
    schema; neither: print the generated schema."""
    text = schema_text(generated())
    if "--write" in argv:
        committed_path().write_text(text, encoding="utf-8")
        return 0
    if "--check" in argv:
        current = committed_path().read_text(encoding="utf-8") == text
        print(f"{committed_path()} is {'current' if current else 'stale: run python3 -m specfmt.algorithms.schema --write'}")
        return 0 if current else 1
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
