# SPDX-License-Identifier: Apache-2.0
"""vLLM 0.33's Scheduler takes kvpool's RemoteKVCacheManager by
configuration alone (scheduler_cls = kvpool.vllm_scheduler.KVPoolScheduler,
the connection in KVPOOL_* variables), and the adapters take the keyword
arguments vLLM constructs its own classes with. Real kvpoold, vLLM's own
Scheduler, Request and block hasher; the model config is a local file."""
import os
import shutil
import sys

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
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    ChunkedLocalAttentionSpec, FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec,
    SlidingWindowSpec)
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

import kvpool  # noqa: E402
from kvpool.vllm import RemoteBlockPool, RemoteKVCacheManager  # noqa: E402
from kvpool.vllm_scheduler import KVPoolScheduler  # noqa: E402

from conftest import start, stop  # noqa: E402

BS, BLOCKS = 16, 64


def _kv_config(blocks=BLOCKS):
    spec = FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype=torch.float32)
    return KVCacheConfig(num_blocks=blocks, kv_cache_groups=[KVCacheGroupSpec(["l0"], spec)],
                         kv_cache_tensors=[])


@pytest.fixture
def env(tmp_path, monkeypatch):
    """A kvpoold with a pool of the engine's shape, named in KVPOOL_URL/KVPOOL_POOL."""
    model = tmp_path / "model"
    model.mkdir()
    shutil.copy(os.path.join(ROOT, "tests", "vllm", "hf", "facebook--opt-125m", "config.json"),
                model / "config.json")
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    proc, url, _ = start(tmp_path, "--pool", f"name=g,blocks={BLOCKS},block_size={BS},"
                         "executor=none,max_model_len=4096", pool="g")
    monkeypatch.setenv("KVPOOL_URL", url)
    monkeypatch.setenv("KVPOOL_POOL", "g")
    yield str(model), url
    stop(proc)


def test_scheduler_from_configuration_alone(env):
    """scheduler_cls names kvpool's class; vLLM resolves and constructs it
    with its own arguments; requests are scheduled on the pool's blocks and
    a second request with the same prompt hits the first one's blocks."""
    model, url = env
    cfg = create_vllm_config(model=model, block_size=BS, max_num_batched_tokens=1000)
    cfg.kv_transfer_config = None  # the helper's default connector: not this test's
    cfg.cache_config.num_gpu_blocks = BLOCKS
    cfg.scheduler_config.scheduler_cls = "kvpool.vllm_scheduler.KVPoolScheduler"
    cls = cfg.scheduler_config.get_scheduler_cls()
    assert cls is KVPoolScheduler
    sched = cls(vllm_config=cfg, kv_cache_config=_kv_config(),
                structured_output_manager=StructuredOutputManager(cfg), block_size=BS,
                hash_block_size=BS, log_stats=True)
    try:
        assert isinstance(sched.kv_cache_manager, RemoteKVCacheManager)
        init_none_hash(sha256)
        hasher = get_request_block_hasher(BS, sha256)
        prompt = list(range(500, 500 + 3 * BS + 4))

        def add(rid):
            sp = SamplingParams(max_tokens=1)
            sp.update_from_generation_config({}, 50256)
            req = Request(request_id=rid, prompt_token_ids=prompt, sampling_params=sp,
                          pooling_params=None, block_hasher=hasher)
            sched.add_request(req)
            return req

        def step():
            out = sched.schedule()
            sched.update_from_output(out, create_model_runner_output(reqs=sched.running,
                                                                     token_id=0))
            return out

        add("a")
        out = step()
        assert out.num_scheduled_tokens == {"a": len(prompt)}
        with kvpool.Client(url, pool="g") as c:
            assert c.stats()["num_cached_blocks"] == 3  # the daemon cached a's full blocks
        b = add("b")
        out = step()
        # b's first three blocks are a's (a finished: they wait in the queue, cached)
        assert out.num_scheduled_tokens == {"b": len(prompt) - 3 * BS}
        assert b.num_computed_tokens == len(prompt)  # and the rest computed
    finally:
        sched.shutdown()


def _hybrid_config(second):
    first = FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype=torch.float32)
    return KVCacheConfig(num_blocks=BLOCKS, kv_cache_tensors=[],
                         kv_cache_groups=[KVCacheGroupSpec(["l0"], first),
                                          KVCacheGroupSpec(["l1"], second)])


@pytest.mark.parametrize("groups,second", [
    ("full:16+sliding_window:16:32",
     SlidingWindowSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype=torch.float32,
                       sliding_window=2 * BS)),
    ("full:16+chunked_local:16:64",
     ChunkedLocalAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype=torch.float32,
                               attention_chunk_size=4 * BS)),
])
def test_hybrid_models_hit_as_on_vllms_own_manager(env, tmp_path, monkeypatch, groups, second):
    """A gpt-oss-like (full + sliding window) or Llama-4-like (full + chunked
    local) model on KVPoolScheduler: prompts sharing prefixes hit, step for
    step, as on vLLM's own Scheduler and KVCacheManager with the same groups
    (the coordinator's fixed point, computed by the daemon)."""
    model, _ = env
    d = tmp_path / "hybrid"
    d.mkdir()
    monkeypatch.delenv("KVPOOL_POOL")  # the daemon would read it as its own pool
    proc, url, _ = start(d, "--pool", f"name=h,blocks={BLOCKS},groups={groups},"
                         "executor=none,max_model_len=4096", pool="h")
    monkeypatch.setenv("KVPOOL_URL", url)
    monkeypatch.setenv("KVPOOL_POOL", "h")
    init_none_hash(sha256)
    hasher = get_request_block_hasher(BS, sha256)
    base = list(range(900, 900 + 6 * BS + 4))
    prompts = {"a": base, "b": base, "c": base[:5 * BS] + list(range(5000, 5000 + 2 * BS + 3)),
               "d": base + list(range(7000, 7000 + BS))}

    def run(scheduler_cls):
        cfg = create_vllm_config(model=model, block_size=BS, max_num_batched_tokens=1000)
        cfg.kv_transfer_config = None
        cfg.cache_config.num_gpu_blocks = BLOCKS
        if scheduler_cls:
            cfg.scheduler_config.scheduler_cls = scheduler_cls
        sched = cfg.scheduler_config.get_scheduler_cls()(
            vllm_config=cfg, kv_cache_config=_hybrid_config(second),
            structured_output_manager=StructuredOutputManager(cfg), block_size=BS,
            hash_block_size=BS, log_stats=True)
        seen = []
        try:
            for rid, prompt in prompts.items():
                sp = SamplingParams(max_tokens=2)
                sp.update_from_generation_config({}, 50256)
                sched.add_request(Request(request_id=rid, prompt_token_ids=prompt,
                                          sampling_params=sp, pooling_params=None,
                                          block_hasher=hasher))
                for _ in range(4):
                    out = sched.schedule()
                    seen.append(dict(out.num_scheduled_tokens))
                    sched.update_from_output(out, create_model_runner_output(
                        reqs=sched.running, token_id=0))
            return seen
        finally:
            sched.shutdown()
    try:
        theirs = run(None)
        ours = run("kvpool.vllm_scheduler.KVPoolScheduler")
        print("steps:", theirs)
        assert ours == theirs
        assert theirs[4]["b"] < len(base)  # b hit a's prefix
    finally:
        stop(proc)


def test_vllms_keyword_constructors_check_the_pools_shape(env):
    """KVCacheManager's and BlockPool's keywords, as vLLM 0.33 passes them:
    accepted where the pool has that shape, refused (naming what differs)
    where it does not, and NotSupported for features the daemon lacks."""
    m = RemoteKVCacheManager(kv_cache_config=_kv_config(), max_model_len=4096,
                             scheduler_block_size=BS, hash_block_size=BS, enable_caching=True,
                             log_stats=False, enable_kv_cache_events=False, dcp_world_size=1,
                             pcp_world_size=1, metrics_collector=None, watermark=0.0)
    assert m.client.info["pool"] == "g"
    m.close()
    with pytest.raises(ValueError, match="num_blocks=65"):
        RemoteKVCacheManager(kv_cache_config=_kv_config(BLOCKS + 1), max_model_len=4096)
    with pytest.raises(kvpool.NotSupported, match="use_eagle"):
        RemoteKVCacheManager(kv_cache_config=_kv_config(), use_eagle=True)
    p = RemoteBlockPool(num_gpu_blocks=BLOCKS, enable_caching=True, hash_block_size=BS,
                        enable_kv_cache_events=False, metrics_collector=None,
                        num_hash_lookahead_tokens=0)
    assert len(p.get_new_blocks(2)) == 2
    p.close()
    with pytest.raises(ValueError, match="hash_block_size=32"):
        RemoteBlockPool(num_gpu_blocks=BLOCKS, enable_caching=True, hash_block_size=32)


@pytest.mark.parametrize("groups,spec,other", [
    ("full:16+chunked_local:16:64", dict(cls=ChunkedLocalAttentionSpec, attention_chunk_size=64),
     dict(cls=ChunkedLocalAttentionSpec, attention_chunk_size=32)),
    ("full:16+sliding_window:16:128", dict(cls=SlidingWindowSpec, sliding_window=128),
     dict(cls=SlidingWindowSpec, sliding_window=64)),
])
def test_hybrid_configs_are_checked_window_and_all(tmp_path, groups, spec, other):
    """A hybrid kv_cache_config is taken where the pool has the same groups
    (chunked local attention included) and refused, naming the groups, where
    a window or chunk differs: a different window would answer other hits."""
    proc, url, _ = start(tmp_path, "--pool", f"name=h,blocks={BLOCKS},groups={groups},"
                         "executor=none,max_model_len=4096", pool="h")

    def config(s):
        s = dict(s)
        second = s.pop("cls")(block_size=BS, num_kv_heads=1, head_size=8, dtype=torch.float32,
                              **s)
        first = FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8,
                                  dtype=torch.float32)
        return KVCacheConfig(num_blocks=BLOCKS, kv_cache_tensors=[],
                             kv_cache_groups=[KVCacheGroupSpec(["l0"], first),
                                              KVCacheGroupSpec(["l1"], second)])
    try:
        with kvpool.Client(url, pool="h") as c:
            m = RemoteKVCacheManager(c, kv_cache_config=config(spec), max_model_len=4096)
            assert [g.kv_cache_spec.block_size for g in m.coordinator.single_type_managers] \
                == [BS, BS]
            second = m.coordinator.single_type_managers[1].kv_cache_spec
            assert isinstance(second, spec["cls"])
            key = "attention_chunk_size" if "attention_chunk_size" in spec else "sliding_window"
            assert getattr(second, key) == spec[key]
            m.close()
            with pytest.raises(ValueError, match="kv_cache_config groups"):
                RemoteKVCacheManager(c, kv_cache_config=config(other), max_model_len=4096)
    finally:
        stop(proc)


def test_members_vllms_code_reads_are_there(env):
    """What vLLM 0.33's own code reads of BlockPool and KVCacheManager beyond
    the calls: every public member of vLLM's classes is on the adapters,
    and each answers as vLLM's does (unpin_blocks refuses, saying why)."""
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    m = RemoteKVCacheManager(kv_cache_config=_kv_config(), max_model_len=4096)
    try:
        pool = m.block_pool
        theirs = BlockPool(BLOCKS, True, BS)
        public = {n for n in dir(theirs) if not n.startswith("_")} | \
            {n for n in vars(theirs) if not n.startswith("_")}
        missing = {n for n in public if not hasattr(pool, n)}
        # the private structures a remote pool does not mirror (docs/vllm.md)
        assert missing <= {"blocks", "free_block_queue", "cached_block_hash_to_block",
                           "cached_block_hashes_by_block"}, missing
        assert {n for n in dir(KVCacheManager) if not n.startswith("_")} - set(dir(m)) == set()
        assert pool.num_hash_lookahead_tokens == 0
        b = pool.get_new_blocks(1)[0]
        assert pool.is_block_writable(b) and not pool.is_block_writable(pool.null_block)
        with pytest.raises(kvpool.NotSupported, match="unpin_blocks"):
            pool.unpin_blocks([b], lambda blk: None)
        pool.free_blocks([b])
        blocks = m.create_kv_cache_blocks(([b, b, b],))
        assert [x.block_id for x in m.truncate_computed_blocks(blocks, 2 * BS).blocks[0]] == \
            [b.block_id] * 2
        with pytest.raises(ValueError):
            m.truncate_computed_blocks(blocks, BS + 1)
    finally:
        m.close()


def test_the_adapters_hand_out_vllms_own_classes(env):
    """With vLLM 0.33 installed, blocks, KVCacheBlocks and PrefixCacheStats
    are vLLM's own classes (isinstance holds), as its events are."""
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.kv_cache_utils import KVCacheBlock
    from vllm.v1.metrics.stats import PrefixCacheStats
    m = RemoteKVCacheManager(kv_cache_config=_kv_config(), log_stats=True)
    try:
        init_none_hash(sha256)
        req = Request(request_id="c", prompt_token_ids=list(range(40)),
                      sampling_params=SamplingParams(max_tokens=1), pooling_params=None,
                      block_hasher=get_request_block_hasher(BS, sha256))
        hit, n, _ = m.get_computed_blocks(req)
        assert isinstance(hit, KVCacheBlocks) and n == 0
        new = m.allocate_slots(req, 40)
        assert isinstance(new, KVCacheBlocks)
        assert all(isinstance(b, KVCacheBlock) for b in new.blocks[0])
        assert new.get_block_ids() == m.get_block_ids("c")
        assert isinstance(m.make_prefix_cache_stats(), PrefixCacheStats)
        m.free(req)
    finally:
        m.close()


def test_without_kvpool_url_the_error_says_what_to_set(env, monkeypatch):
    monkeypatch.delenv("KVPOOL_URL")
    with pytest.raises(ValueError, match="KVPOOL_URL"):
        RemoteKVCacheManager(kv_cache_config=_kv_config())


def test_encoder_decoder_gets_cross_attention_blocks_as_on_vllms_manager(env, tmp_path,
                                                                        monkeypatch):
    """vLLM's Scheduler set up for an encoder-decoder model as its own
    test_variable_length_cross_attn_block_allocation does (self-attention
    plus a CrossAttentionSpec group, prefix caching off), once with vLLM's
    KVCacheManager and once with RemoteKVCacheManager on a
    full:16+cross_attention:16 pool: each request gets cdiv(encoder tokens,
    16) cross-attention blocks and the same tables, step for step."""
    from tests.v1.core.utils import create_requests
    from vllm.multimodal.inputs import PlaceholderRange
    from vllm.v1.core.encoder_cache_manager import EncoderDecoderCacheManager
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import CrossAttentionSpec

    model, _ = env
    d = tmp_path / "encdec"
    d.mkdir()
    monkeypatch.delenv("KVPOOL_POOL")  # the daemon would read it as its own pool
    proc, url, _ = start(d, "--pool", f"name=w,blocks={BLOCKS},executor=none,caching=off,"
                         "groups=full:16+cross_attention:16,max_model_len=4096", pool="w")
    spec = dict(block_size=BS, num_kv_heads=1, head_size=1, dtype=torch.float32)
    kvc = KVCacheConfig(num_blocks=BLOCKS, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["self_attn"], FullAttentionSpec(**spec)),
        KVCacheGroupSpec(["cross_attn"], CrossAttentionSpec(**spec))])
    encoder = [120, 250, 40]

    def run(remote):
        cfg = create_vllm_config(model=model, block_size=BS, max_num_batched_tokens=1000)
        cfg.kv_transfer_config = None
        cfg.cache_config.enable_prefix_caching = False
        cfg.cache_config.num_gpu_blocks = BLOCKS
        sched = Scheduler(vllm_config=cfg, kv_cache_config=kvc, block_size=BS,
                          hash_block_size=BS, structured_output_manager=StructuredOutputManager(cfg))
        sched.is_encoder_decoder = True  # as vLLM's own test patches it
        sched.max_num_encoder_input_tokens = 1000
        sched.encoder_cache_manager = EncoderDecoderCacheManager(cache_size=1000)
        client = None
        if remote:
            client = kvpool.Client(url, pool="w")
            sched.kv_cache_manager = RemoteKVCacheManager(client, kv_cache_config=kvc)
        tables = []
        try:
            reqs = [create_requests(num_requests=1, num_tokens=30, mm_hashes_list=[[f"enc{i}"]],
                                    mm_positions=[[PlaceholderRange(offset=0, length=n)]],
                                    req_ids=[f"r{i}"])[0] for i, n in enumerate(encoder)]
            for r in reqs:
                sched.add_request(r)
            for _ in range(3):
                out = sched.schedule()
                tables.append({r.request_id: sched.kv_cache_manager.get_block_ids(r.request_id)
                               for r in reqs})
                sched.update_from_output(out, create_model_runner_output(
                    reqs=sched.running, token_id=0))
            return tables
        finally:
            if client is not None:
                sched.kv_cache_manager.close()
                client.close()
            sched.shutdown()
    try:
        theirs, ours = run(False), run(True)
        assert [len(theirs[0][f"r{i}"][1]) for i in range(3)] == [8, 16, 3]
        assert ours == theirs
    finally:
        stop(proc)
