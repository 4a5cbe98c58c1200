"""Read the tensor index of a ``torch.save`` zip checkpoint without torch and without running code.

A ``torch.save`` file (PyTorch >= 1.6) is an uncompressed zip: ``ARCHIVE/data.pkl`` is a
pickle whose tensors refer, through persistent ids, to raw storages ``ARCHIVE/data/{key}``
(format: ``torch/serialization.py``, ``_save`` and ``_load``). This module unpickles
``data.pkl`` with an :class:`pickle.Unpickler` that resolves **only** the handful of
globals a plain state dict uses (``torch._utils._rebuild_tensor_v2``,
``torch._utils._rebuild_parameter``, the typed storage classes, ``collections.OrderedDict``)
to inert stand-ins. Nothing is imported and no callable from the file runs, so a hostile
pickle cannot execute code; it raises :class:`NotPlain` and the caller falls back to
``torch.load(weights_only=True)``, which refuses it with its own reason.

The result is, for every tensor, where its bytes lie in the file: a contiguous tensor is a
byte range that can be copied as it is, without loading it (:meth:`specfmt.checkpoint.reader.CheckpointReader.raw`).
"""

from __future__ import annotations

import pickle
import struct
import zipfile
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from .dtypes import ST_DTYPES

#: ``torch.<Name>Storage`` -> safetensors dtype code
STORAGE_DTYPES = {
    "HalfStorage": "F16", "BFloat16Storage": "BF16", "FloatStorage": "F32", "DoubleStorage": "F64",
    "LongStorage": "I64", "IntStorage": "I32", "ShortStorage": "I16", "CharStorage": "I8",
    "ByteStorage": "U8", "BoolStorage": "BOOL",
    "Float8_e4m3fnStorage": "F8_E4M3", "Float8_e5m2Storage": "F8_E5M2",
}
#: bytes per element of each code the storages above map to (from checkpoint.ST_DTYPES, the one table)
ITEMSIZE = {code: ST_DTYPES[code][1] for code in STORAGE_DTYPES.values()}
#: the largest data.pkl read (a state dict's pickle is kilobytes; this bounds a hostile one)
MAX_PICKLE_BYTES = 64 << 20


class NotPlain(Exception):
    """The file is not a zip ``torch.save`` of a flat ``{name: tensor}`` dict this reader understands."""


@dataclass(frozen=True)
class StorageRef:
    key: str
    dtype: str
    numel: int


@dataclass(frozen=True)
class TensorRef:
    """One tensor of the file.

    Attributes:
        dtype: safetensors dtype code.
        shape, stride: in elements.
        storage: the zip member holding the bytes (``ARCHIVE/data/{key}``).
        storage_offset: in elements.
        offset: absolute byte offset of element 0 in the file.
        storage_nbytes: the storage's size in bytes.
    """

    dtype: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    storage: str
    storage_offset: int
    offset: int
    storage_nbytes: int

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * ITEMSIZE[self.dtype]

    @property
    def contiguous(self) -> bool:
        """C-contiguous (then ``offset .. offset + nbytes`` is the tensor, in order)."""
        expect = 1
        for size, st in zip(reversed(self.shape), reversed(self.stride)):
            if size != 1 and st != expect:
                return False
            expect *= size
        return True


@dataclass(frozen=True)
class _Tensor:
    """What ``_rebuild_tensor_v2`` stands for; a pickle cannot build one any other way."""

    storage: StorageRef
    storage_offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]


def _ints(x) -> tuple[int, ...]:
    if not isinstance(x, (tuple, list)) or not all(type(v) is int for v in x):
        raise NotPlain("a tensor size or stride that is not a tuple of ints")
    return tuple(x)


def _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad=False, backward_hooks=None, metadata=None):
    if not isinstance(storage, StorageRef) or type(storage_offset) is not int:
        raise NotPlain("a tensor without a storage")
    return _Tensor(storage, storage_offset, _ints(size), _ints(stride))


def _rebuild_parameter(data, requires_grad=False, backward_hooks=None):
    return data


def _ordered_dict(*args):
    return OrderedDict(*args)


class _Unpickler(pickle.Unpickler):
    """Resolves only the globals of a plain state dict, to inert stand-ins; anything else is :class:`NotPlain`."""

    def find_class(self, module, name):
        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            return _rebuild_tensor_v2
        if module == "torch._utils" and name == "_rebuild_parameter":
            return _rebuild_parameter
        if module == "collections" and name == "OrderedDict":
            return _ordered_dict
        if module == "torch" and name in STORAGE_DTYPES:
            return STORAGE_DTYPES[name]
        raise NotPlain(f"global {module}.{name} is not part of a plain state dict")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and pid[1] in ITEMSIZE and isinstance(pid[2], str)):
            raise NotPlain(f"unexpected persistent id {pid!r:.80}")
        return StorageRef(pid[2], pid[1], pid[4] if type(pid[4]) is int else -1)


def _member_offset(f, info: zipfile.ZipInfo) -> int:
    """Absolute offset of a stored member's data: after its local header, whose extra field
    (torch pads members to 64-byte alignment there) may differ from the central directory's."""
    f.seek(info.header_offset)
    head = f.read(30)
    if len(head) != 30 or head[:4] != b"PK\x03\x04":
        raise NotPlain(f"bad local header for {info.filename}")
    name_len, extra_len = struct.unpack("<HH", head[26:30])
    return info.header_offset + 30 + name_len + extra_len


def read_index(path: Path) -> dict[str, TensorRef]:
    """The tensors of a zip ``torch.save`` state dict, by name, without loading any data.

    Raises:
        NotPlain: not a zip checkpoint; compressed or big-endian; ``data.pkl`` holds anything
            but a flat dict of str -> tensor (any other global, or a tensor whose bytes lie
            outside its storage).
    """
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as e:
        raise NotPlain(f"not a zip checkpoint ({e})") from None
    with zf, open(path, "rb") as f:
        infos = {i.filename: i for i in zf.infolist()}
        pkls = [n for n in infos if n.endswith("/data.pkl") and n.count("/") == 1]
        if len(pkls) != 1:
            raise NotPlain("no single ARCHIVE/data.pkl")
        root = pkls[0][: -len("data.pkl")]
        order = infos.get(root + "byteorder")
        if order is not None and zf.read(order).strip() not in (b"little", b""):
            raise NotPlain("big-endian checkpoint")
        if infos[pkls[0]].file_size > MAX_PICKLE_BYTES:
            raise NotPlain("data.pkl is implausibly large")
        import io

        try:
            obj = _Unpickler(io.BytesIO(zf.read(pkls[0]))).load()
        except NotPlain:
            raise
        except Exception as e:  # a malformed pickle stream: let torch's loader give its reason
            raise NotPlain(f"unreadable data.pkl ({type(e).__name__}: {e})") from None
        if not isinstance(obj, dict) or not all(isinstance(k, str) and isinstance(v, _Tensor) for k, v in obj.items()):
            raise NotPlain("data.pkl is not a flat dict of name -> tensor")
        out: dict[str, TensorRef] = {}
        for name, t in obj.items():
            st, storage_offset, shape, stride = t.storage, t.storage_offset, t.shape, t.stride
            member = infos.get(f"{root}data/{st.key}")
            if member is None or member.compress_type != zipfile.ZIP_STORED:
                raise NotPlain(f"storage {st.key} of {name} is missing or compressed")
            size = ITEMSIZE[st.dtype]
            ref = TensorRef(st.dtype, shape, stride, member.filename, storage_offset,
                            _member_offset(f, member) + storage_offset * size, member.file_size)
            if len(shape) != len(stride) or any(s < 0 for s in shape + stride) or storage_offset < 0:
                raise NotPlain(f"tensor {name} has a malformed shape or stride")
            last = storage_offset + sum((s - 1) * t for s, t in zip(shape, stride)) if ref.numel else storage_offset - 1
            if (last + 1) * size > member.file_size:
                raise NotPlain(f"tensor {name} reaches past the end of its storage")
            out[name] = ref
        return out


__all__ = ["ITEMSIZE", "NotPlain", "TensorRef", "read_index"]
