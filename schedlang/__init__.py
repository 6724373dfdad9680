"""schedlang: declarative memory scheduling for neural-network training.

    import schedlang
    prob = schedlang.load("examples/chain.sched", budget="80%")
    result = prob.solve(backend="cvxpy", solver="highs")
    print(result.status, result.objective, result.simulated.peak_bytes)
"""
from .language.errors import SchedError
from .plans.simulate import simulate
from .problem import Problem, load
from .results import Result

__version__ = "0.1.0"
__all__ = ["load", "simulate", "Problem", "Result", "SchedError", "__version__"]
