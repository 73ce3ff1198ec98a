"""Prompt inputs into token ids: the shapes `LLM.generate` and `LLM.chat` accept.

`normalize_prompts` turns text, token-id lists, token-id tensors and BatchEncodings into
(text or None, token ids) per prompt; `chat_prompts` applies the tokenizer's chat template with
the generation prompt. Everything else is a ValueError that says what to pass instead.
"""
from __future__ import annotations

import numbers
from collections.abc import Mapping

from tpsample.coerce import is_int

_WHAT = ("pass a str, a list of str, a list of token-id lists (e.g. [[1, 2, 3]]), a token-id tensor, "
         "or a tokenizer's BatchEncoding")


def _is_ids(p) -> bool:
    return isinstance(p, (list, tuple)) and all(is_int(t) for t in p)


def _is_float(dtype) -> bool:
    return bool(getattr(dtype, "is_floating_point", False) or getattr(dtype, "kind", "") in "fc" and
                getattr(dtype, "kind", "") != "")


def _tensor_rows(t) -> list[list[int]]:
    if t.ndim == 1:
        return [t.tolist()]
    if t.ndim == 2:
        return t.tolist()
    raise ValueError(f"a token-id tensor must be [T] or [B, T], got shape {tuple(t.shape)}")


def _from_encoding(enc) -> list[list[int]]:
    ids, mask = enc["input_ids"], enc.get("attention_mask")
    rows = _tensor_rows(ids) if hasattr(ids, "ndim") else ([list(ids)] if _is_ids(ids) else [list(r) for r in ids])
    if mask is not None:
        masks = _tensor_rows(mask) if hasattr(mask, "ndim") else ([list(mask)] if _is_ids(mask) else list(mask))
        rows = [[t for t, m in zip(r, mk) if m] for r, mk in zip(rows, masks)]   # drop padding
    return rows


def normalize_prompts(prompts, tokenizer, model: str, *,
                      add_special_tokens: bool = True) -> tuple[list[str | None], list[list[int]]]:
    """(texts, token ids) per prompt; text prompts are encoded with the tokenizer (with its special
    tokens, BOS and the like, unless add_special_tokens=False)."""
    if prompts is None or isinstance(prompts, (bytes, bytearray, numbers.Number)):
        raise ValueError(f"prompts must not be {type(prompts).__name__}: {_WHAT}")
    if isinstance(prompts, str):
        prompts = [prompts]
    elif isinstance(prompts, Mapping):
        if "input_ids" not in prompts:
            raise ValueError(f"a mapping prompt needs 'input_ids' (a BatchEncoding): {_WHAT}")
        prompts = _from_encoding(prompts)
    elif hasattr(prompts, "ndim") and hasattr(prompts, "tolist"):       # torch / numpy
        if _is_float(prompts.dtype):
            raise ValueError(f"a token-id tensor must hold integers, got {prompts.dtype}")
        prompts = _tensor_rows(prompts)
    else:
        try:
            prompts = list(prompts)
        except TypeError:
            raise ValueError(f"prompts must not be {type(prompts).__name__}: {_WHAT}") from None
        if prompts and all(isinstance(t, numbers.Integral) for t in prompts):
            raise ValueError("a flat list of ints is ambiguous: pass [[1, 2, 3]] for one prompt of token ids "
                             "(a list of token-id lists for several)")
    texts, ids = [], []
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            if tokenizer is None:
                raise ValueError(f"prompt {i} is text but {model} has no tokenizer; pass token ids")
            texts.append(p)
            ids.append(tokenizer.encode(p, add_special_tokens=add_special_tokens))
        elif hasattr(p, "ndim") and hasattr(p, "tolist") and p.ndim == 1:
            texts.append(None)
            ids.append([int(t) for t in p.tolist()])
        elif _is_ids(p):
            texts.append(None)
            ids.append([int(t) for t in p])
        else:
            raise ValueError(f"prompt {i} must be a str or a list of token ids, got {type(p).__name__}")
    return texts, ids


def _is_message(m) -> bool:
    return isinstance(m, Mapping) and "role" in m


def chat_prompts(messages, tokenizer, chat_template: str | None = None, *, add_generation_prompt: bool = True,
                 continue_final_message: bool = False, template_kwargs: Mapping | None = None,
                 add_special_tokens: bool = False) -> tuple[list[str], list[list[int]]]:
    """(templated texts, token ids) for one conversation or a list of conversations.

    add_generation_prompt: end with the assistant's turn opening (the default);
    continue_final_message: leave the last message open so the model continues it (not with
    add_generation_prompt); template_kwargs: more variables for the template; add_special_tokens:
    special tokens on top of the template's own (off: the template holds BOS and the like)."""
    if add_generation_prompt and continue_final_message:
        raise ValueError("add_generation_prompt must be false when continue_final_message is true")
    if tokenizer is None:
        raise ValueError("chat needs a tokenizer with a chat template in the model folder")
    if chat_template is None and not getattr(tokenizer, "chat_template", None):
        raise ValueError("the model's tokenizer has no chat template; pass chat_template= or use generate()")
    if isinstance(messages, (list, tuple)) and messages and all(_is_message(m) for m in messages):
        conversations = [list(messages)]
    elif isinstance(messages, (list, tuple)) and all(
            isinstance(c, (list, tuple)) and c and all(_is_message(m) for m in c) for c in messages):
        conversations = [list(c) for c in messages]
    else:
        raise ValueError('messages must be a conversation ([{"role": "user", "content": "Hi"}]) '
                         "or a list of conversations")
    texts = []
    for conv in conversations:
        try:
            texts.append(tokenizer.apply_chat_template(
                conv, chat_template=chat_template, tokenize=False, add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message, **(template_kwargs or {})))
        except Exception as e:       # jinja raises its own types for templates that reject a message
            raise ValueError(f"the chat template rejected the messages: {e}") from None
    return texts, [tokenizer.encode(t, add_special_tokens=add_special_tokens) for t in texts]
