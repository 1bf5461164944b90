# SPDX-License-Identifier: Apache-2.0
"""vLLM 0.33 engines on kvpool's offloading tier while kvpoold fails under
them: killed between a granted HIT and its load, a session at its quota,
and the chaos test (four engines, kvpoold killed, stopped and restarted at
random; tests/CMakeLists.txt runs it alone: test_vllm_chaos). The engines
are test_offload's: vLLM's own Scheduler and OffloadingConnector over CPU
tensors, each block's KV a function of its prefix."""
import os
import signal
import time

import pytest

pytest.importorskip("vllm")
from test_offload import (BS, PROMPT, Engine, loaded_from_tier, model_dir,  # noqa: E402,F401
                          pattern, tier_args)

import kvpool  # noqa: E402
import torch  # noqa: E402

from conftest import start, stop  # noqa: E402


@pytest.mark.parametrize("restart", [False, True])
def test_a_granted_hit_loads_after_kvpoold_dies(model_dir, tmp_path, restart):
    """kvpoold restarts while engine B is idle (B's worker has mapped only
    the first life's region); A stores a prompt in the second life; B's
    lookups hit it (locks taken in the second life) and its scheduler hands
    the load to its worker; kvpoold is killed before the worker runs it (and
    with restart, a third kvpoold starts and removes the dead one's region
    file). B's worker still loads the right bytes, through the scheduler's
    descriptor of that region, without waiting on kvpoold: no engine dies of
    a HIT it was granted. Once the load is done B lets the region go."""
    d = tmp_path / "granted"
    d.mkdir()
    args = tier_args(tmp_path)
    proc, url, _ = start(d, *args, pool="tier")
    engines, later = [], []
    try:
        b = Engine(model_dir, url, "granted-b")
        engines.append(b)
        proc.kill()
        proc.wait()
        proc, _, _ = start(d, *args, pool="tier")  # B idle: it has not seen this life
        a = Engine(model_dir, url, "granted-a")
        engines.append(a)
        a.add(PROMPT)
        a.run()
        region2 = a.manager._regions[a.manager._epoch()].ref()
        req = b.add(PROMPT)
        killed: list = []

        def kill_when_loading(out):
            if b.manager._loading and not killed:
                proc.kill()
                proc.wait()
                killed.append(time.monotonic())
                if restart:  # a new kvpoold sweeps the dead one's region file away
                    killed.append(start(d, *args, pool="tier")[0])
                    later.append(killed[1])

        first = loaded = None
        slowest = 0.0
        for _ in range(40):
            t0 = time.monotonic()
            out = b.step(kill_when_loading)
            slowest = max(slowest, time.monotonic() - t0)
            if req.request_id in out.num_scheduled_tokens and first is None:
                first = out.num_scheduled_tokens[req.request_id]
                ids = b.scheduler.kv_cache_manager.get_block_ids(req.request_id)[0]
                loaded = [b.block_bytes(ids[i]) for i in range(4)]
            if req.is_finished() and not b.conn._jobs:
                break
        assert killed, "B's scheduler never handed its worker a load"
        if restart:
            proc = killed[1]
            # the swept file: only B's scheduler's descriptor still reaches it
            assert not any(p.name.startswith(f"kvpool-tier-") and
                           os.stat(p).st_ino == region2.ino for p in tmp_path.iterdir())
        assert req.is_finished() and first == len(PROMPT) - 4 * BS, first
        for i in range(4):
            for got in loaded[i]:
                assert torch.equal(got, pattern(bytes(req.block_hashes[i]) + b"\0", b.page)), \
                    f"block {i}: wrong bytes loaded"
        assert slowest < 3.0, f"a step waited {slowest:.1f} s on the tier"
        b.run()  # its locks' release fails (or renews), so the dead life goes
        assert region2.ino not in [r.ref().ino for r in b.manager._regions.values()], \
            "B still holds the dead life's region after its load"
    finally:
        for e in engines:
            e.close()
        for p in [proc] + later:
            if p.poll() is None:
                stop(p)


def test_an_engine_at_its_quota_misses_never_raises(model_dir, tmp_path):
    """A pool whose sessions may hold 4 rows (session_rows=4): engine A's store
    of a 6-block prompt is refused QUOTA_EXCEEDED, which the tier turns into a
    skipped store (no exception into vLLM), and its session is not dropped:
    a 4-block prompt after it is stored, and engine B loads it."""
    d = tmp_path / "quota"
    d.mkdir()
    proc, url, _ = start(d, *tier_args(tmp_path, extra=",session_rows=4"), pool="tier")
    engines = []
    try:
        a = Engine(model_dir, url, "quota-a")
        engines.append(a)
        a.add(list(range(8000, 8000 + 6 * BS + 1)))
        a.run()
        assert a.manager.errors == 0 and not a.manager._suspect
        with kvpool.Client(url, pool="tier") as c:
            assert c.stats()["num_cached_keys"] == 0  # nothing stored: over the quota
        a.add(PROMPT)
        a.run()
        b = Engine(model_dir, url, "quota-b")
        engines.append(b)
        loaded_from_tier(b, PROMPT, "A's store within its quota did not reach the tier")
    finally:
        for e in engines:
            e.close()
        stop(proc)


CHAOS_S = float(os.environ.get("KVP_CHAOS_S", "60"))


def test_chaos_engines_never_fail_nor_load_wrong_bytes(model_dir, tmp_path):
    """Four engines share one kvpoold that is SIGKILLed and restarted,
    SIGSTOPped and resumed, and stopped and restarted at random moments for
    KVP_CHAOS_S seconds (60), while each serves prompts drawn from a small
    set (so they hit each other's blocks). No step raises; every block a
    request starts with (loaded from the tier, or cached on its own GPU)
    holds the bytes its prefix gives; once kvpoold runs again and the
    engines are idle, no row is held 2 s later; and no step waits on the
    tier much longer than one call's timeout (1 s)."""
    import random
    import threading

    rng = random.Random(int(os.environ.get("KVP_CHAOS_SEED", "2026")))
    d = tmp_path / "chaos"
    d.mkdir()
    args = tier_args(tmp_path, 96)
    daemon = {"proc": start(d, *args, pool="tier")[0], "stopped": False}
    url = f"ipc://{d}/rpc.ipc"
    lock = threading.Lock()
    done = threading.Event()
    faults: dict = {"kill": 0, "stop": 0, "restart": 0}

    def chaos():
        crng = random.Random(rng.random())
        while not done.wait(crng.uniform(1.0, 4.0)):
            what = crng.choice(["kill", "stop", "restart"])
            with lock:
                p = daemon["proc"]
                if what == "stop":
                    p.send_signal(signal.SIGSTOP)
                    daemon["stopped"] = True
            faults[what] += 1
            if what == "stop":
                done.wait(crng.uniform(0.2, 2.5))
                with lock:
                    p.send_signal(signal.SIGCONT)
                    daemon["stopped"] = False
                continue
            if what == "kill":
                p.kill()
            else:
                p.terminate()
            p.wait()
            done.wait(crng.uniform(0.0, 1.5))
            with lock:
                daemon["proc"] = start(d, *args, pool="tier")[0]

    prompts = [list(range(20000 + 1000 * k, 20000 + 1000 * k + 4 * BS + 3)) for k in range(8)]
    engines = [Engine(model_dir, url, f"chaos-{i}") for i in range(4)]
    thread = threading.Thread(target=chaos, daemon=True)
    checked = blocks_checked = steps = 0
    slowest = 0.0
    try:
        thread.start()
        verified: set = set()
        t_end = time.monotonic() + CHAOS_S
        while time.monotonic() < t_end:
            for e in engines:
                if len(e.scheduler.requests) < 2 and rng.random() < 0.5:
                    e.add(rng.choice(prompts))
                t0 = time.monotonic()
                out = e.step()
                slowest = max(slowest, time.monotonic() - t0)
                steps += 1
                for rid, n in out.num_scheduled_tokens.items():
                    key = (e.cfg.kv_transfer_config.engine_id, rid)
                    if key in verified:
                        continue
                    verified.add(key)
                    req = e.scheduler.requests[rid]
                    had = (req.num_computed_tokens - n) // BS  # blocks it started with
                    ids = e.scheduler.kv_cache_manager.get_block_ids(rid)[0]
                    for i in range(had):
                        for got in e.block_bytes(ids[i]):
                            assert torch.equal(got, pattern(bytes(req.block_hashes[i]) + b"\0",
                                                            e.page)), \
                                f"{key} block {i}: wrong bytes after faults {faults}"
                        blocks_checked += 1
                    checked += 1
        done.set()
        thread.join()
        with lock:
            if daemon["stopped"]:
                daemon["proc"].send_signal(signal.SIGCONT)
        # Idle: every engine finishes what it has and renews a suspect session.
        t_idle = time.monotonic() + 60
        for e in engines:
            while (e.scheduler.requests or e.conn._jobs or e.manager.has_pending_work()) and \
                    time.monotonic() < t_idle:
                e.step()
                time.sleep(0.01)
        time.sleep(2.0)
        with kvpool.Client(url, pool="tier") as c:
            st = c.stats()
            held = c.info["num_blocks"] - 1 - st["num_free"]
        print(f"chaos: {CHAOS_S:.0f} s, faults {faults}, {steps} steps, {checked} requests "
              f"started with {blocks_checked} blocks checked, slowest step {slowest:.2f} s, "
              f"{held} rows held when idle")
        assert sum(faults.values()) >= 3, faults
        assert held == 0, f"{held} rows held 2 s after the engines went idle"
        assert blocks_checked > 0
        # one call's timeout (1 s) at most, with some slack for a loaded machine
        assert slowest < 1.0 + 0.3, f"a step waited {slowest:.2f} s on the tier"
    finally:
        done.set()
        thread.join(timeout=30)
        for e in engines:
            try:
                e.close()
            except Exception:  # noqa: BLE001: the daemon may be gone
                pass
        with lock:
            p = daemon["proc"]
            if daemon["stopped"]:
                p.send_signal(signal.SIGCONT)
            if p.poll() is None:
                stop(p)
