"""The verifier: resolved once per command, read by name, loaded when a run needs it.

A draft is useless without the verifier it was trained for; every command reads it:
``convert`` (sizes, the Medusa v2 head), ``validate`` (sizes, taps), ``validate --run`` and
``train`` (the model itself), the fill-ins (its embedding and head). A :class:`Verifier`
is resolved once -- a local folder, or a Hub id through huggingface_hub and its cache --
and hands every caller what it needs, fetching from the Hub only the files asked for: the
config first, then at most the one shard that holds a tensor, or the weights and tokenizer
when the model must run.
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from ..checkpoint.files import CONFIG_FILE, check_inside, read_json
from ..checkpoint.reader import PICKLE_INDEX, SAFETENSORS_FILE, SAFETENSORS_INDEX, CheckpointReader
from ..errors import InputError
from .resolve import Resolved, fetch, resolve

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from .placement import Placement

#: where causal LMs keep the input embedding and the output head, in order of preference
EMBED_NAMES = ["model.embed_tokens.weight", "model.language_model.embed_tokens.weight", "embed_tokens.weight"]
HEAD_NAMES = ["lm_head.weight", "language_model.lm_head.weight"]
#: the files transformers needs to load the model and its tokenizer
MODEL_PATTERNS = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"]


@dataclass(frozen=True)
class VerifierInfo:
    """What a draft needs to know of its verifier (from the verifier's config.json).

    Multimodal configs are unwrapped through ``text_config``.

    Attributes:
        name_or_path: Hub id or absolute path, as written into the draft config.
        architectures: the verifier's ``architectures``.
        hidden_size: H_t.
        vocab_size: V.
        num_hidden_layers: N, the number of decoder layers (tap ids must be < N).
        max_position_embeddings: the verifier's context length, or None.
        tie_word_embeddings: the verifier's lm_head is its input embedding.
    """

    name_or_path: str
    architectures: tuple[str, ...]
    hidden_size: int
    vocab_size: int
    num_hidden_layers: int
    max_position_embeddings: int | None
    tie_word_embeddings: bool = False

    @classmethod
    def from_config(cls, cfg: dict[str, Any], name_or_path: str, where: str) -> "VerifierInfo":
        """Read the fields from a verifier config.json.

        Raises:
            InputError: a required field is missing or not a positive integer.
        """
        text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}

        def field(key: str, required: bool = True):
            val = text.get(key, cfg.get(key))
            if val is None and not required:
                return None
            if not isinstance(val, int) or isinstance(val, bool) or val < 1:
                raise InputError(
                    f"verifier config has no valid {key} (got {val!r})",
                    where=where,
                    hint="--verifier must name the verifier model (a folder or Hub id with its config.json)",
                )
            return val

        archs = cfg.get("architectures") or text.get("architectures") or []
        if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs) or not archs:
            raise InputError("verifier config has no architectures list", where=where)
        return cls(
            name_or_path=name_or_path,
            architectures=tuple(archs),
            hidden_size=field("hidden_size"),
            vocab_size=field("vocab_size"),
            num_hidden_layers=field("num_hidden_layers"),
            max_position_embeddings=field("max_position_embeddings", required=False),
            tie_word_embeddings=bool(text.get("tie_word_embeddings", cfg.get("tie_word_embeddings", False))),
        )



@dataclass
class Verifier:
    """A verifier, resolved once.

    Attributes:
        ref: the reference as given (a folder or Hub id).
        resolved: where its files are (a Hub snapshot folder holds only what was fetched).
        info: the fields a draft is checked against.
        config: its config.json as read (multimodal configs keep their ``text_config``).

    Use :meth:`load` to build one.
    """

    ref: str
    resolved: Resolved
    info: VerifierInfo
    config: dict[str, Any]
    _readers: dict[str, CheckpointReader] = field(default_factory=dict, repr=False)
    _model: "tuple[Placement, Any] | None" = field(default=None, repr=False)

    @classmethod
    def load(cls, ref: str, revision: str | None = None) -> "Verifier":
        """Resolve ``ref`` (a folder or Hub id) and read its config.json; nothing else is fetched.

        Raises:
            InputError, HubError: the verifier cannot be found, or its config is unusable.
        """
        res = resolve(ref, allow_patterns=[CONFIG_FILE], revision=revision, what="verifier")
        path = res.folder / CONFIG_FILE
        cfg = read_json(path)
        return cls(ref, res, VerifierInfo.from_config(cfg, res.name_or_path, str(path)), cfg)

    @property
    def name_or_path(self) -> str:
        """The Hub id or the absolute path, as written into a draft's config."""
        return self.resolved.name_or_path

    @property
    def folder(self) -> Path:
        return self.resolved.folder

    @property
    def text_config(self) -> dict[str, Any]:
        """The decoder's config: ``text_config`` for multimodal verifiers, else config.json itself."""
        text = self.config.get("text_config")
        return text if isinstance(text, dict) else self.config

    def _files(self, patterns: list[str]) -> Path:
        """The folder, with ``patterns`` fetched first for a Hub id (a no-op for a local folder)."""
        if not self.resolved.is_hub:
            return self.folder
        return fetch(self.resolved, patterns)

    def open_tensor(self, names: list[str]) -> tuple[CheckpointReader, str]:
        """Open the weight file holding the first of ``names`` the verifier has, headers only.

        For a Hub id only that one file is fetched: the shard index first, then the one shard
        named there (a 70B verifier's other shards are never downloaded).

        Args:
            names: candidate tensor names, in order of preference (e.g. ``lm_head.weight``).

        Returns:
            ``(reader, name)``: a reader whose :meth:`~CheckpointReader.get` loads the tensor.

        Raises:
            InputError, HubError: the verifier's weights cannot be read or hold none of ``names``.
        """
        folder = self._files([CONFIG_FILE, "*.index.json"])
        for index_name in (SAFETENSORS_INDEX, PICKLE_INDEX):
            index_path = folder / index_name
            if index_path.is_file():
                weight_map = read_json(index_path).get("weight_map")
                if not isinstance(weight_map, dict):
                    raise InputError("invalid shard index (needs a 'weight_map' object)", where=str(index_path))
                hit = next((n for n in names if n in weight_map), None)
                if hit is None:
                    raise InputError(f"the verifier holds none of {names}", where=str(index_path))
                shard = weight_map[hit]
                if shard not in self._readers:
                    folder = self._files([CONFIG_FILE, "*.index.json", shard])
                    # only that shard is local for a Hub id; the index names shards never downloaded
                    self._readers[shard] = CheckpointReader(folder, only=[shard])
                reader = self._readers[shard]
                break
        else:
            if "" not in self._readers:
                folder = self._files([CONFIG_FILE, "*.safetensors", "pytorch_model*.bin"])
                self._readers[""] = CheckpointReader(folder)
            reader = self._readers[""]
        hit = next((n for n in names if n in reader.infos), None)
        if hit is None:
            raise InputError(f"the verifier's weights hold none of {names}", where=str(reader.folder), hint="--verifier must name the full verifier model, weights included")
        return reader, hit

    def tensor(self, names: list[str]) -> "torch.Tensor":
        """The first of ``names`` the verifier has, read alone from its weights (a fresh CPU tensor).

        Raises:
            InputError, HubError: as :meth:`open_tensor`.
        """
        reader, name = self.open_tensor(names)
        return reader.get(name).clone()

    def embedding(self) -> "torch.Tensor":
        """[V, H_t] the input embedding, read alone from the weights."""
        return self.tensor(EMBED_NAMES)

    def lm_head(self) -> "torch.Tensor":
        """[V, H_t] the output head (the input embedding when ``tie_word_embeddings``), read alone."""
        return self.tensor(HEAD_NAMES + (EMBED_NAMES if self.info.tie_word_embeddings else []))

    def model_folder(self) -> Path:
        """The folder with everything transformers needs for the model and its tokenizer (fetched for a Hub id)."""
        return self._files(MODEL_PATTERNS)

    def tokenizer(self) -> Any:
        """The verifier's transformers tokenizer.

        Raises:
            OSError, ValueError: transformers cannot load it (callers decide how to report that).
        """
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(self.model_folder()))

    def load_model(self, placement: "Placement | None" = None) -> Any:
        """The verifier as a transformers causal LM, eval mode, gradients off; loaded once per :class:`Verifier`.

        A command loads it once and every user shares that one object: the reference run and all
        its misreading variants, the trainer, the feature cache and the validation run after
        training. A second call with the same placement returns the same model; another placement
        releases the first before loading (never two copies at once).

        The weights are read straight into place: transformers builds the model on the ``meta``
        device and fills each parameter in the run dtype (``Placement.from_pretrained_kwargs``:
        ``device_map`` puts it on the GPU, or spreads it with accelerate). Each tensor is read from
        its safetensors file by :func:`lazy_weights`: mapped where it is used as stored (no copy),
        read with ``pread`` where it is converted or moved to a GPU, so that a converted file never
        stays resident beside its copy (a bf16 checkpoint run in float32 peaked at the float32
        copy plus the whole bf16 file). The peak is one copy of the verifier in its run dtype plus
        one tensor (measured: ``benchmarks/memory_bench.py``, ``benchmarks/scale_bench.py``; guarded
        by ``tests/test_scale.py``).

        Args:
            placement: device, dtype and device map (:func:`specfmt.sources.placement.resolve_placement`);
                default: float32 on the CPU.

        Raises:
            OSError, ValueError: transformers cannot load it.
            InputError: the shard index is unreadable, or names a missing file or one outside the folder.
        """
        from transformers import MODEL_FOR_CAUSAL_LM_MAPPING, AutoConfig, AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        from .placement import Placement

        placement = placement or Placement()
        if self._model is not None and self._model[0] == placement:
            return self._model[1]
        self.release_model()
        hf_logging.disable_progress_bar()  # the command's own output is the report; no "Loading weights" bar
        folder = self.model_folder()
        kwargs = placement.from_pretrained_kwargs()
        with lazy_weights(folder, placement) as lazy:
            config = AutoConfig.from_pretrained(str(folder)) if lazy is not None else None
            cls = MODEL_FOR_CAUSAL_LM_MAPPING.get(type(config), None) if config is not None else None
            if isinstance(cls, type):  # the class AutoModelForCausalLM would pick, given the unmapped slices
                model = cls.from_pretrained(None, config=config, state_dict=lazy, **kwargs)
                model.config.name_or_path = str(folder)  # as from_pretrained(folder) sets it
            else:  # no safetensors files, libraries too old to read them unmapped, or not a causal LM (transformers' error)
                model = AutoModelForCausalLM.from_pretrained(str(folder), **kwargs)
        model.eval().requires_grad_(False)
        self._model = (placement, model)
        return model

    def release_model(self) -> None:
        """Drop the loaded model (the next :meth:`load_model` reads it again)."""
        if self._model is not None:
            self._model = None
            import gc

            gc.collect()

    def close(self) -> None:
        self.release_model()
        for r in self._readers.values():
            r.close()
        self._readers.clear()


@contextmanager
def lazy_weights(folder: Path, placement: "Placement") -> Iterator["dict[str, Any] | None"]:
    """The safetensors weights of a model folder as lazy slices, for ``from_pretrained(None, config=...,
    state_dict=...)``, each file opened the way that keeps the fewest of its bytes resident; closed on exit.

    transformers (5.x) opens every safetensors file with a memory map and hands its loader lazy slices
    (it reads them with ``pread`` only on Windows and MPS). A mapped file's pages count towards the
    process's resident memory once read, until the file is closed after the last tensor. Where a
    tensor is used as stored (on the CPU, already in the run dtype) the mapped pages are the weights
    themselves, no copy at all; where it is converted (a bf16 checkpoint run in float32, the CPU
    default) or moved to a GPU, the mapped pages are a second copy, and all of them stayed resident
    until the end: a 0.71 B Llama stored in bf16 peaked at 4.45 GiB in float32 where issue 19's
    bound (1.2 x its 2.66 GiB + 1 GiB) is 4.19 (``benchmarks/memory_bench.py``). So a file whose
    floating tensors are all stored in the run dtype, loaded onto the CPU without a device map, is
    mapped; any other is opened with safetensors' ``pread`` backend (safetensors >= 0.8), which reads
    each tensor into a buffer of its own, freed once the tensor is converted and placed. Which
    files: those of ``model.safetensors.index.json``, else ``model.safetensors``, as
    ``from_pretrained`` chooses them.

    Args:
        folder: the model folder.
        placement: where and in what dtype the model runs.

    Yields:
        ``{name: slice}``, or None where the folder has no such files, or the installed transformers
        (< 5, which needs materialised tensors in ``state_dict``) or safetensors (< 0.8, no ``pread``)
        cannot read them this way: the caller then lets ``from_pretrained`` read the folder itself.

    Raises:
        InputError: the shard index is unreadable, or names a file that is missing or outside the folder.
    """
    import transformers
    from packaging.version import Version
    from safetensors import safe_open

    from ..checkpoint.dtypes import FLOAT_CODES, TORCH_TO_ST

    index = folder / SAFETENSORS_INDEX
    if index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise InputError("invalid shard index (needs a 'weight_map' object of file names)", where=str(index))
        files = [folder / f for f in sorted(set(weight_map.values()))]
    elif (folder / SAFETENSORS_FILE).is_file():
        files = [folder / SAFETENSORS_FILE]
    else:
        files = []
    if not files or Version(transformers.__version__).major < 5:
        yield None
        return
    on_cpu = not placement.is_cuda and placement.device_map is None
    with ExitStack() as stack:
        lazy: dict[str, Any] = {}
        for f in files:
            check_inside(folder, f)
            if not f.is_file():
                raise InputError(f"the shard index names {f.name}, which is not in the folder", where=str(index))
            with safe_open(str(f), framework="pt", device="cpu") as header:  # mapped, but no tensor read
                stored = {header.get_slice(n).get_dtype() for n in header.keys()} & FLOAT_CODES
            backend = "mmap" if on_cpu and stored <= {TORCH_TO_ST[placement.dtype]} else "pread"
            try:
                st = stack.enter_context(safe_open(str(f), framework="pt", device="cpu", backend=backend))
            except TypeError:  # safetensors < 0.8: no backend option
                lazy = {}
                break
            lazy.update({n: st.get_slice(n) for n in st.keys()})
        yield lazy or None
