"""kvrl's model code: HF checkpoint config and loading, and a causal LM over a paged KV cache."""
from kvrl.model.config import ModelConfig
from kvrl.model.loader import load_model
from kvrl.model.metadata import AttentionMetadata, PaddedAttentionMetadata
from kvrl.model.model import CausalLM
from kvrl.model.random_checkpoint import make_random_checkpoint

__all__ = ["AttentionMetadata", "CausalLM", "PaddedAttentionMetadata", "ModelConfig", "load_model", "make_random_checkpoint"]
