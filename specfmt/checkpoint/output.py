"""The one way specfmt writes a folder: beside OUT, then renamed into place.

``OUT`` is the old folder or the new one at every moment, never a half-written one:
everything is written into a temporary folder ``.OUT.specfmt-PID-*`` next to it, which is
renamed to ``OUT`` once complete. A run killed with SIGKILL leaves only that temporary
folder, never a partial ``OUT``; the next run on the same ``OUT`` removes it.

Used by ``convert`` (:func:`specfmt.convert.convert`), the trainer and
:meth:`specfmt.draft.Draft.save`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator

from ..errors import InputError, OutputExistsError


def check_output(out: Path, force: bool, sources: Iterable[Path] = ()) -> None:
    """OUT may be written: not a file, empty unless ``force``, and apart from every input folder.

    Raises:
        OutputExistsError: OUT is a file, or a non-empty folder without ``force``.
        InputError: OUT is, contains or lies inside one of ``sources``.
    """
    if out.exists() and not out.is_dir():
        raise OutputExistsError("the output path exists and is a file", where=str(out), hint="choose a folder path for -o")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise OutputExistsError("the output folder is not empty", where=str(out), hint="choose another -o or pass --force to replace it")
    o = out.resolve()
    for src_folder in sources:
        src = Path(src_folder).resolve()
        if o == src or src in o.parents or o in src.parents:
            raise InputError("the output folder overlaps the source folder", where=str(out), hint="write the output elsewhere; the source is never modified")


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
    never a half-written one. The folder is made world-readable (``mkdtemp`` gives 0700).
    """
    os.chmod(tmp, 0o755)
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
