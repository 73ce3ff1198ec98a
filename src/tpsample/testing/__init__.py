"""Tiny random checkpoints and tokenizers for tests and offline fallbacks (`toy`)."""
