"""Where and in what precision the verifier runs: ``--device``, ``--verifier-dtype``, ``--device-map``.

``validate --run`` and ``train`` both load the verifier (a transformers causal LM) once per
command (:meth:`specfmt.sources.verifier.Verifier.load_model`); a :class:`Placement` says how:

* ``device``: ``cpu``, ``cuda`` or ``cuda:N``; default CUDA when ``torch.cuda.is_available()``.
* ``dtype``: the verifier's run dtype; default ``bfloat16`` on a GPU (what vLLM serves an 8B-70B
  verifier in: its ``dtype="auto"`` takes the checkpoint's bf16), ``float32`` on the CPU (so the
  shipped example's figures stay exactly those of ``examples/world/world.json``); ``bfloat16`` is
  available on the CPU too.
* ``device_map``: ``"auto"`` (also ``balanced``, ``balanced_low_0``, ``sequential``) spreads the
  verifier's layers over every visible GPU with accelerate (transformers' ``from_pretrained(...,
  device_map=...)``), for a verifier that does not fit one GPU; ``max_memory`` caps each device
  (``{0: "70GiB", 1: "70GiB"}``). Without it the whole model is loaded straight onto ``device``
  (``device_map={"": device}``: no staging copy in CPU memory).

Every choice is checked before anything is read (:func:`resolve_placement`), so a bad option is
one line (:class:`specfmt.errors.InputError`), not a CUDA traceback minutes later.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ..errors import InputError

#: run dtypes of the verifier, by the names the options accept (aliases on the right)
DTYPE_ALIASES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
                 "float16": "float16", "fp16": "float16", "half": "float16"}
#: accelerate's placement strategies transformers accepts as a string ``device_map``
DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")
_DEVICE = re.compile(r"^(cpu|cuda(:\d+)?)$")


def _cuda_index(device: str) -> int:
    return int(device.split(":")[1]) if ":" in device else 0


@dataclass(frozen=True)
class Placement:
    """How the verifier is loaded and run.

    Attributes:
        device: ``cpu`` or ``cuda[:N]``: where inputs go and where the draft runs (with a
            ``device_map``, the device of the verifier's first layers).
        dtype: ``float32``, ``bfloat16`` or ``float16``: the verifier's weights and activations.
        device_map: None (the whole model on ``device``) or an accelerate strategy (``auto`` ...).
        max_memory: per-device caps for ``device_map`` (``{0: "70GiB", "cpu": "100GiB"}``), or None.
    """

    device: str = "cpu"
    dtype: str = "float32"
    device_map: str | None = None
    max_memory: dict[Any, str] | None = field(default=None, hash=False)

    @property
    def torch_dtype(self) -> Any:
        import torch

        return getattr(torch, self.dtype)

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def cuda_index(self) -> int:
        """N of ``cuda:N`` (0 for ``cuda``)."""
        return _cuda_index(self.device)

    @property
    def autocast(self) -> bool:
        """The draft trains under ``torch.autocast(dtype)`` (fp32 master weights): a 16-bit verifier."""
        return self.dtype != "float32"

    def from_pretrained_kwargs(self) -> dict[str, Any]:
        """What :meth:`specfmt.sources.verifier.Verifier.load_model` passes to ``from_pretrained``: the dtype and the
        placement (weights read straight onto their device, one tensor at a time: :func:`specfmt.sources.verifier.lazy_weights`)."""
        kw: dict[str, Any] = {"dtype": self.torch_dtype}
        if self.device_map is not None:
            kw["device_map"] = self.device_map
            if self.max_memory:
                kw["max_memory"] = dict(self.max_memory)
        elif self.is_cuda:
            kw["device_map"] = {"": self.device}
        return kw

    def to_json(self) -> dict[str, Any]:
        return {"device": self.device, "dtype": self.dtype, "device_map": self.device_map,
                "max_memory": {str(k): v for k, v in self.max_memory.items()} if self.max_memory else None}


def parse_max_memory(text: str | None) -> dict[Any, str] | None:
    """``"0=70GiB,1=70GiB,cpu=100GiB"`` -> ``{0: "70GiB", 1: "70GiB", "cpu": "100GiB"}`` (accelerate's ``max_memory``).

    Raises:
        InputError: not a comma-separated list of ``DEVICE=SIZE``.
    """
    if text is None:
        return None
    out: dict[Any, str] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        key, sep, size = part.partition("=")
        key, size = key.strip(), size.strip()
        if not sep or not re.fullmatch(r"\d+(\.\d+)?\s*([KMGT]i?B|B)?", size, re.I) or not (key.isdigit() or key in ("cpu", "disk")):
            raise InputError(f"--max-memory {text!r}: expected DEVICE=SIZE pairs, e.g. 0=70GiB,1=70GiB,cpu=100GiB")
        out[int(key) if key.isdigit() else key] = size
    return out or None


def resolve_placement(device: str | None = None, dtype: str | None = None, device_map: str | None = None,
                      max_memory: dict[Any, str] | str | None = None) -> Placement:
    """Check the options and fill the defaults.

    Args:
        device: ``cpu``, ``cuda``, ``cuda:N`` or None (CUDA when available, else the CPU).
        dtype: a name of :data:`DTYPE_ALIASES` or None (bf16 on a GPU, float32 on the CPU).
        device_map: None or one of :data:`DEVICE_MAPS`.
        max_memory: per-device caps (a dict, or the ``--max-memory`` text); only with ``device_map``.

    Returns:
        A :class:`Placement`.

    Raises:
        InputError: an unknown device, dtype or device map; CUDA asked for where torch sees no
            GPU (or fewer than N+1); ``device_map`` without accelerate installed; ``max_memory``
            without ``device_map``.
    """
    import torch

    if device is not None and not _DEVICE.match(device):
        raise InputError(f"unknown --device {device!r}", hint="use cpu, cuda or cuda:N")
    cuda = torch.cuda.is_available()
    if device is None:
        device = "cuda" if cuda else "cpu"
    if device.startswith("cuda"):
        if not cuda:
            raise InputError(f"--device {device}: torch {torch.__version__} sees no CUDA device"
                             + (" (a CPU-only build)" if torch.version.cuda is None else ""),
                             hint="use --device cpu, or install a CUDA build of torch on a machine with a GPU")
        if _cuda_index(device) >= torch.cuda.device_count():
            raise InputError(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) are visible", hint="use cuda:0 ... cuda:N-1")
    if dtype is not None and dtype not in DTYPE_ALIASES:
        raise InputError(f"unknown --verifier-dtype {dtype!r}", hint="use float32, bfloat16 or float16")
    run_dtype = DTYPE_ALIASES[dtype] if dtype is not None else ("bfloat16" if device.startswith("cuda") else "float32")
    if isinstance(max_memory, str):
        max_memory = parse_max_memory(max_memory)
    if device_map is not None:
        if device_map not in DEVICE_MAPS:
            raise InputError(f"unknown --device-map {device_map!r}", hint=f"use {', '.join(DEVICE_MAPS)}")
        import importlib.util

        if importlib.util.find_spec("accelerate") is None:
            raise InputError(f"--device-map {device_map} needs accelerate", hint="pip install accelerate")
    elif max_memory:
        raise InputError("--max-memory caps the devices of --device-map; give --device-map auto too")
    return Placement(device=device, dtype=run_dtype, device_map=device_map, max_memory=max_memory or None)


def plan_device_map(config: Any, max_memory: dict[Any, str], no_split: list[str] | None = None, dtype: str = "bfloat16") -> dict[str, Any]:
    """Where ``device_map="auto"`` would put each module of a verifier, computed without weights or GPUs.

    The model is built on the ``meta`` device (``accelerate.init_empty_weights``) and handed to
    ``accelerate.infer_auto_device_map`` with ``max_memory`` -- what ``from_pretrained(device_map="auto",
    max_memory=...)`` does before it reads a byte. Useful to see a split before renting the GPUs.

    Args:
        config: the verifier's transformers config.
        max_memory: per-device caps, e.g. ``{0: "20GiB", 1: "20GiB"}``.
        no_split: module classes kept whole (default: the model's ``_no_split_modules``, its decoder layer).
        dtype: the run dtype the sizes are counted in.

    Returns:
        ``{module name: device}``.
    """
    import torch
    from accelerate import infer_auto_device_map, init_empty_weights
    from transformers import AutoModelForCausalLM

    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    if model.config.tie_word_embeddings:
        model.tie_weights()
    return infer_auto_device_map(model, max_memory=max_memory, no_split_module_classes=no_split or list(model._no_split_modules or []),
                                 dtype=getattr(torch, dtype))


__all__ = ["DEVICE_MAPS", "DTYPE_ALIASES", "Placement", "parse_max_memory", "plan_device_map", "resolve_placement"]
