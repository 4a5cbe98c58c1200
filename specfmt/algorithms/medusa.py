"""Medusa (Cai et al., "Medusa: Simple LLM Inference Acceleration Framework with Multiple
Decoding Heads", 2024): everything specfmt knows of it.

K heads; head i maps the verifier's last hidden state h (after its final norm) through L
residual blocks ``x + SiLU(W x + b)`` and its own head [V, H] (or the verifier's, shared, with
``original_lm_head``) to the token i+2 places after the one h predicts. Sources:
FasterDecoding/Medusa ``medusa/model/medusa_model.py`` (``ResBlock``, ``MedusaModel``),
``medusa/train/train_legacy.py``; vLLM ``vllm/model_executor/models/medusa.py`` and
``vllm/transformers_utils/configs/medusa.py``. vLLM 0.32's speculators reader has no ``medusa``
algorithm, so the config carries vLLM's native Medusa config at the top level; and any other key
holding "num" with "heads"/"layers" would be renamed onto ``num_heads`` /
``num_hidden_layers`` by vLLM's ``MedusaConfig.from_pretrained``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from packaging.specifiers import SpecifierSet
from pydantic import Field

from ..errors import InputError
from ..format.config import SpeculatorConfig, register_config
from ..format.model import ConfigModel, NonNegativeInt, PositiveInt, Unchecked
from ..format.tensors import TensorSpec
from . import layers
from .base import Algorithm, AlgorithmOptions, Card, Proposer, Reference, Training, Variant, option, register

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from ..format.draft import Draft
    from ..sources.verifier import Verifier, VerifierInfo


class MedusaHeads(ConfigModel):
    """The Medusa head structure: vLLM's native ``MedusaConfig`` fields (``configs/medusa.py``)."""

    schema_name: ClassVar[str] = "medusa_heads"
    schema_description: ClassVar[str] = "The Medusa head structure, repeated from the top level (vLLM requires a transformer_layer_config key)."

    model_type: Literal["medusa"]
    hidden_size: PositiveInt = Field(description="H, the verifier's hidden size (vLLM's default 4096 is wrong for most verifiers).")
    vocab_size: PositiveInt = Field(description="V, the verifier's vocabulary.")
    num_heads: PositiveInt = Field(description="K heads; head i proposes the token i+2 positions ahead.")
    num_hidden_layers: NonNegativeInt = Field(description="residual blocks per head (L).")
    medusa_fc_bias: Unchecked[bool] = None
    original_lm_head: Unchecked[bool] = None


@register_config
class MedusaConfig(SpeculatorConfig, MedusaHeads):
    """A medusa ``config.json``: vLLM's native Medusa config at the top level, which is what vLLM 0.32
    reads (``num_heads`` = k, one head per speculative token), the speculators block beside it, and
    ``transformer_layer_config`` repeating the head structure."""

    name: ClassVar[str] = "medusa"
    architecture: ClassVar[str] = "MedusaModel"
    pin_architecture: ClassVar[bool] = True
    native: ClassVar[bool] = True
    schema_description: ClassVar[str] = (
        "Medusa heads (Cai et al. 2024, arXiv:2401.10774; FasterDecoding/Medusa medusa/model/medusa_model.py). Served by vLLM's Medusa model "
        "(vllm/model_executor/models/medusa.py) with method medusa: head i is num_hidden_layers residual blocks x + SiLU(W x + b) and an "
        "lm_head [V, H]; vLLM builds speculative_tokens heads.")

    transformer_layer_config: MedusaHeads
    medusa_fc_bias: bool = Field(description="the residual blocks' Linear has a bias (vLLM default false drops it silently).")
    original_lm_head: bool = Field(description="true: one lm_head.weight shared by all heads (Medusa-2 'version 2' heads).")
    truncated_vocab_size: PositiveInt = Field(description="equal to vocab_size: specfmt writes no token_map.")

    @classmethod
    def build(cls, verifier: "VerifierInfo", *, hidden_size: int, vocab_size: int, heads: int, layers_per_head: int, fc_bias: bool,
              original_lm_head: bool, dtype: str, speculative_tokens: int | None = None) -> MedusaConfig:
        """A new config (without provenance): the head structure at the top level, ``truncated_vocab_size``
        (= V: no token_map), the speculators block (k = ``speculative_tokens``, else one per head), the
        head structure again as ``transformer_layer_config``, and ``medusa_fc_bias`` set whenever the
        blocks have biases (vLLM's default false drops them).

        Raises:
            pydantic.ValidationError: a value of the wrong type (a specfmt bug).
        """
        heads_cfg = MedusaHeads(model_type="medusa", hidden_size=hidden_size, vocab_size=vocab_size, num_heads=heads,
                                num_hidden_layers=layers_per_head, medusa_fc_bias=fc_bias, original_lm_head=original_lm_head)
        return cls(architectures=[cls.architecture], **heads_cfg.dump(), truncated_vocab_size=vocab_size,
                   **cls.head(verifier, heads if speculative_tokens is None else speculative_tokens), transformer_layer_config=heads_cfg,
                   tie_word_embeddings=False, dtype=dtype)

    def violations(self) -> list[tuple[str, str]]:
        """Beyond the shared rules: k = K (vLLM builds one head per speculative token), no truncated
        vocabulary, and no other key vLLM's ``MedusaConfig.from_pretrained`` would rename onto
        ``num_heads`` / ``num_hidden_layers`` (any key holding "num" and "heads"/"layers", vLLM 0.32)."""
        out = super().violations()
        k = self.speculative_tokens
        if k != self.num_heads:
            out.append(("$.speculators_config.proposal_methods[0].speculative_tokens", f"{k} differs from num_heads={self.num_heads}; vLLM builds one head per speculative token"))
        if self.truncated_vocab_size != self.vocab_size:
            out.append(("$.truncated_vocab_size", f"{self.truncated_vocab_size} differs from vocab_size={self.vocab_size}; specfmt writes no token_map"))
        for key in self.keys():
            if "num" in key and ("heads" in key or "layers" in key) and key not in ("num_heads", "num_hidden_layers"):
                out.append((f"$.{key}", "vLLM's MedusaConfig renames this key onto num_heads/num_hidden_layers; remove it"))
        return out


def build_config(verifier: "VerifierInfo", *, hidden_size: int, vocab_size: int, heads: int, layers_per_head: int, fc_bias: bool,
                 original_lm_head: bool, dtype: str) -> dict[str, Any]:
    """A medusa config.json (without provenance): :meth:`MedusaConfig.build`, dumped."""
    return MedusaConfig.build(verifier, hidden_size=hidden_size, vocab_size=vocab_size, heads=heads, layers_per_head=layers_per_head,
                              fc_bias=fc_bias, original_lm_head=original_lm_head, dtype=dtype).dump()


def heads_module(tensors: dict[str, "torch.Tensor"], cfg: dict[str, Any], *, share: bool = False):
    """The heads (:class:`~specfmt.algorithms.medusa_nn.MedusaHeads`) holding ``tensors``, sized from them:
    H and V from the output heads, K from ``cfg["num_heads"]`` (else the heads the tensors hold), biases
    when the blocks have them.

    Args:
        tensors: specfmt Medusa tensors (``blocks.{i}.layers.{j}.*``, ``lm_heads.{i}.weight`` or ``lm_head.weight``).
        cfg: ``num_hidden_layers`` (L) and ``original_lm_head``; ``num_heads`` when the tensors cannot say.
        share: the module's parameters are ``tensors`` themselves (:func:`specfmt.algorithms.layers.load_state`).

    Raises:
        KeyError / RuntimeError: the tensors do not fit (``load_state_dict(strict=True)``).
    """
    from .medusa_nn import MedusaHeads

    head = tensors["lm_head.weight"] if cfg["original_lm_head"] else tensors["lm_heads.0.weight"]
    ids = {int(n.split(".")[1]) for n in tensors if n.startswith(("blocks.", "lm_heads."))}
    sizes = {"hidden_size": head.shape[1], "vocab_size": head.shape[0], "num_heads": cfg.get("num_heads") or len(ids),
             "num_hidden_layers": cfg["num_hidden_layers"], "medusa_fc_bias": any(n.endswith(".bias") for n in tensors),
             "original_lm_head": cfg["original_lm_head"]}
    return layers.load_state(MedusaHeads(sizes), tensors, share=share)


def medusa_proposer(tensors: dict[str, "torch.Tensor"], cfg: dict[str, Any]) -> "Proposer":
    """Medusa heads (``medusa_model.py``; vLLM ``Medusa``) as a :data:`~specfmt.algorithms.base.Proposer`.

    Head i reads the verifier's last hidden state (after its final norm) at the position
    that produced the newest token x, applies its L blocks ``x + SiLU(W x + b)`` and its
    head (``lm_heads.{i}``, or the shared ``lm_head`` with ``original_lm_head``), and
    proposes the token i+1 places after x: :meth:`~specfmt.algorithms.medusa_nn.MedusaHeads.head`,
    run where the verifier's states are, in their dtype.

    Args:
        tensors / cfg: the heads, as for :func:`heads_module` (the module shares the tensors).
    """
    heads = heads_module(tensors, cfg, share=True).eval()

    def propose(tokens: list[int], states, k: int) -> list[int]:
        import torch

        h0 = states.hidden[-1][-1]
        run = heads.to(h0.device, h0.dtype)
        with torch.no_grad():
            return [int(run.head(i, h0).argmax()) for i in range(k)]

    return propose


def draft_module(cfg: dict[str, Any], tensors: dict[str, "torch.Tensor"] | None = None):
    """K Medusa heads (``medusa_model.py`` ``ResBlock``; vLLM ``medusa.py``) as a trainable module.

    Head i maps the verifier's last hidden state h [..., H] through L blocks
    ``x + SiLU(W x + b)`` and its head [V, H] (``lm_heads.{i}``, or the shared ``lm_head``
    with ``original_lm_head``) to the logits of the token i+2 places after the one h predicts.

    Args:
        cfg: a specfmt medusa ``config.json``.
        tensors: ``blocks.{i}.layers.{j}.*`` and the heads, or None for a random initialisation.

    Raises:
        KeyError / RuntimeError: ``tensors`` do not fit the config.
    """
    from .medusa_nn import MedusaHeads

    return layers.load_state(MedusaHeads(cfg), tensors)


def medusa_loss(heads, last: "torch.Tensor", logits: "torch.Tensor", train: list[int], loss_mask: "torch.Tensor | None" = None):
    """Medusa loss of one batch: head i at position t against the verifier's distribution at t+i+1, weight ``0.8**i``.

    Args:
        heads: a :func:`draft_module` (train mode).
        last: [B, T, H] the verifier's last hidden state.
        logits: [B, T, V] the verifier's logits (``lm_head(last)``).
        train: the heads to train; the others are run without gradients, for the figures.
        loss_mask: [B, T] bool or None (every position): head i's prediction from position t, whose target is
            the verifier's distribution at t+i+1, counts only when ``loss_mask[t+i+1]`` (the mask goes with the
            target, as speculators aligns it: ``speculators/models/eagle3/metrics.py`` ``align_for_step``); each
            head's loss is the mean over its counted predictions.

    Returns:
        ``(loss, correct per head, counted per head)``.
    """
    import contextlib

    import torch

    K = len(heads.blocks)
    loss = torch.zeros((), device=last.device)
    correct, counted = [0] * K, [0] * K
    for i in range(K):
        n = last.shape[1] - (i + 1)
        if n <= 0:
            continue
        p = logits[:, i + 1:].float().softmax(-1)
        with contextlib.nullcontext() if i in train else torch.no_grad():
            out = heads.head(i, last[:, :n]).float()
        ce = -(p * out.log_softmax(-1)).sum(-1)
        hit = out.argmax(-1) == p.argmax(-1)
        if loss_mask is None or bool(loss_mask[:, i + 1:].all()):  # every target counts: the unmasked mean, bit for bit
            if i in train:
                loss = loss + (0.8 ** i) * ce.mean()
            correct[i] = int(hit.sum())
            counted[i] = p.shape[0] * p.shape[1]
            continue
        m = loss_mask[:, i + 1:].to(device=ce.device, dtype=torch.bool)
        if i in train:
            loss = loss + (0.8 ** i) * (ce * m).sum() / m.sum().clamp(min=1)
        correct[i] = int((hit & m).sum())
        counted[i] = int(m.sum())
    return loss, correct, counted


def add_heads(draft: "Draft", verifier: "Verifier", heads: int | None = None) -> dict[str, str]:
    """Give every Medusa head its own ``lm_heads.{i}.weight`` and add heads up to ``heads``.

    Shared-head drafts (``original_lm_head``) get per-head copies of the shared head;
    new heads get zero blocks (biases zero) and a copy of the verifier's ``lm_head``.

    Raises:
        InputError: ``heads`` fewer than the draft has.
    """
    import torch

    cfg = draft.config
    K, L, H = cfg["num_heads"], cfg["num_hidden_layers"], cfg["hidden_size"]
    heads = heads or K
    if heads < K:
        raise InputError(f"--heads {heads}: the draft already has {K} heads", hint="heads are only added, never removed")
    how: dict[str, str] = {}
    if cfg["original_lm_head"]:
        shared = draft.tensors.pop("lm_head.weight")
        for i in range(K):
            draft.tensors[f"lm_heads.{i}.weight"] = shared.clone()
            how[f"lm_heads.{i}.weight"] = "the shared lm_head.weight, copied (original_lm_head -> per-head heads)"
    base = None
    for i in range(K, heads):
        if base is None:
            base = verifier.lm_head()
        dtype = next(t.dtype for n, t in draft.tensors.items() if n.startswith("blocks."))
        for j in range(L):
            draft.tensors[f"blocks.{i}.layers.{j}.weight"] = torch.zeros(H, H, dtype=dtype)
            how[f"blocks.{i}.layers.{j}.weight"] = "new head: zeros (Medusa ResBlock init)"
            if cfg["medusa_fc_bias"]:
                draft.tensors[f"blocks.{i}.layers.{j}.bias"] = torch.zeros(H, dtype=dtype)
                how[f"blocks.{i}.layers.{j}.bias"] = "new head: zeros"
        draft.tensors[f"lm_heads.{i}.weight"] = base.clone()
        how[f"lm_heads.{i}.weight"] = "new head: the verifier's lm_head, copied"
    for block in (cfg, cfg["transformer_layer_config"]):
        block["num_heads"] = heads
        block["original_lm_head"] = False
    return how


@dataclass
class MedusaOptions(AlgorithmOptions):
    """``specfmt train medusa``'s own options: how many heads, how deep a new set is, which heads train."""

    heads: int | None = option(None, "--heads", "Heads K of a new set (default 3), or the total after adding heads to --init.", at_least=1)
    head_layers: int = option(1, "--head-layers", "New set: residual blocks per head.", new_only=True, at_least=1)
    train_all: bool = option(False, "--train-all", "With --init and --heads: train the existing heads too (default: only the new ones).")


@register
class Medusa(Algorithm, Reference, Training, Card):
    config = MedusaConfig
    name = MedusaConfig.name
    title = "Medusa"
    vllm_method = "medusa"
    sglang_unserved = ("SGLang 0.5.23 has no Medusa: no Medusa class in srt/models/ and no MEDUSA in SpeculativeAlgorithm "
                       "(srt/speculative/spec_info.py)")
    parallel_drafting = True  # every head reads the same verifier state: one pass
    train_summary = "Train Medusa heads against the frozen verifier (self-distillation); add heads to an --init set with --heads."
    train_options = MedusaOptions
    interop_note = "speculators 0.9 cannot load this draft: it has no Medusa class."
    #: vLLM 0.33.0 deleted Medusa: the method, ``models/medusa.py``, ``configs/medusa.py`` and the
    #: ``MedusaModel`` registry entry (read in the 0.33.0 wheel; ``tests/test_vllm_matrix.py``)
    vllm_releases = SpecifierSet("<0.33")

    def serving_note(self) -> str:
        """Medusa on vLLM 0.33+: no route serves it there (its model, config and method are gone), and
        Medusa heads cannot be turned into an EAGLE draft exactly (another architecture, trained on
        other inputs). The honest choices are an older vLLM for these heads, or a new draft."""
        return ("vLLM 0.33.0 removed Medusa (its method, model and config), so only vLLM 0.32 and older serve these heads: "
                "pin it (pip install 'vllm<0.33'), or train an EAGLE-3 draft for the same verifier with `specfmt train eagle3`, "
                "which every vLLM release serves")

    def expected_tensors(self, cfg: dict[str, Any]) -> dict[str, TensorSpec]:
        """Medusa (``docs/design/research-formats.md`` §5.4; vLLM ``medusa.py``), K heads of L blocks:

        ================================ ========= ==========================================
        name                             shape     when
        ================================ ========= ==========================================
        ``blocks.{i}.layers.{j}.weight`` [H, H]    i < K, j < L
        ``blocks.{i}.layers.{j}.bias``   [H]       ``medusa_fc_bias``
        ``lm_heads.{i}.weight``          [V, H]    i < K, unless ``original_lm_head``
        ``lm_head.weight``               [V, H]    ``original_lm_head`` (one head shared by all)
        ================================ ========= ==========================================
        """
        c = MedusaConfig.of(cfg)
        H, V, K, L = c.hidden_size, c.vocab_size, c.num_heads, c.num_hidden_layers
        specs: dict[str, TensorSpec] = {}
        for i in range(K):
            for j in range(L):
                specs[f"blocks.{i}.layers.{j}.weight"] = TensorSpec((H, H))
                if c.medusa_fc_bias:
                    specs[f"blocks.{i}.layers.{j}.bias"] = TensorSpec((H,))
            if not c.original_lm_head:
                specs[f"lm_heads.{i}.weight"] = TensorSpec((V, H))
        if c.original_lm_head:
            specs["lm_head.weight"] = TensorSpec((V, H), why="original_lm_head: the one head all Medusa heads share")
        return specs

    def new_shape(self, options: MedusaOptions) -> MedusaOptions:
        return replace(options, heads=options.heads or 3)

    def default_speculative_tokens(self, shape: MedusaOptions) -> int:
        return shape.speculative_tokens or shape.heads

    def new_config(self, verifier: "Verifier", shape: MedusaOptions) -> dict[str, Any]:
        k = self.default_speculative_tokens(shape)
        if k > shape.heads:
            raise InputError(f"--speculative-tokens {k} is more than the {shape.heads} Medusa heads")
        info = verifier.info
        return MedusaConfig.build(info, hidden_size=info.hidden_size, vocab_size=info.vocab_size, heads=shape.heads, layers_per_head=shape.head_layers,
                                  fc_bias=True, original_lm_head=False, dtype=shape.dtype, speculative_tokens=k).dump()

    def speculative_token_limit(self, cfg: dict[str, Any]) -> tuple[int, str] | None:
        return cfg["num_heads"], "heads"

    def module_class(self) -> type:
        from .medusa_nn import MedusaHeads

        return MedusaHeads

    def module(self, cfg: dict[str, Any], tensors: dict[str, "torch.Tensor"] | None = None):
        return layers.load_state(self.module_class()(cfg), tensors)

    def proposer(self, reading: Variant, tensors: dict[str, "torch.Tensor"], embed: "torch.Tensor", lm_head: "torch.Tensor") -> Proposer:
        return medusa_proposer(tensors, reading.cfg)

    def train_positions(self, module: Any, options: MedusaOptions) -> int:
        return len(module.blocks)

    def loss(self, module: Any, *, embed: Any, head: Any, ids: Any, aux: Any, last: Any, options: MedusaOptions, generator: Any,
             subset: list[int] | None, normaliser: Any = None, loss_mask: Any = None):
        import torch

        with torch.no_grad():
            logits = head(last)
        return medusa_loss(module, last, logits, list(range(len(module.blocks))) if subset is None else subset, loss_mask)

    def new_draft(self, cfg: dict[str, Any], verifier: "Verifier", docs: list[list[int]] | None):
        """Medusa's own initialisation: zero blocks (biases zero) and a copy of the verifier's ``lm_head``
        per head, so a new head first proposes what the verifier's head does."""
        import torch

        K, L, H = cfg["num_heads"], cfg["num_hidden_layers"], cfg["hidden_size"]
        head = verifier.lm_head()
        tensors: dict[str, torch.Tensor] = {}
        filled: dict[str, str] = {}
        for i in range(K):
            for j in range(L):
                tensors[f"blocks.{i}.layers.{j}.weight"] = torch.zeros(H, H)
                tensors[f"blocks.{i}.layers.{j}.bias"] = torch.zeros(H)
            tensors[f"lm_heads.{i}.weight"] = head.clone().float()
            filled[f"lm_heads.{i}.weight"] = "the verifier's lm_head, copied (Medusa's initialisation); blocks zero"
        return tensors, filled

    def fill_embed(self, draft: "Draft", verifier: "Verifier") -> dict[str, str]:
        raise InputError("Medusa heads read the verifier's hidden state, not token embeddings")

    def fill_heads(self, draft: "Draft", verifier: "Verifier", options: MedusaOptions, *, lm_heads: bool, fill_only: bool) -> dict[str, str]:
        """Per-head copies of a shared head (``--lm-heads``, and before training), new heads up to ``options.heads``."""
        cfg = draft.config
        heads = options.heads
        grow = heads is not None and heads > cfg["num_heads"]
        if lm_heads or grow or (cfg["original_lm_head"] and not fill_only):
            how = add_heads(draft, verifier, heads)
            if grow:  # one speculative token per head (vLLM builds one head per token); --speculative-tokens may lower it
                cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] = cfg["num_heads"]
            return how
        if heads is not None and heads < cfg["num_heads"]:
            raise InputError(f"--heads {heads}: the draft already has {cfg['num_heads']} heads", hint="heads are only added, never removed")
        return {}

    def heads_trained(self, module: Any, cfg: dict[str, Any], prior: dict[str, Any] | None, options: MedusaOptions) -> list[int] | None:
        """Only the heads a ``--heads`` fill-in added (all when none were added, or with ``--train-all``)."""
        K = cfg["num_heads"]
        prior_heads = (prior or {}).get("num_heads", 0)
        subset = list(range(K)) if (options.train_all or prior_heads in (0, K)) else list(range(prior_heads, K))
        for i, block in enumerate(module.blocks):
            block.requires_grad_(i in subset)
            module.lm_heads[i].requires_grad_(i in subset)
        return subset

    def card_rows(self, cfg: dict[str, Any]) -> list[tuple[str, str]]:
        return [("Medusa heads", f"{cfg['num_heads']}, {cfg['num_hidden_layers']} residual block(s) each"),
                ("lm_head", "one copy of the verifier's, shared" if cfg["original_lm_head"] else "one per head")]
