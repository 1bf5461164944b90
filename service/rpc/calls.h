/* SPDX-License-Identifier: Apache-2.0 */
/*
 * calls.h: every call the daemon serves, in one table.
 *
 * Adding a call is one row here plus its handler kvpd_h_<name>() (declared
 * in call.h, defined in the calls_*.c file of its family) and its tests. The
 * dispatcher's switch, the retry cache's "mutating" set, the batch's
 * wire-number asserts, the metric names and the call count are all
 * generated from this table, so none can be forgotten.
 *
 * Columns: X(UPPER, name, wire, flags, batch)
 *   UPPER, name  the Request oneof case (KVPOOL__V1__REQUEST__CALL_<UPPER>)
 *                and the handler kvpd_h_<name>; name is also the metric label;
 *   wire         the oneof number in proto/kvpool.proto (asserted);
 *   flags        KVPD_CALL_MUTATING: replayed from the session's reply cache
 *                on a retried call id, never applied twice;
 *                KVPD_CALL_NO_SESSION: runs before any session exists (Hello);
 *   batch        Y if BatchCall carries the call (its number is asserted
 *                equal to the Request's, so one handler serves both), N if not.
 *
 * Internal to the daemon. Thread-safe (constant data). No I/O.
 */
#ifndef KVPD_CALLS_H
#define KVPD_CALLS_H

#include <stdbool.h>

#include "kvpool.pb-c.h"

#define KVPD_CALL_MUTATING   1u
#define KVPD_CALL_NO_SESSION 2u

#define KVPD_M KVPD_CALL_MUTATING
#define KVPD_CALLS(X) \
	X(HELLO,               hello,               10, KVPD_CALL_NO_SESSION, N) \
	X(ALLOCATE,            allocate,            11, KVPD_M, Y) \
	X(TOUCH,               touch,               12, KVPD_M, Y) \
	X(FREE,                free,                13, KVPD_M, Y) \
	X(CACHE,               cache,               14, KVPD_M, Y) \
	X(LOOKUP,              lookup,              15, 0,      Y) \
	X(EVICT,               evict,               16, KVPD_M, Y) \
	X(RESET,               reset,               17, KVPD_M, N) \
	X(STATS,               stats,               18, 0,      Y) \
	X(ALLOCATE_SLOTS,      allocate_slots,      19, KVPD_M, Y) \
	X(FREE_REQUEST,        free_request,        20, KVPD_M, Y) \
	X(GET_COMPUTED_BLOCKS, get_computed_blocks, 21, 0,      Y) \
	X(BATCH,               batch,               22, KVPD_M, N) \
	X(HEARTBEAT,           heartbeat,           23, 0,      N) \
	X(GOODBYE,             goodbye,             24, 0,      N) \
	X(REPLAY,              replay,              25, 0,      N) \
	X(SNAPSHOT,            snapshot,            26, 0,      N) \
	X(WRITE_BLOCKS,        write_blocks,        27, 0,      N) \
	X(READ_BLOCKS,         read_blocks,         28, 0,      N) \
	X(COPY_BLOCKS,         copy_blocks,         29, 0,      N) \
	X(WRITE_TOKENS,        write_tokens,        30, 0,      N) \
	X(REGION,              region,              31, 0,      N) \
	X(RESERVE,             reserve,             32, KVPD_M, Y) \
	X(COMMIT,              commit,              33, KVPD_M, Y) \
	X(ABORT,               abort,               34, KVPD_M, Y) \
	X(LOOKUP_AND_LOCK,     lookup_and_lock,     35, KVPD_M, Y) \
	X(UNLOCK,              unlock,              36, KVPD_M, Y) \
	X(CACHE_PARTIAL,       cache_partial,       37, KVPD_M, N) \
	X(MOVE_HASHES,         move_hashes,         38, KVPD_M, N) \
	X(REPORT_CACHED,       report_cached,       39, KVPD_M, N) \
	X(FREE_QUEUE,          free_queue,          41, 0,      N) \
	X(CLUSTER_FILL,        cluster_fill,        42, KVPD_M, N) \
	X(BLOCK_KEYS,          block_keys,          43, 0,      N)

/* KVPD_CALL_<UPPER>: a call's row in the table; KVPD_NUM_CALLS rows. */
enum kvpd_call_index {
#define KVPD_X_INDEX(U, n, w, f, b) KVPD_CALL_##U,
	KVPD_CALLS(KVPD_X_INDEX)
#undef KVPD_X_INDEX
	KVPD_NUM_CALLS
};

struct call;

/* One row of the table, as the dispatcher uses it. */
struct kvpd_call_op {
	const char *name;
	unsigned flags;
	bool batchable;
	int (*run)(struct call *c, const void *msg, Kvpool__V1__Reply *out);
};

/* The row of a Request (or BatchCall) oneof case; NULL if no such call. */
const struct kvpd_call_op *kvpd_call_lookup(int wire);
/* The table index of a row returned by kvpd_call_lookup(). */
enum kvpd_call_index kvpd_call_index(const struct kvpd_call_op *op);
/* The metric label of row i, or NULL if i is out of range. */
const char *kvpd_call_name(int i);

#endif /* KVPD_CALLS_H */
