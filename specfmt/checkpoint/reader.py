"""Read a checkpoint's weights lazily: headers first, one tensor at a time.

* safetensors: the header is read and checked against the file's length before anything
  else; tensor data is only touched by :meth:`CheckpointReader.get` / :meth:`~CheckpointReader.raw`;
* zip pickles (``.bin``, ``.pt``): indexed by specfmt's own restricted unpickler
  (:mod:`specfmt.checkpoint.torchzip`), no code in the file runs; anything else goes to
  ``torch.load(..., weights_only=True, mmap=True)``;
* sharded checkpoints through their ``*.index.json``.

File choice follows vLLM's loader (``docs/design/research-formats.md`` §1.1): safetensors first, then pickles.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from ..errors import InputError
from .dtypes import ST_DTYPES, nbytes, torch_dtype_code
from .files import check_inside

if TYPE_CHECKING:  # pragma: no cover
    import torch

SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PICKLE_INDEX = "pytorch_model.bin.index.json"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth")


@dataclass(frozen=True)
class TensorInfo:
    """A tensor as its file's header (or pickle metadata) describes it.

    Attributes:
        name: the key in the checkpoint.
        shape: the shape.
        dtype: safetensors dtype code (``F16``, ``BF16``, ``F32``, ``I64``, ``BOOL``, ...).
        file: the file (name relative to the checkpoint folder) that holds it.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    file: str

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor: the element size of :attr:`dtype` times the element count."""
        return nbytes(self.dtype, self.shape)


class CheckpointReader:
    """The weight files of one checkpoint folder, read lazily.

    File choice follows vLLM's loader (``docs/design/research-formats.md`` §1.1): safetensors
    first (sharded through ``model.safetensors.index.json`` when present), then
    pickles. Files of the other kind are listed in :attr:`ignored`.

    Args:
        folder: the checkpoint folder.
        pickle_names: pickle file names to accept besides ``pytorch_model*.bin``
            (e.g. ``medusa_lm_head.pt``).
        ignore: weight files that are not part of the model, with the reason; they
            are not read and are listed in :attr:`ignored`.
        only: read exactly these files and no index (e.g. the one shard of a Hub
            verifier that holds ``lm_head.weight``, the others never downloaded).

    Raises:
        InputError: no weight file; an index names a missing shard or a tensor a
            shard does not hold; a tensor name appears twice; a file is not a valid
            safetensors file or not a weights-only pickle of tensors.
    """

    def __init__(self, folder: Path, pickle_names: Iterable[str] = (), ignore: dict[str, str] | None = None, only: Iterable[str] | None = None):
        self.folder = Path(folder)
        self.files: list[str] = []
        self.ignored: dict[str, str] = {}
        ignore = dict(ignore or {})
        self.format = ""
        self._infos: dict[str, TensorInfo] = {}
        self._pickles: dict[str, dict[str, Any]] = {}  # legacy pickles, loaded by torch
        self._zrefs: dict[str, Any] = {}  # tensor -> torchzip.TensorRef (zip pickles, read without torch)
        self._st_begin: dict[str, int] = {}  # tensor -> absolute byte offset in its safetensors file
        st = sorted(p.name for p in self.folder.glob("*.safetensors"))
        pk = sorted(
            p.name
            for p in self.folder.iterdir()
            if p.is_file() and p.suffix in PICKLE_SUFFIXES and (p.name.startswith("pytorch_model") or p.name in set(pickle_names))
        ) if self.folder.is_dir() else []
        for name in [n for n in st + pk if n in ignore]:
            self.ignored[name] = ignore[name]
        st = [n for n in st if n not in ignore]
        pk = [n for n in pk if n not in ignore]
        for name in st + pk + [n for n in (SAFETENSORS_INDEX, PICKLE_INDEX) if (self.folder / n).exists()]:
            check_inside(self.folder, self.folder / name)
        self._index = None
        if only is not None:
            only = list(only)
            missing = [n for n in only if not (self.folder / n).is_file()]
            if missing:
                raise InputError(f"weight files not found: {missing}", where=str(self.folder))
            self.files = only
            self.format = "safetensors" if all(n.endswith(".safetensors") for n in only) else "pickle"
            for name in only:
                self._read_safetensors_header(name) if name.endswith(".safetensors") else self._read_pickle(name)
            return
        if st:
            self.format = "safetensors"
            self.files = self._from_index(SAFETENSORS_INDEX, st)
            for name in pk:
                self.ignored[name] = "safetensors weights present; pickles are not read (vLLM loads *.safetensors first)"
            for name in self.files:
                self._read_safetensors_header(name)
        elif pk:
            self.format = "pickle"
            self.files = self._from_index(PICKLE_INDEX, pk)
            for name in self.files:
                self._read_pickle(name)
        else:
            raise InputError(
                "no weight file (*.safetensors, pytorch_model*.bin) found",
                where=str(self.folder),
                hint="point at the folder that holds the draft's weights",
            )
        self._check_index()

    # -- discovery ---------------------------------------------------------------

    def _from_index(self, index_name: str, present: list[str]) -> list[str]:
        index_path = self.folder / index_name
        self._index: dict[str, str] | None = None
        if not index_path.is_file():
            return present
        try:
            index = json.loads(index_path.read_text(encoding="utf-8"))
            weight_map = index["weight_map"]
            assert isinstance(weight_map, dict) and all(isinstance(v, str) for v in weight_map.values())
        except (json.JSONDecodeError, KeyError, AssertionError, UnicodeDecodeError, TypeError):
            raise InputError("invalid shard index (needs a 'weight_map' object of tensor -> file)", where=str(index_path)) from None
        shards = sorted(set(weight_map.values()))
        missing = [s for s in shards if not (self.folder / s).is_file() or "/" in s or "\\" in s]
        if missing:
            raise InputError(f"the shard index names files that are not in the folder: {missing}", where=str(index_path))
        for extra in sorted(set(present) - set(shards)):
            self.ignored[extra] = f"not listed in {index_name}"
        self._index = weight_map
        return shards

    def _check_index(self) -> None:
        if self._index is None:
            return
        wrong = sorted(n for n, f in self._index.items() if n not in self._infos or self._infos[n].file != f)
        unlisted = sorted(set(self._infos) - set(self._index))
        if wrong or unlisted:
            raise InputError(
                f"the shard index disagrees with the shards: listed but not found there {wrong[:5]}, "
                f"found but not listed {unlisted[:5]}",
                where=str(self.folder),
            )

    def _add(self, info: TensorInfo) -> None:
        if info.name in self._infos:
            raise InputError(f"tensor {info.name!r} appears in both {self._infos[info.name].file} and {info.file}", where=str(self.folder))
        self._infos[info.name] = info

    def _read_safetensors_header(self, name: str) -> None:
        """Header only, with the checks safe_open skips before allocation (sizes vs file length)."""
        path = self.folder / name
        size = path.stat().st_size
        try:
            with open(path, "rb") as f:
                raw = f.read(8)
                if len(raw) < 8:
                    raise ValueError("file shorter than the 8-byte header length")
                (n,) = struct.unpack("<Q", raw)
                if n > size - 8 or n > 100 << 20:
                    raise ValueError(f"header length {n} runs past the end of the file ({size} bytes)")
                header = json.loads(f.read(n))
            if not isinstance(header, dict):
                raise ValueError("header is not a JSON object")
            data_len = size - 8 - n
            infos, begins = [], {}
            for key, meta in header.items():
                if key == "__metadata__":
                    continue
                dtype, shape, (begin, end) = meta["dtype"], tuple(meta["shape"]), meta["data_offsets"]
                if dtype not in ST_DTYPES:
                    raise ValueError(f"tensor {key!r} has unsupported dtype {dtype}")
                info = TensorInfo(key, shape, dtype, name)
                if not (0 <= begin <= end <= data_len) or end - begin != info.nbytes:
                    raise ValueError(f"tensor {key!r} declares bytes {begin}..{end} but the file holds {data_len} data bytes")
                infos.append(info)
                begins[key] = 8 + n + begin
        except (ValueError, KeyError, TypeError, json.JSONDecodeError, UnicodeDecodeError) as e:
            raise InputError(f"not a valid safetensors file: {e}", where=str(path), hint="the file is truncated or corrupt; download it again") from None
        for info in infos:
            self._add(info)
        self._st_begin.update(begins)

    def _read_pickle(self, name: str) -> None:
        """A zip ``torch.save`` state dict is indexed without torch (:mod:`specfmt.checkpoint.torchzip`: no
        code in the file runs, no data is read); anything else goes to ``torch.load(weights_only=True)``."""
        from .torchzip import NotPlain, read_index

        path = self.folder / name
        try:
            refs = read_index(path)
        except NotPlain:
            refs = None
        if refs is not None:
            for key, ref in refs.items():
                self._add(TensorInfo(key, ref.shape, ref.dtype, name))
                self._zrefs[key] = ref
            return
        import pickle

        import torch

        try:
            try:
                sd = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError as e:
                if "mmap" not in str(e):
                    raise
                # legacy (pre-zipfile) pickles cannot be memory-mapped
                sd = torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else "unpickling refused"
            raise InputError(
                f"refused to load a pickle that is not plain tensors ({first})",
                where=str(path),
                hint="specfmt only loads pickles with weights_only=True; ask the author for a safetensors file",
            ) from None
        except (RuntimeError, EOFError, OSError, ValueError, IndexError, KeyError, TypeError, AttributeError) as e:
            # a damaged stream: torch's weights-only unpickler meets it with any of these (an IndexError for a MEMOIZE
            # on an empty stack, issue 35's fuzzing)
            raise InputError(f"cannot read the pickle: {str(e).splitlines()[0] if str(e) else type(e).__name__}", where=str(path)) from None
        if not isinstance(sd, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in sd.items()):
            raise InputError("the pickle is not a flat state dict of name -> tensor", where=str(path))
        self._pickles[name] = sd
        for key, t in sd.items():
            self._add(TensorInfo(key, tuple(t.shape), torch_dtype_code(t), name))

    # -- access ------------------------------------------------------------------

    @property
    def infos(self) -> dict[str, TensorInfo]:
        """Every tensor, by name, from headers only."""
        return dict(self._infos)

    def raw(self, name: str) -> tuple[Path, int] | None:
        """Where a tensor's bytes lie, as they would be written (little-endian, C order):
        ``(file, byte offset)``, ``nbytes`` long; None when they are not one plain range
        (a non-contiguous view in a pickle, a legacy pickle)."""
        info = self._infos[name]
        if name in self._st_begin:
            return self.folder / info.file, self._st_begin[name]
        ref = self._zrefs.get(name)
        if ref is not None and ref.contiguous:
            return self.folder / info.file, ref.offset
        return None

    def read_bytes(self, name: str) -> bytes:
        """A tensor's bytes (C order) for a tensor with a :meth:`raw` range."""
        where = self.raw(name)
        if where is None:
            raise ValueError(f"{name} has no plain byte range")  # a caller bug
        n = self._infos[name].nbytes
        with open(where[0], "rb") as f:
            f.seek(where[1])
            data = f.read(n)
        if len(data) != n:
            raise InputError(f"tensor {name} runs past the end of the file", where=str(where[0]), hint="the file is truncated; download it again")
        return data

    def array(self, name: str):
        """A small integer or bool tensor as a numpy array (the vocabulary map), without torch when possible."""
        import numpy as np

        info = self._infos[name]
        np_dtype = {"I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "?"}.get(info.dtype)
        if np_dtype is None or self.raw(name) is None:
            t = self.get(name)
            return t.numpy() if np_dtype else t.float().numpy()
        return np.frombuffer(self.read_bytes(name), dtype=np_dtype).reshape(info.shape)

    def get(self, name: str) -> "torch.Tensor":
        """Load one tensor as a fresh CPU tensor (a zip pickle's non-contiguous view keeps its strides)."""
        info = self._infos[name]
        if info.file in self._pickles:
            return self._pickles[info.file][name]
        ref = self._zrefs.get(name)
        if ref is not None:
            import torch

            dtype = getattr(torch, ST_DTYPES[ref.dtype][0])
            if ref.contiguous:
                data = bytearray(self.read_bytes(name))
                return torch.frombuffer(data, dtype=dtype).reshape(ref.shape) if data else torch.empty(ref.shape, dtype=dtype)
            with open(self.folder / info.file, "rb") as f:  # the whole storage, then the view
                f.seek(ref.offset - ref.storage_offset * ST_DTYPES[ref.dtype][1])
                storage = torch.frombuffer(bytearray(f.read(ref.storage_nbytes)), dtype=dtype)
            return torch.as_strided(storage, ref.shape, ref.stride, ref.storage_offset).clone()
        from safetensors import safe_open

        with safe_open(str(self.folder / info.file), framework="pt") as f:
            return f.get_tensor(name)

    def close(self) -> None:
        self._pickles.clear()

    def __enter__(self) -> "CheckpointReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
