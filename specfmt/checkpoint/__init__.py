"""Checkpoint I/O: the bytes on disk, read and written without surprises.

* :mod:`~specfmt.checkpoint.reader`: a checkpoint's weight files, read lazily (safetensors,
  zip pickles through :mod:`~specfmt.checkpoint.torchzip`, shards);
* :mod:`~specfmt.checkpoint.stream`: the one stream of output tensors, with their checks, and its
  two consumers: a safetensors file (:func:`~specfmt.checkpoint.stream.write_stream`) and memory;
* :mod:`~specfmt.checkpoint.writer`: one safetensors file written tensor by tensor;
* :mod:`~specfmt.checkpoint.output`: the atomic output folder every command writes through;
* :mod:`~specfmt.checkpoint.files`: containment, memory-mapped windows, digests, JSON;
* :mod:`~specfmt.checkpoint.finite`: the NaN/Inf tests; :mod:`~specfmt.checkpoint.dtypes`: the dtype table.

Nothing here knows about drafts or algorithms.
"""

from .dtypes import DTYPE_CODES, DTYPE_NAMES, FLOAT_CODES, ST_DTYPES, TORCH_TO_ST, kind_of
from .files import CONFIG_FILE, check_inside, jsonl_objects, mapped_windows, read_json, sha256_file, weight_file_digests
from .finite import NONFINITE_BITS, NonfiniteCounter, nonfinite_count, nonfinite_in
from .output import Input, OutputOverlapError, apply_umask, atomic_folder, check_output, cleanup_stale, install_folder, real_path
from .reader import PICKLE_INDEX, SAFETENSORS_INDEX, CheckpointReader, TensorInfo
from .stream import OutTensor, Refusals, TensorStream, load_stream, write_stream
from .writer import SafetensorsStreamWriter, save_file_order

__all__ = [
    "CONFIG_FILE", "DTYPE_CODES", "DTYPE_NAMES", "FLOAT_CODES", "NONFINITE_BITS", "PICKLE_INDEX", "SAFETENSORS_INDEX", "ST_DTYPES",
    "TORCH_TO_ST", "CheckpointReader", "Input", "NonfiniteCounter", "OutTensor", "OutputOverlapError", "Refusals", "SafetensorsStreamWriter",
    "TensorInfo", "TensorStream", "apply_umask", "atomic_folder", "check_inside", "check_output", "cleanup_stale", "install_folder", "jsonl_objects", "kind_of",
    "load_stream", "mapped_windows", "nonfinite_count", "nonfinite_in", "read_json", "real_path", "save_file_order", "sha256_file",
    "weight_file_digests", "write_stream",
]
