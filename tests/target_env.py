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

**Warm interpreters.** :func:`warm_run` runs ``python -c/-m ...`` as a fork of an interpreter that has already
imported what the runs need and started with the run's environment (:class:`_Warm`): an env's runs
(:attr:`TargetEnv.fork`), and ``conftest.run_cli``'s ``specfmt`` commands.
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
#: where the envs live unless their variable names a folder: ``~/.cache/specfmt/NAME-<cache tag>``
CACHE = Path.home() / ".cache" / "specfmt"
#: the modules an env must take from the running interpreter, never from its own folder
SHARED = ("torch", "transformers")


@dataclass(frozen=True)
class TargetEnv:
    """A folder of packages used with this interpreter (``sys.executable``, the folder first on ``PYTHONPATH``).

    Attributes:
        root: the folder.
        packages: the pinned requirements installed into it (``pip install --target --no-deps``).
        check: Python code that must run in it (the imports its users need).
        fork: runs fork one warm interpreter that has run :attr:`check` (:meth:`run`), not start a new
            one each: speculators' imports cost about 7 s per interpreter here, and its tests run it ~40 times.
    """

    root: Path
    packages: tuple[str, ...]
    check: str
    fork: bool = False

    def environ(self, **extra: str) -> dict[str, str]:
        """``os.environ`` with :attr:`root` first on ``PYTHONPATH`` and the Hub offline, plus ``extra``."""
        path = os.pathsep.join(p for p in (str(self.root), os.environ.get("PYTHONPATH", "")) if p)
        return {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1", **extra}

    def run(self, *args: str, cwd: str | Path | None = None) -> subprocess.CompletedProcess:
        """``python ARGS`` (e.g. ``"-c", CODE, ...`` or ``"-m", "speculators", ...``) in the env; output captured as text.

        With :attr:`fork`, a ``-c`` or ``-m`` run is a fork of one warm interpreter of this env (:class:`_Warm`)
        rather than a new one, when the environment it would get is the one the warm interpreter started with."""
        argv, env = [str(a) for a in args], self.environ()
        if self.fork:
            return warm_run(str(self.root), self.check, argv, env, cwd)
        return subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, cwd=cwd)

    def marker(self) -> str:
        """What :data:`MARKER` holds once the folder is complete: the packages and the interpreter."""
        return json.dumps({"packages": list(self.packages), "check": self.check, "python": sys.version.split()[0],
                           "cache_tag": sys.implementation.cache_tag}, indent=1) + "\n"

    def problem(self, root: Path | None = None) -> str | None:
        """Why the folder (``root``, default :attr:`root`) cannot be used as it is, or None: its check fails,
        or torch or transformers in it are not the running interpreter's (:data:`SHARED`)."""
        # the installed folder's check runs in the warm interpreter its runs will fork (:attr:`fork`; one interpreter start
        # fewer, 8-10 s for speculators'), a folder being built in a new one
        env = TargetEnv(root or self.root, self.packages, self.check, fork=self.fork and root is None)
        # where the env finds them (``find_spec``: the file an import would execute, without executing it: importing torch
        # and transformers took 3.5 s of each check, ten checks in test_speculators_interop's rebuild test)
        code = self.check + ("\nimport json\nfrom importlib.util import find_spec\n"
                             "print(json.dumps({m: getattr(find_spec(m), 'origin', None) for m in %r}))" % (SHARED,))
        try:
            r = env.run("-c", code)
        except RuntimeError:  # the warm interpreter ended running the check itself: a new one says why
            r = TargetEnv(env.root, self.packages, self.check).run("-c", code)
        if r.returncode != 0:
            return f"its check fails: {r.stderr.strip()[-2000:]}"
        theirs = json.loads(r.stdout.strip().splitlines()[-1])
        ours = running_interpreter_files()
        wrong = {m: theirs[m] for m in SHARED if theirs[m] is None or os.path.realpath(theirs[m]) != os.path.realpath(ours[m])}
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
        (the vLLM release probes ask for the same one from a thread each), and so do processes (pytest-xdist's
        workers): an exclusive ``flock`` on a file of the temporary folder named after the folder's path (nothing is
        left beside the env), so the second waits and finds it built."""
        import fcntl
        import hashlib
        import tempfile

        with _GUARD:
            lock = _LOCKS.setdefault(self.root, threading.Lock())
        key = hashlib.sha256(str(self.root.resolve()).encode()).hexdigest()[:16]
        with lock, open(Path(tempfile.gettempdir()) / f"specfmt-env-{key}.lock", "a") as held:
            fcntl.flock(held, fcntl.LOCK_EX)  # released when the file closes
            if (self.root / MARKER).is_file():
                compile_tree(self.root)  # first: the check then imports compiled modules
            if not self.usable():
                self.build()
                compile_tree(self.root)
        return self


def compile_tree(root: Path) -> None:
    """Byte-compile every module under ``root`` for this interpreter (``__pycache__``), once: marked by
    ``.compiled-<cache tag>``, written last. Where ``PYTHONDONTWRITEBYTECODE`` is set (this machine sets it), an
    uncompiled folder is compiled from source again by every interpreter that imports it: a vLLM release's probe
    (``vllm_releases.py``) started in 19.6 s from source and in 15.3 s compiled, and ran a case in 0.35 s against
    0.12 s (2026-11-30). Compiled in place, after the folder is complete (a code object names the file it was compiled
    from). Each file is written atomically and the result is the same whoever writes it, so two processes at once, or
    one stopped halfway, leave nothing wrong; a file this Python cannot compile is left to fail where it is imported."""
    import compileall
    import warnings

    mark = root / f".compiled-{sys.implementation.cache_tag}"
    if not mark.is_file():
        with warnings.catch_warnings():  # the packages' own (invalid escape sequences): theirs to fix, not the suite's to report
            warnings.simplefilter("ignore")
            compileall.compile_dir(str(root), quiet=2)
        mark.write_text("")


def pinned_env(name: str, variable: str, packages: tuple[str, ...], check: str, *, root: Path | None = None,
               fork: bool = False) -> TargetEnv:
    """The env ``packages`` make, built or rebuilt unless it is complete and working (:meth:`TargetEnv.ensure`).

    Its folder is ``root``, else ``$VARIABLE``, else ``~/.cache/specfmt/NAME-<cache tag>`` (:data:`CACHE`; the tag is
    the interpreter's, e.g. ``cpython-311``: each Python gets its own).

    Raises:
        RuntimeError: it cannot be built (pip failed) or fails its check after building.
    """
    if root is None:
        root = Path(os.environ.get(variable) or CACHE / f"{name}-{sys.implementation.cache_tag or 'py'}")
    return TargetEnv(Path(root), packages, check, fork=fork).ensure()


_GUARD = threading.Lock()
_LOCKS: dict[Path, threading.Lock] = {}


#: the warm interpreter's loop: run the check once, then for each request (one JSON line: argv, cwd, environment,
#: two output files) fork a child that runs ``-c CODE ARGS`` or ``-m MODULE ARGS`` as ``python`` would, with
#: stdin empty and stdout/stderr in the files, and answer with its exit code.
_WORKER = r"""
import atexit, gc, json, os, runpy, sys, traceback
exec(compile(sys.argv[1], "<check>", "exec"), {"__name__": "__check__"})
answer = os.fdopen(os.dup(1), "w")
for line in sys.stdin:
    req = json.loads(line)
    sys.stdout.flush(); sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        for fd, path in ((1, req["out"]), (2, req["err"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        code, argv = 0, req["argv"]
        os.environ.clear()
        os.environ.update(req["env"])
        try:
            os.chdir(req["cwd"])
            if argv[0] == "-c":
                sys.argv = ["-c", *argv[2:]]
                ns = {"__name__": "__main__", "__builtins__": __builtins__}
                exec(compile(argv[1], "<string>", "exec"), ns)
                del ns
            else:
                sys.argv = [argv[1], *argv[2:]]
                runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
            if not isinstance(e.code, (int, type(None))):
                print(e.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
            code = 1
        atexit._run_exitfuncs()
        gc.collect()
        sys.stdout.flush(); sys.stderr.flush()
        os._exit(code)
    answer.write(json.dumps({"pid": pid}) + "\n")
    answer.flush()
    _, status = os.waitpid(pid, 0)
    answer.write(json.dumps(os.waitstatus_to_exitcode(status)) + "\n")
    answer.flush()
"""


class _Warm:
    """An interpreter that has run a check (the imports its runs need); each run is a fork of it (:data:`_WORKER`), so a
    run pays for its own work and not for ``import speculators`` or ``import torch, transformers`` again.

    One per key and environment (:meth:`fingerprint`: what a module reads when it is imported depends on it): the first
    of a key starts on its first run; another environment gets its own on its second run (its first is a new
    interpreter), so an environment a test sets once costs no start; at most :data:`PER_KEY` per key, the oldest closed
    first (the suite's environment can change for good: a module imported in a test process may set a variable). All
    end when the test session's interpreter exits (their input closes)."""

    _all: dict[tuple[str, str], "_Warm"] = {}
    _seen: dict[tuple[str, str], int] = {}
    PER_KEY = 2
    #: what may differ between the warm interpreter's environment and a run's: pytest names the running test in it
    VOLATILE = ("PYTEST_CURRENT_TEST",)

    def __init__(self, check: str, environ: dict[str, str]):
        import tempfile

        self.lock = threading.Lock()
        self.tmp = Path(tempfile.mkdtemp(prefix="target-env-"))
        self.proc = subprocess.Popen([sys.executable, "-c", _WORKER, check], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=environ)

    @classmethod
    def fingerprint(cls, environ: dict[str, str]) -> str:
        """The environment but for :data:`VOLATILE`: runs fork only an interpreter started with the same."""
        return json.dumps(sorted((k, v) for k, v in environ.items() if k not in cls.VOLATILE))

    @classmethod
    def of(cls, key: str, check: str, environ: dict[str, str]) -> "_Warm | None":
        """The warm interpreter of ``key`` started with ``environ``, started now if this is the key's first run or this
        environment's second; None: run this one in a new interpreter."""
        fp = cls.fingerprint(environ)
        with _GUARD:
            warm = cls._all.get((key, fp))
            if warm is not None:
                if warm.proc.poll() is None:
                    return warm
                del cls._all[(key, fp)]  # it ended: started again below
            mine = [k for k in cls._all if k[0] == key]
            seen = cls._seen[(key, fp)] = cls._seen.get((key, fp), 0) + 1
            if warm is None and mine and seen < 2:
                return None
            while len(mine) >= cls.PER_KEY:
                cls._all.pop(mine.pop(0)).close()
            warm = cls._all[(key, fp)] = cls(check, environ)
            return warm

    def close(self) -> None:
        with self.lock:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def run(self, argv: list[str], cwd: Path, environ: dict[str, str], timeout: float | None = None) -> subprocess.CompletedProcess:
        """One run (see :data:`_WORKER`); past ``timeout`` seconds its process is killed and ``subprocess.TimeoutExpired``
        raised, as ``subprocess.run`` does."""
        import signal

        with self.lock:
            out, err = self.tmp / "out", self.tmp / "err"
            req = {"argv": argv, "cwd": str(cwd), "env": environ, "out": str(out), "err": str(err)}
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
            started = self.proc.stdout.readline()
            if not started:
                raise RuntimeError(f"the warm interpreter of {self.tmp} exited (code {self.proc.wait()})")
            pid, killed = json.loads(started)["pid"], []
            timer = threading.Timer(timeout, lambda: (killed.append(pid), os.kill(pid, signal.SIGKILL))) if timeout else None
            if timer is not None:
                timer.start()
            try:
                line = self.proc.stdout.readline()
            finally:
                if timer is not None:
                    timer.cancel()
            if not line:
                raise RuntimeError(f"the warm interpreter of {self.tmp} exited (code {self.proc.wait()})")
            stdout, stderr = out.read_text(errors="replace"), err.read_text(errors="replace")
            if killed:
                raise subprocess.TimeoutExpired([sys.executable, *argv], timeout, stdout, stderr)
            return subprocess.CompletedProcess([sys.executable, *argv], int(json.loads(line)), stdout, stderr)


def warm_run(key: str, check: str, argv: list[str], environ: dict[str, str], cwd: str | Path | None = None,
             timeout: float | None = None) -> subprocess.CompletedProcess:
    """``python ARGV`` (``-c CODE ARGS`` or ``-m MODULE ARGS``; output captured as text) as a fork of the warm interpreter
    ``key`` started with ``environ`` (:meth:`_Warm.of`: having run ``check``); else, or for any other ``argv``, in a new
    interpreter.

    Raises:
        subprocess.TimeoutExpired: the run took more than ``timeout`` seconds (it is killed).
    """
    if argv[:1] in (["-c"], ["-m"]) and len(argv) > 1 and hasattr(os, "fork"):
        warm = _Warm.of(key, check, environ)
        if warm is not None:
            return warm.run(argv, Path(cwd) if cwd is not None else Path.cwd(), environ, timeout)
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=environ, cwd=cwd, timeout=timeout)


def running_interpreter_files() -> dict[str, str]:
    """Where this interpreter finds torch and transformers (what every env must use too)."""
    return {name: find_spec(name).origin for name in SHARED}
