"""Per-operation costs: FLOPs, memory, roofline time, collectives."""
