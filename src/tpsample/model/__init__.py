"""Llama/Qwen2-family model with tensor-parallel layers and a sharded safetensors loader."""
from tpsample.model.attention import (
    AttentionMetadata,
    PagedAttention,
    PagedMetadata,
    build_attention_metadata,
    build_paged_metadata,
    slot_mapping_np,
)
from tpsample.model.checkpoint import check_checkpoint, expected_tensors
from tpsample.model.config import ModelConfig
from tpsample.model.llama import CausalLM
from tpsample.model.loader import load_model, resolve_dtype
from tpsample.model.parallel_layers import TPGroup

__all__ = ["AttentionMetadata", "CausalLM", "ModelConfig", "PagedAttention", "PagedMetadata", "TPGroup",
           "build_attention_metadata", "build_paged_metadata", "check_checkpoint", "expected_tensors", "load_model",
           "resolve_dtype", "slot_mapping_np"]
