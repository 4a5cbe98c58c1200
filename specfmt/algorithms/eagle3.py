"""EAGLE-3 (Li et al., "EAGLE-3: Scaling up Inference Acceleration of Large Language Models via
Training-Time Test", 2025): everything specfmt knows of it.

The draft fuses n_aux tapped verifier states through ``fc`` [H, n_aux·H_t], then runs decoder
layers whose first one reads ``cat(input_layernorm(embed), hidden_norm(h))`` (2H wide), and
proposes over a draft vocabulary of Vd ids mapped to the verifier's by ``d2t`` (offsets).
Sources: SafeAILab/EAGLE ``eagle/traineagle3/cnets.py``; vLLM ``llama_eagle3.py`` /
``qwen3_eagle3.py``; speculators ``models/eagle3``. The decoder layers are Llama or Qwen3
(:mod:`.layers`): ``transformer_layer_config.model_type`` picks vLLM's
``Eagle3LlamaForCausalLM`` or ``Eagle3Qwen3ForCausalLM``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Annotated, Any, Callable, ClassVar, Literal

from pydantic import Field

from ..checkpoint.dtypes import DTYPE_CODES
from ..errors import Finding, InputError
from ..format.config import DecoderSizes, DecoderConfig, LayerId, SpeculatorConfig, register_config
from ..format.draft import Draft
from ..format.model import ConfigModel, Forbidden, Nullable, PositiveInt, Schema
from ..format.tensors import TensorSpec
from . import layers
from .base import Algorithm, AlgorithmOptions, Card, LossFigures, Proposer, Reference, Training, Variant, option, register
from .reference import DecoderChain
from .sglang import SGLANG_VERSION, SGLang, SGLangLayout, refuse, sglang_tap_ids

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Mapping

    import torch

    from ..checkpoint.reader import CheckpointReader
    from ..sources.verifier import Verifier, VerifierInfo


def default_taps(num_layers: int) -> list[int]:
    """The EAGLE-3 reference tap layers ``(2, N//2, N-3)`` for a verifier with N layers.

    Source: SafeAILab/EAGLE ``eagle/model/modeling_llama_kv.py`` (``idx==2``,
    ``idx==len(self.layers)//2``, ``idx==len(self.layers)-3``); also vLLM's Llama
    ``get_eagle3_aux_hidden_state_layers``.

    Raises:
        InputError: N < 6, where the three taps would not be distinct.
    """
    taps = sorted({2, num_layers // 2, num_layers - 3})
    if num_layers < 6 or len(taps) != 3:
        raise InputError(
            f"the verifier has {num_layers} layers; the EAGLE-3 default taps (2, N//2, N-3) need N >= 6",
            hint="give the tap layers with --aux-layers",
        )
    return taps


class Eagle3LayerConfig(DecoderConfig):
    """An EAGLE-3 draft's decoder config: a layer family vLLM has an EAGLE-3 model for, and the number of
    taps ``fc`` reads."""

    model_type: Literal[tuple(layers.FAMILIES)]  # type: ignore[valid-type]  (llama, qwen3)
    num_aux_hidden_states: PositiveInt = Field(None, description="EAGLE-3: number of tap layers; vLLM sizes fc from it (default 3).")


@register_config
class Eagle3Config(DecoderSizes, SpeculatorConfig):
    """An EAGLE-3 ``config.json`` (speculators ``Eagle3SpeculatorConfig``; vLLM ``algos.update_eagle3``).

    Notation: H ``transformer_layer_config.hidden_size``, V its ``vocab_size`` (the verifier's),
    Vd ``draft_vocab_size``, H_t ``target_hidden_size`` or H, n_aux the number of taps.
    """

    name: ClassVar[str] = "eagle3"
    architecture: ClassVar[str] = "Eagle3DraftModel"
    schema_description: ClassVar[str] = (
        "EAGLE-3 (Li et al. 2025, arXiv:2503.01840; SafeAILab/EAGLE eagle/model/cnets.py). Fields read by vLLM's algos.update_eagle3.")
    forbidden: ClassVar[Forbidden | None] = Forbidden(
        ("model_type",), "vLLM routes to the speculators loader only without a top-level model_type.")

    transformer_layer_config: Eagle3LayerConfig
    draft_vocab_size: PositiveInt = Field(description="Vd: rows of lm_head.")
    norm_before_residual: bool = Field(description=(
        "false: the residual is taken before hidden_norm (EAGLE-3 reference). vLLM assumes true when the key is missing, so it is always written."))
    target_hidden_size: Nullable[PositiveInt] = Field(description="H_t, the verifier's hidden size, when it differs from the draft's H; else null.")
    eagle_aux_hidden_state_layer_ids: Annotated[list[LayerId], Schema({"uniqueItems": True})] = Field(min_length=1, description=(
        "Tap layers: id j is the residual stream entering verifier layer j (HF hidden_states[j]). Ascending, distinct."))
    norm_before_fc: bool = Field(False, description="One RMSNorm over the concatenated n_aux·H_t taps before fc (input_norm.weight; gpt-oss style).")
    fc_norm: bool = Field(False, description="One RMSNorm per tap before fc (fc_norm.{k}.weight); not together with norm_before_fc.")
    norm_output: bool = Field(False, description="EAGLE-3.1: the normed output is fed back to the next drafting step instead of the pre-norm one.")

    @property
    def taps(self) -> list[int]:
        return list(self.eagle_aux_hidden_state_layer_ids)

    @classmethod
    def build(cls, verifier: "VerifierInfo", tlc: DecoderConfig | dict[str, Any], *, speculative_tokens: int, draft_vocab_size: int,
              taps: list[int], norm_before_residual: bool = False, target_hidden_size: int | None = None, norm_before_fc: bool = False,
              fc_norm: bool = False, norm_output: bool = False, dtype: str, **more: Any) -> Eagle3Config:
        """A new config (without provenance), as converters and the trainer write it; ``more``: a
        variant's own fields, written after EAGLE-3's.

        ``transformer_layer_config.num_aux_hidden_states`` is set to the number of taps: vLLM
        sizes ``fc`` from it, else assumes 3 (``llama_eagle3.py``, vLLM 0.32).

        Raises:
            pydantic.ValidationError: a value of the wrong type (a specfmt bug).
        """
        layer = {**(tlc.dump() if isinstance(tlc, ConfigModel) else tlc), "num_aux_hidden_states": len(taps)}
        return cls(architectures=[cls.architecture], **cls.head(verifier, speculative_tokens), transformer_layer_config=layer,
                   draft_vocab_size=draft_vocab_size, norm_before_residual=norm_before_residual, target_hidden_size=target_hidden_size,
                   eagle_aux_hidden_state_layer_ids=list(taps), norm_before_fc=norm_before_fc, fc_norm=fc_norm, norm_output=norm_output,
                   **more, tie_word_embeddings=False, dtype=dtype)

    def violations(self) -> list[tuple[str, str]]:
        """Beyond the shared rules: Vd <= V; taps ascending; ``num_aux_hidden_states`` = the number of
        taps (when missing, vLLM assumes 3); not both ``fc_norm`` and ``norm_before_fc``."""
        out = super().violations()
        tlc, ids = self.transformer_layer_config, self.eagle_aux_hidden_state_layer_ids
        if self.draft_vocab_size > tlc.vocab_size:
            out.append(("$.draft_vocab_size", f"{self.draft_vocab_size} is larger than the verifier vocabulary transformer_layer_config.vocab_size={tlc.vocab_size}"))
        if list(ids) != sorted(ids):
            out.append(("$.eagle_aux_hidden_state_layer_ids", f"{ids} is not ascending; vLLM concatenates the taps in ascending layer order"))
        n_aux = tlc.num_aux_hidden_states
        if n_aux is not None and n_aux != len(ids):
            out.append(("$.transformer_layer_config.num_aux_hidden_states", f"{n_aux} differs from the {len(ids)} tap layers"))
        if n_aux is None and len(ids) != 3:
            out.append(("$.transformer_layer_config.num_aux_hidden_states", f"missing with {len(ids)} tap layers; vLLM then sizes fc for 3"))
        if self.norm_before_fc and self.fc_norm:
            out.append(("$.fc_norm", "fc_norm and norm_before_fc cannot both be true"))
        return out + self.window_violations()

    def window_violations(self) -> list[tuple[str, str]]:
        """``layer_types``, when given, names ``full_attention`` or ``sliding_attention`` for each of the
        draft's layers, and sliding layers come with ``sliding_window`` (a positive int, in tokens), for a
        config read as it is. Whether the window is kept is the config class's (a Qwen3 draft without
        ``use_sliding_window`` attends in full, in vLLM and in the reference: :func:`specfmt.algorithms.layers.kept_window`)."""
        tlc = self.transformer_layer_config
        types, n = tlc.layer_types, tlc.num_hidden_layers
        if types is None:
            return []
        if not (isinstance(types, list) and len(types) == n and all(t in ("full_attention", "sliding_attention") for t in types)):
            return [("$.transformer_layer_config.layer_types", f"must name full_attention or sliding_attention for each of the {n} layer(s)")]
        return layers.window_violations(tlc.sliding_window) if "sliding_attention" in types else []


def build_config(verifier: "VerifierInfo", tlc: DecoderConfig | dict[str, Any], *, speculative_tokens: int, draft_vocab_size: int,
                 taps: list[int], norm_before_residual: bool = False, target_hidden_size: int | None = None, norm_before_fc: bool = False,
                 fc_norm: bool = False, norm_output: bool = False, dtype: str) -> dict[str, Any]:
    """An eagle3 config.json (without provenance), as converters and the trainer write it
    (:meth:`Eagle3Config.build`, dumped)."""
    return Eagle3Config.build(verifier, tlc, speculative_tokens=speculative_tokens, draft_vocab_size=draft_vocab_size, taps=taps,
                              norm_before_residual=norm_before_residual, target_hidden_size=target_hidden_size, norm_before_fc=norm_before_fc,
                              fc_norm=fc_norm, norm_output=norm_output, dtype=dtype).dump()


def vocab_map_problems(d2t, t2d, vocab_size: int, draft_vocab_size: int) -> list[str]:
    """Consistency of an EAGLE-3 draft vocabulary map.

    ``d2t`` [Vd] int64 holds offsets (``target_id = draft_id + d2t[draft_id]``), ``t2d`` [V]
    bool marks the target ids in the draft vocabulary (SafeAILab/EAGLE
    ``traineagle3/cnets.py::scandata``). The rules:

    * ``t2d.sum() == Vd``;
    * ``arange(Vd) + d2t`` is strictly increasing, in ``[0, V)``, and equals the
      positions where ``t2d`` is true.

    Args:
        d2t, t2d: numpy arrays or CPU torch tensors.
    """
    import numpy as np

    d2t, t2d = np.asarray(d2t), np.asarray(t2d)
    problems = []
    if d2t.dtype != np.int64:
        problems.append(f"d2t has dtype {d2t.dtype}, expected int64 offsets")
    if t2d.dtype != np.bool_:
        problems.append(f"t2d has dtype {t2d.dtype}, expected bool")
    if problems:
        return problems
    if d2t.shape != (draft_vocab_size,) or t2d.shape != (vocab_size,):
        return [f"d2t {list(d2t.shape)} / t2d {list(t2d.shape)} do not match Vd={draft_vocab_size}, V={vocab_size}"]
    n = int(t2d.sum())
    if n != draft_vocab_size:
        problems.append(f"t2d marks {n} target ids, but the draft vocabulary has {draft_vocab_size}")
    with np.errstate(over="ignore"):
        target = np.arange(draft_vocab_size, dtype=np.int64) + d2t
    if draft_vocab_size > 1 and not bool((target[1:] > target[:-1]).all()):
        problems.append("arange(Vd) + d2t is not strictly increasing (are these absolute ids instead of offsets?)")
    outside = (target < 0) | (target >= vocab_size)
    if outside.any():
        problems.append(f"{int(outside.sum())} draft ids map outside the verifier vocabulary [0, {vocab_size})")
    if not problems and not np.array_equal(target, np.flatnonzero(t2d)):
        problems.append("arange(Vd) + d2t differs from the positions marked in t2d")
    return problems


def vocab_map_check(cfg: dict[str, Any], reader: "CheckpointReader") -> tuple[str, str, list[str]]:
    """``validate``'s draft-vocabulary row of a draft with EAGLE-3's ``draft_vocab_size`` and ``d2t`` / ``t2d``
    (EAGLE-3, and the DFlash family that took them over): ``(status, detail, problems)``, the map's
    consistency by :func:`vocab_map_problems` when both tensors are present."""
    V, Vd = cfg["transformer_layer_config"]["vocab_size"], cfg["draft_vocab_size"]
    if "d2t" in reader.infos and "t2d" in reader.infos:
        vp = vocab_map_problems(reader.array("d2t"), reader.array("t2d"), V, Vd)
        return ("fail" if vp else "pass"), ("; ".join(vp) if vp else f"d2t/t2d consistent: {Vd} of {V} ids"), vp
    if Vd == V:
        return "pass", "full vocabulary (Vd = V); no map needed", []
    return "skip", "d2t/t2d absent (reported under tensors)", []


def proposable_ids(cfg: dict[str, Any], tensors: dict[str, "torch.Tensor"]) -> list[int] | None:
    """The verifier ids a draft with EAGLE-3's ``d2t`` can propose (EAGLE-3, and the DFlash family that took it
    over): ``arange(Vd) + d2t`` ascending, as vLLM maps a draft id to the verifier's with ``d2t`` alone
    (``vllm/model_executor/models/llama_eagle3.py`` ``compute_logits``: ``draft_id_to_target_id``); None, every id,
    when the draft has no ``d2t`` (Vd = V)."""
    d2t = tensors.get("d2t")
    if d2t is None or cfg["draft_vocab_size"] >= cfg["transformer_layer_config"]["vocab_size"]:
        return None
    import torch

    return sorted(set((torch.arange(d2t.numel(), dtype=torch.int64) + d2t.to("cpu", torch.int64).reshape(-1)).tolist()))


def vocab_map(docs: "list[list[int]] | Mapping[int, int]", vocab_size: int, draft_vocab: int) -> tuple["torch.Tensor", "torch.Tensor", float]:
    """``d2t``/``t2d`` from token frequencies, as SafeAILab ``eagle/traineagle3/cnets.py::scandata``.

    Tokens are counted at every position but each document's first (the reference's loss
    mask zeroes it); the ``draft_vocab`` most frequent ids, sorted ascending, are the draft
    vocabulary. ``d2t[i] = used[i] - i`` (offsets), ``t2d[t] = t in used``. ``docs`` may instead be
    the counts themselves, ``{token id: count}`` (speculators' ``token_freq.pt``, counted under the
    loss mask: ``speculators/train/vocab_mapping.py``), used as they are.

    Returns:
        ``(d2t [Vd] int64, t2d [V] bool, coverage)``: coverage is the share of counted
        positions whose token is in the draft vocabulary.

    Raises:
        InputError: the data has fewer distinct tokens than ``draft_vocab``.
    """
    import collections
    import collections.abc

    import torch

    counts: collections.Counter = collections.Counter()
    if isinstance(docs, collections.abc.Mapping):
        counts.update({int(t): int(c) for t, c in docs.items()})
    else:
        for d in docs:
            counts.update(d[1:])
    top = counts.most_common(draft_vocab)
    if len(top) < draft_vocab:
        raise InputError(f"the training data has {len(top)} distinct tokens, fewer than the draft vocabulary of {draft_vocab}",
                         hint="give more data or a smaller --draft-vocab")
    used = sorted(t for t, _ in top)
    if used[-1] >= vocab_size:
        raise InputError(f"token id {used[-1]} is outside the verifier's vocabulary of {vocab_size}")
    d2t = torch.tensor([t - i for i, t in enumerate(used)], dtype=torch.int64)
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[used] = True
    return d2t, t2d, sum(c for _, c in top) / max(1, sum(counts.values()))


def draft_module(cfg: dict[str, Any], tensors: dict[str, "torch.Tensor"] | None = None, share: bool = False):
    """The EAGLE-3 draft as a ``torch.nn.Module``, with its state-dict names the specfmt tensor names.

    The forward pass of vLLM's ``llama_eagle3.py`` / ``qwen3_eagle3.py`` and SafeAILab
    ``eagle/traineagle3/cnets.py`` (layer 0 reads ``cat(input_layernorm(embed), hidden_norm(h))``,
    2H wide; residual = h, or the normed h with ``norm_before_residual``), with every variant
    the format allows: ``norm_before_fc`` (one RMSNorm over the n_aux·H_t taps,
    ``input_norm.weight``), ``fc_norm`` (one RMSNorm per tap, ``fc_norm.{i}.weight``),
    ``norm_output`` (the normed output is fed back instead of the pre-norm one), ``d2t`` (draft
    id i proposes verifier id ``i + d2t[i]``), layers >= 1 as plain pre-norm layers, and the
    Qwen3 layer family (q/k RMSNorm per head).

    Args:
        cfg: a specfmt eagle3 ``config.json`` (dict).
        tensors: the checkpoint's tensors; None leaves the module randomly initialised
            (``nn.Linear`` defaults, norms = 1). ``embed_tokens.weight`` is kept as the
            attribute ``embed_tokens`` (a tensor, not a parameter) when present.
        share: the module's parameters are ``tensors`` themselves (no copy; frozen), as
            :func:`specfmt.algorithms.layers.load_state`; the reference run's readings share one set.

    Raises:
        KeyError / RuntimeError: ``tensors`` lack a tensor the config implies or have a
            different shape (``load_state_dict(strict=True)``).
    """
    from .eagle3_nn import Eagle3Draft

    return layers.load_state(Eagle3Draft(cfg), tensors, share=share)


def eagle3_proposer(draft, embed: "torch.Tensor", dtype=None, targets: "torch.Tensor | None" = None) -> "Proposer":
    """EAGLE-3 chain drafting (vLLM ``EagleProposer`` with ``Eagle3LlamaForCausalLM``) as a :data:`~specfmt.algorithms.base.Proposer`.

    Position j of the draft reads the embedding of token j+1 and ``combine`` of the verifier's
    tap states at j (``hidden[l]`` for each tap id l: the residual stream entering layer l);
    each drafted position reads the draft's fed-back state of the position before it. The
    proposed verifier id is ``target_ids()[argmax(draft logits)]``.

    The draft keeps a KV cache of each sequence's verified positions between calls
    (:class:`~specfmt.algorithms.reference.DraftCache`) and runs several sequences in one pass
    (:class:`~specfmt.algorithms.reference.DecoderChain`, :class:`~specfmt.algorithms.layers.Rows`):
    a call runs the positions verified since the last one, then one position per further drafted
    token, as vLLM does.

    Args:
        draft: a :func:`draft_module` (eval mode).
        embed: [V, H] the embedding the draft uses: its own ``embed_tokens`` when the
            checkpoint has one, else the verifier's (vLLM shares it).
        dtype: compute dtype (default: the verifier states' dtype); the draft runs on the states' device.
        targets: [Vd] verifier id of each draft id (default ``draft.target_ids()``, the
            format's reading of ``d2t``); validation passes other readings to test them.
    """
    return _Eagle3Chain(draft, embed, dtype, draft.target_ids() if targets is None else targets)


class _Eagle3Chain(DecoderChain):
    """See :func:`eagle3_proposer`."""

    def __init__(self, draft, embed, dtype, targets):
        super().__init__(draft, embed, dtype)
        self.targets = targets

    def read(self, draft, states, start: int, end: int):
        """The tap states ``hidden[l]`` for each tap id l, concatenated: [end - start, n_aux·H_t]."""
        import torch

        return torch.cat([states.hidden[j][start:end] for j in draft.taps], dim=-1)

    def first_hidden(self, draft, features):
        return draft.combine(features)

    def step(self, draft, embeds, hidden, positions, rows):
        logits, feedback, kv = draft(embeds, hidden, positions, rows=rows)
        return [int(self.targets[int(x)]) for x in logits[0].argmax(-1)], feedback, kv


def ttt_mask(L: int, s: int, device=None) -> "torch.Tensor":
    """[L, (s+1)·L] attention mask of TTT step s: query t sees step-0 keys u <= t-s and step-j key t-s+j."""
    import torch

    t = torch.arange(L, device=device)[:, None]
    u = torch.arange(L, device=device)[None, :]
    blocks = [u <= t - s] + [u == t - s + j for j in range(1, s + 1)]
    return torch.cat(blocks, dim=1)


def eagle3_ttt_loss(draft, embed: "torch.Tensor", ids: "torch.Tensor", aux: "torch.Tensor", target_logits: "torch.Tensor", ttt_steps: int,
                    normaliser: "Callable[[torch.Tensor], torch.Tensor] | None" = None, loss_mask: "torch.Tensor | None" = None, *,
                    decay: float = 0.8):
    """Loss of one batch, unrolled over ``ttt_steps`` drafting steps.

    Step ``s`` counts the positions from ``s`` on whose verifier top-1 token is in the draft vocabulary, and
    its loss is the sum of their cross-entropies divided by their number (weight ``decay**s``).

    Args:
        draft: a :func:`draft_module` (train mode).
        embed: [V, H] the (frozen) token embedding the draft reads.
        ids: [B, T] token ids.
        aux: [B, T, n_aux·H_t] the verifier's tap states at each position.
        target_logits: [B, T, V] the verifier's logits at each position.
        ttt_steps: drafting steps to unroll (the k the draft will serve with).
        normaliser: ``counts -> divisors`` ([ttt_steps] float64, this batch's counted positions per step -> what
            each step's sum is divided by), so that several processes average to the mean over all their
            positions (:meth:`specfmt.algorithms.base.Training.loss`); None: the counts (at least 1).
        loss_mask: [B, T] bool or None (every position). A prediction whose target is the verifier's logits at
            position t counts only when ``loss_mask[t]``, at every step: speculators' alignment
            (``speculators/models/eagle3/data.py`` ``shift_batch`` keeps ``loss_mask[1:]`` beside the targets
            ``verifier_last_hidden_states[1:]``; ``models/eagle3/metrics.py`` ``align_for_step`` slices the mask
            with the targets at step s).
        decay: γ, the weight of step s is ``γ**s`` (SafeAILab ``eagle/traineagle3/cnets.py``: 0.8; speculators
            ``--ttt-step-loss-decay``, default 1.0, ``speculators/losses/utils.py`` ``exp_loss_decay``).

    Returns:
        :class:`~specfmt.algorithms.base.LossFigures` ``(loss, correct, counted)``: the weighted loss (scalar), and per
        step s the all-position figures: counted are the predictions of positions s..L-1 under the loss mask, correct
        those whose top draft token mapped to the verifier's vocabulary (``target_ids()[argmax]``) is the verifier's
        top-1 (SafeAILab/EAGLE divides by every loss-mask position, ``eagle/traineagle3/cnets.py``); its
        ``cond_correct``/``cond_counted`` count the in-vocabulary predictions only (those the loss averages over).
    """
    import torch

    L = ids.shape[1] - 1  # position t reads ids[t+1]; its target is the verifier's logits at t+1
    e = embed[ids[:, 1:]]
    hidden = draft.combine(aux[:, :-1])
    tgt = target_logits[:, 1:]
    targets = draft.target_ids()
    tgt_draft = tgt[..., targets]
    top = tgt.argmax(-1)
    in_vocab = torch.zeros(tgt.shape[-1], dtype=torch.bool, device=ids.device)
    in_vocab[targets] = True
    seen = torch.ones_like(top, dtype=torch.bool) if loss_mask is None else loss_mask[:, 1:].to(device=top.device, dtype=torch.bool)
    keep = in_vocab[top] & seen
    tp = tgt_draft.float().softmax(-1)
    tgt_top_draft = tgt_draft.argmax(-1)
    positions = torch.arange(L, device=ids.device)
    past = [[] for _ in draft.layers]
    loss = torch.zeros((), device=ids.device)
    correct, counted, cond_correct, cond_counted = [], [], [], []
    counts = torch.stack([keep[:, s:].sum() for s in range(ttt_steps)]).to(torch.float64)  # step s counts positions s..L-1
    divisors = normaliser(counts) if normaliser is not None else counts.clamp(min=1)
    for s in range(ttt_steps):
        mask = ttt_mask(L, s, ids.device)
        logits, feedback, kv = draft(e, hidden, positions, past=past, mask=mask)
        valid = keep.clone()
        valid[:, :s] = False
        ce = -(tp * logits.float().log_softmax(-1)).sum(-1)
        loss = loss + (decay ** s) * (ce * valid).sum() / divisors[s].to(ce.dtype)
        cond_correct.append(int(((logits.argmax(-1) == tgt_top_draft) & valid).sum()))
        cond_counted.append(int(valid.sum()))
        correct.append(int(((targets[logits.argmax(-1)] == top) & seen)[:, s:].sum()))
        counted.append(int(seen[:, s:].sum()))
        for i, (k, v) in enumerate(kv):
            past[i].append((k, v))
        hidden = torch.cat([torch.zeros_like(feedback[:, :1]), feedback[:, :-1]], dim=1)
    return LossFigures(loss, correct, counted, cond_correct, cond_counted)


@dataclass
class Eagle3Options(AlgorithmOptions):
    """``specfmt train eagle3``'s own options: the training-time test's unroll and a new draft's shape."""

    ttt_steps: int = option(3, "--ttt-steps", "Drafting steps unrolled in training-time test.", at_least=1)
    draft_vocab: int | None = option(None, "--draft-vocab", "New draft: draft vocabulary size Vd, the ids --vocab-from chooses (the "
                                     "verifier's most frequent top-1 predictions over --data by default) (default: the verifier's V).",
                                     new_only=True)
    taps: list[int] | None = option(None, "--aux-layers", "New draft: tap layer ids, e.g. 2,16,29 (default: 2, N//2, N-3).", new_only=True)
    layers: int = option(1, "--layers", "New draft: decoder layers.", new_only=True)
    draft_layer: str | None = option(None, "--draft-layer", "New draft: its decoder-layer family, llama (default) or qwen3 (q/k RMSNorm "
                                     "per head; speculators' default). With --init: the family the draft must have.")
    vocab_from: str | None = option(None, "--vocab-from", "Draft vocabulary (new draft, or train fill of a draft without d2t/t2d): "
                                    "verifier (its top-1 predictions over the training positions; a new draft's default) or data (token "
                                    "frequency of the text, cnets.py; the default with --init or --hidden-states).", recorded=True)
    norm_before_fc: bool | None = option(None, "--norm-before-fc/--no-input-norm", "New draft: one RMSNorm over the concatenated "
                                         "taps before fc (EAGLE-3.1; default on unless --fc-norm, as speculators 0.9 trains).",
                                         new_only=True, recorded=True)
    fc_norm: bool = option(False, "--fc-norm", "New draft: one RMSNorm per tap before fc (EAGLE-3.1 paper) instead of --norm-before-fc.",
                           new_only=True, recorded=True)
    norm_output: bool | None = option(None, "--norm-output/--no-norm-output", "New draft: feed the normed output back to the next "
                                      "drafting step (EAGLE-3.1; default on, as speculators 0.9 trains).", new_only=True, recorded=True)
    lm_head: str = option("trained", "--lm-head", "trained (from the verifier's rows; default) or frozen at the verifier's rows "
                          "(speculators' default).", recorded=True)
    ttt_decay: float = option(0.8, "--ttt-decay", "Weight of drafting step s in the loss: gamma**s (SafeAILab 0.8, default; "
                              "speculators 1.0).", recorded=True)


#: the coverage of the verifier's top-1 over the training positions below which a new draft vocabulary is warned
#: about: measured on examples/world (docs/commands/train.md, "Draft vocabulary"; benchmarks/vocab_coverage.py)
COVERAGE_WARN = 0.95


#: the misreadings of an EAGLE-3 checkpoint (:meth:`Eagle3.readings`) and what each says
CAUSES = {
    "tap ids": "eagle_aux_hidden_state_layer_ids name other verifier layers than the draft was trained on",
    "norm order": "norm_before_residual / norm_output do not match the forward pass the draft was trained with",
    "vocab mapping": "d2t is read the wrong way (offsets vs absolute ids, or the sign)",
    "q/k norms": "the Qwen3 draft layers' q/k norms are not applied (read as Llama layers: transformer_layer_config.model_type)",
}


#: the decoder fields SGLang's ``LlamaForCausalLMEagle3`` reads from its flat Llama config (the draft's
#: ``transformer_layer_config`` less speculators' own ``num_aux_hidden_states``; the tap count goes in ``eagle_config``)
_SGLANG_DROPPED_FIELDS = ("num_aux_hidden_states", "architectures")


class Eagle3SGLang(SGLang):
    """EAGLE-3 in SGLang 0.5.23: ``LlamaForCausalLMEagle3`` (``python/sglang/srt/models/llama_eagle3.py``).

    What its code does, and so what the export writes or refuses:

    * ``load_weights`` renames ``midlayer`` to ``layers.0``, fuses q/k/v and gate/up, turns ``d2t`` into
      ``hot_token_id = d2t + arange(Vd)``, skips ``t2d`` and **skips every name it does not know, silently**;
      the single decoder layer is written ``midlayer.*`` (SpecForge's names), ``t2d`` not at all (``convert``
      rebuilds it from ``d2t``).
    * Its first layer takes the residual before ``hidden_norm``: ``norm_before_residual: false`` only.
    * A layer after the first norms its input with ``hidden_norm`` (fused residual add), vLLM with
      ``input_layernorm``: one decoder layer only.
    * Its layers are Llama layers (no q/k norms), ``qkv_proj`` without bias.
    * The EAGLE worker replaces the draft's ``embed_tokens`` with the verifier's unless ``target_hidden_size``
      differs from ``hidden_size`` (``LlamaForCausalLM.set_embed`` in ``srt/models/llama.py``): a draft's own
      embedding survives only when it is the verifier's.
    * ``norm_before_fc`` (``input_norm``), ``fc_norm`` and ``norm_output`` (top level: the normed output fed back,
      EAGLE-3.1's meaning) are read as vLLM reads them.
    """

    sglang_algorithm = "EAGLE3"
    sglang_architecture = "LlamaForCausalLMEagle3"
    sglang_source = "python/sglang/srt/models/llama_eagle3.py"

    def sglang_layout(self, cfg: dict[str, Any], shapes: dict[str, tuple[int, ...]], verifier: "VerifierInfo",
                      tensor: Callable[[str], Any], embedding: Callable[[], Any]) -> SGLangLayout:
        c = Eagle3Config.of(cfg)
        tlc = c.transformer_layer_config
        self._sglang_refusals(c)
        ids, convention = sglang_tap_ids(c.taps, verifier)
        kept_embed = self._sglang_embedding(c, shapes, tensor, embedding)
        flat = {k: v for k, v in tlc.dump().items() if k not in _SGLANG_DROPPED_FIELDS}
        config = {"architectures": [self.sglang_architecture], **flat, "draft_vocab_size": c.draft_vocab_size,
                  "eagle_config": {"eagle_aux_hidden_state_layer_ids": ids}, "tie_word_embeddings": False}
        if c.target_hidden_size is not None:  # SGLang reads hasattr(config, "target_hidden_size"): null would size fc from None
            config["target_hidden_size"] = c.target_hidden_size
        config.update({k: True for k in ("norm_before_fc", "fc_norm", "norm_output") if getattr(c, k)})
        names = {n: (f"midlayer.{n[len('layers.0.'):]}" if n.startswith("layers.0.") else n) for n in shapes if n != "t2d"}
        dropped = {"t2d": "SGLang maps draft ids with d2t alone and skips t2d (llama_eagle3.py load_weights); "
                          "convert --from auto rebuilds it from d2t exactly"} if "t2d" in shapes else {}
        notes = [f"tap ids written {ids} ({convention.replace('-', ' ')}s): SGLang's {verifier.architectures[0]} captures vLLM's taps {c.taps}"]
        if kept_embed:
            notes.append(kept_embed)
        return SGLangLayout(config, names, dropped, {"tap_ids": convention, "norm_output": "eagle-3.1"}, notes)

    def _sglang_refusals(self, c: "Eagle3Config") -> None:
        """The EAGLE-3 drafts SGLang's class does not run as vLLM does, each with its reason key."""
        tlc = c.transformer_layer_config
        if c.norm_before_residual:
            raise refuse("norm_before_residual", "norm_before_residual is true, but SGLang's LlamaForCausalLMEagle3 takes the residual "
                         "before hidden_norm (norm_before_residual false) and has no other order", hint="serve this draft with vLLM")
        if layers.family_of(tlc.dump()).model_type != "llama":
            raise refuse("draft_layer", f"{tlc.model_type} draft layers: SGLang {SGLANG_VERSION} has only Llama EAGLE-3 draft layers "
                         "(LlamaForCausalLMEagle3), which would drop the q/k norms", hint="serve this draft with vLLM")
        if tlc.num_hidden_layers != 1:
            raise refuse("layers", f"{tlc.num_hidden_layers} decoder layers: SGLang's LlamaForCausalLMEagle3 norms the input of a layer after "
                         "the first with hidden_norm, vLLM with input_layernorm", hint="serve this draft with vLLM")
        if tlc.attention_bias or tlc.mlp_bias:
            raise refuse("bias", "attention_bias/mlp_bias: SGLang's LlamaForCausalLMEagle3 builds qkv_proj and the MLP without biases")
        if tlc.layer_types and "sliding_attention" in tlc.layer_types:
            raise refuse("sliding_window", "sliding-window draft layers: SGLang sets a draft window only from --speculative-draft-window-size, "
                         "for every layer", hint="serve this draft with vLLM")

    def _sglang_embedding(self, c: "Eagle3Config", shapes: dict[str, tuple[int, ...]], tensor: Callable[[str], Any],
                          embedding: Callable[[], Any]) -> str | None:
        """A draft's own ``embed_tokens`` with H = H_t survives in SGLang only if it equals the verifier's (``set_embed``).

        Raises:
            ExportRefusal: ``reason="own_embedding"``, it differs from the verifier's.
        """
        if "embed_tokens.weight" not in shapes or (c.target_hidden_size or c.hidden_size) != c.hidden_size:
            return None
        import torch

        own, theirs = tensor("embed_tokens.weight"), embedding()
        if own.shape != theirs.shape or not torch.equal(own.to(theirs.dtype), theirs) or not torch.equal(own, theirs.to(own.dtype)):
            raise refuse("own_embedding", "the draft has its own embed_tokens.weight, which differs from the verifier's, and SGLang's EAGLE "
                         "worker replaces a draft's embedding with the verifier's when target_hidden_size equals hidden_size "
                         "(LlamaForCausalLM.set_embed, srt/models/llama.py)", hint="serve this draft with vLLM, which keeps its own embedding")
        return "embed_tokens.weight equals the verifier's embedding: written, and SGLang's set_embed replaces it with the same values"

    def sglang_flags(self, cfg: dict[str, Any], k: int) -> list[str]:
        """Chain drafting of k tokens: k steps, top-1, k + 1 draft tokens (SGLang's EAGLE tree of one branch)."""
        return ["--speculative-num-steps", str(k), "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", str(k + 1)]


@register
class Eagle3(Algorithm, Reference, Training, Card, Eagle3SGLang):
    config = Eagle3Config
    name = Eagle3Config.name
    title = "EAGLE-3"
    vllm_method = "eagle3"
    train_summary = "Train an EAGLE-3 draft (training-time test over --ttt-steps) against the frozen verifier."
    train_options = Eagle3Options
    #: ``specfmt train eagle3``'s ``--lr``, ``--optimizer`` and ``--schedule``: the specfmt setting with the best three-seed mean
    #: acceptance length at 1,500 steps (the README's budget) on the larger held-out set in
    #: ``benchmarks/trainer_vs_speculators.results.json`` (``defaults_from_results``; ``tests/test_trainer_bench.py`` holds these
    #: to it, issue 38): Muon at 3e-2 with speculators' linear schedule, 2.631, against the cosine schedule, 2.548, and AdamW
    #: at 1e-2, 2.453 (719 prompts)
    train_defaults = {"lr": 3e-2, "optimizer": "muon", "schedule": "linear"}
    interop_note = "speculators 0.9 loads this draft too (`SpeculatorModel.from_pretrained`), with every tensor as in the file, to train it further."
    map_tensors = ("d2t", "t2d")
    vllm_aliases = {"draft_id_to_target_id": "d2t"}
    vllm_not_held = {"t2d": "vLLM maps draft ids to the verifier's with d2t alone; its EAGLE-3 loader skips t2d "
                            "(llama_eagle3.py load_weights), which only training uses"}
    vllm_only = {"layers.[1-9]*.hidden_norm.weight": "vLLM 0.30-0.33 give every draft layer a hidden_norm and read only the first "
                                                   "layer's (llama_eagle3.py LlamaDecoderLayer.forward, layer_idx == 0); the later ones "
                                                   "keep their initial value, and the file has none (issue 38)"}
    fillable = frozenset({"d2t", "t2d"})
    causes = CAUSES
    #: vLLM guesses the first three when absent, so a finding on one of them names its cause
    key_causes = {"norm_before_residual": "norm order", "norm_output": "norm order", "eagle_aux_hidden_state_layer_ids": "tap ids",
                  "draft_vocab_size": "vocab mapping"}
    check_causes = {"vocab_map": "vocab mapping"}

    # -- format ------------------------------------------------------------------------------

    def expected_tensors(self, cfg: dict[str, Any]) -> dict[str, TensorSpec]:
        """EAGLE-3 (tensor table: ``docs/design/research-formats.md`` §4.3; vLLM ``llama_eagle3.py``):

        ============================== ====================== =====================================
        name                           shape                  when
        ============================== ====================== =====================================
        ``fc.weight``                  [H, n_aux·H_t]         always
        ``layers.0.self_attn.q_proj``  [nH·d, 2H]             k/v: [nKV·d, 2H]; o_proj [H, nH·d]
        ``layers.0.hidden_norm``       [H]                    plus input/post-attention norms, MLP
        ``layers.{i≥1}.*``             standard layer         ``num_hidden_layers`` > 1
        ``layers.{i}.self_attn.q_norm`` [d]                   Qwen3 layers (and ``k_norm``)
        ``norm.weight``                [H]                    always
        ``lm_head.weight``             [Vd, H]                always
        ``d2t`` / ``t2d``              [Vd] int64 / [V] bool  when Vd < V (never when Vd = V)
        ``embed_tokens.weight``        [V, H]                 required when H_t ≠ H, else optional
        ``input_norm.weight``          [n_aux·H_t]            ``norm_before_fc``
        ``fc_norm.{k}.weight``         [H_t]                  ``fc_norm``
        ============================== ====================== =====================================
        """
        c = Eagle3Config.of(cfg)
        tlc = c.transformer_layer_config
        H, V, Vd, Ht, n_aux = c.hidden_size, c.vocab_size, c.draft_vocab_size, c.verifier_hidden_size, len(c.taps)
        specs: dict[str, TensorSpec] = {"fc.weight": TensorSpec((H, n_aux * Ht))}
        for i in range(tlc.num_hidden_layers):
            specs.update(layers.layer_specs(f"layers.{i}", tlc, 2 * H if i == 0 else H, hidden_norm=i == 0))
        specs["norm.weight"] = TensorSpec((H,))
        specs["lm_head.weight"] = TensorSpec((Vd, H))
        if Vd < V:  # a full-vocabulary draft has no map: vLLM rejects d2t when Vd = V
            why_vocab = "Vd < V: without d2t vLLM reads draft id i as target id i and acceptance collapses"
            specs["d2t"] = TensorSpec((Vd,), "int64", why=why_vocab)
            specs["t2d"] = TensorSpec((V,), "bool", why=why_vocab)
        specs["embed_tokens.weight"] = TensorSpec(
            (V, H), required=Ht != H, why="H_t != H: the verifier's embedding has the wrong width for the draft"
        )
        if c.norm_before_fc:
            specs["input_norm.weight"] = TensorSpec((n_aux * Ht,))
        if c.fc_norm:
            for k in range(n_aux):
                specs[f"fc_norm.{k}.weight"] = TensorSpec((Ht,))
        return specs

    def new_config(self, verifier: "Verifier", shape: Eagle3Options) -> dict[str, Any]:
        info = verifier.info
        N, V = info.num_hidden_layers, info.vocab_size
        tlc = layers.decoder_config(layers.verifier_decoder_fields(verifier.text_config, shape.draft_layer), info.hidden_size,
                                    verifier.text_config["num_attention_heads"], V, info, DTYPE_CODES[shape.dtype], shape.layers)
        taps = list(shape.taps) if shape.taps else default_taps(N)
        if sorted(set(taps)) != taps or taps[0] < 0 or taps[-1] >= N:
            raise InputError(f"tap layer ids {taps} must be distinct, ascending and in [0, {N - 1}]")
        Vd = shape.draft_vocab or V
        if not 0 < Vd <= V:
            raise InputError(f"--draft-vocab {Vd} must be between 1 and the verifier's vocabulary ({V})")
        return build_config(info, tlc, speculative_tokens=self.default_speculative_tokens(shape), draft_vocab_size=Vd, taps=taps,
                            norm_before_fc=bool(shape.norm_before_fc), fc_norm=shape.fc_norm, norm_output=bool(shape.norm_output), dtype=shape.dtype)

    def verifier_hidden_size(self, cfg: dict[str, Any]) -> int:
        return Eagle3Config.of(cfg).verifier_hidden_size

    # -- static validation ---------------------------------------------------------------------

    def vocab_map_check(self, cfg: dict[str, Any], reader: "CheckpointReader") -> tuple[str, str, list[str]]:
        return vocab_map_check(cfg, reader)

    def proposable_ids(self, cfg: dict[str, Any], tensors: dict[str, "torch.Tensor"]) -> list[int] | None:
        """``arange(Vd) + d2t`` (:func:`proposable_ids`)."""
        return proposable_ids(cfg, tensors)

    def verifier_problems(self, cfg: dict[str, Any], verifier: "VerifierInfo") -> list["str | Finding"]:
        out_of_range = [t for t in cfg["eagle_aux_hidden_state_layer_ids"] if t >= verifier.num_hidden_layers]
        return [Finding.at("$.eagle_aux_hidden_state_layer_ids", f"tap layers {out_of_range} are not below the verifier's {verifier.num_hidden_layers} layers",
                           kind="rule")] if out_of_range else []

    def tensor_problems(self, cfg: dict[str, Any], small: dict[str, Any]) -> list[str]:
        if "d2t" not in small and "t2d" not in small:
            return []
        return vocab_map_problems(small.get("d2t"), small.get("t2d"), cfg["transformer_layer_config"]["vocab_size"], cfg["draft_vocab_size"])

    # -- reference run ---------------------------------------------------------------------------

    def module_class(self) -> type:
        from .eagle3_nn import Eagle3Draft

        return Eagle3Draft

    def module(self, cfg: dict[str, Any], tensors: dict[str, "torch.Tensor"] | None = None, share: bool = False):
        """The draft as :func:`draft_module` builds it, of :meth:`module_class` (a variant's own draft class)."""
        return layers.load_state(self.module_class()(cfg), tensors, share=share)

    def readings(self, cfg: dict[str, Any], n_verifier_layers: int) -> list[Variant]:
        """As written, then: tap ids (the reference default ``(2, N//2, N-3)``, and the written ids
        shifted by ±1: the off-by-one between "the state entering layer j" and "the output of
        layer j"); norm order (``norm_before_residual`` flipped, ``norm_output`` flipped); vocab
        mapping (``d2t`` read as absolute ids, or with the opposite sign); and, for Qwen3 draft
        layers only, q/k norms dropped (the layers read as Llama layers, which have none: what a
        loader that ignores ``transformer_layer_config.model_type`` serves; issue #18)."""
        out = [Variant(None, "as written", cfg)]
        taps = list(cfg["eagle_aux_hidden_state_layer_ids"])
        N = n_verifier_layers
        seen = {tuple(taps)}
        for label, alt in ((f"EAGLE-3 default taps {[2, N // 2, N - 3]}", [2, N // 2, N - 3]),
                           ("taps + 1", [t + 1 for t in taps]), ("taps - 1", [t - 1 for t in taps])):
            if len(alt) == len(taps) and tuple(alt) not in seen and all(0 <= t < N for t in alt):
                seen.add(tuple(alt))
                out.append(Variant("tap ids", f"{label}: {alt}", {**cfg, "eagle_aux_hidden_state_layer_ids": alt}))
        nbr = bool(cfg.get("norm_before_residual"))
        out.append(Variant("norm order", f"norm_before_residual {str(not nbr).lower()}", {**cfg, "norm_before_residual": not nbr}))
        no = bool(cfg.get("norm_output"))
        out.append(Variant("norm order", f"norm_output {str(not no).lower()}", {**cfg, "norm_output": not no}))
        if cfg["draft_vocab_size"] != cfg["transformer_layer_config"]["vocab_size"]:
            out.append(Variant("vocab mapping", "d2t as absolute ids", cfg, {"targets": "absolute"}))
            out.append(Variant("vocab mapping", "d2t with the opposite sign", cfg, {"targets": "negated"}))
        if layers.family_of(cfg["transformer_layer_config"]).qk_norm:
            out.append(Variant("q/k norms", "q/k norms dropped (Llama layers)", cfg, {"qk_norm": False}))
        return out

    def proposer(self, reading: Variant, tensors: dict[str, "torch.Tensor"], embed: "torch.Tensor", lm_head: "torch.Tensor") -> Proposer:
        import torch

        draft = self.module(reading.cfg, tensors, share=True).eval()  # every reading shares the checkpoint's tensors
        if reading.extra.get("qk_norm") is False:
            layers.drop_qk_norms(draft.layers)
        own = draft.embed_tokens if draft.embed_tokens is not None else embed
        targets = None
        how = reading.extra.get("targets", "offsets")
        if how != "offsets" and hasattr(draft, "d2t"):
            base = torch.arange(draft.d2t.numel())
            targets = draft.d2t.clone() if how == "absolute" else base - draft.d2t
            targets = targets.clamp(0, reading.cfg["transformer_layer_config"]["vocab_size"] - 1)
        return eagle3_proposer(draft, own, targets=targets)

    # -- training --------------------------------------------------------------------------------

    def feature_taps(self, cfg: dict[str, Any]) -> list[int]:
        return list(cfg["eagle_aux_hidden_state_layer_ids"])

    def train_positions(self, module: Any, options: Eagle3Options) -> int:
        return options.ttt_steps

    def loss(self, module: Any, *, embed: Any, head: Any, ids: Any, aux: Any, last: Any, options: Eagle3Options, generator: Any,
             subset: list[int] | None, normaliser: Any = None, loss_mask: Any = None):
        import torch

        with torch.no_grad():
            logits = head(last)
        return eagle3_ttt_loss(module, embed, ids, aux, logits, options.ttt_steps, normaliser, loss_mask, decay=options.ttt_decay)

    def check_options(self, options: Eagle3Options, *, init: bool) -> None:
        """The shared checks, and ``--draft-layer`` names a family (:func:`specfmt.algorithms.layers.family`)."""
        super().check_options(options, init=init)
        if options.draft_layer is not None:
            layers.family(options.draft_layer)
        if options.vocab_from not in (None, "verifier", "data"):
            raise InputError(f"--vocab-from must be verifier or data, not {options.vocab_from!r}")
        if options.lm_head not in ("trained", "frozen"):
            raise InputError(f"--lm-head must be trained or frozen, not {options.lm_head!r}")
        if not 0 < options.ttt_decay <= 1:
            raise InputError(f"--ttt-decay must be in (0, 1], not {options.ttt_decay}", hint="0.8 is SafeAILab's, 1.0 speculators'")
        if options.norm_before_fc and options.fc_norm:
            raise InputError("--norm-before-fc and --fc-norm are exclusive: one RMSNorm over the concatenated taps, or one per tap",
                             hint="give one of them (a new draft's default is --norm-before-fc, speculators' too)")

    def heads_trained(self, module: Any, cfg: dict[str, Any], prior: dict[str, Any] | None, options: Eagle3Options) -> None:
        """``--lm-head frozen``: ``lm_head.weight`` keeps its values (``requires_grad`` False, so
        :func:`specfmt.training.loop.fit` leaves it out of the optimizer), as speculators freezes it
        (``speculators/model.py`` ``DraftVocabMixin``: ``self.lm_head.weight.requires_grad = False``)."""
        if options.lm_head == "frozen":
            module.lm_head.weight.requires_grad_(False)
        return None

    def new_shape(self, options: Eagle3Options) -> Eagle3Options:
        return replace(options, draft_layer=options.draft_layer or "llama")

    def settle_options(self, options: Eagle3Options, *, counts_only: bool, init: bool) -> Eagle3Options:
        """``--vocab-from`` settled: ``verifier`` for a new draft, ``data`` when the data holds token counts only
        (hidden-states data, whose tokens are usually the verifier's own regenerated responses) or for the map of an
        ``--init`` draft (a trained draft's map is rebuilt as its trainer built it, cnets.py scandata).

        Raises:
            InputError: ``--vocab-from verifier`` with such data.
        """
        if options.vocab_from == "verifier" and counts_only:
            raise InputError("--vocab-from verifier needs the token ids of --data; --hidden-states data gives token counts only",
                             hint="drop --vocab-from (hidden-states data uses its token_freq.pt) or train from --data")
        vocab_from = options.vocab_from or ("data" if counts_only or init else "verifier")
        if init:
            return replace(options, vocab_from=vocab_from)
        # a new draft: EAGLE-3.1's norms unless turned off (they win benchmarks/trainer_vs_speculators.py at 150 and 1500 steps)
        nbf = (not options.fc_norm) if options.norm_before_fc is None else options.norm_before_fc
        return replace(options, vocab_from=vocab_from, norm_before_fc=nbf, norm_output=True if options.norm_output is None else options.norm_output)

    def vocab_from_verifier(self, options: Eagle3Options) -> bool:
        return options.vocab_from == "verifier"

    def check_draft(self, draft: "Draft", options: Eagle3Options, init: str) -> None:
        """``--draft-layer`` with ``--init`` is a check, not a conversion: the layers are the draft's own.

        Raises:
            InputError: the draft's layers are of another family.
        """
        if options.draft_layer is None:
            return
        has = layers.family_of(draft.config["transformer_layer_config"]).model_type
        if has != layers.family(options.draft_layer).model_type:
            raise InputError(f"--init {init} has {has} decoder layers, not {options.draft_layer}",
                             hint="drop --draft-layer: an --init draft keeps its own layers")

    def new_draft(self, cfg: dict[str, Any], verifier: "Verifier", docs: list[list[int]] | None):
        module = self.module(cfg)
        draft = Draft(cfg, {n: t.detach().clone() for n, t in module.state_dict().items()})
        filled: dict[str, str] = {}
        V, Vd = cfg["transformer_layer_config"]["vocab_size"], cfg["draft_vocab_size"]
        if Vd < V:
            if docs is None:
                raise InputError(f"a draft vocabulary of {Vd} < {V} is built from the training data", hint="pass --data")
            draft.tensors.pop("d2t"), draft.tensors.pop("t2d")
            filled.update(self.fill_vocab_map(draft, docs))
        filled.update(self.fill_head(draft, verifier))
        return draft.tensors, filled

    def fill_vocab(self, draft: "Draft", *, wanted: bool | None, docs: list[list[int]] | None) -> dict[str, str]:
        cfg = draft.config
        needs = cfg["draft_vocab_size"] < cfg["transformer_layer_config"]["vocab_size"] and "d2t" not in draft.tensors
        if not (wanted or (wanted is None and needs)):
            return {}
        if docs is None:
            raise InputError("the draft has no d2t/t2d (draft vocabulary map); they are built from token frequencies over a corpus",
                             hint="pass --data FILE")
        return self.fill_vocab_map(draft, docs)

    def fill_vocab_map(self, draft: "Draft", docs: list[list[int]]) -> dict[str, str]:
        """``d2t``/``t2d`` of an EAGLE-3 draft with Vd < V that lacks them (:func:`vocab_map`).

        Raises:
            InputError: the draft's vocabulary is the verifier's, it already has a map, or the data is too small.
        """
        cfg = draft.config
        V, Vd = cfg["transformer_layer_config"]["vocab_size"], cfg["draft_vocab_size"]
        if Vd == V:
            raise InputError("the draft's vocabulary is the verifier's (Vd = V): it needs no d2t/t2d")
        if "d2t" in draft.tensors:
            raise InputError("the draft already has d2t/t2d", hint="drop --vocab-map to keep them")
        what = getattr(docs, "what", None)  # the verifier's top-1 counts (specfmt.training.data.VerifierTop1)
        d2t, t2d, coverage = vocab_map(docs if what is None else docs.at_least(Vd), V, Vd)
        draft.tensors["d2t"], draft.tensors["t2d"] = d2t, t2d
        if what is None:
            how = f"top {Vd} token ids by frequency over the training data, covering {coverage:.1%} of its positions (cnets.py scandata)"
        else:
            unseen = Vd - sum(1 for t in t2d.nonzero().flatten().tolist() if t in docs)
            how = (f"top {Vd} token ids by frequency of {what}, covering {coverage:.1%} of them (verifier top-1 coverage)"
                   + (f"; {unseen} ids it never predicts filled by text frequency" if unseen else ""))
            if coverage < COVERAGE_WARN:
                docs.notes.append(f"warning: the draft vocabulary covers {coverage:.1%} of the verifier's top-1 over the training positions, "
                                  f"below {COVERAGE_WARN:.0%}: expect lower acceptance (docs/commands/train.md); raise --draft-vocab")
        return {"d2t": how, "t2d": how}

    def fill_embed(self, draft: "Draft", verifier: "Verifier") -> dict[str, str]:
        """Copy the verifier's embedding into ``embed_tokens.weight`` (H = H_t only: the draft was
        trained with it, frozen).

        Raises:
            InputError: the draft is narrower than the verifier (its embedding must be trained,
                not copied), or already has one.
        """
        cfg = draft.config
        H = cfg["transformer_layer_config"]["hidden_size"]
        if "embed_tokens.weight" in draft.tensors:
            raise InputError("the draft already has embed_tokens.weight")
        if (cfg.get("target_hidden_size") or H) != H:
            raise InputError(f"the draft is {H} wide and the verifier {cfg['target_hidden_size']}: the verifier's embedding cannot be copied",
                             hint="such a draft's embedding is trained with it")
        return copy_embedding(draft, verifier)

    def fill_head(self, draft: "Draft", verifier: "Verifier") -> dict[str, str]:
        """Initialise a new draft's ``lm_head`` [Vd, H] from the verifier's head rows ``t2d``.

        Raises:
            InputError: the draft is narrower than the verifier (the rows do not fit).
        """
        H = draft.config["transformer_layer_config"]["hidden_size"]
        head = verifier.lm_head()
        if head.shape[1] != H:
            raise InputError(f"the verifier's lm_head is {head.shape[1]} wide, the draft {H}: it cannot start from it")
        rows = draft.tensors["t2d"].nonzero().squeeze(1) if "t2d" in draft.tensors else slice(None)
        draft.tensors["lm_head.weight"] = head[rows].clone()
        return {"lm_head.weight": "the verifier's lm_head rows of the draft vocabulary (t2d), as a starting point"}

    # -- publishing ------------------------------------------------------------------------------

    def card_rows(self, cfg: dict[str, Any]) -> list[tuple[str, str]]:
        vd, v = cfg["draft_vocab_size"], cfg["transformer_layer_config"]["vocab_size"]
        return [("draft vocabulary", f"{vd:,} of the verifier's {v:,} ids" + (" (`d2t`/`t2d` map)" if vd != v else "")),
                ("tap layers (`eagle_aux_hidden_state_layer_ids`)", ", ".join(map(str, cfg["eagle_aux_hidden_state_layer_ids"]))),
                ("`norm_before_residual`", str(cfg["norm_before_residual"]).lower())] + super().card_rows(cfg)


def copy_embedding(draft: "Draft", verifier: "Verifier") -> dict[str, str]:
    """``embed_tokens.weight`` = the verifier's input embedding, read alone from its weights.

    Raises:
        InputError: the verifier's embedding is not [V, H] of the draft.
    """
    cfg = draft.config
    V, H = cfg["transformer_layer_config"]["vocab_size"], cfg["transformer_layer_config"]["hidden_size"]
    embed = verifier.embedding()
    if tuple(embed.shape) != (V, H):
        raise InputError(f"the verifier's embedding is {list(embed.shape)}, the draft needs [{V}, {H}]")
    draft.tensors["embed_tokens.weight"] = embed
    return {"embed_tokens.weight": "the verifier's input embedding, copied"}
