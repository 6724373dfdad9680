"""Importable test material: tiny instances of each graph view and the brute-force oracles the
ILP optima are compared with (used by tests/ and bench/; never by the library itself)."""
