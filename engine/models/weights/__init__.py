"""Checkpoint readers (GGUF files and Hugging Face directories, both yielding HF-named tensors) and the
Hugging Face directory writer."""
