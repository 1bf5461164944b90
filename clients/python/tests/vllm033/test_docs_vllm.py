# SPDX-License-Identifier: Apache-2.0
"""The `vllm serve --kv-transfer-config` the docs show (README.md and
docs/vllm.md) is one vLLM 0.33 takes: its JSON is a KVTransferConfig,
whose extra config names kvpool's spec to vLLM's own factory (or vLLM's
TieringOffloadingSpec with kvpool's secondary tier, resolved by vLLM's
SecondaryTierFactory), and every kvpool_* key it sets is one kvpool reads. (Serving a model needs a GPU;
tests/check_docs.py requires this test for the block.)"""
import json
import os
import re
import shlex

import pytest

vllm = pytest.importorskip("vllm")
if not vllm.__version__.startswith("0.33."):
    pytest.skip(f"these tests pin vLLM 0.33, not {vllm.__version__}", allow_module_level=True)

from vllm.config import KVTransferConfig  # noqa: E402
from vllm.v1.kv_offload.factory import OffloadingSpecFactory  # noqa: E402

from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory  # noqa: E402
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec  # noqa: E402

from kvpool.vllm_offload import KVPoolOffloadingSpec  # noqa: E402
from kvpool.vllm_tier import KVPoolSecondaryTier  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.dirname(os.path.abspath(__file__))))))
PAGES = ["README.md", "docs/vllm.md"]
SPEC_KEYS = {"kvpool_url", "kvpool_pool", "kvpool_token", "kvpool_token_file",
             "kvpool_timeout_ms", "kvpool_vllm_pod"}


def serve_configs(page):
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        blocks = re.findall(r"^ *```sh\n(.*?)^ *```$", f.read(), re.S | re.M)
    out = []
    for b in blocks:
        if "vllm serve" not in b:
            continue
        words = shlex.split(b)
        out.append(json.loads(words[words.index("--kv-transfer-config") + 1]))
    return out


@pytest.mark.parametrize("page", PAGES)
def test_the_page_kv_transfer_config_loads_kvpool(page):
    configs = serve_configs(page)
    assert configs, f"{page} shows no vllm serve"
    for cfg in configs:
        ktc = KVTransferConfig(**cfg)
        assert ktc.kv_connector == "OffloadingConnector"
        extra = ktc.kv_connector_extra_config
        spec = OffloadingSpecFactory.get_spec_cls(extra)
        if spec is TieringOffloadingSpec:  # kvpool as a secondary tier
            tiers = [t for t in extra["secondary_tiers"]
                     if SecondaryTierFactory.get_tier_class(t) is KVPoolSecondaryTier]
            assert len(tiers) == 1 and int(extra["cpu_bytes_to_use"]) > 0
            extra = tiers[0]
        else:
            assert spec is KVPoolOffloadingSpec
        kvpool_keys = {k for k in extra if k.startswith("kvpool_")}
        assert "kvpool_url" in kvpool_keys and kvpool_keys <= SPEC_KEYS
