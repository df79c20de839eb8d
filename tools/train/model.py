"""pycoder-moe model: transformers' DeepseekV3ForCausalLM plus one DeepSeek MTP module.

Owns: the architecture settings (ARCH), the MTP layer, the joint loss, the experts forward used
for training, and the aux-loss-free router-bias update.
MTP (arch doc section 7, vLLM order): for position i, h_i = main model's final hidden state AFTER
model.norm, e = embed(t_{i+1});  u = eh_proj(concat(enorm(e), hnorm(h_i)))  (embedding first);
v = DecoderLayer_L(u) (a full MLA + MoE decoder layer, layer index L = num_hidden_layers, causal,
RoPE at position i);  draft logits for t_{i+2} = lm_head(shared_head.norm(v)).  The embedding and
lm_head are the main model's (shared, as in DeepSeek-V3).
Loss = CE_main(t_{i+1}) + MTP_LAMBDA * CE_mtp(t_{i+2}); gradients of both flow everywhere.
Load balancing: no auxiliary loss; after every optimizer step each MoE layer's
e_score_correction_bias[e] += BIAS_UPDATE_SPEED * sign(mean_load - load[e]) (DeepSeek-V3 sec. 2.1.2).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
from transformers.masking_utils import create_causal_mask
from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
    DeepseekV3DecoderLayer, DeepseekV3RMSNorm, DeepseekV3TopkRouter)

# Every architecture setting of the shipped model (documented in tools/train/README.md).
ARCH = dict(
    vocab_size=8192,
    hidden_size=256,
    intermediate_size=1024,          # dense MLP of layer 0
    moe_intermediate_size=128,       # each routed expert and the shared expert
    num_hidden_layers=8,             # layer 0 dense, layers 1..7 MoE; MTP is layer 8
    num_attention_heads=4,
    num_key_value_heads=4,
    q_lora_rank=128,
    kv_lora_rank=128,
    qk_nope_head_dim=64,
    qk_rope_head_dim=32,
    v_head_dim=64,
    n_routed_experts=16,
    n_shared_experts=1,
    num_experts_per_tok=4,
    n_group=4,
    topk_group=2,
    routed_scaling_factor=2.5,
    norm_topk_prob=True,
    first_k_dense_replace=1,
    hidden_act="silu",
    max_position_embeddings=4096,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    rope_interleave=True,
    initializer_range=0.02,
    tie_word_embeddings=False,
    bos_token_id=0,
    eos_token_id=1,
    num_nextn_predict_layers=1,
    attention_bias=False,
)
MTP_LAMBDA = 0.3
BIAS_UPDATE_SPEED = 2e-3


def make_config(arch=None, attn="sdpa", experts="eager"):
    a = dict(ARCH if arch is None else arch)
    theta = a.pop("rope_theta")
    cfg = DeepseekV3Config(**a, rope_parameters={"rope_type": "default", "rope_theta": theta})
    cfg._attn_implementation = attn
    cfg._experts_implementation = experts
    return cfg


# ---------------------------------------------------------------------------------------------
# Experts forward for training on CUDA: tokens sorted by expert, two bf16 grouped GEMMs.
def bf16_grouped_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    n_tok, k = top_k_index.shape
    flat = top_k_index.reshape(-1)
    order = torch.argsort(flat, stable=True)
    tok = order // k
    x = hidden_states[tok].to(torch.bfloat16)
    counts = torch.zeros(self.num_experts, dtype=torch.int32, device=flat.device)
    counts.scatter_add_(0, flat.to(torch.int64), torch.ones_like(flat, dtype=torch.int32))
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    w_gu = self.gate_up_proj.to(torch.bfloat16).transpose(-2, -1)      # [E, D, 2I]
    w_d = self.down_proj.to(torch.bfloat16).transpose(-2, -1)          # [E, I, D]
    gu = F.grouped_mm(x, w_gu, offs=offs)                               # [S, 2I]
    g, u = gu.chunk(2, dim=-1)
    y = F.grouped_mm(F.silu(g) * u, w_d, offs=offs)                     # [S, D]
    y = y.float() * top_k_weights.reshape(-1)[order].unsqueeze(-1).float()
    out = torch.zeros(n_tok, y.shape[-1], dtype=torch.float32, device=y.device)
    out.index_add_(0, tok, y)
    return out.to(hidden_states.dtype)


ALL_EXPERTS_FUNCTIONS.register("di_bf16_grouped", bf16_grouped_experts_forward)


def set_experts_impl(model, name):
    """Switch every experts module (main and MTP) to a registered implementation."""
    model.cfg._experts_implementation = name
    for m in model.modules():
        if hasattr(m, "config") and hasattr(m.config, "_experts_implementation"):
            m.config._experts_implementation = name


# ---------------------------------------------------------------------------------------------
class SharedHead(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.norm = DeepseekV3RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)


class MTPLayer(DeepseekV3DecoderLayer):
    """A DeepSeek-V3 decoder layer (index L = num_hidden_layers) with the MTP input/output parts.
    State-dict names match the Hub layout under model.layers.{L}. (embed_tokens and
    shared_head.head are the shared main tensors and are added only at export)."""

    def __init__(self, cfg):
        super().__init__(cfg, layer_idx=cfg.num_hidden_layers)
        self.enorm = DeepseekV3RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.hnorm = DeepseekV3RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.shared_head = SharedHead(cfg)


class PyCoder(nn.Module):
    """Main model (HF DeepseekV3ForCausalLM, attribute `lm`) + MTP layer (attribute `mtp`)."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.lm = DeepseekV3ForCausalLM(cfg)
        self.mtp = MTPLayer(cfg)
        std = cfg.initializer_range
        with torch.no_grad():
            for name, p in self.mtp.named_parameters():
                if name.endswith("norm.weight") or "layernorm" in name:
                    p.fill_(1.0)
                elif "experts.gate_up_proj" in name or "experts.down_proj" in name or p.dim() == 2:
                    p.normal_(0.0, std)
            self.mtp.mlp.gate.e_score_correction_bias.zero_()

    def routers(self):
        return [m for m in self.modules() if isinstance(m, DeepseekV3TopkRouter)]

    def mtp_forward(self, h, next_ids, position_ids):
        """h: [B,T,D] post-norm hidden states at positions i; next_ids: [B,T] tokens t_{i+1}.
        Returns the MTP's normalized output [B,T,D] (feed to lm_head for t_{i+2} logits)."""
        e = self.lm.model.embed_tokens(next_ids)
        u = self.mtp.eh_proj(torch.cat([self.mtp.enorm(e), self.mtp.hnorm(h)], dim=-1))
        pos_emb = self.lm.model.rotary_emb(u, position_ids=position_ids)
        mask = create_causal_mask(config=self.cfg, inputs_embeds=u, attention_mask=None,
                                  past_key_values=None, position_ids=position_ids)
        v = self.mtp(u, attention_mask=mask, position_ids=position_ids, position_embeddings=pos_emb)
        return self.mtp.shared_head.norm(v)

    def forward(self, window):
        """window: [B, T+2] token ids.  Returns (loss_main, loss_mtp) averaged over T positions."""
        x = window[:, :-2]
        t = x.shape[1]
        pos = torch.arange(t, device=x.device).unsqueeze(0)
        h = self.lm.model(input_ids=x, position_ids=pos).last_hidden_state      # post-norm
        logits = self.lm.lm_head(h)
        loss_main = F.cross_entropy(logits.float().view(-1, logits.shape[-1]),
                                    window[:, 1:-1].reshape(-1))
        hm = self.mtp_forward(h, window[:, 1:-1], pos)
        logits_m = self.lm.lm_head(hm)
        loss_mtp = F.cross_entropy(logits_m.float().view(-1, logits_m.shape[-1]),
                                   window[:, 2:].reshape(-1))
        return loss_main, loss_mtp


class LoadBalancer:
    """Counts tokens per expert in every router during forward; updates the correction bias."""

    def __init__(self, model, speed=BIAS_UPDATE_SPEED):
        self.speed = speed
        self.routers = model.routers()
        self.counts = [torch.zeros(r.num_experts, device=r.weight.device) for r in self.routers]
        self.enabled = True
        for r, c in zip(self.routers, self.counts):
            r.register_forward_hook(self._hook(c))

    def _hook(self, counts):
        def hook(mod, inp, out):
            if self.enabled and mod.training:
                idx = out[2].reshape(-1)
                counts.scatter_add_(0, idx, torch.ones_like(idx, dtype=counts.dtype))
        return hook

    @torch.no_grad()
    def step(self):
        """Apply the bias update from the loads since the last call; returns max/mean load (tensor)."""
        worst = []
        for r, c in zip(self.routers, self.counts):
            mean = c.mean()
            r.e_score_correction_bias.add_(self.speed * torch.sign(mean - c))
            worst.append(c.max() / mean.clamp(min=1.0))
            c.zero_()
        return torch.stack(worst)


def count_params(model):
    n_main = sum(p.numel() for p in model.lm.parameters())
    n_mtp = sum(p.numel() for p in model.mtp.parameters())
    cfg = model.cfg
    per_expert = 3 * cfg.hidden_size * cfg.moe_intermediate_size
    n_moe_layers = cfg.num_hidden_layers - cfg.first_k_dense_replace
    inactive = (cfg.n_routed_experts - cfg.num_experts_per_tok) * per_expert
    return {"main": n_main, "mtp_unique": n_mtp, "total_unique": n_main + n_mtp,
            "active_per_token_main": n_main - n_moe_layers * inactive}
