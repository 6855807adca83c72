"""Model configs, loaders (HF safetensors directories, GGUF files), tokenizer and the transformer."""
