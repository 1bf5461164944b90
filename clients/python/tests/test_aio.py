# SPDX-License-Identifier: Apache-2.0
"""kvpool.aio against a real kvpoold: AsyncClient's calls are awaited in
order without blocking the loop, errors are raised where awaited, a Batch
is one await; AsyncSubscriber yields the stream's items from the loop."""
import asyncio

import pytest

import kvpool
from kvpool.aio import AsyncClient, AsyncSubscriber

from conftest import start, stop


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    proc, url, ev = start(tmp_path_factory.mktemp("kvpoold-aio"),
                          "--pool", "name=kv,blocks=16,block_size=4,seed=0,executor=none",
                          pool="kv", events=True)
    yield url, ev
    stop(proc)


def test_calls_are_awaited_in_order_and_errors_raise_there(served):
    url, _ = served

    async def main():
        async with await AsyncClient.open(url, pool="kv") as c:
            assert c.info["pool"] == "kv"
            ticks = 0

            async def ticker():  # the loop keeps running while calls wait on the network
                nonlocal ticks
                while True:
                    ticks += 1
                    await asyncio.sleep(0)
            t = asyncio.ensure_future(ticker())
            got = await asyncio.gather(*(c.allocate(2) for _ in range(4)))
            t.cancel()
            assert sorted(i for ids in got for i in ids) == list(range(1, 9))
            assert got[0] == [1, 2]  # awaited in order, served in order
            assert ticks > 0
            with pytest.raises(kvpool.NoSpace):
                await c.allocate(100)
            with pytest.raises(TypeError):
                await c.allocate("two")
            res = await c.send_batch(lambda b: [b.free(ids) for ids in got])
            assert all(r.ok for r in res)
            assert (await c.stats())["num_free"] == 15
    asyncio.run(main())


def test_subscriber_yields_from_the_loop(served):
    url, ev = served

    async def main():
        async with AsyncSubscriber(ev, url, pools=["kv"]) as sub, \
                await AsyncClient.open(url, pool="kv") as c:
            first = await sub.next(timeout=10)
            assert isinstance(first, kvpool.Reset) and first.pool == "kv"
            ids = await c.allocate(1)
            await c.cache(ids, range(40, 44), 1)
            async for item in sub:
                if isinstance(item, kvpool.EventBatch) and any(
                        isinstance(e, kvpool.BlockStored) for e in item.events):
                    break
            await c.free(ids)
            with pytest.raises(asyncio.TimeoutError):
                while True:  # nothing more but the stream's ticks: times out
                    item = await sub.next(timeout=0.2)
                    assert not (isinstance(item, kvpool.EventBatch) and item.events)
    asyncio.run(asyncio.wait_for(main(), 30))


def test_wraps_only_a_client():
    with pytest.raises(TypeError):
        AsyncClient("ipc:///nowhere")
