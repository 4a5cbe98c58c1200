"""The typed blocks of a speculators ``config.json`` that every algorithm shares, and the registry of
the algorithms' config classes.

:class:`SpeculatorConfig` is the top level (what speculators 0.9 calls ``SpeculatorModelConfig``):
``speculators_model_type``, ``speculators_version``, ``speculators_config``
(:class:`SpeculatorsBlock`: proposal methods, :class:`VerifierRef`), ``transformer_layer_config``
(for the EAGLE family a :class:`DecoderConfig`), ``architectures``, ``dtype``/``torch_dtype``,
``tie_word_embeddings`` and the ``specfmt`` provenance block
(:class:`~specfmt.format.provenance.Provenance`). Each algorithm subclasses it in its own module
(:mod:`specfmt.algorithms`), with its name and architecture as class-level data, and registers the
class (:func:`register_config`); a variant of an algorithm subclasses that algorithm's class
(``class PEagleConfig(Eagle3Config)`` would add ``mask_token_id`` and its name). The JSON Schema
is generated from these classes (:mod:`specfmt.format.schema`).

It also holds the one typed reading of the ``speculators_config`` object for code that reads configs
before (or without) the schema. A config.json can hold any JSON value at any key; the schema check
reports that, but detection, ``upgrade``'s verifier lookup and ``push`` read ``speculators_config``
before or without it. They read it here: :func:`speculators_section` and :func:`verifier_section`
give the object or None, or refuse with one line, and never hand a list or a string to ``.get``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import Field

from ..errors import InputError
from .model import AS_ENUM, ConfigModel, Def, Forbidden, Integer, NonNegativeInt, NonNegativeNumber, PositiveInt, PositiveNumber, Schema, Unchecked
from .provenance import Provenance
from .versions import SPECULATORS_VERSION

if TYPE_CHECKING:  # pragma: no cover
    from ..sources.verifier import VerifierInfo

#: the floating dtypes of a checkpoint (``dtype``, ``torch_dtype``)
Dtype = Annotated[Literal["float16", "bfloat16", "float32"], Def("dtype")]
#: how a draft proposes (speculators' ``proposal_type``): vLLM drafts a greedy chain
ProposalType = Annotated[Literal["greedy"], AS_ENUM]
#: a verifier layer id (``eagle_aux_hidden_state_layer_ids``)
LayerId = Annotated[NonNegativeInt, Def("layer_id")]

#: ``name_or_path``: a Hub id or an absolute path (not a relative path, not ``..`` anywhere)
_HUB_ID_OR_ABSOLUTE = Schema({"anyOf": [
    {"pattern": "^/"},
    {"pattern": "^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$", "not": {"pattern": "(^|/)\\.\\.?(/|$)|--|\\.\\."}},
]})


class ProposalMethod(ConfigModel):
    """One entry of ``speculators_config.proposal_methods``."""

    schema_name: ClassVar[str] = "proposal_method"

    proposal_type: ProposalType
    speculative_tokens: Integer = Field(ge=1, le=64, description="Number of speculative tokens vLLM drafts per step (num_speculative_tokens).")
    verifier_accept_k: PositiveInt = None
    accept_tolerance: NonNegativeNumber = None


class VerifierRef(ConfigModel):
    """``speculators_config.verifier``: the verifier ``vllm serve`` loads with the draft."""

    name_or_path: Annotated[str, _HUB_ID_OR_ABSOLUTE] = Field(
        min_length=1,
        description="A Hugging Face Hub id (owner/name) or an absolute path; never a relative path, which breaks `vllm serve` run from another folder.")
    architectures: list[str] = Field(min_length=1)


class SpeculatorsBlock(ConfigModel):
    """``speculators_config``: the algorithm, how it proposes, and the verifier."""

    schema_name: ClassVar[str] = "speculators_config"

    algorithm: str
    proposal_methods: list[ProposalMethod] = Field(min_length=1)
    default_proposal_method: ProposalType
    verifier: VerifierRef

    @classmethod
    def greedy(cls, algorithm: str, speculative_tokens: int, verifier: "VerifierInfo") -> SpeculatorsBlock:
        """One greedy proposal method of ``speculative_tokens`` (what vLLM reads as
        ``num_speculative_tokens``) and the verifier vLLM serves."""
        return cls(
            algorithm=algorithm,
            proposal_methods=[ProposalMethod(proposal_type="greedy", speculative_tokens=speculative_tokens, verifier_accept_k=1, accept_tolerance=0.0)],
            default_proposal_method="greedy",
            verifier=VerifierRef(name_or_path=verifier.name_or_path, architectures=list(verifier.architectures)),
        )


class RopeParameters(ConfigModel):
    """``transformer_layer_config.rope_parameters`` (transformers 5): the rotary settings. Only
    ``rope_theta`` is typed (the draft's rotary base, :mod:`specfmt.algorithms.layers`); the other keys
    (``rope_type``, scaling factors) are kept as they are."""

    rope_theta: PositiveNumber = None


class DecoderSizes:
    """H, V and H_t of a speculators config whose draft decoder is ``transformer_layer_config`` and whose
    verifier width is ``target_hidden_size`` (EAGLE-3's and DFlash's configs and their subclasses)."""

    @property
    def hidden_size(self) -> int:
        """H."""
        return self.transformer_layer_config.hidden_size

    @property
    def vocab_size(self) -> int:
        """V, the verifier's vocabulary."""
        return self.transformer_layer_config.vocab_size

    @property
    def verifier_hidden_size(self) -> int:
        """H_t: ``target_hidden_size``, else H."""
        return self.target_hidden_size or self.hidden_size


class DecoderConfig(ConfigModel):
    """A draft decoder's HF config (``transformer_layer_config`` of the EAGLE family): the fields of one
    Llama or Qwen3 layer (:mod:`specfmt.algorithms.layers`). Notation: H ``hidden_size``, V
    ``vocab_size`` (the verifier's), d ``head_dim`` (else H / ``num_attention_heads``)."""

    schema_name: ClassVar[str] = "decoder_config"
    schema_description: ClassVar[str] = (
        "The draft decoder's HF config (vLLM flattens it into the draft config). vocab_size is the verifier's vocabulary V.")
    forbidden: ClassVar[Forbidden | None] = Forbidden(
        ("bias",), "'bias' means q/k/v/o attention bias to vLLM's Llama layer (vLLM PR #9580); never write it.")

    model_type: str
    architectures: Unchecked[list[str]] = None
    vocab_size: PositiveInt
    hidden_size: PositiveInt
    intermediate_size: PositiveInt
    num_hidden_layers: PositiveInt
    num_attention_heads: PositiveInt
    num_key_value_heads: PositiveInt
    head_dim: PositiveInt = None
    rms_norm_eps: PositiveNumber = None
    hidden_act: str = None
    max_position_embeddings: PositiveInt = None
    attention_bias: bool = None
    mlp_bias: bool = None
    tie_word_embeddings: Literal[False] = None
    rope_theta: PositiveNumber = None
    rope_parameters: RopeParameters = Field(None, description=(
        "transformers 5's rotary settings; the draft's rotary base is its rope_theta when present (specfmt.algorithms.layers)."))
    rope_scaling: Unchecked[dict] = None
    dtype: Unchecked[str] = None
    torch_dtype: Unchecked[str] = None
    layer_types: Unchecked[list[str]] = None
    sliding_window: Unchecked[PositiveInt] = None
    use_sliding_window: Unchecked[bool] = None
    max_window_layers: Unchecked[NonNegativeInt] = None

    @property
    def head_width(self) -> int:
        """d: ``head_dim`` when given, else H / ``num_attention_heads``."""
        return self.head_dim or self.hidden_size // self.num_attention_heads


class SpeculatorConfig(ConfigModel):
    """The top level of a speculators ``config.json``: what every algorithm has.

    Class-level data of an algorithm's subclass:

    Attributes:
        name: ``speculators_model_type`` (and ``speculators_config.algorithm``).
        architecture: what a new config's ``architectures`` holds.
        pin_architecture: the schema requires ``architectures`` to be exactly ``[architecture]``
            (vLLM picks the draft model by it: EAGLE-1, Medusa).
        native: vLLM reads the draft's own config at the top level (no speculators algorithm in
            vLLM 0.32): ``transformer_layer_config`` repeats it and must agree with it.
    """

    schema_description: ClassVar[str] = (
        "The config.json of a draft model ('speculator') in the speculators format that vLLM detects on its own "
        "(vllm/transformers_utils/config.py::maybe_override_with_speculators: a speculators_config key). One branch per algorithm "
        "(speculators_model_type). eagle3 has no top-level model_type, so vLLM's speculators loader builds the draft config from "
        "transformer_layer_config. vLLM 0.32's speculators loader has no eagle or medusa algorithm, so those branches also carry vLLM's "
        "native draft config at the top level (model_type llama / medusa), which vLLM reads instead; transformer_layer_config repeats it "
        "because vLLM requires the key. The 'specfmt' block is provenance that vLLM ignores.")

    name: ClassVar[str] = ""
    architecture: ClassVar[str] = ""
    pin_architecture: ClassVar[bool] = False
    native: ClassVar[bool] = False

    speculators_model_type: str = Field(description="The draft algorithm; vLLM's proposal method.")
    speculators_version: Annotated[str, Schema({"pattern": "^[0-9]+(\\.[0-9]+)*([._-]?(a|b|rc|dev|post)[0-9]*)*$"})] = Field(
        description="Version of the speculators format the file follows (PEP 440).")
    speculators_config: SpeculatorsBlock
    transformer_layer_config: dict[str, Any] = Field(
        description="The draft's layer config (HF PretrainedConfig dict); vLLM requires the key (validate_speculators_config). "
                    "vocab_size is the verifier's vocabulary V.")
    architectures: list[str] = None
    torch_dtype: Dtype = None
    dtype: Dtype = None
    tie_word_embeddings: Literal[False] = Field(None, description="The draft's lm_head (Vd rows) and embedding (V rows) are never tied.")
    specfmt: Provenance = None

    @classmethod
    def head(cls, verifier: "VerifierInfo", speculative_tokens: int) -> dict[str, Any]:
        """The fields every new config of this algorithm starts with, in the file's order:
        ``speculators_model_type``, ``speculators_version`` (the one specfmt writes) and
        ``speculators_config`` (one greedy method of ``speculative_tokens``, the verifier)."""
        return {"speculators_model_type": cls.name, "speculators_version": SPECULATORS_VERSION,
                "speculators_config": SpeculatorsBlock.greedy(cls.name, speculative_tokens, verifier)}

    @property
    def speculative_tokens(self) -> int:
        """k: ``speculators_config.proposal_methods[0].speculative_tokens``."""
        return self.speculators_config.proposal_methods[0].speculative_tokens

    def violations(self) -> list[tuple[str, str]]:
        """The rules a schema cannot state, for a config the schema accepts: ``[(json_path, message)]``,
        empty when they hold. Here: ``speculators_config`` agrees with itself and with
        ``speculators_model_type``, and (:attr:`native`) ``transformer_layer_config`` says what the
        top level says. An algorithm's class adds its own rules (and calls this)."""
        out = []
        sc = self.speculators_config
        if sc.algorithm != self.speculators_model_type:
            out.append(("$.speculators_config.algorithm", f"{sc.algorithm!r} differs from speculators_model_type {self.speculators_model_type!r}"))
        kinds = [m.proposal_type for m in sc.proposal_methods]
        if sc.default_proposal_method not in kinds:
            out.append(("$.speculators_config.default_proposal_method", f"{sc.default_proposal_method!r} is not one of the proposal_methods {kinds}"))
        if self.native:
            out += self.native_violations()
        return out

    def native_violations(self) -> list[tuple[str, str]]:
        """For drafts vLLM reads through a native config at the top level (EAGLE-1, Medusa):
        every key of ``transformer_layer_config`` the top level also has must say the same
        (``architectures`` excepted: the top level names vLLM's draft model)."""
        tlc = self.transformer_layer_config
        layer = tlc.dump() if isinstance(tlc, ConfigModel) else tlc
        out = []
        for key, val in layer.items():
            top = self.value(key) if self.has(key) else None
            top = top.dump() if isinstance(top, ConfigModel) else top  # a typed block (rope_parameters) as the file holds it
            if key != "architectures" and self.has(key) and top != val:
                out.append((f"$.transformer_layer_config.{key}", f"{val!r} differs from the top-level {key}={top!r} that vLLM reads"))
        return out


#: the algorithms' config classes, by ``speculators_model_type``, in registration order
CONFIGS: dict[str, type[SpeculatorConfig]] = {}


def register_config(cls: type[SpeculatorConfig]) -> type[SpeculatorConfig]:
    """Class decorator: publish ``cls`` as the config of ``speculators_model_type == cls.name``
    (a branch of the generated schema; :func:`config_class`).

    Raises:
        ValueError: the name is missing or taken.
    """
    if not cls.name or cls.name in CONFIGS:
        raise ValueError(f"config name {cls.name!r} missing or taken")
    CONFIGS[cls.name] = cls
    return cls


def config_class(name: Any) -> type[SpeculatorConfig] | None:
    """The config class registered for a ``speculators_model_type``, or None."""
    return CONFIGS.get(name) if isinstance(name, str) else None


def speculators_block(algorithm: str, speculative_tokens: int, verifier: "VerifierInfo") -> dict[str, Any]:
    """The ``speculators_config`` object (:meth:`SpeculatorsBlock.greedy`) as ``config.json`` holds it."""
    return SpeculatorsBlock.greedy(algorithm, speculative_tokens, verifier).dump()


def speculative_tokens(cfg: dict[str, Any]) -> int:
    """k: ``speculators_config.proposal_methods[0].speculative_tokens`` of a schema-valid config."""
    return cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"]


def json_type(value: Any) -> str:
    """The JSON name of a value's type, for messages: ``null``, ``a boolean``, ``a list``..."""
    if value is None:
        return "null"
    for kind, name in ((bool, "a boolean"), ((int, float), "a number"), (str, "a string"), (list, "a list"), (dict, "an object")):
        if isinstance(value, kind):
            return name
    return type(value).__name__


def speculators_section(cfg: dict[str, Any], where: str = "config.json") -> dict[str, Any] | None:
    """``cfg["speculators_config"]``: the object, or None when the key is absent.

    Raises:
        InputError: the key is there but holds anything other than an object (``null``, a list,
            a string, a boolean, a number).
    """
    if "speculators_config" not in cfg:
        return None
    section = cfg["speculators_config"]
    if not isinstance(section, dict):
        raise InputError(f"speculators_config is {json_type(section)}, not an object", where=where,
                         hint="a speculators config.json holds speculators_config as {\"algorithm\": ..., \"proposal_methods\": [...], \"verifier\": {...}}")
    return section


def verifier_section(cfg: dict[str, Any]) -> dict[str, Any] | None:
    """``speculators_config.verifier`` when both are objects, else None (never raises: a lookup)."""
    section = cfg.get("speculators_config")
    verifier = section.get("verifier") if isinstance(section, dict) else None
    return verifier if isinstance(verifier, dict) else None


def verifier_ref(cfg: dict[str, Any]) -> str | None:
    """The verifier a speculators config names (``speculators_config.verifier.name_or_path``, a
    non-empty string), or None (absent, or not a string; never raises)."""
    v = (verifier_section(cfg) or {}).get("name_or_path")
    return v if isinstance(v, str) and v else None


def with_verifier(cfg: dict[str, Any], name: str, where: str = "config.json") -> dict[str, Any]:
    """A copy of ``cfg`` whose ``speculators_config.verifier.name_or_path`` is ``name``.

    Raises:
        InputError: ``cfg`` has no ``speculators_config.verifier`` object to write it into.
    """
    import copy

    if verifier_section(cfg) is None:
        raise InputError("config.json has no speculators_config.verifier object to name the verifier in; this is not a speculators "
                         "checkpoint", where=where, hint="push a folder that `specfmt convert -o` or `specfmt train -o` wrote")
    new = copy.deepcopy(cfg)
    new["speculators_config"]["verifier"]["name_or_path"] = name
    return new
