/* SPDX-License-Identifier: Apache-2.0 */
/*
 * call.h: one call in progress (call.c), shared by the dispatcher
 * (dispatch.c) and the handlers of each family of calls (calls_session.c,
 * calls_blocks.c, calls_requests.c, calls_stream.c, calls_data.c). Every
 * handler is kvpd_h_<name>(call, request, reply), named by its row in the
 * call table (calls.h).
 *
 * Internal to the daemon; everything here runs under the pool's lock. A
 * handler validates the whole call before the engine changes anything,
 * records ownership only after the engine succeeded, builds its result from
 * kvpd_scratch() memory (freed when the reply is packed), and reports
 * failures with kvpd_fail(), which keeps the detail for the reply.
 */
#ifndef KVPD_CALL_H
#define KVPD_CALL_H

#include <stdbool.h>
#include <stddef.h>

#include "common/block_hash.h"
#include "service/rpc/dispatch.h"

#define MAX_MM_FEATURES 256

/* One call in progress: its status, detail, and its pool's scratch arena. */
struct call {
	struct kvpd_pool *p;
	struct kvpd_session *sess;
	int status;
	char detail[256];
	bool oom;
	uint64_t call_id;
	uint64_t now_ms;         /* the daemon's clock when the call arrived */
	size_t sess_index;       /* sess's slot in the pool's session list */
	struct kvpd_sink *sink;  /* where the reply goes */
	bool replied;            /* a handler wrote the whole reply into the sink itself */
	const struct kvpd_precomputed *pre; /* computed before the lock; NULL: nothing */
	/* The call table's row for a wire call number (kvpd_call_lookup): Batch's way in. */
	const struct kvpd_call_op *(*lookup)(int wire);
};

/* Sets the call's status and detail; returns the status. */
int kvpd_fail(struct call *c, int status, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* Zeroed memory that lives until the call's reply is packed; NULL on ENOMEM. */
void *kvpd_scratch(struct call *c, size_t n);
/* A copy of s in scratch memory; NULL on ENOMEM. */
char *kvpd_scratch_str(struct call *c, const char *s);

/* A zeroed, initialised protobuf-c message from scratch memory. */
void *kvpd_new_msg(struct call *c, const ProtobufCMessageDescriptor *d);
#define NEW(c, type, desc) ((type *)kvpd_new_msg((c), &(desc)))
/* Zeroes what the last call used, keeping the arena's chunks (dispatch.c). */
void kvpd_scratch_reset(struct kvpd_pool *p);

/* A call's extra-key sources, decoded from the wire. */
struct call_keys {
	struct kvp_mm_feature mm[MAX_MM_FEATURES];
	struct kvp_request_keys keys;
	const struct kvp_request_keys *ptr; /* NULL when the call has none */
	bool has_lora_id;
	int64_t lora_id;
};

/* At most max-ids ids, each inside the pool: KVP_OK, or the failure (detail set). */
int kvpd_check_ids(struct call *c, const int32_t *ids, size_t n);

int kvpd_parse_keys(struct call *c, const Kvpool__V1__RequestKeys *k, struct call_keys *out);
/* A group the pool has: KVP_OK, or INVALID_ARGUMENT naming how many it has. */
int kvpd_check_group(struct call *c, uint32_t g);
/*
 * The fine hashes of a call: given (a multiple of the pool's hash_len) or
 * computed from the request's tokens (from position 0) and keys.
 */
int kvpd_fine_hashes(struct call *c, ProtobufCBinaryData given, const int64_t *tokens, size_t ntok,
                     const struct kvp_request_keys *keys, const uint8_t **out, size_t *n,
                     bool *computed);

/* Sessions (calls_session.c) and Batch (calls_batch.c). */
int kvpd_h_hello(struct call *c, const Kvpool__V1__HelloRequest *m, Kvpool__V1__Reply *out);
int kvpd_h_heartbeat(struct call *c, const Kvpool__V1__HeartbeatRequest *m, Kvpool__V1__Reply *out);
int kvpd_h_goodbye(struct call *c, const Kvpool__V1__GoodbyeRequest *m, Kvpool__V1__Reply *out);
int kvpd_h_batch(struct call *c, const Kvpool__V1__BatchRequest *m, Kvpool__V1__Reply *out);

/* Block-level calls (calls_blocks.c). */
int kvpd_h_allocate(struct call *c, const Kvpool__V1__AllocateRequest *m, Kvpool__V1__Reply *out);
int kvpd_h_touch(struct call *c, const Kvpool__V1__TouchRequest *m, Kvpool__V1__Reply *out);
int kvpd_h_free(struct call *c, const Kvpool__V1__FreeRequest *m, Kvpool__V1__Reply *out);
int kvpd_h_cache(struct call *c, const Kvpool__V1__CacheRequest *m, Kvpool__V1__Reply *out);
int kvpd_h_lookup(struct call *c, const Kvpool__V1__LookupRequest *m, Kvpool__V1__Reply *out);
int kvpd_h_evict(struct call *c, const Kvpool__V1__EvictRequest *m, Kvpool__V1__Reply *out);
int kvpd_h_reset(struct call *c, const Kvpool__V1__ResetRequest *m, Kvpool__V1__Reply *out);
int kvpd_h_stats(struct call *c, const Kvpool__V1__StatsRequest *m, Kvpool__V1__Reply *out);
int kvpd_h_free_queue(struct call *c, const Kvpool__V1__FreeQueueRequest *m,
                      Kvpool__V1__Reply *out);
int kvpd_h_block_keys(struct call *c, const Kvpool__V1__BlockKeysRequest *m,
                      Kvpool__V1__Reply *out);

/* The cluster tier's agent (calls_cluster.c). */
int kvpd_h_cluster_fill(struct call *c, const Kvpool__V1__ClusterFillRequest *m,
                        Kvpool__V1__Reply *out);

/* Request-level calls (calls_requests.c). */
int kvpd_h_allocate_slots(struct call *c, const Kvpool__V1__AllocateSlotsRequest *m,
                          Kvpool__V1__Reply *out);
int kvpd_h_free_request(struct call *c, const Kvpool__V1__FreeRequestRequest *m,
                        Kvpool__V1__Reply *out);
int kvpd_h_get_computed_blocks(struct call *c, const Kvpool__V1__GetComputedBlocksRequest *m,
                               Kvpool__V1__Reply *out);

/* The event stream's repair (calls_stream.c). */
int kvpd_h_replay(struct call *c, const Kvpool__V1__ReplayRequest *m, Kvpool__V1__Reply *out);
int kvpd_h_snapshot(struct call *c, const Kvpool__V1__SnapshotRequest *m,
                     Kvpool__V1__Reply *out);

/* The data plane (calls_data.c). */
int kvpd_h_write_blocks(struct call *c, const Kvpool__V1__WriteBlocksRequest *m,
                        Kvpool__V1__Reply *out);
int kvpd_h_read_blocks(struct call *c, const Kvpool__V1__ReadBlocksRequest *m,
                       Kvpool__V1__Reply *out);
int kvpd_h_copy_blocks(struct call *c, const Kvpool__V1__CopyBlocksRequest *m,
                       Kvpool__V1__Reply *out);
int kvpd_h_write_tokens(struct call *c, const Kvpool__V1__WriteTokensRequest *m,
                        Kvpool__V1__Reply *out);

/* The shared region and its calls by key (calls_region.c). */
int kvpd_h_region(struct call *c, const Kvpool__V1__RegionRequest *m, Kvpool__V1__Reply *out);
int kvpd_h_reserve(struct call *c, const Kvpool__V1__ReserveRequest *m, Kvpool__V1__Reply *out);
int kvpd_h_commit(struct call *c, const Kvpool__V1__CommitRequest *m, Kvpool__V1__Reply *out);
int kvpd_h_abort(struct call *c, const Kvpool__V1__AbortRequest *m, Kvpool__V1__Reply *out);
int kvpd_h_lookup_and_lock(struct call *c, const Kvpool__V1__LookupAndLockRequest *m,
                           Kvpool__V1__Reply *out);
int kvpd_h_unlock(struct call *c, const Kvpool__V1__UnlockRequest *m, Kvpool__V1__Reply *out);

/* vLLM 0.33's partial prefix-cache entries and reuse reports (calls_partial.c). */
int kvpd_h_cache_partial(struct call *c, const Kvpool__V1__CachePartialRequest *m,
                         Kvpool__V1__Reply *out);
int kvpd_h_move_hashes(struct call *c, const Kvpool__V1__MoveHashesRequest *m,
                       Kvpool__V1__Reply *out);
int kvpd_h_report_cached(struct call *c, const Kvpool__V1__ReportCachedRequest *m,
                         Kvpool__V1__Reply *out);
/* Whether the session may take n more block references (--max-refs); fails the call if not. */
int kvpd_room_for_refs(struct call *c, size_t n);

#endif /* KVPD_CALL_H */
