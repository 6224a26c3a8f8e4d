"""Vision-language (image + text → text) and text-only causal LM policies: ``adapter.py`` + ``tiny.py``."""
