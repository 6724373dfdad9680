"""`python -m schedlang.cli`: the command line."""
from .main import entry

entry()
