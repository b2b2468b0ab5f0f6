"""Train a small Qwen-style byte-level BPE tokenizer for the synthetic world.

Same pipeline as Qwen2.5's tokenizer.json (NFC, the Qwen split regex, byte-level with no prefix
space, byte-level decoder), so the agent code treats it exactly like a real checkpoint's
tokenizer. The full 256-byte alphabet is in the vocabulary, so any text encodes and decodes back
exactly. Special tokens: <|endoftext|> (pad), <|im_start|>, <|im_end|> (eos). The agent tags
(<think>, <tool_call>, ...) are added tokens that are NOT special, so they stay single ids and
survive decode(skip_special_tokens=True), as in Qwen where <tool_call> is a plain added token.
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
AGENT_TAGS = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
              "<memory>", "</memory>", "<question>", "</question>")
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"

# Qwen2's pre-tokenizer regex: single digits, letters with one leading non-letter, punctuation runs.
QWEN_SPLIT_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                    r"|\s*[\r\n]+|\s+(?!\S)|\s+")

# Qwen2.5-style chat template without the default system prompt (the agent always sends its own)
# and without tool schemas (the agent's system prompt describes its one tool in plain text).
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def build_untrained(vocab_size: int) -> tuple[Tokenizer, trainers.BpeTrainer]:
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    # Tags are added after training, so leave room for them inside vocab_size.
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(AGENT_TAGS), min_frequency=2, show_progress=False,
        special_tokens=list(SPECIAL_TOKENS), initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    return tok, trainer


def _split_pieces(texts: list[str], word_pieces: Mapping[str, Sequence[str]]) -> list[str]:
    # A newline between pieces ends a pre-token without attaching to the next one, so BPE never
    # learns a merge across a piece boundary ("Ge\nbin" -> pre-tokens "Ge", "\n", "bin").
    if not word_pieces:
        return texts
    for word, pieces in word_pieces.items():
        if "".join(pieces) != word:
            raise ValueError(f"word_pieces[{word!r}] = {list(pieces)!r}: pieces must concatenate to the word")
    pattern = re.compile(r"\b(" + "|".join(re.escape(w) for w in sorted(word_pieces, key=len, reverse=True)) + r")\b")
    return [pattern.sub(lambda m: "\n".join(word_pieces[m.group(1)]), t) for t in texts]


def train_tokenizer(texts: Iterable[str], out_dir: str, vocab_size: int = 1024,
                    extra_texts: Iterable[str] = (), word_pieces: Mapping[str, Sequence[str]] | None = None,
                    model_max_length: int = 32768) -> str:
    """Train on `texts` + `extra_texts` (e.g. the agent's prompts) and save a HF tokenizer dir.

    word_pieces: words never to become single tokens, only their pieces (e.g. made-up names ->
    syllables), so rare or held-out names are built from tokens seen in training.
    The directory loads with `transformers.AutoTokenizer.from_pretrained(out_dir)`. The final
    vocabulary has exactly `vocab_size` entries when the corpus has enough merges (fewer otherwise).
    Returns out_dir.
    """
    min_vocab = 256 + len(SPECIAL_TOKENS) + len(AGENT_TAGS)
    if vocab_size < min_vocab:
        raise ValueError(f"vocab_size={vocab_size}: must be at least {min_vocab} (bytes + special tokens + tags)")
    tok, trainer = build_untrained(vocab_size)
    corpus = _split_pieces([t for t in list(texts) + list(extra_texts) if t], word_pieces or {})
    if not corpus:
        raise ValueError("train_tokenizer: no texts given")
    tok.train_from_iterator(corpus, trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False, single_word=False, lstrip=False, rstrip=False)
                    for t in AGENT_TAGS])
    save_tokenizer(tok, out_dir, model_max_length)
    return out_dir


def save_tokenizer(tok: Tokenizer, out_dir: str, model_max_length: int = 32768) -> None:
    """Write tokenizer.json + tokenizer_config.json (+ special_tokens_map.json) into out_dir."""
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    added = {}
    for tid, tk in sorted(tok.get_added_tokens_decoder().items()):
        added[str(tid)] = {"content": tk.content, "lstrip": tk.lstrip, "normalized": tk.normalized,
                           "rstrip": tk.rstrip, "single_word": tk.single_word, "special": tk.special}
    config = {
        # The generic fast class loads tokenizer.json verbatim (Qwen2Tokenizer would rebuild it).
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "unk_token": None,
        "add_bos_token": False,
        "add_prefix_space": False,
        # Decoding must not touch spaces, or round trips break (" ." would become ".").
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        "model_max_length": model_max_length,
        "chat_template": CHAT_TEMPLATE,
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
    with open(os.path.join(out_dir, "special_tokens_map.json"), "w", encoding="utf-8") as f:
        json.dump({"eos_token": EOS_TOKEN, "pad_token": PAD_TOKEN,
                   "additional_special_tokens": ["<|im_start|>", "<|im_end|>"]}, f, indent=2)


def load_tokenizer(tok_dir: str):
    """AutoTokenizer for a directory written by `train_tokenizer` (a clear error if it isn't one)."""
    if not os.path.isfile(os.path.join(tok_dir, "tokenizer.json")):
        raise FileNotFoundError(f"{tok_dir}: no tokenizer.json; expected a directory written by "
                                "memsearcher_jax.data.tokenizer.train_tokenizer "
                                "(tokenizer.json + tokenizer_config.json)")
    from transformers import AutoTokenizer  # heavy import, only when loading

    return AutoTokenizer.from_pretrained(tok_dir)
