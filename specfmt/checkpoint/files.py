"""Files of an input: containment, windowed memory maps, digests and JSON.

Every byte specfmt reads from an input passes through :func:`check_inside` (no symlink
out of the folder) and, for tensor data, :func:`mapped_windows` (one read-only window
resident at a time, never past the end of the file).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Iterator

from ..errors import InputError

if TYPE_CHECKING:  # pragma: no cover
    import threading

#: bytes moved per read/write when a tensor is copied as it is (a multiple of every element size)
COPY_CHUNK = 16 << 20
#: the file a checkpoint's config lives in
CONFIG_FILE = "config.json"


def containing_root(folder: Path) -> Path:
    """The tree a checkpoint folder's files may resolve into: the folder itself, or for a
    Hugging Face cache snapshot (``models--OWNER--NAME/snapshots/REV``, whose files are
    symlinks to ``../../blobs/``) the repo's cache folder."""
    folder = Path(folder).resolve()
    if folder.parent.name == "snapshots" and folder.parent.parent.name.startswith(("models--", "datasets--")):
        return folder.parent.parent
    return folder


def check_inside(folder: Path, path: Path) -> Path:
    """``path`` (in ``folder``) with its symlinks resolved, refused if that leaves the folder's tree.

    A draft from a stranger could link ``config.json`` or a weight file to any file on the
    machine (``/etc/passwd``, a private key); specfmt would read it and, through ``push``,
    publish it.

    Raises:
        InputError: the resolved path is outside :func:`containing_root`.
    """
    real = Path(path).resolve()
    root = containing_root(folder)
    if real != root and root not in real.parents:
        raise InputError(f"{Path(path).name} is a symlink to {real}, outside the checkpoint folder", where=str(path),
                         hint="copy the file into the folder; specfmt does not follow links out of an input")
    return real


def mapped_windows(f: BinaryIO, offset: int, nbytes: int, window: int = COPY_CHUNK):
    """Yield ``(position, memoryview)`` over bytes ``offset .. offset + nbytes`` of the open file
    ``f``, through read-only memory maps of ``window`` bytes: the data is never copied into Python
    buffers and the resident set stays one window. The range is clamped to the file's current
    size (a map past the end would raise SIGBUS on access); callers that need every byte check
    the size first. Views must not outlive their iteration step.
    """
    import mmap

    fd = f.fileno()
    end = min(offset + nbytes, os.fstat(fd).st_size)
    pos = offset
    while pos < end:
        n = min(window, end - pos)
        lead = pos % mmap.ALLOCATIONGRANULARITY
        with mmap.mmap(fd, lead + n, offset=pos - lead, access=mmap.ACCESS_READ) as m:
            view = memoryview(m)[lead: lead + n]
            try:
                yield pos, view
            finally:
                view.release()
        pos += n


def data_extents(f: BinaryIO, offset: int, nbytes: int) -> list[tuple[int, int]]:
    """The ``(start, length)`` parts of bytes ``offset .. offset + nbytes`` of ``f`` that hold data:
    holes of a sparse file (``lseek`` ``SEEK_DATA``/``SEEK_HOLE``) read as zeros and are left out.
    Where the file system cannot tell, the whole range is one extent."""
    fd = f.fileno()
    end = offset + nbytes
    if not hasattr(os, "SEEK_DATA") or nbytes <= 0:
        return [(offset, nbytes)] if nbytes > 0 else []
    out, pos = [], offset
    try:
        while pos < end:
            try:
                start = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError:  # ENXIO: only a hole up to the end of the file
                break
            if start >= end:
                break
            stop = min(os.lseek(fd, start, os.SEEK_HOLE), end)
            out.append((start, stop - start))
            pos = stop
    except OSError:
        return [(offset, nbytes)]
    return out


def sha256_file(path: Path, chunk: int = COPY_CHUNK, stop: "threading.Event | None" = None) -> str:
    """Hex sha256 of a file, read in ``chunk``-byte pieces (16 MiB) into one reused buffer.

    Read, not memory-mapped: a file truncated while it is hashed (by another process, or by the
    caller once an aborted conversion returned) gives another digest, never a SIGBUS that kills the
    process (found by ``benchmarks/fuzz_bench.py``, issue 23).

    Args:
        stop: when set, hashing stops before the next piece and :class:`InterruptedError` is raised.
    """
    h = hashlib.sha256()
    buf = bytearray(chunk)
    view = memoryview(buf)
    with open(path, "rb") as f:
        while n := f.readinto(buf):
            if stop is not None and stop.is_set():
                raise InterruptedError(f"hashing {path} was stopped")
            h.update(view[:n])
    return h.hexdigest()


def weight_file_digests(folder: Path) -> dict[str, str]:
    """sha256 (hex) of ``config.json`` and every safetensors weight file and index in ``folder``, by name.

    ``validation.json`` stores these so that ``specfmt push`` can tell whether the figures in it
    were measured on the files being published.
    """
    names = [p.name for p in sorted(folder.iterdir()) if p.is_file() and (p.name == "config.json" or p.name.endswith((".safetensors", ".safetensors.index.json")))]
    return {n: sha256_file(folder / n) for n in names}


def read_json(path: Path) -> dict[str, Any]:
    """Parse a JSON object file.

    Raises:
        InputError: missing, unreadable, not JSON, or not a JSON object; a symlink out of its folder
            (:func:`check_inside`).
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path.name} not found", where=str(path.parent), hint="point at a folder that holds the checkpoint's config.json")
    if path.is_symlink():
        check_inside(path.parent, path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise InputError("not a UTF-8 text file", where=str(path)) from None
    except json.JSONDecodeError as e:
        raise InputError(f"invalid JSON at line {e.lineno} column {e.colno}: {e.msg}", where=str(path)) from None
    if not isinstance(data, dict):
        raise InputError(f"expected a JSON object, got {type(data).__name__}", where=str(path))
    return data


def jsonl_objects(path: str | Path, text: str | None = None) -> Iterator[tuple[str, Any]]:
    """Yield ``(where, obj)`` for every non-blank line of a jsonl file, ``where`` = ``path:line``.

    Raises:
        InputError: the file is not UTF-8; a line is not JSON (named ``path:line``).
    """
    if text is None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise InputError(f"the file is not UTF-8 text ({e.reason} at byte {e.start})", where=str(path)) from None
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            yield where, json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"line is not JSON ({e.msg})", where=where) from None
