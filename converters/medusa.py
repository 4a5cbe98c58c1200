"""``--from medusa``: Medusa heads (FasterDecoding/Medusa) -> specfmt (speculators ``medusa``).

A Medusa head i (of K) is L residual blocks ``x + SiLU(W_ij x + b_ij)`` over the
verifier's last hidden state (after its final norm), then a Linear [V, H] that
predicts the token i+2 positions ahead.

The layouts it accepts, and the variations it converts or refuses, are stated once, in
:attr:`MedusaConverter.layouts` and :attr:`MedusaConverter.cases`; the docs render them
(``docs/layouts.md``). The formats behind them: ``docs/design/research-formats.md`` §5.

Output (:meth:`specfmt.algorithms.medusa.Medusa.expected_tensors`): ``blocks.{i}.layers.{j}.weight`` [H, H] (and ``.bias``
[H] with ``medusa_fc_bias``), ``lm_heads.{i}.weight`` [V, H] or one ``lm_head.weight`` [V, H].
The config carries vLLM's native Medusa fields at the top level (vLLM 0.32's speculators
loader has no medusa algorithm) and no other key holding "num" with "heads"/"layers":
vLLM's ``MedusaConfig.from_pretrained`` renames such keys onto ``num_heads`` /
``num_hidden_layers``.

Sources: FasterDecoding/Medusa ``medusa/model/medusa_model.py`` (``ResBlock``,
``MedusaModel``; tag ``v0.1``), ``medusa/model/medusa_model_legacy.py``,
``medusa/train/train_legacy.py``; vLLM ``vllm/model_executor/models/medusa.py`` (``Medusa``,
``ResidualBlock``: the bias exists only with ``medusa_fc_bias``, default false, so a
missing flag silently drops trained biases) and ``vllm/transformers_utils/configs/medusa.py``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from specfmt.algorithms.medusa import MedusaConfig, build_config
from specfmt.checkpoint.dtypes import DTYPE_NAMES, SOURCE_FLOATS
from specfmt.errors import ConversionError, InputError
from specfmt.format.model import field_kinds

from .base import (DECODER_FIELDS, KEEP, NON_NEGATIVE_INT, POSITIVE_INT, STRING, Case, Converter, Derived, Example, Layout, Options, Plan, Refusal, Rule, Seen, Source,
                   decide_float_dtype, refuse, register, short)

#: optional prefix: the ModuleList attribute name when the whole model was saved
_PREFIX = r"(?:medusa_head\.)?"
#: a residual block's Linear: head i, block j, weight or bias
_BLOCK = re.compile(_PREFIX + r"(\d+)\.(\d+)\.linear\.(weight|bias)")
#: the per-head Linear [V, H]: head i, at Sequential index L (after the L blocks)
_HEAD_LINEAR = re.compile(_PREFIX + r"(\d+)\.(\d+)\.weight")

#: the same tensors in vLLM's names (``Medusa.blocks`` / ``Medusa.lm_heads``)
_VLLM_BLOCK = re.compile(r"blocks\.(\d+)\.layers\.(\d+)\.(weight|bias)")
_VLLM_HEAD = re.compile(r"lm_heads\.(\d+)\.weight")

_BASE_REASON = "the base model of a Medusa-2 full checkpoint; vLLM serves the verifier (--verifier) itself"


def _count(cfg: dict[str, Any], key: str, minimum: int) -> int | None:
    """An optional integer config field (None when absent)."""
    val = cfg.get(key)
    if val is None:
        return None
    if not isinstance(val, int) or isinstance(val, bool) or val < minimum:
        raise ConversionError(f"source config field {key} must be an integer >= {minimum}, got {val!r}", where="config.json")
    return val


def _medusa(seen: Seen) -> bool:
    """Medusa head tensors: residual blocks ``{i}.{j}.linear.weight`` or per-head Linears ``{i}.{j}.weight``."""
    return seen.has(_BLOCK.pattern) or seen.has(_HEAD_LINEAR.pattern)


#: per-layout field readings: the config keys that give the head and block counts, first present wins
#: (vLLM's ``MedusaConfig`` names them ``num_heads`` / ``num_hidden_layers``; the research keys are read too)
_COUNT_FIELDS: dict[str, dict[str, tuple[str, ...]]] = {
    "vllm": {"heads": ("medusa_num_heads", "num_heads"), "layers": ("medusa_num_layers", "num_hidden_layers")},
    "": {"heads": ("medusa_num_heads",), "layers": ("medusa_num_layers",)},
}

#: refusals that are conditions on the config (checked on :func:`_read_counts`'s readings, in order)
_CONFIG_REFUSALS = (
    Refusal(lambda c: c["version"] is not None and str(c["version"]) not in ("1", "2"),
            lambda c: f"unknown Medusa config version {c['version']!r} (known: none/1, 2)"),
    Refusal(lambda c: c["v2"] and c["layers"] == 0,
            "the config says version 2 with medusa_num_layers 0: such heads have no parameters at all, so every head "
            "is the verifier's lm_head and proposes the next token, not the token i+2 ahead",
            hint="there is nothing to convert; these heads were not trained"),
    Refusal(lambda c: c["truncated"] is not None and c["vocab"] is not None and c["truncated"] < c["vocab"],
            lambda c: f"truncated_vocab_size {c['truncated']} < vocab_size {c['vocab']}: the heads propose over a truncated vocabulary "
                      "through a token_map, which vLLM's speculators loader has no field for",
            hint="specfmt converts Medusa heads over the full vocabulary"),
)


def _first(cfg: dict[str, Any], keys: tuple[str, ...], minimum: int) -> int | None:
    """The first of ``keys`` present in the config, as :func:`_count` reads it."""
    return next((val for key in keys if (val := _count(cfg, key, minimum)) is not None), None)


def _read_counts(cfg: dict[str, Any], layout: str) -> dict[str, Any]:
    """The config's counts as the layout reads them (:data:`_COUNT_FIELDS`), checked by :data:`_CONFIG_REFUSALS`.

    Raises:
        ConversionError: a row of :data:`_CONFIG_REFUSALS` holds.
    """
    fields = _COUNT_FIELDS.get(layout, _COUNT_FIELDS[""])
    vllm = layout == "vllm"
    counts = {"version": cfg.get("version"), "v2": str(cfg.get("version")) == "2", "heads": _first(cfg, fields["heads"], 1),
              "layers": _first(cfg, fields["layers"], 0), "truncated": _count(cfg, "truncated_vocab_size", 1) if vllm else None,
              "vocab": _count(cfg, "vocab_size", 1) if vllm else None}
    refuse(_CONFIG_REFUSALS, counts)
    return counts


@dataclass
class _Heads:
    """The head structure the tensors hold: residual blocks ``(i, j) -> {"weight", "bias"}`` and
    each head's per-head Linear at Sequential index ``linears[i]``; K heads, L blocks each."""

    blocks: dict[tuple[int, int], set[str]]
    linears: dict[int, int]
    prefix: str
    K: int = 0
    L: int = 0

    @property
    def has_bias(self) -> bool:
        return any("bias" in parts for parts in self.blocks.values())

    @classmethod
    def scan(cls, plan: Plan, src: Source) -> "_Heads":
        """Read the structure from the written moves.

        Raises:
            ConversionError: no head tensors, or heads not numbered 0..K-1.
        """
        heads = cls({}, {}, "")
        for m in plan.moves:
            if m.dst is None:
                continue
            if b := _BLOCK.fullmatch(m.src) or _VLLM_BLOCK.fullmatch(m.src):
                heads.blocks.setdefault((int(b[1]), int(b[2])), set()).add(b[3])
            elif h := _HEAD_LINEAR.fullmatch(m.src):
                heads.linears[int(h[1])] = int(h[2])
            elif h := _VLLM_HEAD.fullmatch(m.src):
                heads.linears[int(h[1])] = -1  # after the head's blocks, whatever their number (set below)
            heads.prefix = "medusa_head." if m.src.startswith("medusa_head.") else heads.prefix
        for i in [i for i, j in heads.linears.items() if j == -1]:
            heads.linears[i] = 1 + max((j for h, j in heads.blocks if h == i), default=-1)
        heads._number(src, plan)
        return heads

    def _number(self, src: Source, plan: Plan) -> None:
        """K from the head numbering, which must be 0..K-1."""
        heads = sorted({i for i, _ in self.blocks} | set(self.linears))
        if not heads:
            raise ConversionError(
                "no Medusa head tensors ({i}.{j}.linear.weight, {i}.{L}.weight, optionally prefixed medusa_head.) in the source",
                where=str(src.folder),
                hint="is this a Medusa checkpoint? tensors found: " + (short(sorted([m.src for m in plan.moves] + plan.unknown)) or "none"),
            )
        self.K = heads[-1] + 1
        if heads != list(range(self.K)):
            gaps = sorted(set(range(self.K)) - set(heads))
            raise ConversionError(
                f"the Medusa heads are numbered {heads}: head(s) {gaps} are missing (heads must be 0..K-1, head i proposes token i+2)",
                hint="the checkpoint is incomplete; download it again",
            )

    def _linear_names(self, n: int) -> str:
        return short([f"{self.prefix}{i}.{j}.weight" for i, j in sorted(self.linears.items())], n)

    def check_structure(self, v2: bool) -> None:
        """L, and the per-head Linears as the version says: none for version 2, one per head at index L otherwise.

        Raises:
            ConversionError: version 2 with per-head Linears, version 1 without them, Linears at
                different depths, or blocks at or after the Linear.
        """
        if v2:
            if self.linears:
                raise ConversionError(
                    f"the config says version 2 (heads without their own lm_head), but the weights hold per-head Linears ({self._linear_names(3)})",
                    where="config.json",
                    hint="remove \"version\": \"2\" from config.json if these are version-1 heads",
                )
            self.L = max(j for _, j in self.blocks) + 1
            return
        if not self.linears:
            raise ConversionError(
                "the heads have residual blocks but no per-head Linear {i}.{L}.weight, and the config does not say "
                "\"version\": \"2\" (heads that use the base lm_head)",
                where="config.json",
                hint="add \"version\": \"2\" to config.json if the heads were trained with the Medusa-2 trainer",
            )
        depths = sorted(set(self.linears.values()))
        if len(depths) > 1:
            raise ConversionError(
                f"the per-head Linears sit at different depths {depths} ({self._linear_names(8)}); "
                "every head has the same number of residual blocks L, then its Linear at index L"
            )
        self.L = depths[0]
        deep = sorted(f"{self.prefix}{i}.{j}.linear.weight" for i, j in self.blocks if j >= self.L)
        if deep:
            raise ConversionError(f"residual blocks at or after the per-head Linear (index {self.L}): {short(deep)}")

    def check_complete(self, plan: Plan, v2: bool, cfg: dict[str, Any]) -> None:
        """Every head has every block's weight (and bias, when any has one) and, version 1, its Linear;
        vLLM-named blocks without biases get a note.

        Raises:
            ConversionError: a tensor the other heads have is missing.
        """
        has_bias, vllm_names = self.has_bias, plan.layout == "vllm"
        if vllm_names and self.L and not has_bias:
            plan.notes.append("the residual blocks hold no biases: medusa_fc_bias false, as vLLM ran them. Old vLLM conversions dropped the biases "
                              "FasterDecoding's ResBlock trains; biases absent from the file cannot be recovered (convert the original heads to keep them)")
        if vllm_names and "medusa_fc_bias" in cfg and cfg["medusa_fc_bias"] != has_bias:
            plan.notes.append(f"config medusa_fc_bias={cfg['medusa_fc_bias']} but the blocks {'hold' if has_bias else 'hold no'} biases; the tensors decide")
        missing = []
        for i in range(self.K):
            for j in range(self.L):
                parts = self.blocks.get((i, j), set())
                missing += [f"{self.prefix}{i}.{j}.linear.{p}" for p in ("weight", "bias") if p not in parts and (p == "weight" or has_bias)]
            if not v2 and i not in self.linears:
                missing.append(f"{self.prefix}{i}.{self.L}.weight")
        if missing:
            raise ConversionError(
                f"the source lacks tensors that its other heads have (K={self.K} heads, L={self.L} blocks{', with biases' if has_bias else ''}): {short(missing)}",
                hint="the checkpoint is incomplete; download it again",
            )


def _check_counts(counts: dict[str, Any], K: int, L: int, notes: list[str]) -> None:
    """The config's counts against the weights: an understated ``medusa_num_heads`` gets a note
    (the released v0.1 configs), an overstated one or another ``medusa_num_layers`` is refused.

    Raises:
        ConversionError: the config counts more heads, or other blocks, than the weights hold.
    """
    cfg_heads, cfg_layers = counts["heads"], counts["layers"]
    if cfg_heads is None:
        notes.append(f"medusa_num_heads not in the source config; the weights hold {K} heads")
    elif cfg_heads < K:
        notes.append(
            f"config.json says medusa_num_heads={cfg_heads} but the weights hold {K} heads; all {K} converted "
            "(the released v0.1 configs understate the heads; FasterDecoding's loader hard-codes 5)"
        )
    elif cfg_heads > K:
        raise ConversionError(f"config.json says medusa_num_heads={cfg_heads} but the weights hold only {K} head(s)", where="config.json", hint="the checkpoint is incomplete; download it again")
    if cfg_layers is not None and cfg_layers != L:
        raise ConversionError(f"config.json says medusa_num_layers={cfg_layers} but the weights hold {L} residual block(s) per head", where="config.json")


def _speculative_tokens(opts: Options, K: int, plan: Plan) -> int:
    """k, the heads written: ``--speculative-tokens`` (default K); vLLM builds one head per speculative token.

    Raises:
        ConversionError: k above K or below 1.
    """
    k = opts.speculative_tokens if opts.speculative_tokens is not None else K
    if k > K:
        raise ConversionError(f"--speculative-tokens {k} asks for more heads than the {K} the source holds", hint=f"use --speculative-tokens {K} or less (Medusa head i proposes token i+2)")
    if k < 1:
        raise ConversionError(f"--speculative-tokens must be at least 1, got {k}")
    if k < K:
        for m in plan.moves:
            if m.dst and int(m.dst.split(".")[1]) >= k:
                m.drop(f"head beyond --speculative-tokens {k} (vLLM builds one head per speculative token)")
        plan.notes.append(f"--speculative-tokens {k}: kept heads 0..{k - 1} of {K}")
    return k


def _decide_dtype(plan: Plan, opts: Options, vhead: Any, verifier: Any) -> str:
    """The output float dtype over the written tensors and, for version 2, the verifier's head,
    which is then added as the derived ``lm_head.weight`` (Medusa v2's head copy)."""
    if vhead is None:
        return decide_float_dtype(plan.moves, opts)
    reader, vname, vinfo = vhead
    out_code = decide_float_dtype(plan.moves, opts, also=(vinfo.dtype,), what="the heads and the verifier's lm_head")
    plan.derived = [Derived(dst="lm_head.weight", shape=tuple(vinfo.shape), out_dtype=out_code,
                            how=f"the verifier's {vname} ({verifier.name_or_path}): version 2 heads use the base model's head",
                            compute=lambda get, reader=reader, vname=vname: reader.get(vname))]
    return out_code


@register
class MedusaConverter(Converter):
    name = "medusa"
    summary = "Medusa heads: v0.1 (medusa_lm_head.pt), legacy trainer (medusa_lm_head.safetensors), version 2 (no per-head lm_head), Medusa-2 full models (medusa_head.*)"
    detects_as = "medusa"
    rules = (
        Rule(_VLLM_BLOCK.pattern, KEEP),
        Rule(_VLLM_HEAD.pattern, KEEP),
        Rule(_BLOCK.pattern, r"blocks.\1.layers.\2.\3"),
        Rule(_HEAD_LINEAR.pattern, r"lm_heads.\1.weight"),  # the Sequential index is checked to be L in decide()
        Rule(r"model\..+", None, _BASE_REASON),
        Rule(r"lm_head\.weight", None, "the base model's next-token head (Medusa-2 full checkpoint); the verifier (--verifier) applies its own"),
    )
    #: the decoder's fields, vLLM's Medusa fields as :class:`~specfmt.algorithms.medusa.MedusaConfig` types them (``num_hidden_layers``
    #: is L, the residual blocks per head: 0 is valid), and the research names of K and L
    fields = {**DECODER_FIELDS, **field_kinds(MedusaConfig, "num_heads", "num_hidden_layers", "truncated_vocab_size", "medusa_fc_bias"),
              "medusa_num_heads": POSITIVE_INT, "medusa_num_layers": NON_NEGATIVE_INT, "base_model_name_or_path": STRING}
    layouts = (
        Layout("vllm", lambda s: s.has(_VLLM_BLOCK.pattern) or s.has(_VLLM_HEAD.pattern),
               "vLLM Medusa names blocks.{i}.layers.{j}.weight / lm_heads.{i}.weight (converted for vLLM's MedusaModel)",
               details="written by vLLM's own conversion for `MedusaModel`: `blocks.{i}.layers.{j}.weight` [H, H], `lm_heads.{i}.weight` "
                       "[V, H], config `num_heads` / `num_hidden_layers` / `truncated_vocab_size`; old conversions dropped the blocks' biases",
               outcome="converted; `medusa_fc_bias` set from the tensors present, with a note that biases absent from the file cannot be "
                       "recovered. A `truncated_vocab_size` below the vocabulary (a `token_map`) is refused",
               examples=(Example("abhigoyal/vllm-medusa-vicuna-7b-v1.3", "https://huggingface.co/abhigoyal/vllm-medusa-vicuna-7b-v1.3",
                                 "no biases; config text from the project's reference notes only"),)),
        Layout("medusa-1.0", lambda s: _medusa(s) and any(n.startswith("model.") or n == "lm_head.weight" for n in s.names),
               "Medusa-2 full model: medusa_head.* next to the base model's model.* (only the heads are converted)",
               details="`FasterDecoding/medusa-1.0-*`: a whole causal LM (`model.*`, `lm_head.weight`, sharded `pytorch_model-*.bin` with "
                       "an index) plus `medusa_head.{i}.{j}.linear.*` and `medusa_head.{i}.{L}.weight`",
               outcome="converted: only the heads are extracted; the base model is what `--verifier` serves"),
        Layout("v2", lambda s: _medusa(s) and str(s.config.get("version")) == "2", "config version 2: heads without their own lm_head",
               details="`medusa/train/train_legacy.py` from commit 2b8020f (\"Creating medusa2\"): only `{i}.{j}.linear.*`, no per-head "
                       "Linear; the logits are `base.lm_head(head_i(h))`",
               outcome="converted: the verifier's `lm_head.weight` (its embedding when tied) is copied once into `lm_head.weight` with "
                       "`original_lm_head: true` (vLLM PR #10454); for a Hub id only the index and the one shard holding it are downloaded"),
        Layout("v0.1", lambda s: _medusa(s) and s.format == "pickle", "medusa_lm_head.pt with {i}.{j}.linear.* blocks / {i}.{L}.weight heads (FasterDecoding v0.1)",
               details="`torch.save(medusa_head.state_dict())`, read as plain tensors only; `config.json` holds only "
                       "`base_model_name_or_path`, `medusa_num_heads` and `medusa_num_layers`, no sizes",
               outcome="converted; K heads, L blocks, H and V are read from the tensors and checked against the verifier. The released "
                       "configs understate the heads (2 in the config, 5 in the weights): the weights win, with a note",
               examples=(Example("FasterDecoding/medusa-vicuna-7b-v1.3", "https://huggingface.co/FasterDecoding/medusa-vicuna-7b-v1.3",
                                 "config says 2 heads, the file holds 5"),)),
        Layout("legacy-trainer", _medusa, "medusa_lm_head.safetensors with {i}.{j}.linear.* blocks / {i}.{L}.weight heads (train_legacy.py)",
               details="`medusa/train/train_legacy.py` before commit 2b8020f (and the `refs/pr/1` safetensors of the 7B repo): the keys of v0.1"),
    )
    cases = (
        Case("a `medusa_head.` prefix (the whole model's state dict)", "accepted in every research layout"),
        Case("no residual blocks (`medusa_num_layers: 0`, only `{i}.0.weight`)", "recognised by inspect and `--from auto`; converted",
             (Example("Narsil/mistral-medusa", note="no config text found"),)),
        Case("L > 1 blocks per head (the reference's `[ResBlock(H)] * L` shares one block, but its state dict lists every index)",
             "accepted"),
    )
    fallback_layout = "legacy-trainer"
    pickle_names = ("medusa_lm_head.pt",)

    def describe(self, seen: Seen) -> tuple[list[str], dict[str, Any]]:
        heads = {int(m.group(1)) for n in seen.names if (m := re.match(r"(?:medusa_head\.)?(\d+)\.", n))}
        return [], {"heads": len(heads), "version": seen.config.get("version", "1")}

    def decide(self, src: Source, opts: Options, plan: Plan) -> None:
        """The output config (:func:`specfmt.algorithms.medusa.build_config`).

        K, L, H and V come from the tensors (the configs of released heads hold no sizes
        and understate K); H and V are checked against the verifier.

        Raises:
            ConversionError: the config or tensors do not describe Medusa heads that vLLM
                runs exactly as the source computes them: head numbering with gaps, a head
                or block missing a tensor the others have, per-head Linears at different
                depths, a ``version`` 2 config with per-head Linears (or a version-1 config
                without them), ``medusa_num_heads`` larger than the heads present,
                ``medusa_num_layers`` differing from the weights, H or V differing from the
                verifier, ``--speculative-tokens`` above K, mixed float dtypes without
                ``--dtype``, or version-2 heads with no blocks at all.
        """
        counts = _read_counts(src.config, plan.layout)
        heads = _Heads.scan(plan, src)
        heads.check_structure(counts["v2"])
        heads.check_complete(plan, counts["v2"], src.config)
        _check_counts(counts, heads.K, heads.L, plan.notes)
        k = _speculative_tokens(opts, heads.K, plan)
        H, V, vhead = self._widths(src, plan, counts["v2"])
        if plan.layout == "medusa-1.0":
            plan.notes.append(
                "Medusa-2 full model: only the heads were extracted; Medusa-2 trains the base model with the heads, "
                "so --verifier should be this checkpoint's own base weights (model.*, lm_head.weight)"
            )
        out_code = _decide_dtype(plan, opts, vhead, src.verifier.info)
        plan.config = build_config(src.verifier.info, hidden_size=H, vocab_size=V, heads=k, layers_per_head=heads.L, fc_bias=heads.has_bias,
                                   original_lm_head=counts["v2"], dtype=DTYPE_NAMES[out_code])

    def _widths(self, src: Source, plan: Plan, v2: bool) -> tuple[int, int, Any]:
        """H from the written tensors, V from the per-head Linears (version 2: the verifier's head,
        opened and returned as ``vhead``), both checked against the verifier and the config."""
        verifier, cfg = src.verifier.info, src.config
        written = [m for m in plan.moves if m.dst]
        H = next(m.info.shape[-1] for m in written if m.dst.endswith(".weight"))
        if H != verifier.hidden_size:
            raise ConversionError(
                f"the Medusa heads take hidden states of width {H} but the verifier's hidden_size is {verifier.hidden_size}",
                hint="is --verifier the model these heads were trained for?",
            )
        vhead = self._verifier_lm_head(src, H) if v2 else None
        V = vhead[2].shape[0] if vhead is not None else next(m.info.shape[0] for m in written if m.dst.startswith("lm_heads."))
        if V != verifier.vocab_size:
            raise ConversionError(
                f"the Medusa heads propose over {V} tokens but the verifier's vocab_size is {verifier.vocab_size}",
                hint="is --verifier the model these heads were trained for?",
            )
        for key, val in (("hidden_size", H), ("vocab_size", V)):
            if key in cfg and cfg[key] != val:
                raise ConversionError(f"config.json says {key}={cfg[key]!r} but the tensors give {val}", where="config.json")
        if "hidden_size" not in cfg:
            plan.notes.append(f"hidden_size and vocab_size not in the source config; read from the tensors (H={H}, V={V}) and checked against the verifier")
        return H, V, vhead

    @staticmethod
    def _verifier_lm_head(src: Source, H: int):
        """Open the verifier's head for version-2 heads: ``(reader, name, info)``, info of shape [V, H].

        Raises:
            ConversionError: the verifier's weights cannot be read, hold no head, or the
                head is not [vocab_size, H].
        """
        verifier = src.verifier.info
        names = ["lm_head.weight"] + (["model.embed_tokens.weight"] if verifier.tie_word_embeddings else [])
        try:
            vreader, vname = src.verifier.open_tensor(names)
        except InputError as e:
            raise ConversionError(
                f"version 2 Medusa heads use the verifier's lm_head, which cannot be read: {e.message}",
                where=e.where,
                hint="--verifier must name the full verifier (folder or Hub id with its weights, not only config.json)",
            ) from None
        vinfo = vreader.infos[vname]
        if tuple(vinfo.shape) != (verifier.vocab_size, H):
            raise ConversionError(
                f"the verifier's {vname} has shape {list(vinfo.shape)}, expected [vocab_size, H] = [{verifier.vocab_size}, {H}]",
                where=str(vreader.folder),
                hint="is --verifier the model these heads were trained for?",
            )
        if vinfo.dtype not in SOURCE_FLOATS:
            raise ConversionError(f"the verifier's {vname} has dtype {vinfo.dtype}; a quantized head cannot be copied exactly", where=str(vreader.folder))
        return vreader, vname, vinfo


__all__ = ["MedusaConverter"]
