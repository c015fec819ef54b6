"""rollserve: rollout-as-a-service for RL of multi-turn LLM agents."""

__version__ = "0.2.0"
