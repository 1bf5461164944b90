# SPDX-License-Identifier: Apache-2.0
"""The Python programs the docs show, run as written against a real
kvpoold (tests/check_docs.py requires a test for each): README.md's and
docs/python.md's, with the daemon's URL in place of ipc:///tmp/kvpool.ipc;
and docs/cluster.md's agent line, parsed by the agent's own options."""
import os
import re

import pytest

from conftest import ROOT, check_docs, start, stop

PAGES = ["README.md", "docs/python.md"]


def python_blocks(page):
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        return re.findall(r"^```python\n(.*?)^```$", f.read(), re.S | re.M)


@pytest.fixture(scope="module")
def default_pool(tmp_path_factory):
    proc, url, _ = start(tmp_path_factory.mktemp("docs"), "--kv-layers", "2", "--kv-heads", "2",
                         "--kv-head-size", "16", "--pool", "name=default,blocks=64,block_size=16",
                         pool="default")
    yield url
    stop(proc)


@pytest.mark.parametrize("page", PAGES)
def test_the_page_python_runs(page, default_pool, capsys):
    found = python_blocks(page)
    assert found, f"{page} shows no Python block"
    for code in found:
        assert "ipc:///tmp/kvpool.ipc" in code  # the daemon the reader starts
        exec(compile(code.replace("ipc:///tmp/kvpool.ipc", default_pool), page, "exec"), {})
    if page == "README.md":  # what it prints is what the prose says
        out = capsys.readouterr().out
        assert "3 blocks for request 1" in out and "32 of its tokens cached" in out


def sh_commands(page, first):
    """page's sh commands from blocks starting with first (check_docs.py's parser)."""
    return check_docs.sh_commands(os.path.join(ROOT, page), first)


def test_the_cluster_agent_line_is_what_the_agent_takes():
    """docs/cluster.md's agent command: its options are the agent's, its
    addresses private (the agent would refuse a public one)."""
    from kvpool.cluster import _parse
    from kvpool.cluster_store import private_address

    cmds = sh_commands("docs/cluster.md", "python -m kvpool.cluster")
    assert len(cmds) == 1 and cmds[0][:3] == ["python", "-m", "kvpool.cluster"]
    cfg, _ = _parse(cmds[0][3:])
    assert cfg.pool == "tier" and cfg.write_behind
    for where in (cfg.store.master, cfg.store.metadata, cfg.store.host):
        assert private_address(where), where
