"""The planner: plan space, fast estimate, search, explanation and reports."""
