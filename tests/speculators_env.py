"""speculators 0.9.0 beside the running interpreter's own torch and transformers, shared by every test
that runs speculators' code (its model classes, ``save_pretrained``, its converter CLI, later its trainer).

Take the session fixture :func:`spec_env` (``from speculators_env import spec_env``) or call
:func:`speculators_env`; either gives a :class:`target_env.TargetEnv`, whose ``run("-c", CODE, ...)`` or
``run("-m", "speculators", ...)`` starts this interpreter with speculators importable. The folder is
``$SPECFMT_SPECULATORS_ENV``, else ``~/.cache/specfmt/speculators-0.9.0-<cache tag>``; how it is built,
checked and rebuilt: ``tests/target_env.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from target_env import TargetEnv, pinned_env

#: speculators 0.9.0 and what ``import speculators`` needs beyond what ``.ci/install`` installs (speculators/train/data.py
#: imports datasets and hs_connectors; pandas needs python-dateutil, which needs six). Found by importing in a new venv
#: until nothing was missing: the machine's own Python happened to have python-dateutil and six.
PACKAGES = ("speculators==0.9.0", "hs-connectors==0.9.0", "datasets==5.1.0", "multiprocess==0.70.19", "pandas==3.1.1",
            "pyarrow==26.0.1", "xxhash==4.1.0", "python-dateutil==2.9.0.post0", "six==1.17.0")
#: what the tests import from it (``speculators.__main__``: its command line)
CHECK = "import torch, transformers, speculators, speculators.__main__"


#: Driver code (run with ``python -c``) that makes a transformers draft module compute in float64 throughout:
#: transformers computes the rotary tables and RMSNorm in float32 whatever the model's dtype (about 1e-6 off
#: at the test sizes; ``LlamaRMSNorm``/``Qwen3RMSNorm``: ``hidden_states.to(torch.float32)``), so
#: ``float64_like_transformers(model, tl)`` puts the same formulas, in float64, in their place. ``tl``: the
#: config with ``rope_theta`` / ``rope_parameters``. Prepended to the drivers of test_peagle.py, test_dflash.py
#: and test_dspark_convert.py.
FLOAT64 = r"""
import torch
def float64_like_transformers(model, tl):
    theta = float((getattr(tl, "rope_parameters", None) or {}).get("rope_theta", getattr(tl, "rope_theta", 10000.0)))
    rot = model.rotary_emb
    def rope64(x, position_ids):
        hd = 2 * rot.inv_freq.numel()
        freqs = position_ids[..., None].double() / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        emb = torch.cat([freqs, freqs], dim=-1)
        return (emb.cos() * rot.attention_scaling).to(x.dtype), (emb.sin() * rot.attention_scaling).to(x.dtype)
    rot.forward = rope64
    def norm64(mod):
        return lambda x: mod.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + mod.variance_epsilon))
    for mod in model.modules():
        if hasattr(mod, "variance_epsilon"):
            mod.forward = norm64(mod)
"""


def speculators_env(root: Path | None = None) -> TargetEnv:
    """speculators 0.9.0 (:data:`PACKAGES`) at ``root`` (default ``$SPECFMT_SPECULATORS_ENV``, else ``~/.cache/specfmt/speculators-0.9.0-<cache tag>``),
    built or rebuilt unless it is complete and working (:func:`target_env.pinned_env`).

    Raises:
        RuntimeError: it cannot be built (pip failed) or fails its check after building.
    """
    return pinned_env("speculators-0.9.0", "SPECFMT_SPECULATORS_ENV", PACKAGES, CHECK, root=root, fork=True)


@pytest.fixture(scope="session")
def spec_env() -> TargetEnv:
    """The shared speculators env (import this fixture into a test module to use it)."""
    return speculators_env()
