"""OpenAI-compatible HTTP serving on top of the engine (`tpsample serve`)."""
