# SPDX-License-Identifier: Apache-2.0
"""Step: one scheduler step's RemoteKVCacheManager calls as one Batch, with
decode-shaped calls queued and read back in bulk (_Run)."""
from __future__ import annotations

from array import array
from ctypes import byref, c_int32, c_size_t, c_uint32
from operator import attrgetter, itemgetter, sub
from typing import TYPE_CHECKING, Any, Optional

from . import _lib as L
from ._types import RequestLike
from ._args import _raise
from .errors import NoSpace, NotSupported
from .block_pool import KVCacheBlocks

if TYPE_CHECKING:
    from .batch import Batch
    from .manager import RemoteKVCacheManager

def _check_reserved(reserved_blocks):
    if reserved_blocks:
        raise NotSupported(NotSupported.status, "NOT_SUPPORTED",
                           "Step.allocate_slots(reserved_blocks > 0): a step's calls go in "
                           "one Batch, with no free count to check them against first; use "
                           "RemoteKVCacheManager.allocate_slots")


def _released(req):
    """The mirror's side of FreeRequest: each held block loses a reference."""
    for row in req.blocks:
        for b in row:
            if not b.is_null:
                b.ref_cnt -= 1
    req.blocks = []


_all_tokens, _sent, _wire_id = (attrgetter(a) for a in ("all_token_ids", "sent", "wire_id"))
_last = itemgetter(-1)


class _Run:
    """Consecutive decode-shaped allocate_slots calls of a Step (a request
    the daemon has, no prefix hit, lookahead or delay, and on a pool with
    sparse groups no tokens in flight), added to the batch
    with one C call and read back with one. Kept as parallel lists so that
    queueing one is three appends and each pass over them runs in C (map)."""
    __slots__ = ("requests", "reqs", "nnew", "targets", "ntok", "first")

    def __init__(self):
        self.requests = []  # vLLM's Request objects
        self.reqs = []      # their _Req mirrors
        self.nnew = []      # num_new_tokens
        self.targets = self.ntok = None
        self.first = -1

    def add_to(self, batch):
        """Adds the calls; each request's tokens are read now."""
        reqs = self.reqs
        tokens = list(map(_all_tokens, self.requests))
        self.targets = targets = list(map(len, tokens))
        self.ntok = ntok = array("I", map(sub, targets, map(_sent, reqs)))
        if len(ntok) and min(ntok) == 1 and max(ntok) == 1:  # a decode step: one token each
            toks = array("q", map(_last, tokens))
        else:
            toks = array("q")
            for t, k in zip(tokens, map(_sent, reqs)):
                toks.extend(t[k:])
        ids = array("Q", map(_wire_id, reqs))
        self.first = batch._add_slots_run(ids, array("I", self.nnew), ntok, toks)


class Step:
    """One scheduler step's calls as one Batch (keep-going: a request that
    does not fit is refused alone). allocate_slots() and free() queue and
    return the call's index; commit() sends them and returns one result per
    call: KVCacheBlocks or None for allocate_slots, None for free. A request
    takes one allocate_slots per step (a second raises ValueError and queues
    nothing), as in vLLM's scheduler, which retries one only after it has
    the answer.

    Decode-shaped calls (a request the daemon already has, without a prefix
    hit, lookahead or delay) take a bulk path: runs of them are added and
    read back with one C call each, so a step of a few hundred decodes
    costs Python little beside the round trip.

    Open one per scheduler step (`with mgr.step() as s:`): closing it
    keeps its Batch, cleared, for the manager's next Step, so a step does
    not create one. Calls queued and not committed are dropped at close,
    and a closed Step refuses calls (ValueError).

    Differs from calling the manager directly in one way that a network
    imposes: the results come back together, so a scheduler decides on
    preemption after the step rather than between its calls."""

    def __init__(self, mgr: RemoteKVCacheManager) -> None:
        self._mgr = mgr
        # A scheduler opens a Step per step: the last one's Batch (and the C
        # memory it grew) is reused rather than created again.
        self._batch: Optional[Batch] = mgr._take_batch()
        self._ops: list[Any] = []  # ("slots", ...), ("free", req), ("noop",) or a _Run
        self._run: Optional[_Run] = None  # the open _Run, if the last call was decode-shaped
        self._count = 0
        self._queued: set[Any] = set()  # request ids with an allocate_slots in this step

    def allocate_slots(self, request: RequestLike, num_new_tokens: int,
                       num_new_computed_tokens: int = 0,
                       new_computed_blocks: Optional[KVCacheBlocks] = None,
                       num_lookahead_tokens: int = 0, num_external_computed_tokens: int = 0,
                       delay_cache_blocks: bool = False, num_encoder_tokens: int = 0,
                       full_sequence_must_fit: bool = False, reserved_blocks: int = 0,
                       has_scheduled_reqs: bool = True,
                       skip_zeroing_group_ids: tuple[int, ...] = ()) -> int:
        _check_reserved(reserved_blocks)
        rid = request.request_id
        if rid in self._queued:
            # Its tokens are counted at commit: a second call would send them twice.
            raise ValueError(f"request {rid!r} already has an allocate_slots call in this "
                             "step: commit the step first")
        req = self._mgr._reqs.get(rid)
        if req is not None and req.sent and num_new_tokens > 0 and not (
                num_new_computed_tokens or num_lookahead_tokens or delay_cache_blocks
                or num_external_computed_tokens or full_sequence_must_fit
                or num_encoder_tokens or (not self._mgr._plain and
                                          bool(getattr(request, "num_in_flight_tokens", None)))):
            run = self._run
            if run is None:
                self._live()  # once per run: a closed Step has none
                run = self._run = _Run()
                self._ops.append(run)
            run.requests.append(request)
            run.reqs.append(req)
            run.nnew.append(num_new_tokens)
            self._queued.add(rid)
            self._count += 1
            return self._count - 1
        batch = self._live()
        kw, req = self._mgr._slots_call(request, num_new_tokens, num_new_computed_tokens,
                                        num_lookahead_tokens, num_external_computed_tokens,
                                        delay_cache_blocks, num_encoder_tokens,
                                        full_sequence_must_fit)
        self._close_run()
        batch.allocate_slots(req.wire_id, **kw)
        self._ops.append(("slots", request, req, kw, num_new_computed_tokens,
                          new_computed_blocks))
        self._queued.add(rid)
        self._count += 1
        return self._count - 1

    def free(self, request: RequestLike) -> int:
        batch = self._live()
        self._close_run()
        self._queued.discard(request.request_id)
        req = self._mgr._reqs.pop(request.request_id, None)
        if req is not None and req.sent:
            batch.free_request(req.wire_id)
            self._ops.append(("free", req))
        else:
            self._ops.append(("noop",))
        self._count += 1
        return self._count - 1

    def _live(self):
        if self._batch is None:
            raise ValueError("kvpool: this Step is closed")
        return self._batch

    def _close_run(self):
        if self._run is not None:
            self._run.add_to(self._batch)
            self._run = None

    def commit(self) -> list[Optional[KVCacheBlocks]]:
        """Sends the step; one result per queued call, in order."""
        batch = self._live()
        self._mgr._prefetched = {}
        self._close_run()
        if len(batch):
            batch._transmit()
        out: list[Optional[KVCacheBlocks]] = []
        try:
            k = 0
            for op in self._ops:
                if isinstance(op, _Run):
                    self._run_results(op, out)
                    k += len(op.reqs)
                    continue
                if op[0] == "noop":
                    out.append(None)
                    continue
                if op[0] == "free":
                    err = batch._error(k)
                    k += 1
                    if err is not None:
                        raise err
                    _released(op[1])
                    out.append(None)
                    continue
                res, err = batch._slots(k)
                k += 1
                _, request, req, kw, nhit, hit_blocks = op
                if isinstance(err, NoSpace):
                    self._mgr._refused(request, req, nhit + kw["num_external_computed_tokens"]
                                       - kw.get("num_in_flight_tokens", 0))
                    out.append(None)
                elif err is not None:
                    raise err
                else:
                    out.append(self._mgr._slots_done(request, req, kw, res, nhit, hit_blocks))
        finally:
            batch.clear()
            self._ops.clear()
            self._queued.clear()
            self._count = 0
        return out

    def _run_results(self, run, out):
        mgr, batch = self._mgr, self._batch
        reqs, first = run.reqs, run.first
        n, ng = len(reqs), mgr.num_kv_cache_groups
        st, comp, rows = array("i", bytes(4 * n)), array("I", bytes(4 * n)), \
            array("I", bytes(4 * n * ng))
        cap = (sum(run.nnew) + 2 * n) * ng
        ids = array("i", bytes(4 * cap))
        got = c_size_t()
        rv = L.kvp_batch_slots_results(
            batch._b, first, n, ng, (c_int32 * n).from_buffer(st),
            (c_uint32 * n).from_buffer(comp), (c_uint32 * (n * ng)).from_buffer(rows),
            (c_int32 * cap).from_buffer(ids), cap, byref(got))
        if rv != 0:
            _raise(rv, "step: cannot read the AllocateSlots results")
        empty, blocks, null = mgr.empty_kv_cache_blocks, mgr._blocks, mgr.null_block
        if not mgr._plain:
            for req in reqs:  # vLLM's remove_skipped_blocks, before the new blocks
                mgr._drop_skipped(req, req.computed)
        for req, target, computed in zip(reqs, run.targets, comp):
            req.sent = target
            req.computed = computed
            mgr._note_cached(req, False)  # a run's calls are never delay_cache_blocks
        res = [empty] * n
        err = None
        if any(st):
            for j in [j for j, s in enumerate(st) if s]:
                # NoSpace: the tokens stay appended, the skipped blocks dropped (above).
                e = batch._result(first + j).error
                res[j] = None
                if not isinstance(e, NoSpace):
                    reqs[j].sent = run.targets[j] - run.ntok[j]
                    err = err or e
        off = 0
        totals = [sum(rows[j * ng:(j + 1) * ng]) for j in range(n)] if ng > 1 else rows
        for j in [j for j, k in enumerate(totals) if k]:
            req, new = reqs[j], []
            for g in range(ng):
                k = rows[j * ng + g]
                if k and not mgr._plain:
                    mgr._note_state(req, g)
                row = []
                for i in ids[off:off + k]:
                    if i == 0:
                        row.append(null)
                        continue
                    b = blocks.get(i)
                    if b is None:
                        b = blocks[i] = mgr._block_cls(i)
                    b.ref_cnt = 1
                    b._block_hash = None
                    row.append(b)
                off += k
                req.blocks[g].extend(row)
                new.append(row)
            if any(new):
                res[j] = mgr._blocks_cls(tuple(new))
        out.extend(res)
        if err is not None:
            raise err

    def close(self) -> None:
        """Ends the Step; calls queued and not committed are dropped."""
        batch, self._batch = self._batch, None
        if batch is None:
            return
        self._ops.clear()
        self._queued.clear()
        self._run = None
        self._mgr._give_batch(batch)

    def __enter__(self) -> Step:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
