"""Checkpoints on disk (Hugging Face directories, GGUF files) to a ready model with its tokenizer."""
