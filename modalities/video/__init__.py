"""Video LLM policies (video + text → text): the VLM token policy with a video media encoder."""
