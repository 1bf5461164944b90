# SPDX-License-Identifier: Apache-2.0
"""kvpool for asyncio: AsyncClient and AsyncSubscriber.

    import kvpool.aio
    async with await kvpool.aio.AsyncClient.open(url, pool="default") as c:
        ids = await c.allocate(4)
        await c.free(ids)
    async with kvpool.aio.AsyncSubscriber(events_url, url, pools=["default"]) as sub:
        async for item in sub:           # Reset, then EventBatch, as Subscriber.poll
            ...

The C client is blocking (one REQ socket, one call at a time), so
AsyncClient runs each call of a kvpool.Client on a thread of its own, one
call after another in the order they were awaited: the event loop never
blocks on the network, and a call's errors are raised where it is awaited.
A cancelled await does not recall a call that the daemon may already
have applied (a mutating call is retried safely by its call id, as the
blocking client's are); its result is dropped. For many calls at once,
a Batch in one await (await c.send_batch(build)) is one round trip.

AsyncSubscriber wakes on Subscriber.fileno() through the loop's reader,
so it costs no thread."""
from __future__ import annotations

import asyncio
import functools
from concurrent.futures import ThreadPoolExecutor
from typing import Any, AsyncIterator, Callable, Optional, Sequence, Union

from .batch import Batch, CallResult
from .client import Client
from .events import EventBatch, Reset, Subscriber

# Client members that are not calls: read directly, not through the thread.
_PLAIN = frozenset({"info", "url", "hash_len"})


class AsyncClient:
    """A kvpool.Client whose calls are coroutines. Make one with
    `await AsyncClient.open(...)` (Client's arguments: Hello runs off the
    loop); every public Client call is here with the same arguments,
    awaited. info is read as is."""

    def __init__(self, client: Client) -> None:
        if not isinstance(client, Client):
            raise TypeError("kvpool: AsyncClient wraps a kvpool.Client (or use AsyncClient.open)")
        self._client = client
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvpool-aio")

    @classmethod
    async def open(cls, url: str, pool: Optional[str] = None, token: Optional[str] = None,
                   **kwargs: Any) -> AsyncClient:
        """Connects and says Hello off the event loop; kvpool.Client's arguments."""
        loop = asyncio.get_running_loop()
        client = await loop.run_in_executor(None, functools.partial(Client, url, pool, token,
                                                                    **kwargs))
        return cls(client)

    @property
    def client(self) -> Client:
        """The blocking client underneath (its calls block the caller)."""
        return self._client

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        attr = getattr(self._client, name)
        if name in _PLAIN or not callable(attr):
            return attr

        @functools.wraps(attr)
        async def call(*args: Any, **kwargs: Any) -> Any:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._pool, functools.partial(attr, *args,
                                                                            **kwargs))
        return call

    async def send_batch(self, build: Callable[[Batch], Any], *,
                         keep_going: bool = False) -> list[CallResult]:
        """Builds a Batch with build(batch) and sends it, off the loop, as one round trip."""
        def run() -> list[CallResult]:
            with self._client.batch(keep_going=keep_going) as b:
                build(b)
                return b.send()
        return await asyncio.get_running_loop().run_in_executor(self._pool, run)

    async def close(self) -> None:
        """Waits for the calls in progress, then says Goodbye and closes."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._pool, self._client.close)
        self._pool.shutdown(wait=True)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncSubscriber:
    """A kvpool.Subscriber whose items an event loop awaits: `async for`
    yields what Subscriber.poll returns (Reset, EventBatch), waking on the
    subscriber's descriptor. Subscriber's arguments."""

    def __init__(self, events_url: str, rpc_url: str, *, pools: Sequence[str] = ("default",),
                 **kwargs: Any) -> None:
        self._sub = Subscriber(events_url, rpc_url, pools=pools, **kwargs)
        self._ready: list[Union[Reset, EventBatch]] = []

    @property
    def subscriber(self) -> Subscriber:
        """The subscriber underneath (stats(), index)."""
        return self._sub

    async def next(self, timeout: Optional[float] = None) -> Union[Reset, EventBatch]:
        """The next item; asyncio.TimeoutError after timeout seconds (None: wait)."""
        return await asyncio.wait_for(self._next(), timeout)

    async def _next(self) -> Union[Reset, EventBatch]:
        loop = asyncio.get_running_loop()
        while not self._ready:
            self._ready.extend(self._sub.poll(0))
            if self._ready:
                break
            woke = loop.create_future()
            fd = self._sub.fileno()

            def wake() -> None:
                if not woke.done():
                    woke.set_result(None)
            loop.add_reader(fd, wake)
            try:
                await woke
            finally:
                loop.remove_reader(fd)
        return self._ready.pop(0)

    def __aiter__(self) -> AsyncIterator[Union[Reset, EventBatch]]:
        return self

    async def __anext__(self) -> Union[Reset, EventBatch]:
        return await self._next()

    def close(self) -> None:
        self._sub.close()

    async def __aenter__(self) -> AsyncSubscriber:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()
