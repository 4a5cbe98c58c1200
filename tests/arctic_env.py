"""arctic-inference 0.1.1 (what vLLM's ``method: "suffix"`` imports) built from its sdist for the running interpreter,
shared by every test that runs suffix decoding (the reference's ``SuffixDecodingCache``, vLLM's suffix engine).

PyPI has arctic-inference 0.1.1 as an sdist only, whose build requirements pin ``torch == 2.7.0``; an isolated
build would download that torch (CUDA packages, gigabytes) to read one path the suffix-tree extension does not use.
So it is built in three steps, each a folder under ``~/.cache/specfmt`` (``$SPECFMT_ARCTIC_ENV`` for the last):

1. its other build requirements, pinned (:data:`BUILD_PACKAGES`), with ``pip install --target`` (``tests/target_env.py``);
2. the wheel, ``pip wheel --no-build-isolation --no-deps`` with that folder on ``PYTHONPATH`` and this interpreter's
   torch (:func:`build_wheel`; the C++ suffix tree compiles with the machine's compiler, nanobind and cmake);
3. the wheel installed ``--target`` into the test folder, checked by importing ``SuffixDecodingCache``.

Measured on this machine (2 cores, shared): the build takes about 2 minutes once; later sessions only check the
folders. Its vLLM plugin stays off (``ARCTIC_INFERENCE_ENABLED`` unset), so the vLLM beside it is not patched.

:func:`use_arctic` puts the folder on ``sys.path`` (the reference imports it in this process) and on
``PYTHONPATH`` (vLLM's engine host, a child process), and restarts a running shared host so that its next engine
sees it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from target_env import TargetEnv

#: the sdist vLLM 0.32 names (``SpeculativeConfig._validate_suffix_decoding``)
ARCTIC = "arctic-inference==0.1.1"
#: its pyproject's build requirements but torch, pinned (the versions it names where it pins one; cmake and ninja
#: as wheels, so that no system cmake is assumed)
BUILD_PACKAGES = ("setuptools==80.9.0", "wheel==0.45.1", "nanobind==2.9.2", "grpcio-tools==1.71.0", "protobuf==5.29.5",
                  "cmake==3.31.6", "ninja==1.11.1.4")
CHECK = "from arctic_inference.suffix_decoding import SuffixDecodingCache"


def _cache() -> Path:
    return Path.home() / ".cache" / "specfmt"


def _tag() -> str:
    return sys.implementation.cache_tag or "py"


def build_deps() -> TargetEnv:
    """The folder of :data:`BUILD_PACKAGES` (built unless complete and importable)."""
    return TargetEnv(_cache() / f"arctic-build-deps-{_tag()}", BUILD_PACKAGES,
                     "import nanobind, grpc_tools.protoc, setuptools, wheel, cmake, ninja").ensure()


def build_wheel() -> Path:
    """arctic-inference's wheel for this interpreter, built once into ``~/.cache/specfmt/arctic-inference-0.1.1-wheel-<tag>``.

    Raises:
        RuntimeError: the build failed; the message holds the end of pip's log (the compiler's error).
    """
    out = _cache() / f"arctic-inference-0.1.1-wheel-{_tag()}"
    found = sorted(out.glob("arctic_inference-0.1.1-*.whl"))
    if found:
        return found[0]
    deps = build_deps()
    partial = out.with_name(out.name + f".partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    env = deps.environ(PATH=os.pathsep.join([str(deps.root / "bin"), os.environ.get("PATH", "")]), CMAKE_BUILD_PARALLEL_LEVEL="2")
    env.pop("HF_HUB_OFFLINE", None)
    try:
        r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--no-deps", "--no-build-isolation",
                            "--no-binary", "arctic-inference", "-w", str(partial), ARCTIC], capture_output=True, text=True, env=env)
        wheels = sorted(partial.glob("arctic_inference-0.1.1-*.whl"))
        if r.returncode != 0 or not wheels:
            raise RuntimeError(f"building {ARCTIC} failed (exit {r.returncode}): {(r.stdout + r.stderr).strip()[-3000:]}")
        shutil.rmtree(out, ignore_errors=True)
        partial.rename(out)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return sorted(out.glob("arctic_inference-0.1.1-*.whl"))[0]


def arctic_env() -> TargetEnv:
    """arctic-inference 0.1.1 installed for this interpreter (``$SPECFMT_ARCTIC_ENV``, else
    ``~/.cache/specfmt/arctic-inference-0.1.1-<tag>``), built as the module says.

    Raises:
        RuntimeError: it cannot be built, or fails its import check.
    """
    root = Path(os.environ.get("SPECFMT_ARCTIC_ENV") or _cache() / f"arctic-inference-0.1.1-{_tag()}")
    return TargetEnv(root, (str(build_wheel()),), CHECK).ensure()


def use_arctic(env: TargetEnv) -> None:
    """Make ``env`` importable here and in every vLLM engine started from now on (see the module docstring)."""
    from specfmt.validation import vllm_run

    root = str(env.root)
    if root not in sys.path:
        sys.path.insert(0, root)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([root, *paths])
        host = vllm_run._shared
        if host is not None:
            host.close()  # its child started without the folder; the next engine starts a new one


@pytest.fixture(scope="session")
def arctic() -> TargetEnv:
    """arctic-inference built and importable here and in vLLM's engines (import this fixture into a test module)."""
    env = arctic_env()
    use_arctic(env)
    return env
