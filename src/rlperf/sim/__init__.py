"""The RL iteration simulator: a deterministic discrete-event simulation of iterations."""
