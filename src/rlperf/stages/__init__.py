"""Stage cost models: rollout, forward-only passes, training step, weight sync."""
