"""Write one safetensors file tensor by tensor, holding at most one tensor in memory.

The safetensors Python API has no incremental writer (``save_file`` wants every tensor in
memory at once), so the header is computed from the layout up front and each tensor's bytes
are appended in order. The layout follows the safetensors spec (8-byte little-endian header
length, JSON header padded with spaces to 8 bytes, contiguous data in header order).
A tensor kept as it is in its source file is copied by the kernel (``os.copy_file_range``),
window by window, with a check on every window (the NaN/Inf bit test).
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any, BinaryIO, Callable

from ..errors import InputError
from .dtypes import ST_DTYPES, torch_dtype_code
from .files import mapped_windows

#: the dtype order of a file written by safetensors' own ``save_file``, largest element first: it
#: sorts tensors by dtype in this order, then by name (observed on safetensors 0.8; the Rust
#: crate's serializer sorts by descending ``Dtype``; ``tests/test_tensor_stream.py`` pins it)
SAVE_FILE_DTYPE_ORDER = ("I64", "F64", "F32", "I32", "BF16", "F16", "I16", "F8_E4M3", "F8_E5M2", "I8", "U8", "BOOL")


def save_file_order(layout: list[tuple[str, str, tuple[int, ...]]]) -> list[tuple[str, str, tuple[int, ...]]]:
    """``layout`` ([(name, dtype code, shape)]) in the order safetensors' ``save_file`` writes
    tensors (:data:`SAVE_FILE_DTYPE_ORDER`, then name), so that a file streamed in that order is
    byte for byte the file ``save_file`` makes from the same tensors (with ``{"format": "pt"}`` metadata)."""
    return sorted(layout, key=lambda entry: (SAVE_FILE_DTYPE_ORDER.index(entry[1]), entry[0]))


class SafetensorsStreamWriter:
    """Write one safetensors file tensor by tensor, holding one tensor in memory.

    The header is fixed up front from ``layout`` ([(name, dtype_code, shape), ...]);
    :meth:`write` must then be called once per tensor, in that order.

    Raises:
        ValueError: a tensor arrives out of order or with another shape or dtype
            than announced, or :meth:`close` is called before every tensor came
            (these are bugs in the caller, not user errors).
    """

    def __init__(self, path: Path, layout: list[tuple[str, str, tuple[int, ...]]], metadata: dict[str, str] | None = None):
        self.path = Path(path)
        self._layout = list(layout)
        header: dict[str, Any] = {"__metadata__": {"format": "pt", **(metadata or {})}}
        offset = 0
        for name, dtype, shape in self._layout:
            n = ST_DTYPES[dtype][1]
            for s in shape:
                n *= s
            header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
            offset += n
        raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
        raw += b" " * (-len(raw) % 8)
        # unbuffered: a BufferedWriter copies every large write once more (measured 3-5x slower on 16 MiB chunks)
        self._f: BinaryIO = open(self.path, "wb", buffering=0)
        self._write_all(struct.pack("<Q", len(raw)) + raw)
        self._next = 0
        self._kernel = True

    def write(self, name: str, tensor) -> None:
        """Append one tensor's bytes (little-endian, C order)."""
        exp_name, exp_dtype, exp_shape = self._layout[self._next]
        if name != exp_name or tuple(tensor.shape) != tuple(exp_shape) or torch_dtype_code(tensor) != exp_dtype:
            raise ValueError(f"writer expected {exp_name} {exp_dtype} {exp_shape}, got {name} {tensor.dtype} {tuple(tensor.shape)}")
        t = tensor.detach().contiguous().reshape(-1)
        if t.numel():
            import torch

            self._write_all(t.view(torch.uint8).numpy())
        self._next += 1

    def copy(self, name: str, src: Path, offset: int, nbytes: int, check: Callable[[memoryview], int] | None = None) -> int:
        """Append one tensor's bytes copied from ``src`` at ``offset``, :data:`COPY_CHUNK` at a time:
        ``check`` reads each chunk through a memory map of that window only (so the resident set
        stays one chunk) and returns the NaN/Inf it found; the bytes are then copied by the kernel
        (``os.copy_file_range``; a plain write where it is unavailable). Returns the sum of ``check``.

        Raises:
            InputError: ``src`` ends before ``offset + nbytes`` (checked before anything is mapped).
        """
        exp_name, exp_dtype, exp_shape = self._layout[self._next]
        n = ST_DTYPES[exp_dtype][1]
        for s in exp_shape:
            n *= s
        if name != exp_name or n != nbytes:
            raise ValueError(f"writer expected {exp_name} ({n} bytes), got {name} ({nbytes} bytes)")
        bad = 0
        with open(src, "rb", buffering=0) as f:
            if offset + nbytes > os.fstat(f.fileno()).st_size:
                raise InputError(f"tensor {name} runs past the end of the file", where=str(src), hint="the file is truncated; download it again")
            for pos, view in mapped_windows(f, offset, nbytes):
                if check is not None:
                    bad += check(view)
                if not self._kernel_copy(f.fileno(), pos, len(view)):
                    self._write_all(view)
        self._next += 1
        return bad

    def _kernel_copy(self, fd: int, pos: int, n: int) -> bool:
        """``os.copy_file_range`` of ``n`` bytes at ``pos`` to the end of the output; False when the
        kernel or file system cannot (then nothing was copied and the caller writes them)."""
        if not self._kernel or not hasattr(os, "copy_file_range"):
            return False
        done = 0
        try:
            while done < n:
                got = os.copy_file_range(fd, self._f.fileno(), n - done, pos + done)
                if got == 0:
                    raise OSError("copy_file_range copied nothing")
                done += got
        except OSError:
            if done:
                raise
            self._kernel = False
            return False
        return True

    def _write_all(self, data) -> None:
        view = memoryview(data).cast("B")
        while len(view):
            view = view[self._f.write(view):]

    def close(self) -> None:
        if self._next != len(self._layout):
            self._f.close()
            raise ValueError(f"writer closed after {self._next} of {len(self._layout)} tensors")
        # No fsync: the folder appears by rename, so an interrupted run never leaves a partial
        # OUT; power-loss durability is the file system's, as for cp or save_pretrained. (An
        # fsync here cost 0.25-0.47 s on the 850 MB benchmark, more than the copy itself.)
        self._f.close()

    def abort(self) -> None:
        if not self._f.closed:
            self._f.close()
