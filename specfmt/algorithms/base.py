"""What every algorithm module provides, and the registry that finds one by name.

An algorithm (EAGLE-3, EAGLE-1/2, Medusa) is one module of this package, holding all that
only it knows; the shared code looks it up by ``speculators_model_type`` and never branches
on the name. The contract, :class:`Algorithm`:

* **format**: its typed config (:attr:`Algorithm.config`, a
  :class:`~specfmt.format.config.SpeculatorConfig` subclass: fields, the builders its converters
  call, cross-field rules, its schema branch), a new draft's config (:meth:`Algorithm.new_config`)
  and its tensor table (:meth:`~Algorithm.expected_tensors`), shapes in H, H_t, V, Vd, K notation;
* **validation**: its static checks (:meth:`~Algorithm.vocab_map_check`,
  :meth:`~Algorithm.verifier_problems`, :meth:`~Algorithm.tensor_problems`), its reference
  module and proposer (:meth:`~Algorithm.module`, :meth:`~Algorithm.proposer`) and the
  plausible misreadings of a checkpoint (:meth:`~Algorithm.readings`);
* **training**: its objective (:meth:`~Algorithm.loss`), a new draft's initialisation and the
  fill-ins (:meth:`~Algorithm.new_draft`, ``fill_*``);
* **publishing**: its model-card rows (:meth:`~Algorithm.card_rows`).

A draft-layer family (llama, qwen3) is a parameter of an algorithm (:mod:`.layers`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar

from packaging.specifiers import SpecifierSet

from ..errors import Finding, InputError
from ..format.config import SpeculatorConfig

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from ..checkpoint.reader import CheckpointReader
    from ..format.draft import Draft
    from ..format.tensors import TensorSpec
    from ..sources.verifier import Verifier, VerifierInfo


@dataclass
class Variant:
    """One reading of a checkpoint: the config as written, or a plausible misreading of it.

    Attributes:
        cause: None for the checkpoint as written; else the cause this misreading stands for
            (``tap ids``, ``norm order``, ``vocab mapping``, ``q/k norms``).
        label: one line for the report (``taps + 1: [3, 5, 6]``).
        cfg: the config of this reading.
        extra: what else the algorithm's proposer needs to read it this way (e.g. how ``d2t`` maps,
            or ``qk_norm: False`` for Qwen3 layers read without their q/k norms).
    """

    cause: str | None
    label: str
    cfg: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)


#: ``propose(tokens, states, k) -> k draft token ids`` (see :mod:`specfmt.algorithms.reference`)
Proposer = Callable[[list[int], Any, int], list[int]]


@dataclass
class NewDraft:
    """The shape of a draft trained from scratch (``specfmt train ALGORITHM`` options).

    Attributes:
        draft_vocab: EAGLE-3 draft vocabulary Vd (None: the verifier's V).
        taps: EAGLE-3 tap layer ids (None: the reference default).
        layers: EAGLE decoder layers.
        heads / head_layers: Medusa heads K and residual blocks per head L.
        speculative_tokens: k (None: the algorithm's default).
        dtype: the floating dtype the tensors will be saved in.
        draft_layer: the decoder-layer family (``llama``, ``qwen3``).
    """

    draft_vocab: int | None = None
    taps: list[int] | None = None
    layers: int = 1
    heads: int = 3
    head_layers: int = 1
    speculative_tokens: int | None = None
    dtype: str = "float32"
    draft_layer: str = "llama"


class Algorithm:
    """Base class of an algorithm; subclasses live one per module and register an instance.

    Attributes:
        config: the typed config class (:class:`~specfmt.format.config.SpeculatorConfig`).
        name: ``speculators_model_type`` (``config.name``).
        title: the name people use (``EAGLE-3``).
        vllm_method: vLLM's speculative method for it (what ``vllm serve OUT`` attaches).
        train_summary: one line for ``specfmt train NAME --help``; empty when it cannot be trained.
    """

    #: the typed config (fields, defaults, cross-field rules, the schema branch); ``name`` is its name
    config: ClassVar[type[SpeculatorConfig]]
    name: ClassVar[str] = ""
    title: ClassVar[str] = ""
    vllm_method: ClassVar[str] = ""
    train_summary: ClassVar[str] = ""
    #: small integer tensors the writer keeps in memory to check them together (e.g. a vocabulary map)
    map_tensors: ClassVar[tuple[str, ...]] = ()
    #: vLLM parameter names that are not the file's names, e.g. ``draft_id_to_target_id`` -> ``d2t``
    vllm_aliases: ClassVar[dict[str, str]] = {}
    #: file tensors vLLM keeps no copy of, and why (``validate --run``'s ``vllm_weights`` check does not look for them)
    vllm_not_held: ClassVar[dict[str, str]] = {}
    #: tensors a research checkpoint may lack because ``specfmt train fill`` computes them
    fillable: ClassVar[frozenset[str]] = frozenset()
    #: the vLLM releases that serve this algorithm (every release when empty; :mod:`specfmt.serving`)
    vllm_releases: ClassVar[SpecifierSet] = SpecifierSet()
    #: what other tools make of the output (the model card and ``docs/serving.md`` say it)
    interop_note: ClassVar[str] = ""

    def serving_note(self) -> str:
        """What to tell a user whose vLLM cannot serve this algorithm (empty when every release can)."""
        return ""

    # -- format ------------------------------------------------------------------------------

    def config_violations(self, cfg: dict[str, Any]) -> list[tuple[str, str]]:
        """Cross-field rules of a schema-valid config: ``[(json_path, message)]``, empty when it holds
        (the typed config's :meth:`~specfmt.format.config.SpeculatorConfig.violations`)."""
        return self.config.of(cfg).violations()

    def expected_tensors(self, cfg: dict[str, Any]) -> dict[str, "TensorSpec"]:
        """The tensors (names, shapes, kinds) a schema-valid config implies."""
        raise NotImplementedError

    def new_config(self, verifier: "Verifier", shape: NewDraft) -> dict[str, Any]:
        """The config of a new draft for ``verifier``, its decoder shaped like one verifier layer.

        Raises:
            InputError: an option does not fit the verifier or the algorithm.
        """
        raise InputError(f"{self.title} drafts cannot be built from scratch by this specfmt")

    def default_speculative_tokens(self, shape: NewDraft) -> int:
        return shape.speculative_tokens or 3

    def speculative_token_limit(self, cfg: dict[str, Any]) -> tuple[int, str] | None:
        """The most speculative tokens this draft can propose per step, with what limits it
        (``(3, "heads")``), or None when any k works."""
        return None

    def verifier_hidden_size(self, cfg: dict[str, Any]) -> int:
        """The width of the verifier states the draft reads (H_t)."""
        return cfg["transformer_layer_config"]["hidden_size"]

    # -- static validation ---------------------------------------------------------------------

    def vocab_map_check(self, cfg: dict[str, Any], reader: "CheckpointReader") -> tuple[str, str, list[str]]:
        """The ``vocab_map`` check: ``(status, summary, details)``."""
        return "pass", f"no draft vocabulary: {self.name} proposes over the verifier's {cfg['transformer_layer_config']['vocab_size']} ids", []

    def verifier_problems(self, cfg: dict[str, Any], verifier: "VerifierInfo") -> list["str | Finding"]:
        """What in the config does not fit the verifier, beyond width and vocabulary: each problem a line,
        or a :class:`~specfmt.errors.Finding` naming the config field it concerns (``path``)."""
        return []

    def tensor_problems(self, cfg: dict[str, Any], small: dict[str, Any]) -> list[str]:
        """Problems of the :attr:`map_tensors` written (numpy arrays or CPU tensors, by name)."""
        return []

    # -- reference run ---------------------------------------------------------------------------

    def module(self, cfg: dict[str, Any], tensors: dict[str, "torch.Tensor"] | None = None) -> Any:
        """The draft as a ``torch.nn.Module`` whose state-dict names are the specfmt tensor names
        (random initialisation when ``tensors`` is None).

        Raises:
            KeyError, RuntimeError: ``tensors`` do not fit the config (``load_state_dict(strict=True)``).
        """
        raise NotImplementedError

    def readings(self, cfg: dict[str, Any], n_verifier_layers: int) -> list[Variant]:
        """The checkpoint as written first, then the misreadings this field is known for."""
        return [Variant(None, "as written", cfg)]

    def proposer(self, reading: Variant, tensors: dict[str, "torch.Tensor"], embed: "torch.Tensor", lm_head: "torch.Tensor") -> Proposer:
        """Chain drafting of ``reading`` as vLLM runs it, for the reference acceptance loop.

        Args:
            tensors: the checkpoint's tensors.
            embed: [V, H_t] the verifier's input embedding.
            lm_head: [V, H_t] the verifier's output head.
        """
        raise NotImplementedError

    # -- training --------------------------------------------------------------------------------

    def feature_taps(self, cfg: dict[str, Any]) -> list[int]:
        """Verifier layers whose input states the draft reads (EAGLE-3 taps); empty: the last hidden state only."""
        return []

    def train_positions(self, module: Any, ttt_steps: int) -> int:
        """How many draft positions the training figures report per step."""
        return 1

    def loss(self, module: Any, *, embed: Any, head: Any, ids: Any, aux: Any, last: Any, ttt_steps: int, noise: float,
             generator: Any, subset: list[int] | None, normaliser: Any = None) -> tuple[Any, list[int], list[int]]:
        """The training loss of one batch: ``(loss, correct per position, counted per position)``.

        Args:
            module: the draft (:meth:`module`, train mode).
            embed: [V, H] the frozen embedding the draft reads; head: the verifier's ``lm_head``.
            ids: [B, T] token ids; aux: [B, T, n_aux·H_t] tap states or None; last: [B, T, H_t]
                the verifier's last hidden state (after its final norm).
            ttt_steps, noise, generator: options of the objectives that use them.
            subset: the parts to train (Medusa heads), None for all.
            normaliser: for an objective that averages over a number of counted positions that differs
                between processes (EAGLE-3's positions masked by the draft vocabulary), ``counts -> divisors``:
                given this process's counts per loss term (float64 tensor), what to divide its sums by so
                that the average of the processes' losses -- what ``DistributedDataParallel`` averages the
                gradients over -- is the mean over every process's positions (:func:`specfmt.training.loop.fit`:
                the global count over the number of processes). None: the counts themselves (one process).
                Objectives that average over the same number of positions on every process ignore it.
        """
        raise NotImplementedError

    def check_new_draft(self, shape: NewDraft, *, init: bool) -> None:
        """Refuse options that do not shape this algorithm's drafts.

        Raises:
            InputError: naming the option.
        """
        if shape.draft_vocab is not None or shape.taps is not None:
            raise InputError("--draft-vocab and --aux-layers apply to new EAGLE-3 drafts")

    def check_new_heads(self, heads: int | None) -> None:
        """Refuse ``--heads`` for a new draft of an algorithm without heads.

        Raises:
            InputError: ``heads`` given.
        """
        if heads is not None:
            raise InputError("--heads applies to Medusa drafts")

    def new_draft(self, cfg: dict[str, Any], verifier: "Verifier", docs: list[list[int]] | None) -> tuple[dict[str, "torch.Tensor"], dict[str, str]]:
        """The tensors of a new draft, initialised as the reference trainers do, and ``{tensor: how}``
        for those filled from the verifier or the data.

        Raises:
            InputError: the initialisation needs data (``docs``) that was not given.
        """
        raise NotImplementedError

    def fill_vocab(self, draft: "Draft", *, wanted: bool | None, docs: list[list[int]] | None) -> dict[str, str]:
        """Build a draft vocabulary map from ``docs`` when asked (``wanted``) or needed (None).

        Raises:
            InputError: asked for a draft without one.
        """
        if wanted:
            raise InputError(f"--vocab-map: a {self.name} draft has no draft vocabulary map")
        return {}

    def fill_vocab_map(self, draft: "Draft", docs: list[list[int]]) -> dict[str, str]:
        """``d2t``/``t2d`` from token frequencies over ``docs``.

        Raises:
            InputError: the draft has no draft vocabulary.
        """
        raise InputError(f"a {self.name} draft has no draft vocabulary map", hint="only EAGLE-3 drafts use d2t/t2d")

    def fill_embed(self, draft: "Draft", verifier: "Verifier") -> dict[str, str]:
        """Copy the verifier's embedding into ``embed_tokens.weight``.

        Raises:
            InputError: the draft reads no token embedding, or one that cannot be copied.
        """
        raise InputError(f"a {self.title} draft reads no token embedding of its own")

    def fill_heads(self, draft: "Draft", verifier: "Verifier", *, heads: int | None, lm_heads: bool, fill_only: bool) -> dict[str, str]:
        """Per-head output heads and new heads (``--lm-heads``, ``--heads K``).

        Raises:
            InputError: the draft has no heads to fill.
        """
        if heads is not None or lm_heads:
            raise InputError(f"--heads / --lm-heads apply to Medusa drafts, not {self.name}")
        return {}

    def heads_trained(self, module: Any, cfg: dict[str, Any], prior: dict[str, Any] | None, train_all: bool) -> list[int] | None:
        """Freeze what is not trained; the subset :meth:`loss` trains (None: everything)."""
        return None

    # -- publishing ------------------------------------------------------------------------------

    def card_rows(self, cfg: dict[str, Any]) -> list[tuple[str, str]]:
        """Rows of the model card's table that describe this draft's shape."""
        tlc = cfg["transformer_layer_config"]
        return [("decoder layers", f"{tlc['num_hidden_layers']} (hidden size {tlc['hidden_size']}, {tlc['num_attention_heads']} attention heads)")]


REGISTRY: dict[str, Algorithm] = {}


def register(cls: type[Algorithm]) -> type[Algorithm]:
    """Class decorator: make an algorithm findable as ``speculators_model_type == cls.name``."""
    if not cls.name or cls.name in REGISTRY:
        raise ValueError(f"algorithm name {cls.name!r} missing or taken")
    REGISTRY[cls.name] = cls()
    return cls
