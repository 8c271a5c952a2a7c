"""Pantheon's torch inference engine: model, loaders, tokenizer, chat templates, sampler, KV cache.

Importable and testable without Django; nothing in this package imports Django or the rest of `inference`.
"""
