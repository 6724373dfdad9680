"""Size guards: how large a model may get before lowering materializes it (issue 11).

Lowering builds each declaration's index domain as a binding table, one join or product at a
time. Before each step materializes rows, it knows how many it will make: a product is the
product of the cardinalities, a join on keys counts its matches in the sorted key index, and a
range `lo..hi` counts its integers. When that count passes the limit, lowering stops with a
`SizeError` located at the declaration being built, naming it, the count and the limit. The
count is taken before `where` filters that cannot be used as join keys, so it is an upper
bound of the declaration's final element count (exact for plain products and joins).

`DEFAULT_MAX_ELEMENTS` is 20 million rows in one binding table: the largest table the shipped
models build on the shared Checkmate graphs is 453,886 rows (checkmate on resnet50_train, whose
model has 350k variables and 550k rows), and at most 7,800 on the shipped examples, so the
default leaves a 44x margin, while a 20-million-row table of three int64 columns is ~0.5 GB
(docs/reliability.md). `--max-elements N` (check, solve, sweep) and `max_elements=` (Python:
`load`, `lower_program`) raise or lower it.
"""
from __future__ import annotations

from ..language.errors import DataError

DEFAULT_MAX_ELEMENTS = 20_000_000


class SizeError(DataError):
    """A declaration's domain (or a table built while lowering it) is larger than the limit."""


def size_message(name: str | None, count: int, limit: int) -> str:
    who = f"'{name}'" if name else "the model"
    return (f"{who} would have {count:,} elements (estimated from the sizes of its index sets, "
            f"before it is built), over the limit of {limit:,}; raise the limit with "
            f"--max-elements N (Python: max_elements=N) if the machine has the memory")


