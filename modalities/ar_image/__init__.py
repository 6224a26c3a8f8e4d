"""Autoregressive text-to-image policies over VQ image tokens (Janus / Janus-Pro): ``adapter.py`` + ``tiny.py``."""
