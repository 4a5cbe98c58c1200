"""The tap convention: which verifier layers a draft reads, in vLLM's numbering.

EAGLE-3 drafts (and DFlash's, whose ids vLLM reads minus one) name the verifier layers whose
hidden states they fuse. Sources write those ids in two conventions the file does not say;
this module is the one place that reads them (:func:`read_taps`), names the readings
(:data:`TAP_READINGS`, ``specfmt convert --tap-ids``) and describes them for ``inspect``
(:func:`describe_taps`).

The two conventions of tap ids, and their sources:

* vLLM reads ``eagle_aux_hidden_state_layer_ids`` (top level, else ``eagle_config``) verbatim
  (vLLM 0.32 ``vllm/v1/worker/gpu_model_runner.py`` ``_get_eagle3_aux_layers_from_config``) and
  captures id ``j`` as the state after ``j`` layers (``models/interfaces.py``
  ``_maybe_add_hidden_state``, called with ``idx + 1`` after layer ``idx`` in ``models/llama.py``).
  The speculators format is read by the same code, so its ids are vLLM's by definition.
* SGLang's ``set_eagle3_layers_to_capture(layer_ids)`` captures ``[val + 1 for val in layer_ids]``
  ("for the ith layer, it takes the output of the (i-1)th layer"), i.e. an explicit id ``i``
  means the *output* of layer ``i``; SpecForge, which trains through SGLang or HF targets,
  therefore defaults to ``[1, N//2 - 1, N - 4]`` ("in sglang, when we do
  set_eagle3_layers_to_capture, we will add 1 to the layer index"), which is vLLM's (2, N//2, N-3).
* Published drafts use both: SGLang PR #25454 (2026-05) drops the ``+1`` unless the first id is 1,
  because e.g. lightseekorg/kimi-k2.5-eagle3-mla ships input-convention ids; SGLang PR #32334
  reads nvidia/gpt-oss-120b-Eagle3-v3's ``[24, 30, 36]`` as boundary (input-convention) indices.
  So the ids of a SpecForge/ModelOpt ``eagle_config`` (or a research config's top level) do not
  say which they are, and guessing from the first id would silently shift every tap of a
  draft trained the other way. vLLM PR #43671 (open) shows the cost: a MiniMax-M2.5 draft trained
  against SGLang's ``+1``, read verbatim by vLLM, accepted ~10% at position 0 instead of ~45%.
"""

from __future__ import annotations

from typing import Any, Callable

from specfmt.errors import ConversionError, InputError

from .base import Options

#: ``--tap-ids``: the readings of tap ids whose convention the source file does not fix, and
#: what each adds to an id to give vLLM's (see :func:`read_taps`)
TAP_READINGS: dict[str, int] = {"layer-output": 1, "layer-input": 0}

#: set by a converter's ``from_speculators`` on the research config it builds: the tap ids
#: came from a speculators config, whose convention is vLLM's by definition
SPECULATORS_TAPS = "specfmt:speculators_taps"

#: the field holding the ids, at the top level or in ``eagle_config``
TAPS_KEY = "eagle_aux_hidden_state_layer_ids"


def _is_ids(ids: Any) -> bool:
    return isinstance(ids, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in ids)


def source_taps(cfg: dict[str, Any]) -> tuple[str, list[int] | None]:
    """``(where, ids)``: the tap ids a research config names (top level first, then
    ``eagle_config``), and the key they were read from.

    Raises:
        ConversionError: the ids are not a list of integers.
    """
    ec = cfg.get("eagle_config") if isinstance(cfg.get("eagle_config"), dict) else {}
    key = TAPS_KEY if cfg.get(TAPS_KEY) is not None else f"eagle_config.{TAPS_KEY}"
    ids = cfg.get(TAPS_KEY, ec.get(TAPS_KEY))
    if ids is not None and not _is_ids(ids):
        raise ConversionError(f"eagle_aux_hidden_state_layer_ids must be a list of integers, got {ids!r}", where="config.json")
    return key, ids


def _taps_absent(opts: Options, num_layers: int, notes: list[str], default: Callable[[int], list[int]]) -> list[int]:
    """A source without ids: ``--aux-layers``, else the default (with a note); ``--tap-ids`` is refused."""
    if opts.tap_ids is not None:
        raise ConversionError(f"--tap-ids {opts.tap_ids} says how to read the source's tap ids, but its config names none",
                              where="config.json", hint="drop --tap-ids; the taps are --aux-layers or the default (2, N//2, N-3)")
    if opts.aux_layers is not None:
        return list(opts.aux_layers)
    taps = default(num_layers)
    notes.append(f"tap layers not in the source; wrote the EAGLE-3 reference default (2, N//2, N-3) = {taps} for N={num_layers} verifier layers")
    return taps


def _taps_fixed(ids: list[int], reading: str | None) -> list[int]:
    """Ids from a speculators config: vLLM's by definition; a ``--tap-ids`` other than ``layer-input`` is refused."""
    if reading not in (None, "layer-input"):
        raise ConversionError(f"--tap-ids {reading} contradicts the speculators format, whose eagle_aux_hidden_state_layer_ids are vLLM's "
                              "(the residual stream entering each layer)", where="config.json", hint="drop --tap-ids")
    return list(ids)


def _taps_read(key: str, ids: list[int], opts: Options, notes: list[str]) -> list[int]:
    """Ids from a research config, read as ``--tap-ids`` says, or as the reading ``--aux-layers`` equals."""
    reading, given = opts.tap_ids, opts.aux_layers
    readings = {name: [i + shift for i in ids] for name, shift in TAP_READINGS.items()}
    if reading is None and given is not None:
        reading = next((name for name, vids in readings.items() if vids == list(given)), None)
    if reading is None:
        raise ConversionError(
            f"{key} {ids}: SGLang/SpecForge read layer outputs (vLLM ids {readings['layer-output']}), "
            f"vLLM reads layer inputs ({readings['layer-input']}); pass --tap-ids layer-output or --tap-ids layer-input"
            + (f" (--aux-layers {list(given)} is neither)" if given is not None else ""),
            where="config.json",
            hint="SpecForge trains through SGLang (layer outputs); `specfmt validate --run` tries the other reading as a ±1 variant",
        )
    taps = readings[reading]
    notes.append(f"{key} {ids} read as {reading.replace('-', ' ')}s (--tap-ids {reading}): vLLM tap ids {taps}")
    return taps


def _check_taps(taps: list[int], given: list[int] | None, num_layers: int) -> list[int]:
    """``--aux-layers`` equals the ids as read; the ids are distinct, ascending and within the verifier."""
    if given is not None and list(given) != taps:
        raise ConversionError(f"--aux-layers {list(given)} contradicts the source's tap ids, which are {taps} in vLLM's convention",
                              hint="drop --aux-layers; the draft was trained on the source's taps")
    if taps != sorted(set(taps)):
        raise ConversionError(f"tap layer ids {taps} must be distinct and ascending")
    if taps and (taps[0] < 0 or taps[-1] >= num_layers):
        raise ConversionError(f"tap layer ids {taps} must lie in [0, {num_layers - 1}] for a verifier with {num_layers} layers")
    return taps


def read_taps(cfg: dict[str, Any], opts: Options, num_layers: int, notes: list[str], default: Callable[[int], list[int]]) -> list[int]:
    """The tap ids written to the output, in vLLM's convention: id ``j`` taps the residual stream
    *entering* verifier layer ``j`` (``hidden_states + residual`` before layer ``j``), i.e. HF's
    ``output_hidden_states[j]``; the default is (2, N//2, N-3). The two conventions, and their
    sources, are in the module docstring.

    Rule: ids from a research config are read as ``opts.tap_ids`` says (``layer-output``: written
    ``+1``; ``layer-input``: written as given). Without ``--tap-ids``, ``--aux-layers`` (always vLLM's
    ids) picks the reading it equals; with neither, the conversion is refused naming both readings.
    Ids from a speculators config are vLLM's; a source without ids gets ``--aux-layers`` or the default.
    ``--aux-layers`` must always equal the ids as read. ``specfmt validate --run`` tries the ±1
    misreadings, which shows whether the chosen reading is the one the draft was trained on.

    Args:
        cfg: the research config (a speculators config is marked with :data:`SPECULATORS_TAPS` by the converter's ``from_speculators``).
        opts: ``aux_layers`` (vLLM ids) and ``tap_ids`` (a key of :data:`TAP_READINGS`).
        num_layers: N, the verifier's decoder layers.
        notes: the plan's notes; the reading used is recorded there.
        default: ``default(N)``, the ids when neither the source nor ``--aux-layers`` names any (EAGLE-3: ``default_taps``).

    Returns:
        The tap ids, distinct and ascending, each in [0, N-1].

    Raises:
        InputError: ``--tap-ids`` is not a key of :data:`TAP_READINGS`.
        ConversionError: ids that are not a list of integers, a research config's ids with
            neither ``--tap-ids`` nor ``--aux-layers``, ``--tap-ids`` with a source whose ids are
            fixed or absent that contradicts it, ``--aux-layers`` that contradicts the ids as read,
            or ids not distinct, ascending and within the verifier.
    """
    key, ids = source_taps(cfg)
    if opts.tap_ids is not None and opts.tap_ids not in TAP_READINGS:
        raise InputError(f"--tap-ids must be {' or '.join(TAP_READINGS)}, not {opts.tap_ids!r}")
    if ids is None:
        taps = _taps_absent(opts, num_layers, notes, default)
    elif cfg.get(SPECULATORS_TAPS) is True:
        taps = _taps_fixed(ids, opts.tap_ids)
    else:
        taps = _taps_read(key, ids, opts, notes)
    return _check_taps(taps, opts.aux_layers, num_layers)


def read_output_taps(key: str, ids: list[int], opts: Options, num_layers: int, notes: list[str], why: str) -> list[int]:
    """Ids that the source's own code reads as layer outputs (``why`` names that code, e.g. z-lab's and SpecForge's DFlash
    ``extract_context_feature``: ``hidden_states[id + 1]``), so no ``--tap-ids`` is needed: vLLM's ids are ``id + 1``.

    Raises:
        ConversionError: ``--tap-ids layer-input``, ``--aux-layers`` other than the ids as read, or ids not distinct,
            ascending and within the verifier (:func:`read_taps`' checks).
    """
    if opts.tap_ids not in (None, "layer-output"):
        raise ConversionError(f"--tap-ids {opts.tap_ids} contradicts {why}, which reads layer outputs", where="config.json", hint="drop --tap-ids")
    taps = [i + TAP_READINGS["layer-output"] for i in ids]
    notes.append(f"{key} {ids} are layer outputs ({why}): vLLM tap ids {taps}")
    return _check_taps(taps, opts.aux_layers, num_layers)


def describe_taps(ids: Any) -> Any:
    """``inspect``'s tap figure: a research config's ids with both readings (:func:`read_taps`)."""
    if not ids:
        return "not given (reference default 2, N//2, N-3)"
    if _is_ids(ids):
        return f"{ids} (layer outputs: vLLM ids {[i + 1 for i in ids]}; layer inputs: {ids}; convert needs --tap-ids)"
    return ids
