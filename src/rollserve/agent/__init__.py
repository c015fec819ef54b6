"""The multi-turn agent loop and the token-level trajectory."""
