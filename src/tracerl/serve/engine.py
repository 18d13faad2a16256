"""One worker thread owns the model: requests from any thread are queued and run in batches.

Generation jobs that arrive while the worker is busy are merged into the next batch (up to
`max_batch_size` rows; rows of different adapters run together through PEFT's mixed batches).
Adapter loads and unloads go through the same queue, so they never change the weights under a
running batch. A full queue refuses new work (`QueueFull`) instead of growing without bound.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from tracerl.models.generation import GenerationRequest, GenerationResult
from tracerl.models.local import LocalPolicy


class QueueFull(Exception):
    """The engine's queue is at capacity; the client should retry later."""


@dataclass
class _Job:
    future: Future
    requests: list[GenerationRequest] | None = None
    call: Callable[[], Any] | None = None


class Engine:
    def __init__(self, policy: LocalPolicy, *, max_batch_size: int = 16, max_queue: int = 256):
        self.policy = policy
        self.max_batch_size = max_batch_size
        self._queue: queue.Queue[_Job | None] = queue.Queue(maxsize=max_queue)
        self._thread = threading.Thread(target=self._work, name="tracerl-engine", daemon=True)
        self._thread.start()
        self.batches_run = 0
        self.rows_run = 0

    def generate(self, requests: list[GenerationRequest]) -> Future:
        """A future of the results, one per request, in order."""
        return self._put(_Job(Future(), requests=list(requests)))

    def call(self, fn: Callable[[], Any]) -> Future:
        """Run `fn()` on the worker thread between batches (adapter load/unload)."""
        return self._put(_Job(Future(), call=fn))

    def close(self, timeout: float = 10.0) -> None:
        self._queue.put(None)
        self._thread.join(timeout)

    def _put(self, job: _Job) -> Future:
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            raise QueueFull(f"the server is busy ({self._queue.maxsize} requests queued); retry later") from None
        return job.future

    def _work(self) -> None:
        pending: _Job | None = None
        while True:
            job = pending if pending is not None else self._queue.get()
            pending = None
            if job is None:
                return
            if job.call is not None:
                _run(job.future, job.call)
                continue
            batch = [job]
            rows = len(job.requests or [])
            while rows < self.max_batch_size:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None or nxt.call is not None or rows + len(nxt.requests or []) > self.max_batch_size:
                    pending = nxt
                    break
                batch.append(nxt)
                rows += len(nxt.requests or [])
            self._run_batch(batch)

    def _run_batch(self, batch: list[_Job]) -> None:
        requests = [r for job in batch for r in (job.requests or [])]
        live = {id(job) for job in batch if job.future.set_running_or_notify_cancel()}
        try:
            results: list[GenerationResult] = self.policy.generate_requests(requests)
        except Exception as e:  # noqa: BLE001 — reported to every waiting request
            for job in batch:
                if id(job) in live:
                    job.future.set_exception(e)
            return
        self.batches_run += 1
        self.rows_run += len(requests)
        start = 0
        for job in batch:
            n = len(job.requests or [])
            if id(job) in live:
                job.future.set_result(results[start:start + n])
            start += n


def _run(future: Future, fn: Callable[[], Any]) -> None:
    if not future.set_running_or_notify_cancel():
        return
    try:
        future.set_result(fn())
    except Exception as e:  # noqa: BLE001
        future.set_exception(e)
