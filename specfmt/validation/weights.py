"""Did vLLM load the draft's weights? Compare what vLLM holds with the file, element by element.

vLLM keeps a draft tensor it did not find at its initial value without a word
(``docs/design/research-formats.md`` §1.2: the EAGLE classes' ``load_weights`` return nothing), and a
tensor loaded under another's name, or transposed, keeps its shape and its sum. So ``validate --run``
has the engine write the draft's tensors as it holds them after loading
(:func:`specfmt.validation.vllm_run.generate` with ``dump_draft``, the same engine that serves the
prompts) and this module compares every one of them with the file:

* **the rule: equal after one rounding.** vLLM's weight loaders copy each file tensor into a parameter of
  the dtype it serves in (``param.data.copy_(loaded_weight)``: one round-to-nearest-even cast), so what it
  holds is the file's tensor cast by torch to that dtype, bit for bit. Each file tensor is cast once to the
  dtype of the tensor vLLM holds (the served dtype, e.g. ``bfloat16`` for a float16 or float32 file on vLLM's
  CPU build) and must be equal to it; integer tensors (EAGLE-3's ``d2t``) must be equal as they are. A
  tolerance would let a swapped or transposed block of similar values through; there is no arithmetic
  between the file and the parameter to allow for. The one exception is a weight vLLM's CPU build repacks
  (its parameter then reads empty): it is read by applying the layer to the identity (``<module>.applied``),
  where each output is one weight times one, exact in any precision except that CPU kernels may flush a
  weight below the served dtype's smallest normal to zero (allowed there, and only there).
* **names.** vLLM's names lose ``model.``; its merged layers (``qkv_proj``, ``gate_up_proj``) hold the
  file's parts stacked along the output dimension in :data:`MERGED` order, and each part is compared with
  its own rows; other renames are the algorithm's
  :attr:`~specfmt.algorithms.base.Algorithm.vllm_aliases` (``draft_id_to_target_id`` is ``d2t``).
* **shared modules.** A module vLLM replaced by the verifier's (``embed_tokens``, ``lm_head``:
  ``llm_base_proposer._maybe_share_*``, when the file lacks it or holds an identical copy) is compared with
  the verifier's tensor, and the file's own copy, if any, must be that tensor too.
* **vocabulary padding.** An embedding or LM head vLLM pads to a multiple of :data:`VOCAB_PADDING` rows
  (``pad_vocab_size`` in ``vocab_parallel_embedding.py``) holds the file's rows, then zeros.
* **every file tensor is held**, except those the algorithm says vLLM keeps no copy of
  (:attr:`~specfmt.algorithms.base.Algorithm.vllm_not_held`, e.g. EAGLE-3's ``t2d``).
"""

from __future__ import annotations

from fnmatch import fnmatchcase

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping

if TYPE_CHECKING:  # pragma: no cover
    import torch

#: vLLM's merged linear layers: the file's parts, stacked along the output dimension in this order
#: (``QKVParallelLinear``, ``MergedColumnParallelLinear``)
MERGED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
#: vLLM pads an embedding's or LM head's rows to a multiple of this, with zeros (``DEFAULT_VOCAB_PADDING_SIZE``)
VOCAB_PADDING = 64
#: the suffix under which the engine writes the weight a linear layer applies, read functionally
APPLIED = ".applied"


@dataclass
class WeightCheck:
    """What :func:`vllm_weight_mismatches` found.

    Attributes:
        problems: one line per tensor that is not the file's (or the verifier's, for a shared module),
            absent from the file, or in the file but not held; empty when every tensor matches.
        held: tensors vLLM holds for the draft that were compared.
        file_tensors: the file's tensors found among them (a shared module's copy included).
        shared: modules vLLM shares with the verifier, compared with the verifier's tensors.
        dtype: the dtype vLLM holds the draft's floating tensors in (None: it held none).
    """

    problems: list[str] = field(default_factory=list)
    held: int = 0
    file_tensors: int = 0
    shared: list[str] = field(default_factory=list)
    dtype: str | None = None

    @property
    def ok(self) -> bool:
        return not self.problems


class _HeldFile(Mapping):
    """The engine's dump (a safetensors file) as a mapping that reads one tensor at a time."""

    def __init__(self, path: str | os.PathLike) -> None:
        from safetensors import safe_open

        self._file = safe_open(str(path), framework="pt")
        self._keys = list(self._file.keys())

    def __getitem__(self, name: str) -> "torch.Tensor":
        return self._file.get_tensor(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)


def file_names(held_name: str, aliases: Mapping[str, str]) -> tuple[str, list[str]]:
    """vLLM's name of a held tensor -> ``(module, the file's tensor names)``.

    ``model.layers.0.self_attn.qkv_proj.applied`` -> ``("layers", [layers.0.self_attn.q_proj.weight, ...k_proj..,
    ...v_proj..])``; ``draft_id_to_target_id`` -> ``("draft_id_to_target_id", ["d2t"])`` with EAGLE-3's aliases.
    The module is the name's first part, as vLLM reports what it shares (``embed_tokens``, ``lm_head``).
    """
    name = held_name[len("model."):] if held_name.startswith("model.") else held_name
    if name.endswith(APPLIED):
        name = name[: -len(APPLIED)] + ".weight"
    module = name.split(".")[0]
    name = aliases.get(name, name)
    stem, _, last = name.rpartition(".")
    for merged, parts in MERGED.items():
        if stem == merged or stem.endswith("." + merged):
            return module, [f"{stem[: -len(merged)]}{p}.{last}" for p in parts]
    return module, [name]


def _padded(rows: int) -> int:
    return -(-rows // VOCAB_PADDING) * VOCAB_PADDING


def _differ(got: "torch.Tensor", want: "torch.Tensor", applied: bool) -> str | None:
    """Why ``got`` (held by vLLM) is not ``want`` (the file's tensor, not yet rounded); None when it is."""
    import torch

    if got.is_floating_point() != want.is_floating_point():
        return f"vLLM holds {got.dtype}, the file {want.dtype}"
    want_shape = list(want.shape)
    if list(got.shape) != want_shape:
        pad = got.dim() == 2 and want.dim() == 2 and got.shape[1] == want.shape[1] and got.shape[0] == _padded(want.shape[0]) > want.shape[0]
        if not pad:
            return f"vLLM holds shape {list(got.shape)}, the file {want_shape}"
        if torch.count_nonzero(got[want.shape[0]:]):
            return f"vLLM's padding rows {want.shape[0]}-{got.shape[0] - 1} are not zero"
        got = got[: want.shape[0]]
    want = want.to(got.dtype)  # one round-to-nearest-even cast, as vLLM's loader copies it into the parameter
    same = got == want
    if applied and got.is_floating_point():  # a CPU kernel may flush a subnormal weight to zero
        same |= (got == 0) & (want.abs() < torch.finfo(got.dtype).tiny)
    if bool(same.all()):
        return None
    n = int((~same).sum())
    worst = float((got.double() - want.double()).abs().max())
    rounded = f" rounded to {str(got.dtype).replace('torch.', '')}" if got.is_floating_point() else ""
    return f"{n} of {got.numel()} elements differ from the file's{rounded} (max |diff| {worst:.3g})"


def vllm_weight_mismatches(
    held: "Mapping[str, torch.Tensor] | str | os.PathLike",
    tensors: "Mapping[str, torch.Tensor]",
    *,
    shares: Mapping[str, bool] | None = None,
    verifier: "Callable[[str], torch.Tensor] | None" = None,
    aliases: Mapping[str, str] | None = None,
    not_held: Mapping[str, str] | None = None,
    vllm_only: Mapping[str, str] | None = None,
) -> WeightCheck:
    """Compare every tensor vLLM holds for the draft with the file's, element by element (the module's rules).

    Args:
        held: the engine's dump (``{vLLM name: tensor}``, or the safetensors file
            :func:`specfmt.validation.vllm_run.generate` wrote with ``dump_draft``, read one tensor at a time):
            every non-empty parameter, and ``<module>.applied`` [output, input] for a linear layer whose
            parameter is repacked.
        tensors: the file's tensors, by the file's names.
        shares: ``{module: bool}``: the modules vLLM replaced by the verifier's (``VLLMRun.draft_shares``).
        verifier: ``module -> tensor``: the verifier's tensor for a shared module (``embed_tokens``: its
            input embedding, ``lm_head``: its output head); needed only when a module is shared.
        aliases: vLLM names that are not the file's (the algorithm's ``vllm_aliases``).
        not_held: ``{file tensor: why}``: file tensors vLLM keeps no copy of (the algorithm's ``vllm_not_held``).
        vllm_only: ``{name: why}``: vLLM parameters no file tensor feeds, not compared (the algorithm's ``vllm_only``); a
            name may be a shell pattern (:func:`fnmatch.fnmatchcase`, e.g. ``layers.[1-9]*.hidden_norm.weight``).

    Returns:
        A :class:`WeightCheck`; ``problems`` empty when vLLM holds exactly the file.

    Raises:
        OSError, safetensors' errors: the dump cannot be read (the caller reports it).
    """
    held = _HeldFile(held) if isinstance(held, (str, os.PathLike)) else held
    cmp = _Comparison(tensors, verifier, not_held or {})
    for name in sorted(held):
        got = held[name]
        module, names = file_names(name, aliases or {})
        if all(any(fnmatchcase(n, pattern) for pattern in vllm_only or {}) for n in names):
            continue
        cmp.count(got)
        if (shares or {}).get(module):
            cmp.shared(name, module, names, got)
        else:
            cmp.own(name, names, got)
    return cmp.result()


class _Comparison:
    """The running state of :func:`vllm_weight_mismatches`: what was held, covered and found wrong."""

    def __init__(self, tensors: "Mapping[str, torch.Tensor]", verifier, not_held: Mapping[str, str]) -> None:
        self.tensors, self.verifier, self.not_held = tensors, verifier, not_held
        self.out = WeightCheck()
        self.problems: dict[str, None] = {}  # ordered, without repeats (a layer may be read twice: parameter and applied)
        self.covered: set[str] = set()
        self.theirs: dict[str, Any] = {}

    def count(self, got: "torch.Tensor") -> None:
        self.out.held += 1
        if got.is_floating_point() and self.out.dtype is None:
            self.out.dtype = str(got.dtype).replace("torch.", "")

    def verifier_tensor(self, module: str):
        """The verifier's tensor for ``module``, read once; the exception when it cannot be read."""
        if module not in self.theirs:
            try:
                self.theirs[module] = self.verifier(module) if self.verifier is not None else None
            except Exception as e:  # noqa: BLE001 - reported as the check's finding, not raised
                self.theirs[module] = e
        return self.theirs[module]

    def shared(self, name: str, module: str, names: list[str], got: "torch.Tensor") -> None:
        """A module vLLM replaced by the verifier's: vLLM's must be the verifier's, and so must the file's copy."""
        applied = name.endswith(APPLIED)
        if module not in self.out.shared:
            self.out.shared.append(module)
        want = self.verifier_tensor(module)
        if want is None or isinstance(want, Exception):
            self.problems[f"{module}: vLLM shares the verifier's, which cannot be read to compare" + (f" ({want})" if want is not None else "")] = None
            return
        why = _differ(got, want, applied)
        if why:
            self.problems[f"{name}: vLLM shares the verifier's {module}, but holds other values: {why}"] = None
        for n in names:  # the file's own copy of a module vLLM shares: it must be the verifier's
            if n in self.tensors:
                self.covered.add(n)
                why = _differ(got, self.tensors[n], applied)
                if why:
                    self.problems[f"{n}: vLLM uses the verifier's {module} in its place, and the file's differs: {why}"] = None

    def own(self, name: str, names: list[str], got: "torch.Tensor") -> None:
        """A module vLLM loaded from the file: one file tensor, or several merged by rows."""
        applied = name.endswith(APPLIED)
        missing = [n for n in names if n not in self.tensors]
        for n in missing:
            self.problems[f"{n}: not in the file; vLLM keeps its initial value"] = None
        if missing:
            self.covered.update(n for n in names if n in self.tensors)  # held, in a layer whose rows cannot be told apart
            return
        self.covered.update(names)
        parts = [self.tensors[n] for n in names]
        if len(parts) > 1 and got.dim() >= 1 and got.shape[0] == sum(p.shape[0] for p in parts):
            rows = 0
            for n, p in zip(names, parts):  # each part against its own rows of the merged layer
                why = _differ(got[rows:rows + p.shape[0]], p, applied)
                rows += p.shape[0]
                if why:
                    self.problems[f"{n} (rows {rows - p.shape[0]}-{rows - 1} of vLLM's {name}): {why}"] = None
        elif len(parts) > 1:
            self.problems[f"{name}: vLLM holds shape {list(got.shape)}, the file's {'+'.join(names)} stack to "
                          f"{[sum(p.shape[0] for p in parts), *parts[0].shape[1:]]}"] = None
        else:
            why = _differ(got, parts[0], applied)
            if why:
                self.problems[f"{names[0]}: {why}" + (f" (vLLM's {name})" if name != names[0] else "")] = None

    def result(self) -> WeightCheck:
        """The check: every file tensor vLLM holds no copy of (and was not declared so) is a problem."""
        for n in sorted(set(self.tensors) - self.covered):
            if n not in self.not_held:
                self.problems[f"{n}: in the file, but vLLM holds no copy of it"] = None
        self.out.file_tensors = len(self.covered)
        self.out.problems = list(self.problems)
        return self.out


__all__ = ["APPLIED", "MERGED", "VOCAB_PADDING", "WeightCheck", "file_names", "vllm_weight_mismatches"]
