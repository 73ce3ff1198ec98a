"""The text-side files of a local HF model folder (no downloads): its tokenizer and generation_config.json.

Contract
- `load_tokenizer(folder)`: the folder's tokenizer, or None when it has none; a tokenizer file
  that is not a JSON object, or files transformers cannot build a tokenizer from, are one
  ValueError line naming the file (or the folder), never the library's bare error.
- `read_generation_config(folder)`: the file's JSON object, {} when there is none; a file that is
  not a JSON object is a ValueError naming the file, in one line.
- `sampling_defaults(folder)`: the sampling fields vLLM takes from it (`SAMPLING_FIELDS`, with
  `max_new_tokens` as `max_tokens`), each checked for type (a number; an integer where one is
  needed), else a ValueError naming the file and the field. Front ends apply them only to the
  fields a request leaves out.
- `generation_eos_ids(folder)`: its `eos_token_id` (an id or a list of them) as a tuple (config.json's
  are read by the model config).
"""
from __future__ import annotations

import numbers
import os

from tpsample.model.config import read_json_object

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
_JSON_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
GENERATION_CONFIG = "generation_config.json"


def has_tokenizer(folder: str) -> bool:
    """Whether the folder holds tokenizer files (cheap: no transformers import)."""
    return any(os.path.exists(os.path.join(folder, f)) for f in _TOKENIZER_FILES)


def load_tokenizer(folder: str):
    """The folder's tokenizer, or None without one; ValueError naming a file that does not load."""
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


# field -> (the SamplingParams / request name, integer or not), as vLLM's generation-config defaults
SAMPLING_FIELDS = {"temperature": ("temperature", False), "top_p": ("top_p", False), "top_k": ("top_k", True),
                   "min_p": ("min_p", False), "repetition_penalty": ("repetition_penalty", False),
                   "max_new_tokens": ("max_tokens", True)}


def read_generation_config(folder: str) -> dict:
    """The folder's generation_config.json as a dict ({} without one); ValueError naming the file."""
    path = os.path.join(folder, GENERATION_CONFIG)
    return read_json_object(path, "is not a readable JSON file") if os.path.exists(path) else {}


def check_sampling_defaults(values: dict, source: str) -> dict:
    """`values` (generation-config names) as request defaults, each checked; ValueError naming `source`."""
    out = {}
    for key, value in values.items():
        if key not in SAMPLING_FIELDS:
            continue
        name, integer = SAMPLING_FIELDS[key]
        kind = numbers.Integral if integer else numbers.Real
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, kind):
            raise ValueError(f"{source}: {key} must be {'an integer' if integer else 'a number'}, got {value!r}")
        out[name] = value
    return out


def sampling_defaults(folder: str) -> dict:
    """The sampling defaults the folder's generation_config.json sets (request field names)."""
    return check_sampling_defaults(read_generation_config(folder), os.path.join(folder, GENERATION_CONFIG))


def generation_eos_ids(folder: str) -> tuple[int, ...]:
    """The EOS ids generation_config.json names."""
    eos = read_generation_config(folder).get("eos_token_id")
    if eos is None:
        return ()
    ids = tuple(eos) if isinstance(eos, list) else (eos,)
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise ValueError(f"{os.path.join(folder, GENERATION_CONFIG)}: eos_token_id must be a token id or a list of them, "
                         f"got {eos!r}")
    return ids
