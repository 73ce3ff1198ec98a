"""Tokenizer and stop-token discovery from a local HF folder (no downloads)."""
from __future__ import annotations

import os

from tpsample.model.config import read_json_object

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
_JSON_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def has_tokenizer(folder: str) -> bool:
    """Whether the folder holds tokenizer files (cheap: no transformers import)."""
    return any(os.path.exists(os.path.join(folder, f)) for f in _TOKENIZER_FILES)


def load_tokenizer(folder: str):
    """The folder's tokenizer, or None when it has none. A tokenizer file that is not a JSON
    object, or files transformers cannot build a tokenizer from, are one ValueError line naming
    the file (or the folder), never the library's bare error."""
    if not has_tokenizer(folder):
        return None
    for name in _JSON_FILES:
        if os.path.lexists(os.path.join(folder, name)):
            read_json_object(os.path.join(folder, name))
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except ImportError:
        raise
    except Exception as e:          # whatever a malformed file makes transformers / tokenizers raise
        why = " ".join(f"{type(e).__name__}: {e}".split())
        raise ValueError(f"the tokenizer files in {folder} do not load ({why[:300]})") from None


def generation_eos_ids(folder: str) -> tuple[int, ...]:
    """EOS ids from generation_config.json (config.json's are read by the model config)."""
    from tpsample.engine.generation_config import eos_token_ids

    return eos_token_ids(folder)


def make_grammar_backend(folder: str, vocab_size: int):
    """A GrammarBackend when the folder has a tokenizer and xgrammar is installed, else None.
    The tokenizer and xgrammar's tables load on the first guided request."""
    import importlib.util

    if not has_tokenizer(folder) or importlib.util.find_spec("xgrammar") is None:
        return None
    from tpsample.engine.structured import GrammarBackend

    return GrammarBackend(lambda: load_tokenizer(folder), vocab_size)
