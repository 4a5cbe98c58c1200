#!/usr/bin/env python3
"""Head to head: ``specfmt train eagle3`` against speculators 0.9's trainer, same data, vocabulary and budget.

What is shared, and how (issue 27):

* **Data**: the world's training text (``examples/make_world.py`` ``TRAIN_FILES``, the Python
  standard library sources both worlds' verifiers and drafts were trained on), tokenised by the
  verifier's tokenizer as ``specfmt train --data`` reads it (``read_documents``), concatenated and cut
  into windows of ``--seq-len`` tokens (offset 0, the tail dropped), every token under loss. The
  verifier's hidden states of every window are extracted ONCE, by specfmt's datagen Python API
  (the transformers engine, float32: ``specfmt.datagen.hf_engine.TransformersEngine``,
  ``specfmt.datagen.layout``), into one folder in speculators 0.9's layout, at the tap layers of a new
  EAGLE-3 draft (``default_taps``) and the last layer. specfmt reads it with ``--hidden-states``
  (``specfmt/training/hsdata.py``), speculators with ``--data-path``.
* **Draft vocabulary**: ``DIR/token_freq.pt``, which both trainers turn into d2t/t2d
  (speculators: ``train/vocab_mapping.py`` ``build_vocab_mappings_from_distribution``; specfmt:
  ``hidden_state_documents`` -> ``eagle3.vocab_map``). ``--vocab-from verifier`` (default) counts the
  verifier's top-1 prediction at every training position, ``data`` the training tokens (speculators'
  own count). Every token id is in the file, ordered by (-count, id): speculators breaks ties by id,
  specfmt keeps the file's order, so both pick the same ids; the harness asserts that both drafts
  end with identical d2t/t2d.
* **Budget**: ``--steps`` optimizer steps of ``--batch-size x --seq-len`` tokens. specfmt takes
  ``batch_size`` windows of ``seq_len``; speculators packs whole samples into one row of
  ``--total-seq-len`` tokens, given ``batch_size * seq_len``: with samples of exactly ``seq_len``
  tokens that is ``batch_size`` samples, the same tokens per step. speculators' linear schedule is
  given ``--max-steps STEPS``, over which its linear schedule decays (``trainer.py``
  ``_resolve_scheduler_steps``), and ``--train-data-ratio 0.999`` (it refuses 1: two of the samples
  are its validation split, the rest trains); ``--num-layers 1`` (both trainers' EAGLE-3 default,
  stated). Everything else is each trainer's own default (speculators:
  Muon + AdamW, KL loss, norm_before_fc / norm_output on, lm_head frozen; specfmt: whatever
  ``specfmt train eagle3`` defaults to), plus what ``--specfmt-option`` / ``--speculators-arg`` add.
* **Measurement**: each draft in the specfmt format (speculators' checkpoint through
  ``specfmt convert --from speculators``) is run by ``validate_run(max_tokens=32,
  num_speculative_tokens=3, use_vllm=False)`` on the world's held-out ``prompts.jsonl``: the
  reference AL and per-position acceptance. ``--vllm`` adds vLLM's AL (``use_vllm=True``) for the best
  learning rate of each trainer per budget. Tokens/s is the training loop proper: specfmt, trained
  tokens over the wall time between the step callbacks after ``--warmup`` steps; speculators, the
  same tokens over the sum of its profiler's ``step_ms`` (batch fetch to optimizer step, logged every
  step) after the same warmup.

Each run is checkpointed into the results file as it ends (key: world, trainer, steps, lr, vocab,
options, a seed other than the default, and for specfmt the git tree of specfmt/, so new specfmt code or
defaults run again); a run already there is skipped unless ``--force``. ``--paired KEY_A,KEY_B`` trains
nothing: it reruns the reference on two recorded drafts and gives the difference of their AL with a 95 %
interval from a paired bootstrap over the prompts (what 16 prompts can tell apart). One harness per trainer may run at once on one results
file. On a loaded machine give ``--threads 1`` (and ``GOMP_SPINCOUNT=0``): measured here at load
average ~15 on 2 cores, specfmt's step took 30 s with 2 threads and 2.2 s with 1. Usage::

    python benchmarks/trainer_vs_speculators.py [--world examples/world] [--trainers specfmt,speculators] \\
        [--steps 150,1500] [--lrs 1e-3,3e-3] [--vllm] [--force]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).with_suffix(".results.json")
TRAINERS = ("specfmt", "speculators")
#: the seed of every run but a seed sweep's (``--seed``); the shipped world's recipe uses it too
SEED = 1237
#: the world's 16 held-out prompts (``make_world.make_prompts``; CI's set) and the larger set that separates 0.05 AL
#: (``make_world.tile_prompts``, ``--prompts``): a run's reference figures are kept per prompts file
SMALL_PROMPTS, LARGE_PROMPTS = "prompts.jsonl", "prompts-heldout.jsonl"
#: each trainer's learning-rate sweep: specfmt's around its 3e-3; speculators' default 1e-3 (Muon and AdamW,
#: speculators/train/config/schema.py ``lr``, ``muon_lr`` unset -> ``lr``) and x/÷ 3
DEFAULT_LRS = {"specfmt": "3e-3,1e-3,1e-2", "speculators": "1e-3,3.3e-4,3e-3"}  # each default first
#: speculators 0.9's ``python -m speculators.train`` flags fixed by the benchmark (see the module docstring)
SPECULATORS_FIXED = ["--speculator-type", "eagle3", "--num-layers", "1", "--draft-arch", "llama",
                     "--draft-attn-impl", "sdpa", "--loss-implementation", "eager", "--hidden-states-dtype", "float32",
                     "--train-data-ratio", "0.999", "--num-workers", "0", "--on-missing", "raise", "--epochs", "1000"]
#: ``--algorithm dflash`` (issue 38): the DFlash shape both trainers are given (the Qwen3 world's draft: one Qwen3 layer, a
#: block of 4 so that k = 3, the full vocabulary, the mask token each resolves from the tokenizer, the pad: 2), and each
#: trainer's DFlash defaults otherwise (speculators: D-PACE with cross-entropy, 512 anchors per row, Muon; specfmt: the same
#: objective, ``specfmt train dflash``'s defaults)
DFLASH_SHAPE = {"block_size": 4, "layers": 1}
SPECULATORS_DFLASH = ["--speculator-type", "dflash", "--num-layers", str(DFLASH_SHAPE["layers"]), "--draft-arch", "qwen3",
                      "--block-size", str(DFLASH_SHAPE["block_size"]), *SPECULATORS_FIXED[6:]]


def _tests_on_path() -> None:
    if str(REPO / "tests") not in sys.path:
        sys.path.insert(0, str(REPO / "tests"))


def train_files() -> list[str]:
    """The world's training files: ``make_world.TRAIN_FILES`` (both worlds; ``make_world_qwen3`` reads the same corpus)."""
    sys.path.insert(0, str(REPO / "examples"))
    from make_world import TRAIN_FILES

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return [str(stdlib / n) for n in TRAIN_FILES if (stdlib / n).is_file()]


# ---------------------------------------------------------------- shared data


def _windows(verifier, seq_len: int) -> list[list[int]]:
    from specfmt.training.data import read_documents

    docs = read_documents(train_files(), verifier.tokenizer())
    stream = [t for d in docs.ids for t in d]
    return [stream[i:i + seq_len] for i in range(0, len(stream) - seq_len + 1, seq_len)]


def _top1_counts(engine, folder: Path, n: int, vocab_size: int) -> dict[int, int]:
    """The verifier's top-1 prediction at every stored position: its final norm and lm_head over the last layer."""
    import torch
    from safetensors.torch import load_file

    from specfmt.datagen.engine import sample_path

    model = engine._load()
    norm, head = model.get_decoder().norm, model.get_output_embeddings()
    device = head.weight.device
    counts = torch.zeros(vocab_size, dtype=torch.long)
    with torch.no_grad():
        for i in range(n):
            last = load_file(str(sample_path(folder, i)))["hidden_states"][:, -1].to(device)
            counts += torch.bincount(head(norm(last)).argmax(-1), minlength=vocab_size).cpu()
    return {t: int(c) for t, c in enumerate(counts.tolist())}


def ordered_counts(counts: dict[int, int]) -> dict[int, int]:
    """``counts`` in the order (-count, id): speculators breaks ties by id (``build_vocab_mappings_from_distribution``),
    specfmt's ``vocab_map`` by the dict's order (``Counter.most_common``), so both take the same ids from this dict."""
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def prepare_data(world: Path, root: Path, seq_len: int, vocab_from: str, max_samples: int | None = None, *, device: str = "cpu",
                 dtype: str = "float32") -> dict:
    """Make (once) ``root``: the preprocessed dataset, the hidden states (extracted on ``device`` in ``dtype``) and
    ``token_freq.pt``; returns its facts."""
    import torch

    from specfmt.algorithms.eagle3 import default_taps
    from specfmt.datagen import layout
    from specfmt.datagen.hf_engine import TransformersEngine
    from specfmt.sources.verifier import Verifier

    facts_file = root / "bench_data.json"
    if facts_file.is_file():
        facts = json.loads(facts_file.read_text())
        if facts["seq_len"] == seq_len and facts["vocab_from"] == vocab_from:
            return facts
        sys.exit(f"{root} holds data made with seq len {facts['seq_len']}, vocab from {facts['vocab_from']}: give another --work")
    shutil.rmtree(root, ignore_errors=True)
    verifier = Verifier.load(str(world / "verifier"))
    n_layers, V = verifier.info.num_hidden_layers, verifier.info.vocab_size
    layers = default_taps(n_layers) + [n_layers]
    windows = _windows(verifier, seq_len)[:max_samples]
    samples = [layout.Sample(w, [1] * len(w)) for w in windows]
    t0 = time.perf_counter()
    layout.write_preprocessed(samples, root)
    folder = layout.hidden_states_folder(root)
    engine = TransformersEngine(verifier, dtype=dtype, device=device)
    for _ in engine.extract(list(enumerate(windows)), layers, folder):
        pass
    counts = (_top1_counts(engine, folder, len(windows), V) if vocab_from == "verifier"
              else {**{t: 0 for t in range(V)}, **layout.token_frequencies(samples)})
    torch.save(ordered_counts(counts), root / layout.TOKEN_FREQ)
    files = layout.existing_samples(folder)
    layout.write_manifest(root, layout.Manifest(
        verifier=str(world / "verifier"), layers=layers, hidden_size=verifier.info.hidden_size, engine="transformers",
        seq_len=seq_len, dtype=dtype, samples=len(samples), tokens=sum(map(len, samples)), files=len(files),
        bytes=sum(layout.sample_path(folder, i).stat().st_size for i in files)))
    facts = {"seq_len": seq_len, "vocab_from": vocab_from, "samples": len(samples), "tokens": len(samples) * seq_len,
             "layers": layers, "vocab_size": V, "files": len(train_files()), "seconds": round(time.perf_counter() - t0, 1)}
    facts_file.write_text(json.dumps(facts, indent=2) + "\n")
    return facts


def vocab_coverage(root: Path, draft_vocab: int) -> float:
    """The share of the counts in ``token_freq.pt`` that its ``draft_vocab`` most frequent ids hold."""
    import torch

    counts = sorted(torch.load(root / "token_freq.pt", weights_only=True).values(), reverse=True)
    return round(sum(counts[:draft_vocab]) / max(1, sum(counts)), 4)


# ---------------------------------------------------------------- the two trainers


def _option_value(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text


def specfmt_child(spec: dict) -> dict:
    """One ``specfmt train eagle3 --hidden-states`` run (``train_draft``, what the command runs), timed by its step callbacks."""
    import torch

    from specfmt.training.loop import TrainOptions
    from specfmt.training.pipeline import TrainRequest, train_draft

    torch.set_num_threads(spec["threads"])
    train_fields = set(TrainOptions.__dataclass_fields__)
    request_fields = set(TrainRequest.__dataclass_fields__)
    topts = {"steps": spec["steps"], "batch_size": spec["batch"], "seq_len": spec["seq_len"], "lr": spec["lr"], "seed": spec["seed"],
             "save_every": 0}
    algorithm = spec.get("algorithm", "eagle3")
    req_kw: dict = {"algorithm": algorithm, "hidden_states": spec["data"], "device": spec.get("device", "cpu"), "validate": False, "force": True,
                    **({"verifier_dtype": spec["verifier_dtype"]} if spec.get("verifier_dtype") else {})}
    algo: dict = {"draft_vocab": spec["draft_vocab"]} if algorithm == "eagle3" else dict(DFLASH_SHAPE)
    for item in spec["options"]:
        name, _, value = item.partition("=")
        name = name.strip().lstrip("-").replace("-", "_")
        dest = topts if name in train_fields else req_kw if name in request_fields else algo
        dest[name] = _option_value(value)
    stamps: list[float] = []
    losses: list[float] = []
    req = TrainRequest(spec["out"], spec["verifier"], options=algo, **req_kw)
    opts = TrainOptions(**topts)
    train_draft(req, opts, log=lambda s, loss, acc: (stamps.append(time.perf_counter()), losses.append(float(loss))))
    timed = len(stamps) - 1 - spec["warmup"]
    seconds = stamps[-1] - stamps[spec["warmup"]]
    peak = {"peak_cuda_allocated_bytes": torch.cuda.max_memory_allocated()} if str(req_kw["device"]).startswith("cuda") else {}
    trained = opts.resolved(algorithm)  # the optimizer and schedule the algorithm's defaults gave where the options did not
    return {"optimizer": trained.optimizer, "schedule": trained.schedule, "train_seconds": round(stamps[-1] - stamps[0], 2), "timed_steps": timed,
            "tokens_per_second": round(timed * spec["batch"] * spec["seq_len"] / seconds, 1), "final_loss": round(losses[-1], 4), **peak}


def patched_speculators(work: Path) -> tuple[Path, dict]:
    """A copy of speculators 0.9.0 with the CPU patches of tests/test_hidden_states_interop.py, and its environment."""
    _tests_on_path()
    from speculators_env import speculators_env
    from test_hidden_states_interop import CPU_PATCHES

    env = speculators_env()
    root = work / "speculators-cpu"
    if not (root / "speculators" / "__init__.py").is_file():
        shutil.rmtree(root, ignore_errors=True)
        shutil.copytree(env.root / "speculators", root / "speculators")
        for what, rel, old, new in CPU_PATCHES:
            p = root / "speculators" / rel
            text = p.read_text()
            if old not in text:
                sys.exit(f"a CPU patch no longer applies to speculators: {what}")
            p.write_text(text.replace(old, new))
    return root, env.environ(PYTHONPATH=os.pathsep.join([str(root), str(env.root)]))


def _speculators_profile(log: str) -> list[float]:
    """``step_ms`` of every logged step in speculators' metric log lines (its Profiler, ``log_freq`` 1)."""
    return [float(m) for m in re.findall(r"profile/step_ms[\"']?[:=]\s*([0-9.eE+-]+)", log)]


def run_speculators(spec: dict, work: Path) -> dict:
    """One ``python -m speculators.train`` run on the shared data; its last checkpoint is left in ``spec['ckpt']``."""
    _, env = patched_speculators(work)
    env["OMP_NUM_THREADS"] = str(spec["threads"])
    epochs = -(-spec["steps"] * spec["batch"] // spec["samples"])
    dflash = spec.get("algorithm", "eagle3") == "dflash"
    fixed = SPECULATORS_DFLASH if dflash else SPECULATORS_FIXED
    if spec.get("hs_dtype"):  # the GPU bench: bf16 hidden states and autocast (speculators' recommended setting)
        fixed = [spec["hs_dtype"] if a == "float32" and fixed[i - 1] == "--hidden-states-dtype" else a for i, a in enumerate(fixed)]
    args = [sys.executable, "-m", "speculators.train", *fixed[:-1], str(epochs),
            "--verifier-name-or-path", spec["verifier"], "--data-path", spec["data"], "--target-layer-ids",
            *map(str, spec["layers"][:-1]), *([] if dflash else ["--draft-vocab-size", str(spec["draft_vocab"])]),
            "--total-seq-len", str(spec["batch"] * spec["seq_len"]), "--max-steps", str(spec["steps"]),
            "--lr", str(spec["lr"]), "--seed", str(spec["seed"]), "--save-path", spec["ckpt"], "--log-dir", spec["ckpt"] + "-logs",
            *[a for item in spec["options"] for a in item.split()]]
    shutil.rmtree(spec["ckpt"], ignore_errors=True)
    t0 = time.perf_counter()
    r = subprocess.run(args, env=env, cwd=str(work), capture_output=True, text=True)
    wall = time.perf_counter() - t0
    log = r.stdout + r.stderr
    Path(spec["ckpt"] + ".log").write_text(log)
    if r.returncode != 0:
        sys.exit(f"speculators' trainer failed (log: {spec['ckpt']}.log):\n{log[-3000:]}")
    ms = _speculators_profile(log)
    if len(ms) != spec["steps"]:
        sys.exit(f"speculators' log has {len(ms)} step times for {spec['steps']} steps (log: {spec['ckpt']}.log)")
    timed = ms[spec["warmup"] + 1:]
    return {"train_seconds": round(sum(ms) / 1000, 2), "timed_steps": len(timed), "wall_seconds_process": round(wall, 1),
            "tokens_per_second": round(len(timed) * spec["batch"] * spec["seq_len"] / (sum(timed) / 1000), 1)}


def speculators_checkpoint(ckpt: Path) -> Path:
    """The last checkpoint folder speculators saved (``SAVE/<epoch>/`` with a config.json)."""
    saved = sorted((p.parent for p in ckpt.rglob("config.json") if p.parent.name.isdigit()), key=lambda p: int(p.name))
    if not saved:
        sys.exit(f"speculators saved no checkpoint under {ckpt}")
    return saved[-1]


# ---------------------------------------------------------------- measurement


def vocab_of(draft: Path) -> tuple[list[int], list[int]]:
    """(d2t, indices where t2d is true) of a specfmt draft folder."""
    from safetensors import safe_open

    files = sorted(draft.glob("*.safetensors"))
    found: dict = {}
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            for name in ("d2t", "t2d"):
                if name in st.keys():
                    found[name] = st.get_tensor(name)
    return found["d2t"].tolist(), found["t2d"].nonzero().flatten().tolist()


def measure(draft: Path, world: Path, use_vllm: bool, prompts: str = SMALL_PROMPTS) -> dict:
    """AL of a specfmt draft on the world's held-out ``prompts`` (``validate --run``'s reference run, or vLLM's); the
    reference run's figures also carry ``rows``, each prompt's ``[drafts, accepted]`` (what :func:`paired_bootstrap` resamples).
    Another set than :data:`SMALL_PROMPTS` is measured by :func:`reference_only` or :func:`vllm_only` (the larger set: the
    misreadings would multiply its cost about sevenfold)."""
    from specfmt.validation.run import validate_run

    if prompts != SMALL_PROMPTS:
        return vllm_only(draft, world, prompts) if use_vllm else reference_only(draft, world, prompts)

    file, tokens = prompt_set(prompts)
    run = validate_run(str(draft), prompts=str(prompts_file(world, file)), max_tokens=tokens, num_speculative_tokens=3,
                       use_vllm=use_vllm, write=False)
    fig = run.vllm if use_vllm else run.reference
    if fig is None:
        sys.exit(f"validate --run measured nothing for {draft}: " + "; ".join(c.detail for c in run.report.checks if c.status == "fail"))
    out = {"al": round(fig["mean_acceptance_length"], 4), "per_position": [round(x, 4) for x in fig["acceptance_rate_per_position"]]}
    if not use_vllm:
        out["rows"] = [[p["drafts"], p["accepted"]] for p in run.diagnosis["per_prompt"]]
    return out


def reference_only(draft: Path, world: Path, prompts: str) -> dict:
    """The reference run of ``draft`` as written, alone: what ``validate_run`` measures first (the same verifier load, prompts,
    proposer and :func:`specfmt.validation.acceptance.run_chains`), without the misreadings it simulates beside it (about 7
    readings for EAGLE-3; ``tests/test_trainer_bench.py`` checks that the figures are ``validate_run``'s). ``{al, per_position,
    rows}``."""
    import torch

    from specfmt.algorithms import get
    from specfmt.algorithms.base import Variant
    from specfmt.convert import load_draft
    from specfmt.sources.placement import resolve_placement
    from specfmt.sources.verifier import Verifier
    from specfmt.validation.acceptance import group_size, run_chains
    from specfmt.validation.prompts import load_prompts

    file, tokens = prompt_set(prompts)
    d = load_draft(str(draft))
    cfg, algo = d.config, get(d.config["speculators_model_type"])
    verifier = Verifier.load(str(world / "verifier"))
    ids = load_prompts(str(prompts_file(world, file)), verifier.tokenizer()).ids
    model = verifier.load_model(resolve_placement("cpu", "float32", None, None))
    embed, head = model.get_input_embeddings().weight.detach(), model.get_output_embeddings().weight.detach()
    tensors = {n: t.float() if t.is_floating_point() else t for n, t in d.tensors.items()}
    k = 3
    with torch.no_grad():
        proposer = algo.proposer(Variant(None, "as written", cfg), tensors, embed, head)
        res = run_chains(model, ids, [proposer], k, tokens, group=group_size(model, max(map(len, ids)) + tokens + k))[0]
    return {"al": round(res.mean_acceptance_length, 4), "per_position": [round(x, 4) for x in res.acceptance_rate_per_position],
            "rows": [[a, b] for a, b in zip(res.drafts_per_prompt, res.accepted_per_prompt)]}


def vllm_only(draft: Path, world: Path, prompts: str) -> dict:
    """vLLM's run of ``draft`` alone on the world's ``prompts``: the engine ``validate --run`` starts (``serving.engine_args``,
    greedy, k = 3), without the verifier-alone engine and the misreadings beside it (the 16-prompt ``vllm`` figures of every
    run check exactness). ``{al, per_position, tokens_per_step, rows}``, ``al`` from vLLM's counters (accepted tokens per
    proposal); ``rows``, each prompt's ``[verifier steps after its prefill, tokens those steps gave beyond one each]`` from
    the engine's per-step outputs (``VLLMRun.step_tokens``): what :func:`paired_bootstrap` resamples, so its interval is of
    tokens per step, which equals the AL wherever every step carries a proposal."""
    from specfmt.convert import load_draft
    from specfmt.serving import engine_args, installed_vllm
    from specfmt.sources.verifier import Verifier
    from specfmt.validation import vllm_run
    from specfmt.validation.prompts import load_prompts

    file, tokens = prompt_set(prompts)
    cfg = load_draft(str(draft)).config
    verifier = Verifier.load(str(world / "verifier"))
    ids = load_prompts(str(prompts_file(world, file)), verifier.tokenizer()).ids
    k = 3
    model, spec, _ = engine_args(cfg, str(draft), str(world / "verifier"), installed_vllm(), k)
    run = vllm_run.generate(model, ids, max_tokens=tokens, max_model_len=vllm_run.context_limit(ids, tokens, k),
                            timeout=3600, speculative_config=spec)
    d = run.num_drafts
    return {"al": round(1 + run.num_accepted_tokens / d, 4), "per_position": [round(a / d, 4) for a in run.accepted_per_position],
            "tokens_per_step": round(run.tokens_per_step, 4), "seconds": run.seconds,
            "rows": [[len(s) - 1, sum(s[1:]) - (len(s) - 1)] for s in run.step_tokens]}


def prompts_file(world: Path, file: str) -> Path:
    """``world / file``, or examples/world's file where the world has none: the Qwen3 world's prompts are cut from the
    same held-out files, and its larger set is not copied there (it would take the world past its 15 MB budget)."""
    own = world / file
    return own if own.is_file() else REPO / "examples" / "world" / file


def prompt_set(label: str) -> tuple[str, int]:
    """``(prompts file in the world, tokens generated per prompt)`` of a prompt set's label: ``FILE`` (32 tokens, what every
    run was measured with first) or ``FILE@TOKENS``."""
    file, _, tokens = label.partition("@")
    return file, int(tokens) if tokens else 32


def figures_on(rec: dict, prompts: str, engine: str = "reference") -> dict | None:
    """A run's figures on the world's ``prompts`` file, by the reference run (``reference`` for :data:`SMALL_PROMPTS`, the
    set every run was measured on first, else ``evals[prompts]``) or by vLLM (``engine="vllm"``: ``vllm``, else
    ``vllm:PROMPTS``, :func:`vllm_only`); None when not measured there."""
    if engine == "vllm":
        return rec.get("vllm" if prompts == SMALL_PROMPTS else f"vllm:{prompts}")
    return rec.get("reference") if prompts == SMALL_PROMPTS else rec.get("evals", {}).get(prompts)


def specfmt_tree() -> str:
    """The git tree of specfmt/ at HEAD (``+dirty`` with uncommitted changes there): specfmt's runs are keyed by it,
    so a change of specfmt's trainer or its defaults runs them again, and a run says which code made it."""
    def git(*a: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(REPO), *a], capture_output=True, text=True)

    tree = git("rev-parse", "--short", "HEAD:specfmt").stdout.strip() or "unknown"
    return tree + ("" if git("diff", "--quiet", "HEAD", "--", "specfmt").returncode == 0 else "+dirty")


def run_key(world: str, trainer: str, steps: int, lr: float, vocab_from: str, options: list[str], seed: int = SEED,
            algorithm: str = "eagle3") -> str:
    """The results file's key of one run; a seed other than :data:`SEED` and an algorithm other than EAGLE-3 are part of it."""
    code = [f"specfmt-tree:{specfmt_tree()}"] if trainer == "specfmt" else []
    return "|".join([world, trainer, str(steps), f"{lr:g}", vocab_from, " ".join(options), *code, *([f"seed:{seed}"] if seed != SEED else []),
                     *([f"algorithm:{algorithm}"] if algorithm != "eagle3" else [])])


def train_spec(world: Path, data: Path, facts: dict, run_dir: Path, *, steps: int, lr: float, options: list[str], batch: int, seq_len: int,
               seed: int, threads: int, warmup: int, draft_vocab: int, algorithm: str = "eagle3", **more) -> dict:
    """What :func:`train_one` trains: the run's settings, the shared data (``facts``: :func:`prepare_data`'s samples and
    layers), the draft in ``run_dir/draft`` and speculators' checkpoints in ``run_dir/speculators``; ``more``: the device
    and dtypes of a GPU run (``gpu_train_bench.py``)."""
    return {**more, "steps": steps, "batch": batch, "seq_len": seq_len, "lr": lr, "seed": seed, "threads": threads, "warmup": warmup,
            "samples": facts["samples"], "layers": facts["layers"], "draft_vocab": draft_vocab, "verifier": str(world / "verifier"),
            "data": str(data), "algorithm": algorithm, "out": str(run_dir / "draft"), "ckpt": str(run_dir / "speculators"), "options": options}


def train_one(trainer: str, spec: dict, work: Path) -> tuple[dict, Path]:
    """Train one draft; returns its timing figures and the specfmt draft folder."""
    from specfmt.convert import convert

    out = Path(spec["out"])
    if trainer == "specfmt":
        shutil.rmtree(out, ignore_errors=True)
        cmd = [sys.executable, __file__, "--child", json.dumps(spec)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": str(spec["threads"])})
        if proc.returncode != 0:
            sys.exit(f"specfmt's trainer failed:\n{proc.stderr[-3000:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1]), out
    figures = run_speculators(spec, work)
    convert("speculators", str(speculators_checkpoint(Path(spec["ckpt"]))), out, spec["verifier"], force=True)
    return figures, out


def expected_vocab(data: Path, draft_vocab: int) -> tuple[list[int], list[int]]:
    """(d2t, used ids) by speculators' rule (``build_vocab_mappings_from_distribution``: top counts, ties by id)."""
    import torch

    counts = torch.load(data / "token_freq.pt", weights_only=True)
    used = sorted(sorted(counts, key=lambda t: (-counts[t], t))[:draft_vocab])
    return [t - i for i, t in enumerate(used)], used


def _slug(key: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "_", key).strip("_")[:120]


def _save(path: Path, results: dict) -> None:
    """Write ``results`` merged into what the file holds now (runs, data and paired comparisons by key, a run's fields
    by name): harnesses may share one results file (one per trainer, a ``--vllm`` pass); a lock beside it orders their
    writes, and a field one added (``vllm``) survives another's older copy of the run."""
    import fcntl

    with open(Path(tempfile.gettempdir()) / f"{path.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        disk = json.loads(path.read_text()) if path.is_file() else {}
        for part in ("runs", "data", "paired"):  # by key, and within a run by field: a field another harness added stays
            mine = results.get(part, {})
            results[part] = {**disk.get(part, {}), **{k: {**disk.get(part, {}).get(k, {}), **v} for k, v in mine.items()}}
        tmp = path.with_name(path.name + ".tmp")
        # a prompt's [drafts, accepted] on one line: 719 lines per measurement on the larger set, not 2,876
        tmp.write_text(re.sub(r"\[\s+(\d+),\s+(\d+)\s+\]", r"[\1, \2]", json.dumps(results, indent=2)) + "\n")
        os.replace(tmp, path)


def _meta(args: argparse.Namespace) -> dict:
    import torch

    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    return {"date": datetime.date.today().isoformat(), "python": platform.python_version(), "torch": torch.__version__,
            "cpus": os.cpu_count(), "machine": platform.machine(), "threads": args.threads, "specfmt_commit": commit,
            "speculators": "0.9.0 (CPU patches of tests/test_hidden_states_interop.py)", "loadavg": [round(x, 2) for x in os.getloadavg()],
            "batch": args.batch_size, "seq_len": args.seq_len, "draft_vocab": args.draft_vocab, "seed": SEED,
            "warmup_steps_not_timed": args.warmup}


def run_all(args: argparse.Namespace, world: Path, results: dict) -> None:
    """Every selected (steps, trainer, lr) not yet in ``results``: train, check the vocabulary, measure, save."""
    work = Path(args.work).expanduser() / world.name
    data = work / (f"data-{args.seq_len}-{args.vocab_from}" + (f"-first{args.max_samples}" if args.max_samples else ""))
    facts = prepare_data(world, data, args.seq_len, args.vocab_from, args.max_samples)
    facts["vocab_coverage_of_counts"] = vocab_coverage(data, args.draft_vocab)
    results.setdefault("data", {})[f"{world.name}|{args.vocab_from}"] = facts
    want_d2t, want_used = expected_vocab(data, args.draft_vocab)
    lrs = {t: [float(x) for x in (args.lrs or DEFAULT_LRS[t]).split(",")] for t in args.trainers.split(",")}
    for steps in map(int, args.steps.split(",")):
        for trainer, lr in [(t, v[i]) for i in range(max(map(len, lrs.values()))) for t, v in lrs.items() if i < len(v)]:
            options = args.specfmt_option if trainer == "specfmt" else args.speculators_arg
            key = (run_key(world.name, trainer, steps, lr, args.vocab_from, options, args.seed, args.algorithm)
                   + (f"|first{args.max_samples}" if args.max_samples else ""))
            old = results["runs"].get(key)
            if old is not None and not args.force:
                if figures_on(old, args.prompts) is not None:
                    print(f"have {key}", flush=True)
                    continue
                if (Path(old["draft"]) / "config.json").is_file():  # a kept draft: measured on the new set, not trained again
                    print(f"measuring {key} on {args.prompts}", flush=True)
                    old.setdefault("evals", {})[args.prompts] = measure(Path(old["draft"]), world, False, args.prompts)
                    _save(Path(args.json), results)
                    continue
                print(f"{key}: no figures on {args.prompts} and its draft is gone: training it again", flush=True)
            run_dir = work / "runs" / _slug(key)
            spec = train_spec(world, data, facts, run_dir, steps=steps, lr=lr, options=options, batch=args.batch_size, seq_len=args.seq_len,
                              seed=args.seed, threads=args.threads, warmup=args.warmup, draft_vocab=args.draft_vocab, algorithm=args.algorithm)
            print(f"training {key}", flush=True)
            load = os.getloadavg()[0]
            figures, draft = train_one(trainer, spec, work)
            figures["load_average"] = [round(load, 2), round(os.getloadavg()[0], 2)]  # 1-min, before and after: a shared machine
            if args.algorithm == "eagle3":  # a DFlash draft has the full vocabulary
                d2t, used = vocab_of(draft)
                assert (d2t, used) == (want_d2t, want_used), f"{key}: the draft's d2t/t2d differ from the shared vocabulary"
            if trainer == "speculators":  # its --optimizer, default muon (speculators/train/config/schema.py OptimizerArgs)
                figures["optimizer"] = "adamw" if "--optimizer adamw" in " ".join(options) else "muon"
            rec = {"world": world.name, **({"algorithm": args.algorithm} if args.algorithm != "eagle3" else {}), "trainer": trainer, "steps": steps, "lr": lr, "seed": args.seed, "vocab_from": args.vocab_from, "threads": args.threads,
                   "specfmt_tree": specfmt_tree(),
                   "options": options, "tokens": steps * args.batch_size * args.seq_len, **figures,
                   "reference": measure(draft, world, use_vllm=False), "draft": str(draft)}
            if old is not None and old["reference"]["al"] != rec["reference"]["al"]:
                rec["earlier_reference_al"] = old["reference"]["al"]  # the same run trained again gave another draft
            if args.prompts != SMALL_PROMPTS:
                rec["evals"] = {args.prompts: measure(draft, world, False, args.prompts)}
            results["runs"][key] = rec
            _save(Path(args.json), results)
            big = figures_on(rec, args.prompts)
            print(f"  AL {rec['reference']['al']:.3f} {rec['reference']['per_position']}"
                  + (f", on {args.prompts} {big['al']:.3f}" if args.prompts != SMALL_PROMPTS else "")
                  + f"  {rec['tokens_per_second']:,.0f} tokens/s  {rec['train_seconds']:.0f} s", flush=True)
    if args.vllm:
        run_vllm(args, world, results)


def remeasure(args: argparse.Namespace, world: Path, results: dict) -> None:
    """``--remeasure``: every recorded run of the selected trainers and budgets whose draft is still on disk and has no figures on
    ``--prompts``, measured there (nothing is trained: a run's key names the code that trained it, and that code may be gone)."""
    trainers, budgets = args.trainers.split(","), set(map(int, args.steps.split(",")))
    for key, rec in results["runs"].items():
        if (rec["world"] != world.name or rec["trainer"] not in trainers or rec["steps"] not in budgets
                or rec.get("algorithm", "eagle3") != args.algorithm or figures_on(rec, args.prompts) is not None):
            continue
        if not (Path(rec["draft"]) / "config.json").is_file():
            print(f"{key}: its draft is gone", flush=True)
            continue
        print(f"measuring {key} on {args.prompts}", flush=True)
        rec.setdefault("evals", {})[args.prompts] = measure(Path(rec["draft"]), world, False, args.prompts)
        _save(Path(args.json), results)


def run_vllm(args: argparse.Namespace, world: Path, results: dict) -> None:
    """vLLM's AL for the best learning rate (by the reference AL) of each selected trainer and budget, among the runs of ``--seed``."""
    for steps in map(int, args.steps.split(",")):
        for trainer in args.trainers.split(","):
            runs = [r for r in results["runs"].values() if (r["world"], r.get("algorithm", "eagle3"), r["trainer"], r["steps"], r["vocab_from"])
                    == (world.name, args.algorithm, trainer, steps, args.vocab_from) and r.get("seed", SEED) == args.seed
                    and (trainer != "specfmt" or r.get("specfmt_tree") == specfmt_tree())]
            runs = [r for r in runs if figures_on(r, args.prompts) is not None]
            if not runs:
                continue
            best = max(runs, key=lambda r: figures_on(r, args.prompts)["al"])
            field = "vllm" if args.prompts == SMALL_PROMPTS else f"vllm:{args.prompts}"
            if field in best and not args.force:
                continue
            print(f"vLLM: {trainer} {steps} steps lr {best['lr']:g} on {args.prompts}", flush=True)
            best[field] = measure(Path(best["draft"]), world, True, args.prompts)
            _save(Path(args.json), results)


def per_prompt(draft: Path, world: Path, prompts: str = SMALL_PROMPTS) -> list[tuple[int, int]]:
    """``(drafts, accepted)`` of each held-out prompt in the reference run of ``draft`` (``validate --run``'s diagnosis)."""
    from specfmt.validation.run import validate_run

    file, tokens = prompt_set(prompts)
    run = validate_run(str(draft), prompts=str(prompts_file(world, file)), max_tokens=tokens, num_speculative_tokens=3,
                       use_vllm=False, write=False)
    return [(p["drafts"], p["accepted"]) for p in run.diagnosis["per_prompt"]]


def paired_bootstrap(a: list[tuple[int, int]], b: list[tuple[int, int]], resamples: int = 10_000, seed: int = 0) -> dict:
    """AL(a) - AL(b) on the same prompts, and its 95 % interval over the prompts resampled with replacement (both
    drafts on the same resampled prompts); AL = 1 + accepted / drafts over the prompts taken."""
    import random

    def al(rows: list[tuple[int, int]]) -> float:
        return 1 + sum(x for _, x in rows) / max(1, sum(d for d, _ in rows))

    rng, n = random.Random(seed), len(a)
    diffs = []
    for _ in range(resamples):
        idx = [rng.randrange(n) for _ in range(n)]
        diffs.append(al([a[i] for i in idx]) - al([b[i] for i in idx]))
    diffs.sort()
    return {"difference": round(al(a) - al(b), 4), "low": round(diffs[int(0.025 * resamples)], 4),
            "high": round(diffs[int(0.975 * resamples)], 4), "prompts": n, "resamples": resamples}


def compare(results: dict, keys: list[str], world: Path, prompts: str = SMALL_PROMPTS) -> None:
    """``--paired A,B``: the paired bootstrap of two recorded runs' reference AL on ``prompts`` (their recorded
    per-prompt figures, else a new reference run of each draft), printed and saved under ``paired``."""
    missing = [k for k in keys if k not in results["runs"]]
    if len(keys) != 2 or missing:
        sys.exit(f"--paired takes two keys of the results file; not there: {missing}" if missing else "--paired takes two keys")
    rows = []
    for k in keys:
        fig = figures_on(results["runs"][k], prompts)
        rows.append([tuple(r) for r in fig["rows"]] if fig and "rows" in fig
                    else per_prompt(Path(results["runs"][k]["draft"]), world, prompts))
    out = {"a": keys[0], "b": keys[1], "prompts_file": prompts, **paired_bootstrap(*rows)}
    results.setdefault("paired", {})[" - ".join(keys) + ("" if prompts == SMALL_PROMPTS else f" @ {prompts}")] = out
    print(f"{keys[0]} - {keys[1]}: {out['difference']:+.4f}, 95 % interval {out['low']:+.4f} to {out['high']:+.4f} "
          f"({out['prompts']} prompts, {out['resamples']:,} resamplings)")


def _al(rows: list) -> float:
    return 1 + sum(a for _, a in rows) / max(1, sum(d for d, _ in rows))


def _given(options: list[str], *names: str) -> str | None:
    """The value of the last of ``options`` that sets one of ``names`` (``name=value`` for specfmt, ``--name value`` for
    speculators), else None."""
    found = [o.replace("--", "").replace("=", " ").split()[-1].strip('"') for o in options if o.replace("--", "").startswith(names)]
    return found[-1] if found else None


def settings(results: dict, prompts: str, world: str = "world", algorithm: str = "eagle3") -> dict[tuple, list[dict]]:
    """The runs measured on ``prompts``, by setting ``(trainer, steps, optimizer, options, lr, schedule)``, each setting's
    runs one per seed (of several runs of one seed, the last in the file: a newer specfmt tree). ``options`` leaves out
    the optimizer and the schedule, which are fields of their own (``optimizer=...``, ``schedule=...`` for specfmt,
    ``--optimizer ...``, ``--scheduler-type ...`` for speculators). A run that does not record its schedule is of
    specfmt's cosine (every specfmt run before ``--schedule``) or speculators' linear default."""
    found: dict[tuple, dict[int, dict]] = {}
    for r in results["runs"].values():
        if r["world"] != world or r.get("algorithm", "eagle3") != algorithm or figures_on(r, prompts) is None:
            continue
        opts = tuple(o for o in r["options"] if not o.replace("--", "").startswith(("optimizer", "schedule")))
        speculators = r["trainer"] == "speculators"
        optimizer = r.get("optimizer") or _given(r["options"], "optimizer") or ("muon" if speculators else "adamw")  # runs before issue 38: AdamW in specfmt
        schedule = r.get("schedule") or _given(r["options"], "schedule") or ("linear" if speculators else "cosine")
        found.setdefault((r["trainer"], r["steps"], optimizer, opts, r["lr"], schedule), {})[r.get("seed", SEED)] = r
    return {k: [v[s] for s in sorted(v)] for k, v in found.items()}


def seed_mean(runs: list[dict], prompts: str, engine: str = "reference") -> float:
    return sum(figures_on(r, prompts, engine)["al"] for r in runs) / len(runs)


def best_setting(results: dict, prompts: str, trainer: str, steps: int, seeds: int = 3, optimizer: str | None = None,
                 options: tuple = (), world: str = "world", algorithm: str = "eagle3") -> tuple[tuple, list[dict]] | None:
    """The setting of ``trainer`` at ``steps`` (with ``options``; of ``optimizer`` when given) with at least ``seeds``
    seeds measured on ``prompts`` and the best mean AL over them; None when no setting has that many seeds."""
    found = [(k, v) for k, v in settings(results, prompts, world, algorithm).items() if k[0] == trainer and k[1] == steps and k[3] == options
             and (optimizer is None or k[2] == optimizer) and len(v) >= seeds]
    return max(found, key=lambda kv: seed_mean(kv[1], prompts)) if found else None


#: the options of specfmt's default setting, per (world, algorithm), as its runs spell them: the DFlash runs gave
#: ``block_mask=causal`` before it became ``specfmt train dflash``'s default (the winner of those runs)
DEFAULT_OPTIONS = {("world-qwen3", "dflash"): ("block_mask=causal",)}


def defaults_from_results(results: dict, steps: int = 1500, world: str = "world", algorithm: str = "eagle3") -> dict:
    """``specfmt train ALGORITHM``'s ``--optimizer``, ``--lr`` and ``--schedule`` by this benchmark: specfmt's setting with every other
    option at its default (:data:`DEFAULT_OPTIONS`) and the best three-seed mean AL at ``steps`` (EAGLE-3: the README's
    budget, 1,500), on the larger held-out set where a setting has three seeds measured there, else on the world's 16
    prompts (``tests/test_trainer_bench.py`` holds ``Eagle3.train_defaults`` and ``DFlash.train_defaults`` to it).

    Raises:
        LookupError: no specfmt setting at ``steps`` has three seeds measured on either set.
    """
    options = DEFAULT_OPTIONS.get((world, algorithm), ())
    for prompts in (LARGE_PROMPTS, SMALL_PROMPTS):
        best = best_setting(results, prompts, "specfmt", steps, options=options, world=world, algorithm=algorithm)
        if best is not None:
            (_, _, optimizer, _, lr, schedule), _ = best
            return {"optimizer": optimizer, "lr": lr, "schedule": schedule, "prompts": prompts}
    raise LookupError(f"no specfmt setting at {steps} steps has three seeds measured on {LARGE_PROMPTS} or {SMALL_PROMPTS}")


def paired_means(a: list[dict], b: list[dict], prompts: str, resamples: int = 10_000, seed: int = 0, engine: str = "reference") -> dict:
    """The difference of two settings' seed-mean AL on ``prompts`` (by ``engine``'s figures, :func:`figures_on`), with its
    95 % interval from a paired bootstrap over the prompts (every seed's draft of both settings on the same resampled
    prompts); the seeds' spread beside it."""
    import random
    import statistics

    import numpy as np

    rows_a = [figures_on(r, prompts, engine)["rows"] for r in a]
    rows_b = [figures_on(r, prompts, engine)["rows"] for r in b]
    n = len(rows_a[0])
    rng = random.Random(seed)
    idx = np.array([[rng.randrange(n) for _ in range(n)] for _ in range(resamples)])  # [resamples, n]

    def mean_al(rows: list, take: "np.ndarray") -> "np.ndarray":
        arr = np.array(rows, dtype=np.float64)  # [runs, n, 2]
        got = arr[:, take]  # [runs, ..., n, 2]
        return (1 + got[..., 1].sum(-1) / np.maximum(1, got[..., 0].sum(-1))).mean(0)

    def diff(take: "np.ndarray") -> "np.ndarray":
        return mean_al(rows_a, take) - mean_al(rows_b, take)

    diffs = sorted(diff(idx).tolist())
    sd = lambda rows: statistics.stdev(_al(r) for r in rows) if len(rows) > 1 else 0.0  # noqa: E731
    return {"difference": round(float(diff(np.arange(n))), 4), "low": round(diffs[int(0.025 * resamples)], 4),
            "high": round(diffs[int(0.975 * resamples)], 4), "prompts": n, "resamples": resamples,
            "seeds": [len(a), len(b)], "seed_sd": [round(sd(rows_a), 4), round(sd(rows_b), 4)]}


def head_to_head(results: dict, prompts: str = LARGE_PROMPTS) -> dict:
    """At each budget, each trainer's best three-seed setting on ``prompts`` (specfmt's with its default options,
    :data:`DEFAULT_OPTIONS`) and the paired difference of their means (specfmt minus speculators); saved under ``head_to_head`` and rendered in the docs. The settings are chosen by the
    reference run; where vLLM measured every seed's draft of both on ``prompts`` (:func:`vllm_only`), the same comparison
    by vLLM's figures is under ``vllm``."""
    out = {}
    combos = sorted({(r["world"], r.get("algorithm", "eagle3"), r["steps"]) for r in results["runs"].values()})
    for world, algorithm, steps in combos:
        a = best_setting(results, prompts, "specfmt", steps, world=world, algorithm=algorithm, options=DEFAULT_OPTIONS.get((world, algorithm), ()))
        b = best_setting(results, prompts, "speculators", steps, world=world, algorithm=algorithm)
        if a is None or b is None:
            continue
        key = str(steps) if (world, algorithm) == ("world", "eagle3") else f"{world}|{algorithm}|{steps}"
        out[key] = {"specfmt": {"optimizer": a[0][2], "lr": a[0][4], "schedule": a[0][5], "mean": round(seed_mean(a[1], prompts), 4),
                                "seeds": [figures_on(r, prompts)["al"] for r in a[1]]},
                    "speculators": {"optimizer": b[0][2], "lr": b[0][4], "schedule": b[0][5], "mean": round(seed_mean(b[1], prompts), 4),
                                    "seeds": [figures_on(r, prompts)["al"] for r in b[1]]},
                    "paired": paired_means(a[1], b[1], prompts)}
        if all(figures_on(r, prompts, "vllm") for r in a[1] + b[1]):
            out[key]["vllm"] = {t: {"mean": round(seed_mean(runs, prompts, "vllm"), 4), "seeds": [figures_on(r, prompts, "vllm")["al"] for r in runs]}
                                for t, runs in (("specfmt", a[1]), ("speculators", b[1]))}
            out[key]["vllm"]["paired"] = paired_means(a[1], b[1], prompts, engine="vllm")
    return out


def table(results: dict) -> str:
    rows = [f"| world | steps | trainer | lr | AL reference (per position) | AL vLLM | AL on {LARGE_PROMPTS} | tokens/s | train s |",
            "| --- | ---: | --- | ---: | --- | ---: | ---: | ---: | ---: |"]
    runs = sorted(results["runs"].values(), key=lambda r: (r["world"], r["steps"], r["trainer"], r["lr"]))
    for r in runs:
        best = max((x["reference"]["al"] for x in runs if (x["world"], x["steps"], x["trainer"]) == (r["world"], r["steps"], r["trainer"])))
        al = f"{r['reference']['al']:.3f}" + (" **best**" if r["reference"]["al"] == best else "")
        pp = " / ".join(f"{x:.3f}" for x in r["reference"]["per_position"])
        vl = f"{r['vllm']['al']:.3f}" if "vllm" in r else ""
        opts = (f" {' '.join(r['options'])}" if r["options"] else "") + (f" ({r['specfmt_tree']})" if r["trainer"] == "specfmt" else "")
        big = figures_on(r, LARGE_PROMPTS)
        seed = f" seed {r['seed']}" if r.get("seed", SEED) != SEED else ""
        opts += f" {r['optimizer']}" if "optimizer" in r and not any("optimizer" in o for o in r["options"]) else ""
        opts += f" {r['schedule']}" if "schedule" in r and not any("schedule" in o for o in r["options"]) else ""
        large = f"{big['al']:.3f}" if big else ""
        rows.append(f"| {r['world']} | {r['steps']} | {r['trainer']}{opts}{seed} | {r['lr']:g} | {al} ({pp}) | {vl} | {large} | "
                    f"{r['tokens_per_second']:,.0f} | {r['train_seconds']:.0f} |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--world", default=str(REPO / "examples" / "world"), help="world folder (examples/world, examples/world-qwen3)")
    ap.add_argument("--trainers", default=",".join(TRAINERS))
    ap.add_argument("--algorithm", choices=("eagle3", "dflash"), default="eagle3",
                    help=f"the draft both trainers train (dflash: {DFLASH_SHAPE}, the full vocabulary)")
    ap.add_argument("--steps", default="150,1500", help="step budgets, comma-separated")
    ap.add_argument("--lrs", default=None, help="learning rates for every selected trainer (default: each trainer's sweep, "
                    + "; ".join(f"{t} {v}" for t, v in DEFAULT_LRS.items()) + ")")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--draft-vocab", type=int, default=1024)
    ap.add_argument("--vocab-from", choices=("verifier", "data"), default="verifier",
                    help="token_freq.pt counts: the verifier's top-1 at every training position, or the training tokens")
    ap.add_argument("--max-samples", type=int, default=None,
                    help="only the first N windows (a quick check of the harness; its results are not comparable)")
    ap.add_argument("--prompts", default=SMALL_PROMPTS,
                    help=f"the world's held-out prompts file each draft is measured on besides {SMALL_PROMPTS} (the larger set: "
                         f"{LARGE_PROMPTS}); a recorded run without figures there is measured (its draft kept) or trained again")
    ap.add_argument("--seed", type=int, default=SEED, help="a seed other than the default is part of the run's key")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=5, help="steps not timed")
    ap.add_argument("--specfmt-option", action="append", default=[], metavar="NAME=VALUE",
                    help="passed to specfmt's trainer: a TrainOptions, TrainRequest or EAGLE-3 option (JSON value)")
    ap.add_argument("--speculators-arg", action="append", default=[], metavar="'--FLAG VALUE'",
                    help="extra flags for python -m speculators.train")
    ap.add_argument("--vllm", action="store_true", help="also vLLM's AL for each trainer's best lr per budget (~1 min each)")
    ap.add_argument("--force", action="store_true", help="run again what the results file holds")
    ap.add_argument("--remeasure", action="store_true", help="train nothing: measure every recorded run of --trainers and --steps "
                    "whose draft is kept on --prompts, where it has no figures")
    ap.add_argument("--work", default="~/.cache/specfmt/bench/trainer_vs_speculators", help="data, drafts and logs")
    ap.add_argument("--json", default=str(RESULTS))
    ap.add_argument("--paired", default=None, metavar="KEY_A,KEY_B",
                    help="no training: the paired bootstrap over the prompts of two recorded runs' reference AL")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(specfmt_child(json.loads(args.child))))
        return
    import torch

    torch.set_num_threads(args.threads)  # the extraction and the reference runs here, as each trainer
    world = Path(args.world).resolve()
    path = Path(args.json)
    results = json.loads(path.read_text()) if path.is_file() else {"runs": {}}
    if args.paired:
        compare(results, args.paired.split(","), world, args.prompts)
        _save(path, results)
        return
    results["meta"] = _meta(args)
    if args.remeasure:
        remeasure(args, world, results)
    else:
        run_all(args, world, results)
    _save(path, results)
    results = json.loads(path.read_text())  # with what another harness added meanwhile
    results["head_to_head"] = head_to_head(results)
    _save(path, results)
    print()
    print(table(results))


if __name__ == "__main__":
    main()
