"""Inference backends: the servers and in-process models that sample token ids."""
