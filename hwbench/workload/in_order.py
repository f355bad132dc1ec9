"""Results of a pool's calls in the order of their inputs, with a bounded number in flight: the
tokenizer's worker processes (prepare.py) and the weight draws on threads (model.py) both keep
what is held at once to a few items, not the whole input."""

from __future__ import annotations

import collections
import concurrent.futures
from collections.abc import Callable, Iterable, Iterator
from typing import Any


def in_order(pool: concurrent.futures.Executor, call: Callable[[Any], Any], items: Iterable[Any],
             in_flight: int) -> Iterator[Any]:
    """``call(item)`` for each item, computed by ``pool``, yielded in input order with at most
    ``in_flight`` submitted and not yet yielded."""
    pending: collections.deque = collections.deque()
    for item in items:
        pending.append(pool.submit(call, item))
        if len(pending) >= in_flight:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()
