"""Tokens: chat templates, tokenizers (local or the serving backend's) and append-only prompts."""
