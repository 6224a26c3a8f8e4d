"""Speech policies: Whisper (seq2seq) and Qwen2-Audio (decoder-only with an audio encoder)."""
