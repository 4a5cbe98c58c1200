"""Ctrl-C, the same in every command: one line on stderr, exit 130, within a bound, no half-written file, and no
engine process left running.

The one mechanism (every command runs inside :func:`guard`, through
:func:`specfmt.cli.common.ctrl_c_ends_in_one_line`; ``tests/test_ctrl_c.py`` walks the command tree):

* **The first SIGINT** raises ``KeyboardInterrupt`` in the main thread, as Python's own handler does, so the code
  that was running unwinds through its ``except`` and ``finally`` blocks: temporary files removed, whole files kept,
  and the one line says what was kept (:class:`~specfmt.errors.DataInterrupted`,
  :class:`~specfmt.errors.TrainInterrupted`; otherwise "interrupted; nothing was written"). At the same moment every
  engine process group registered with :func:`engine_group` is sent SIGTERM: an engine's work is never kept.
* **A watchdog** bounds the rest. If the command still runs :data:`GRACE_S` seconds after the signal -- a library
  swallowed the ``KeyboardInterrupt`` (vLLM 0.32's ``zmq_socket_ctx`` does, while its engine core starts:
  ``vllm/utils/network_utils.py``), or a call into C does not return -- it ends the process: the engine groups and
  every child process killed, the :func:`on_hard_exit` cleanups run, the line printed if none was, exit 130. Code that
  cleans up on purpose for longer (a training state being saved) says so with :func:`finishing`.
* **A swallowed interrupt is raised again** where specfmt gets control back: calls into a library in specfmt's own
  process (vLLM's ``LLM(...)`` and ``generate``) run inside :func:`library_call`, which raises ``KeyboardInterrupt``
  when the call returns after a SIGINT. A library's ``except`` swallows it, and so does Python itself when the signal
  comes while a finalizer (``__del__``) runs; that case would print "Exception ignored in ..." with a traceback,
  which :func:`guard` keeps off the terminal (:func:`_quiet_interrupts`).
* **A second SIGINT** does what the watchdog does, at once.
* **Engines run where the terminal's Ctrl-C does not reach them**, so that only specfmt decides how they stop and
  nothing of theirs is printed: vLLM's engine core in specfmt's own process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``:
  ``specfmt datagen``, ``specfmt regenerate``), or a child process in a session of its own, registered with
  :func:`engine_group` (``validate --run``'s engine host). A child in the terminal's process group gets the
  terminal's SIGINT itself: vLLM's engine-core process then prints a ``KeyboardInterrupt`` traceback while it imports,
  or its own shutdown log after.
* After the line, the command line ends with :func:`exit_now` (``os._exit``): no exit-time handler of a library runs
  (vLLM's finalizers shut an engine down, joining its threads, and log while doing it).

Ctrl-C is SIGINT as a terminal sends it: to every process of the foreground process group. A command started with
SIGINT ignored (a background job of a non-interactive shell) keeps it ignored.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from .errors import Interrupted

#: seconds from the first SIGINT to the watchdog's end of the process (outside :func:`finishing`)
GRACE_S = 10.0
#: seconds an engine process group gets between SIGTERM and SIGKILL
KILL_GRACE_S = 3.0
#: the exit status of an interrupted command (128 + SIGINT, as a shell reports it)
EXIT_CODE = 130

_lock = threading.RLock()
_groups: dict[int, str] = {}  #: process group id -> what runs there
_cleanups: list[Callable[[], None]] = []
_last_words: list[Callable[[], None]] = []  #: prints the one line, when none was printed
_kept: list[Callable[[], "Interrupted"]] = []  #: the line a Ctrl-C would end with now (:func:`describe`)
_state = {"signalled": None, "finishing": 0, "ending": False}
_watchdog: list[threading.Thread] = []


def interrupted() -> bool:
    """Whether a SIGINT arrived while the running command runs (False again once it has ended)."""
    return _state["signalled"] is not None


@contextmanager
def guard(last_words: Callable[[], None]) -> Iterator[None]:
    """Run a command under the Ctrl-C mechanism (module docstring).

    Args:
        last_words: prints the command's one line if it has printed none (called by the watchdog and on a second
            SIGINT, from whichever thread ends the process).

    Outside the main thread, or when SIGINT is ignored, nothing is installed (``signal.signal`` works in the main
    thread only; an ignored SIGINT stays ignored). On the way out (the command's line is printed by then), after a
    Ctrl-C the engine groups still registered are stopped; the previous handler is restored and the watchdog is
    disarmed: the command line then ends at once (:func:`exit_now`), and a caller of the command in Python
    (``typer.testing.CliRunner``) goes on as before. Without a Ctrl-C a group is left to its owner: an engine host of
    an enclosing :func:`specfmt.validation.vllm_run.engines` block outlives the command (CI: a test's in-process
    ``validate --run`` stopped the session's shared host at its end, and the next test wrote its job to the dying
    host: "vLLM exited with code -15 without a result").
    """
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) in (signal.SIG_IGN, None):
        yield
        return
    previous = signal.signal(signal.SIGINT, _on_sigint)
    unraisable = sys.unraisablehook
    sys.unraisablehook = _quiet_interrupts(unraisable)
    _last_words.append(last_words)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        sys.unraisablehook = unraisable
        if interrupted():  # after a Ctrl-C no engine is kept; otherwise each group is its owner's to stop
            for pgid in list(_groups):
                stop_group(pgid)
        with _lock:
            _last_words.remove(last_words)
            _state["signalled"] = None  # the watchdog stops
            _cleanups.clear()
            _kept.clear()


def _quiet_interrupts(hook: Callable[[Any], None]) -> Callable[[Any], None]:
    """``sys.unraisablehook`` that says nothing of a ``KeyboardInterrupt`` raised where Python can only ignore it -- a
    finalizer (``__del__``, a weakref callback) running when the SIGINT came -- and passes anything else to ``hook``.
    Python would print it as "Exception ignored in ..." with a traceback (seen in a test run here: the ``regex``
    package's ``SetBase.__del__``, while vLLM started); the interrupt is not lost: :func:`library_call` and the watchdog end the
    command all the same."""
    def quiet(info: Any) -> None:
        if not isinstance(info.exc_value, KeyboardInterrupt):
            hook(info)

    return quiet


def _on_sigint(signum: int, frame: object) -> None:
    if interrupted():  # a second Ctrl-C
        _end()
    with _lock:
        _state["signalled"] = time.monotonic()
        if not _watchdog:
            t = threading.Thread(target=_watch, name="specfmt-ctrl-c-watchdog", daemon=True)
            _watchdog.append(t)
            t.start()
    for pgid in list(_groups):
        _signal_group(pgid, signal.SIGTERM)
    raise KeyboardInterrupt


def _watch() -> None:
    while True:
        time.sleep(0.1)
        with _lock:
            if _state["signalled"] is None:  # the command ended: its line is printed
                _watchdog.clear()
                return
            if time.monotonic() - _state["signalled"] >= GRACE_S and not _state["finishing"]:
                _end()


def _end() -> None:
    """End the process now: engine groups and children killed, cleanups run, the line printed, exit 130."""
    with _lock:
        if _state["ending"]:  # pragma: no cover - the other thread is ending it
            return
        _state["ending"] = True
    exit_now(EXIT_CODE, cleanups=True)


def exit_now(code: int, *, cleanups: bool = False) -> None:
    """Leave the process at once with ``code``: every engine group and child process killed, the
    :func:`on_hard_exit` cleanups run when asked (the watchdog, a second Ctrl-C: no ``finally`` block ran), the one
    line printed if none was, stdout and stderr flushed, then ``os._exit`` -- no library's exit-time handler runs
    after the line."""
    for pgid in list(_groups):
        _signal_group(pgid, signal.SIGKILL)
    for pid in descendants():
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    if cleanups:
        for fn in list(_cleanups):
            try:
                fn()
            except Exception:  # noqa: BLE001 - best effort, the process is ending
                pass
    for words in list(_last_words)[-1:]:
        try:
            words()
        except Exception:  # noqa: BLE001
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed pipe
            pass
    os._exit(code)


@contextmanager
def finishing() -> Iterator[None]:
    """Cleanup that takes as long as it takes: the watchdog waits for the block to end (a second Ctrl-C does not)."""
    with _lock:
        _state["finishing"] += 1
    try:
        yield
    finally:
        with _lock:
            _state["finishing"] -= 1
            if interrupted():  # the watchdog's grace starts again after the block
                _state["signalled"] = time.monotonic()


@contextmanager
def library_call() -> Iterator[None]:
    """Around a call into a library that may swallow the ``KeyboardInterrupt`` of a SIGINT (vLLM's ``LLM(...)`` and
    ``generate`` in specfmt's own process): when the call returns normally after a SIGINT arrived, the
    ``KeyboardInterrupt`` is raised again here, so the command ends as interrupted at once -- not only when the
    watchdog's :data:`GRACE_S` runs out, and never with exit 0 when the call happened to finish within the grace
    (a CI run: ``regenerate`` interrupted while vLLM loaded the verifier wrote all its lines and exited 0)."""
    yield
    if interrupted():
        raise KeyboardInterrupt


def on_hard_exit(fn: Callable[[], None]) -> Callable[[], None]:
    """Register a quick cleanup (remove a temporary folder) run when the watchdog or a second Ctrl-C ends the
    process, whose ``finally`` blocks then never run; returns ``fn`` (pass it to :func:`forget`)."""
    _cleanups.append(fn)
    return fn


def forget(fn: Callable[..., object]) -> None:
    """Unregister an :func:`on_hard_exit` cleanup (its ``finally`` block ran) or a :func:`describe`."""
    for registry in (_cleanups, _kept):
        while fn in registry:
            registry.remove(fn)


def describe(kept: Callable[[], "Interrupted"]) -> Callable[[], "Interrupted"]:
    """Say what a Ctrl-C keeps from here on: ``kept()`` is the :class:`~specfmt.errors.Interrupted` the command's own
    ``except`` block raises, which the watchdog prints when that block never ran; returns ``kept`` (pass it to
    :func:`forget`)."""
    _kept.append(kept)
    return kept


def interruption() -> "Interrupted | None":
    """The error the running command would end with on a Ctrl-C now (the latest :func:`describe`'s), or None."""
    for kept in reversed(_kept):
        try:
            return kept()
        except Exception:  # noqa: BLE001 - the generic line is printed instead
            return None
    return None


def engine_group(pgid: int, what: str) -> None:
    """Register a child started in a process group of its own (``start_new_session=True``): Ctrl-C sends it
    SIGTERM at once, and it is killed when the command ends. :func:`stop_group` unregisters it."""
    _groups[pgid] = what


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_group(pgid: int, leader: "object | None" = None, grace: float = KILL_GRACE_S) -> None:
    """Stop a process group: SIGTERM, then SIGKILL to whatever is left after ``grace`` seconds; unregister it.

    Args:
        pgid: the group (its leader's pid).
        leader: the leader's ``subprocess.Popen``, reaped here (a zombie leader keeps the group alive).
        grace: seconds between SIGTERM and SIGKILL.
    """
    import subprocess

    _signal_group(pgid, signal.SIGTERM)
    if leader is not None:
        try:
            leader.wait(timeout=grace)  # type: ignore[attr-defined]
        except subprocess.TimeoutExpired:
            pass
    else:
        _wait_gone(pgid, grace)
    _signal_group(pgid, signal.SIGKILL)
    if leader is not None:
        leader.wait()  # type: ignore[attr-defined]
    else:  # a killed process takes a while to die (its memory freed): its owner then finds it ended, not running
        _wait_gone(pgid, grace)
    _groups.pop(pgid, None)


def _wait_gone(pgid: int, seconds: float) -> None:
    """Wait up to ``seconds`` for the group to hold no live process (:func:`_group_alive`)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and _group_alive(pgid):
        time.sleep(0.05)


def _group_alive(pgid: int) -> bool:
    """Whether a live process (not a zombie: an unreaped leader keeps ``killpg(pgid, 0)`` succeeding) is in the group."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:
        names = os.listdir("/proc")
    except OSError:  # no /proc: the group exists
        return True
    for name in names:
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    stat = f.read().decode(errors="replace")
            except OSError:
                continue
            fields = stat[stat.rfind(")") + 2:].split()  # state, ppid, pgrp, ...
            if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return False


def descendants(pid: int | None = None) -> list[int]:
    """Every live process below ``pid`` (default: this one), children first (Linux ``/proc``; empty elsewhere)."""
    root = os.getpid() if pid is None else pid
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()  # after "pid (comm) ": state, ppid, ...
        if fields and fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(name))
    out: list[int] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def parent_watch() -> None:
    """In a child started in a session of its own: end this process when its parent dies (the terminal's signals
    no longer reach it, and a parent killed with SIGKILL cannot stop it)."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != parent:
                os._exit(EXIT_CODE)

    threading.Thread(target=watch, name="specfmt-parent-watch", daemon=True).start()


__all__ = ["EXIT_CODE", "GRACE_S", "KILL_GRACE_S", "descendants", "describe", "engine_group", "exit_now", "finishing", "forget", "library_call",
           "guard", "interrupted", "interruption", "on_hard_exit", "parent_watch", "stop_group"]
