"""Token-policy machinery shared by the token adapters (VLM, video; AR image and speech LLMs): KV-expanded
sampling and prefix sharing (``prefix_sharing``), and the media encoders a token policy composes (``media``:
the encoder protocol and images; ``video``: frame sampling, the time axis and the decode cache)."""
