#!/usr/bin/env python3
"""Prints the RoPE inverse frequencies, cos/sin attention factor and attention softmax scale
that transformers computes for a few configs; tests/unit/test_config.c holds these numbers.

Usage: python3 tools/golden/rope_reference.py   (transformers 5.17, CPU is enough)
"""
import json
import transformers
from transformers import DeepseekV2Config, DeepseekV3Config
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RotaryEmbedding, DeepseekV3Attention
from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2RotaryEmbedding, DeepseekV2Attention

YARN_V3 = {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32,
           "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}
SMALL = dict(hidden_size=64, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=1,
             num_attention_heads=2, n_routed_experts=8, n_group=2, topk_group=1, num_experts_per_tok=2,
             kv_lora_rank=32, q_lora_rank=None, qk_nope_head_dim=16, v_head_dim=16, vocab_size=64)

CASES = {
    # the real DeepSeek-V3 rope (dims of the real model)
    "v3": (DeepseekV3Config, DeepseekV3RotaryEmbedding, DeepseekV3Attention,
           dict(SMALL, qk_rope_head_dim=64, qk_nope_head_dim=128, max_position_embeddings=163840,
                rope_scaling=YARN_V3, rope_theta=10000)),
    # V2-Lite: mscale = mscale_all_dim = 0.707
    "v2lite": (DeepseekV2Config, DeepseekV2RotaryEmbedding, DeepseekV2Attention,
               dict(SMALL, qk_rope_head_dim=64, qk_nope_head_dim=128, max_position_embeddings=163840,
                    rope_scaling=dict(YARN_V3, mscale=0.707, mscale_all_dim=0.707), rope_theta=10000)),
    # YaRN without mscale fields: attention factor 0.1 ln(s) + 1, plain softmax scale
    "yarn_nomscale": (DeepseekV3Config, DeepseekV3RotaryEmbedding, DeepseekV3Attention,
                      dict(SMALL, qk_rope_head_dim=32, max_position_embeddings=256,
                           rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 500.0,
                                            "original_max_position_embeddings": 64, "beta_fast": 16,
                                            "beta_slow": 2, "truncate": False})),
    # small rope dim with low == high corner and mscale_all_dim only
    "yarn_small": (DeepseekV3Config, DeepseekV3RotaryEmbedding, DeepseekV3Attention,
                   dict(SMALL, qk_rope_head_dim=16, max_position_embeddings=256,
                        rope_scaling={"type": "yarn", "factor": 4, "original_max_position_embeddings": 64,
                                      "mscale_all_dim": 0.8}, rope_theta=10000)),
    "default": (DeepseekV3Config, DeepseekV3RotaryEmbedding, DeepseekV3Attention,
                dict(SMALL, qk_rope_head_dim=24, rope_theta=5000.0)),
}

out = {"transformers": transformers.__version__}
for name, (cfg_cls, rope_cls, attn_cls, kw) in CASES.items():
    cfg = cfg_cls(**kw)
    rope = rope_cls(cfg)
    attn = attn_cls(cfg, 0)
    out[name] = {
        "inv_freq": [float(x) for x in rope.inv_freq],
        "attention_scaling": float(rope.attention_scaling),
        "softmax_scale": float(attn.scaling),
    }
print(json.dumps(out, indent=1))
