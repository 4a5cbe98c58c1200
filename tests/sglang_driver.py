"""Run inside the SGLang env (``tests/sglang_env.py``): SGLang 0.5.23's own code on specfmt's exports.

``python -c DRIVER CASES.json OUT.json`` where CASES is ``{"cases": [...], "verifier": FOLDER}``, each case
``{"name", "export", "draft", "argv"}`` (the export folder, the specfmt draft it came from, the serve line).
For each case it builds the draft class SGLang's model registry names in the export's ``architectures``, fills
every parameter with NaN, feeds the export to the class's own ``load_weights`` through SGLang's own safetensors
iterator (recording which file tensor each parameter loader was called for), then gives the draft the
verifier's embedding the way SGLang's EAGLE worker does (``EAGLEWorkerV2.init_lm_head``: ``set_embed``), and
compares every parameter with the specfmt draft's tensors element by element. It also parses each serve line
with SGLang's own parser (``prepare_server_args``) and runs each verifier class's own
``set_eagle3_layers_to_capture`` on the tap ids written and on the rules of :data:`TAP_RULES`.

Then it runs SGLang's forward of the draft on CPU (``LlamaModel.forward`` of ``llama_eagle3.py``, the logits through
its ``lm_head``) with SGLang's own ``torch_native`` attention backend, in float64, on random token ids and tap
states, and compares it with specfmt's reference (``Eagle3Draft``) fed the same embeddings and taps: once as SGLang
computes (its RMSNorm and rotary tables are float32 whatever the model's dtype: ``layernorm.py`` ``forward_native``,
``rotary_embedding/base.py`` ``_compute_cos_sin_cache``), once with those two float32 choices made float64, and once
against the reference with ``norm_before_residual`` flipped, a misreading the comparison must see. The ``ForwardBatch``
is built by hand (one request, an extend of T tokens) over a KV cache of plain tensors (:data:`KV`), the part of
SGLang's memory pool the backend reads and writes, since SGLang's pools are built by its model runner.
"""

DRIVER = r'''
import json, os, sys, types
from pathlib import Path

import torch
from safetensors.torch import load_file

cases_file, out_file = sys.argv[1], sys.argv[2]
torch._dynamo.config.disable = True  # SGLang's torch.compile'd helpers (DFlash2's _grouped_conv, the selector's) run as written, eagerly
spec = json.loads(Path(cases_file).read_text())
report = {"cases": {}, "tap_rules": {}, "parser": {}}

from sglang.srt.distributed.parallel_state import init_distributed_environment, initialize_model_parallel
from sglang.srt.model_loader import weight_utils
from sglang.srt.models.registry import ModelRegistry
from sglang.srt.runtime_context import SpawnRanks, publish
from sglang.srt.server_args import prepare_server_args
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from transformers import AutoConfig


def parsed(argv):
    """The serve line's arguments exactly as printed, through SGLang's own argparse parser (``ServerArgs.add_cli_args``:
    ``prepare_server_args``' parser), and through ``prepare_server_args`` itself with ``--device cpu`` added: this machine
    has no accelerator (SGLang's ``get_device`` refuses "auto" then), and the draft class reads the published arguments."""
    import argparse

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    raw = parser.parse_args(argv)
    try:
        return raw, prepare_server_args([*argv, "--device", "cpu"]), None
    except ValueError as e:  # DFLASH and DSPARK resolve only on an accelerator (speculative_hook.py _handle_dflash, _handle_dspark)
        return raw, None, str(e)


def fake_verifier(n_layers):
    """What set_eagle3_layers_to_capture reads of its model: its config, its pipeline rank, its inner model."""
    inner = types.SimpleNamespace()
    inner.set_eagle3_layers_to_capture = lambda ids: setattr(inner, "layers_to_capture", list(ids))
    return types.SimpleNamespace(pp_group=types.SimpleNamespace(is_last_rank=True), config=types.SimpleNamespace(num_hidden_layers=n_layers),
                                 model=inner, capture_aux_hidden_states=False)


def captured(arch, ids, n_layers):
    cls, _ = ModelRegistry.resolve_model_cls([arch])
    me = fake_verifier(n_layers)
    cls.set_eagle3_layers_to_capture(me, list(ids))
    return me.model.layers_to_capture


def dflash_captured(arch, ids, n_layers):
    """What the verifier class's own ``set_dflash_layers_to_capture(ids)`` captures (the DFLASH family's taps)."""
    cls, _ = ModelRegistry.resolve_model_cls([arch])
    me = fake_verifier(n_layers)
    me.model.set_dflash_layers_to_capture = lambda ids: setattr(me.model, "layers_to_capture", list(ids))
    cls.set_dflash_layers_to_capture(me, list(ids))
    return me.model.layers_to_capture


def ours_for(name, ours):
    """The specfmt tensor an SGLang parameter holds (q/k/v and gate/up fused as SGLang fuses them)."""
    key = name[len("model."):] if name.startswith("model.") else name
    for fused, parts in (("qkv_proj", ("q_proj", "k_proj", "v_proj")), ("gate_up_proj", ("gate_proj", "up_proj"))):
        if fused in key:
            return torch.cat([ours[key.replace(fused, p)] for p in parts], 0)
    return ours.get(key)


def load_case(case, first):
    folder = case["export"]
    raw, sa, unresolved = parsed(case["argv"])
    if first:
        publish(sa, role="test", ranks=SpawnRanks(world_rank=0, dp_rank=None, gpu_id=0))
        init_distributed_environment(world_size=1, rank=0, local_rank=0, distributed_init_method="tcp://127.0.0.1:%d" % spec["port"], backend="gloo")
        initialize_model_parallel()
    cfg = AutoConfig.from_pretrained(folder)
    cls, arch = ModelRegistry.resolve_model_cls(cfg.architectures)
    # DSpark builds its confidence head only outside SGLang's default ragged-verify mode, static (dspark.py build_confidence_head)
    os.environ["SGLANG_RAGGED_VERIFY_MODE"] = case.get("ragged_verify_mode", "static")
    model = cls(cfg)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for p in params.values():
            p.fill_(float("nan"))
    current, calls, by_id = [None], {n: [] for n in params}, {}

    def recorder(name, load):
        def record(param, weight, *shard):  # the file tensor by identity: DSpark's load_weights loads after reading them all
            calls[name].append(by_id.get(id(weight), (None, current[0]))[1])
            return load(param, weight, *shard)
        return record

    for n, p in params.items():
        p.weight_loader = recorder(n, getattr(p, "weight_loader", weight_utils.default_weight_loader))
    files = sorted(str(f) for f in Path(folder).glob("*.safetensors"))
    yielded = []

    def weights():
        for name, tensor in weight_utils.safetensors_weights_iterator(files):
            current[0] = name
            yielded.append(name)
            by_id[id(tensor)] = (tensor, name)  # the tensor kept alive, so that its id is not reused
            yield name, tensor

    with torch.no_grad():
        model.load_weights(weights())
    consumed = {c for cs in calls.values() for c in cs}
    exported = load_file(files[0])
    hot = getattr(model, "hot_token_id", None)
    if hot is not None and "d2t" in exported and torch.equal(hot, exported["d2t"] + torch.arange(exported["d2t"].numel())):
        consumed.add("d2t")  # llama_eagle3.py: d2t becomes hot_token_id = d2t + arange(Vd), held outside the parameters
    by_loader = {n: sorted(set(c)) for n, c in calls.items()}
    verifier = load_file(str(Path(case.get("verifier", spec["verifier"])) / "model.safetensors"))
    embed, head = verifier["model.embed_tokens.weight"], verifier["lm_head.weight"]
    with torch.no_grad():  # EAGLEWorkerV2.init_lm_head; the DFLASH family's draft has no embedding or head of its own
        if case["kind"] == "eagle" or getattr(model, "load_lm_head_from_target", False):  # EAGLE: always the verifier's embedding and head
            model.set_embed_and_head(torch.nn.Parameter(embed.clone()), torch.nn.Parameter(head.clone()))
        elif case["kind"] == "eagle3":  # EAGLE3, load_lm_head_from_target false: set_embed(the verifier's)
            model.set_embed(torch.nn.Parameter(embed.float().clone()))
    params = dict(model.named_parameters())
    ours = load_file(str(Path(case["draft"]) / "model.safetensors"))
    ours.setdefault("embed_tokens.weight", embed)
    if case["kind"] == "eagle":  # the verifier's head; the zero fc.bias the export writes for SGLang's fc
        ours.setdefault("lm_head.weight", head)
        ours.setdefault("fc.bias", torch.zeros(ours["fc.weight"].shape[0], dtype=ours["fc.weight"].dtype))
    held = {}
    for n, p in params.items():
        want = ours_for(n, ours)
        if want is None:
            held[n] = "no specfmt tensor"
            continue
        same = tuple(want.shape) == tuple(p.shape) and torch.equal(p.detach(), want.to(p.dtype)) and torch.equal(p.detach().to(want.dtype), want)
        held[n] = 0.0 if same else (float((p.detach().double() - want.double()).abs().max()) if want.shape == p.shape else "shape")
    d2t = ours.get("d2t")
    forward = None if case.get("load_only") else FORWARDS[case["kind"]](model, cfg, case["draft"], embed, head)
    return {"forward": forward, "class": cls.__name__, "arch": arch, "parameters": {n: list(p.shape) for n, p in params.items()},
            "unfilled": [n for n, p in params.items() if not torch.isfinite(p).all()], "loaded_from": by_loader,
            "yielded": yielded, "skipped": sorted(set(yielded) - consumed),
            "hot_token_id": None if hot is None else (d2t is not None and torch.equal(hot, torch.arange(d2t.numel()) + d2t)),
            "held": held, "eagle_config": getattr(cfg, "eagle_config", None),
            "raw": {k: getattr(raw, k) for k in ("model_path", "speculative_algorithm", "speculative_draft_model_path", "speculative_num_steps",
                                                 "speculative_eagle_topk", "speculative_num_draft_tokens")},
            "unresolved": unresolved, **algorithm_of(raw.speculative_algorithm), **block_hooks(case),
            **({} if sa is None else {"algorithm": sa.speculative_algorithm, "draft_path": sa.speculative_draft_model_path, "model_path": sa.model_path,
                                      "steps": [sa.speculative_num_steps, sa.speculative_eagle_topk, sa.speculative_num_draft_tokens]})}


def block_hooks(case):
    """For DFLASH and DSPARK, the serve line through SGLang's own resolution of the algorithm (``arg_groups/speculative_hook.py``
    ``_handle_dflash`` / ``_handle_dspark``: DSpark reads the draft's gamma and stops unless ``--speculative-num-draft-tokens``
    is gamma + 1), with ``--device cuda`` (both refuse other devices; neither touches one); and the line with one draft token
    fewer, which DSpark's hook must refuse."""
    from sglang.srt.arg_groups import speculative_hook

    hook = {"dflash": speculative_hook._handle_dflash, "dspark": speculative_hook._handle_dspark}.get(BLOCK_KINDS.get(case["kind"]))
    if hook is None:
        return {}
    out = {}
    for key, argv in (("hook", case["argv"]), ("hook_one_fewer", fewer_draft_tokens(case["argv"]))):
        try:
            hook(prepare_server_args([*argv, "--device", "cuda"]))
            out[key] = "ok"
        except ValueError as e:
            out[key] = str(e)
    return out


def fewer_draft_tokens(argv):
    i = argv.index("--speculative-num-draft-tokens")
    return [*argv[:i + 1], str(int(argv[i + 1]) - 1), *argv[i + 2:]]


#: the DFLASH family's kinds, and the worker that runs each
BLOCK_KINDS = {"dflash": "dflash", "dflash2": "dflash", "dspark": "dspark"}


def algorithm_of(name):
    """What SGLang's ``SpeculativeAlgorithm`` makes of ``--speculative-algorithm NAME`` (``srt/speculative/spec_info.py``)."""
    algo = SpeculativeAlgorithm.from_string(name)
    return {"enum": algo.name, **{f"is_{k}": getattr(algo, f"is_{k}")() for k in ("eagle", "eagle3", "dflash", "dspark")}}


import contextlib, dataclasses

from sglang.srt.layers import layernorm
from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
from sglang.srt.layers.rotary_embedding import base as rope_base
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.model_executor.forward_context import ForwardContext, forward_context


class KV:
    """The KV cache the torch_native backend reads and writes: per layer, [slots, kv heads, head dim] keys and values."""

    def __init__(self, layers, slots, heads, dim):
        self.k = [torch.zeros(slots, heads, dim, dtype=torch.float64) for _ in range(layers)]
        self.v = [torch.zeros(slots, heads, dim, dtype=torch.float64) for _ in range(layers)]

    def set_kv_buffer(self, layer, loc, k, v, *args, **kwargs):
        self.k[layer.layer_id][loc.loc] = k.view(-1, *self.k[0].shape[1:])
        self.v[layer.layer_id][loc.loc] = v.view(-1, *self.v[0].shape[1:])

    def get_key_buffer(self, i):
        return self.k[i]

    def get_value_buffer(self, i):
        return self.v[i]


class Float64:
    """``torch`` as SGLang's norm and rotary modules see it, with ``float32`` (and ``float``) meaning float64."""

    def __getattr__(self, name):
        return torch.float64 if name in ("float32", "float") else getattr(torch, name)


def run_extend(model, cfg, ids, aux, call, *, prefix=0, kv=None):
    """``call(fb)`` under SGLang's forward context, ``fb`` a ``ForwardBatch`` of one request extending ``prefix`` cached tokens
    (their keys and values already in ``kv``) by len(ids) tokens at positions prefix .. prefix + len(ids) - 1, with the
    ``torch_native`` attention backend; ``aux``: what the draft reads as ``spec_info.hidden_states``."""
    T, slots = ids.numel(), 64
    kv = kv or KV(cfg.num_hidden_layers, slots, cfg.num_key_value_heads, getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    runner = types.SimpleNamespace(device="cpu", req_to_token_pool=types.SimpleNamespace(req_to_token=torch.arange(slots).view(1, slots)),
                                   token_to_kv_pool=kv)
    backend = TorchNativeAttnBackend(runner)
    pos = torch.arange(prefix, prefix + T)
    given = dict(forward_mode=ForwardMode.EXTEND, batch_size=1, input_ids=ids, req_pool_indices=torch.tensor([0]), seq_lens=torch.tensor([prefix + T]),
                 out_cache_loc=pos, seq_lens_sum=prefix + T, extend_seq_lens=torch.tensor([T]), extend_prefix_lens=torch.tensor([prefix]),
                 extend_start_loc=torch.tensor([0]), positions=pos, attn_backend=backend, req_to_token_pool=runner.req_to_token_pool,
                 token_to_kv_pool=kv, spec_info=types.SimpleNamespace(hidden_states=aux), encoder_lens=None)
    names = {f.name for f in dataclasses.fields(ForwardBatch)}
    fb = ForwardBatch(**{k: v for k, v in given.items() if k in names})
    backend.init_forward_metadata(fb)
    with torch.no_grad(), forward_context(ForwardContext(attn_backend=backend), forward_batch=fb):
        return call(fb)


@contextlib.contextmanager
def float64_norms_and_rotary(model):
    """SGLang's RMSNorm and rotary tables in float64 (they are float32 whatever the model's dtype: ``layernorm.py``
    ``forward_native``, ``rotary_embedding/base.py`` ``_compute_cos_sin_cache``), for a comparison at float64 rounding."""
    saved = layernorm.torch, rope_base.torch
    layernorm.torch = rope_base.torch = Float64()
    try:
        for m in model.modules():
            if hasattr(m, "_compute_cos_sin_cache") and hasattr(m, "cos_sin_cache"):
                m.cos_sin_cache = m._compute_cos_sin_cache()
                m._cos_sin_cache_cast = None
        yield
    finally:
        layernorm.torch, rope_base.torch = saved


def eagle3_forward(model, cfg, draft_dir, embed, head):
    """SGLang's forward against specfmt's reference, in float64: max |difference| of the logits and of the fed-back state."""
    from specfmt.algorithms import get
    from specfmt.draft import read_draft

    model.double()
    d = read_draft(Path(draft_dir))
    tensors = {n: (t.double() if t.is_floating_point() else t) for n, t in d.tensors.items()}
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (7,), generator=gen)
    width = model.model.fc.in_features
    aux = torch.randn(7, width, generator=gen, dtype=torch.float64)

    def diff(reference, embeds, logits, fed):
        with torch.no_grad():
            rl, rf, _ = reference(embeds[None], reference.combine(aux[None]), torch.arange(7))
        return [float((rl[0] - logits).abs().max()), float((rf[0] - fed).abs().max())]

    def run():
        embeds = model.model.embed_tokens(ids)
        normed, fed = run_extend(model, cfg, ids, aux, lambda fb: model.model(ids, torch.arange(7), fb, input_embeds=embeds))
        return embeds, normed @ model.lm_head.weight.T, fed[0]

    ref = get("eagle3").module(d.config, tensors).double().eval()
    flipped = get("eagle3").module({**d.config, "norm_before_residual": not d.config["norm_before_residual"]}, tensors).double().eval()
    out = {"as_sglang_computes": diff(ref, *run()), "misread": diff(flipped, *run())}
    with float64_norms_and_rotary(model):
        out["float64"] = diff(ref, *run())
    return out


def eagle1_forward(model, cfg, draft_dir, embed, head):
    """SGLang's EAGLE-1 forward (``llama_eagle.py`` ``LlamaModel.forward``: ``fc(cat(embeds, spec_info.hidden_states))``, its
    layers, no norm; logits through the verifier's head, which ``set_embed_and_head`` gave it) against specfmt's reference
    (``Eagle1Draft``) fed the same embeddings and verifier states, in float64: max |difference| of the logits and of the
    state fed back; ``misread``: the reference with ``fc``'s two inputs swapped, a misreading the comparison must see."""
    from specfmt.algorithms import get
    from specfmt.draft import read_draft

    model.double()
    d = read_draft(Path(draft_dir))
    tensors = {n: t.double() for n, t in d.tensors.items()}
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (7,), generator=gen)
    hidden = torch.randn(7, cfg.hidden_size, generator=gen, dtype=torch.float64)
    ref = get("eagle").module(d.config, tensors).double().eval()
    head = model.lm_head.weight

    def diff(embeds, fed, swap=False):
        with torch.no_grad():
            x, y = (hidden, embeds) if swap else (embeds, hidden)
            rf, _ = ref(x[None], y[None], torch.arange(7))
        return [float((rf[0] @ head.T - fed @ head.T).abs().max()), float((rf[0] - fed).abs().max())]

    def run():
        embeds = model.model.embed_tokens(ids)
        return embeds, run_extend(model, cfg, ids, hidden, lambda fb: model.model(ids, torch.arange(7), fb, input_embeds=embeds))

    out = {"as_sglang_computes": diff(*run()), "misread": diff(*run(), swap=True)}
    with float64_norms_and_rotary(model):
        out["float64"] = diff(*run())
    return out


def verifier_state(verifier_dir, n):
    """What SGLang's ``LlamaForCausalLM`` (the world verifier) hands its logits processor, which stores it for the EAGLE worker
    (``LogitsProcessor._get_hidden_states_to_store``): max |difference| from HF's final-normed last hidden state and from the
    state before the norm, and whether the class passed ``hidden_states_before_norm`` (which the processor would prefer)."""
    from transformers import AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(verifier_dir)
    cls, _ = ModelRegistry.resolve_model_cls(cfg.architectures)
    model = cls(cfg)
    files = sorted(str(f) for f in Path(verifier_dir).glob("*.safetensors"))
    with torch.no_grad():
        model.load_weights(weight_utils.safetensors_weights_iterator(files))
    model.double()
    seen = {}

    class Recorder(torch.nn.Module):
        def forward(self, input_ids, hidden_states, lm_head, fb, aux=None, **kw):
            seen.update(hidden=hidden_states, kw=kw)

    model.logits_processor = Recorder()
    ids = torch.randint(0, cfg.vocab_size, (n,), generator=torch.Generator().manual_seed(1))
    with float64_norms_and_rotary(model):
        run_extend(model, cfg, ids, None, lambda fb: model(ids, torch.arange(n), fb))
    hf = AutoModelForCausalLM.from_pretrained(verifier_dir, torch_dtype=torch.float64).eval()
    normed = []
    hf.model.norm.register_forward_hook(lambda mod, args, out: normed.append((args[0][0], out[0])))
    with torch.no_grad():
        hf(ids[None])
    before, after = normed[0]
    return {"after_norm": float((seen["hidden"] - after).abs().max()), "before_norm": float((seen["hidden"] - before).abs().max()),
            "kwargs": sorted(seen["kw"])}


def block_forward(model, cfg, draft_dir, embed, head):
    """SGLang's DFLASH-family forward of one block against specfmt's reference, in float64.

    As SGLang's DFLASH worker runs it: the context (C verified positions' tap states) through the draft's own
    ``project_target_hidden`` (``fc``, ``hidden_norm``) into the KV cache by the worker's own
    ``_append_target_hidden_sequential`` (``kv_proj_only``, ``k_norm``, rotary at the context positions); then the
    draft's forward over the block (the anchor and B - 1 mask tokens, embedded with the verifier's embedding, at
    positions C .. C + B - 1) as one extend after the C cached tokens, its full-attention layers ``ENCODER_ONLY``. The
    reference (``DFlashDraft`` and its variants) runs the same block over the same context. Compared: the block's normed
    hidden states and the proposing slots' logits through the verifier's head; ``misread``: the reference with a causal
    block. DFlash2 adds the selector's walk and DSpark the Markov head's sequential draft and the confidence head
    (:func:`selector_walk`, :func:`markov_draft`), each through SGLang's own modules."""
    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2
    from specfmt.algorithms import get
    from specfmt.draft import read_draft

    model.double()
    d = read_draft(Path(draft_dir))
    algo = get(d.config["speculators_model_type"])
    tensors = {n: (t.double() if t.is_floating_point() else t) for n, t in d.tensors.items()}
    ref = algo.module(d.config, tensors).double().eval()
    B, from_anchor = d.config["block_size"], bool(d.config.get("sample_from_anchor"))
    if hasattr(model, "set_block_size"):
        model.set_block_size(B)  # the worker's: the convolutions index the block by the resolved block size
    gen = torch.Generator().manual_seed(0)
    C = 5
    aux = torch.randn(C, model.fc.in_features, generator=gen, dtype=torch.float64)
    anchor = int(torch.randint(0, cfg.vocab_size, (1,), generator=gen))
    ids = torch.tensor([anchor] + [d.config["mask_token_id"]] * (B - 1))
    E, W = embed.double(), head.double()
    embeds = E[ids]

    def run():
        kv = KV(cfg.num_hidden_layers, 64, cfg.num_key_value_heads, cfg.head_dim)
        worker = types.SimpleNamespace(draft_model=model, draft_model_runner=types.SimpleNamespace(token_to_kv_pool=kv))
        with torch.no_grad():
            DFlashWorkerV2._append_target_hidden_sequential(worker, ctx_hidden=model.project_target_hidden(aux), ctx_positions=torch.arange(C),
                                                             ctx_cache_loc=torch.arange(C))
        out = run_extend(model, cfg, ids, None, lambda fb: model(ids, fb.positions, fb, input_embeds=embeds), prefix=C, kv=kv)
        return out.hidden_states

    def reference(causal=False):
        with torch.no_grad():
            return ref(embeds[None], ref.context(aux[None]), torch.arange(C), torch.arange(C, C + B), causal=causal)[0]

    slots = slice(0, B) if from_anchor else slice(1, B)

    def diff(h, r):
        return [float((r[slots] @ W.T - h[slots] @ W.T).abs().max()), float((r - h).abs().max())]

    h = run()
    out = {"as_sglang_computes": diff(h, reference()), "misread": diff(h, reference(causal=True))}
    with float64_norms_and_rotary(model):
        h = run()
        out["float64"] = diff(h, reference())
        r = reference()
        if getattr(model, "candidate_selector", None) is not None:
            out["selector"] = selector_walk(model, ref, h[slots], r[slots], W, anchor)
        if getattr(model, "markov_head", None) is not None:
            out["markov"] = markov_draft(model, ref, h[slots], r[slots], W, anchor)
    return out


def selector_walk(model, ref, h, r, W, anchor):
    """DFlash2's proposals: SGLang's ``CandidateSelector`` (``build_lattice`` over the top ``selector_top_k`` of each slot through
    the verifier's head, as ``candidate_topk`` takes them; ``sample_path`` greedy, its CPU path) against specfmt's walk
    (``CandidateSelector.walk``). SGLang rounds the unary logits to float32 (``_transform_unary_logits``)."""
    from sglang.srt.models import dflash as sgl_dflash

    head = types.SimpleNamespace(weight=W)
    logits = sgl_dflash._project_candidate_logits(h, head, num_org=W.shape[0], use_quant_head=False)
    vals, cand = sgl_dflash._radix_topk(logits, model.candidate_selector.top_k)
    unary = model._transform_unary_logits(vals)
    sel = model.candidate_selector
    with torch.no_grad():
        scores = sel.build_lattice(candidate_ids=cand[None], unary_logits=unary[None], hidden_states=h[None], anchor_token_ids=torch.tensor([anchor]))
        tokens, _ = sel.sample_path(candidate_ids=cand[None], scores=scores, uniforms=torch.zeros(1, h.shape[0]), temperatures=torch.ones(1),
                                    greedy_mask=torch.tensor([True]))
        ours, _ = ref.candidate_selector.walk(r @ W.T, r, anchor)
    return {"sglang": tokens[0].tolist(), "ours": list(ours)}


def markov_draft(model, ref, h, r, W, anchor):
    """DSpark's proposals: SGLang's base logits (``compute_base_logits``: the verifier's head), its sequential Markov draft
    (``dspark_draft.draft_markov_block``, greedy: ``markov_greedy_step``'s CPU path) and its confidence head (``predict``, raw
    logits) against specfmt's (``dspark_nn.draft_block``, ``ConfidenceHead``); and each step's Markov bias (``step_bias``)
    for the tokens drafted."""
    from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead
    from sglang.srt.speculative.dspark_components import dspark_draft
    from specfmt.algorithms.dspark_nn import draft_block

    lm_head = ParallelLMHead(W.shape[0], W.shape[1]).double()
    with torch.no_grad():
        lm_head.weight.copy_(W)
        model.attach_shared_modules(embed_tokens=None, lm_head=lm_head)
        base, features = model.compute_base_logits(h)
        tokens, _ = dspark_draft.draft_markov_block(markov_head=model.markov_head, base_logits=base[None], anchor_tokens=torch.tensor([anchor]),
                                                    draft_hidden=h[None], step_temperatures=torch.zeros(1),
                                                    noise=dspark_draft.DraftNoise(key=0, offset=torch.zeros(1, dtype=torch.int64)),
                                                    tp_sync=types.SimpleNamespace(sync=lambda site, t: t), greedy_draft=True)
        ours, ours_logits, embs = draft_block(ref.markov_head, (r @ W.T)[None], r[None], torch.tensor([anchor]))
        prev = torch.cat([torch.tensor([anchor]), ours[0][:-1]])
        bias = torch.stack([model.markov_head.step_bias(prev[i:i + 1], hidden_states=None, state=None)[0][0] for i in range(len(prev))])
        out = {"sglang": tokens[0].tolist(), "ours": ours[0].tolist(), "base": float((base - r @ W.T).abs().max()),
               "bias": float((bias + r @ W.T - ours_logits[0]).abs().max())}
        if model.confidence_head is not None and ref.confidence_head is not None:
            _, raw = model.compute_confidence(anchor_tokens=torch.tensor([anchor]), draft_tokens=ours, confidence_features=features)
            out["confidence"] = float((raw[0] - ref.confidence_head(r, embs[0])).abs().max())
    return out


FORWARDS = {"eagle3": eagle3_forward, "eagle": eagle1_forward, "dflash": block_forward, "dflash2": block_forward, "dspark": block_forward}

for i, case in enumerate(spec["cases"]):
    report["cases"][case["name"]] = r = load_case(case, i == 0)
    if case["kind"] == "eagle3":
        ids = (r["eagle_config"] or {}).get("eagle_aux_hidden_state_layer_ids")
        r["captured"] = captured(case["verifier_arch"], ids, case["verifier_layers"])
    elif case["kind"] in BLOCK_KINDS:
        ids = json.loads((Path(case["export"]) / "config.json").read_text())["dflash_config"]["target_layer_ids"]
        r["captured"] = dflash_captured(case["verifier_arch"], ids, case["verifier_layers"])

from specfmt.algorithms.sglang import RULES, TAP_RULES

for arch, (rule, where) in TAP_RULES.items():
    rows = []
    for n_layers, ids in spec["tap_probes"]:
        rows.append([n_layers, ids, captured(arch, ids, n_layers), RULES[rule](ids, n_layers)])
    report["tap_rules"][arch] = rows
report["parser"]["EAGLE"] = SpeculativeAlgorithm.from_string("EAGLE").is_eagle3()
from specfmt.algorithms.dflash import SGLANG_DFLASH_CAPTURE

report["dflash_capture"] = {arch: [[n, ids, dflash_captured(arch, ids, n)] for n, ids in spec["tap_probes"]] for arch in SGLANG_DFLASH_CAPTURE}
report["dflash_capture"]["Qwen2ForCausalLM"] = hasattr(ModelRegistry.resolve_model_cls(["Qwen2ForCausalLM"])[0], "set_dflash_layers_to_capture")
import importlib, inspect

from specfmt.algorithms.eagle import SGLANG_BEFORE_NORM, SGLANG_FINAL_NORMED

report["verifier_state"] = {"world": verifier_state(spec["verifier"], 7),
                            "source": {arch: "hidden_states_before_norm" in inspect.getsource(importlib.import_module(
                                           "sglang." + where[:-3].replace("/", ".")))
                                       for arch, where in {**SGLANG_FINAL_NORMED, **SGLANG_BEFORE_NORM}.items()},
                            "class_file": {arch: inspect.getsourcefile(ModelRegistry.resolve_model_cls([arch])[0]).split("sglang/")[-1]
                                           for arch in {**SGLANG_FINAL_NORMED, **SGLANG_BEFORE_NORM}}}
Path(out_file).write_text(json.dumps(report))
'''
