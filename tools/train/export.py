"""Export of a trained PyCoder to DeepSeek-V3's Hub layout in FP8, and loading it back.

Owns: tensor naming (in-memory HF v5 names <-> Hub names), the FP8 e4m3 block quantizer, the
sharded safetensors writer, config.json.
Hub layout: one tensor per expert (model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight),
MTP as layer L = num_hidden_layers (enorm, hnorm, eh_proj, shared_head.norm, shared_head.head,
embed_tokens + the decoder layer), config.json with num_nextn_predict_layers = 1 and
quantization_config {fp8, e4m3, dynamic, [128,128]}.
FP8 (arch doc section 6): for each linear weight of attention, the dense MLP, the routed experts and
the shared expert: S[bi,bj] = max|W over block| / 448 (1.0 for an all-zero block), stored as
`weight_scale_inv` fp32 [ceil(out/128), ceil(in/128)]; Wq = e4m3(clamp(W / S, -448, 448)) with
round-to-nearest-even; dequantization is Wq * S.  Everything else (embeddings, norms, router gate,
eh_proj, shared_head, lm_head) is bf16, e_score_correction_bias fp32.
"""
import json
import os
import re

import torch
from safetensors.torch import load_file, save_file

BLOCK = 128
FP8_MAX = 448.0
QUANT_RE = re.compile(
    r"^model\.layers\.\d+\.(self_attn\.(q_a_proj|q_b_proj|q_proj|kv_a_proj_with_mqa|kv_b_proj|o_proj)"
    r"|mlp\.(gate_proj|up_proj|down_proj)"
    r"|mlp\.experts\.\d+\.(gate_proj|up_proj|down_proj)"
    r"|mlp\.shared_experts\.(gate_proj|up_proj|down_proj))\.weight$")


def quantize_fp8(w):
    """w: [out, in] float tensor -> (e4m3 [out, in], fp32 scale_inv [ceil(out/128), ceil(in/128)])."""
    w = w.detach().float().cpu()
    out_f, in_f = w.shape
    nb_o, nb_i = -(-out_f // BLOCK), -(-in_f // BLOCK)
    pad = torch.zeros(nb_o * BLOCK, nb_i * BLOCK)
    pad[:out_f, :in_f] = w
    blocks = pad.view(nb_o, BLOCK, nb_i, BLOCK)
    amax = blocks.abs().amax(dim=(1, 3))
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q = (blocks / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX)
    q = q.view(nb_o * BLOCK, nb_i * BLOCK)[:out_f, :in_f].contiguous().to(torch.float8_e4m3fn)
    return q, scale.contiguous()


def dequantize_fp8(q, scale):
    out_f, in_f = q.shape
    s = scale.float().repeat_interleave(BLOCK, 0)[:out_f].repeat_interleave(BLOCK, 1)[:, :in_f]
    return q.float() * s


def hub_state_dict(model):
    """In-memory PyCoder -> {hub_name: float tensor} (unquantized), MTP as layer L."""
    cfg = model.cfg
    L = cfg.num_hidden_layers
    out = {}

    def put_layer(prefix, sd):
        for k, v in sd.items():
            if k.startswith("mlp.experts.gate_up_proj"):
                inter = v.shape[1] // 2
                for e in range(v.shape[0]):
                    out[f"{prefix}mlp.experts.{e}.gate_proj.weight"] = v[e, :inter]
                    out[f"{prefix}mlp.experts.{e}.up_proj.weight"] = v[e, inter:]
            elif k.startswith("mlp.experts.down_proj"):
                for e in range(v.shape[0]):
                    out[f"{prefix}mlp.experts.{e}.down_proj.weight"] = v[e]
            else:
                out[prefix + k] = v

    sd = {k: v.detach() for k, v in model.lm.state_dict().items()}
    for k in list(sd):
        m = re.match(r"model\.layers\.(\d+)\.(.*)$", k)
        if m is None:
            out[k] = sd[k]
    for l in range(L):
        pre = f"model.layers.{l}."
        put_layer(pre, {k[len(pre):]: v for k, v in sd.items() if k.startswith(pre)})
    put_layer(f"model.layers.{L}.", {k: v.detach() for k, v in model.mtp.state_dict().items()})
    out[f"model.layers.{L}.embed_tokens.weight"] = sd["model.embed_tokens.weight"]
    out[f"model.layers.{L}.shared_head.head.weight"] = sd["lm_head.weight"]
    return out


def to_fp8_tensors(hub):
    """{name: float} -> {name: stored tensor} (fp8 + scale_inv / bf16 / fp32 bias)."""
    st = {}
    for k, v in hub.items():
        if QUANT_RE.match(k):
            q, s = quantize_fp8(v)
            st[k] = q
            st[k + "_scale_inv"] = s
        elif k.endswith("e_score_correction_bias"):
            st[k] = v.detach().float().cpu().contiguous()
        else:
            st[k] = v.detach().to(torch.bfloat16).cpu().contiguous()
    return st


def config_dict(cfg, fp8=True):
    d = cfg.to_dict()
    for k in ("_experts_implementation", "_attn_implementation", "dtype", "torch_dtype",
              "transformers_version", "architectures", "num_mtp_layers", "head_dim", "qk_head_dim",
              "_name_or_path", "id2label", "label2id", "chunk_size_feed_forward", "is_encoder_decoder",
              "output_attentions", "output_hidden_states", "problem_type", "return_dict"):
        d.pop(k, None)
    d.update({
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "torch_dtype": "bfloat16",
        "num_nextn_predict_layers": 1,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "moe_layer_freq": 1,
        "rope_theta": d["rope_parameters"]["rope_theta"],
        "rope_scaling": None,
    })
    if fp8:
        d["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                    "weight_block_size": [BLOCK, BLOCK]}
    return dict(sorted(d.items()))


def write_sharded(tensors, out_dir, max_shard_bytes=15 * 1024 * 1024, prefix="model"):
    """Write tensors as <prefix>-0000i-of-0000n.safetensors (each <= max_shard_bytes) + index."""
    os.makedirs(out_dir, exist_ok=True)
    names = sorted(tensors, key=_layer_sort_key)
    shards, cur, cur_bytes = [], [], 0
    for k in names:
        nb = tensors[k].numel() * tensors[k].element_size()
        if cur and cur_bytes + nb > max_shard_bytes - 64 * 1024:
            shards.append(cur)
            cur, cur_bytes = [], 0
        cur.append(k)
        cur_bytes += nb
    if cur:
        shards.append(cur)
    weight_map, files = {}, []
    total = 0
    for i, keys in enumerate(shards):
        fn = f"{prefix}-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({k: tensors[k] for k in keys}, os.path.join(out_dir, fn), metadata={"format": "pt"})
        files.append(fn)
        for k in keys:
            weight_map[k] = fn
            total += tensors[k].numel() * tensors[k].element_size()
    with open(os.path.join(out_dir, f"{prefix}.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    return files


def _layer_sort_key(k):
    m = re.match(r"model\.layers\.(\d+)\.(.*)", k)
    if m:
        return (1, int(m.group(1)), m.group(2))
    return (0 if "embed" in k else 2, 0, k)


def export(model, out_dir, log=print):
    """Write config.json + FP8 shards; returns list of shard files."""
    hub = hub_state_dict(model)
    st = to_fp8_tensors(hub)
    files = write_sharded(st, out_dir)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config_dict(model.cfg), f, indent=2)
    size = sum(os.path.getsize(os.path.join(out_dir, fn)) for fn in files)
    log(f"export: {len(st)} tensors, {len(files)} shards, {size / 1e6:.2f} MB -> {out_dir}")
    return files


def load_hub_tensors(model_dir, dequant=True):
    """Read all shards of a Hub-layout directory -> {name: tensor}, FP8 dequantized to fp32."""
    with open(os.path.join(model_dir, "model.safetensors.index.json")) as f:
        files = sorted(set(json.load(f)["weight_map"].values()))
    raw = {}
    for fn in files:
        raw.update(load_file(os.path.join(model_dir, fn)))
    out = {}
    for k, v in raw.items():
        if k.endswith("_scale_inv"):
            continue
        if v.dtype == torch.float8_e4m3fn and dequant:
            out[k] = dequantize_fp8(v, raw[k + "_scale_inv"])
        else:
            out[k] = v.float()
    return out


def load_into(model, hub):
    """Inverse of hub_state_dict: fuse experts, strip the MTP layer; strict load into `model`."""
    cfg = model.cfg
    L = cfg.num_hidden_layers
    E = cfg.n_routed_experts
    lm_sd, mtp_sd = {}, {}
    used = set()
    for l in range(L + 1):
        pre = f"model.layers.{l}."
        if f"{pre}mlp.experts.0.gate_proj.weight" in hub:
            gu = torch.stack([torch.cat([hub[f"{pre}mlp.experts.{e}.gate_proj.weight"],
                                         hub[f"{pre}mlp.experts.{e}.up_proj.weight"]], 0) for e in range(E)])
            dn = torch.stack([hub[f"{pre}mlp.experts.{e}.down_proj.weight"] for e in range(E)])
            tgt = mtp_sd if l == L else lm_sd
            key = "" if l == L else pre
            tgt[key + "mlp.experts.gate_up_proj"] = gu
            tgt[key + "mlp.experts.down_proj"] = dn
            for e in range(E):
                for p in ("gate", "up", "down"):
                    used.add(f"{pre}mlp.experts.{e}.{p}_proj.weight")
    for k, v in hub.items():
        if k in used:
            continue
        m = re.match(r"model\.layers\.(\d+)\.(.*)$", k)
        if m and int(m.group(1)) == L:
            rest = m.group(2)
            if rest in ("embed_tokens.weight", "shared_head.head.weight"):
                continue    # shared with the main model
            mtp_sd[rest] = v
        else:
            lm_sd[k] = v
    model.lm.load_state_dict(lm_sd, strict=True)
    model.mtp.load_state_dict(mtp_sd, strict=True)
    # Shared tensors must really be copies of the main ones.
    for a, b in ((f"model.layers.{L}.embed_tokens.weight", "model.embed_tokens.weight"),
                 (f"model.layers.{L}.shared_head.head.weight", "lm_head.weight")):
        if a in hub and not torch.equal(hub[a], hub[b]):
            raise ValueError(f"{a} differs from {b}")
    return model


def write_dequantized_twin(model_dir, twin_dir, drop_mtp=False):
    """A bf16-free fp32 copy of an FP8 export (weights dequantized, no quantization_config), for
    loading with transformers' from_pretrained."""
    hub = load_hub_tensors(model_dir)
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    cfg.pop("quantization_config", None)
    cfg["torch_dtype"] = "float32"
    if drop_mtp:
        L = cfg["num_hidden_layers"]
        hub = {k: v for k, v in hub.items() if not k.startswith(f"model.layers.{L}.")}
    os.makedirs(twin_dir, exist_ok=True)
    write_sharded({k: v.contiguous() for k, v in hub.items()}, twin_dir, max_shard_bytes=1 << 40)
    with open(os.path.join(twin_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)


def config_from_dir(model_dir, attn="sdpa", experts="eager"):
    """DeepseekV3Config from a shipped config.json (quantization_config and DeepSeek-only fields
    dropped: the weights are dequantized by load_hub_tensors)."""
    from transformers import DeepseekV3Config
    with open(os.path.join(model_dir, "config.json")) as f:
        d = json.load(f)
    for k in ("quantization_config", "architectures", "model_type", "torch_dtype", "topk_method",
              "scoring_func", "moe_layer_freq", "rope_theta", "rope_scaling"):
        d.pop(k, None)
    cfg = DeepseekV3Config(**d)
    cfg._attn_implementation = attn
    cfg._experts_implementation = experts
    return cfg
