"""Text in and out: tokenizers, chat templates, incremental detokenization."""
