"""The one way specfmt writes a folder: beside OUT, then renamed into place, never over an input.

``OUT`` is the old folder or the new one at every moment, never a half-written one:
everything is written into a temporary folder ``.OUT.specfmt-PID-*`` next to it, which is
renamed to ``OUT`` once complete. A run killed with SIGKILL leaves only that temporary
folder, never a partial ``OUT``; the next run on the same ``OUT`` removes it.

One rule for every command that writes: OUT is never an input, never inside one, and never
contains one (:func:`check_output`); ``--force`` replaces an earlier output, never an input, and a
command that continues its own earlier output (``datagen``, ``regenerate --resume``) continues
nothing else. Every writer passes the full list of its inputs as :class:`Input` values. On the
command line the rule is applied before a command's body runs, from the command's declaration of
its OUT and its inputs (:func:`specfmt.cli.output.writes`), so a new command cannot skip it; the
library functions (:func:`specfmt.convert.convert`, :func:`specfmt.draft.save_draft`, the
training and datagen pipelines) apply it again with what only they resolve.

What is written gets the permissions of a file or folder made with ``open()`` / ``mkdir()``
under the process umask (:func:`apply_umask`): ``0666 & ~umask`` for files, ``0777 & ~umask``
for folders, whichever library wrote the bytes (safetensors' ``save_file`` makes 0600 files,
``mkdtemp`` 0700 folders).

Every draft folder is written through it (:func:`specfmt.draft.write_folder`: ``convert``,
``upgrade`` and the trainer's :func:`specfmt.draft.save_draft`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

from ..errors import InputError, OutputExistsError
from .files import containing_root


@dataclass(frozen=True)
class Input:
    """One input of a writing command, as the user named it.

    Attributes:
        label: the argument or option that named it (``SRC``, ``--verifier``, ``--init``,
            ``--data``, ``--prompts``, ``--cache``), as the refusal quotes it.
        path: where it is on disk: a folder or a file, as given (a symlink is followed by
            :func:`check_output`); need not exist.
        hub: the Hub id when ``path`` is that id's snapshot in the Hugging Face cache (the whole
            repo cache folder, ``models--OWNER--NAME``, is then the input).
    """

    label: str
    path: Path
    hub: str | None = None

    @classmethod
    def of(cls, label: str, ref: "str | os.PathLike[str] | None", resolved=None) -> "list[Input]":
        """The input behind one argument: ``ref`` as typed, or, for a Hub id, the snapshot folder
        it was ``resolved`` to (a :class:`specfmt.sources.resolve.Resolved`) in the Hugging Face cache.
        ``ref`` None (an option not given) gives none."""
        if resolved is not None and resolved.is_hub:
            return [cls(label, Path(resolved.folder), hub=str(resolved.name_or_path))]
        if ref is None:
            return [cls(label, Path(resolved.folder))] if resolved is not None else []
        return [cls(label, Path(ref).expanduser())]


class OutputOverlapError(InputError):
    """OUT is an input, lies inside one, or contains one (``--force`` does not lift this).

    Attributes:
        relation: ``is``, ``lies inside`` or ``contains``.
        input: the :class:`Input` OUT collides with.
        at: the path of the collision (the input, its Hub cache folder, or a file it links to).
    """

    def __init__(self, message: str, *, relation: str, input: Input, at: Path, **kw):
        super().__init__(message, **kw)
        self.relation = relation
        self.input = input
        self.at = at


def real_path(path: "str | os.PathLike[str]") -> Path:
    """``path`` absolute, with ``~`` expanded and every symlink followed (``os.path.realpath``:
    unlike ``Path.resolve`` on Python 3.11, a symlink loop is not an exception)."""
    return Path(os.path.realpath(Path(path).expanduser()))


def _same(a: Path, b: Path) -> bool:
    """Same path, or the same entry on disk (a case-insensitive file system, a bind mount). Entries
    are compared without following a final symlink: the callers pass resolved paths, except for an
    input's own path as given, which then stands for the link itself."""
    if a == b:
        return True
    try:
        sa, sb = os.lstat(a), os.lstat(b)
    except OSError:  # one of them does not exist
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def _relation(out: Path, other: Path) -> str | None:
    """How OUT stands to ``other`` (both resolved): ``is``, ``lies inside``, ``contains`` or None."""
    if _same(out, other):
        return "is"
    if any(_same(p, other) for p in out.parents):
        return "lies inside"
    if any(_same(p, out) for p in other.parents):
        return "contains"
    return None


def _locations(inp: Input) -> Iterator[tuple[Path, str]]:
    """Every place on disk that belongs to ``inp``, each with how the refusal names it: the path
    as given (a symlink itself), what it resolves to (a Hub snapshot: the repo's cache folder,
    whose ``blobs/`` its files link to), and the target of every symlink inside an input folder."""
    given = Path(os.path.abspath(inp.path.expanduser()))
    name = f"{inp.label} {inp.hub}" if inp.hub else f"{inp.label} {inp.path}"
    at = real_path(given.parent) / given.name
    yield at, name if str(at) == str(inp.path) else f"{name} ({at})"
    real = real_path(given)
    if inp.hub:
        yield containing_root(real), f"the Hub cache folder of {name} ({containing_root(real)})"
    else:
        yield real, name if str(real) == str(inp.path) else f"{name} ({real})"
    if real.is_dir():
        for root, dirs, files in os.walk(real):
            for entry in dirs + files:
                p = Path(root) / entry
                if p.is_symlink():
                    target = real_path(p)
                    yield target, f"{target}, the target of the link {p.relative_to(real)} in {name}"


#: what a command does with an OUT that exists: ``(out) -> None``, raising a :class:`specfmt.errors.SpecfmtError`
#: (one line) unless OUT is this command's own earlier output that it may continue (``datagen``, ``regenerate --resume``)
Continues = Callable[[Path], None]


def check_output(out: Path, force: bool = False, inputs: Iterable[Input] = (), *, kind: str = "folder",
                 continues: Continues | None = None, beside: Iterable[str] = ()) -> None:
    """OUT may be written: apart from every input, of the right kind, and new, empty, replaceable
    (``force``) or continued (``continues``).

    The overlap rule comes first and neither ``force`` nor ``continues`` lifts it: replacing OUT (or
    writing beside it) must never touch what the command reads. Each input counts with the path as
    given (a symlink itself), the path it resolves to (for a Hub id, the repo's whole cache
    folder) and the target of every symlink inside it. Paths are compared after following
    symlinks and by identity on disk (device and inode), so a link to an input, a
    case-insensitive file system or a bind mount is caught too. The paths written beside OUT
    (``OUT`` + each of ``beside``: ``OUT.train-state``, ``OUT.provenance.json``) obey the same rule.

    Args:
        out: the output folder, or file (``kind="file"``).
        force: the user allows replacing an existing OUT (a non-empty folder, a file).
        inputs: every input of the command (:meth:`Input.of`).
        kind: ``folder`` or ``file``: what OUT is.
        continues: for a command that continues its own earlier output instead of replacing it: called
            with an existing OUT (a non-empty folder, or a file) to check that it is one; ``force`` is then
            not consulted.
        beside: suffixes of the paths the command writes next to OUT.

    Raises:
        OutputOverlapError: OUT (or a path beside it) is, lies inside or contains an input (the message names it).
        OutputExistsError: OUT lies under a file, is a file where a folder is written (or the reverse), or
            exists and is neither replaceable (``force``) nor continued.
        SpecfmtError: what ``continues`` raises.
    """
    if kind not in ("folder", "file"):
        raise ValueError(f"kind must be folder or file, not {kind!r}")
    out = Path(out).expanduser()
    o = real_path(out)
    inputs = list(inputs)
    written = [(o, f"the output {kind}")]
    for suffix in beside:  # OUT + suffix, whether OUT's links are followed before the suffix is added or after
        for path in dict.fromkeys((real_path(f"{out}{suffix}"), o.parent / f"{o.name}{suffix}")):
            written.append((path, f"{out.name}{suffix}, written beside the output,"))
    for path, what in written:
        for inp in inputs:
            for at, name in _locations(inp):
                rel = _relation(path, at)
                if rel is not None:
                    raise OutputOverlapError(
                        f"{what} {rel} {name}",
                        relation=rel, input=inp, at=at, where=str(out),
                        hint="choose an -o outside every input; no option (--force included) lets a command write into one",
                    )
    other = "file" if kind == "folder" else "folder"
    for p in o.parents:
        if p.exists() and not p.is_dir():
            raise OutputExistsError("the output path lies under a file", where=str(p), hint=f"choose a {kind} path for -o")
    if o.exists() and (o.is_dir() if kind == "file" else not o.is_dir()):
        raise OutputExistsError(f"the output path exists and is a {other}", where=str(out), hint=f"choose a {kind} path for -o")
    exists = o.is_file() if kind == "file" else o.is_dir() and any(o.iterdir())
    if not exists:
        return
    if continues is not None:
        continues(out)  # as given: what a command writes beside OUT is beside the path it was given
    elif not force:
        what = "the output folder is not empty" if kind == "folder" else "the output file exists"
        raise OutputExistsError(what, where=str(out), hint="choose another -o or pass --force to replace it")


def current_umask() -> int:
    """The process umask, read without changing it where Linux reports it (``/proc/self/status``)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def apply_umask(path: Path) -> None:
    """Give ``path`` (a file, or a folder and everything in it) the modes ``open()`` and ``mkdir()``
    would: ``0666 & ~umask`` for files, ``0777 & ~umask`` for folders. Symlinks are left alone."""
    mask = current_umask()
    fmode, dmode = 0o666 & ~mask, 0o777 & ~mask
    path = Path(path)
    if not path.is_dir() or path.is_symlink():
        if not path.is_symlink():
            os.chmod(path, fmode)
        return
    for root, dirs, files in os.walk(path):
        for f in files:
            p = os.path.join(root, f)
            if not os.path.islink(p):
                os.chmod(p, fmode)
        for d in dirs:
            p = os.path.join(root, d)
            if not os.path.islink(p):
                os.chmod(p, dmode)
    os.chmod(path, dmode)


def cleanup_stale(out: Path) -> None:
    """Remove temporary folders of earlier runs on the same OUT whose process is gone (killed)."""
    for p in out.parent.glob(f".{out.name}.specfmt-*"):
        try:
            pid = int(p.name.rsplit("-", 2)[-2])
        except (ValueError, IndexError):
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(p, ignore_errors=True)
        except PermissionError:
            pass


def install_folder(tmp: Path, out: Path) -> None:
    """Move a finished temporary folder to ``out`` (same parent), replacing what is there.

    ``out`` is swapped by renames: it is the old folder or the new one at every moment,
    never a half-written one. The folder and its files first get the umask's modes
    (:func:`apply_umask`; ``mkdtemp`` gives 0700, safetensors 0600).
    """
    apply_umask(tmp)
    if out.exists():
        old = out.parent / f".{out.name}.specfmt-{os.getpid()}-old"
        out.rename(old)
        tmp.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(out)


@contextmanager
def atomic_folder(out: Path) -> Iterator[Path]:
    """Yield an empty temporary folder beside ``out``; on a normal exit it becomes ``out``.

    Leftovers of killed runs on the same ``out`` are removed first (:func:`cleanup_stale`).
    On any exception, Ctrl-C included, the temporary folder is removed and ``out`` is left as
    it was. The caller checks ``out`` with :func:`check_output` before doing any work.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    cleanup_stale(out)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.specfmt-{os.getpid()}-", dir=out.parent))
    try:
        yield tmp
        install_folder(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
