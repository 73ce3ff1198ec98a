"""Tiny random checkpoints and a local byte-level tokenizer, for tests and the demo.

Everything is built here from a config with transformers; nothing is downloaded.
"""
from __future__ import annotations

import os

import torch

QWEN2_VOCAB = 151_936
TOY_CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                     "{% if add_generation_prompt %}assistant:{% endif %}")


def make_random_checkpoint(folder: str, *, family: str = "qwen2", vocab_size: int = 512,
                           hidden_size: int = 64, num_layers: int = 2, num_heads: int = 4,
                           num_kv_heads: int = 2, intermediate_size: int = 128,
                           tie_word_embeddings: bool = False, rope_scaling: dict | None = None,
                           max_position_embeddings: int = 1024, eos_token_id: int | None = None,
                           init_std: float = 0.02, seed: int = 0, tokenizer: bool = False,
                           chat_template: bool = False) -> str:
    """Write config.json + model.safetensors (+ a byte-level tokenizer, + a plain chat template)."""
    import transformers

    torch.manual_seed(seed)
    kwargs = dict(vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=num_layers,
                  num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
                  intermediate_size=intermediate_size, tie_word_embeddings=tie_word_embeddings,
                  max_position_embeddings=max_position_embeddings, initializer_range=init_std,
                  eos_token_id=eos_token_id, bos_token_id=None)
    if rope_scaling is not None:
        kwargs["rope_scaling"] = rope_scaling
    if family == "qwen2":
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**kwargs))
    elif family == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**kwargs))
    else:
        raise ValueError(f"family must be 'qwen2' or 'llama', got {family!r}")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, init_std)          # transformers zeroes biases; make them matter
    os.makedirs(folder, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    if tokenizer:
        tok = make_byte_tokenizer(vocab_size, eos_token_id)
        if chat_template:
            tok.chat_template = TOY_CHAT_TEMPLATE
        tok.save_pretrained(folder)
    return folder


def make_chat_checkpoint(folder: str, *, family: str = "llama", vocab_size: int = 500, **kw) -> str:
    """A random checkpoint a chat front end can talk to: a tokenizer, a chat template, EOS = 0,
    and weights large enough (std 0.3) that greedy answers vary with the prompt."""
    return make_random_checkpoint(folder, family=family, vocab_size=vocab_size, init_std=0.3, eos_token_id=0,
                                  tokenizer=True, chat_template=True, **kw)


def make_byte_tokenizer(max_vocab: int, eos_token_id: int | None = None):
    """A byte-level BPE tokenizer trained on a few strings (ids < max_vocab).

    Its EOS is `<|endoftext|>`, id 0; pass eos_token_id=0 to the checkpoint to agree.
    """
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    assert eos_token_id in (None, 0), "the toy tokenizer's EOS is id 0"
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=min(max_vocab, 400), special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    corpus = ['{"name": "Alice", "age": 30, "tags": ["a", "b"]}', "the quick brown fox jumps over the lazy dog",
              '{"ok": true, "items": [1, 2, 3], "none": null}', "hello world, hello tensor parallel sampling"]
    tok.train_from_iterator(corpus * 8, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")
