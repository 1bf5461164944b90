# SPDX-License-Identifier: Apache-2.0
"""The package's type hints: every public method and function is annotated,
the annotations resolve, mypy (Debian's python3-mypy) finds the package
consistent, and a user's program that misuses the API is flagged."""
import inspect
import os
import subprocess
import sys
import typing

import pytest

import kvpool
import kvpool.batch
import kvpool.client
import kvpool.events
import kvpool.manager
import kvpool.vllm

PKG = os.path.dirname(os.path.abspath(kvpool.__file__))
PUBLIC = [kvpool.Client, kvpool.Hasher, kvpool.Batch, kvpool.CallResult, kvpool.SlotsResult,
          kvpool.Subscriber, kvpool.Index, kvpool.KvpoolError, kvpool.vllm.KVCacheBlock,
          kvpool.vllm.KVCacheBlocks, kvpool.vllm.RemoteBlockPool,
          kvpool.manager.RemoteKVCacheManager, kvpool.manager.Step]
# What the modules import for their annotations only (under TYPE_CHECKING).
NAMES = {"Batch": kvpool.Batch, "Client": kvpool.Client, "Step": kvpool.manager.Step,
         "RemoteKVCacheManager": kvpool.manager.RemoteKVCacheManager}


def _methods():
    for cls in PUBLIC:
        for name, f in vars(cls).items():
            if name.startswith("_") and name not in ("__init__", "__enter__", "__exit__",
                                                      "__len__", "__add__"):
                continue
            if isinstance(f, property):
                f = f.fget
            if inspect.isfunction(f) and f.__qualname__.startswith(cls.__name__ + "."):
                yield f"{cls.__name__}.{name}", f
    yield "events.hash_to_int", kvpool.events.hash_to_int
    yield "events.convert", kvpool.events.convert


@pytest.mark.parametrize("name,f", list(_methods()), ids=lambda v: v if isinstance(v, str) else "")
def test_every_public_method_is_annotated(name, f):
    sig = inspect.signature(f)
    missing = [p.name for p in sig.parameters.values()
               if p.name != "self" and p.annotation is inspect.Parameter.empty]
    assert not missing, f"{name}: parameters without a type: {missing}"
    assert sig.return_annotation is not inspect.Signature.empty, f"{name}: no return type"
    # The annotations name things that exist (a typo would only show here or in mypy).
    mod = sys.modules[f.__module__]
    typing.get_type_hints(f, globalns={**vars(mod), **NAMES})


def test_the_package_says_it_is_typed():
    assert os.path.exists(os.path.join(PKG, "py.typed"))
    assert kvpool.vllm.RequestLike.__module__ == "kvpool._types"  # as its README names it


def _mypy(*args):
    pytest.importorskip("mypy")
    return subprocess.run([sys.executable, "-m", "mypy", "--no-incremental",
                           "--cache-dir", os.devnull, "--ignore-missing-imports",
                           "--no-error-summary", *args], capture_output=True, text=True,
                          timeout=90)


def test_mypy_finds_the_package_consistent():
    r = _mypy(PKG)
    assert r.returncode == 0, r.stdout + r.stderr


def test_mypy_flags_a_user_program_that_misuses_the_api(tmp_path):
    """A scheduler's code checked against the installed hints: the right
    calls pass, and each wrong one is reported on its line."""
    prog = tmp_path / "user.py"
    prog.write_text(
        "import kvpool\n"
        "from kvpool.vllm import RemoteKVCacheManager\n"
        "def step(c: kvpool.Client, waiting: list, running: list) -> None:\n"
        "    ids: list[int] = c.allocate(4)\n"
        "    c.free(ids)\n"
        "    m = RemoteKVCacheManager(c)\n"
        "    m.prefetch_computed_blocks(waiting)\n"
        "    with m.step() as s:\n"
        "        for r in running:\n"
        "            s.allocate_slots(r, 1)\n"
        "        got = s.commit()\n"
        "    blocks, hit, _ = m.get_computed_blocks(waiting[0])\n"  # vLLM 0.33's triple
        "    new = m.allocate_slots(waiting[0], 8 - hit, hit, blocks)\n"
        "    first: list[int] = new.get_block_ids()[0] if new is not None else []\n"
        "    c.allocate('4')\n"                             # line 15: a str for an int
        "    n: str = m.usage\n"                            # line 16: a float as a str
        "    s.allocate_slots(running[0])\n")               # line 17: num_new_tokens missing
    env = dict(os.environ, MYPYPATH=os.path.dirname(PKG))
    r = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "--cache-dir",
                        os.devnull, "--ignore-missing-imports", "user.py"],
                       capture_output=True, text=True, timeout=90, env=env, cwd=tmp_path) \
        if _mypy("--version").returncode == 0 else None
    assert r is not None
    flagged = {int(line.split(":")[1]) for line in r.stdout.splitlines()
               if line.startswith("user.py:") and ": error:" in line}
    assert flagged == {15, 16, 17}, r.stdout
