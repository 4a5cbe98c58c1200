"""What every converter shares: tensor-name rules as data, declared config fields, layouts
shared with ``specfmt inspect``, the plan, and the registry.

A converter is a registered class that states only what differs (llama.cpp's
``convert_hf_to_gguf.py`` and ``gguf-py/tensor_mapping.py`` work the same way):

* a :class:`NameMap` per source dialect (vLLM V0's ``model.`` prefix, speculators-eagle's
  ``fusion_fc.*``), declared like vLLM's ``WeightsMapper`` and applied first
  (:attr:`Source.names`), so the rest sees one naming;
* :attr:`Converter.rules`: its rename / keep / drop table, each drop with its reason (vLLM's
  ``WeightsMapper`` plus a reason);
* tables of :class:`Refusal` rows ``(test, message, hint)`` for every refusal that is a condition
  on config fields or tensor names, and of :class:`FieldReading` rows for a layout's own meaning
  of a field (SpecForge's top-level ``norm_output``);
* :attr:`Converter.fields`: the config fields it reads, with the JSON type each must have
  (checked before anything is planned, :func:`check_source_types`);
* :attr:`Converter.layouts`: the repository layouts it recognises, as predicates over the
  config and the tensor names; ``specfmt inspect`` and ``--from auto`` use the same
  predicates (:mod:`specfmt.detect`), so one set of layout names exists;
* :meth:`Converter.decide`: the output config (built by the algorithm,
  :mod:`specfmt.algorithms`), the refusals that need a computed value (sizes read from
  tensors, the verifier's), and the few transforms a table cannot say (the EAGLE-1 bias
  fold, ``t2d`` from ``d2t``, the Medusa v2 head copy), as :class:`Derived` tensors. It reads
  the plan's output names (:meth:`Plan.outputs`, :meth:`Plan.names`), never the source's.

The shared :meth:`Converter.plan` runs the common opening (field types, layout, tensor table)
and returns a typed :class:`Plan`; :mod:`specfmt.convert` checks it against the format, and
:meth:`Plan.stream` yields its tensors, with their checks, to disk or into memory. Every source tensor ends
in exactly one of four places -- renamed, kept, folded exactly into other tensors, or dropped
with a stated reason -- and a name no rule knows is an error (speculators issue #1114 saved
random weights instead).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar

from specfmt.checkpoint.dtypes import DTYPE_CODES, DTYPE_NAMES, SOURCE_FLOATS, ST_DTYPES
from specfmt.checkpoint.reader import CheckpointReader, TensorInfo
from specfmt.checkpoint.stream import OutTensor, Refusals, TensorStream
from specfmt.errors import ConversionError, InputError
from specfmt.format.config import DecoderConfig
from specfmt.format.model import (BOOL, INDEXES, NON_NEGATIVE_INT, OBJECT, POSITIVE_INT, POSITIVE_REAL, STRING, STRINGS,  # noqa: F401  (the converters' words)
                                  field_kinds)
from specfmt.sources.resolve import Resolved

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from specfmt.sources.verifier import Verifier


@dataclass(frozen=True)
class Rule:
    """One line of a converter's table.

    Attributes:
        pattern: regex matched against the whole source tensor name.
        to: replacement (``re`` template, e.g. ``r"layers.0.\\1"``); ``None`` drops the tensor.
        reason: why a tensor is dropped (required when ``to`` is None).
    """

    pattern: str
    to: str | None
    reason: str = ""

    def apply(self, name: str) -> tuple[bool, str | None]:
        m = re.fullmatch(self.pattern, name)
        if not m:
            return False, None
        return True, (m.expand(self.to) if self.to is not None else None)


KEEP = r"\g<0>"


@dataclass
class TensorMove:
    """What happens to one source tensor.

    Attributes:
        src: source name.
        dst: output name (None when dropped).
        action: ``"rename"``, ``"keep"``, ``"drop"`` or ``"fold"`` (its values live on,
            exactly, in :class:`Derived` tensors; it is not written itself).
        reason: why it was dropped, or where it was folded (empty otherwise).
        info: the source header entry.
        out_dtype: safetensors dtype code written (casts only with ``--dtype``).
    """

    src: str
    dst: str | None
    action: str
    reason: str
    info: TensorInfo
    out_dtype: str

    def drop(self, reason: str, action: str = "drop") -> None:
        """Do not write this tensor (``action`` ``drop``, or ``fold`` when its values live on elsewhere)."""
        self.dst, self.action, self.reason = None, action, reason


@dataclass
class Derived:
    """An output tensor computed rather than copied.

    Attributes:
        dst: output name.
        shape: output shape.
        out_dtype: safetensors dtype code written.
        how: one line for the provenance block (``specfmt.tensors.derived``).
        compute: ``compute(get)`` returns the tensor, where ``get(name)`` loads a source
            tensor; it may also read the verifier. The result is cast to ``out_dtype``
            and checked for NaN/Inf (e.g. a fold that overflows float16) before writing.
    """

    dst: str
    shape: tuple[int, ...]
    out_dtype: str
    how: str
    compute: Callable[[Callable[[str], Any]], Any]


@dataclass(frozen=True)
class NameMap:
    """A source dialect's tensor names as the names a converter's rules read, declared as data
    the way vLLM's ``WeightsMapper`` declares them (``vllm/model_executor/models/utils.py``:
    ``orig_to_new_regex``, then ``orig_to_new_substr``, then ``orig_to_new_prefix``, each applied
    in order to the name the previous one gave; a target of None leaves the tensor out of the
    converter's view).

    A layout selects a map (vLLM V0's ``model.`` prefix, speculators <= 0.6 eagle's
    ``fusion_fc.*`` / ``transformer.*``); :meth:`Converter.plan` applies it first, plans under the
    mapped names, and records the real source names in the plan (provenance reads them).

    Attributes:
        regex: ``(pattern, template)`` pairs; ``re.sub`` where ``re.search`` finds the pattern.
        substr: ``(substring, replacement)`` pairs; the first occurrence is replaced.
        prefix: ``(prefix, replacement)`` pairs.
    """

    regex: tuple[tuple[str, str | None], ...] = ()
    substr: tuple[tuple[str, str | None], ...] = ()
    prefix: tuple[tuple[str, str | None], ...] = ()

    def map_name(self, name: str) -> str | None:
        """The mapped name, or None when the map leaves the tensor out."""
        for pattern, to in self.regex:
            if re.search(pattern, name):
                if to is None:
                    return None
                name = re.sub(pattern, to, name)
        for sub, to in self.substr:
            if sub in name:
                if to is None:
                    return None
                name = name.replace(sub, to, 1)
        for pre, to in self.prefix:
            if name.startswith(pre):
                if to is None:
                    return None
                name = to + name[len(pre):]
        return name

    def view(self, names: Any) -> dict[str, str]:
        """``{mapped name: source name}`` of every name the map keeps."""
        out = {}
        for old in names:
            new = self.map_name(old)
            if new is not None:
                out[new] = old
        return out


@dataclass
class Source:
    """A source checkpoint opened for conversion.

    Attributes:
        resolved: where it is.
        config: its parsed config.json.
        reader: its weight files, headers read.
        verifier: the verifier (``--verifier``), resolved once; converters read its sizes
            (``verifier.info``) and, where a layout needs one, a tensor (``verifier.open_tensor``).
        names: the source dialect's tensor-name map (:class:`NameMap`), applied before the
            converter's rules; None: the names are the converter's own.
    """

    resolved: Resolved
    config: dict[str, Any]
    reader: Any
    verifier: "Verifier"
    names: "NameMap | None" = None

    @property
    def folder(self) -> Path:
        return self.resolved.folder

    def get(self, name: str) -> Any:
        """The tensor ``name`` (torch), under the names the converter plans with."""
        return self.reader.get(name)

    def array(self, name: str) -> Any:
        """The tensor ``name`` as a numpy array (no torch), under the names the converter plans with."""
        return self.reader.array(name)

    @property
    def source_names(self) -> dict[str, TensorInfo]:
        """``{name: header entry}`` under the source's own names: what a dialect's translation
        (``from_speculators``, vLLM V0's unwrapping) reads before its :class:`NameMap` applies.
        A plan reads :meth:`Plan.outputs` / :meth:`Plan.names` instead."""
        return self.reader.infos

    def mapped(self) -> "Source":
        """This source seen through its :attr:`names` map: the reader shows the mapped names
        (itself when there is no map)."""
        if self.names is None:
            return self
        return replace(self, reader=_MappedReader(self.reader, self.names.view(self.reader.infos)), names=None)


@dataclass
class Options:
    """Conversion options shared by converters (CLI flags of ``specfmt convert``).

    Attributes:
        speculative_tokens: k written into ``proposal_methods[0].speculative_tokens``
            (None: the converter's default).
        aux_layers: tap layer ids given by the user, in vLLM's convention (None: from the
            source, else the default).
        tap_ids: how to read tap ids whose convention the source file does not fix:
            ``layer-output`` or ``layer-input`` (:data:`converters.taps.TAP_READINGS`).
        dtype: output dtype for floating tensors (``float16``/``bfloat16``/``float32``),
            None keeps the source dtype.
        mask_token_id: the mask token of a draft whose source does not record it (SpecForge's P-EAGLE);
            a converter whose source records one refuses a different value.
    """

    speculative_tokens: int | None = None
    aux_layers: list[int] | None = None
    dtype: str | None = None
    tap_ids: str | None = None
    mask_token_id: int | None = None


@dataclass
class Plan:
    """A conversion, fully decided, before anything is written: an in-memory draft whose
    tensors are still in the source files.

    Attributes:
        source_format: the ``--from`` name.
        layout: which repository layout the source follows (e.g. ``safeailab``).
        config: the output config.json (without the provenance block).
        moves: one entry per source tensor, in output order for kept/renamed ones.
        notes: facts the user should see (defaults applied, files ignored).
        unknown: source tensors no rule of the converter knows (an error).
        derived: output tensors computed from source (or verifier) tensors, written
            after the copied ones.
    """

    source_format: str
    layout: str
    config: dict[str, Any]
    moves: list[TensorMove]
    notes: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    derived: list[Derived] = field(default_factory=list)

    @property
    def written(self) -> list[TensorMove]:
        return [m for m in self.moves if m.dst is not None]

    def outputs(self) -> dict[str, TensorInfo]:
        """``{output name: source header entry}`` of every move written: what a converter's
        :meth:`Converter.decide` reads, so a layout's source naming never reaches it."""
        return {m.dst: m.info for m in self.moves if m.dst is not None}

    def names(self) -> set[str]:
        """Every tensor name a converter's refusals may test: the output names of the written moves
        and the names no rule knows (:attr:`unknown`, as the source has them)."""
        return set(self.outputs()) | set(self.unknown)

    def output_shapes(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """``{name: (shape, dtype code)}`` of every tensor the plan writes."""
        out = {m.dst: (tuple(m.info.shape), m.out_dtype) for m in self.written}
        out.update({d.dst: (tuple(d.shape), d.out_dtype) for d in self.derived})
        return out

    def stream(self, reader: Any) -> TensorStream:
        """The plan's output tensors as they are written, checked, or loaded (:mod:`specfmt.checkpoint.stream`):
        the written moves in order, then the derived tensors.

        A move kept in its source dtype with a plain byte range in its file
        (:meth:`CheckpointReader.raw`) is copied from that range; a cast move (``--dtype``) is read
        and cast; a derived tensor is computed, cast to its ``out_dtype`` and made contiguous. Every
        tensor is checked for NaN/±Inf, and the algorithm's :attr:`~specfmt.algorithms.base.Algorithm.map_tensors`
        (the EAGLE-3 ``d2t``/``t2d``) together (:meth:`~specfmt.algorithms.base.Algorithm.tensor_problems`).

        Args:
            reader: the source's weights (open while the stream is consumed).

        Returns:
            The :class:`~specfmt.checkpoint.stream.TensorStream`; a failed check raises
            :class:`ConversionError` at once (a NaN/Inf: the tensor's source name, and
            ``after the cast`` for a cast or derived one; an inconsistent vocabulary map).
        """
        from specfmt.algorithms import of

        algo = of(self.config)
        tensors = [_moved(m, reader) for m in self.written] + [_derived(d, reader) for d in self.derived]
        maps = sorted({t.name for t in tensors} & set(algo.map_tensors))
        return TensorStream(tensors, _RefuseConversion(maps), together=tuple(algo.map_tensors),
                            check_together=lambda kept: algo.tensor_problems(self.config, kept))


def _torch_dtype(code: str) -> "torch.dtype":
    import torch

    return getattr(torch, ST_DTYPES[code][0])


def _moved(m: TensorMove, reader: Any) -> OutTensor:
    """A written move as a stream tensor: its source bytes copied when it keeps its dtype, else read and cast."""
    cast = m.out_dtype != m.info.dtype

    def compute() -> "torch.Tensor":
        t = reader.get(m.src)
        return t.to(_torch_dtype(m.out_dtype)) if cast else t

    return OutTensor(m.dst, m.out_dtype, tuple(m.info.shape), compute, copy_from=None if cast else reader.raw(m.src),
                     array=lambda: reader.array(m.src), shared=True, label=f"tensor {m.src}", cast=cast,
                     hint="keep the source dtype (drop --dtype)" if cast else "the checkpoint is damaged")


def _derived(d: Derived, reader: Any) -> OutTensor:
    """A derived tensor as a stream tensor: computed (reading source tensors by name), cast to its ``out_dtype``, contiguous."""
    return OutTensor(d.dst, d.out_dtype, tuple(d.shape), lambda: d.compute(reader.get).to(_torch_dtype(d.out_dtype)).contiguous(),
                     label=f"derived tensor {d.dst} ({d.how})", cast=True,
                     hint="the value does not fit the output dtype; convert with --dtype float32 (or bfloat16)")


class _RefuseConversion(Refusals):
    """A conversion refuses at the first failed check: nothing reaches OUT (or the trainer).
    ``maps`` names the stream's map tensors, which an inconsistent map's error lists."""

    def __init__(self, maps: list[str]) -> None:
        self.maps = maps

    def nonfinite(self, tensor: OutTensor, count: int) -> None:
        raise ConversionError(f"{tensor.label} has {count} NaN/Inf value(s)" + (" after the cast" if tensor.cast else ""), hint=tensor.hint)

    def inconsistent(self, problems: list[str]) -> None:
        raise ConversionError("the draft vocabulary map is inconsistent: " + "; ".join(problems), hint="the source's d2t/t2d are damaged",
                              tensors={"inconsistent": list(self.maps)})


# --------------------------------------------------------------------------- layouts


@dataclass(frozen=True)
class Seen:
    """What a layout predicate may look at: the config, the tensor names and shapes, the
    weights' format (``safetensors`` / ``pickle``) and every file name in the folder."""

    config: dict[str, Any]
    shapes: dict[str, tuple[int, ...]]
    format: str
    files: frozenset[str]

    @classmethod
    def of(cls, config: dict[str, Any], reader: Any) -> "Seen":
        folder = Path(reader.folder)
        files = frozenset(p.name for p in folder.iterdir()) if folder.is_dir() else frozenset()
        return cls(config, {n: tuple(i.shape) for n, i in reader.infos.items()}, reader.format, files)

    @property
    def names(self) -> set[str]:
        return set(self.shapes)

    def has(self, pattern: str) -> bool:
        """Some tensor name matches ``pattern`` (a regex, whole name)."""
        rx = re.compile(pattern)
        return any(rx.fullmatch(n) for n in self.names)


@dataclass(frozen=True)
class Example:
    """A published checkpoint or config of a layout (the docs' "real example" column).

    Attributes:
        title: what it is, e.g. ``yuhuili/EAGLE3-LLaMA3.1-Instruct-8B``.
        url: where its text is published (empty when none was found).
        note: what else to know about it, e.g. ``config says 2 heads, file holds 5``.
    """

    title: str
    url: str = ""
    note: str = ""


@dataclass(frozen=True)
class Layout:
    """A repository layout a converter recognises. The one statement of the layout: ``inspect``
    prints :attr:`evidence`, and the docs' table of accepted layouts (``docs/layouts.md``) is
    rendered from these fields.

    Attributes:
        name: the layout name (written into the provenance block, printed by ``inspect``).
        test: ``test(seen) -> bool``.
        evidence: one line saying what identifies it (``inspect`` prints it).
        details: what else the layout holds, beyond what identifies it (files, dtypes, fields).
        outcome: what ``specfmt convert`` does with it.
        examples: published checkpoints or configs in this layout.
    """

    name: str
    test: Callable[[Seen], bool]
    evidence: str
    details: str = ""
    outcome: str = "converted"
    examples: tuple[Example, ...] = ()


@dataclass(frozen=True)
class Case:
    """A variation a converter meets in any of its layouts (a config field, a tensor, a size) and
    what it does with it; rendered into the docs next to :attr:`Converter.layouts`.

    Attributes:
        what: the variation, e.g. ``head_dim`` ≠ H / heads.
        outcome: converted (and how), or refused (and why).
        examples: published checkpoints or configs that have it.
    """

    what: str
    outcome: str
    examples: tuple[Example, ...] = ()


# --------------------------------------------------------------------------- refusals as data


@dataclass(frozen=True)
class Refusal:
    """One refusal a converter states as data (a row of its ``refusals`` tables): a condition on
    config fields or tensor names, the message and the hint. :meth:`Converter.decide` keeps in
    code only the refusals that need a computed value (a size read from a tensor, a verifier
    figure).

    Attributes:
        test: ``test(ctx) -> bool``; true refuses. ``ctx`` is what the table is checked against
            (the converter's own small record of the source: config, names, layout).
        message: the one-line message, or ``message(ctx)`` for one that names values.
        hint: how to fix it (empty: none).
        where: the file concerned (``config.json`` by default; None for a tensor condition).
    """

    test: Callable[[Any], bool]
    message: str | Callable[[Any], str]
    hint: str = ""
    where: str | None = "config.json"

    def check(self, ctx: Any) -> None:
        """Raise this refusal if ``ctx`` meets it.

        Raises:
            ConversionError: ``test(ctx)`` is true.
        """
        if self.test(ctx):
            text = self.message(ctx) if callable(self.message) else self.message
            raise ConversionError(text, where=self.where, hint=self.hint or None)


def refuse(table: tuple[Refusal, ...], ctx: Any) -> None:
    """Check every row of a refusal table in order; the first that holds is raised.

    Raises:
        ConversionError: a row's condition holds.
    """
    for row in table:
        row.check(ctx)


@dataclass(frozen=True)
class FieldReading:
    """How a layout reads a config field whose meaning there is not vLLM's (a row of a converter's
    readings table, applied by :func:`read_fields`): SpecForge's top-level ``norm_output``, a
    research config's ``num_hidden_layers`` beside one unnumbered layer, a ``mixtral`` type over
    dense layers.

    Attributes:
        field: the config field read.
        when: ``when(cfg, ctx) -> bool``: the layout's reading applies (``ctx``: what else it
            looks at, e.g. the plan's tensor names).
        value: ``value(cfg, ctx)``: the field's value in vLLM's meaning.
        note: the note the plan records when the reading applies (or ``note(cfg)``).
        refusal: a value the layout's meaning has no vLLM equivalent for, checked first.
    """

    field: str
    when: Callable[[dict[str, Any], Any], bool]
    value: Callable[[dict[str, Any], Any], Any]
    note: str | Callable[[dict[str, Any]], str]
    refusal: "Refusal | None" = None


def read_fields(readings: tuple[FieldReading, ...], cfg: dict[str, Any], ctx: Any, notes: list[str]) -> dict[str, Any]:
    """The config with each reading that applies put in vLLM's meaning (a new dict), and its note.

    Raises:
        ConversionError: a reading's refusal holds.
    """
    for reading in readings:
        if not reading.when(cfg, ctx):
            continue
        if reading.refusal is not None:
            reading.refusal.check(cfg)
        notes.append(reading.note(cfg) if callable(reading.note) else reading.note)
        cfg = {**cfg, reading.field: reading.value(cfg, ctx)}
    return cfg


# --------------------------------------------------------------------------- config fields

# field kinds (what :func:`check_source_types` requires of a value; null counts as absent) and the
# tables of them come from the typed configs (:func:`specfmt.format.model.field_kinds`): a research
# config's decoder fields have the types the draft's decoder config gives them

#: the decoder fields of a Llama-style research config (every converter reads some of them): those of
#: :class:`~specfmt.format.config.DecoderConfig`, and a multimodal verifier's nested ``text_config``
DECODER_FIELDS: dict[str, str] = {**field_kinds(DecoderConfig), "text_config": OBJECT}


def _fits(kind: str, val: Any) -> bool:
    if kind == POSITIVE_INT:
        return type(val) is int and val >= 1
    if kind == NON_NEGATIVE_INT:
        return type(val) is int and val >= 0
    if kind == POSITIVE_REAL:
        return type(val) in (int, float) and math.isfinite(val) and val > 0
    if kind == BOOL:
        return type(val) is bool
    if kind == STRING:
        return isinstance(val, str)
    if kind == OBJECT:
        return isinstance(val, dict)
    if kind == STRINGS:
        return isinstance(val, list) and all(isinstance(a, str) for a in val)
    if kind == INDEXES:
        return isinstance(val, list) and all(type(i) is int and i >= 0 for i in val)
    raise ValueError(f"unknown field kind {kind!r}")  # a converter's table is wrong


def check_source_types(cfg: dict[str, Any], fields: dict[str, str], where: str = "config.json", nested: tuple[str, ...] = ()) -> None:
    """The fields of a research config.json that a converter reads have the JSON types they
    must have (null counts as absent). Checked before anything is planned, so a stranger's
    ``"hidden_size": "4096"`` or ``"rms_norm_eps": [1]`` is one clear line, not a crash
    (found by ``tests/test_fuzz.py``). The objects named in ``nested`` (e.g. ``eagle_config``)
    are checked the same way.

    Raises:
        InputError: the first field of the wrong type or value, naming it.
    """
    for key, val in cfg.items():
        kind = fields.get(key)
        if val is None or kind is None:
            continue
        if not _fits(kind, val):
            raise InputError(f"config field {key} must be {kind}, not {json_repr(val)}", where=where, hint="fix the source's config.json")
    for key in nested:
        if isinstance(cfg.get(key), dict):
            check_source_types(cfg[key], fields, where=f"{where} ({key})")


def json_repr(val: Any, limit: int = 40) -> str:
    text = repr(val)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --------------------------------------------------------------------------- the converter


class Converter:
    """Base class: subclasses set the class attributes below and implement :meth:`decide`."""

    #: the ``--from`` name
    name: ClassVar[str] = ""
    #: one line for ``specfmt convert --help``
    summary: ClassVar[str] = ""
    #: a few words after the name in the ``--from`` help (e.g. ``EAGLE-1/2``); empty: the name says it
    label: ClassVar[str] = ""
    #: what ``inspect`` calls the format of the layouts below (e.g. ``eagle`` for EAGLE-1 and HASS)
    detects_as: ClassVar[str] = ""
    #: the speculators_model_type whose older speculators checkpoints this converter reads too
    #: (``specfmt upgrade``; :meth:`from_speculators`), or None
    upgrades: ClassVar[str | None] = None
    #: the tensor-name table, first match wins
    rules: ClassVar[tuple[Rule, ...]] = ()
    #: config fields read, with the JSON type each must have
    fields: ClassVar[dict[str, str]] = DECODER_FIELDS
    #: config objects whose fields are checked like the top level's (e.g. ``eagle_config``)
    nested_fields: ClassVar[tuple[str, ...]] = ()
    #: the layouts recognised, first match names the source's; ``inspect`` / ``--from auto`` use them too
    layouts: ClassVar[tuple[Layout, ...]] = ()
    #: the layout of a source no predicate matches (the plan then reports its tensors in full)
    fallback_layout: ClassVar[str] = ""
    #: variations met in any of the layouts, and what the conversion does with each (docs only)
    cases: ClassVar[tuple[Case, ...]] = ()
    #: pickle files read besides ``pytorch_model*.bin`` (e.g. ``medusa_lm_head.pt``)
    pickle_names: ClassVar[tuple[str, ...]] = ()
    #: weight files of the source that are not the draft, with the reason (not read)
    ignore_files: ClassVar[dict[str, str]] = {}

    @property
    def algorithm(self) -> str | None:
        """The algorithm (``speculators_model_type``) this converter writes: :attr:`detects_as` where it names a
        registered algorithm (every research layout), None where the source decides (``speculators``: an older
        checkpoint of any algorithm)."""
        from specfmt.algorithms import find

        return self.detects_as if find(self.detects_as) is not None else None

    def claims(self, seen: Seen) -> bool:
        """For ``--from auto``: whether a source in one of :attr:`layouts` may be this converter's
        (False where the files say it is another's, e.g. HASS always has ``fc.bias``)."""
        return True

    def describe(self, seen: Seen) -> tuple[list[str], dict[str, Any]]:
        """For ``specfmt inspect``: evidence lines beyond the layout's, and key figures."""
        return [], {}

    def layout_of(self, seen: Seen) -> Layout | None:
        """The first of :attr:`layouts` that ``seen`` matches, or None."""
        return next((lay for lay in self.layouts if lay.test(seen)), None)

    def plan(self, src: Source, opts: Options) -> Plan:
        """Decide the output config and the fate of every source tensor; nothing is read but
        headers (and the few small tensors a decision needs), nothing is written.

        The common opening: the declared :attr:`fields` are type-checked, the source's
        :class:`NameMap` (its dialect, :attr:`Source.names`) is applied, the layout is named
        (:attr:`layouts`), and every tensor goes through :attr:`rules`; then :meth:`decide` makes
        the format's own decisions under those names. The plan's moves and derived tensors then
        name the real source tensors (they are read, and recorded, under those).

        Args:
            src: the source: config, weights (headers read) and the verifier.
            opts: the ``specfmt convert`` options.

        Returns:
            The :class:`Plan`. Tensors no rule knows are listed in :attr:`Plan.unknown`;
            :mod:`specfmt.convert` then refuses the plan together with any missing or
            mis-shaped tensor.

        Raises:
            InputError: a declared config field has the wrong JSON type.
            ConversionError: the source cannot be converted exactly (each converter's
                :meth:`decide` documents its refusals), or two tensors map to one output name.
        """
        check_source_types(src.config, self.fields, nested=self.nested_fields)
        view = src.mapped()
        layout = self.layout_of(Seen.of(view.config, view.reader))
        moves, unknown = self.map_tensors(view.reader.infos)
        plan = Plan(self.name, layout.name if layout else self.fallback_layout, {}, moves, unknown=unknown)
        self.decide(view, opts, plan)
        return _source_names(plan, view.reader.new_to_old) if view is not src else plan

    def decide(self, src: Source, opts: Options, plan: Plan) -> None:  # pragma: no cover - abstract
        """Fill in ``plan.config`` (and notes, derived tensors, dtypes), adjusting ``plan.moves``.

        Raises:
            ConversionError: the source does not describe a draft that vLLM runs exactly as
                the source computes it.
        """
        raise NotImplementedError

    def from_speculators(self, src: Source, cfg: dict[str, Any], notes: list[str]) -> Source:
        """The source of an older speculators checkpoint of :attr:`upgrades`, seen as this
        converter's research layout (config and tensor names); ``notes`` collects what the
        translation did."""
        raise NotImplementedError

    def map_tensors(self, infos: dict[str, TensorInfo]) -> tuple[list[TensorMove], list[str]]:
        """Apply :attr:`rules` to every source tensor (each written in its source dtype until
        :func:`decide_float_dtype` says otherwise).

        Returns:
            ``(moves, unknown)``: one move per known tensor, and the names no rule knows.

        Raises:
            ConversionError: two tensors map to one output name.
        """
        moves, unknown, taken = [], [], {}
        for name in sorted(infos):
            info = infos[name]
            for rule in self.rules:
                hit, dst = rule.apply(name)
                if not hit:
                    continue
                if dst is None:
                    moves.append(TensorMove(name, None, "drop", rule.reason, info, info.dtype))
                else:
                    if dst in taken:
                        raise ConversionError(f"source tensors {taken[dst]!r} and {name!r} both map to {dst!r}", tensors={"conflicting": [taken[dst], name]})
                    taken[dst] = name
                    moves.append(TensorMove(name, dst, "keep" if dst == name else "rename", "", info, info.dtype))
                break
            else:
                unknown.append(name)
        return moves, unknown


def short(names: list[str], n: int = 8) -> str:
    """At most ``n`` names, then how many more."""
    shown = ", ".join(names[:n])
    return shown + (f", ... ({len(names) - n} more)" if len(names) > n else "")


REGISTRY: dict[str, Converter] = {}


def register(cls: type[Converter]) -> type[Converter]:
    """Class decorator: make a converter available as ``--from cls.name``."""
    if not cls.name or cls.name in REGISTRY:
        raise ValueError(f"converter name {cls.name!r} missing or taken")
    REGISTRY[cls.name] = cls()
    return cls


# --------------------------------------------------------------------------- decisions shared by converters


def positive_int(cfg: dict[str, Any], key: str, default: int | None = None) -> int:
    """``cfg[key]`` as a positive integer.

    Raises:
        ConversionError: missing (without a default) or not a positive integer.
    """
    from specfmt.algorithms.layers import positive_int as _positive_int

    return _positive_int(cfg, key, default)


def check_vocab(V: int, verifier: "Verifier") -> None:
    """The draft's ``vocab_size`` is the verifier's.

    Raises:
        ConversionError: it is not.
    """
    if V != verifier.info.vocab_size:
        raise ConversionError(f"draft vocab_size {V} differs from the verifier's {verifier.info.vocab_size}", where="config.json",
                              hint="is --verifier the model this draft was trained for?", config_path="$.vocab_size")


def decide_float_dtype(moves: list[TensorMove], opts: Options, *, also: tuple[str, ...] = (), what: str = "the source") -> str:
    """The one floating dtype (safetensors code) written, and set it on every written float move.

    ``--dtype`` wins; otherwise the single float dtype over the tensors that are written
    (dropped ones do not count) and the codes in ``also`` (e.g. a verifier tensor a
    derived output is copied from).

    Raises:
        ConversionError: those dtypes are mixed and no ``--dtype`` was given (``what``
            names them in the message).
    """
    codes = sorted({m.info.dtype for m in moves if m.dst and m.info.dtype in SOURCE_FLOATS} | {c for c in also if c in SOURCE_FLOATS})
    if opts.dtype:
        out = DTYPE_CODES[opts.dtype]
    elif len(codes) == 1 and codes[0] in DTYPE_NAMES:
        out = codes[0]
    elif not codes:
        out = "F32"
    else:
        raise ConversionError(f"{what} mix floating dtypes {codes}", hint="choose one with --dtype float16|bfloat16|float32")
    for m in moves:
        if m.dst and m.info.dtype in SOURCE_FLOATS:
            m.out_dtype = out
    return out


def decoder_layer_count(indices: set[int], cfg: dict[str, Any]) -> int:
    """The number of decoder layers the weights hold, checked: numbered 0..n-1 and equal to
    the config's ``num_hidden_layers`` (1 when absent, as in every official EAGLE config).

    Raises:
        ConversionError: a gap in the numbering, no layer at all, or a config that disagrees.
    """
    layers = sorted(indices)
    n = len(layers)
    if layers != list(range(n)) or n == 0:
        raise ConversionError(f"decoder layers {layers} are not numbered 0..n-1")
    if cfg.get("num_hidden_layers", 1) != n:
        raise ConversionError(f"config num_hidden_layers={cfg.get('num_hidden_layers', 1)} but the weights hold {n} decoder layer(s)", where="config.json",
                              config_path="$.num_hidden_layers")
    return n


def check_rotary_caches(src: Source, tlc: DecoderConfig) -> None:
    """A saved ``rotary_emb.inv_freq`` is dropped only if it equals what the written
    ``rope_theta`` gives (``1 / theta**(arange(0, d, 2) / d)``), so the drop is exact.

    Raises:
        ConversionError: a saved cache disagrees with the config's rope settings.
    """
    caches = [name for name in src.source_names if name.endswith("rotary_emb.inv_freq")]
    if not caches:
        return  # the usual case: nothing to read, and torch stays unimported
    import torch

    d = tlc.head_dim
    theta = tlc.rope_theta
    want = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    rope = tlc.rope_parameters.dump() if tlc.rope_parameters is not None else {}  # the typed block, as the file holds it
    for name in caches:
        got = src.get(name).to(torch.float64)
        if rope.get("rope_type", "default") != "default" or got.shape != want.shape or not torch.allclose(got, want, rtol=1e-3):
            raise ConversionError(
                f"{name} does not match rope_theta={theta} (head_dim {d}) from the draft config",
                hint="the draft was trained with other rope settings; fix rope_theta in the source config.json",
                tensors={"inconsistent": [name]}, config_path="$.rope_theta",
            )


class _MappedReader:
    """A view of a :class:`CheckpointReader` under the names of a :class:`NameMap` (``{new: old}``)."""

    def __init__(self, reader: CheckpointReader, new_to_old: dict[str, str]):
        self._reader = reader
        self.new_to_old = dict(new_to_old)
        self._infos = {new: reader.infos[old] for new, old in self.new_to_old.items()}

    @property
    def infos(self) -> dict[str, TensorInfo]:
        return dict(self._infos)

    def get(self, name: str) -> Any:
        return self._reader.get(self.new_to_old[name])

    def raw(self, name: str) -> Any:
        return self._reader.raw(self.new_to_old[name])

    def array(self, name: str) -> Any:
        return self._reader.array(self.new_to_old[name])

    def __getattr__(self, attr: str) -> Any:  # files, ignored, format, folder
        return getattr(self._reader, attr)


def _source_names(plan: Plan, new_to_old: dict[str, str]) -> Plan:
    """Undo a :class:`NameMap` in a finished plan: moves name their real source tensors
    (so they are read and recorded under those names) and derived tensors read them too."""
    for m in plan.moves:
        m.src = new_to_old.get(m.src, m.src)
        if m.dst is not None:
            m.action = "keep" if m.dst == m.src else "rename"
    for d in plan.derived:
        d.compute = (lambda inner: (lambda get: inner(lambda n: get(new_to_old.get(n, n)))))(d.compute)
    return plan
