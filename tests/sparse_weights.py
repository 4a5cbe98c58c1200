"""Weight files of published shapes that cost (almost) nothing: zero-filled sparse files.

A record of ``tests/data/real_configs`` lists a checkpoint's tensors (names, shapes, dtypes) as
published; a 128256 x 4096 float16 head is 1 GB. These writers lay out the real file formats
-- a safetensors header followed by the tensor bytes, or a ``torch.save`` zip (stored members,
zip64 where offsets pass 4 GiB) -- but leave every all-zero tensor as a hole in the file
(``truncate``/``seek``), so a file of gigabytes takes a few kilobytes of disk and no memory.
Tensors that must hold values (a vocabulary map ``d2t``/``t2d``) are given as bytes.

The zip writer computes each stored member's CRC-32 exactly; for a member of n zero bytes it
is computed without reading any (the CRC register advanced by 8n zero bits: the GF(2) matrix
power zlib's ``crc32_combine`` uses), so ``zipfile`` and ``torch.load`` accept the file.
"""

from __future__ import annotations

import json
import pickle
import struct
import zlib
from collections import OrderedDict
from pathlib import Path

ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
STORAGE = {"F64": "DoubleStorage", "F32": "FloatStorage", "F16": "HalfStorage", "BF16": "BFloat16Storage", "I64": "LongStorage",
           "I32": "IntStorage", "I16": "ShortStorage", "I8": "CharStorage", "U8": "ByteStorage", "BOOL": "BoolStorage",
           "F8_E4M3": "Float8_e4m3fnStorage", "F8_E5M2": "Float8_e5m2Storage"}


def nbytes(shape, dtype: str) -> int:
    n = ITEMSIZE[dtype]
    for s in shape:
        n *= s
    return n


def write_safetensors(path: Path, tensors: dict[str, tuple[list[int], str]], data: dict[str, bytes] | None = None) -> int:
    """A safetensors file: ``tensors`` ``{name: (shape, dtype code)}``, zeros except ``data``'s.

    Returns the file's length (its apparent size; the disk holds only the header and ``data``).
    """
    data = data or {}
    header, offset = {}, 0
    for name, (shape, dtype) in tensors.items():
        n = nbytes(shape, dtype)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    begin = 8 + len(raw)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for name, payload in data.items():
            assert len(payload) == nbytes(*tensors[name]), name
            f.seek(begin + header[name]["data_offsets"][0])
            f.write(payload)
        f.truncate(begin + offset)
    return begin + offset


# --------------------------------------------------------------------------- torch.save zip


def _gf2_times(mat: list[int], vec: int) -> int:
    out, i = 0, 0
    while vec:
        if vec & 1:
            out ^= mat[i]
        vec >>= 1
        i += 1
    return out


def _gf2_square(mat: list[int]) -> list[int]:
    return [_gf2_times(mat, mat[n]) for n in range(32)]


def crc32_zeros(n: int) -> int:
    """``zlib.crc32(bytes(n))`` without the bytes: the register 0xFFFFFFFF advanced by 8n zero bits."""
    # the operator of one zero bit on the reflected register (polynomial 0xEDB88320)
    op = [0xEDB88320] + [1 << (k - 1) for k in range(1, 32)]
    reg, bits = 0xFFFFFFFF, 8 * n
    while bits:
        if bits & 1:
            reg = _gf2_times(op, reg)
        op = _gf2_square(op)
        bits >>= 1
    return reg ^ 0xFFFFFFFF


class _Storage:
    def __init__(self, key: str, dtype: str, numel: int):
        self.key, self.dtype, self.numel = key, dtype, numel


class _Tensor:
    def __init__(self, storage: _Storage, shape: list[int]):
        self.storage, self.shape = storage, tuple(shape)

    def __reduce_ex__(self, protocol):
        import torch._utils

        stride, acc = [], 1
        for s in reversed(self.shape):
            stride.insert(0, acc)
            acc *= s
        return torch._utils._rebuild_tensor_v2, (self.storage, 0, self.shape, tuple(stride), False, OrderedDict())


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, _Storage):
            import torch

            return ("storage", getattr(torch, STORAGE[obj.dtype]), obj.key, "cpu", obj.numel)
        return None


class _ZipWriter:
    """A stored (uncompressed) zip, members 64-byte aligned like ``torch.save``'s, zip64 where needed."""

    def __init__(self, f):
        self.f, self.entries = f, []

    def add(self, name: str, size: int, payload: bytes | None) -> None:
        """One member of ``size`` bytes: ``payload``, or a hole of zeros when None."""
        f = self.f
        offset = f.tell()
        fname = name.encode()
        big = size >= 0xFFFFFFFF or offset >= 0xFFFFFFFF
        zip64 = struct.pack("<HHQQ", 1, 16, size, size) if big else b""
        pad = -(offset + 30 + len(fname) + len(zip64) + 4) % 64
        extra = zip64 + struct.pack("<HH", 0x4246, pad) + b"\0" * pad  # "FB" padding, as torch writes it
        crc = zlib.crc32(payload) if payload is not None else crc32_zeros(size)
        small = 0xFFFFFFFF if big else size
        f.write(struct.pack("<4s5H3L2H", b"PK\x03\x04", 45 if big else 20, 0, 0, 0, 0, crc, small, small, len(fname), len(extra)) + fname + extra)
        if payload is not None:
            f.write(payload)
        else:
            f.seek(size, 1)
        self.entries.append((fname, offset, size, crc))

    def close(self) -> None:
        f = self.f
        cd_start = f.tell()
        for fname, offset, size, crc in self.entries:
            big = size >= 0xFFFFFFFF or offset >= 0xFFFFFFFF
            extra = struct.pack("<HHQQQ", 1, 24, size, size, offset) if big else b""
            small, off = (0xFFFFFFFF, 0xFFFFFFFF) if big else (size, offset)
            f.write(struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 45, 45 if big else 20, 0, 0, 0, 0, crc, small, small,
                                len(fname), len(extra), 0, 0, 0, 0, off) + fname + extra)
        cd_end = f.tell()
        n, cd_size = len(self.entries), cd_end - cd_start
        f.write(struct.pack("<4sQ2H2L4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, n, n, cd_size, cd_start))
        f.write(struct.pack("<4sLQL", b"PK\x06\x07", 0, cd_end, 1))
        f.write(struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, min(n, 0xFFFF), min(n, 0xFFFF), min(cd_size, 0xFFFFFFFF),
                            min(cd_start, 0xFFFFFFFF), 0))
        f.truncate()


def write_torch_zip(path: Path, tensors: dict[str, tuple[list[int], str]], data: dict[str, bytes] | None = None, archive: str = "archive") -> int:
    """A ``torch.save(state_dict)`` zip (``pytorch_model.bin``, ``medusa_lm_head.pt``): one storage per
    tensor, zeros except ``data``'s. Returns the file's apparent size."""
    import io

    data = data or {}
    objs, sizes = OrderedDict(), {}
    for i, (name, (shape, dtype)) in enumerate(tensors.items()):
        numel = nbytes(shape, dtype) // ITEMSIZE[dtype]
        objs[name] = _Tensor(_Storage(str(i), dtype, numel), shape)
        sizes[str(i)] = (name, nbytes(shape, dtype))
    buf = io.BytesIO()
    _Pickler(buf, protocol=2).dump(objs)
    with open(path, "wb") as f:
        z = _ZipWriter(f)
        z.add(f"{archive}/data.pkl", len(buf.getvalue()), buf.getvalue())
        z.add(f"{archive}/byteorder", 6, b"little")
        for key, (name, n) in sizes.items():
            payload = data.get(name)
            assert payload is None or len(payload) == n, name
            z.add(f"{archive}/data/{key}", n, payload)
        z.add(f"{archive}/version", 2, b"3\n")
        z.close()
        return f.tell()
