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


def test_an_aborted_conversion_stops_hashing_its_source(tmp_path, monkeypatch):
    """A conversion that fails while its tensors are written stops the thread hashing the source before it
    raises: nothing reads the source afterwards (the fuzz benchmark truncated a source a refused conversion
    was still hashing, through a memory map, and the process died of SIGBUS)."""
    import threading

    import specfmt.convert as conv
    from specfmt.errors import ConversionError

    def fail(*a, **kw):
        raise ConversionError("stopped here on purpose")

    monkeypatch.setattr(conv, "_write_atomic", fail)
    with pytest.raises(ConversionError, match="on purpose"):
        conv.convert("eagle3", str(WORLD / "eagle3-safeailab"), tmp_path / "out", str(WORLD / "verifier"))
    assert not [t.name for t in threading.enumerate() if t.name == "specfmt-sha256"]
    assert not (tmp_path / "out").exists()


def test_sha256_file_reads_and_can_be_stopped(tmp_path):
    import hashlib
    import threading

    from specfmt.checkpoint.files import sha256_file

    data = bytes(range(256)) * 5000  # 1.28 MB: several pieces of 64 KiB
    (tmp_path / "f").write_bytes(data)
    assert sha256_file(tmp_path / "f", chunk=1 << 16) == hashlib.sha256(data).hexdigest()
    (tmp_path / "empty").write_bytes(b"")
    assert sha256_file(tmp_path / "empty") == hashlib.sha256(b"").hexdigest()
    stop = threading.Event()
    stop.set()
    with pytest.raises(InterruptedError):
        sha256_file(tmp_path / "f", chunk=1 << 16, stop=stop)
