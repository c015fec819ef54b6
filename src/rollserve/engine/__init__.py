"""The three-stage pipeline, the rollout state machine and the store."""
