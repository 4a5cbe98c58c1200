"""A conversion killed part-way (SIGINT, SIGKILL) leaves nothing at OUT, the source unchanged,
and the next run works (and clears what the killed run left next to OUT)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import WORLD, tree_digest

#: the CLI in a child whose tensor copy pauses after the first tensor (and says so in a file),
#: so the test can interrupt it mid-write, deterministically
CHILD = """
import signal, sys, time
from pathlib import Path
# Ctrl-C as in a terminal: a shell that runs its jobs in the background (a CI runner, nohup ... &)
# starts them with SIGINT ignored, and Python then never raises KeyboardInterrupt
signal.signal(signal.SIGINT, signal.default_int_handler)
import specfmt.checkpoint as ck
flag = Path(sys.argv[1])
orig = ck.SafetensorsStreamWriter.copy
def slow_copy(self, *a, **k):
    r = orig(self, *a, **k)
    flag.write_text("copying")
    time.sleep(60)
    return r
ck.SafetensorsStreamWriter.copy = slow_copy
sys.argv = ["specfmt"] + sys.argv[2:]
from specfmt.cli import main
main()
"""


def start(tmp_path: Path, out: Path) -> tuple[subprocess.Popen, Path]:
    flag = tmp_path / "copying"
    cmd = [sys.executable, "-c", CHILD, str(flag), "convert", "--from", "eagle3", str(WORLD / "eagle3-safeailab"), "-o", str(out),
           "--verifier", str(WORLD / "verifier")]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not flag.exists():
        assert p.poll() is None, p.communicate()
        assert time.time() < deadline, "the child never started copying"
        time.sleep(0.05)
    return p, flag


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["SIGINT", "SIGKILL"])
def test_a_killed_conversion_leaves_nothing_and_the_next_run_works(tmp_path, sig):
    out = tmp_path / "out"
    before = tree_digest(WORLD / "eagle3-safeailab")
    p, _ = start(tmp_path, out)
    temps = [q for q in tmp_path.iterdir() if q.name.startswith(".out.specfmt-")]
    assert len(temps) == 1 and (temps[0] / "model.safetensors").stat().st_size > 0  # really part-way: a partial file exists
    p.send_signal(sig)
    stdout, stderr = p.communicate(timeout=60)
    assert not out.exists()
    if sig == signal.SIGINT:
        assert p.returncode == 130 and "interrupted; nothing was written" in stderr
        assert "Traceback" not in stderr
        assert not temps[0].exists()  # cleaned up on the way out
    else:
        assert p.returncode == -signal.SIGKILL
        assert temps[0].exists()  # nothing could clean up: it sits next to OUT, never at OUT
    r = subprocess.run([sys.executable, "-m", "specfmt", "convert", "--from", "eagle3", str(WORLD / "eagle3-safeailab"), "-o", str(out),
                        "--verifier", str(WORLD / "verifier")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()
    assert not [q for q in tmp_path.iterdir() if q.name.startswith(".out.specfmt-")]  # the killed run's leftovers are gone
    assert tree_digest(WORLD / "eagle3-safeailab") == before
    r = subprocess.run([sys.executable, "-m", "specfmt", "validate", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout
