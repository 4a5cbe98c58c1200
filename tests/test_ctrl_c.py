"""Ctrl-C anywhere ends in one line and exit 130 (:mod:`specfmt.interrupt`, ``ctrl_c_ends_in_one_line``).

Every command wears the mechanism (the typer app's command tree is walked, so a new command cannot forget it).
Each command that starts an engine is run as a user runs it: ``python3 -m specfmt ...`` in a process group of its
own, sent SIGINT as a terminal sends it (to the whole group) at a point read from its output -- vLLM loading the
verifier's weights (its ``Loading safetensors checkpoint shards`` line: inside ``vllm.LLM(...)``), a progress line
-- or, where nothing is printed, at a point a child script announces (it patches one function to say so and wait).
Each run asserts: exit 130 within :data:`BOUND_S` of the signal; after the signal exactly one line on stderr, the
error line saying what was kept (progress lines already on their way excepted); no ``Traceback`` anywhere; no
half-written file; and no process left of the command's (every process started carries a tag in its environment,
which this test looks for in ``/proc``).

The vLLM runs (marked ``vllm``) are kept few for the CI budget: ``datagen``, ``validate --run`` and ``regenerate`` run
at once, each interrupted while vLLM loads the weights (three partial engine starts, side by side), and one
``datagen`` run is interrupted during extraction (one full engine start).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from conftest import REPO

WORLD = REPO / "examples" / "world"
VERIFIER = WORLD / "verifier"
#: the mechanism's own bound: the watchdog's grace plus an engine group's kill grace, plus the interpreter's exit on a
#: busy 2-core machine (measured: 0.3-1.5 s from the signal to the exit in these runs)
BOUND_S = 10.0 + 3.0 + 5.0
#: vLLM 0.32 loading the verifier's weights, inside ``vllm.LLM(...)`` (``vllm/model_executor/model_loader``)
LOADING = r"Loading safetensors checkpoint shards"
TAG = "SPECFMT_TEST_CTRL_C"


def _reset_sigint() -> None:  # a shell that runs jobs in the background starts them with SIGINT ignored
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Run:
    """A command in a process group of its own, its output read line by line with the time each line came."""

    def __init__(self, args: list[str], env: dict | None = None, script: str | None = None):
        self.tag = uuid.uuid4().hex
        cmd = [sys.executable, "-c", script, *args] if script else [sys.executable, "-m", "specfmt", *args]
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                                     preexec_fn=_reset_sigint, env={**os.environ, TAG: self.tag, **(env or {})})
        self.lines: list[tuple[float, str, str]] = []
        self.signalled: float | None = None
        self._new = threading.Condition()
        self.ended: float | None = None  #: when the process ended (a thread waits for it)
        self._pumps = [threading.Thread(target=self._pump, args=(s, n), daemon=True) for s, n in ((self.proc.stdout, "out"), (self.proc.stderr, "err"))]
        for t in [*self._pumps, threading.Thread(target=self._wait, daemon=True)]:
            t.start()

    def _wait(self) -> None:
        self.proc.wait()
        self.ended = time.monotonic()

    def _pump(self, stream, name: str) -> None:
        for line in stream:
            with self._new:
                self.lines.append((time.monotonic(), name, line.rstrip("\n")))
                self._new.notify_all()

    def seen(self, pattern: str, stream: str = "err") -> bool:
        """Whether a line of ``stream`` matching ``pattern`` came."""
        with self._new:
            return any(name == stream and re.search(pattern, text) for _, name, text in self.lines)

    def wait_for(self, pattern: str, stream: str = "err", timeout: float = 300) -> str:
        """The first line of ``stream`` matching ``pattern``, waited for (the command must not end first)."""
        deadline = time.monotonic() + timeout
        with self._new:
            while True:
                hit = next((text for _, name, text in self.lines if name == stream and re.search(pattern, text)), None)
                if hit is not None:
                    return hit
                assert self.proc.poll() is None or any(t.is_alive() for t in self._pumps), f"ended before {pattern!r}:\n{self.text()}"
                assert time.monotonic() < deadline, f"no {pattern!r} within {timeout} s:\n{self.text()}"
                self._new.wait(0.2)

    def ctrl_c(self) -> None:
        """SIGINT to the command's process group, as a terminal's Ctrl-C."""
        self.signalled = time.monotonic()
        os.killpg(self.proc.pid, signal.SIGINT)

    def finish(self, timeout: float = 120) -> float:
        """Wait for the end; the seconds from the signal to the exit."""
        try:
            self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:  # never leave it running
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        for t in self._pumps:
            t.join(10)
        while self.ended is None:
            time.sleep(0.01)
        return self.ended - (self.signalled or self.t0)

    def text(self) -> str:
        return "\n".join(f"{t - self.t0:7.1f} {n} {x}" for t, n, x in self.lines)

    def after_signal(self, stream: str = "err", ignore: str | None = None) -> list[str]:
        """The lines of ``stream`` that came after the signal, but for those matching ``ignore`` (a library's progress bar in
        flight when the signal came) and, with ``ignore``, the blank lines that bar writes around itself (vLLM's "Loading
        safetensors checkpoint shards" bar, seen in CI as two blank lines before the one line)."""
        return [x for t, n, x in self.lines if n == stream and t >= self.signalled and not (ignore and (re.search(ignore, x) or not x.strip()))]

    def leftovers(self) -> list[str]:
        """Processes still alive that carry this run's tag in their environment (its own, and all it started)."""
        left = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                env = Path(f"/proc/{pid}/environ").read_bytes()
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                continue
            if f"{TAG}={self.tag}".encode() in env and stat[stat.rfind(")") + 2] != "Z":
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                left.append(f"{pid} {cmdline[:200]}")
        return left


def assert_one_line(run: Run, seconds: float, line: str, ignore: str | None = None) -> None:
    """Exit 130 within the bound, the one line (and only it) on stderr after the signal, no traceback, nothing left."""
    assert run.proc.returncode == 130, run.text()
    assert seconds <= BOUND_S, f"{seconds:.1f} s from the signal to the exit\n{run.text()}"
    assert run.after_signal("err", ignore) == [line], run.text()
    assert "Traceback" not in run.text()
    assert run.leftovers() == []


def half_written(folder: Path) -> list[str]:
    """Files under ``folder`` that are not finished: temporary names, staging folders, vLLM's lock files."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")
                  if re.search(r"\.(tmp|part|lock)$", p.name) or p.name.startswith((".vllm-staging", ".preprocessed")))


def assert_whole_hidden_states(folder: Path) -> int:
    """Every ``hs_*.safetensors`` opens and holds [T, 4, 128] states for T token ids; returns how many there are."""
    from safetensors.torch import load_file

    files = sorted(folder.glob("hs_*.safetensors"))
    for f in files:
        t = load_file(str(f))
        assert t["hidden_states"].shape[1:] == (4, 128) and t["hidden_states"].shape[0] == t["token_ids"].shape[0] > 0, f
    return len(files)


def data_file(path: Path, n: int, key: str = "text") -> Path:
    """``n`` jsonl rows of Python source (the stdlib's ``os.py`` in pieces of 600 characters)."""
    import os as os_module

    src = Path(os_module.__file__).read_text()
    path.write_text("".join(json.dumps({key: src[i * 600:(i + 1) * 600]}) + "\n" for i in range(n)))
    return path


# ------------------------------------------------------------------ every command

def _leaf_commands(group, prefix: str = "") -> dict:
    out = {}
    for name, cmd in group.commands.items():
        if hasattr(cmd, "commands"):  # a group (typer ships its own click)
            out.update(_leaf_commands(cmd, f"{prefix}{name} "))
        else:
            out[prefix + name] = cmd
    return out


def test_every_command_ends_in_one_line_on_ctrl_c():
    """Each command of the CLI, as click dispatches it, runs inside ``ctrl_c_ends_in_one_line`` (found along the
    callback's ``__wrapped__`` chain: typer's wrapper, then ours)."""
    import typer

    from specfmt.cli import app

    commands = _leaf_commands(typer.main.get_command(app))
    assert {"convert", "upgrade", "validate", "inspect", "serve-command", "push", "datagen", "regenerate", "train fill",
            "train eagle3"} <= set(commands)  # the walk reaches every level
    bare = []
    for name, cmd in commands.items():
        fn, worn = cmd.callback, False
        while fn is not None and not worn:
            worn = getattr(fn, "ctrl_c_ends_in_one_line", False)
            fn = getattr(fn, "__wrapped__", None)
        if not worn:
            bare.append(name)
    assert bare == []


# ------------------------------------------------------------------ the mechanism itself

#: ``specfmt inspect`` whose detection behaves as vLLM 0.32's engine start did: it swallows the KeyboardInterrupt
#: (``zmq_socket_ctx``) and waits on processes of its own -- one in a session of its own (registered, as
#: ``validate --run``'s host), one in the command's group that ignores SIGINT (as vLLM's engine core handles it)
SWALLOWS = """
import os, signal, subprocess, sys, time
from pathlib import Path
import specfmt.interrupt as interrupt
interrupt.GRACE_S = float(sys.argv[2])
marker = Path(sys.argv[1])
saving = float(sys.argv[4]) if len(sys.argv) > 4 else None
SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]
IGNORE = lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)  # from its start: no KeyboardInterrupt while it starts

def swallowing_detect(path):
    engine = subprocess.Popen(SLEEP, start_new_session=True)
    interrupt.engine_group(engine.pid, "an engine")
    subprocess.Popen(SLEEP, preexec_fn=IGNORE)
    interrupt.on_hard_exit(lambda: marker.write_text("cleaned up"))
    said = False
    while True:
        try:
            if not said:  # said inside the try: a Ctrl-C right after it is swallowed too
                said = True
                print("waiting", file=sys.stderr, flush=True)
            time.sleep(600)
        except KeyboardInterrupt:
            if saving:  # a cleanup that takes its time on purpose (a training state saved), then the line
                with interrupt.finishing():
                    time.sleep(saving)
                    marker.write_text("saved")
                raise

import specfmt.detect
specfmt.detect.detect = swallowing_detect
sys.argv = ["specfmt", "inspect", sys.argv[3]]
from specfmt.cli import main
main()
"""


@pytest.mark.parametrize("how", ["the watchdog", "a second Ctrl-C", "a cleanup that takes its time"])
def test_a_swallowed_ctrl_c_still_ends_in_one_line(tmp_path, how):
    """The watchdog ends a command whose KeyboardInterrupt a library swallowed, GRACE_S after the signal (here 1 s);
    a second Ctrl-C ends it at once (here the grace is 60 s). Either way: the engine's group and the child in the
    command's group are killed, the hard-exit cleanup runs, one line, exit 130. A cleanup inside
    ``interrupt.finishing()`` (saving a training state) is waited for past the grace (here 2.5 s against 1 s)."""
    grace = 60.0 if how == "a second Ctrl-C" else 1.0
    marker = tmp_path / "cleaned"
    run = Run([str(marker), str(grace), str(WORLD / "eagle3-safeailab")] + (["2.5"] if how == "a cleanup that takes its time" else []),
              script=SWALLOWS)
    run.wait_for("^waiting$")
    run.ctrl_c()
    if how == "a second Ctrl-C":
        time.sleep(0.5)
        assert run.proc.poll() is None  # the first one was swallowed
        os.killpg(run.proc.pid, signal.SIGINT)
    seconds = run.finish()
    assert_one_line(run, seconds, "specfmt: error: interrupted; nothing was written")
    if how == "a cleanup that takes its time":
        assert marker.read_text() == "saved" and 2.5 <= seconds < 6, seconds
    else:
        assert marker.read_text() == "cleaned up" and seconds < (grace + 3 if how == "the watchdog" else 3), seconds


SWALLOWING_VLLM = """
import importlib.machinery, os, signal, sys, types

class LLM:  # vLLM's LLM(...) as CI saw it: a SIGINT while it starts is swallowed, and the start goes on
    def __init__(self, **kwargs):
        try:
            print("starting", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(10**6):  # the handler runs between two bytecodes of this loop
                pass
        except KeyboardInterrupt:
            pass

    def generate(self, prompts, params, use_tqdm=False):
        one = types.SimpleNamespace(token_ids=[1, 2], finish_reason="stop")
        return [types.SimpleNamespace(outputs=[one]) for _ in prompts]

vllm = types.ModuleType("vllm")
vllm.__spec__ = importlib.machinery.ModuleSpec("vllm", None)
vllm.LLM, vllm.SamplingParams = LLM, lambda **kwargs: kwargs
platforms = types.ModuleType("vllm.platforms")
platforms.current_platform = types.SimpleNamespace(is_cpu=lambda: True)
sys.modules.update({"vllm": vllm, "vllm.platforms": platforms})
sys.argv = ["specfmt", *sys.argv[1:]]
from specfmt.cli import main
main()
"""


def test_a_ctrl_c_a_library_swallows_and_returns_from_ends_the_command_at_once(tmp_path):
    """CI's failure: ``regenerate`` was interrupted while vLLM loaded the verifier, vLLM swallowed the
    KeyboardInterrupt and finished starting within the watchdog's grace, and the command wrote every line and exited 0.
    ``interrupt.library_call`` raises the interrupt again when the call returns: one line, exit 130, no line written."""
    out = tmp_path / "regen.jsonl"
    run = Run(["regenerate", "--verifier", str(VERIFIER), "--data", str(data_file(tmp_path / "in.jsonl", 4, "prompt")), "-o", str(out),
               "--max-model-len", "256", "--max-tokens", "8"], script=SWALLOWING_VLLM)
    run.wait_for("^starting$")
    run.signalled = next(t for t, _, x in run.lines if x == "starting") + 1e-6  # the command signals itself, inside LLM(...)
    seconds = run.finish()
    assert_one_line(run, seconds, f"specfmt: error: interrupted after 0 of 4 conversations (whole lines only) [{out}]; "
                                  f"continue with the same command and --resume")
    assert seconds < 5, seconds  # at once, not after the watchdog's grace
    assert not out.exists() or out.read_text() == ""


@pytest.fixture
def pythons_sigint():
    """Python's own SIGINT handler for the test, as in a terminal (a pytest-xdist worker may start with SIGINT ignored,
    and the guard then installs nothing, as for a background job); the process's own is back after it."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def test_a_ctrl_c_during_a_finalizer_prints_nothing_and_is_raised_when_the_library_returns(monkeypatch, pythons_sigint):
    """Seen in a test run here: the SIGINT came while the ``regex`` package's ``SetBase.__del__`` ran inside vLLM's
    start; Python cannot raise there and printed "Exception ignored in ..." with a traceback. Under the guard nothing is printed, and
    ``library_call`` raises the interrupt when the call returns."""
    import gc

    from specfmt import interrupt

    class Finalized:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(10**6):  # the handler runs between two bytecodes of this loop, inside __del__
                pass

    def library() -> str:
        Finalized()  # dropped at once: its __del__ runs here
        gc.collect()
        return "done"

    reported = []  # what Python would print as "Exception ignored in ..." (its default hook; pytest's own here)
    monkeypatch.setattr(sys, "unraisablehook", lambda info: reported.append(info.exc_type))
    with pytest.raises(KeyboardInterrupt), interrupt.guard(lambda: None), interrupt.library_call():
        assert library() == "done"  # the call itself saw nothing
    assert reported == [] and not interrupt.interrupted()
    Finalized.__del__ = lambda self: (_ for _ in ()).throw(ValueError("ours"))  # anything else is still reported
    with interrupt.guard(lambda: None):
        Finalized()
        gc.collect()
    assert reported == [ValueError]
    with pytest.raises(KeyboardInterrupt):  # outside the guard Python's own handler is back
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)


def test_a_command_that_ends_without_ctrl_c_leaves_an_enclosing_blocks_engine_running(pythons_sigint):
    """CI: a test's in-process ``validate --run`` stopped the session's shared engine host at its end (the guard
    stopped every registered group), and the next test wrote its job to the dying host ("vLLM exited with code -15
    without a result"). Without a Ctrl-C a group is its owner's to stop; after one, it is stopped."""
    from specfmt import interrupt

    engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        interrupt.engine_group(engine.pid, "an enclosing block's engine")
        with interrupt.guard(lambda: None):
            pass
        time.sleep(0.5)
        assert engine.poll() is None  # still running, still registered: its owner stops it
        with pytest.raises(KeyboardInterrupt), interrupt.guard(lambda: None):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
        assert engine.wait(timeout=10) == -signal.SIGTERM  # a Ctrl-C keeps no engine
    finally:
        interrupt.stop_group(engine.pid, leader=engine)


# ------------------------------------------------------------------ what each point keeps (in this process)

def _ctrl_c_when(target, name: str, monkeypatch, when=lambda *a, **k: True) -> None:
    """Make ``target.name`` raise KeyboardInterrupt (as a Ctrl-C arriving in it would) when ``when(*args)`` holds."""
    real = getattr(target, name)

    def patched(*a, **k):
        if when(*a, **k):
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(target, name, patched)


@pytest.mark.parametrize("point", ["reading the data", "writing token_freq.pt", "engine shutdown", "writing the manifest"])
def test_datagen_ctrl_c_at_each_point_keeps_whole_files_and_says_what(tmp_path, monkeypatch, point):
    """A Ctrl-C at each point of ``run_datagen`` (transformers engine) becomes one DataInterrupted that says how many
    hidden-state files this run made; nothing half-written is left (the files written aside are removed)."""
    from specfmt.datagen import layout
    from specfmt.datagen import pipeline as dg
    from specfmt.datagen.hf_engine import TransformersEngine
    from specfmt.errors import DataInterrupted

    if point == "reading the data":
        _ctrl_c_when(dg, "read_samples", monkeypatch)
    elif point == "writing token_freq.pt":
        _ctrl_c_when(layout.os, "replace", monkeypatch, lambda src, dst: Path(dst).name == "token_freq.pt")
    elif point == "engine shutdown":
        _ctrl_c_when(TransformersEngine, "close", monkeypatch)
    else:  # the manifest is written first (what the run is made from) and again at the end, with the figures: the end
        _ctrl_c_when(layout.os, "replace", monkeypatch,
                     lambda src, dst: Path(dst).name == layout.MANIFEST and any((Path(dst).parent / "hidden_states").glob("hs_*.safetensors")))
    out = tmp_path / "out"
    req = dg.DatagenRequest(verifier=str(VERIFIER), data=[str(data_file(tmp_path / "d.jsonl", 3))], output=str(out), seq_len=64,
                            engine="transformers")
    try:
        dg.run_datagen(req)
        pytest.fail("not interrupted")
    except DataInterrupted as e:
        error = e
    except KeyboardInterrupt:
        pytest.fail(f"Ctrl-C while {point} escaped as a KeyboardInterrupt")
    made = 3 if point in ("engine shutdown", "writing the manifest") else 0
    kept = "before any hidden states were made" if made == 0 else f"after {made} of 3 samples"
    assert error.one_line() == (f"interrupted {kept}; every file in place is whole [{out}]; run the same command again to resume")
    assert error.exit_code == 130 and error.done == made
    assert (assert_whole_hidden_states(out / "hidden_states") if (out / "hidden_states").exists() else 0) == made
    assert half_written(out) == [] if out.exists() else True


def test_the_vllm_engine_removes_its_staging_folder_when_its_shutdown_is_interrupted(tmp_path):
    """Ctrl-C inside vLLM's shutdown (``VllmEngine.close``): the staging folder, which may hold a file vLLM was writing,
    is removed all the same."""
    from types import SimpleNamespace

    from specfmt.datagen.vllm_engine import VllmEngine

    class Core:
        def shutdown(self):
            raise KeyboardInterrupt

    engine = VllmEngine(str(VERIFIER))
    staging = tmp_path / ".vllm-staging"
    staging.mkdir()
    (staging / "hs_3.safetensors.part").write_bytes(b"half")
    engine._stagings, engine._llm = [staging], SimpleNamespace(llm_engine=SimpleNamespace(engine_core=Core()))
    with pytest.raises(KeyboardInterrupt):
        engine.close()
    assert not staging.exists()


def test_regenerate_provenance_record_interrupted_leaves_no_temporary_file(tmp_path, monkeypatch):
    from specfmt.datagen import regenerate as rg

    _ctrl_c_when(rg.os, "replace", monkeypatch)
    output = rg.Output(tmp_path / "out.jsonl", {"settings": {}, "verifier": "v", "input_sha256": "0", "dtype": "auto"})
    with pytest.raises(KeyboardInterrupt):
        output.open(resume=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# ------------------------------------------------------------------ vLLM: datagen, validate --run, regenerate

@pytest.mark.vllm
def test_ctrl_c_while_vllm_starts_in_datagen_validate_and_regenerate(tmp_path):
    """The issue's hang: SIGINT while vLLM loads the verifier (inside ``vllm.LLM``) ends in one line, at once, in each
    command that starts vLLM. ``datagen`` and ``regenerate`` run vLLM's engine core in their own process;
    ``validate --run`` in its engine host, a child in a session of its own whose group is stopped (its log shows the
    point). The three run at once, each interrupted at its own point (one partial engine start each, in parallel)."""
    from specfmt.convert import convert

    draft = tmp_path / "draft"
    convert("eagle3", str(WORLD / "eagle3-safeailab"), draft, str(VERIFIER))
    before = sorted(p.name for p in draft.iterdir())
    logs = tmp_path / "tmp"
    logs.mkdir()
    out, regen = tmp_path / "out", tmp_path / "regen.jsonl"
    runs = {
        "datagen": Run(["datagen", "--verifier", str(VERIFIER), "--data", str(data_file(tmp_path / "d.jsonl", 8)), "--seq-len", "128",
                        "--engine", "vllm", "-o", str(out)]),
        "regenerate": Run(["regenerate", "--verifier", str(VERIFIER), "--data", str(data_file(tmp_path / "in.jsonl", 4, "prompt")),
                           "-o", str(regen), "--max-model-len", "256", "--max-tokens", "8"]),
        "validate --run": Run(["validate", str(draft), "--run", "--max-tokens", "8"], env={"TMPDIR": str(logs)}),
    }
    points = {"datagen": lambda r: r.seen(LOADING), "regenerate": lambda r: r.seen(LOADING),
              "validate --run": lambda r: any(re.search(LOADING, p.read_text(errors="replace")) for p in logs.glob("specfmt-vllm-*.log"))}
    deadline = time.monotonic() + 600
    try:
        while any(r.signalled is None for r in runs.values()):
            for name, r in runs.items():
                if r.signalled is None and points[name](r):
                    r.ctrl_c()
                assert r.signalled is not None or r.proc.poll() is None, f"{name} ended before its point:\n{r.text()}"
            assert time.monotonic() < deadline, {name: r.text()[-2000:] for name, r in runs.items()}
            time.sleep(0.05)
    finally:
        for r in runs.values():
            if r.signalled is None and r.proc.poll() is None:  # a failed wait: stop it now
                os.killpg(r.proc.pid, signal.SIGKILL)
        seconds = {name: r.finish() for name, r in runs.items()}
    assert_one_line(runs["datagen"], seconds["datagen"], f"specfmt: error: interrupted after 0 of 8 samples; every file in place is whole "
                                                         f"[{out}]; run the same command again to resume", ignore=LOADING)
    assert assert_whole_hidden_states(out / "hidden_states") == 0 and half_written(out) == []
    assert_one_line(runs["regenerate"], seconds["regenerate"], f"specfmt: error: interrupted after 0 of 4 conversations (whole lines only) "
                                                               f"[{regen}]; continue with the same command and --resume", ignore=LOADING)
    assert not regen.exists() and half_written(tmp_path) == []
    assert_one_line(runs["validate --run"], seconds["validate --run"], "specfmt: error: interrupted; nothing was written")
    assert sorted(p.name for p in draft.iterdir()) == before
    print("\n" + "; ".join(f"{name}: exit 130 {sec:.1f} s after the signal" for name, sec in seconds.items()))


#: ``specfmt datagen`` with the vLLM engine handing vLLM 4 samples per call (the default is 256), so that files are
#: placed while later ones are still being made
SMALL_BATCHES = """
import sys
from specfmt.datagen import vllm_engine
real = vllm_engine.VllmEngine.__init__
def init(self, *a, **kw):
    real(self, *a, **{**kw, "batch_size": 4})
vllm_engine.VllmEngine.__init__ = init
sys.argv = ["specfmt"] + sys.argv[1:]
from specfmt.cli import main
main()
"""


@pytest.mark.vllm
def test_datagen_vllm_ctrl_c_during_extraction(tmp_path):
    """The issue's swallowed Ctrl-C: SIGINT once files are being placed ends in one line naming them; each whole,
    vLLM's staging folder removed, no process left."""
    out = tmp_path / "out"
    run = Run(["datagen", "--verifier", str(VERIFIER), "--data", str(data_file(tmp_path / "d.jsonl", 40)), "--seq-len", "128",
               "--engine", "vllm", "-o", str(out)], script=SMALL_BATCHES)
    run.wait_for(r"^hidden states 8/40 ")
    run.ctrl_c()
    seconds = run.finish()
    made = assert_whole_hidden_states(out / "hidden_states")
    assert 8 <= made < 40
    assert_one_line(run, seconds, f"specfmt: error: interrupted after {made} of 40 samples; every file in place is whole [{out}]; "
                                  "run the same command again to resume", ignore=r"^hidden states \d+/40 ")
    assert half_written(out) == []
    print(f"\ndatagen, vLLM extracting: exit 130 {seconds:.1f} s after the signal, {made} files kept")


def test_push_ctrl_c_says_what_the_hub_holds(monkeypatch):
    """``push``: a Ctrl-C while the commit is sent says what the push did on the Hub (here: created the repo) and that
    the commit is there whole or not at all."""
    from types import SimpleNamespace

    import huggingface_hub
    from huggingface_hub.errors import RepositoryNotFoundError

    from specfmt.errors import Interrupted
    from specfmt.hub import transport
    from specfmt.hub.push import PushPlan

    class Api:
        endpoint = "https://hub.example"
        created = False

        def __init__(self, token=None):
            pass

        def repo_info(self, repo_id, revision=None):
            if not Api.created:
                raise RepositoryNotFoundError("no such repo", response=SimpleNamespace(headers={}, status_code=404, request=None))
            return SimpleNamespace(private=False, sha="0" * 40)

        def create_repo(self, repo_id, private=False, exist_ok=False):
            Api.created = True

        def list_repo_files(self, repo_id, revision=None):
            return []

        def create_commit(self, *a, **kw):
            raise KeyboardInterrupt

    monkeypatch.setattr(huggingface_hub, "HfApi", Api)
    monkeypatch.setenv("HF_TOKEN", "hf_x")
    monkeypatch.setattr(transport, "_operations", lambda plan, delete: [])
    plan = PushPlan(folder=Path("."), repo_id="me/draft", revision=None, create_pr=False, private=False, verifier="v", files=[], card="",
                    card_origin="generated", commit_message="m")
    with pytest.raises(Interrupted) as e:
        transport.push(plan)
    assert e.value.one_line() == ("interrupted; the push created the repo me/draft; the commit was being sent: the Hub has it whole or not "
                                  "at all [me/draft]; run the same command again (files the Hub holds are not sent again)")
    assert e.value.exit_code == 130
