"""What every converter shares: tensor-name rules as data, the plan, the registry.

A converter is a table of rules plus the few decisions a table cannot make (the
output config, tap layers, checks against the verifier, folding a bias). It
returns a :class:`Plan`; :mod:`specfmt.convert` checks the plan against the
format and streams the tensors to disk. Every source tensor ends in exactly one
of four places -- renamed, kept, folded exactly into other tensors, or dropped
with a stated reason -- and a name no rule knows is an error (speculators issue
#1114 saved random weights instead). Output tensors that are computed rather
than copied (a folded bias, a head read from the verifier) are :class:`Derived`.

Inspired by llama.cpp's ``TensorNameMap`` and vLLM's ``WeightsMapper``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar

from specfmt.checkpoint import CheckpointReader, TensorInfo
from specfmt.errors import ConversionError
from specfmt.format import VerifierInfo
from specfmt.hub import Resolved


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


@dataclass
class Source:
    """A source checkpoint opened for conversion.

    Attributes:
        resolved: where it is.
        config: its parsed config.json.
        reader: its weight files, headers read.
        verifier_ref: the ``--verifier`` reference (folder or Hub id), for converters
            that read verifier tensors (:func:`specfmt.convert.open_verifier_tensor`).
    """

    resolved: Resolved
    config: dict[str, Any]
    reader: CheckpointReader
    verifier_ref: str = ""

    @property
    def folder(self) -> Path:
        return self.resolved.folder


@dataclass
class Options:
    """Conversion options shared by converters (CLI flags of ``specfmt convert``).

    Attributes:
        speculative_tokens: k written into ``proposal_methods[0].speculative_tokens``
            (None: the converter's default).
        aux_layers: tap layer ids given by the user (None: from the source, else the default).
        dtype: output dtype for floating tensors (``float16``/``bfloat16``/``float32``),
            None keeps the source dtype.
    """

    speculative_tokens: int | None = None
    aux_layers: list[int] | None = None
    dtype: str | None = None


@dataclass
class Plan:
    """A conversion, fully decided, before anything is written.

    Attributes:
        source_format: the ``--from`` name.
        layout: which repository layout the source follows (e.g. ``safeailab``).
        config: the output config.json (without the provenance block).
        moves: one entry per source tensor, in output order for kept/renamed ones.
        notes: facts the user should see (defaults applied, files ignored).
        transforms: optional per-output-tensor functions applied while streaming.
        unknown: source tensors no rule of the converter knows (an error).
        derived: output tensors computed from source (or verifier) tensors, written
            after the copied ones.
    """

    source_format: str
    layout: str
    config: dict[str, Any]
    moves: list[TensorMove]
    notes: list[str] = field(default_factory=list)
    transforms: dict[str, Callable[[Any], Any]] = field(default_factory=dict)
    unknown: list[str] = field(default_factory=list)
    derived: list[Derived] = field(default_factory=list)

    @property
    def written(self) -> list[TensorMove]:
        return [m for m in self.moves if m.dst is not None]

    def output_shapes(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """``{name: (shape, dtype code)}`` of every tensor the plan writes."""
        out = {m.dst: (tuple(m.info.shape), m.out_dtype) for m in self.written}
        out.update({d.dst: (tuple(d.shape), d.out_dtype) for d in self.derived})
        return out


class Converter:
    """Base class: subclasses set :attr:`name`, :attr:`rules` and implement :meth:`plan`."""

    #: the ``--from`` name
    name: ClassVar[str] = ""
    #: one line for ``specfmt convert --help``
    summary: ClassVar[str] = ""
    #: the tensor-name table, first match wins
    rules: ClassVar[tuple[Rule, ...]] = ()
    #: pickle files read besides ``pytorch_model*.bin`` (e.g. ``medusa_lm_head.pt``)
    pickle_names: ClassVar[tuple[str, ...]] = ()
    #: weight files of the source that are not the draft, with the reason (not read)
    ignore_files: ClassVar[dict[str, str]] = {}

    def plan(self, src: Source, verifier: VerifierInfo, opts: Options) -> Plan:  # pragma: no cover - abstract
        raise NotImplementedError

    def map_tensors(self, infos: dict[str, TensorInfo], out_dtype: Callable[[TensorInfo], str]) -> tuple[list[TensorMove], list[str]]:
        """Apply :attr:`rules` to every source tensor.

        Returns:
            ``(moves, unknown)``: one move per known tensor, and the names no rule knows.
            :meth:`plan` puts the latter into :attr:`Plan.unknown`; the conversion then
            fails listing them together with any missing or mis-shaped tensors.

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
                        raise ConversionError(f"source tensors {taken[dst]!r} and {name!r} both map to {dst!r}")
                    taken[dst] = name
                    moves.append(TensorMove(name, dst, "keep" if dst == name else "rename", "", info, out_dtype(info)))
                break
            else:
                unknown.append(name)
        return moves, unknown


def _short(names: list[str], n: int = 8) -> str:
    shown = ", ".join(names[:n])
    return shown + (f", ... ({len(names) - n} more)" if len(names) > n else "")


REGISTRY: dict[str, type[Converter]] = {}


def register(cls: type[Converter]) -> type[Converter]:
    """Class decorator: make a converter available as ``--from cls.name``."""
    if not cls.name or cls.name in REGISTRY:
        raise ValueError(f"converter name {cls.name!r} missing or taken")
    REGISTRY[cls.name] = cls
    return cls


# --------------------------------------------------------------------------- helpers shared by converters

#: output float dtypes: safetensors code -> config name
DTYPE_NAMES = {"F16": "float16", "BF16": "bfloat16", "F32": "float32"}
DTYPE_CODES = {v: k for k, v in DTYPE_NAMES.items()}
_FLOATS = ("F16", "BF16", "F32", "F64")


def speculators_block(algorithm: str, speculative_tokens: int, verifier: VerifierInfo) -> dict[str, Any]:
    """The ``speculators_config`` object: one greedy proposal method of ``speculative_tokens``
    (what vLLM reads as ``num_speculative_tokens``) and the verifier vLLM serves."""
    return {
        "algorithm": algorithm,
        "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": speculative_tokens, "verifier_accept_k": 1, "accept_tolerance": 0.0}],
        "default_proposal_method": "greedy",
        "verifier": {"name_or_path": verifier.name_or_path, "architectures": list(verifier.architectures)},
    }


def positive_int(cfg: dict[str, Any], key: str, default: int | None = None) -> int:
    """``cfg[key]`` as a positive integer.

    Raises:
        ConversionError: missing (without a default) or not a positive integer.
    """
    val = cfg.get(key, default)
    if not isinstance(val, int) or isinstance(val, bool) or val < 1:
        raise ConversionError(f"source config field {key} must be a positive integer, got {val!r}", where="config.json")
    return val


def decide_float_dtype(moves: list[TensorMove], opts: Options, *, also: tuple[str, ...] = (), what: str = "the source") -> str:
    """The one floating dtype (safetensors code) written, and set it on every written float move.

    ``--dtype`` wins; otherwise the single float dtype over the tensors that are written
    (dropped ones do not count) and the codes in ``also`` (e.g. a verifier tensor a
    derived output is copied from).

    Raises:
        ConversionError: those dtypes are mixed and no ``--dtype`` was given (``what``
            names them in the message).
    """
    codes = sorted({m.info.dtype for m in moves if m.dst and m.info.dtype in _FLOATS} | {c for c in also if c in _FLOATS})
    if opts.dtype:
        out = DTYPE_CODES[opts.dtype]
    elif len(codes) == 1 and codes[0] in DTYPE_NAMES:
        out = codes[0]
    elif not codes:
        out = "F32"
    else:
        raise ConversionError(f"{what} mix floating dtypes {codes}", hint="choose one with --dtype float16|bfloat16|float32")
    for m in moves:
        if m.dst and m.info.dtype in _FLOATS:
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
        raise ConversionError(f"config num_hidden_layers={cfg.get('num_hidden_layers', 1)} but the weights hold {n} decoder layer(s)", where="config.json")
    return n


_POSITIVE_INTS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers", "vocab_size",
                  "draft_vocab_size", "target_hidden_size", "head_dim", "max_position_embeddings", "medusa_num_heads")
_NON_NEGATIVE_INTS = ("medusa_num_layers",)  # Medusa heads may have no residual blocks
_POSITIVE_REALS = ("rms_norm_eps", "rope_theta")
_BOOLS = ("tie_word_embeddings", "attention_bias", "mlp_bias", "bias", "norm_before_residual", "norm_before_fc", "fc_norm", "norm_output",
          "fusion_bias", "layernorms", "use_aux_hidden_state")
_STRINGS = ("model_type", "hidden_act", "torch_dtype", "dtype")
_OBJECTS = ("eagle_config", "rope_scaling", "rope_parameters", "text_config")


def check_source_types(cfg: dict[str, Any], where: str = "config.json") -> None:
    """The fields of a research config.json that the converters read have the JSON types they
    must have (null counts as absent). Checked before anything is planned, so a stranger's
    ``"hidden_size": "4096"`` or ``"rms_norm_eps": [1]`` is one clear line, not a crash
    (found by ``tests/test_fuzz.py``). Nested ``eagle_config`` is checked the same way.

    Raises:
        InputError: the first field of the wrong type or value, naming it.
    """
    import math

    from specfmt.errors import InputError

    def bad(key: str, want: str, val: Any) -> InputError:
        return InputError(f"config field {key} must be {want}, not {json_repr(val)}", where=where, hint="fix the source's config.json")

    for key, val in cfg.items():
        if val is None:
            continue
        if key in _POSITIVE_INTS and not (type(val) is int and val >= 1):
            raise bad(key, "a positive integer", val)
        if key in _NON_NEGATIVE_INTS and not (type(val) is int and val >= 0):
            raise bad(key, "a non-negative integer", val)
        if key in _POSITIVE_REALS and not (type(val) in (int, float) and math.isfinite(val) and val > 0):
            raise bad(key, "a positive number", val)
        if key in _BOOLS and type(val) is not bool:
            raise bad(key, "true or false", val)
        if key in _STRINGS and not isinstance(val, str):
            raise bad(key, "a string", val)
        if key in _OBJECTS and not isinstance(val, dict):
            raise bad(key, "an object", val)
        if key == "architectures" and not (isinstance(val, list) and all(isinstance(a, str) for a in val)):
            raise bad(key, "a list of strings", val)
        if key == "eagle_aux_hidden_state_layer_ids" and not (isinstance(val, list) and all(type(i) is int and i >= 0 for i in val)):
            raise bad(key, "a list of non-negative integers", val)
    if isinstance(cfg.get("eagle_config"), dict):
        check_source_types(cfg["eagle_config"], where=f"{where} (eagle_config)")


def json_repr(val: Any, limit: int = 40) -> str:
    text = repr(val)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_rotary_caches(src: Source, tlc: dict[str, Any]) -> None:
    """A saved ``rotary_emb.inv_freq`` is dropped only if it equals what the written
    ``rope_theta`` gives (``1 / theta**(arange(0, d, 2) / d)``), so the drop is exact.

    Raises:
        ConversionError: a saved cache disagrees with the config's rope settings.
    """
    caches = [name for name in src.reader.infos if name.endswith("rotary_emb.inv_freq")]
    if not caches:
        return  # the usual case: nothing to read, and torch stays unimported
    import torch

    d = tlc["head_dim"]
    theta = tlc["rope_theta"]
    want = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    for name in caches:
        got = src.reader.get(name).to(torch.float64)
        if tlc["rope_parameters"].get("rope_type", "default") != "default" or got.shape != want.shape or not torch.allclose(got, want, rtol=1e-3):
            raise ConversionError(
                f"{name} does not match rope_theta={theta} (head_dim {d}) from the draft config",
                hint="the draft was trained with other rope settings; fix rope_theta in the source config.json",
            )


def llama_decoder_config(cfg: dict[str, Any], H: int, nH: int, V: int, verifier: VerifierInfo, out_code: str, n_layers: int) -> dict[str, Any]:
    """A draft decoder's Llama config (``transformer_layer_config``) from the source's own fields.

    Rope comes from the draft's config, never the verifier's: the EAGLE references
    build their rotary embedding from the draft config (base 10000 when ``rope_theta``
    is absent, as in the official EAGLE-3 8B config), so the verifier's 500000 would
    be wrong. ``max_position_embeddings`` is raised to the verifier's (the official
    configs say 2048; vLLM #48894).
    """
    rope_params = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), dict) else None
    theta = cfg.get("rope_theta", (rope_params or {}).get("rope_theta", 10000.0))
    scaling = cfg.get("rope_scaling")
    if rope_params is None:
        rope_params = {"rope_type": "default"}
        if isinstance(scaling, dict):
            rope_params = {**scaling, "rope_type": scaling.get("rope_type", scaling.get("type", "default"))}
            rope_params.pop("type", None)
    rope_params = {**rope_params, "rope_theta": float(theta)}
    src_max = cfg.get("max_position_embeddings") or 2048
    model_type = cfg.get("model_type", "llama")
    tlc: dict[str, Any] = {
        "model_type": model_type,
        "architectures": ["LlamaForCausalLM"] if model_type == "llama" else ["Qwen3ForCausalLM"],
        "vocab_size": V,
        "hidden_size": H,
        "intermediate_size": positive_int(cfg, "intermediate_size"),
        "num_hidden_layers": n_layers,
        "num_attention_heads": nH,
        "num_key_value_heads": positive_int(cfg, "num_key_value_heads", nH),
        "head_dim": positive_int(cfg, "head_dim", H // nH),
        "hidden_act": cfg.get("hidden_act", "silu"),
        "rms_norm_eps": float(cfg.get("rms_norm_eps", 1e-6)),
        "max_position_embeddings": max(src_max, verifier.max_position_embeddings or 0),
        "rope_theta": float(theta),
        "rope_parameters": rope_params,
        "attention_bias": bool(cfg.get("attention_bias", False)),
        "mlp_bias": bool(cfg.get("mlp_bias", False)),
        "tie_word_embeddings": False,
        "dtype": DTYPE_NAMES[out_code],
    }
    if isinstance(scaling, dict):
        tlc["rope_scaling"] = scaling
    return tlc


class RenamedReader:
    """A view of a :class:`CheckpointReader` under other tensor names (``{new: old}``).

    Lets one converter hand a source to another converter's plan under the names that
    converter knows (e.g. speculators' ``fusion_fc.*`` as EAGLE-1's ``fc.*``).
    """

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


def restore_source_names(plan: Plan, new_to_old: dict[str, str]) -> Plan:
    """Undo a :class:`RenamedReader` in a finished plan: moves name their real source tensors
    (so they are read and recorded under those names) and derived tensors read them too."""
    for m in plan.moves:
        m.src = new_to_old.get(m.src, m.src)
        if m.dst is not None:
            m.action = "keep" if m.dst == m.src else "rename"
    for d in plan.derived:
        d.compute = (lambda inner: (lambda get: inner(lambda n: get(new_to_old.get(n, n)))))(d.compute)
    return plan
