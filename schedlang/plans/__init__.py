"""Plans: what runs them (`interpreter`)."""
