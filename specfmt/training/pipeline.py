"""``specfmt train``: build a draft (new, or read from any source), fill its gaps, train it, write it, check it.

The pipeline behind the CLI, one request at a time; what differs per algorithm is asked of
the algorithm's training part (:class:`specfmt.algorithms.base.Training`), which receives the
algorithm's own options as one typed object (:class:`~specfmt.algorithms.base.AlgorithmOptions`):

1. the draft: read into memory with :func:`specfmt.convert.load_draft` (``--init``: a specfmt
   folder, or a research checkpoint through its converter, no temporary folder), or a new
   config for the verifier (:meth:`~specfmt.algorithms.base.Training.new_config`) initialised
   as the references do (:meth:`~specfmt.algorithms.base.Training.new_draft`);
2. fill-ins (``fill_vocab``, ``fill_embed``, ``fill_heads``): ``d2t``/``t2d`` from the data,
   embeddings and heads copied from the verifier, Medusa heads added;
3. training (:func:`specfmt.training.loop.fit`) unless ``steps`` is 0 or it is a dry run, with
   the state saved next to OUT (``OUT.train-state/``) for ``--resume``; a held-out share of the data
   (:func:`heldout_share`) is evaluated during training and the best evaluation's weights are written;
4. the draft written atomically in the specfmt format (:func:`specfmt.draft.save_draft`);
5. a short validation run: the static checks and the reference run of
   :func:`specfmt.validation.run.validate_run` (no vLLM), its figures written to
   ``validation.json``.

Under ``torchrun`` every process trains on its own windows through
``DistributedDataParallel``; process 0 alone writes.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ..algorithms import find, get, trainable
from ..algorithms.base import AlgorithmOptions, Training
from ..checkpoint.output import Input, check_output, real_path
from ..convert import load_draft
from ..converters import get as converter
from ..draft import save_draft
from ..format.draft import Draft
from ..errors import InputError
from ..sources.verifier import Verifier
from ..sources.placement import Placement, resolve_placement
from ..validation.acceptance import input_device
from .data import FeatureCache, FrozenEnds, HeldOut, VerifierTop1, Windows, read_documents
from .hsdata import HiddenStateBatches, HiddenStateHeldOut, hidden_state_documents
from .loop import SCHEDULES, fit
from .optim import OPTIMIZERS

if TYPE_CHECKING:  # pragma: no cover
    from ..validation.run import RunResult
    from .loop import Evaluation, TrainOptions, TrainStats


@dataclass(init=False)
class TrainRequest:
    """What ``specfmt train`` was asked to do.

    Attributes:
        algorithm: ``eagle3``, ``eagle`` or ``medusa``; None takes the ``init`` draft's.
        out: output folder.
        verifier: folder or Hub id.
        data: training data files (:func:`specfmt.training.data.read_documents`).
        init: a draft to start from (specfmt folder or research checkpoint); None: new.
        source_format: ``--from`` of ``init``.
        fill_only: fill the gaps and write, no training (``specfmt train fill``).
        dry_run: write the initialised draft, no training.
        options: the algorithm's own options: its :class:`~specfmt.algorithms.base.AlgorithmOptions`
            (``Eagle3Options(draft_vocab=1024)``), or their values by field name (``{"heads": 5}``), checked
            once the algorithm is known (:meth:`~specfmt.algorithms.base.Training.parse_options`); None:
            the defaults. The constructor takes any other keyword as such a value
            (``TrainRequest(out, verifier, algorithm="eagle3", draft_vocab=1024)``).
        embed: copy the verifier's embedding into the draft (``embed_tokens.weight``).
        lm_heads: Medusa: give shared-head drafts per-head ``lm_heads``.
        vocab_map: build ``d2t``/``t2d`` (default: when the draft needs and lacks them).
        speculative_tokens: k written into the config (default: the draft's, else 3 / K).
        device: ``cpu``, ``cuda``, ``cuda:N`` or None (CUDA when available).
        verifier_dtype: the verifier's run dtype (None: bf16 on a GPU, float32 on the CPU); a
            16-bit verifier trains the draft under ``torch.autocast`` with float32 master weights.
        device_map: spread the verifier over the GPUs with accelerate (``auto``); None: all on ``device``.
        max_memory: per-device caps for ``device_map`` (``--max-memory`` text or dict).
        cache: feature cache folder, or None.
        hidden_states: a hidden-states data folder in speculators 0.9's layout (``specfmt datagen``'s or
            speculators' own output; :class:`specfmt.training.hsdata.HiddenStateBatches`): the features and
            loss mask come from it and the verifier's layers are never loaded for training; None: ``data``.
        fill_cache_only: fill ``cache`` with the verifier's features and stop (no draft is
            written); under ``torchrun`` each process fills its own shards.
        resume: continue a saved state.
        dtype: floating dtype of the written tensors (None: the ``init`` draft's, else float32).
        force: replace a non-empty OUT.
        validate: run the short validation at the end.
        prompts: validation prompts file (None: the built-in prompts).
    """

    out: str
    verifier: str
    algorithm: str | None = None
    data: list[str] = field(default_factory=list)
    init: str | None = None
    source_format: str = "auto"
    fill_only: bool = False
    dry_run: bool = False
    options: "AlgorithmOptions | dict[str, Any] | None" = None
    embed: bool = False
    lm_heads: bool = False
    vocab_map: bool | None = None
    speculative_tokens: int | None = None
    device: str | None = None
    verifier_dtype: str | None = None
    device_map: str | None = None
    max_memory: Any = None
    cache: str | None = None
    hidden_states: str | None = None
    fill_cache_only: bool = False
    resume: bool = False
    dtype: str | None = None
    force: bool = False
    validate: bool = True
    prompts: str | None = None

    def __init__(self, out: str, verifier: str, options: "AlgorithmOptions | dict[str, Any] | None" = None, **kwargs: Any) -> None:
        for f in fields(self):
            if f.name not in ("out", "verifier", "options"):
                setattr(self, f.name, kwargs.pop(f.name) if f.name in kwargs else f.default_factory() if f.default is MISSING else f.default)  # type: ignore[misc]
        if kwargs and isinstance(options, AlgorithmOptions):
            raise TypeError("give the algorithm's options as an options object or as keywords, not both")
        self.out, self.verifier = out, verifier
        self.options = {**(options or {}), **kwargs} if kwargs or not isinstance(options, AlgorithmOptions) else options


@dataclass
class TrainResult:
    """What a training request produced (process 0; other processes get ``out`` None)."""

    out: Path | None
    draft: "Draft"
    filled: dict[str, str]
    trained: list[str]
    stats: "TrainStats | None"
    validation: "RunResult | None" = None
    notes: list[str] = field(default_factory=list)
    placement: "Placement | None" = None
    cache_filled: str | None = None


def state_dir(out: str | Path) -> Path:
    """Where the training state of OUT is kept between runs (``OUT.train-state``)."""
    p = real_path(out)
    return p.parent / f"{p.name}.train-state"


#: the options the provenance block records besides the shared ones, with their values for an algorithm without
#: them: format v1 records ``ttt_steps`` and ``noise`` for every draft (read by no one; kept so that a draft's
#: ``config.json`` is byte-identical to what specfmt wrote before each algorithm declared its own options)
_RECORDED_OPTIONS: dict[str, Any] = {"ttt_steps": 3, "noise": 0.0}


def _options_record(opts: "TrainOptions", options: AlgorithmOptions) -> dict[str, Any]:
    """``specfmt.train.options`` of a trained draft's provenance: the shared options in their order, with
    :data:`_RECORDED_OPTIONS` after ``warmup`` (the algorithm's own value of each when it declares one)."""
    shared = vars(opts)
    keys = list(shared)
    at = keys.index("warmup") + 1
    extra = {k: getattr(options, k, default) for k, default in _RECORDED_OPTIONS.items()}
    own = {f.name: getattr(options, f.name) for f in options.declared() if f.metadata.get("recorded")}  # after the shared ones
    return {**{k: shared[k] for k in keys[:at]}, **extra, **{k: shared[k] for k in keys[at:]}, **own}


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _init_distributed(req: TrainRequest) -> tuple[int, int, "Placement"]:
    """Check the placement options and join the ``torchrun`` process group when there is one;
    returns ``(rank, world, placement)``: under torchrun on GPUs each process takes ``cuda:LOCAL_RANK``
    (NCCL), on the CPU gloo.

    Raises:
        InputError: as :func:`specfmt.sources.placement.resolve_placement`; ``--device-map`` under torchrun
            (one verifier per process cannot also be spread over every GPU).
    """
    import torch.distributed as dist

    placement = resolve_placement(req.device, req.verifier_dtype, req.device_map, req.max_memory)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        if placement.device_map is not None:
            raise InputError("--device-map spreads one verifier over the GPUs; under torchrun each process loads its own",
                             hint="run one process with --device-map auto, or torchrun without it")
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if placement.is_cuda:
            import torch

            placement = replace(placement, device=f"cuda:{local}")
            torch.cuda.set_device(local)
        if not dist.is_initialized():
            dist.init_process_group("nccl" if placement.is_cuda else "gloo")
        return dist.get_rank(), world, placement
    return 0, 1, placement


@dataclass
class _Job:
    """One request on its way: what its steps share."""

    req: TrainRequest
    opts: "TrainOptions"
    verifier: Verifier
    placement: Placement
    rank: int
    world: int
    say: Callable[[str], None]
    docs: Any = None
    notes: list[str] = field(default_factory=list)
    heldout: float = 0.0
    evaluated: Any = None
    model: Any = None
    split: Any = None  # (training documents, held-out windows or None) of a --data run without --cache (:func:`_split`)

    @property
    def doc_ids(self) -> list[list[int]] | None:
        return self.docs.ids if self.docs is not None else None

    @property
    def train_ids(self) -> list[list[int]] | None:
        """The documents the draft trains on (a draft vocabulary is counted over them): the held-out ones left out."""
        return self.split[0] if self.split is not None else self.doc_ids


def _trainer(name: str) -> Training:
    """The training part of algorithm ``name``.

    Raises:
        InputError: no such algorithm, or one ``specfmt train`` cannot train.
    """
    algo = get(name)
    if algo.training is None or algo.reference is None:  # training runs the reference part's module
        raise InputError(f"{name} drafts cannot be trained by this specfmt", hint=f"train {_names()}")
    return algo.training


def _check_init_algorithm(found: str, asked: str | None, what: str) -> None:
    """A ``--init`` draft of algorithm ``found`` for ``specfmt train asked`` (None: ``train fill``, any trainable one).

    Raises:
        InputError: ``found`` is not ``asked``, or no ``specfmt train`` command trains it; the hint names only
            commands that exist (the trainable algorithms: :func:`specfmt.algorithms.trainable`), never one
            built from the draft's name (issue 35).
    """
    names = [a.name for a in trainable()]
    if found not in names:
        algo = find(found)
        title = algo.title if algo is not None else found
        raise InputError(f"{what} is a {title} draft; this specfmt does not train {title} drafts",
                         hint=f"it trains {_names()} drafts, e.g. a new one for the same verifier with `specfmt train {names[0]}`; "
                              f"a {title} draft is converted (`specfmt convert`) and served as it is")
    if asked is not None and found != asked:
        raise InputError(f"{what} is a {found} draft, not {asked}", hint=f"use `specfmt train {found}`")


def _names() -> str:
    names = [a.name for a in trainable()]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def _read_data(job: _Job, training: bool) -> Any:
    """The training data as token ids (None without ``--data``).

    Raises:
        InputError: training without data, or unreadable data (:func:`specfmt.training.data.read_documents`).
    """
    if job.req.hidden_states:
        job.say(f"reading the hidden-states data {job.req.hidden_states}")
        return hidden_state_documents(Path(job.req.hidden_states))
    if job.req.data:
        job.say("reading the training data")
        return read_documents(job.req.data, job.verifier.tokenizer())
    if training:
        raise InputError("training needs data", hint="pass --data FILE (text, or jsonl with \"text\" or \"messages\")")
    return None


def _read_init(job: _Job) -> tuple[Draft, Training, AlgorithmOptions, dict[str, str], dict[str, Any]]:
    """The ``--init`` draft read into memory, held to the options, and filled in:
    ``(draft, its algorithm's training part, the options, filled, the config as read)``."""
    req = job.req
    job.say(f"reading the draft {req.init}")
    draft = load_draft(req.init, source_format=req.source_format, verifier=job.verifier, allow_missing=FILLABLE)
    job.notes += draft.notes
    _check_init_algorithm(draft.algorithm, req.algorithm, "--init")
    req.algorithm = draft.algorithm
    algo = _trainer(draft.algorithm)
    options = algo.settle_options(algo.parse_options(req.options, init=True), counts_only=bool(req.hidden_states), init=True)
    algo.check_draft(draft, options, str(req.init))
    prior: dict[str, Any] = json.loads(json.dumps(draft.config))
    filled = _fill(job, algo, options, draft)
    if req.dtype is not None:
        for block in (draft.config, draft.config["transformer_layer_config"]):
            if "dtype" in block:
                block["dtype"] = req.dtype
    return draft, algo, options, filled, prior


def _new_draft(job: _Job) -> tuple[Draft, Training, AlgorithmOptions, dict[str, str], None]:
    """A new draft for the verifier, initialised as the reference trainers do: ``(draft, training part, options, filled, None)``."""
    req = job.req
    if req.fill_only:
        raise InputError("nothing to fill: no --init draft")
    algo = _trainer(str(req.algorithm))
    options = algo.settle_options(algo.parse_options(req.options, init=False), counts_only=bool(req.hidden_states), init=False)
    shape = algo.new_shape(replace(options, speculative_tokens=req.speculative_tokens, dtype=req.dtype or "float32"))
    cfg = algo.new_config(job.verifier, shape)
    docs = _vocab_docs(job, algo, options, cfg)
    tensors, filled = algo.new_draft(cfg, job.verifier, docs)
    job.notes += getattr(docs, "notes", [])
    job.notes.append(f"new {algo.name} draft for {req.verifier}")
    return Draft(cfg, tensors), algo, options, filled, None


def _fill(job: _Job, algo: Training, options: AlgorithmOptions, draft: Draft) -> dict[str, str]:
    """The fill-ins a draft read from ``--init`` gets."""
    req = job.req
    filled: dict[str, str] = {}
    cfg = draft.config
    docs = _vocab_docs(job, algo, options, cfg)
    filled.update(algo.fill_vocab(draft, wanted=req.vocab_map, docs=docs))
    job.notes += getattr(docs, "notes", [])
    if req.embed:
        filled.update(algo.fill_embed(draft, job.verifier))
    filled.update(algo.fill_heads(draft, job.verifier, options, lm_heads=req.lm_heads, fill_only=req.fill_only))
    if req.speculative_tokens is not None:
        limit = get(draft.algorithm).speculative_token_limit(cfg)
        if limit is not None and req.speculative_tokens > limit[0]:
            raise InputError(f"--speculative-tokens {req.speculative_tokens} is more than the {limit[0]} {algo.title} {limit[1]}")
        cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] = req.speculative_tokens
    return filled


def _vocab_docs(job: _Job, algo: Training, options: AlgorithmOptions, cfg: dict[str, Any]) -> Any:
    """What a draft vocabulary is counted over: the data's token ids (or counts), or the verifier's top-1
    predictions over them (:class:`specfmt.training.data.VerifierTop1`, computed only if a map is built; from
    the ``--cache`` when it is complete)."""
    if job.train_ids is None or not algo.vocab_from_verifier(options):
        return job.train_ids
    opts = job.opts

    def load() -> Any:
        job.say("counting the verifier's top-1 predictions over the training positions (draft vocabulary)")
        return _verifier_model(job)

    cache = None
    if job.req.cache:
        windows = Windows(job.train_ids, opts.seq_len, opts.batch_size, opts.seed, fixed=True)
        cache = FeatureCache(job.req.cache, _cache_key(job, windows, algo.feature_taps(cfg)))
    return VerifierTop1(load, job.train_ids, opts.seq_len, opts.batch_size, cache=cache,
                        ends=lambda: FrozenEnds.from_verifier(job.verifier, job.placement))


def _cache_key(job: _Job, windows: Any, taps: list[int]) -> dict[str, Any]:
    """What a ``--cache`` folder's features are valid for (:class:`specfmt.training.data.FeatureCache`)."""
    return {"verifier": job.req.verifier, "verifier_config": _digest(job.verifier.config),
            "data": windows.digest(), "seq_len": job.opts.seq_len, "taps": taps, "dtype": job.placement.dtype}


def _verifier_model(job: _Job) -> Any:
    """The verifier, loaded once per request (the draft vocabulary and the training share it)."""
    if job.model is None:
        job.model = _load_verifier(job.verifier, job.placement, job.say)
    return job.model


def _load_verifier(verifier: Verifier, placement: "Placement", say: Callable[[str], None]) -> Any:
    where = f"{placement.device_map} device map" if placement.device_map else placement.device
    say(f"loading the verifier {verifier.name_or_path} on {where} in {placement.dtype}")
    return verifier.load_model(placement)


def _module(draft: Draft, device: Any) -> Any:
    """The draft's module (its algorithm's :meth:`~specfmt.algorithms.base.Reference.module`), float32 on ``device``."""
    import torch

    tensors = {n: t.float() if t.is_floating_point() else t for n, t in draft.tensors.items()}
    module = get(draft.algorithm).reference.module(draft.config, tensors).to(device, torch.float32)  # type: ignore[union-attr]
    if module.embed_tokens is not None:
        module.embed_tokens = module.embed_tokens.float().to(device)
    return module


def check_request(req: TrainRequest) -> AlgorithmOptions | None:
    """Option checks that need no file (they fail before anything is read).

    Returns:
        The algorithm's options, checked, when the request names the algorithm; None when it is the
        ``--init`` draft's (its options are checked once the draft is read).

    Raises:
        InputError: options that contradict each other or the algorithm.
    """
    names = [a.name for a in trainable()]
    if req.algorithm is not None and req.algorithm not in names:
        raise InputError(f"unknown algorithm {req.algorithm!r}", hint=f"train {_names()}")
    if req.algorithm is None and req.init is None:
        raise InputError("no algorithm and no --init draft to take it from")
    if req.dtype not in (None, "float16", "bfloat16", "float32"):
        raise InputError(f"--dtype must be float16, bfloat16 or float32, not {req.dtype!r}")
    if req.init is not None and req.source_format not in ("auto", "specfmt"):
        written = converter(req.source_format).algorithm  # an unknown --from fails here
        if written is not None:
            _check_init_algorithm(written, req.algorithm, f"--from {req.source_format}")
    options = _trainer(req.algorithm).parse_options(req.options, init=req.init is not None) if req.algorithm else None
    if options is not None:
        options = _trainer(req.algorithm).settle_options(options, counts_only=bool(req.hidden_states),
                                                            init=req.init is not None)
    if req.cache and req.fill_only:
        raise InputError("--cache has no use without training")
    if req.hidden_states and (req.data or req.cache):
        raise InputError("--hidden-states is the training data, with the verifier's features: it goes with neither --data nor --cache",
                         hint="give --hidden-states DIR alone, or --data FILE (with --cache DIR)")
    if req.fill_cache_only and not req.cache:
        raise InputError("--fill-cache-only fills a --cache folder", hint="give --cache DIR")
    if req.fill_cache_only and (req.dry_run or req.fill_only or req.resume):
        raise InputError("--fill-cache-only computes the verifier's features only; it does not go with --dry-run or --resume")
    if req.resume and (req.dry_run or req.fill_only):
        raise InputError("--resume continues training; it does not go with --dry-run")
    return options


def request_inputs(req: TrainRequest, verifier: Verifier) -> list[Input]:
    """Every input of a training request, for the output check (:func:`specfmt.checkpoint.output.check_output`):
    the verifier, the draft read (``--init``; ``SRC`` of ``train fill``), each ``--data`` file, the
    ``--prompts`` file and the ``--cache`` folder. A Hub id is resolved here, so that its folder in
    the Hugging Face cache is known before anything is read.

    Raises:
        InputError, HubError: ``--init`` is neither a folder nor a reachable Hub id.
    """
    from ..convert import SOURCE_PATTERNS
    from ..sources.resolve import resolve

    found = Input.of("--verifier", verifier.ref, verifier.resolved)
    if req.init is not None:
        label = "SRC" if req.fill_only else "--init"
        local = Path(req.init).expanduser().exists()
        found += Input.of(label, req.init, None if local else resolve(req.init, allow_patterns=SOURCE_PATTERNS, what="source"))
    for path in req.data:
        found += Input.of("--data", path)
    found += Input.of("--prompts", req.prompts)
    found += Input.of("--cache", req.cache)
    found += Input.of("--hidden-states", req.hidden_states)
    return found


def train_draft(req: TrainRequest, opts: "TrainOptions", *, log: Callable[[int, float, list[float]], None] | None = None,
                status: Callable[[str], None] | None = None, evaluated: "Callable[[Evaluation], None] | None" = None) -> TrainResult:
    """Run a :class:`TrainRequest`.

    Args:
        req: what to do.
        opts: the shared training hyper-parameters (the algorithm's own options are ``req.options``).
        log: per-step callback (process 0), as for :func:`specfmt.training.loop.fit`.
        status: called with one-line phase messages ("reading data", ...).
        evaluated: called (process 0) with each held-out :class:`~specfmt.training.loop.Evaluation` (``opts.heldout``,
            :func:`heldout_share`).

    Returns:
        :class:`TrainResult`.

    Raises:
        InputError, HubError, ConversionError: bad inputs; nothing is written.
        OutputExistsError: OUT is not empty and ``force`` is not set.
        OutputOverlapError: OUT is, lies inside or contains an input (:func:`request_inputs`;
            ``force`` does not lift it); checked before anything is read but the verifier's config.
        TrainInterrupted: Ctrl-C during training (the state is saved).
    """
    import torch.distributed as dist

    check_request(req)
    out = real_path(req.out)
    if opts.steps < 0 or opts.batch_size < 1 or opts.seq_len < 2 or (opts.lr is not None and opts.lr <= 0):
        raise InputError("--steps must be >= 0, --batch-size >= 1, --seq-len >= 2 and --lr > 0")
    if opts.optimizer is not None and opts.optimizer not in OPTIMIZERS:
        raise InputError(f"--optimizer must be {' or '.join(OPTIMIZERS)}, not {opts.optimizer!r}")
    if opts.schedule is not None and opts.schedule not in SCHEDULES:
        raise InputError(f"--schedule must be {' or '.join(SCHEDULES)}, not {opts.schedule!r}")
    if opts.eval_every is not None and opts.eval_every < 1:
        raise InputError(f"--eval-every must be at least 1, not {opts.eval_every}")
    heldout_share(req, opts, HELDOUT_MIN_DOCS)  # an explicit --heldout is checked before anything is read
    ours = not (dist.is_available() and dist.is_initialized())
    rank, world, placement = _init_distributed(req)
    try:
        return _train(req, opts, out, rank, world, placement, log, status, evaluated)
    finally:
        # a process group left to the interpreter's exit aborts a gloo process now and then
        # ("terminate called without an active exception", SIGABRT): every process takes its own down
        if world > 1 and ours and dist.is_initialized():
            dist.destroy_process_group()


def _train(req: TrainRequest, opts: "TrainOptions", out: Path, rank: int, world: int, placement: "Placement",
           log: Callable[[int, float, list[float]], None] | None, status: Callable[[str], None] | None, evaluated: Any = None) -> TrainResult:
    """:func:`train_draft` once the process group (under torchrun) is up."""
    import torch

    device = torch.device(placement.device)
    torch.manual_seed(opts.seed)
    verifier = Verifier.load(req.verifier)  # resolved once: data, fill-ins, training and the validation run share it
    inputs = request_inputs(req, verifier)
    check_output(out, req.force, inputs)
    req.verifier = verifier.name_or_path
    job = _Job(req, opts, verifier, placement, rank, world, status or (lambda msg: None), evaluated=evaluated)
    training = not (req.fill_only or req.dry_run) and (opts.steps > 0 or req.fill_cache_only)
    job.docs = _read_data(job, training)
    if training and not req.fill_cache_only:
        job.heldout, note = heldout_share(req, opts, len(job.docs.ids) if not req.hidden_states else 0)
        job.notes += [note] if note else []
        if not (req.cache or req.hidden_states):  # split before the draft vocabulary is counted: over the training documents only
            job.split = _split(job)
    draft, algo, options, filled, prior = _read_init(job) if req.init is not None else _new_draft(job)
    module = _module(draft, device)
    subset = algo.heads_trained(module, draft.config, prior, options)
    trained = [n for n, p in module.named_parameters() if p.requires_grad]
    stats = None
    if training:
        stats = _fit(job, algo, options, draft, module, device, subset, state_dir(out), log)
        if stats is None:  # --fill-cache-only
            return TrainResult(None, draft, {}, [], None, notes=job.notes, placement=placement, cache_filled=str(req.cache))
    tensors = {n: t.detach().cpu() for n, t in module.state_dict().items()}
    if module.embed_tokens is not None:
        tensors["embed_tokens.weight"] = module.embed_tokens.detach().cpu()
    draft.tensors = tensors  # a vocabulary map is among the module's buffers
    result = TrainResult(None, draft, filled, trained if training else [], stats, notes=job.notes, placement=placement)
    if rank != 0:
        return result
    return _write(job, result, out, inputs, options, training)


def _fit(job: _Job, algo: Training, options: AlgorithmOptions, draft: Draft, module: Any, device: Any, subset: list[int] | None,
         sdir: Path, log: Callable[[int, float, list[float]], None] | None) -> "TrainStats | None":
    """Train ``module`` in place (:func:`specfmt.training.loop.fit`), the verifier's features computed on the
    fly or read from the ``--cache`` folder (filled first when it is not complete); None after ``--fill-cache-only``."""
    import torch.distributed as dist

    job.opts = job.opts.resolved(draft.algorithm)  # the values trained with are the ones the provenance block records
    req, opts, say, placement = job.req, job.opts, job.say, job.placement
    taps = algo.feature_taps(draft.config)
    cache = model = heldout = None
    if req.hidden_states:
        # the features are on disk, the last layer before the norm: the verifier's two ends and its final norm only
        say(f"reading the features from {req.hidden_states}; the verifier's embedding, lm_head and final norm only ({placement.dtype})")
        model = FrozenEnds.from_verifier(job.verifier, placement, norm=True)
        windows: Any = HiddenStateBatches(req.hidden_states, opts.seq_len, opts.batch_size, opts.seed, taps=taps,
                                          n_layers=job.verifier.info.num_hidden_layers, norm=model.norm, dtype=placement.torch_dtype,
                                          world=job.world, rank=job.rank, heldout=job.heldout)
        heldout = HiddenStateHeldOut(windows, windows.held[:EVAL_WINDOWS]) if windows.held else None
    elif req.cache:  # fixed windows: the held-out share is of the windows, whose features the cache holds too
        windows = Windows(job.docs.ids, opts.seq_len, opts.batch_size, opts.seed, fixed=True, world=job.world, rank=job.rank, heldout=job.heldout)
    else:
        train_ids, heldout = job.split or (job.docs.ids, None)
        windows = Windows(train_ids, opts.seq_len, opts.batch_size, opts.seed, world=job.world, rank=job.rank)
    if req.cache:
        cache = FeatureCache(req.cache, _cache_key(job, windows, taps))
        if job.world > 1:  # every process has read the folder before any writes to it
            dist.barrier()
        if not cache.complete:
            model = _fill_cache(job, cache, windows, taps)
        if req.fill_cache_only:
            say(f"the feature cache {req.cache} holds the features of all {windows.n} windows")
            return None
    if cache is not None and windows.held:
        heldout = HeldOut(windows, windows.held[:EVAL_WINDOWS], cache)
    if cache is not None and model is None:
        # the features are on disk: training reads them and never loads the verifier, only its two ends
        say(f"reading the features from {req.cache}; the verifier's embedding and lm_head only ({placement.dtype})")
        model = FrozenEnds.from_verifier(job.verifier, placement)
    elif model is None:
        model = _verifier_model(job)
    where = model.get_output_embeddings().weight.device  # a device map: the draft trains beside the verifier's last layers
    if where != device:
        module.to(where)
        if module.embed_tokens is not None:
            module.embed_tokens = module.embed_tokens.to(where)
    fingerprint = {"algorithm": draft.algorithm, "verifier": req.verifier, "init": req.init, "data": job.docs.files,
                   "draft": _digest(draft.config), "world": job.world, "verifier_dtype": placement.dtype,
                   "options": {**{k: v for k, v in vars(opts).items() if k != "save_every"}, **options.given()}}
    embed = module.embed_tokens  # the draft's own (EAGLE-1; EAGLE-3 with H != H_t), else the verifier's
    trained = [n for n, p in module.named_parameters() if p.requires_grad]
    say(f"training {len(trained)} tensors for {opts.steps} steps of {opts.batch_size} x {opts.seq_len} tokens"
        + (f" on {job.world} processes" if job.world > 1 else "")
        + (f", {placement.dtype} autocast over float32 weights" if placement.autocast else ""))
    return fit(draft.algorithm, module, model, windows, opts, options=options, embed=embed, cache=cache, state_dir=sdir, resume=req.resume,
               fingerprint=fingerprint, subset=subset, log=log, autocast=placement.torch_dtype if placement.autocast else None,
               heldout=heldout, evaluated=job.evaluated)


#: the default held-out share, and the fewest documents it is taken from (fewer: no split, with a note)
HELDOUT_SHARE, HELDOUT_MIN_DOCS = 0.05, 20
#: at most this many held-out windows are evaluated (the first of the fixed held-out windows, or held-out samples with
#: ``--hidden-states``, in order)
EVAL_WINDOWS = 64


def heldout_share(req: TrainRequest, opts: "TrainOptions", n_docs: int) -> tuple[float, str | None]:
    """The share of ``--data`` documents set aside for the held-out evaluation, and a note when there is none.

    ``opts.heldout`` None: :data:`HELDOUT_SHARE` when there are at least :data:`HELDOUT_MIN_DOCS` documents and the data
    is ``--data`` without ``--cache``, else 0 (with a note). With ``--cache`` the share is of the fixed windows, with
    ``--hidden-states`` of the samples (:class:`specfmt.training.hsdata.HiddenStateBatches`), and only when given (a default
    would change what an existing run trains on).

    Raises:
        InputError: ``--heldout`` outside [0, 1).
    """
    share = opts.heldout
    if share is not None and not 0 <= share < 1:
        raise InputError(f"--heldout must be a share in [0, 1), not {share}", hint="e.g. --heldout 0.05")
    if share is not None:
        return share, None
    if req.hidden_states or req.cache:
        flag = "--hidden-states" if req.hidden_states else "--cache"
        return 0.0, f"no held-out split with {flag} by default: the draft is the last step's" + ("" if req.hidden_states else " (give --heldout SHARE)")
    if n_docs < HELDOUT_MIN_DOCS:
        return 0.0, f"no held-out split: {n_docs} documents (fewer than {HELDOUT_MIN_DOCS}); the draft is the last step's"
    return HELDOUT_SHARE, None


def _split(job: _Job) -> tuple[list[list[int]], "HeldOut | None"]:
    """``(training documents, held-out windows or None)``: ``job.heldout`` of the documents (at least one, never all), drawn by a
    permutation seeded by ``--seed``, cut into fixed windows of which the first :data:`EVAL_WINDOWS` are evaluated; the
    rest, in their order, train.

    Raises:
        InputError: fewer than two documents, or held-out documents shorter than two windows (an explicit ``--heldout``
            only; the default then has no split, with a note).
    """
    import torch

    docs, opts = job.docs.ids, job.opts
    if not job.heldout:
        return docs, None
    if len(docs) < 2:
        raise InputError(f"--heldout {opts.heldout} needs at least two documents; the data has {len(docs)}",
                         hint="split the data into documents (one text file or jsonl line each), or pass --heldout 0")
    n = min(len(docs) - 1, max(1, round(job.heldout * len(docs))))
    held = set(torch.randperm(len(docs), generator=torch.Generator().manual_seed(opts.seed)).tolist()[:n])
    tokens = sum(len(docs[i]) for i in held)
    if tokens < 2 * opts.seq_len:
        if opts.heldout is not None:
            raise InputError(f"--heldout {opts.heldout} sets aside {n} documents of {tokens} tokens; --seq-len {opts.seq_len} needs "
                             f"at least {2 * opts.seq_len}", hint="raise --heldout, give more data, or pass --heldout 0")
        job.notes.append(f"no held-out split: {n} of {len(docs)} documents hold {tokens} tokens, under two windows")
        job.heldout = 0.0
        return docs, None
    heldout = Windows([docs[i] for i in sorted(held)], opts.seq_len, opts.batch_size, opts.seed, fixed=True)
    return [d for i, d in enumerate(docs) if i not in held], HeldOut(heldout, list(range(min(heldout.n, EVAL_WINDOWS))))


def _fill_cache(job: _Job, cache: FeatureCache, windows: Windows, taps: list[int]) -> Any:
    """Compute the verifier's features of every window into the cache (each process its share); the verifier loaded."""
    import torch.distributed as dist

    model = _verifier_model(job)
    job.say(f"computing the verifier's features of {windows.n} windows into {job.req.cache}"
            + (f" (process {job.rank} of {job.world})" if job.world > 1 else ""))
    cache.build(windows, model, taps, input_device(model), rank=job.rank, world=job.world)
    if job.world > 1:
        dist.barrier()
        if job.rank == 0:
            cache.mark_complete()
    return model


def _heldout_record(job: _Job, stats: "TrainStats | None") -> dict[str, Any] | None:
    """``specfmt.train.heldout`` of the provenance: the share set aside, which evaluation's weights the draft holds
    (``kept``: best or last) and its figures (:meth:`specfmt.training.loop.Evaluation.to_json`); None without a split."""
    if stats is None or stats.kept is None:
        return None
    return {"share": job.heldout, "evaluations": len(stats.evaluations), "kept_by": "last" if job.opts.keep_last else "best",
            "kept": stats.kept.to_json()}


def _write(job: _Job, result: TrainResult, out: Path, inputs: list[Input], options: AlgorithmOptions, training: bool) -> TrainResult:
    """Process 0: the draft written with its provenance (:func:`specfmt.draft.save_draft`), the saved state
    removed, and the short validation run."""
    req, opts, stats, draft, docs = job.req, job.opts, result.stats, result.draft, job.docs
    provenance = {
        "algorithm": draft.algorithm,
        "init": req.init,
        "filled": result.filled,
        "trained": result.trained,
        "steps": stats.steps + stats.resumed_from if stats else 0,
        "options": _options_record(opts, options) if training else None,
        "data": docs.files if docs else {},
        "tokens": stats.tokens if stats else 0,
        "seconds": round(stats.seconds, 1) if stats else 0,
        "tokens_per_second": round(stats.tokens_per_second, 1) if stats else None,
        "verifier_placement": job.placement.to_json() if training else None,
        "top1_agreement": [round(a, 4) for a in stats.accuracy] if stats else None,
        "top1_agreement_conditional": [round(a, 4) for a in stats.conditional_accuracy] if stats else None,
        "draft_vocab_coverage": [round(a, 4) for a in stats.coverage] if stats else None,
        "heldout": _heldout_record(job, stats),
        "processes": job.world,
        "dry_run": req.dry_run,
    }
    if req.init is None:
        draft.source = {"format": "specfmt-train", "layout": "new draft", "name_or_path": req.verifier, "revision": None,
                        "files": {Path(f).name: h for f, h in (docs.files if docs else {}).items()}}
    result.out = save_draft(out, draft, train=provenance, force=req.force, inputs=inputs)
    sdir = state_dir(out)
    if sdir.exists():
        shutil.rmtree(sdir, ignore_errors=True)
    if req.validate:
        job.say("validating: static checks and the reference run (no vLLM)")
        from ..validation.run import validate_run

        # the verifier loaded for training (if any) is the one the reference run uses: loaded once per command
        result.validation = validate_run(result.out, verifier=job.verifier, prompts=req.prompts, use_vllm=False, placement=job.placement)
    return result


#: tensors a research checkpoint read with ``--init`` may lack: the fill-ins compute them
FILLABLE = frozenset(n for a in trainable() for n in a.training.fillable)  # type: ignore[union-attr]


__all__ = ["EVAL_WINDOWS", "HELDOUT_MIN_DOCS", "HELDOUT_SHARE", "TrainRequest", "TrainResult", "check_request", "heldout_share", "request_inputs",
           "state_dir", "train_draft"]
