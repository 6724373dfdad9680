"""Plans: the format (plan), what runs one (interpreter, simulate, allocator), and what makes
one (decoders from solver values, heuristic planners)."""
