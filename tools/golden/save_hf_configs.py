#!/usr/bin/env python3
"""Writes config.json files as transformers 5.17 saves them (v5 `rope_parameters`, `dtype`, ...)
for checkpoints made by `deepinfer mkmodel`, into tests/data/config/. test_config.c checks that
our parser reads them into the same configuration as the original mkmodel config.json.

Usage: python3 tools/golden/save_hf_configs.py --bin build/bin/deepinfer
"""
import argparse
import os
import shutil
import subprocess
import tempfile

import transformers

PRESETS = ["tiny-v3", "tiny-v3-nolora", "tiny-v2-lite", "tiny-v2-grouped", "tiny-v32"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--out", default="tests/data/config")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    tmp = tempfile.mkdtemp()
    try:
        for p in PRESETS:
            d = os.path.join(tmp, p)
            subprocess.run([a.bin, "mkmodel", "--preset", p, "--out", d], check=True, capture_output=True)
            cfg = transformers.AutoConfig.from_pretrained(d)
            s = os.path.join(tmp, p + "_saved")
            cfg.save_pretrained(s)
            shutil.copy(os.path.join(s, "config.json"), os.path.join(a.out, f"hf_saved_{p}.json"))
            print(f"{p}: rope_parameters = {cfg.rope_parameters}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
