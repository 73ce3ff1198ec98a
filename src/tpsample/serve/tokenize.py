"""vLLM's /tokenize and /detokenize, run in the preparation threads (`Preparer.run`).

/tokenize takes `prompt` (text; special tokens added unless `add_special_tokens: false`) or
`messages` (the chat template applied, with `add_generation_prompt`, `continue_final_message`
and `chat_template_kwargs` as in chat completions) and answers {count, max_model_len, tokens,
token_strs} (`token_strs`, the tokens' vocabulary strings, with `return_token_strs`, else null).
/detokenize takes `tokens` (ids in the vocabulary) and answers {"prompt": text}. The server's
limits on messages and prompt characters hold here too.
"""
from __future__ import annotations

from tpsample.serve import protocol as P
from tpsample.serve.inputs import Preparer


def tokenize(preparer: Preparer, body: bytes) -> dict:
    req = preparer.parse(P.TokenizeRequest, body)
    tokenizer = preparer.tokenizer
    if tokenizer is None:
        raise ValueError("prompt: /tokenize needs a tokenizer in the model folder")
    _, ids = preparer.chat_prompt(req) if req.messages is not None else preparer.text_prompt(req)
    tokens = ids[0]
    return {"count": len(tokens), "max_model_len": preparer.max_model_len, "tokens": tokens,
            "token_strs": tokenizer.convert_ids_to_tokens(tokens) if req.return_token_strs else None}


def detokenize(preparer: Preparer, vocab_size: int, body: bytes) -> dict:
    req = preparer.parse(P.DetokenizeRequest, body)
    if preparer.tokenizer is None:
        raise ValueError("tokens: /detokenize needs a tokenizer in the model folder")
    bad = [t for t in req.tokens if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"tokens must be token ids in [0, {vocab_size}), got {bad[0]}")
    return {"prompt": preparer.tokenizer.decode(req.tokens)}
