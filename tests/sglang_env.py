"""SGLang 0.5.23 beside the running interpreter's own torch and transformers, for the tests that run SGLang's
own code on specfmt's exports (``tests/test_sglang_interop.py``): its draft classes, their ``load_weights``, its
model registry, its verifier classes' tap rules and its server's argument parser; and SpecForge 0.2.0's exporter
(``tests/test_specforge_export.py``) and DSpark draft model (``tests/test_dspark_convert.py``).

Take the session fixture :func:`sgl_env` (``from sglang_env import sgl_env``) or call :func:`sglang_env`; either
gives a :class:`target_env.TargetEnv` whose ``run("-c", CODE, ...)`` starts this interpreter with SGLang
importable. The folder is ``$SPECFMT_SGLANG_ENV``, else ``~/.cache/specfmt/sglang-0.5.23-<cache tag>``, built
once like speculators' (``tests/target_env.py``): ``pip install --target --no-deps`` of :data:`PACKAGES`, pinned,
never a torch (SGLang's metadata asks for torch 2.14.1, torchvision, flashinfer and other CUDA wheels).

:data:`PACKAGES` is exactly what importing the draft classes and ``sglang.srt.server_args`` needs beyond what
``.ci/install`` installs: found by importing them with only ``.ci/install``'s packages visible (its resolved
list, ``pip install --dry-run --report``) and adding the one named missing until none was.

**One import is stubbed: torchvision** (:data:`STUB`). SGLang imports it while importing its configs
(``srt/configs/__init__.py`` -> ``nano_nemotron_vl.py`` -> ``srt/multimodal/internvl_utils.py``, image transforms),
and transformers' image code imports it once it is there. The torchvision wheels on PyPI are CUDA builds: 0.28.0,
the one made for torch 2.13, links ``libtorch_cuda.so`` and ``libc10_cuda.so``, which the CPU torch does not
have, and its import fails ("operator torchvision::nms does not exist"); the CPU build is not on PyPI. No draft
class, loader or parser touches it. The stub is a module that answers every attribute with another stub, and
says version 0.28.0 to transformers' version check.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from target_env import TargetEnv, pinned_env

#: SGLang 0.5.23 and what importing its draft classes and its server arguments needs beyond ``.ci/install``'s packages;
#: and SpecForge 0.2.0, SGLang's trainer, whose exporter ``tests/test_specforge_export.py`` runs: it imports with nothing
#: more, and sharing this env costs one install and one warm interpreter instead of two (its metadata asks for
#: torch 2.11, transformers 5.8.1 and sglang 0.5.14, none of which it needs to import and export here)
PACKAGES = ("sglang==0.5.23", "orjson==3.13.0", "ipython==9.18.1", "traitlets==5.16.1", "gguf==0.19.0", "specforge==0.2.0")

#: torchvision, stubbed for SGLang's and transformers' imports of it (see the module docstring): prepended to every driver
STUB = r"""
import sys, types
from importlib.machinery import ModuleSpec

class _Stub(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        sub = _Stub(f"{self.__name__}.{name}")
        sub.__path__, sub.__spec__ = [], ModuleSpec(sub.__name__, None)
        setattr(self, name, sub)
        sys.modules[sub.__name__] = sub
        return sub

    def __call__(self, *args, **kwargs):
        return self

class _StubFinder:
    def find_spec(self, name, path=None, target=None):
        if name == "torchvision" or name.startswith("torchvision."):
            return ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        mod = _Stub(spec.name)
        mod.__path__, mod.__version__ = [], "0.28.0"
        return mod

    def exec_module(self, module):
        pass

sys.meta_path.insert(0, _StubFinder())
"""

#: what the tests import from it (done once per session by the warm interpreter, ``TargetEnv.fork``)
CHECK = STUB + ("import torch, transformers, sglang.srt.server_args, sglang.srt.models.llama_eagle3, "
                "sglang.srt.models.registry, sglang.srt.model_loader.weight_utils")


def sglang_env(root: Path | None = None) -> TargetEnv:
    """SGLang 0.5.23 (:data:`PACKAGES`) at ``root`` (default ``$SPECFMT_SGLANG_ENV``, else ``~/.cache/specfmt/sglang-0.5.23-<cache tag>``),
    built or rebuilt unless it is complete and working (:func:`target_env.pinned_env`).

    Raises:
        RuntimeError: it cannot be built (pip failed) or fails its check after building.
    """
    return pinned_env("sglang-0.5.23", "SPECFMT_SGLANG_ENV", PACKAGES, CHECK, root=root, fork=True)


@pytest.fixture(scope="session")
def sgl_env() -> TargetEnv:
    """The shared SGLang env (import this fixture into a test module to use it)."""
    return sglang_env()
