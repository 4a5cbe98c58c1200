"""SpecForge 0.2.0 (PyPI) beside the running interpreter's own torch and transformers, for the tests that run
SpecForge's own draft models (``tests/test_dspark_convert.py``: its ``DSparkDraftModel`` against specfmt's reference).

Built as ``tests/speculators_env.py`` builds speculators' (``tests/target_env.py``: ``pip install --target --no-deps``,
checked with this interpreter, the marker written last). Only the wheel goes in: its metadata pins ``torch==2.11.0``,
``transformers==5.8.1`` and ``sglang==0.5.14`` (with datasets, accelerate, wandb, yunchang ...), which would replace this
interpreter's torch; ``specforge.modeling.draft.dspark`` itself imports torch, transformers and its own modules only, and
its package ``__init__``s nothing more (checked by :data:`CHECK`). The folder is ``$SPECFMT_SPECFORGE_ENV``, else
``~/.cache/specfmt/specforge-0.2.0-<cache tag>``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from target_env import TargetEnv

#: the release (its wheel holds ``specforge/modeling/draft/dspark.py``, the DSpark of SpecForge a6b6b02 that the docs cite)
PACKAGES = ("specforge==0.2.0",)
#: what the tests import from it
CHECK = "import torch, transformers, specforge.modeling.draft.dspark"


def default_root() -> Path:
    tag = sys.implementation.cache_tag or "py"
    return Path(os.environ.get("SPECFMT_SPECFORGE_ENV") or Path.home() / ".cache" / "specfmt" / f"specforge-0.2.0-{tag}")


def specforge_env(root: Path | None = None) -> TargetEnv:
    """SpecForge 0.2.0 (:data:`PACKAGES`) at ``root`` (default :func:`default_root`), built or rebuilt unless it is
    complete and working.

    Raises:
        RuntimeError: it cannot be built (pip failed) or fails its check after building.
    """
    return TargetEnv(Path(root) if root is not None else default_root(), PACKAGES, CHECK).ensure()


@pytest.fixture(scope="session")
def sf_env() -> TargetEnv:
    """The shared SpecForge env (import this fixture into a test module to use it)."""
    return specforge_env()
