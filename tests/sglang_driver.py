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
import json, sys, types
from pathlib import Path

import torch
from safetensors.torch import load_file

cases_file, out_file = sys.argv[1], sys.argv[2]
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
    model = cls(cfg)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for p in params.values():
            p.fill_(float("nan"))
    current, calls = [None], {n: [] for n in params}

    def recorder(name, load):
        def record(param, weight, *shard):
            calls[name].append(current[0])
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
    with torch.no_grad():  # EAGLEWorkerV2.init_lm_head
        if case["kind"] == "eagle" or getattr(model, "load_lm_head_from_target", False):  # EAGLE: always the verifier's embedding and head
            model.set_embed_and_head(torch.nn.Parameter(embed.clone()), torch.nn.Parameter(head.clone()))
        else:  # EAGLE3, load_lm_head_from_target false: set_embed(the verifier's)
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
    forward = FORWARDS[case["kind"]](model, cfg, case["draft"])
    return {"forward": forward, "class": cls.__name__, "arch": arch, "parameters": {n: list(p.shape) for n, p in params.items()},
            "unfilled": [n for n, p in params.items() if not torch.isfinite(p).all()], "loaded_from": by_loader,
            "yielded": yielded, "skipped": sorted(set(yielded) - consumed),
            "hot_token_id": None if hot is None else (d2t is not None and torch.equal(hot, torch.arange(d2t.numel()) + d2t)),
            "held": held, "eagle_config": getattr(cfg, "eagle_config", None),
            "raw": {k: getattr(raw, k) for k in ("model_path", "speculative_algorithm", "speculative_draft_model_path", "speculative_num_steps",
                                                 "speculative_eagle_topk", "speculative_num_draft_tokens")},
            "unresolved": unresolved, **algorithm_of(raw.speculative_algorithm),
            **({} if sa is None else {"algorithm": sa.speculative_algorithm, "draft_path": sa.speculative_draft_model_path, "model_path": sa.model_path,
                                      "steps": [sa.speculative_num_steps, sa.speculative_eagle_topk, sa.speculative_num_draft_tokens]})}


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


def eagle3_forward(model, cfg, draft_dir):
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


def eagle1_forward(model, cfg, draft_dir):
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


FORWARDS = {"eagle3": eagle3_forward, "eagle": eagle1_forward}

for i, case in enumerate(spec["cases"]):
    report["cases"][case["name"]] = r = load_case(case, i == 0)
    if case["kind"] == "eagle3":
        ids = (r["eagle_config"] or {}).get("eagle_aux_hidden_state_layer_ids")
        r["captured"] = captured(case["verifier_arch"], ids, case["verifier_layers"])

from specfmt.algorithms.sglang import RULES, TAP_RULES

for arch, (rule, where) in TAP_RULES.items():
    rows = []
    for n_layers, ids in spec["tap_probes"]:
        rows.append([n_layers, ids, captured(arch, ids, n_layers), RULES[rule](ids, n_layers)])
    report["tap_rules"][arch] = rows
report["parser"]["EAGLE"] = SpeculativeAlgorithm.from_string("EAGLE").is_eagle3()
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
