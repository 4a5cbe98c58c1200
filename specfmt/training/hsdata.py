"""Training batches from hidden-states data on disk (``specfmt train --hidden-states DIR``).

The layout is speculators 0.9's (``speculators/train/data.py`` ``ArrowDataset``): ``DIR`` is a
``datasets`` ``save_to_disk`` folder with one row per sample (``input_ids`` [T_i], ``loss_mask`` [T_i]),
and ``DIR/hidden_states/hs_{i}.safetensors`` holds row i's ``hidden_states`` [T_i, n, H] (the stored
layers, taps first, the verifier's last layer L last, before its final norm) and ``token_ids`` [T_i]
(``hs_connectors/transfer.py`` ``FileTransfer.get_cached``). speculators reads the taps as
``hidden_states[:, :-1]`` and the last layer as ``hidden_states[:, -1]``, normed by the verifier's norm
when training (``speculators/models/eagle3/core.py``).

:class:`HiddenStateBatches` deals the samples as batches like :class:`specfmt.training.data.Windows`:
a seeded permutation per epoch, a pure function of the step (``--resume`` repeats nothing), ranks
sharing no sample within a step. Each row is one sample cut to ``--seq-len`` tokens and padded with
zeros after its end; the padding is masked out of the loss (``loss_mask`` False). With ``--heldout SHARE`` a seeded
share of the samples is set aside (:attr:`HiddenStateBatches.held`) and evaluated from the files with its loss mask
(:class:`HiddenStateHeldOut`), as the ``--cache`` path holds out fixed windows (:class:`specfmt.training.data.Windows`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ..errors import InputError

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Iterator

    import torch

    from .data import Documents

from ..datagen import layout
from ..datagen.engine import sample_path

def stored_layers(folder: Path) -> list[int] | None:
    """The layer ids the hidden-states files hold, in order (the last is the verifier's layer count L), from the
    data's manifest (:func:`specfmt.datagen.layout.read_manifest`); None when there is none (speculators' own
    output records no layer ids).

    Raises:
        InputError: a malformed manifest.
    """
    manifest = layout.read_manifest(folder)
    return list(manifest.layers) if manifest is not None else None


def tap_positions(taps: list[int], stored: list[int] | None, n_stored: int, n_layers: int) -> list[int]:
    """Where each of the draft's tap layer ids is among the stored layers (the last stored one is layer L,
    never a tap).

    Args:
        taps: the draft's ``eagle_aux_hidden_state_layer_ids`` (empty: it reads the last layer only).
        stored: the stored layer ids (:func:`stored_layers`), or None: the files' first ``n_stored - 1``
            layers are taken to be the draft's taps, in order (speculators' trainer assumes the same).
        n_stored: layers per position in the files.
        n_layers: the verifier's decoder layers L.

    Raises:
        InputError: the draft needs a layer the data lacks, or the last stored layer is not L.
    """
    if stored is None:
        if taps and len(taps) != n_stored - 1:
            raise InputError(f"the hidden states hold {n_stored - 1} tap layers, the draft reads {len(taps)} ({taps})",
                             hint="generate the data with the draft's tap layers")
        return list(range(len(taps)))
    if len(stored) != n_stored:
        raise InputError(f"the manifest names {len(stored)} layers {stored}, the files hold {n_stored}")
    if stored[-1] != n_layers:
        raise InputError(f"the last stored layer is {stored[-1]}, not the verifier's last ({n_layers})",
                         hint="generate the data with the last layer last, as speculators does")
    lacking = [t for t in taps if t not in stored[:-1]]
    if lacking:
        raise InputError(f"the draft reads tap layer(s) {lacking}; the hidden states hold {stored[:-1]}",
                         hint="generate the data with the draft's tap layers (eagle_aux_hidden_state_layer_ids)")
    return [stored.index(t) for t in taps]


def hidden_state_documents(folder: Path) -> "Documents":
    """The data's token counts for a draft vocabulary, as :class:`specfmt.training.data.Documents` whose ``ids``
    are ``{token id: count}`` (:func:`specfmt.algorithms.eagle3.vocab_map` takes them as they are): speculators'
    ``token_freq.pt`` when the folder has one (``speculators/train/cli.py`` reads ``data_path / "token_freq.pt"``),
    else counted where ``loss_mask`` is 1 (:func:`specfmt.datagen.layout.token_frequencies`, as
    ``speculators/train/vocab_mapping.py`` counts). ``files`` holds the sha256 of the dataset's ``state.json``,
    ``dataset_info.json`` and ``token_freq.pt``.

    Raises:
        InputError: as :func:`specfmt.datagen.layout.load_preprocessed`; a ``token_freq.pt`` that is no ``{int: int}`` dict.
    """
    import torch

    from ..checkpoint.files import sha256_file
    from .data import Documents

    layout.load_preprocessed(folder)  # the checks, with their messages
    freq_file = folder / layout.TOKEN_FREQ
    if freq_file.is_file():
        try:
            counts = torch.load(freq_file, weights_only=True)
        except Exception as e:  # noqa: BLE001 - not a torch file, a pickle with other globals, a truncated zip: all one line
            raise InputError(f"token_freq.pt does not load as a torch-saved {{token id: count}} dict ({type(e).__name__})",
                             where=str(freq_file), hint="remove it (the counts are then made from the dataset), or make the data again with specfmt datagen") from None
        if not isinstance(counts, dict) or not all(isinstance(k, int) and isinstance(v, int) for k, v in counts.items()):
            raise InputError("token_freq.pt is not a {token id: count} dict", where=str(freq_file))
    else:
        counts = layout.token_frequencies(layout.read_preprocessed(folder))
    names = ("state.json", "dataset_info.json", layout.TOKEN_FREQ)
    files = {str(folder / n): sha256_file(folder / n) for n in names if (folder / n).is_file()}
    return Documents(counts, files)  # type: ignore[arg-type]


class HiddenStateBatches:
    """Samples of a hidden-states folder dealt as batches: ``(ids, aux, last, loss_mask)`` per step.

    Args:
        folder: the data folder (module docstring).
        seq_len: T, tokens per row (longer samples are cut, shorter ones padded and masked).
        batch: B, rows per step and process.
        seed: seeds the permutation of each epoch.
        taps: the draft's tap layer ids (:meth:`specfmt.algorithms.base.Training.feature_taps`).
        n_layers: the verifier's decoder layers L.
        norm: the verifier's final norm ([..., H] -> [..., H]); ``last`` is ``norm(layer L)``.
        dtype: the torch dtype the features are handed on in (the verifier's run dtype).
        world, rank: processes and this one's rank.
        heldout: that share of the n samples (at least one, never all) is set aside, drawn by a permutation seeded by
            ``seed`` apart from the epochs' (as :class:`specfmt.training.data.Windows` holds out windows): :attr:`held`,
            sorted; the epochs permute the others. 0: none, the batches are those of a run without it.

    Raises:
        InputError: the folder is not such data (:func:`specfmt.datagen.layout.load_preprocessed`), has no samples (fewer
            than two with ``heldout``), or lacks a layer the draft reads (:func:`tap_positions`).
    """

    def __init__(self, folder: str | Path, seq_len: int, batch: int, seed: int, *, taps: list[int], n_layers: int,
                 norm: Callable[[Any], Any], dtype: Any = None, world: int = 1, rank: int = 0, heldout: float = 0.0):
        import torch

        self.folder = Path(folder)
        self.data = layout.load_preprocessed(self.folder).with_format("torch")
        self.n = len(self.data)
        if self.n < 1:
            raise InputError(f"the dataset in {self.folder} has no samples")
        if heldout and self.n < 2:
            raise InputError(f"--heldout {heldout} needs at least two samples; the hidden-states data in {self.folder} has {self.n}",
                             hint="generate more samples, or pass --heldout 0")
        self.heldout = heldout
        self.held: list[int] = []  # the held-out sample numbers, sorted
        self._pool: Any = None  # the sample numbers the epochs permute (None: all n)
        if heldout:
            k = min(self.n - 1, max(1, round(heldout * self.n)))
            order = torch.randperm(self.n, generator=torch.Generator().manual_seed(seed * 1_000_003 - 1))  # no epoch's seed
            self.held, self._pool = sorted(order[:k].tolist()), order[k:].sort().values
        self.seq_len, self.batch, self.seed, self.world, self.rank = seq_len, batch, seed, world, rank
        self.norm, self.dtype = norm, dtype or torch.float32
        n_stored, self.hidden = self._shape(0)
        self.n_stored = n_stored
        self.taps = tap_positions(taps, stored_layers(self.folder), n_stored, n_layers)
        self._perm: tuple[int, Any] | None = None

    def path(self, i: int) -> Path:
        return sample_path(layout.hidden_states_folder(self.folder), i)

    def _shape(self, i: int) -> tuple[int, int]:
        from safetensors import safe_open

        if not self.path(i).is_file():
            raise InputError(f"sample {i} has no hidden states file {self.path(i)}", hint="generate the data's hidden states first")
        try:
            with safe_open(str(self.path(i)), framework="pt") as f:
                shape = f.get_slice("hidden_states").get_shape()
        except Exception as e:  # noqa: BLE001 - safetensors' errors have no common class
            raise InputError(f"sample {i}: the hidden-states file does not open ({str(e).splitlines()[0][:200] if str(e) else type(e).__name__})",
                             where=str(self.path(i)), hint="make it again (specfmt datagen resumes and remakes it)") from None
        if len(shape) != 3:
            raise InputError(f"hidden_states is {list(shape)}, not [T, layers, H]", where=str(self.path(i)))
        return shape[1], shape[2]

    @property
    def trained(self) -> int:
        """How many samples the epochs visit (n less the held-out ones)."""
        return self.n if self._pool is None else len(self._pool)

    def _epoch(self, e: int) -> Any:
        if self._perm is None or self._perm[0] != e:
            import torch

            g = torch.Generator().manual_seed(self.seed * 1_000_003 + e)
            pool = self._pool
            self._perm = (e, torch.randperm(self.n, generator=g) if pool is None else pool[torch.randperm(len(pool), generator=g)])
        return self._perm[1]

    def indices(self, step: int) -> list[tuple[int, int]]:
        """``(epoch, sample)`` of each batch row at ``step`` on this rank (as :meth:`Windows.indices`); never a held-out sample."""
        first = (step * self.world + self.rank) * self.batch
        out = []
        for g in range(first, first + self.batch):
            e, i = divmod(g, self.trained)
            out.append((e, int(self._epoch(e)[i])))
        return out

    def sample(self, i: int) -> tuple["torch.Tensor", "torch.Tensor", "torch.Tensor"]:
        """Sample i: ``(ids [T_i], loss_mask [T_i] bool, hidden_states [T_i, n, H])``, checked by
        :func:`specfmt.datagen.layout.check_sample` (speculators' ``check_hidden_states`` and the shape).

        Raises:
            InputError: naming the sample: the file is missing, its token ids are not the dataset's
                ``input_ids``, its shape is not [T_i, n, H], or it holds NaN/Inf.
        """
        from safetensors import safe_open

        try:
            row = self.data[i]
            ids, mask = row["input_ids"].long(), row["loss_mask"].bool()
        except Exception as e:  # noqa: BLE001 - pyarrow reads the row now: a damaged data file, or columns of another type
            raise InputError(f"sample {i} of the preprocessed dataset does not read as token ids and a loss mask ({type(e).__name__})",
                             where=str(self.folder), hint="make the data again with specfmt datagen") from None
        if ids.dim() != 1 or mask.shape != ids.shape:
            raise InputError(f"sample {i} has input_ids {list(ids.shape)} and loss_mask {list(mask.shape)}; both must be [T]", where=str(self.folder))
        path = self.path(i)
        if not path.is_file():
            raise InputError(f"sample {i} has no hidden states file {path}", hint="generate the data's hidden states first")
        layout.check_sample(path, i, ids.tolist(), self.n_stored, self.hidden)
        with safe_open(str(path), framework="pt") as f:  # checked: read again from the page cache
            hs = f.get_tensor("hidden_states")
        return ids, mask, hs

    def batch_at(self, step: int) -> tuple["torch.Tensor", "torch.Tensor | None", "torch.Tensor", "torch.Tensor"]:
        """``(ids [B, T], aux [B, T, k·H] or None, last [B, T, H], loss_mask [B, T])`` of ``step`` on this rank;
        ``last`` is the verifier's norm of the stored layer L, rows padded with zeros and masked after their end."""
        return self.rows([i for _, i in self.indices(step)])

    def rows(self, samples: list[int]) -> tuple["torch.Tensor", "torch.Tensor | None", "torch.Tensor", "torch.Tensor"]:
        """``(ids [B, T], aux [B, T, k·H] or None, last [B, T, H], loss_mask [B, T])`` of the given samples, B of them,
        in order (as :meth:`batch_at`).

        Raises:
            InputError: as :meth:`sample`.
        """
        import torch

        B, T = len(samples), self.seq_len
        ids = torch.zeros(B, T, dtype=torch.long)
        mask = torch.zeros(B, T, dtype=torch.bool)
        aux = torch.zeros(B, T, len(self.taps) * self.hidden, dtype=self.dtype) if self.taps else None
        pre = torch.zeros(B, T, self.hidden, dtype=self.dtype)
        for b, i in enumerate(samples):
            s_ids, s_mask, hs = self.sample(i)
            t = min(T, s_ids.numel())
            ids[b, :t], mask[b, :t] = s_ids[:t], s_mask[:t]
            if aux is not None:
                aux[b, :t] = hs[:t, self.taps].flatten(1).to(self.dtype)
            pre[b, :t] = hs[:t, -1].to(self.dtype)
        with torch.no_grad():
            last = self.norm(pre)
        return ids, aux, last, mask

    def digest(self) -> dict[str, Any]:
        """What the data is, for a resumed run's fingerprint: with a held-out share, the share and the samples it holds."""
        held = {"heldout": self.heldout, "held": self.held} if self.held else {}
        return {"hidden_states": str(self.folder.resolve()), "samples": self.n, "taps": self.taps, **held}


@dataclass
class HiddenStateHeldOut:
    """The held-out samples a ``--hidden-states`` run is evaluated on (:func:`specfmt.training.loop.evaluate`): sample
    ``numbers`` of ``data`` (its :attr:`HiddenStateBatches.held`), their features read from the files (the verifier
    does not run), each with its loss mask."""

    data: HiddenStateBatches
    numbers: list[int]

    def batches(self, verifier: Any, taps: list[int], device: Any) -> "Iterator[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]]":
        """``(ids [B, T], aux [B, T, k·H] or None, last [B, T, H], loss_mask [B, T])`` of the samples, ``data.batch`` at a
        time, in order, on ``device`` (:meth:`HiddenStateBatches.rows`; ``verifier`` and ``taps`` are not read).

        Raises:
            InputError: as :meth:`HiddenStateBatches.sample`.
        """
        for first in range(0, len(self.numbers), self.data.batch):
            ids, aux, last, mask = self.data.rows(self.numbers[first:first + self.data.batch])
            yield ids.to(device), (aux.to(device) if aux is not None else None), last.to(device), mask.to(device)


__all__ = ["HiddenStateBatches", "HiddenStateHeldOut", "hidden_state_documents", "stored_layers", "tap_positions"]
