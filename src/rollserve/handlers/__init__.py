"""Task families: one AgentHandler per data_source, and the registry."""
