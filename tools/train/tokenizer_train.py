"""Byte-level BPE tokenizer for pycoder-moe, trained with Hugging Face `tokenizers`.

Owns: tokenizer.json + tokenizer_config.json of the shipped model.
Keeps DeepSeek-V3's normalizer (empty), pre-tokenizer (three isolating regex Splits + ByteLevel
without regex), post-processor and decoder verbatim, and its special-token strings:
  id 0 BOS <｜begin▁of▁sentence｜>, id 1 EOS <｜end▁of▁sentence｜>, id 2 <｜▁pad▁｜>  (trained first),
  then the BPE vocabulary (256 byte symbols + merges),
  then, at the top of the id range, the FIM / chat / tool-call tokens of V3 plus <think>, </think>,
  with V3's special/normalized flags.
The total size equals `vocab_size` exactly (the model's embedding rows).
tokenizer_config.json copies V3's chat template, bos/eos/pad and add_bos_token: true.
"""
import copy
import json
import os

from tokenizers import Tokenizer, models, trainers, pre_tokenizers

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
PAD = "<｜▁pad▁｜>"
# (content, special) for the tokens appended after the BPE vocabulary; flags follow V3's file.
TAIL_TOKENS = [
    ("<｜fim▁hole｜>", False), ("<｜fim▁begin｜>", False), ("<｜fim▁end｜>", False),
    ("<｜User｜>", False), ("<｜Assistant｜>", False), ("<|EOT|>", True),
    ("<｜tool▁calls▁begin｜>", False), ("<｜tool▁calls▁end｜>", False),
    ("<｜tool▁call▁begin｜>", False), ("<｜tool▁call▁end｜>", False),
    ("<｜tool▁outputs▁begin｜>", False), ("<｜tool▁outputs▁end｜>", False),
    ("<｜tool▁output▁begin｜>", False), ("<｜tool▁output▁end｜>", False),
    ("<｜tool▁sep｜>", False), ("<think>", False), ("</think>", False),
]


def _v3_parts(v3_dir):
    with open(os.path.join(v3_dir, "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    with open(os.path.join(v3_dir, "tokenizer_config.json"), encoding="utf-8") as f:
        tc = json.load(f)
    return ({k: tj[k] for k in ("normalizer", "pre_tokenizer", "post_processor", "decoder")},
            tc["chat_template"])


def save_v3_parts(v3_dir, out_path):
    """Copy the parts of DeepSeek-V3's tokenizer we reuse into one small JSON (shipped to the GPU run)."""
    parts, tmpl = _v3_parts(v3_dir)
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump({"parts": parts, "chat_template": tmpl}, f, ensure_ascii=False, indent=1)


def train(texts, vocab_size, v3_parts_path, out_dir, log=print):
    """Train on an iterable of strings; write tokenizer.json and tokenizer_config.json to out_dir."""
    with open(v3_parts_path, encoding="utf-8") as f:
        v3 = json.load(f)
    parts, chat_template = v3["parts"], v3["chat_template"]
    skeleton = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
        "normalizer": parts["normalizer"], "pre_tokenizer": parts["pre_tokenizer"],
        "post_processor": parts["post_processor"], "decoder": parts["decoder"],
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False, "vocab": {}, "merges": []},
    }
    tok = Tokenizer.from_str(json.dumps(skeleton))
    n_bpe = vocab_size - len(TAIL_TOKENS)
    trainer = trainers.BpeTrainer(vocab_size=n_bpe, min_frequency=2, show_progress=False,
                                  special_tokens=[BOS, EOS, PAD],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    got = tok.get_vocab_size(with_added_tokens=True)
    if got != n_bpe:
        raise RuntimeError(f"BPE trainer produced {got} ids, expected {n_bpe}")
    tj = json.loads(tok.to_str())
    # Added tokens: V3's flags.  BOS/EOS/PAD special+not normalized; the tail per TAIL_TOKENS.
    added = []
    for i, c in enumerate((BOS, EOS, PAD)):
        added.append({"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                      "normalized": False, "special": True})
    for j, (c, special) in enumerate(TAIL_TOKENS):
        added.append({"id": n_bpe + j, "content": c, "single_word": False, "lstrip": False,
                      "rstrip": False, "normalized": True, "special": special})
    tj["added_tokens"] = added
    for a in added[3:]:
        tj["model"]["vocab"][a["content"]] = a["id"]
    # Keep the V3 pieces exactly as in V3's file (train() may normalise field order/defaults).
    for k, v in parts.items():
        tj[k] = copy.deepcopy(v)
    os.makedirs(out_dir, exist_ok=True)
    text = json.dumps(tj, ensure_ascii=False, indent=None, separators=(",", ":"))
    final = Tokenizer.from_str(text)        # validates
    if final.get_vocab_size(with_added_tokens=True) != vocab_size:
        raise RuntimeError("final tokenizer size mismatch")
    with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        f.write(text)
    tok_entry = lambda c: {"__type": "AddedToken", "content": c, "lstrip": False, "normalized": True,
                           "rstrip": False, "single_word": False}
    cfg = {
        "add_bos_token": True, "add_eos_token": False,
        "bos_token": tok_entry(BOS), "eos_token": tok_entry(EOS), "pad_token": tok_entry(EOS),
        "clean_up_tokenization_spaces": False, "legacy": True, "model_max_length": 4096,
        "sp_model_kwargs": {}, "unk_token": None, "tokenizer_class": "LlamaTokenizerFast",
        "chat_template": chat_template,
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=2)
    log(f"tokenizer: {vocab_size} ids ({n_bpe} BPE incl. 3 leading specials, {len(TAIL_TOKENS)} tail tokens)")
    return final
