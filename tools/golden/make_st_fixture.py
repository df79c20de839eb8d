#!/usr/bin/env python3
"""Writes tests/data/safetensors/python.safetensors with the Python `safetensors` library, so
that tests/unit/test_safetensors.c checks our reader against a file we did not write.

Values: tensor with n elements holds x[k] = (k - 5) / 4 (exactly representable in every dtype);
the FP8 tensor [130, 200] holds ((k % 17) - 8) / 4; its scale [2, 2] is [[1, 2], [0.25, 0.5]];
ids.i64 = [1, 0, -3].

Usage: python3 tools/golden/make_st_fixture.py [out_path]
"""
import sys
import torch
from safetensors.torch import save_file


def ramp(n, dtype):
    return ((torch.arange(n, dtype=torch.float32) - 5) / 4).to(dtype)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/data/safetensors/python.safetensors"
    fp8 = (((torch.arange(130 * 200) % 17) - 8).float() / 4).reshape(130, 200).to(torch.float8_e4m3fn)
    tensors = {
        "model.f32": ramp(15, torch.float32).reshape(3, 5),
        "model.bf16": ramp(6, torch.bfloat16),
        "model.f16": ramp(7, torch.float16).reshape(7, 1),
        "model.fp8": fp8,
        "model.fp8_scale_inv": torch.tensor([[1.0, 2.0], [0.25, 0.5]], dtype=torch.float32),
        "ids.i64": torch.tensor([1, 0, -3], dtype=torch.int64),
    }
    save_file(tensors, out, metadata={"format": "pt", "producer": "tools/golden/make_st_fixture.py"})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
