"""What SGLang does with a draft, read from SGLang 0.5.23's own code: the part an algorithm composes to be
exported to SGLang (:class:`SGLang`), and the rules SGLang applies whatever the algorithm (its tap ids).

An algorithm SGLang serves composes :class:`SGLang` and states, in its own module, the draft class SGLang's
model registry builds (``architectures[0]``, looked up by ``ModelRegistry`` among the ``EntryClass`` lists of
``python/sglang/srt/models/*.py``), the ``--speculative-algorithm`` that runs it, and
:meth:`SGLang.sglang_layout`: the config, the tensor names and what is dropped, or the refusal. Shared code
(:mod:`specfmt.export`, :mod:`specfmt.serving`) asks ``algo.sglang is None`` and never for a name.

**Tap ids are the verifier's business in SGLang.** The draft's ``eagle_config.eagle_aux_hidden_state_layer_ids``
(SGLang reads only the nested key: ``srt/model_executor/model_runner_components/spec_aux_hidden_state.py``)
is handed to the *verifier's* ``set_eagle3_layers_to_capture``, and each verifier class has its own rule
(:data:`TAP_RULES`). ``layers_to_capture`` there counts as vLLM's ids do: capture ``i`` is the residual
stream entering layer ``i`` (``srt/models/llama.py`` ``LlamaModel.forward``). The rules, by file:

* ``plus-one`` (``llama.py``, ``qwen2.py``, ``qwen3.py``, ``qwen3_moe.py``, ``mistral.py`` via Llama, ...):
  ``[val + 1 for val in layer_ids]`` ("for the ith layer, it takes the output of the (i-1)th layer");
* ``plus-one-if-first-is-1`` (``deepseek_v2.py``, ``glm4_moe_lite.py``; SGLang PR #25454): ``+1`` only
  when the first id is 1, the ids as they are otherwise;
* ``as-is-if-max-is-n`` (``gpt_oss.py``): the ids as they are when the largest is N, else ``+1``.

:func:`sglang_tap_ids` writes, for the taps a draft was trained on (vLLM's ids), ids that the verifier's rule
turns back into exactly those taps, or refuses. ``tests/test_sglang_interop.py`` runs each verifier class's own
``set_eagle3_layers_to_capture`` on the ids written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar

from ..errors import ExportRefusal

if TYPE_CHECKING:  # pragma: no cover
    from ..sources.verifier import VerifierInfo

#: the SGLang release whose code these rules were read from and are tested against (``tests/sglang_env.py``)
SGLANG_VERSION = "0.5.23"
#: the provenance key of an export's config.json (:mod:`specfmt.export`; SGLang ignores it, ``convert --from auto`` reads it)
EXPORT_KEY = "specfmt_export"

#: ``ids, N -> layers_to_capture``: what a verifier class's ``set_eagle3_layers_to_capture`` does with the draft's ids
TapRule = Callable[[list[int], int], list[int]]
RULES: dict[str, TapRule] = {
    "plus-one": lambda ids, n: [i + 1 for i in ids],
    "plus-one-if-first-is-1": lambda ids, n: [i + 1 for i in ids] if ids and ids[0] == 1 else list(ids),
    "as-is-if-max-is-n": lambda ids, n: list(ids) if ids and max(ids) == n else [i + 1 for i in ids],
}

#: verifier ``architectures[0]`` -> its class's rule (:data:`RULES`), and the SGLang file that holds the class
TAP_RULES: dict[str, tuple[str, str]] = {
    "LlamaForCausalLM": ("plus-one", "srt/models/llama.py"),
    "MistralForCausalLM": ("plus-one", "srt/models/mistral.py"),
    "Qwen2ForCausalLM": ("plus-one", "srt/models/qwen2.py"),
    "Qwen3ForCausalLM": ("plus-one", "srt/models/qwen3.py"),
    "Qwen3MoeForCausalLM": ("plus-one", "srt/models/qwen3_moe.py"),
    "DeepseekV2ForCausalLM": ("plus-one-if-first-is-1", "srt/models/deepseek_v2.py"),
    "DeepseekV3ForCausalLM": ("plus-one-if-first-is-1", "srt/models/deepseek_v2.py"),
    "Glm4MoeLiteForCausalLM": ("plus-one-if-first-is-1", "srt/models/glm4_moe_lite.py"),
    "GptOssForCausalLM": ("as-is-if-max-is-n", "srt/models/gpt_oss.py"),
}

#: how the ids written may be read back (the convention recorded in the export, ``converters/taps.py``'s readings)
CONVENTIONS: dict[str, int] = {"layer-output": -1, "layer-input": 0}


def sglang_tap_ids(taps: list[int], verifier: "VerifierInfo") -> tuple[list[int], str]:
    """The ``eagle_aux_hidden_state_layer_ids`` to write so that SGLang's verifier captures exactly ``taps``.

    Tries SGLang's and SpecForge's convention first (layer outputs: ``taps - 1``), then layer inputs (``taps``),
    and keeps the first that the verifier's rule (:data:`TAP_RULES`) turns back into ``taps``.

    Args:
        taps: the draft's taps in vLLM's convention (the state entering layer j), ascending.
        verifier: the verifier (its ``architectures[0]`` picks the rule; N its layers).

    Returns:
        ``(ids, convention)``: the ids and which reading of :data:`CONVENTIONS` they are.

    Raises:
        ExportRefusal: ``reason="verifier"``, a verifier architecture whose rule was not read from SGLang;
            ``reason="taps"``, no ids the rule reads back as ``taps`` (e.g. tap 1 on a PR #25454 verifier).
    """
    arch = verifier.architectures[0] if verifier.architectures else "?"
    if arch not in TAP_RULES:
        raise ExportRefusal(f"SGLang {SGLANG_VERSION}'s tap rule for verifier architecture {arch} was not read by this specfmt "
                            f"(known: {', '.join(TAP_RULES)})", engine="sglang", reason="verifier",
                            hint="each SGLang verifier class reads the draft's tap ids its own way (set_eagle3_layers_to_capture)")
    rule, where = TAP_RULES[arch]
    for convention, shift in CONVENTIONS.items():
        ids = [t + shift for t in taps]
        if all(i >= 0 for i in ids) and RULES[rule](ids, verifier.num_hidden_layers) == list(taps):
            return ids, convention
    raise ExportRefusal(f"taps {list(taps)}: SGLang {SGLANG_VERSION}'s {arch} ({where}, rule {rule}) reads no tap ids as these layers "
                        f"(layer outputs {[t - 1 for t in taps]} and layer inputs {list(taps)} are both misread)",
                        engine="sglang", reason="taps", hint="SGLang PR #25454: +1 only when the first id is 1; serve this draft with vLLM")


@dataclass
class SGLangLayout:
    """A draft as SGLang's draft class reads it.

    Attributes:
        config: the flat ``config.json`` SGLang builds the class from (``architectures[0]`` names it).
        names: specfmt tensor name -> the name written (every tensor not in :attr:`dropped`).
        dropped: specfmt tensor name -> why it is not written (what SGLang does without it).
        recorded: what the export's provenance records so that ``convert --from auto`` reads it back exactly
            (the tap-id convention, the meaning of a field SGLang reads differently from SpecForge).
        notes: what the user should know.
        derived: written name -> (why, make): tensors SGLang's class needs that the draft does not hold, made
            exactly from it (EAGLE-1's all-zero ``fc.bias``); ``convert --from auto`` reads each back as nothing.
    """

    config: dict[str, Any]
    names: dict[str, str]
    dropped: dict[str, str] = field(default_factory=dict)
    recorded: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    derived: dict[str, tuple[str, Callable[[], Any]]] = field(default_factory=dict)


class SGLang:
    """The SGLang part: how SGLang (:data:`SGLANG_VERSION`) serves this algorithm's drafts.

    Attributes:
        sglang_algorithm: SGLang's ``--speculative-algorithm`` for it (``EAGLE3``, not ``EAGLE``, for EAGLE-3:
            under the wrong one a draft runs at accept length 1.0, SGLang PR #21272).
        sglang_architecture: the draft class SGLang's model registry builds (the config's ``architectures[0]``).
        sglang_source: the SGLang file that holds it, for messages and docs.
    """

    sglang_algorithm: ClassVar[str] = ""
    sglang_architecture: ClassVar[str] = ""
    sglang_source: ClassVar[str] = ""

    def sglang_layout(self, cfg: dict[str, Any], shapes: dict[str, tuple[int, ...]], verifier: "VerifierInfo",
                      tensor: Callable[[str], Any], embedding: Callable[[], Any]) -> SGLangLayout:
        """The draft as SGLang reads it, or the reason it cannot be.

        Args:
            cfg: the draft's schema-valid specfmt config.
            shapes: its tensors' names and shapes.
            verifier: the verifier's fields.
            tensor: returns one of the draft's tensors by specfmt name (read only when a rule needs it).
            embedding: returns the verifier's input embedding [V, H_t] (read only when a rule needs it).

        Raises:
            ExportRefusal: SGLang would not run the draft exactly as specfmt and vLLM do; ``reason`` names the rule.
        """
        raise NotImplementedError

    def sglang_flags(self, cfg: dict[str, Any], k: int) -> list[str]:
        """The speculative flags of ``python -m sglang.launch_server`` beyond the algorithm and the draft path."""
        return []


def exported_by_specfmt(cfg: dict[str, Any], algorithm: str) -> dict[str, Any] | None:
    """The provenance block (:data:`EXPORT_KEY`) of a config.json ``specfmt export --to sglang`` wrote for a draft of
    ``algorithm``, or None for any other config (what the converters' ``sglang-export`` layouts recognise)."""
    block = cfg.get(EXPORT_KEY)
    return block if isinstance(block, dict) and block.get("engine") == "sglang" and block.get("algorithm") == algorithm else None


def same_tensor(own: Any, theirs: Any) -> bool:
    """``own`` holds exactly ``theirs``' values: same shape, and equal both ways across the two dtypes (so that neither
    rounding hides a difference). Used for a draft's copy of the verifier's embedding, which SGLang replaces."""
    import torch

    return own.shape == theirs.shape and torch.equal(own.to(theirs.dtype), theirs) and torch.equal(own, theirs.to(own.dtype))


def refuse(reason: str, message: str, hint: str | None = None) -> ExportRefusal:
    """An :class:`~specfmt.errors.ExportRefusal` of the SGLang export (``reason``: the rule's key)."""
    return ExportRefusal(message, engine="sglang", reason=reason, hint=hint)


__all__ = ["CONVENTIONS", "EXPORT_KEY", "RULES", "SGLANG_VERSION", "SGLang", "SGLangLayout", "TAP_RULES", "exported_by_specfmt", "refuse", "same_tensor", "sglang_tap_ids"]
