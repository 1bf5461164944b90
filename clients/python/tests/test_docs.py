# SPDX-License-Identifier: Apache-2.0
"""The Python programs the docs show, run as written against a real
kvpoold (tests/check_docs.py requires a test for each): README.md's and
docs/python.md's, with the daemon's URL in place of ipc:///tmp/kvpool.ipc."""
import os
import re

import pytest

from conftest import ROOT, start, stop

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
