"""The code family: the agent writes a solution in a sandbox; hidden tests decide it."""
