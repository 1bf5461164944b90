# SPDX-License-Identifier: Apache-2.0
"""kvpool's status codes as exceptions: every call that the daemon (or the
C client) refuses raises the subclass of KvpoolError for its status, with
the daemon's detail text."""
from __future__ import annotations

from typing import Any, Optional


class KvpoolError(Exception):
    """A refused call. status: the numeric kvp status; name: its name
    (NO_SPACE, as kvpoolctl and the log show it); detail: the daemon's or the client's explanation.
    results: a Batch's failure raised from send(), every call's CallResult."""
    status = -1
    results: Optional[list[Any]] = None

    def __init__(self, status: int, name: str, detail: str = "") -> None:
        self.status, self.name, self.detail = status, name, detail
        super().__init__(f"{name}: {detail}" if detail else name)


class InvalidArgument(KvpoolError, ValueError):
    status = 1


class NoSpace(KvpoolError):
    """Not enough free blocks: the caller must preempt (vLLM returns None)."""
    status = 2


class NotFound(KvpoolError, LookupError):
    status = 3


class WrongState(KvpoolError):
    status = 4


class NotOwner(KvpoolError, PermissionError):
    status = 5


class UnknownPool(KvpoolError, LookupError):
    status = 6


class UnsupportedVersion(KvpoolError):
    status = 7


class MessageTooLarge(KvpoolError):
    status = 8


class Unauthenticated(KvpoolError, PermissionError):
    status = 9


class Busy(KvpoolError):
    """No answer in time, or the daemon is saturated; safe to retry."""
    status = 10


class Internal(KvpoolError):
    status = 11


class OutOfRange(KvpoolError, IndexError):
    status = 12


class NoMemory(KvpoolError, MemoryError):
    status = 13


class NotSupported(KvpoolError):
    status = 14


class NoDevice(KvpoolError):
    status = 15


class Unavailable(KvpoolError, ConnectionError):
    """No daemon could be reached within the connect timeout (is kvpoold running?)."""
    status = 16


class DeadlineExceeded(KvpoolError, TimeoutError):
    """The call's deadline passed before the daemon ran it: nothing was applied."""
    status = 17


class QuotaExceeded(KvpoolError):
    """The call would take the session past its quota on the pool (session_refs,
    session_rows): nothing was applied; release references first."""
    status = 18


BY_STATUS = {cls.status: cls for cls in (
    InvalidArgument, NoSpace, NotFound, WrongState, NotOwner, UnknownPool, UnsupportedVersion,
    MessageTooLarge, Unauthenticated, Busy, Internal, OutOfRange, NoMemory, NotSupported,
    NoDevice, Unavailable, DeadlineExceeded, QuotaExceeded)}
