"""Text sources -> token windows and splits; the default assets (model, text) and the GGUF conversion."""
