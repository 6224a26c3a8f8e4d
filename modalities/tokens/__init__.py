"""Token-policy machinery shared by the token adapters (VLM, video; AR image and speech LLMs)."""
