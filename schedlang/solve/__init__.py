"""Solving the IR: backends (Pyomo, CVXPY), one adapter per solver (solvers/), the status
table, relaxations, the outside incumbent, the default strategy and budget bisection."""
