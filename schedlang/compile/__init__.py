"""The compiler: a checked program and its graph data lowered to the IR (lower, relational,
logic), sized (sizes), made smaller (presolve), and moved from budget to budget (parametric)."""
