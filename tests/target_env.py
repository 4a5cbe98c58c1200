"""A folder of pinned packages used with the running interpreter, for tests that need more than the
project installs (speculators' own code in ``speculators_env.py``; what a vLLM release's probe imports
in ``vllm_releases.py``).

**A ``pip install --target`` folder on ``PYTHONPATH`` of ``sys.executable``, not a venv.** A nested
``python -m venv --system-site-packages`` made from inside a venv sees the *base* interpreter's
site-packages, not the venv's: there ``import torch`` fails or finds another torch. ``sys.executable``
with the folder first on ``PYTHONPATH`` sees exactly what the running interpreter sees, venv or not,
plus the folder. Packages go in ``--no-deps`` and pinned: their metadata may ask for what would
replace this interpreter's torch (speculators asks for torchvision and torchaudio).

**Built once, checked every time, never reused half-made.** :meth:`TargetEnv.ensure` builds the
folder in a temporary sibling, runs its check there with this interpreter (torch and transformers
must still be this interpreter's own, :data:`SHARED`), writes the marker (:data:`MARKER`: the package
list, the check and the interpreter) *last*, then moves it into place. A folder whose marker is
missing or differs, or whose check fails, is built again; the check runs in every session.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import sys
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path

MARKER = ".complete"
#: the modules an env must take from the running interpreter, never from its own folder
SHARED = ("torch", "transformers")


@dataclass(frozen=True)
class TargetEnv:
    """A folder of packages used with this interpreter (``sys.executable``, the folder first on ``PYTHONPATH``).

    Attributes:
        root: the folder.
        packages: the pinned requirements installed into it (``pip install --target --no-deps``).
        check: Python code that must run in it (the imports its users need).
    """

    root: Path
    packages: tuple[str, ...]
    check: str

    def environ(self, **extra: str) -> dict[str, str]:
        """``os.environ`` with :attr:`root` first on ``PYTHONPATH`` and the Hub offline, plus ``extra``."""
        path = os.pathsep.join(p for p in (str(self.root), os.environ.get("PYTHONPATH", "")) if p)
        return {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1", **extra}

    def run(self, *args: str, cwd: str | Path | None = None) -> subprocess.CompletedProcess:
        """``python ARGS`` (e.g. ``"-c", CODE, ...`` or ``"-m", "speculators", ...``) in the env; output captured as text."""
        return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, env=self.environ(), cwd=cwd)

    def marker(self) -> str:
        """What :data:`MARKER` holds once the folder is complete: the packages and the interpreter."""
        return json.dumps({"packages": list(self.packages), "check": self.check, "python": sys.version.split()[0],
                           "cache_tag": sys.implementation.cache_tag}, indent=1) + "\n"

    def problem(self, root: Path | None = None) -> str | None:
        """Why the folder (``root``, default :attr:`root`) cannot be used as it is, or None: its check fails,
        or torch or transformers in it are not the running interpreter's (:data:`SHARED`)."""
        env = TargetEnv(root or self.root, self.packages, self.check)
        code = self.check + "\nimport importlib, json\nprint(json.dumps({m: importlib.import_module(m).__file__ for m in %r}))" % (SHARED,)
        r = env.run("-c", code)
        if r.returncode != 0:
            return f"its check fails: {r.stderr.strip()[-2000:]}"
        theirs = json.loads(r.stdout.strip().splitlines()[-1])
        ours = running_interpreter_files()
        wrong = {m: theirs[m] for m in SHARED if os.path.realpath(theirs[m]) != os.path.realpath(ours[m])}
        return f"it imports {wrong}, not this interpreter's {ours}" if wrong else None

    def usable(self) -> bool:
        """Marked complete with this very package list and interpreter, and its check passes."""
        marker = self.root / MARKER
        return marker.is_file() and marker.read_text() == self.marker() and self.problem() is None

    def build(self) -> None:
        """Install :attr:`packages` into a sibling folder, check it, mark it (last) and move it to :attr:`root`,
        replacing what was there.

        Raises:
            RuntimeError: pip failed, or the new folder fails its check.
        """
        root = self.root
        root.parent.mkdir(parents=True, exist_ok=True)
        me = f"{os.getpid()}-{threading.get_ident()}"  # per process and thread: test runs, and threads of one, may build at once
        partial = root.with_name(f"{root.name}.partial-{me}")
        stale = root.with_name(f"{root.name}.stale-{me}")
        shutil.rmtree(partial, ignore_errors=True)
        try:
            r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps", "--no-compile",
                                "--target", str(partial), *self.packages], capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError(f"pip install --target {partial} failed: {r.stderr.strip()[-2000:]}")
            problem = self.problem(partial)
            if problem is not None:
                raise RuntimeError(f"the env built in {partial} cannot be used: {problem}")
            (partial / MARKER).write_text(self.marker())  # last: only a checked folder is ever marked
            if root.exists():
                root.rename(stale)
            try:
                partial.rename(root)
            except OSError:  # another process moved its own checked folder in first
                if not self.usable():
                    raise
        finally:
            shutil.rmtree(partial, ignore_errors=True)
            shutil.rmtree(stale, ignore_errors=True)

    def ensure(self) -> "TargetEnv":
        """Build it unless it is :meth:`usable`; then it is. Threads of one process build a folder one at a time
        (the vLLM release probes ask for the same one from a thread each)."""
        with _GUARD:
            lock = _LOCKS.setdefault(self.root, threading.Lock())
        with lock:
            if not self.usable():
                self.build()
        return self


_GUARD = threading.Lock()
_LOCKS: dict[Path, threading.Lock] = {}


def running_interpreter_files() -> dict[str, str]:
    """Where this interpreter finds torch and transformers (what every env must use too)."""
    return {name: find_spec(name).origin for name in SHARED}
