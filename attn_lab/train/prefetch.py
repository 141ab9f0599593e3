"""Background prefetch: the next batches are read, padded and placed on the device while the current step runs.

The training loop then only dispatches compiled steps, so the host never leaves the device idle waiting for data.
One worker thread computes ``fn(item)`` for the items *in order* (the batch for step ``s`` is still
``dataset[s - 1]``, so resumed runs stay exact), at most ``depth`` items ahead of the consumer (bounded memory).
Exceptions raised by ``fn`` re-raise in the consumer at the item that raised them; leaving the ``with`` block --
normally, on an exception or on Ctrl-C -- cancels what is queued and joins the worker, so nothing is left running.
"""

from __future__ import annotations

import collections
import concurrent.futures
from typing import Callable, Generic, Iterable, Iterator, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Prefetcher(Generic[T, R]):
    """Iterates ``(item, fn(item))`` over ``items``, computing ``fn`` up to ``depth`` items ahead in one thread.

    Use as a context manager so the worker is always stopped::

        with Prefetcher(make_batch, range(1, n + 1), depth=2) as batches:
            for step, batch in batches:
                ...
    """

    def __init__(self, fn: Callable[[T], R], items: Iterable[T], depth: int = 2):
        if depth < 1:
            raise ValueError(f"prefetch depth must be >= 1, got {depth}")
        self._fn, self._items, self._depth = fn, iter(items), depth
        self._pending: collections.deque[tuple[T, concurrent.futures.Future]] = collections.deque()
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="attn_lab-prefetch")

    def __enter__(self) -> Prefetcher[T, R]:
        self._fill()
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __iter__(self) -> Iterator[tuple[T, R]]:
        return self

    def __next__(self) -> tuple[T, R]:
        if not self._pending:
            raise StopIteration
        item, future = self._pending.popleft()
        self._fill()  # queue the next item before waiting, so the worker never idles while we wait
        return item, future.result()

    def close(self) -> None:
        """Cancels queued items, waits for the one in progress (one batch: short) and stops the worker."""
        self._pending.clear()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _fill(self) -> None:
        while len(self._pending) < self._depth:
            item = next(self._items, _END)
            if item is _END:
                return
            self._pending.append((item, self._pool.submit(self._fn, item)))


_END = object()
