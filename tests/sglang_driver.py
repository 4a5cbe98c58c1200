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
    return raw, prepare_server_args([*argv, "--device", "cpu"])


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
    raw, sa = parsed(case["argv"])
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
    verifier = load_file(str(Path(spec["verifier"]) / "model.safetensors"))
    embed = verifier["model.embed_tokens.weight"]
    with torch.no_grad():  # EAGLEWorkerV2.init_lm_head for EAGLE3, load_lm_head_from_target false: set_embed(the verifier's)
        if getattr(model, "load_lm_head_from_target", False):
            model.set_embed_and_head(torch.nn.Parameter(embed.clone()), torch.nn.Parameter(verifier["lm_head.weight"].clone()))
        else:
            model.set_embed(torch.nn.Parameter(embed.float().clone()))
    params = dict(model.named_parameters())
    ours = load_file(str(Path(case["draft"]) / "model.safetensors"))
    ours.setdefault("embed_tokens.weight", embed)
    held = {}
    for n, p in params.items():
        want = ours_for(n, ours)
        if want is None:
            held[n] = "no specfmt tensor"
            continue
        same = tuple(want.shape) == tuple(p.shape) and torch.equal(p.detach(), want.to(p.dtype)) and torch.equal(p.detach().to(want.dtype), want)
        held[n] = 0.0 if same else (float((p.detach().double() - want.double()).abs().max()) if want.shape == p.shape else "shape")
    d2t = ours.get("d2t")
    return {"class": cls.__name__, "arch": arch, "parameters": {n: list(p.shape) for n, p in params.items()},
            "unfilled": [n for n, p in params.items() if not torch.isfinite(p).all()], "loaded_from": by_loader,
            "yielded": yielded, "skipped": sorted(set(yielded) - consumed),
            "hot_token_id": None if hot is None else (d2t is not None and torch.equal(hot, torch.arange(d2t.numel()) + d2t)),
            "held": held, "eagle_config": getattr(cfg, "eagle_config", None),
            "raw": {k: getattr(raw, k) for k in ("model_path", "speculative_algorithm", "speculative_draft_model_path", "speculative_num_steps",
                                                 "speculative_eagle_topk", "speculative_num_draft_tokens")},
            "algorithm": sa.speculative_algorithm, "is_eagle3": SpeculativeAlgorithm.from_string(sa.speculative_algorithm).is_eagle3(),
            "draft_path": sa.speculative_draft_model_path, "model_path": sa.model_path,
            "steps": [sa.speculative_num_steps, sa.speculative_eagle_topk, sa.speculative_num_draft_tokens]}


for i, case in enumerate(spec["cases"]):
    report["cases"][case["name"]] = r = load_case(case, i == 0)
    ids = (r["eagle_config"] or {}).get("eagle_aux_hidden_state_layer_ids")
    r["captured"] = captured(case["verifier_arch"], ids, case["verifier_layers"])

from specfmt.algorithms.sglang import RULES, TAP_RULES

for arch, (rule, where) in TAP_RULES.items():
    rows = []
    for n_layers, ids in spec["tap_probes"]:
        rows.append([n_layers, ids, captured(arch, ids, n_layers), RULES[rule](ids, n_layers)])
    report["tap_rules"][arch] = rows
report["parser"]["EAGLE"] = SpeculativeAlgorithm.from_string("EAGLE").is_eagle3()
Path(out_file).write_text(json.dumps(report))
'''
