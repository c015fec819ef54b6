"""Routing: sticky sessions over the registered backends, health, pause/resume, policy versions."""
