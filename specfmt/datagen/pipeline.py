"""``specfmt datagen``: training data from the verifier, in speculators 0.9's layout (:mod:`specfmt.datagen.layout`).

One run does what speculators splits in two commands: ``prepare-data`` (``--data`` into the
preprocessed dataset with loss masks, :mod:`specfmt.datagen.chat`, and ``token_freq.pt``) and
``generate-offline-data`` (``hidden_states/hs_{i}.safetensors`` per row, from an engine:
``vllm`` or ``transformers``). A second run resumes: the dataset must be the same, complete files
are skipped, unreadable ones are made again. Every file is checked
(:func:`~specfmt.datagen.layout.check_sample`) before it counts. The manifest is written last.
"""

from __future__ import annotations

import importlib
import importlib.util
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..algorithms.eagle3 import default_taps
from ..errors import DataInterrupted, InputError, SpecfmtError, VLLMRunError
from ..sources.verifier import Verifier
from .chat import read_samples
from .engine import HiddenStateEngine
from .engine import check_layers
from .hf_engine import TransformersEngine
from .layout import (
    TOKEN_FREQ, Manifest, Sample, check_sample, existing_samples, has_preprocessed, hidden_states_folder, read_manifest,
    read_preprocessed, write_manifest, write_preprocessed, write_token_freq,
)

ENGINES = ("auto", "vllm", "transformers")
#: ``--dtype``: the run and stored dtype; ``auto`` is vLLM's own choice, float32 for the transformers engine
DTYPES = ("auto", "float32", "bfloat16", "float16")
#: speculators' ``prepare-data --seq-length`` default (speculators/cli/prepare_data.py)
DEFAULT_SEQ_LEN = 8192
#: the module dg-vllm's engine lives in, imported by name only when asked for
VLLM_ENGINE = "specfmt.datagen.vllm_engine"


@dataclass
class DatagenRequest:
    """What ``specfmt datagen`` was asked for (the CLI's options)."""

    verifier: str
    data: list[str]
    output: str
    layers: list[int] | None = None
    seq_len: int | None = None
    max_samples: int | None = None
    engine: str = "auto"
    world_size: int = 1
    rank: int = 0
    tensor_parallel_size: int = 1
    dtype: str = "auto"


@dataclass
class DatagenResult:
    """What a run did.

    Attributes:
        root: the output folder. engine: the engine that ran. layers: the stored layer ids.
        samples: rows in the dataset. shard: this rank's indices. resumed: files of the shard already in place.
        made: files made by this run, with their ``tokens`` and ``bytes``, in ``seconds``.
        unsupervised, skipped_turns: rows dropped and assistant turns skipped by the cut to ``seq_len``.
        notes: what the user should know (an engine fallback).
    """

    root: Path
    engine: str
    layers: list[int]
    seq_len: int
    samples: int
    shard: range
    resumed: int = 0
    made: int = 0
    tokens: int = 0
    bytes: int = 0
    seconds: float = 0.0
    unsupervised: int = 0
    skipped_turns: int = 0
    notes: list[str] = field(default_factory=list)
    placed: set[int] = field(default_factory=set, repr=False)

    @property
    def bytes_per_token(self) -> float:
        return self.bytes / self.tokens if self.tokens else 0.0


def shard_indices(num_samples: int, max_samples: int | None, world_size: int, rank: int) -> range:
    """The dataset indices rank ``rank`` of ``world_size`` makes: the first ``min(max_samples, n)`` rows in contiguous
    chunks differing by at most one, the remainder to the first ranks (speculators/data_generation/offline.py
    ``get_indices_to_process``, before it drops the existing ones)."""
    target = min(max_samples, num_samples) if max_samples is not None else num_samples
    if target <= 0:
        return range(0)
    chunk, rem = divmod(target, world_size)
    start = rank * chunk + min(rank, rem)
    return range(start, start + chunk + (1 if rank < rem else 0))


def check_request(req: DatagenRequest) -> None:
    """Option checks that need no file.

    Raises:
        InputError: an unknown engine, ``--rank`` outside [0, world size), a count below 1.
    """
    if req.engine not in ENGINES:
        raise InputError(f"unknown engine {req.engine!r}", where="--engine", hint="choose " + ", ".join(ENGINES))
    if req.dtype not in DTYPES:
        raise InputError(f"unknown dtype {req.dtype!r}", where="--dtype", hint="choose " + ", ".join(DTYPES))
    if req.world_size < 1 or not 0 <= req.rank < req.world_size:
        raise InputError(f"--rank {req.rank} must be in [0, --world-size {req.world_size})")
    for name, val in (("--max-samples", req.max_samples), ("--seq-len", req.seq_len), ("--tensor-parallel-size", req.tensor_parallel_size)):
        if val is not None and val < (2 if name == "--seq-len" else 1):
            raise InputError(f"{name} {val} is too small")
    if not req.data:
        raise InputError("no --data given", hint="--data takes text files or jsonl files with \"text\" or \"messages\"")


def _hf(verifier: Verifier, tensor_parallel_size: int, dtype: str) -> TransformersEngine:
    return TransformersEngine(verifier, tensor_parallel_size=tensor_parallel_size, dtype="float32" if dtype == "auto" else dtype)


def make_engine(name: str, verifier: Verifier, tensor_parallel_size: int, dtype: str = "auto",
                seq_len: int | None = None) -> tuple[HiddenStateEngine, list[str]]:
    """The engine ``--engine`` names (``auto``: vLLM when it imports, else transformers), and notes.

    Raises:
        InputError: ``vllm`` asked for and vLLM or specfmt's vLLM engine does not import.
    """
    if name in ("auto", "vllm"):
        try:
            vllm_engine = importlib.import_module(VLLM_ENGINE)
            if importlib.util.find_spec("vllm") is None:  # found, not imported: the engine imports it when it starts
                raise ImportError("No module named 'vllm'")
        except ImportError as e:
            if name == "vllm":
                raise InputError(f"--engine vllm cannot start: {e}", hint="pip install vllm, or use --engine transformers") from None
            return _hf(verifier, tensor_parallel_size, dtype), [f"vLLM is not available ({e}); using the transformers forward"]
        return vllm_engine.VllmEngine(str(verifier.model_folder()), tensor_parallel_size=tensor_parallel_size, dtype=dtype,
                                      max_model_len=seq_len + 1 if seq_len else None), []
    return _hf(verifier, tensor_parallel_size, dtype), []


def _seq_len(req: DatagenRequest, verifier: Verifier) -> int:
    """``--seq-len``, at most the verifier's positions less one: vLLM extracts with one generated token after the
    sample (``max_tokens=1``, as speculators' ``vllm_client.py``), and both engines take the same samples."""
    limit = verifier.info.max_position_embeddings
    if req.seq_len is None:
        return min(DEFAULT_SEQ_LEN, limit - 1) if limit else DEFAULT_SEQ_LEN
    if limit and req.seq_len > limit - 1:
        raise InputError(f"--seq-len {req.seq_len}: the verifier has {limit} positions and vLLM needs one after the sample",
                         hint=f"give --seq-len {limit - 1} or less")
    return req.seq_len


def _dataset(req: DatagenRequest, verifier: Verifier, seq_len: int, root: Path) -> tuple[list[Sample], int, int]:
    """The preprocessed dataset: read from ``--data``; written (with token_freq.pt), or checked equal to what ``root`` holds."""
    try:
        tok = verifier.tokenizer()
    except (OSError, ValueError) as e:
        raise InputError(f"the verifier's tokenizer does not load ({str(e).splitlines()[0]})", where=str(verifier.folder)) from None
    read = read_samples(req.data, tok, seq_len)
    if has_preprocessed(root):
        if read_preprocessed(root) != read.samples:
            raise InputError("the output folder holds a preprocessed dataset made from other --data, --seq-len or verifier",
                             where=str(root), hint="give a new --output, or the options of the run that made it")
    else:
        write_preprocessed(read.samples, root)
    if not (root / TOKEN_FREQ).exists():
        write_token_freq(read.samples, root / TOKEN_FREQ)
    return read.samples, read.unsupervised, read.skipped_turns


def _check_manifest(root: Path, verifier: Verifier, layers: list[int], seq_len: int) -> None:
    m = read_manifest(root)
    if m is not None and (m.layers != layers or m.verifier != verifier.name_or_path or m.seq_len != seq_len):
        raise InputError(f"the output folder holds hidden states of {m.verifier} at layers {m.layers} (seq len {m.seq_len})",
                         where=str(root), hint="give a new --output, or the same verifier, --layers and --seq-len")


#: called after each placed file: (index, tokens, bytes)
OnFile = Callable[[int, int, int], None]


def _extract(engine: HiddenStateEngine, todo: list[tuple[int, list[int]]], layers: list[int], folder: Path,
             hidden: int, res: DatagenResult, on_file: OnFile | None) -> None:
    ids_of = dict(todo)
    for index, path in engine.extract([t for t in todo if t[0] not in res.placed], layers, folder):
        if index not in ids_of:
            raise InputError(f"the engine wrote sample {index}, which it was not given", where=str(path))
        try:
            tokens = check_sample(path, index, ids_of[index], len(layers), hidden)
        except InputError as e:
            path.unlink(missing_ok=True)
            raise InputError(e.message + " (the file was removed)", where=e.where, hint=e.hint) from None
        size = path.stat().st_size
        res.placed.add(index)
        res.made += 1
        res.tokens += tokens
        res.bytes += size
        if on_file:
            on_file(index, tokens, size)


def _run_engine(req: DatagenRequest, verifier: Verifier, todo: list[tuple[int, list[int]]], layers: list[int],
                folder: Path, res: DatagenResult, on_file: OnFile | None) -> None:
    engine, notes = make_engine(req.engine, verifier, req.tensor_parallel_size, req.dtype, res.seq_len)
    res.notes += notes
    res.engine = engine.name
    start = time.perf_counter()
    try:
        try:
            _extract(engine, todo, layers, folder, verifier.info.hidden_size, res, on_file)
        except (SpecfmtError, KeyboardInterrupt):
            raise
        except Exception as e:  # noqa: BLE001 - vLLM could not run this verifier: auto falls back, vllm reports it
            if engine.name == "transformers":
                raise
            what = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            if req.engine != "auto" or res.made:
                raise VLLMRunError(f"vLLM failed after {res.made} samples ({what})", where=str(folder),
                                   hint="files in place are whole; run again to resume, or use --engine transformers") from e
            engine.close()
            res.notes.append(f"vLLM could not run the verifier ({what}); using the transformers forward")
            engine = _hf(verifier, req.tensor_parallel_size, req.dtype)
            res.engine = engine.name
            _extract(engine, todo, layers, folder, verifier.info.hidden_size, res, on_file)
    except KeyboardInterrupt:
        raise DataInterrupted(f"interrupted after {res.made} of {len(todo)} samples; every file in place is whole",
                                 done=res.made, where=str(folder), hint="run the same command again to resume") from None
    finally:
        res.seconds = time.perf_counter() - start
        engine.close()


def _stored_dtype(folder: Path, indices: list[int]) -> str:
    from safetensors import safe_open

    from .engine import sample_path

    if not indices:
        return "unknown"
    with safe_open(str(sample_path(folder, indices[0])), framework="pt") as f:
        code = str(f.get_slice("hidden_states").get_dtype())
    return {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "F64": "float64"}.get(code, code.lower())


def run_datagen(req: DatagenRequest, on_file: OnFile | None = None, on_start: Callable[[DatagenResult, int], None] | None = None) -> DatagenResult:
    """Make (or resume) ``req.output``: the preprocessed dataset, ``token_freq.pt``, this rank's hidden-state files, the manifest.

    Args:
        req: the request.
        on_file: called after each file is placed and checked.
        on_start: called once the work is known, with the result so far and the number of tokens to make.

    Raises:
        InputError: bad options or data (see :func:`check_request`, :func:`~specfmt.datagen.chat.read_samples`); the
            output holds other data; a made file fails :func:`~specfmt.datagen.layout.check_sample` (it is removed).
        VLLMRunError: the vLLM engine failed (``--engine vllm``, or ``auto`` after it made files; ``auto`` before any
            falls back to transformers with a note).
        DataInterrupted: Ctrl-C; the files in place are whole, the same command resumes.
    """
    check_request(req)
    verifier = Verifier.load(req.verifier)
    n = verifier.info.num_hidden_layers
    layers = check_layers(req.layers if req.layers is not None else default_taps(n) + [n], n)
    seq_len = _seq_len(req, verifier)
    root = Path(req.output)
    _check_manifest(root, verifier, layers, seq_len)
    samples, unsupervised, skipped_turns = _dataset(req, verifier, seq_len, root)
    folder = hidden_states_folder(root)
    folder.mkdir(parents=True, exist_ok=True)
    shard = shard_indices(len(samples), req.max_samples, req.world_size, req.rank)
    done = set(existing_samples(folder))
    todo = [(i, list(samples[i].input_ids)) for i in shard if i not in done]
    res = DatagenResult(root, req.engine, layers, seq_len, len(samples), shard, resumed=len(shard) - len(todo),
                        unsupervised=unsupervised, skipped_turns=skipped_turns)
    if on_start:
        on_start(res, sum(len(ids) for _, ids in todo))
    before = read_manifest(root)
    if todo:
        _run_engine(req, verifier, todo, layers, folder, res, on_file)
    engines = sorted({e for e in (before.engine.split("+") if before else [])} | ({res.engine} if res.made else set()))
    placed = existing_samples(folder)
    write_manifest(root, Manifest(verifier=verifier.name_or_path, layers=layers, hidden_size=verifier.info.hidden_size, engine="+".join(engines),
                                  seq_len=seq_len, dtype=_stored_dtype(folder, placed), samples=len(samples),
                                  tokens=sum(map(len, samples)), files=len(placed),
                                  bytes=sum((folder / f"hs_{i}.safetensors").stat().st_size for i in placed)))
    return res


__all__ = ["DEFAULT_SEQ_LEN", "ENGINES", "DatagenRequest", "DatagenResult", "check_request", "make_engine", "run_datagen", "shard_indices"]
