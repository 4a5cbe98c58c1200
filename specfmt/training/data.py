"""Training data for the trainer: documents, token windows, verifier features and their cache.

* :func:`read_documents` reads plain text files (one document each), jsonl with ``text``,
  and chat jsonl with ``messages`` rendered with the verifier's chat template.
* :class:`Windows` cuts the concatenated token stream into fixed-length windows and deals
  them out as batches: a seeded permutation per epoch, a function of the step number alone,
  so a resumed run sees exactly the batches an uninterrupted one would.
* :func:`verifier_features` runs the frozen verifier; :class:`FeatureCache` keeps its
  outputs in safetensors shards for repeated epochs (offline training, as SpecForge's
  ``prepare_hidden_states``).
"""

from __future__ import annotations

import collections.abc
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from ..checkpoint.files import sha256_file
from ..sources.records import read_records, read_text
from ..checkpoint.output import apply_umask
from ..errors import InputError

if TYPE_CHECKING:  # pragma: no cover
    import torch

TEXT_SUFFIXES = (".txt", ".md", ".py", ".text")


@dataclass
class Documents:
    """Tokenized training documents.

    Attributes:
        ids: one list of token ids per document (the tokenizer's BOS when it adds one,
            the text, then EOS); for hidden-states data, the token counts ``{id: count}``
            (:func:`specfmt.training.hsdata.hidden_state_documents`), which only a draft vocabulary reads.
        files: sha256 of every data file read, by path (provenance).
        chat: some documents were rendered with the chat template.
    """

    ids: list[list[int]]
    files: dict[str, str]
    chat: bool = False

    @property
    def tokens(self) -> int:
        return sum(map(len, self.ids))


def read_documents(paths: list[str], tokenizer: Any) -> Documents:
    """Read and tokenize training data.

    Args:
        paths: data files (:mod:`specfmt.sources.records`: jsonl lines with ``text``/``prompt`` or chat
            ``messages``, rendered with the chat template; any other file one plain-text document).
        tokenizer: the verifier's transformers tokenizer.

    Raises:
        InputError: a file is missing or not UTF-8, a line is not JSON or has neither
            field (``file:line``), chat data when the tokenizer has no chat template, or no
            documents at all.
    """
    eos = getattr(tokenizer, "eos_token_id", None)

    def encode(text: str, special: bool = True) -> list[int]:
        ids = list(tokenizer.encode(text, add_special_tokens=special, verbose=False))  # documents are longer than a window
        return ids + [eos] if eos is not None and (not ids or ids[-1] != eos) else ids

    docs: list[list[int]] = []
    files: dict[str, str] = {}
    chat = False
    for path in paths:
        text = read_text(path, "training data")
        files[str(path)] = sha256_file(Path(path))
        for rec in read_records(path, text, what="training data"):
            if rec.text is not None:
                docs.append(encode(rec.text))
                continue
            if not getattr(tokenizer, "chat_template", None):
                raise InputError("chat data (messages) but the verifier's tokenizer has no chat template", where=rec.where,
                                 hint="give the text as {\"text\": ...}")
            try:
                rendered = tokenizer.apply_chat_template(rec.turns(), tokenize=False)
            except Exception as e:  # jinja errors: a malformed turn
                raise InputError(f"the chat template cannot render these messages: {str(e).splitlines()[0]}", where=rec.where) from None
            docs.append(encode(rendered, special=False))
            chat = True
    if not docs:
        raise InputError("no training documents in " + ", ".join(paths))
    return Documents(docs, files, chat)


class Windows:
    """Fixed-length token windows over the concatenated documents, dealt as batches.

    Window i of epoch e starts at ``offset(e) + i·T``; the offset is 0 when ``fixed``
    (a feature cache needs the same windows every epoch), else drawn per epoch from
    ``[0, T)`` so unfixed epochs see new boundaries. Each epoch visits the n windows in a
    permutation seeded by ``(seed, e)``. Batch b of step s on rank r takes the flat window
    numbers ``((s·W + r)·B + b)`` across epochs: a pure function of the step, so a resumed
    run repeats nothing and skips nothing, and W ranks never share a window within a step.
    ``heldout`` (fixed windows only): that share of the n windows (at least one, never all), drawn by a
    permutation seeded by ``seed``, is set aside (:attr:`held`) and the epochs permute the others.

    Raises:
        InputError: the stream is shorter than two windows.
    """

    def __init__(self, docs: list[list[int]], seq_len: int, batch: int, seed: int, *, fixed: bool = False, world: int = 1, rank: int = 0,
                 heldout: float = 0.0):
        import torch

        self.stream = torch.tensor([t for d in docs for t in d], dtype=torch.long)
        self.seq_len, self.batch, self.seed, self.fixed, self.world, self.rank = seq_len, batch, seed, fixed, world, rank
        self.n = (self.stream.numel() - seq_len) // seq_len
        if self.n < 1 or (heldout and self.n < 2):
            raise InputError(f"the training data has {self.stream.numel()} tokens; --seq-len {seq_len} needs at least "
                             f"{(3 if heldout else 2) * seq_len}" + (" with --heldout" if heldout else ""), hint="give more data or a smaller --seq-len")
        self._perms: dict[int, tuple[Any, int]] = {}
        self.held: list[int] = []
        self._pool = None  # the window numbers the epochs permute (None: all n)
        if heldout:
            assert fixed, "a held-out share of windows needs fixed windows"
            k = min(self.n - 1, max(1, round(heldout * self.n)))
            order = torch.randperm(self.n, generator=torch.Generator().manual_seed(seed * 1_000_003 - 1))
            self.held, self._pool = sorted(order[:k].tolist()), order[k:].sort().values

    @property
    def trained(self) -> int:
        """How many windows the epochs visit (n less the held-out ones)."""
        return self.n if self._pool is None else len(self._pool)

    def _epoch(self, e: int):
        if e not in self._perms:
            import torch

            g = torch.Generator().manual_seed(self.seed * 1_000_003 + e)
            offset = 0 if self.fixed else int(torch.randint(0, self.seq_len, (1,), generator=g))
            perm = torch.randperm(self.n, generator=g) if self._pool is None else self._pool[torch.randperm(len(self._pool), generator=g)]
            self._perms = {e: (perm, offset)}
        return self._perms[e]

    def indices(self, step: int) -> list[tuple[int, int]]:
        """``(epoch, window)`` of each batch row at ``step`` on this rank."""
        first = (step * self.world + self.rank) * self.batch
        out = []
        for g in range(first, first + self.batch):
            e, i = divmod(g, self.trained)
            out.append((e, int(self._epoch(e)[0][i])))
        return out

    def window(self, epoch: int, i: int) -> "torch.Tensor":
        offset = self._epoch(epoch)[1]
        start = offset + i * self.seq_len
        return self.stream[start:start + self.seq_len]

    def ids(self, step: int) -> "torch.Tensor":
        """[B, T] the token ids of ``step``'s batch on this rank."""
        import torch

        return torch.stack([self.window(e, i) for e, i in self.indices(step)])

    def digest(self) -> str:
        """sha256 of the token stream and window shape (what a feature cache is valid for)."""
        h = hashlib.sha256(self.stream.numpy().tobytes())
        h.update(f"{self.seq_len}".encode())
        return h.hexdigest()


@dataclass
class HeldOut:
    """The held-out windows a run is evaluated on (:func:`specfmt.training.loop.evaluate`): window ``numbers`` of the
    fixed ``windows``, their features computed by the verifier, or read from ``cache`` (a complete feature cache of
    ``windows``)."""

    windows: Windows
    numbers: list[int]
    cache: "FeatureCache | None" = None

    def batches(self, verifier: Any, taps: list[int], device: Any) -> "Iterator[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]]":
        """``(ids [B, T], aux, last)`` of the windows, ``windows.batch`` at a time, in order, on ``device``."""
        import torch

        for first in range(0, len(self.numbers), self.windows.batch):
            idx = self.numbers[first:first + self.windows.batch]
            ids = torch.stack([self.windows.window(0, i) for i in idx]).to(device)
            if self.cache is None:
                yield ids, *verifier_features(verifier, ids, taps)
            else:
                aux, last = self.cache.get(idx)
                yield ids, (aux.to(device) if aux is not None else None), last.to(device)


def verifier_features(verifier: Any, ids: "torch.Tensor", taps: list[int]) -> tuple["torch.Tensor | None", "torch.Tensor"]:
    """The frozen verifier's features of a batch.

    Args:
        verifier: a transformers causal LM (eval mode).
        ids: [B, T] token ids.
        taps: EAGLE-3 tap layer ids l (``hidden_states[l]``, the residual stream entering
            layer l, as vLLM's ``aux_hidden_states``); empty for none.

    Returns:
        ``(aux [B, T, n·H] or None, last [B, T, H])``: the taps, concatenated, and the last
        hidden state after the final norm (what the verifier's ``lm_head`` reads; EAGLE-1
        and Medusa read it too), in the verifier's run dtype, both on the last hidden state's
        device (a verifier spread with a ``device_map`` returns each layer's state on its own GPU).
    """
    import torch

    with torch.no_grad():
        out = verifier.get_decoder()(input_ids=ids, output_hidden_states=bool(taps), use_cache=False)
        last = out.last_hidden_state
        aux = torch.cat([out.hidden_states[j].to(last.device) for j in taps], dim=-1) if taps else None
        return aux, last


#: tokens per verifier forward when :class:`VerifierTop1` counts (at least the training batch): ``B x T`` of 2 x 64
#: windows made the world's count (79k tokens) 15.6 s on 2 CPU cores beside a running test suite, 16 x 64 made it
#: 7.6 s and 64 x 64 7.1 s, the same counts each time (2026-11-29)
COUNT_TOKENS = 4096


class VerifierTop1(collections.abc.Mapping):
    """``{token id: count}`` of the verifier's top-1 prediction (argmax of its logits) over the training
    positions, for a draft vocabulary chosen by what the draft is trained to propose (``--vocab-from verifier``).

    The training positions: the windows of a fixed :class:`Windows` (T tokens at offset 0, what a
    :class:`FeatureCache` holds), positions 1..T-1 of each, the positions whose logits are training targets
    (:func:`specfmt.algorithms.eagle3.eagle3_ttt_loss` reads ``target_logits[:, 1:]``). The verifier runs once
    over them, or, when ``cache`` is complete, its ``lm_head`` reads the cached last hidden states and the
    verifier does not run, :data:`COUNT_TOKENS` tokens per forward (or the training batch, if larger). Computed on
    first use, so a draft that needs no vocabulary map never runs it.

    Args:
        load: returns the verifier (a transformers causal LM, eval mode), loaded once.
        docs: token ids per document.
        seq_len: T, tokens per window; batch: the training batch (the least windows per forward).
        cache: the request's feature cache (``--cache``), or None; ends: returns the verifier's
            :class:`FrozenEnds` (its ``lm_head``), used with a complete cache.

    Attributes:
        what: how a fill-in description names these counts.
        notes: warnings the draft vocabulary built from them adds (shown by ``specfmt train``).

    Raises:
        InputError: (on first use) the data is shorter than two windows (:class:`Windows`).
    """

    what = "the verifier's top-1 predictions over the training positions"

    def __init__(self, load: Callable[[], Any], docs: list[list[int]], seq_len: int, batch: int, *,
                 cache: "FeatureCache | None" = None, ends: Callable[[], Any] | None = None):
        self._load, self._docs, self._T, self._B, self._cache, self._ends = load, docs, seq_len, batch, cache, ends
        self._counts: dict[int, int] | None = None
        self.notes: list[str] = []

    def counts(self) -> dict[int, int]:
        if self._counts is None:
            import torch

            windows = Windows(self._docs, self._T, self._B, 0, fixed=True)
            cached = self._cache is not None and self._cache.complete
            model = self._ends() if cached else self._load()
            head, total = model.get_output_embeddings(), None
            batch = max(self._B, COUNT_TOKENS // self._T)  # no gradients: more windows per forward than training takes
            for start in range(0, windows.n, batch):
                idx = list(range(start, min(windows.n, start + batch)))
                if cached:
                    last = self._cache.get(idx)[1]
                else:
                    ids = torch.stack([windows.window(0, i) for i in idx]).to(model.get_input_embeddings().weight.device)
                    last = verifier_features(model, ids, [])[1]
                with torch.no_grad():
                    top = head(last[:, 1:].to(head.weight.device)).argmax(-1).flatten().cpu()
                counts = torch.bincount(top, minlength=head.weight.shape[0])
                total = counts if total is None else total + counts
            self._counts = {int(t): int(total[t]) for t in total.nonzero().flatten()}
        return self._counts

    def at_least(self, n: int) -> dict[int, int]:
        """The counts, with the text's most frequent ids (after each document's first, as cnets.py counts) that the
        verifier never predicts added at count 0, in that order, until there are ``n`` ids: a draft vocabulary larger
        than the verifier's distinct predictions is filled by text frequency."""
        import collections

        counts = dict(self.counts())
        if len(counts) < n:
            text: collections.Counter = collections.Counter()
            for d in self._docs:
                text.update(d[1:])
            for t, _ in text.most_common():
                if len(counts) >= n:
                    break
                counts.setdefault(t, 0)
        return counts

    def __getitem__(self, key: int) -> int:
        return self.counts()[key]

    def __iter__(self):
        return iter(self.counts())

    def __len__(self) -> int:
        return len(self.counts())


#: where a verifier's final norm weight is, by architecture (Llama-style decoders; multimodal wrappers)
NORM_NAMES = ["model.norm.weight", "model.language_model.norm.weight", "language_model.model.norm.weight"]


class FrozenEnds:
    """The two ends of a verifier a draft trains against when its features come from a
    :class:`FeatureCache` or hidden-states data: the input embedding and the ``lm_head``, read alone from the
    verifier's weights (:meth:`specfmt.sources.verifier.Verifier.embedding`, :meth:`~specfmt.sources.verifier.Verifier.lm_head`),
    and, for hidden-states data (which stores the last layer before the norm), the final norm, so training
    never loads the verifier's layers. Offers what :func:`specfmt.training.loop.fit` calls on a verifier:
    ``get_input_embeddings()``, ``get_output_embeddings()``, ``eval()``, and ``norm`` ([..., H] -> [..., H]; None without it).
    """

    def __init__(self, embed: "torch.Tensor", head: "torch.Tensor", norm: Any = None):
        import torch

        self._embed = torch.nn.Embedding.from_pretrained(embed, freeze=True)
        self._head = torch.nn.Linear(head.shape[1], head.shape[0], bias=False, device="meta")
        self._head.weight = torch.nn.Parameter(head, requires_grad=False)
        self.norm = norm

    @classmethod
    def from_verifier(cls, verifier: Any, placement: Any, *, norm: bool = False) -> "FrozenEnds":
        """[V, H_t] embedding and head in the placement's dtype, on its device; with ``norm``, the final norm
        (:func:`final_norm`)."""
        dev, dt = placement.device, placement.torch_dtype
        embed = verifier.embedding().to(dev, dt)
        head = embed if verifier.info.tie_word_embeddings else verifier.lm_head().to(dev, dt)  # tied: the same tensor
        return cls(embed, head, final_norm(verifier).to(dev, dt) if norm else None)

    def get_input_embeddings(self):
        return self._embed

    def get_output_embeddings(self):
        return self._head

    def eval(self) -> "FrozenEnds":
        return self


def final_norm(verifier: Any) -> Any:
    """The verifier's final norm as transformers' own RMSNorm module of its model type (``LlamaRMSNorm``,
    ``Qwen3RMSNorm``, ... from ``transformers.models.<type>.modeling_<type>``) with its weight [H] and
    ``rms_norm_eps``, read alone from the verifier's weights (eval mode, frozen).

    Raises:
        InputError: the weights hold no final norm (:data:`NORM_NAMES`), or transformers has no RMSNorm
            class for the model type.
    """
    import importlib

    text = verifier.text_config
    mt = str(text.get("model_type", ""))
    cls = None
    try:
        mod = importlib.import_module(f"transformers.models.{mt}.modeling_{mt}")
        cls = next((getattr(mod, n) for n in dir(mod) if n.lower() == f"{mt.replace('_', '')}rmsnorm"), None)
    except ImportError:
        pass
    if cls is None:
        raise InputError(f"transformers has no RMSNorm class for the verifier's model type {mt!r}",
                         hint="train with --data or --cache (the verifier's own forward)")
    weight = verifier.tensor(NORM_NAMES)
    norm = cls(weight.shape[0], eps=float(text.get("rms_norm_eps", 1e-6)))
    norm.weight.data.copy_(weight)
    return norm.requires_grad_(False).eval()


class FeatureCache:
    """Verifier features of every window of a fixed :class:`Windows`, in safetensors shards.

    ``DIR/manifest.json`` records what the cache is valid for (verifier, data digest,
    window length, taps, dtype); ``DIR/shard-NNNNN.safetensors`` holds ``last`` [n, T, H]
    and, with taps, ``aux`` [n, T, k·H] for windows ``NNNNN·S ... NNNNN·S + n - 1``.

    Raises:
        InputError: ``DIR`` holds a cache built for something else.
    """

    SHARD = 64

    def __init__(self, folder: str | Path, key: dict[str, Any]):
        self.folder = Path(folder)
        self.key = key
        self._open: dict[int, Any] = {}
        manifest = self.folder / "manifest.json"
        if manifest.is_file():
            try:
                got = json.loads(manifest.read_text())
            except ValueError:
                got = None
            if not isinstance(got, dict) or got.get("key") != key:
                diff = sorted(k for k in key if not isinstance(got, dict) or (got.get("key") or {}).get(k) != key[k])
                raise InputError(f"the feature cache {self.folder} was built for other inputs (differs in: {', '.join(diff) or 'format'})",
                                 hint="pass another --cache folder, or delete this one")
        elif self.folder.exists() and any(self.folder.iterdir()):
            raise InputError(f"--cache {self.folder} is a non-empty folder without a specfmt manifest.json", hint="give an empty or new folder")

    @property
    def complete(self) -> bool:
        m = self.folder / "manifest.json"
        return m.is_file() and json.loads(m.read_text()).get("complete") is True

    def build(self, windows: Windows, verifier: Any, taps: list[int], device: Any, progress: Callable[[int, int], None] | None = None,
              rank: int = 0, world: int = 1) -> None:
        """Compute the features of every window (shard k on rank k mod W) and write the shards.

        With one process the cache is then marked complete; with several, the caller marks
        it (:meth:`mark_complete`, on one process) once every process has finished.
        """
        import torch
        from safetensors.torch import save_file

        self.folder.mkdir(parents=True, exist_ok=True)
        shards = (windows.n + self.SHARD - 1) // self.SHARD
        for k in range(rank, shards, world):
            path = self.folder / f"shard-{k:05d}.safetensors"
            if path.is_file():
                continue
            idx = range(k * self.SHARD, min(windows.n, (k + 1) * self.SHARD))
            ids = torch.stack([windows.window(0, i) for i in idx])
            parts: dict[str, list] = {"last": [], "aux": []}
            for b in range(0, len(idx), 8):
                aux, last = verifier_features(verifier, ids[b:b + 8].to(device), taps)
                parts["last"].append(last.cpu())
                if aux is not None:
                    parts["aux"].append(aux.cpu())
            tensors = {n: torch.cat(v).contiguous() for n, v in parts.items() if v}
            tmp = path.with_suffix(".tmp")
            save_file(tensors, str(tmp))
            apply_umask(tmp)  # save_file makes 0600 files; the cache follows the umask like every output
            os.replace(tmp, path)
            if progress:
                progress(min(windows.n, (k + 1) * self.SHARD), windows.n)
        if world == 1:
            self.mark_complete()

    def mark_complete(self) -> None:
        tmp = self.folder / "manifest.json.tmp"
        tmp.write_text(json.dumps({"key": self.key, "complete": True}, indent=2) + "\n")
        os.replace(tmp, self.folder / "manifest.json")

    def get(self, windows: list[int]) -> tuple["torch.Tensor | None", "torch.Tensor"]:
        """``(aux or None, last)`` of the given window numbers, stacked [B, T, ...]."""
        import torch
        from safetensors import safe_open

        aux, last = [], []
        for i in windows:
            k, j = divmod(i, self.SHARD)
            if k not in self._open:
                self._open[k] = safe_open(str(self.folder / f"shard-{k:05d}.safetensors"), framework="pt")
            f = self._open[k]
            last.append(f.get_slice("last")[j:j + 1])
            if "aux" in f.keys():
                aux.append(f.get_slice("aux")[j:j + 1])
        return (torch.cat(aux) if aux else None), torch.cat(last)


__all__ = ["Documents", "FeatureCache", "FrozenEnds", "HeldOut", "Windows", "final_norm", "read_documents", "verifier_features"]
