"""speculators 0.9's on-disk layout of offline training data, read and written.

One output folder ``ROOT`` holds (speculators 0.9.0):

* the **preprocessed dataset**: a ``datasets`` ``save_to_disk`` folder at ``ROOT`` itself
  (``data-*.arrow``, ``dataset_info.json``, ``state.json``), one row per sample with columns
  ``input_ids`` [T] int64, ``loss_mask`` [T] int64 (1 = the token is trained on) and
  ``seq_len`` (T). Source: ``speculators/data_generation/preprocessing.py`` (``_append_row``;
  ``build_speculator_training_dataset`` sets the torch format), written by
  ``speculators/cli/prepare_data.py`` (``dataset.save_to_disk(output)``); read by
  ``speculators/train/data.py`` (``ArrowDataset``: ``load_from_disk(datapath)``, the
  ``seq_len`` column for its length-aware batching, ``input_ids`` and ``loss_mask`` per row).
* the **hidden states**: ``ROOT/hidden_states/hs_{i}.safetensors`` for row i, holding
  ``hidden_states`` [T, L, H] (the tap layers, then the last layer) and ``token_ids`` [T] int64.
  Source: ``speculators/train/data.py`` (``FileTransfer(Path(datapath) / "hidden_states")``;
  ``hs_connectors/transfer.py`` ``FileTransfer.get_cached``), ``speculators/cli/generate_offline_data.py``
  (``--output`` defaults to ``<preprocessed-data>/hidden_states``).
* the **token frequencies**: ``ROOT/token_freq.pt``, a ``torch.save``\\ d ``dict[int, int]`` counting
  each token id where ``loss_mask`` is 1 (``speculators/train/vocab_mapping.py``
  ``save_token_frequency_distribution``; read from ``data_path / "token_freq.pt"`` by
  ``speculators/train/cli.py`` ``_generate_vocab_mappings``), from which the draft vocabulary is built.

speculators itself writes no record of the layer ids or the verifier beside the data: its trainer
re-derives the layer ids from the verifier (``speculators/models/utils.py``
``resolve_target_layer_ids``). specfmt adds :data:`MANIFEST` (``specfmt_datagen.json``), so that
``specfmt train --hidden-states`` knows which layers the files hold; speculators ignores it
(``load_from_disk`` reads only ``state.json`` and the files it lists). It is the first file a
datagen run writes (what the data is made from: the verifier, the ``--data`` files by content, the
layers, ``--seq-len``, ``--dtype``) and is written again with the figures at the end, so that a
folder with a manifest is a datagen output that a run with the same inputs may continue
(:func:`check_resumable`), and a folder without one is never written into.

``import specfmt.datagen.layout`` imports neither torch nor ``datasets``; the functions that need
them import them when called.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..checkpoint.output import apply_umask
from ..errors import InputError
from .engine import SAMPLE_FILE, sample_path

#: the hidden-states folder inside an output folder (speculators/train/data.py)
HIDDEN_STATES = "hidden_states"
#: the token frequencies inside an output folder (speculators/train/cli.py)
TOKEN_FREQ = "token_freq.pt"
#: specfmt's record of what made the data, written last
MANIFEST = "specfmt_datagen.json"
#: the columns speculators' trainer reads (speculators/train/data.py ArrowDataset)
COLUMNS = ("input_ids", "loss_mask", "seq_len")
#: ``datasets``' marker of a complete save_to_disk folder
_STATE = "state.json"
_HS_NAME = re.compile(r"^hs_(\d+)\.safetensors$")
#: 2: the manifest is written first and records ``data_sha256`` and ``dtype_option``
MANIFEST_VERSION = 2


@dataclass(frozen=True)
class Sample:
    """One training row: ``input_ids`` [T] and ``loss_mask`` [T] (0/1, 1 = trained on)."""

    input_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "input_ids", tuple(int(t) for t in self.input_ids))
        object.__setattr__(self, "loss_mask", tuple(int(m) for m in self.loss_mask))
        if len(self.input_ids) != len(self.loss_mask):
            raise InputError(f"a sample has {len(self.input_ids)} input ids but {len(self.loss_mask)} loss-mask entries")

    def __len__(self) -> int:
        return len(self.input_ids)


@dataclass
class Manifest:
    """What made a datagen output folder (``ROOT/specfmt_datagen.json``).

    Attributes:
        verifier: the verifier's path or Hub id.
        layers: the layer ids stored in ``hidden_states``' second axis, in order (vLLM's
            ``eagle_aux_hidden_state_layer_ids`` semantics; see :mod:`specfmt.datagen.engine`).
        hidden_size: H.
        engine: the engines that made the files: ``"vllm"``, ``"transformers"``, or both joined by ``+``
            (a run resumed with the other engine).
        seq_len: the ``--seq-len`` the samples were truncated to.
        dtype: the dtype of the stored hidden states (``"float32"``, ``"bfloat16"``, ...).
        samples: rows in the preprocessed dataset.
        tokens: tokens over all rows.
        files: hidden-state files present when the manifest was written (0 in the manifest a run starts with).
        bytes: their total size in bytes.
        data_sha256: the sha256 of each ``--data`` file, in order (None in a version-1 manifest).
        dtype_option: ``--dtype`` as given (``auto``, ...; None in a version-1 manifest).
    """

    verifier: str
    layers: list[int]
    hidden_size: int
    engine: str
    seq_len: int
    dtype: str
    samples: int
    tokens: int
    files: int = 0
    bytes: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    version: int = MANIFEST_VERSION
    data_sha256: list[str] | None = None
    dtype_option: str | None = None


def _datasets() -> Any:
    try:
        import datasets
    except ImportError:
        raise InputError("speculators' data layout needs the datasets package", hint="pip install 'specfmt[datagen]'") from None
    return datasets


def hidden_states_folder(root: str | Path) -> Path:
    """``root/hidden_states``, where speculators' trainer looks for ``hs_{i}.safetensors``."""
    return Path(root) / HIDDEN_STATES


def has_preprocessed(root: str | Path) -> bool:
    """Whether ``root`` holds a complete preprocessed dataset (``datasets``' ``state.json``)."""
    return (Path(root) / _STATE).is_file()


def write_preprocessed(samples: Sequence[Sample], root: str | Path) -> None:
    """Write the preprocessed dataset (columns :data:`COLUMNS`) into ``root``.

    The dataset is saved into a folder beside and its files moved in, ``state.json`` last, so an
    interrupted write leaves no dataset that ``load_from_disk`` would open.

    Raises:
        InputError: no samples; ``datasets`` is not installed; ``root`` already holds a dataset.
    """
    if not samples:
        raise InputError("no training samples to write", where=str(root), hint="give more data or a larger --seq-len")
    root = Path(root)
    if has_preprocessed(root):
        raise InputError("the output folder already holds a preprocessed dataset", where=str(root))
    datasets = _datasets()
    ds = datasets.Dataset.from_dict({
        "input_ids": [list(s.input_ids) for s in samples],
        "loss_mask": [list(s.loss_mask) for s in samples],
        "seq_len": [len(s) for s in samples],
    })
    # saved in torch format, as speculators saves it (speculators/data_generation/preprocessing.py
    # ``build_speculator_training_dataset``: ``dataset.set_format(type="torch")``): its trainer compares a file's
    # token_ids with the row's input_ids by ``torch.equal`` (speculators/train/data.py ``ArrowDataset._get_raw_data``)
    ds.set_format(type="torch")
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".preprocessed.{os.getpid()}.tmp"  # per process: data-parallel ranks may write at once
    shutil.rmtree(tmp, ignore_errors=True)
    bars = not datasets.utils.are_progress_bars_disabled()
    try:
        datasets.utils.disable_progress_bars()  # a library call prints nothing; the command shows its own progress
        ds.save_to_disk(str(tmp))
        names = sorted(p.name for p in tmp.iterdir())
        for name in [n for n in names if n != _STATE] + [_STATE]:
            os.replace(tmp / name, root / name)
            apply_umask(root / name)
    finally:
        if bars:
            datasets.utils.enable_progress_bars()
        shutil.rmtree(tmp, ignore_errors=True)


def load_preprocessed(root: str | Path) -> Any:
    """The preprocessed dataset in ``root`` (made by specfmt or by speculators' ``prepare-data``), as
    ``datasets.load_from_disk`` returns it, with the columns speculators' trainer reads.

    Raises:
        InputError: ``datasets`` is not installed; no dataset in ``root``; a column speculators' trainer
            reads (``input_ids``, ``loss_mask``) is missing.
    """
    root = Path(root)
    if not has_preprocessed(root):
        raise InputError("no preprocessed dataset (datasets' state.json) in the folder", where=str(root),
                         hint="give a folder made by specfmt datagen or speculators prepare-data")
    datasets = _datasets()
    try:
        ds = datasets.load_from_disk(str(root))
    except Exception as e:  # noqa: BLE001 - datasets, pyarrow and json raise many kinds for a damaged folder
        raise InputError(f"the preprocessed dataset does not load ({type(e).__name__}: {_first_line(e)})", where=str(root),
                         hint="make it again: specfmt datagen into a new folder") from None
    if not isinstance(ds, datasets.Dataset):  # a DatasetDict's folder
        raise InputError("the folder holds a dataset dictionary, not one preprocessed dataset", where=str(root))
    missing = [c for c in ("input_ids", "loss_mask") if c not in ds.column_names]
    if missing:
        raise InputError(f"the preprocessed dataset has no {', '.join(missing)} column", where=str(root))
    return ds


def read_preprocessed(root: str | Path) -> list[Sample]:
    """Read the preprocessed dataset in ``root`` as :class:`Sample` rows.

    Raises:
        InputError: as :func:`load_preprocessed`; a row's ``loss_mask`` length differs from its
            ``input_ids``' (the row is named).
    """
    root = Path(root)
    ds = load_preprocessed(root).with_format(None)
    try:
        columns = zip(ds["input_ids"], ds["loss_mask"])
    except Exception as e:  # noqa: BLE001 - pyarrow reads the columns now: a damaged data file fails here
        raise InputError(f"the preprocessed dataset does not read ({type(e).__name__}: {_first_line(e)})", where=str(root),
                         hint="make it again: specfmt datagen into a new folder") from None
    out = []
    for i, (ids, mask) in enumerate(columns):
        try:
            if len(ids) != len(mask):
                raise InputError(f"sample {i} has {len(ids)} input ids but {len(mask)} loss-mask entries", where=str(root))
            out.append(Sample(ids, mask))
        except (TypeError, ValueError):
            raise InputError(f"sample {i}'s input_ids and loss_mask are not lists of integers", where=str(root)) from None
    return out


def _first_line(e: BaseException) -> str:
    return str(e).splitlines()[0][:200] if str(e) else ""


def existing_samples(folder: str | Path) -> list[int]:
    """The indices i whose ``hs_{i}.safetensors`` in ``folder`` is complete: its safetensors header
    opens (header length, JSON, offsets covering the file exactly), read without the tensor data.

    As speculators' ``get_existing_hidden_state_indices`` followed by
    ``find_corrupt_hidden_state_indices`` (``speculators/data_generation/offline.py``): a truncated
    file is not counted, so a resumed run makes it again.
    """
    from safetensors import safe_open

    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = []
    for p in folder.iterdir():
        m = _HS_NAME.match(p.name)
        if not m:
            continue
        try:
            with safe_open(str(p), framework="pt"):
                pass
        except Exception:  # noqa: BLE001 - any header failure means "not complete"
            continue
        found.append(int(m.group(1)))
    return sorted(found)


def check_sample(path: str | Path, index: int, token_ids: Sequence[int], n_layers: int, hidden_size: int) -> int:
    """Check one hidden-states file against its sample; return its number of tokens T.

    The checks are speculators' ``check_hidden_states`` (``speculators/data_generation/offline.py``:
    the keys, the token ids, T, finiteness) plus the shape [T, n_layers, H] the layer ids declare.

    Raises:
        InputError: naming sample ``index``: the file does not open; ``hidden_states`` or
            ``token_ids`` is missing; the token ids differ from the input ids (the first position
            that differs); the shape is not [T, n_layers, H]; a value is NaN or Inf.
    """
    import torch
    from safetensors.torch import load_file

    where = str(path)
    try:
        data = load_file(str(path))
    except Exception as e:  # noqa: BLE001 - safetensors' errors have no common class
        raise InputError(f"sample {index}: the hidden-states file does not open ({str(e).splitlines()[0] if str(e) else type(e).__name__})",
                         where=where, hint="delete it and run again to make it anew") from None
    for key in ("hidden_states", "token_ids"):
        if key not in data:
            raise InputError(f"sample {index}: the hidden-states file has no {key!r} tensor", where=where)
    hs, ids = data["hidden_states"], data["token_ids"].tolist()
    want = [int(t) for t in token_ids]
    if ids != want:
        pos = next((i for i, (a, b) in enumerate(zip(ids, want)) if a != b), min(len(ids), len(want)))
        raise InputError(f"sample {index}: the file's token ids differ from the input ids at position {pos} "
                         f"({len(ids)} tokens in the file, {len(want)} in the sample)", where=where)
    expected = (len(want), n_layers, hidden_size)
    if tuple(hs.shape) != expected:
        raise InputError(f"sample {index}: hidden_states has shape {list(hs.shape)}, expected [T, L, H] = {list(expected)}", where=where)
    if hs.numel() and not bool(torch.isfinite(hs).all()):
        bad = int((~torch.isfinite(hs)).sum())
        raise InputError(f"sample {index}: hidden_states holds {bad} NaN or Inf values", where=where)
    return len(want)


def sample_in_place(path: str | Path, token_ids: Sequence[int], n_layers: int, hidden_size: int) -> bool:
    """Whether a resumed run may keep the hidden-states file ``path`` for its sample: it holds ``token_ids`` exactly
    and ``hidden_states`` of shape [T, n_layers, H], read from the header and the token ids alone (the hidden states'
    values were checked when the file was made: :func:`check_sample`). A file that fails is remade, never kept."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            if set(f.keys()) != {"hidden_states", "token_ids"}:
                return False
            shape = tuple(f.get_slice("hidden_states").get_shape())
            ids = f.get_tensor("token_ids").tolist()
    except Exception:  # noqa: BLE001 - any failure to read means "not in place"
        return False
    return shape == (len(token_ids), n_layers, hidden_size) and ids == [int(t) for t in token_ids]


def token_frequencies(samples: Iterable[Sample]) -> dict[int, int]:
    """Count each token id where ``loss_mask`` is 1 (speculators/train/vocab_mapping.py
    ``save_token_frequency_distribution``)."""
    freq: Counter[int] = Counter()
    for s in samples:
        freq.update(t for t, m in zip(s.input_ids, s.loss_mask) if m)
    return dict(freq)


def write_token_freq(samples: Iterable[Sample], path: str | Path) -> dict[int, int]:
    """``torch.save`` :func:`token_frequencies` of ``samples`` to ``path`` (``ROOT/token_freq.pt``),
    atomically; returns the counts."""
    import torch

    freq = token_frequencies(samples)
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        torch.save(freq, tmp)
        os.replace(tmp, path)
    except BaseException:  # Ctrl-C included: no half-written file is left
        tmp.unlink(missing_ok=True)
        raise
    apply_umask(path)
    return freq


def write_manifest(root: str | Path, manifest: Manifest) -> Path:
    """Write ``root/specfmt_datagen.json`` atomically; returns its path."""
    path = Path(root) / MANIFEST
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(asdict(manifest), indent=2, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except BaseException:  # Ctrl-C included: no half-written file is left
        tmp.unlink(missing_ok=True)
        raise
    apply_umask(path)
    return path


def check_resumable(root: str | Path) -> Manifest | None:
    """An existing, non-empty output folder that ``datagen`` may continue: it holds a datagen manifest (:data:`MANIFEST`,
    written before anything else a run writes). Whether that run had the same inputs is the pipeline's check
    (:func:`specfmt.datagen.pipeline.run_datagen`), once the verifier and ``--data`` are read.

    Returns:
        The manifest; None when the folder holds nothing but a manifest being written (a rank of the same run starting).

    Raises:
        OutputExistsError: the folder holds no manifest: it is not the output of a datagen run (a verifier, a draft,
            another tool's data, a folder of stray files), and nothing in it may be kept.
        InputError: the manifest is malformed (:func:`read_manifest`).
    """
    from ..errors import OutputExistsError

    m = read_manifest(root)
    if m is None and all(re.fullmatch(rf"{re.escape(MANIFEST)}\.\d+\.tmp", p.name) for p in Path(root).iterdir()):
        return None  # another rank of this run is writing the manifest: the folder is new
    if m is None:
        raise OutputExistsError(f"the output folder is not empty and holds no datagen output (no {MANIFEST})", where=str(root),
                                hint="give a new or empty -o; datagen continues only the output of an earlier datagen run")
    return m


def read_manifest(root: str | Path) -> Manifest | None:
    """The manifest in ``root``, or None where there is none (speculators' own output).

    Raises:
        InputError: the manifest is not JSON, or lacks a field, or is of a newer version.
    """
    path = Path(root) / MANIFEST
    if not path.is_file():
        return None
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(obj, dict):
            raise ValueError("not a JSON object")
        if int(obj.get("version", 0)) > MANIFEST_VERSION:
            raise InputError(f"the datagen manifest is version {obj['version']}; this specfmt reads up to {MANIFEST_VERSION}",
                             where=str(path), hint="upgrade specfmt")
        m = Manifest(**obj)
    except (ValueError, TypeError, AttributeError, OSError) as e:
        raise InputError(f"the datagen manifest is malformed ({e})", where=str(path), hint="give a new -o, or delete the folder and run specfmt datagen again") from None
    bad = [name for name, ok in (
        ("verifier", isinstance(m.verifier, str)), ("layers", isinstance(m.layers, list) and all(type(x) is int for x in m.layers)),
        ("hidden_size", type(m.hidden_size) is int), ("seq_len", type(m.seq_len) is int), ("engine", isinstance(m.engine, str)),
        ("data_sha256", m.data_sha256 is None or isinstance(m.data_sha256, list) and all(isinstance(x, str) for x in m.data_sha256)),
        ("dtype_option", m.dtype_option is None or isinstance(m.dtype_option, str))) if not ok]
    if bad:
        raise InputError(f"the datagen manifest is malformed (a wrong type: {', '.join(bad)})", where=str(path),
                         hint="give a new -o, or delete the folder and run specfmt datagen again")
    return m


__all__ = ["COLUMNS", "HIDDEN_STATES", "MANIFEST", "SAMPLE_FILE", "TOKEN_FREQ", "Manifest", "Sample", "check_resumable", "check_sample",
           "existing_samples", "has_preprocessed", "hidden_states_folder", "load_preprocessed", "read_manifest", "read_preprocessed",
           "sample_in_place", "sample_path", "token_frequencies", "write_manifest", "write_preprocessed", "write_token_freq"]
