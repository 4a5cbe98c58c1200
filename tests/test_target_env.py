"""The suite's warm interpreters (``target_env.warm_run``, used by ``conftest.run_cli`` and the pinned envs): a run is a
fork of an interpreter that has run its check and started with the run's environment, or a new interpreter (an
environment's first run, when another has a warm interpreter already); either way the caller gets what ``subprocess.run`` gives (exit code, stdout, stderr, a timeout)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from target_env import warm_run

#: the check leaves a mark only the warm interpreter's forks inherit
CHECK = "import builtins\nbuiltins._specfmt_warm_mark = 1"
PROBE = ("import builtins, os, sys; print(getattr(builtins, '_specfmt_warm_mark', 0), os.getcwd(), sys.argv[1:], os.environ.get('SPECFMT_T'));"
         "print('to stderr', file=sys.stderr); sys.exit(3)")


def test_a_run_is_a_fork_of_the_warm_interpreter_with_its_output_code_cwd_and_arguments(tmp_path):
    env = {**os.environ, "SPECFMT_T": "a"}
    key = f"test-{tmp_path}"
    for _ in range(2):  # the first run starts the interpreter; both are its forks
        r = warm_run(key, CHECK, ["-c", PROBE, "x", "y"], env, cwd=tmp_path)
        assert (r.returncode, r.stdout.split(), r.stderr) == (3, ["1", str(tmp_path), "['x',", "'y']", "a"], "to stderr\n")
    # another environment: its first run is a new interpreter, which has not run the check; its second a fork of a warm
    # interpreter started with it; the first environment's is still there
    b = {**env, "SPECFMT_T": "b"}
    for mark in ("0", "1"):
        r = warm_run(key, CHECK, ["-c", PROBE], b, cwd=tmp_path)
        assert (r.returncode, r.stdout.split(), r.stderr) == (3, [mark, str(tmp_path), "[]", "b"], "to stderr\n")
    r = warm_run(key, CHECK, ["-c", PROBE], env, cwd=tmp_path)
    assert r.stdout.split()[0] == "1" and r.stdout.split()[-1] == "a"
    # a module run, as ``python -m``: argv[0] is the module's file
    r = warm_run(key, CHECK, ["-m", "json.tool", "--help"], env, cwd=tmp_path)
    assert r.returncode == 0 and "json.tool" in r.stdout, r.stderr


def test_a_run_past_its_timeout_is_killed_and_raises_as_subprocess_run_does(tmp_path):
    key = f"test-{tmp_path}"
    t0 = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        warm_run(key, CHECK, ["-c", "import time; print('started', flush=True); time.sleep(60)"], dict(os.environ), timeout=2)
    assert time.monotonic() - t0 < 30
    r = warm_run(key, CHECK, ["-c", "print('next')"], dict(os.environ), timeout=30)  # the interpreter serves the next run
    assert (r.returncode, r.stdout) == (0, "next\n")
    assert sys.executable in r.args
