"""The model: its config, the decoder-only Transformer, int8 layers, the KV cache and the runner that steps it."""
