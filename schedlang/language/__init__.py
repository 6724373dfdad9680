"""The language: `.sched` text read into a checked program (parser, ast, program, check,
builtins), located errors, units, the paths and files a user gives, the shipped resources."""
