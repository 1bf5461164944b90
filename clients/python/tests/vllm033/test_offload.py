# SPDX-License-Identifier: Apache-2.0
"""kvpool as vLLM 0.33's offloading tier, with vLLM's own classes: its
Scheduler, its OffloadingConnector (scheduler and worker sides) and kvpool's
spec loaded by name from kv_connector_extra_config, over a real kvpoold.
Worker transfers run on CPU tensors shaped like vLLM's KV cache.

Engine A serves a prompt and stores its blocks; engine B, a second Scheduler
on the same pool, gets the same prompt: its lookups hit, it loads, and its
request skips the loaded tokens, with the bytes A's worker wrote. A killed
before it commits leaves nothing; a restarted engine hits what it stored."""
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

vllm = pytest.importorskip("vllm")
if not vllm.__version__.startswith("0.33."):
    pytest.skip(f"these tests pin vLLM 0.33, not {vllm.__version__}", allow_module_level=True)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(HERE))))
SHARED = os.environ.get("KVP_VLLM_TESTS", os.path.join(os.path.dirname(ROOT), "shared",
                                                       "vllm-tests"))
if not os.path.isdir(os.path.join(SHARED, "tests", "v1", "kv_connector")):
    pytest.skip(f"no vLLM tests at {SHARED} (their helpers build the config)",
                allow_module_level=True)
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, SHARED)

import torch  # noqa: E402
from tests.v1.kv_connector.unit.utils import (  # noqa: E402
    create_model_runner_output, create_vllm_config)
from vllm import SamplingParams  # noqa: E402
from vllm.config import KVTransferConfig, set_current_vllm_config  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (  # noqa: E402
    OffloadingWorkerMetadata)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import (  # noqa: E402
    OffloadingConnector)
from vllm.forward_context import ForwardContext  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import (  # noqa: E402
    get_request_block_hasher, init_none_hash, resolve_kv_cache_block_sizes)
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, KVCacheTensor, SlidingWindowSpec)
from vllm.v1.kv_offload.base import LookupResult  # noqa: E402
from vllm.v1.kv_offload.factory import OffloadingSpecFactory  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

import kvpool  # noqa: E402
from kvpool.vllm_offload import KVPoolOffloadingSpec, check_hashing  # noqa: E402

from conftest import start, stop  # noqa: E402

BS = 16          # tokens per block
LAYERS, HEADS, HEAD = 2, 1, 8  # fp32: one layer's page is 2 x 16 x 1 x 8 x 4 = 1 KiB
GPU_BLOCKS = 40


@pytest.fixture
def model_dir(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    shutil.copy(os.path.join(ROOT, "tests", "vllm", "hf", "facebook--opt-125m", "config.json"),
                d / "config.json")
    return str(d)


def tier_args(region_dir, blocks=64, extra=""):
    """kvpoold's arguments for a region pool shaped for the engines' blocks (2 KiB)."""
    return ("--region-dir", str(region_dir), "--pool",
            f"name=tier,blocks={blocks},block_size={BS},executor=cpu,layers={LAYERS},"
            f"heads={HEADS},head_size={HEAD},dtype=fp32{extra}")


@pytest.fixture
def tier(tmp_path):
    """A kvpoold with a region pool shaped for the engines' blocks (2 KiB)."""
    procs = []

    def run(blocks=64):
        d = tmp_path / f"d{len(procs)}"
        d.mkdir()
        proc, url, _ = start(d, *tier_args(tmp_path, blocks), pool="tier")
        procs.append(proc)
        return url
    yield run
    for p in procs:
        if p.poll() is None:
            stop(p)


def pattern(block_hash: bytes, page: int) -> torch.Tensor:
    """The KV a real model would compute for a block: a function of its prefix (its hash)."""
    g = torch.Generator().manual_seed(int.from_bytes(block_hash[:8], "little") & (2**63 - 1))
    return torch.randint(-128, 127, (page,), dtype=torch.int8, generator=g)


class Engine:
    """One vLLM engine: its Scheduler with the OffloadingConnector and kvpool's
    spec, and one worker's connector over CPU KV tensors."""

    def __init__(self, model_dir: str, url: str, engine_id: str, hybrid: bool = False,
                 hash_algo: str = "sha256"):
        cfg = create_vllm_config(model=model_dir, block_size=BS, max_num_batched_tokens=1000)
        cfg.cache_config.prefix_caching_hash_algo = hash_algo
        cfg.kv_transfer_config = KVTransferConfig(
            kv_connector="OffloadingConnector", kv_role="kv_both", engine_id=engine_id,
            kv_connector_extra_config={
                "spec_name": "KVPoolOffloadingSpec", "spec_module_path": "kvpool.vllm_offload",
                "kvpool_url": url, "kvpool_pool": "tier", "offload_prompt_only": False})
        full = FullAttentionSpec(block_size=BS, num_kv_heads=HEADS, head_size=HEAD,
                                 dtype=torch.float32)
        groups = [KVCacheGroupSpec([f"layer{i}" for i in range(LAYERS)], full)]
        if hybrid:  # gpt-oss-like: a sliding-window group of as many layers beside it
            groups.append(KVCacheGroupSpec(
                [f"swa{i}" for i in range(LAYERS)],
                SlidingWindowSpec(block_size=BS, num_kv_heads=HEADS, head_size=HEAD,
                                  dtype=torch.float32, sliding_window=2 * BS)))
        page = full.page_size_bytes
        names = [n for g in groups for n in g.layer_names]
        # vLLM 0.33's tensor placement: each layer its own allocation, layer-outermost
        kvc = KVCacheConfig(num_blocks=GPU_BLOCKS, kv_cache_groups=groups, kv_cache_tensors=[
            KVCacheTensor(size=page * GPU_BLOCKS, layers=[n], layer_stride=page * GPU_BLOCKS,
                          block_stride=page) for n in names])
        cfg.cache_config.num_gpu_blocks = GPU_BLOCKS
        sbs, hbs = resolve_kv_cache_block_sizes(kvc, cfg)
        self.cfg = cfg
        self.scheduler = Scheduler(vllm_config=cfg, kv_cache_config=kvc, log_stats=True,
                                   structured_output_manager=StructuredOutputManager(cfg),
                                   block_size=sbs, hash_block_size=hbs)
        self.worker = OffloadingConnector(cfg, KVConnectorRole.WORKER, kvc)
        self.kv = {n: torch.zeros(GPU_BLOCKS, 2, BS, HEADS, HEAD, dtype=torch.float32)
                   for n in names}
        self.groups = groups
        with set_current_vllm_config(cfg):
            self.worker.register_kv_caches(self.kv)
        self.page = page
        self.conn = self.scheduler.connector.connector_scheduler
        self.manager = self.conn.manager
        init_none_hash(sha256)
        self.hasher = get_request_block_hasher(BS, sha256)
        self.ctx = ForwardContext(no_compile_layers={}, attn_metadata={}, slot_mapping={})
        self.n = 0

    def add(self, tokens, max_tokens=2):
        self.n += 1
        sp = SamplingParams(max_tokens=max_tokens)
        sp.update_from_generation_config({}, 50256)
        req = Request(request_id=f"r{self.n}", prompt_token_ids=list(tokens),
                      sampling_params=sp, pooling_params=None, block_hasher=self.hasher)
        self.scheduler.add_request(req)
        return req

    def _compute(self, out):
        """The model: a block this step completes holds pattern(its hash), as
        real KV depends on the block's prefix; blocks computed before (or
        loaded) are left alone."""
        for req_id, n in out.num_scheduled_tokens.items():
            req = self.scheduler.requests[req_id]
            # schedule() has already advanced num_computed_tokens past this step's tokens
            start, done = req.num_computed_tokens - n, req.num_computed_tokens
            for g, group in enumerate(self.groups):
                ids = self.scheduler.kv_cache_manager.get_block_ids(req_id)[g]
                for i, h in enumerate(req.block_hashes):
                    if start < (i + 1) * BS <= done and ids[i] != 0:
                        for n in group.layer_names:
                            self.kv[n][ids[i]].view(torch.int8).view(-1)[:] = \
                                pattern(bytes(h) + bytes([g]), self.page)

    def step(self, before_worker=None):
        out = self.scheduler.schedule()
        if before_worker is not None:
            before_worker(out)  # between the scheduler's step and its workers'
        meta = out.kv_connector_metadata
        self.worker.handle_preemptions(meta)
        self.worker.bind_connector_metadata(meta)
        self.worker.start_load_kv(self.ctx)
        self._compute(out)
        self.worker.wait_for_save()
        sending, recving = self.worker.get_finished(out.finished_req_ids)
        wmeta = self.worker.build_connector_worker_meta() or OffloadingWorkerMetadata()
        self.worker.clear_connector_metadata()
        mro = create_model_runner_output(reqs=self.scheduler.running, finished_sending=sending,
                                         finished_recving=recving, token_id=0,
                                         kv_connector_worker_meta=wmeta)
        self.scheduler.update_from_output(out, mro)
        return out

    def run(self, steps=40):
        outs = []
        for _ in range(steps):
            outs.append(self.step())
            if not self.scheduler.requests and not self.conn._jobs and \
                    not self.scheduler.finished_req_ids and not self.manager.has_pending_work():
                break
        return outs

    def serve(self, req, steps=40, group=0):
        """Steps until req finishes; returns the tokens its first computing
        step scheduled and the bytes of the group's first four blocks then
        (None for a block the group does not hold: the null block)."""
        first = loaded = None
        for _ in range(steps):
            out = self.step()
            if req.request_id in out.num_scheduled_tokens and first is None:
                first = out.num_scheduled_tokens[req.request_id]
                ids = self.scheduler.kv_cache_manager.get_block_ids(req.request_id)[group]
                loaded = [self.block_bytes(ids[i], group) if ids[i] else None
                          for i in range(4)]
            if req.is_finished() and not self.conn._jobs:
                break
        return first, loaded

    def block_bytes(self, block_id, group=0):
        return [self.kv[n][block_id].view(torch.int8).reshape(-1)
                for n in self.groups[group].layer_names]

    def close(self):
        self.manager.shutdown()
        self.worker.shutdown()


PROMPT = list(range(1000, 1000 + 4 * BS + 5))  # four full blocks and a partial one


def test_spec_loads_from_configuration_alone():
    cls = OffloadingSpecFactory.get_spec_cls(
        {"spec_name": "KVPoolOffloadingSpec", "spec_module_path": "kvpool.vllm_offload"})
    assert cls is KVPoolOffloadingSpec


def test_two_engines_share_one_tier(model_dir, tier):
    url = tier()
    a = Engine(model_dir, url, "engine-a")
    ra = a.add(PROMPT)
    a.run()
    assert ra.is_finished()
    hashes = [bytes(h) for h in ra.block_hashes[:4]]
    # A's blocks are in the pool, committed: another client sees them by key
    with kvpool.Client(url, pool="tier") as c:
        keys = [kvpool.offload_key(h, 0) for h in hashes]
        rows, _ = c.lookup_and_lock(keys)
        assert all(r > 0 for r in rows), rows
        c.unlock(keys)

    b = Engine(model_dir, url, "engine-b")
    first, loaded = b.serve(b.add(PROMPT))
    # B computed only what the tier did not have: the tail past the four loaded blocks
    assert first == len(PROMPT) - 4 * BS, first
    for i, h in enumerate(hashes):
        for got in loaded[i]:
            assert torch.equal(got, pattern(h + b"\0", b.page)), f"block {i} differs from A's"
    assert b.manager.round_trips > 0
    b.close()
    a.close()


def test_hybrid_engines_share_both_groups(model_dir, tier):
    """A full-attention and a sliding-window group (gpt-oss-like): each group's
    blocks are stored under its own keys, and a second engine loads what its
    groups need, as vLLM's own CPU tier serves them."""
    url = tier(blocks=128)
    a = Engine(model_dir, url, "hybrid-a", hybrid=True)
    ra = a.add(PROMPT)
    a.run()
    assert ra.is_finished()
    with kvpool.Client(url, pool="tier") as c:
        for g in (0, 1):
            keys = [kvpool.offload_key(bytes(h), g) for h in ra.block_hashes[:4]]
            rows, _ = c.lookup_and_lock(keys)
            hit = [r > 0 for r in rows]
            c.unlock([k for k, r in zip(keys, rows) if r > 0])
            assert any(hit), f"group {g}: nothing stored"
    for group in (0, 1):
        b = Engine(model_dir, url, f"hybrid-b{group}", hybrid=True)
        rb = b.add(PROMPT)
        first, loaded = b.serve(rb, group=group)
        # B computed only the tail: every full block came from the tier
        assert first == len(PROMPT) - 4 * BS, first
        held = [i for i, blk in enumerate(loaded) if blk is not None]
        # the full group holds all four; the 32-token window only the last two
        assert held == ([0, 1, 2, 3] if group == 0 else [2, 3]), held
        for i in held:
            for got in loaded[i]:
                assert torch.equal(got, pattern(bytes(rb.block_hashes[i]) + bytes([group]),
                                                b.page)), f"group {group} block {i}"
        b.close()
    a.close()


def test_killed_engine_leaves_nothing_and_restart_hits(model_dir, tier, tmp_path):
    url = tier()
    # An engine that reserves rows and dies before committing: a child process, killed.
    child = subprocess.Popen([sys.executable, "-c", f"""
import sys, time
sys.path.insert(0, {os.path.join(ROOT, "clients", "python")!r})
import kvpool
c = kvpool.Client({url!r}, pool="tier", lease_ms=300)
keys = [kvpool.offload_key(bytes([7]) * 32, 0), kvpool.offload_key(bytes([8]) * 32, 0)]
rows, _ = c.reserve(keys)
assert all(r > 0 for r in rows)
print("reserved", flush=True)
time.sleep(60)
"""], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "reserved"
    child.send_signal(signal.SIGKILL)
    child.wait()
    with kvpool.Client(url, pool="tier") as c:
        keys = [kvpool.offload_key(bytes([7]) * 32, 0), kvpool.offload_key(bytes([8]) * 32, 0)]
        assert c.lookup_and_lock(keys)[0] == [-1, -1]  # never visible
        for _ in range(100):
            if c.stats()["num_free"] == c.info["num_blocks"] - 1:
                break
            time.sleep(0.05)
        assert c.stats()["num_free"] == c.info["num_blocks"] - 1  # its rows came back

    # A restarted engine (a new Scheduler, same engine id) hits what it stored before.
    a = Engine(model_dir, url, "engine-a")
    a.add(PROMPT)
    a.run()
    a.close()
    a2 = Engine(model_dir, url, "engine-a")
    first, _ = a2.serve(a2.add(PROMPT))
    assert first == len(PROMPT) - 4 * BS
    a2.close()


@pytest.mark.parametrize("error", [kvpool.Internal, ValueError])
def test_any_tier_error_is_a_miss_never_an_exception(model_dir, tier, monkeypatch, error):
    """A daemon answering INTERNAL, a refusal the tier has no use for, or
    what the client cannot decode: the engine's steps go on (lookups miss,
    stores are skipped), the failures are counted, and once the daemon
    answers again the tier hits."""
    url = tier()
    a = Engine(model_dir, url, "faulty")
    a.add(PROMPT)
    a.run()  # stored while the tier works

    def broken(*args, **kwargs):
        raise error(99, "INTERNAL", "injected") if error is not ValueError else error("garbage")
    monkeypatch.setattr(kvpool.Batch, "send_rows", broken)  # the step's calls: one batch
    b = Engine(model_dir, url, "faulty-b")
    first, _ = b.serve(b.add(PROMPT))
    assert first == len(PROMPT)  # every block computed: misses, no exception
    assert b.manager.errors >= 1
    monkeypatch.undo()
    other = [t + 5000 for t in PROMPT]
    a.add(other)
    a.run()
    time.sleep(5.5)  # past the longest backoff: b's next call renews its session
    first, _ = b.serve(b.add(other))
    assert first == len(other) - 4 * BS  # b hits the tier again
    b.close()
    a.close()


def test_tier_refuses_a_pool_that_cannot_hold_the_blocks(model_dir, tmp_path):
    d = tmp_path / "small"
    d.mkdir()
    proc, url, _ = start(d, "--region-dir", str(tmp_path), "--pool",
                         f"name=tier,blocks=8,block_size={BS},executor=cpu,layers=1,heads=1,"
                         f"head_size={HEAD},dtype=fp32", pool="tier")
    try:
        with pytest.raises(ValueError, match="a KV shape of at least 2048 bytes"):
            Engine(model_dir, url, "too-small")
    finally:
        stop(proc)


def test_an_engine_hashing_otherwise_is_refused_at_start(model_dir, tier):
    """vLLM started with another --prefix-caching-hash-algo than the pool's
    would make keys no pool row can hold: the engine is refused as it
    starts (its workers see vLLM's config), naming both settings."""
    url = tier()
    with pytest.raises(ValueError, match="--prefix-caching-hash-algo xxhash, pool tier with "
                                         "hash_algo=sha256"):
        Engine(model_dir, url, "xx", hash_algo="xxhash")


def test_check_hashing_says_what_to_set():
    info = {"pool": "p", "hash_algorithm": "xxhash"}
    with pytest.raises(ValueError, match="Start vLLM with --prefix-caching-hash-algo xxhash"):
        check_hashing(info, "sha256")
    assert "PYTHONHASHSEED" in check_hashing(info, "xxhash", None)
    assert "PYTHONHASHSEED" in check_hashing(info, None, "")  # vLLM's setting not seen
    assert check_hashing(info, "xxhash", "0") is None
    assert check_hashing({"pool": "p", "hash_algorithm": "sha256"}, "sha256") is None


def test_a_key_of_another_length_misses_and_is_never_stored(model_dir, tier):
    """Where the start could not see vLLM's setting (its scheduler is built
    outside vLLM's config context), a key of another length answers MISS
    and is not stored: an exception here would end the engine."""
    url = tier()
    a = Engine(model_dir, url, "short-keys")
    try:
        short = b"k" * 20  # an xxhash key (16 + 4) on a sha256 pool
        assert a.manager.lookup(short, None) == LookupResult.MISS
        out = a.manager.prepare_store([short], None)
        assert list(out.keys_to_store) == []
        assert a.manager.lookup(short, None) == LookupResult.MISS  # logged once, still a miss
    finally:
        a.close()


def test_tensor_parallel_workers_write_their_own_shard(tmp_path):
    """With tensor parallelism each worker holds part of a block; on a pool of
    shards=2 each writes and reads only its own half of the row."""
    from vllm.v1.kv_offload.base import (CanonicalKVCacheRef, CanonicalKVCaches,
                                         CanonicalKVCacheTensor, GPULoadStoreSpec)
    from vllm.v1.kv_offload.config import (OffloadingCacheConfig, OffloadingConfig,
                                           OffloadingGroupConfig, OffloadingModelConfig,
                                           OffloadingParallelConfig)
    from kvpool.vllm_offload import KVPoolOffloadingWorker, KVPoolRowsSpec
    d = tmp_path / "tp"
    d.mkdir()
    # 2 layers x 2 x 16 tokens x 2 heads x 8 x fp32 = 4 KiB a block: 2 KiB a worker
    proc, url, _ = start(d, "--region-dir", str(tmp_path), "--pool",
                         f"name=tier,blocks=16,block_size={BS},executor=cpu,layers={LAYERS},"
                         f"heads=2,head_size={HEAD},dtype=fp32,shards=2", pool="tier")
    page = 1024  # one worker's page of one layer: 2 x 16 x 1 head x 8 x 4

    def worker(rank, tensors):
        cfg = OffloadingConfig(
            groups=(OffloadingGroupConfig(tokens_per_block=BS, layer_names=("l0", "l1"),
                                          group_id=0),),
            worker_kv_bytes_per_block=LAYERS * page, enable_kv_cache_events=False,
            extra_config={}, engine_id="tp", model=OffloadingModelConfig("m", "float32"),
            cache=OffloadingCacheConfig(tokens_per_hash=BS, blocks_per_chunk=1),
            parallel=OffloadingParallelConfig(
                rank=rank, world_size=2, tp_size=2, pp_size=1, pcp_size=1, dcp_size=1,
                data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=None,
                is_parallelism_agnostic=True))
        kvc = CanonicalKVCaches(
            tensors=[CanonicalKVCacheTensor(tensor=t, page_size_bytes=page) for t in tensors],
            group_data_refs=[[CanonicalKVCacheRef(tensor_idx=i, page_size_bytes=page)
                              for i in range(len(tensors))]])
        return KVPoolOffloadingWorker({"kvpool_url": url, "kvpool_pool": "tier"}, cfg, kvc)

    try:
        gpu = [[torch.randint(-128, 127, (4, page), dtype=torch.int8) for _ in range(LAYERS)]
               for _ in range(2)]
        ws = [worker(r, gpu[r]) for r in range(2)]
        with kvpool.Client(url, pool="tier") as c, c.region() as reg:
            keys = [kvpool.offload_key(bytes([9, i]) * 16, 0) for i in range(2)]
            rows, _ = c.reserve(keys)
            spec = KVPoolRowsSpec(keys, rows)
            blocks = GPULoadStoreSpec([1, 3], group_sizes=[2], block_indices=[0])
            for job, w in enumerate(ws):
                assert w.submit_store(job, blocks, spec)
                assert [r.job_id for r in w.get_finished()] == [job]
            c.commit(keys)
            half = reg.shard_bytes
            for i, (row, blk) in enumerate(zip(rows, (1, 3))):
                for rank in range(2):
                    shard = bytes(reg.shard(row, rank))
                    want = b"".join(bytes(gpu[rank][lay][blk].numpy()) for lay in range(LAYERS))
                    assert shard[:len(want)] == want, f"row {i} shard {rank}"
                    assert len(want) <= half
            # each worker loads its own half back into empty tensors
            for rank, w in enumerate(ws):
                for t in gpu[rank]:
                    t.zero_()
                assert w.submit_load(10 + rank, spec, blocks)
                w.get_finished()
                shard = bytes(reg.shard(rows[0], rank))
                assert bytes(gpu[rank][0][1].numpy()) == shard[:page]
            # A job naming another life of the pool (a region gone with a restart)
            # copies nothing: a load is reported failed (its blocks hold no KV), a
            # store done (what it would have written went with that life; vLLM 0.33
            # ends an engine on any failed job).
            for t in gpu[0]:
                t.zero_()
            before = bytes(reg.shard(rows[0], 0))
            stale = KVPoolRowsSpec(keys, rows, epoch=c.info["event_epoch"] ^ 1)
            assert ws[0].submit_load(20, stale, blocks)
            assert [(r.job_id, r.success) for r in ws[0].get_finished()] == [(20, False)]
            assert not any(t.any() for t in gpu[0])
            gpu[0][0][1].fill_(7)
            assert ws[0].submit_store(21, blocks, stale)
            assert [(r.job_id, r.success, r.transfer_size)
                    for r in ws[0].get_finished()] == [(21, True, 0)]
            assert bytes(reg.shard(rows[0], 0)) == before
            for w in ws:
                w.shutdown()
    finally:
        stop(proc)


def loaded_from_tier(engine, prompt, why):
    """engine serves prompt: its four full blocks come from the tier, with the bytes
    the engine that stored them computed."""
    req = engine.add(prompt)
    first, loaded = engine.serve(req)
    assert first == len(prompt) - 4 * BS, first
    for i in range(4):
        for got in loaded[i]:
            assert torch.equal(got, pattern(bytes(req.block_hashes[i]) + b"\0", engine.page)), \
                f"block {i}: {why}"


def test_engines_outlive_a_kvpoold_restart(model_dir, tmp_path):
    """kvpoold stops and restarts (a crash, an upgrade) under running engines.
    While it is down an engine serves without the tier. Its new region is
    another file, so a worker still mapping the old one must not copy to or
    from it: engine B, alive across the restart, loads what an engine stored
    after it with the right bytes, and what B stores after it reaches the new
    region (engine C loads it)."""
    d = tmp_path / "restart"
    d.mkdir()
    args = tier_args(tmp_path)
    proc, url, _ = start(d, *args, pool="tier")
    engines = []
    try:
        a = Engine(model_dir, url, "restart-a")
        a.add(PROMPT)
        a.run()
        b = Engine(model_dir, url, "restart-b")
        engines += [a, b]
        first, _ = b.serve(b.add(PROMPT))
        assert first == len(PROMPT) - 4 * BS  # B's worker has mapped the first region

        proc.kill()
        proc.wait()
        # While kvpoold is down B goes on without the tier: a new prompt misses and is
        # computed whole, no step raises, and each try costs one short timeout per backoff.
        down = list(range(7000, 7000 + 4 * BS + 2))
        t0 = time.monotonic()
        rd = b.add(down)
        first, _ = b.serve(rd)
        assert rd.is_finished() and first == len(down), first
        assert time.monotonic() - t0 < 10, "the outage stalled the scheduler"
        proc, url2, _ = start(d, *args, pool="tier")
        assert url2 == url
        time.sleep(max(0.0, b.manager._down_until - time.monotonic()))  # B's next try
        # A (its manager renews its session) stores a new prompt in the new region.
        other = list(range(5000, 5000 + 4 * BS + 3))
        a.add(other)
        a.run()
        # B loads it: its worker must read the new region's rows, not the old file's.
        loaded_from_tier(b, other, "B read the old region")
        # B stores a third prompt; C, a new engine, loads B's bytes from the new region.
        third = list(range(9000, 9000 + 4 * BS + 1))
        b.add(third)
        b.run()
        c = Engine(model_dir, url, "restart-c")
        engines.append(c)
        loaded_from_tier(c, third, "B's store did not reach the new region")
    finally:
        for e in engines:
            e.close()
        stop(proc)


def test_a_warm_restart_keeps_the_tier_for_engines(model_dir, tmp_path):
    """restart=warm (docs/operations.md): kvpoold killed with SIGKILL and started
    again on the same settings serves what engines stored before, with the right
    bytes: engine B, alive across the restart (its first call after it renews
    its session), and engine C, new after it, both load A's prompt from the
    tier; nothing is computed again. A's rows were committed without a CRC (the
    spec sends none): the daemon's sweeper proved them before the kill."""
    d = tmp_path / "warm"
    d.mkdir()
    args = tier_args(tmp_path, extra=",restart=warm")
    proc, url, _ = start(d, *args, pool="tier")
    engines = []
    try:
        a = Engine(model_dir, url, "warm-a")
        a.add(PROMPT)
        a.run()
        b = Engine(model_dir, url, "warm-b")
        engines += [a, b]
        first, _ = b.serve(b.add(list(range(3000, 3000 + 4 * BS + 1))))  # B maps the region
        # The spec commits without a CRC; the daemon's reaper takes one within a period
        # (250 ms): a kill before it would drop the rows as unproven (docs/operations.md).
        time.sleep(1.0)
        proc.kill()
        proc.wait()
        proc, url2, _ = start(d, *args, pool="tier")
        assert url2 == url
        c = Engine(model_dir, url, "warm-c")
        engines.append(c)
        loaded_from_tier(c, PROMPT, "C read wrong bytes after the warm restart")
        time.sleep(max(0.0, b.manager._down_until - time.monotonic()))  # B's next try
        # B's first call after the restart finds its session gone (a miss) and renews it.
        b.serve(b.add(list(range(4000, 4000 + 4 * BS + 1))))
        time.sleep(max(0.0, b.manager._down_until - time.monotonic()))
        loaded_from_tier(b, PROMPT, "B read wrong bytes after the warm restart")
    finally:
        for e in engines:
            e.close()
        stop(proc)


def test_a_call_that_timed_out_leaves_nothing_held(model_dir, tmp_path):
    """kvpoold stalls (SIGSTOP) while an engine's step locks its hits: the
    call times out and the step goes on without the tier, but the stalled
    daemon still runs it when it wakes, locking rows for a session that has
    given up on them. The engine's next call opens a new session, whose old
    one takes those locks with it: every row is free again once the engines
    are idle."""
    d = tmp_path / "stall"
    d.mkdir()
    proc, url, _ = start(d, *tier_args(tmp_path), pool="tier")
    engines = []
    try:
        a = Engine(model_dir, url, "stall-a")
        engines.append(a)
        a.add(PROMPT)
        a.run()
        b = Engine(model_dir, url, "stall-b")
        engines.append(b)
        rb = b.add(PROMPT)
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            b.step()  # its lookups go out at the step's end, and time out
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        with kvpool.Client(url, pool="tier") as c:
            total = c.info["num_blocks"] - 1
            for _ in range(100):  # the woken daemon runs the call: four rows locked
                if c.stats()["num_free"] < total:
                    break
                time.sleep(0.02)
            assert c.stats()["num_free"] == total - 4
            first, _ = b.serve(rb)
            # Computed whole while the tier counts as down, or loaded once B's next
            # call renewed its session (the stalled call took one timeout, 1 s)
            assert rb.is_finished() and first in (len(PROMPT), len(PROMPT) - 4 * BS)
            time.sleep(max(0.0, b.manager._down_until - time.monotonic()))  # B's next try
            b.add(list(range(3000, 3000 + 2 * BS)))
            b.run()  # its stores open a new session
            assert not b.manager._suspect
            assert c.stats()["num_free"] == total, "the timed-out call's locks are still held"
    finally:
        for e in engines:
            e.close()
        stop(proc)
