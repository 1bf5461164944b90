/* SPDX-License-Identifier: Apache-2.0 */
/*
 * server.h: kvpoold's state and its one entry point for requests.
 *
 * A server hosts named pools. Each pool owns its engine (pool, hasher,
 * request manager), its sessions and one mutex: every call on a pool runs
 * under that pool's lock, so the engine is touched by one thread at a time
 * while different pools proceed in parallel.
 *
 * kvpd_server_handle() turns request bytes into reply bytes and never
 * fails to produce a reply: bad input of any kind becomes an error status.
 * It does no I/O, so tests and the fuzzer drive it directly; transport.c
 * connects it to nng. Time comes in as an argument (milliseconds, any
 * monotonic origin).
 *
 * Thread-safe: kvpd_server_handle and kvpd_server_expire may be called from
 * any number of threads.
 */
#ifndef KVPD_SERVER_H
#define KVPD_SERVER_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/kvp_status.h"
#include "service/rpc/calls.h"
#include "service/config/config.h"
#include "service/streams/stream.h"

struct kvpd_server;

#define KVPD_NUM_STATUS KVP_STATUS_COUNT
#define KVPD_LATENCY_BUCKETS 14

/* Upper bounds (seconds) of the call latency histogram's buckets; the last is +Inf. */
extern const double kvpd_latency_bounds[KVPD_LATENCY_BUCKETS - 1];

/* Per-pool counters for /metrics and Stats. */
struct kvpd_pool_counters {
	uint64_t sessions_opened, leases_expired, goodbyes;
	uint64_t events_emitted;
	uint64_t calls, call_errors;
	uint64_t event_batches, replays_served, replays_refused, snapshots;
	uint64_t replay_bytes, replay_dropped_for_bytes;   /* the replay ring: held now, dropped */
	uint64_t bytes_read, bytes_written;                /* block contents moved by data calls */
	uint64_t reply_cache_bytes, replies_forgotten;     /* stored replies: held now, dropped */
	uint64_t limit_refusals;                           /* --max-refs, --max-session-requests */
	uint64_t quota_refusals;                           /* the pool's session_refs */
	uint64_t cluster_pending, cluster_dropped;         /* fill.h: pending answers, no room */
	uint64_t refs_held;                                /* every session's references, now */
	uint64_t by_call[KVPD_NUM_CALLS][KVPD_NUM_STATUS]; /* [call table row][status] */
	/* Handling time by call (table row), lock wait included, not the network. */
	uint64_t latency[KVPD_NUM_CALLS][KVPD_LATENCY_BUCKETS];
	double latency_sum[KVPD_NUM_CALLS];
	/*
	 * Calls' time waiting for the pool's lock, and holding it to run: one
	 * pool's calls run one at a time, so held time near one second per
	 * second means the pool is saturated, whatever the CPUs have left.
	 */
	double lock_wait_s, lock_held_s;
	uint32_t sessions;                                 /* open now */
	bool vllm_on;                                      /* a vLLM-wire publisher is attached */
	uint64_t vllm_batches, vllm_bytes, vllm_replays, vllm_bad_replay_requests,
		vllm_send_failures, vllm_replays_cut, vllm_publisher_resets;
};

/* A snapshot of a pool's engine gauges and counters, for /metrics. */
struct kvpd_pool_gauges {
	uint32_t num_blocks, num_free, num_cached_blocks, num_cached_keys;
	double usage;
	uint64_t blocks_allocated, blocks_evicted, alloc_failures, blocks_stored, resets;
	uint64_t prefix_requests, prefix_queries, prefix_hits, active_requests;
};
void kvpd_server_pool_gauges(struct kvpd_server *s, size_t i, struct kvpd_pool_gauges *out);


/* Renders every pool's metrics in Prometheus text format into a new string. */
char *kvpd_metrics_render(struct kvpd_server *s);

/*
 * Creates the server and its pools from a loaded configuration. Returns 0,
 * or a kvp status with a reason written to err_buf.
 */
int kvpd_server_create(const struct kvpd_config *cfg, struct kvpd_server **out, char *err_buf,
                       size_t err_len);
/* Destroys the server; every session's blocks are released first. NULL: no-op. */
void kvpd_server_destroy(struct kvpd_server *s);

/*
 * Where a reply's bytes go: alloc(ctx, len) returns len writable bytes (or
 * NULL), replacing any buffer an earlier alloc returned for the same reply.
 * The reply is then buf[0..len). kvpoold's transport allocates an nng
 * message, so a large reply (ReadBlocks) is written once, in place.
 */
struct kvpd_sink {
	void *(*alloc)(void *ctx, size_t len);
	void *ctx;
	uint8_t *buf;
	size_t len;
	/* Set by the call when its refusal is worth an operator's attention (for the log). */
	uint8_t refusal;                  /* enum kvpd_refusal; 0: none */
	bool authenticated;               /* the call carried a pool's token (the transport's precedence) */
	char refusal_pool[KVPD_NAME_MAX];
	char refusal_why[256];            /* the reply's detail: never a secret */
};

enum kvpd_refusal { KVPD_REFUSED_AUTH = 1, KVPD_REFUSED_SESSION_LIMIT, KVPD_REFUSED_TOO_LARGE };
#define KVPD_NUM_REFUSALS 4

/*
 * Records a refusal in the sink for the transport's log. Inline: the
 * dispatcher and the session calls record refusals, and neither may call
 * back into the server (no circle between the files).
 */
static inline void
kvpd_sink_refusal(struct kvpd_sink *sink, enum kvpd_refusal kind, const char *pool,
                  const char *why)
{
	if (sink == NULL)
		return;
	sink->refusal = (uint8_t)kind;
	snprintf(sink->refusal_pool, sizeof(sink->refusal_pool), "%s", pool ? pool : "");
	snprintf(sink->refusal_why, sizeof(sink->refusal_why), "%s", why ? why : "");
}

/* kvpd_server_handle with the reply written through sink. KVP_OK or KVP_ENOMEM. */
int kvpd_server_handle_to(struct kvpd_server *s, const uint8_t *req, size_t len, uint64_t now_ms,
                          struct kvpd_sink *sink);

/*
 * Handles one request (len bytes) at time now_ms. On return *reply (malloc'd,
 * the caller frees it) holds the encoded Reply; returns KVP_OK, or KVP_ENOMEM
 * when not even an error reply could be built (*reply is then NULL).
 */
int kvpd_server_handle(struct kvpd_server *s, const uint8_t *req, size_t len, uint64_t now_ms,
                       uint8_t **reply, size_t *reply_len);

/* Ends sessions whose lease ran out by now_ms, releasing their blocks. Returns how many. */
size_t kvpd_server_expire(struct kvpd_server *s, uint64_t now_ms);

/*
 * Sets the function that sends each pool's event batches (nng PUB in
 * kvpoold; tests may capture them). Call before serving requests.
 */
void kvpd_server_set_publisher(struct kvpd_server *s, kvpd_publish_fn fn, void *ctx);

/* Engine pods the pool's sessions serve (HelloRequest.vllm_pod), with how many sessions each. */
#define KVPD_MAX_POOL_PODS 64
struct kvpd_pool_pods {
	struct {
		char name[64];
		uint32_t sessions;
	} pod[KVPD_MAX_POOL_PODS];
	size_t n;
};

/*
 * Pool i's engine pods (read under the pool's lock: from the event sink's
 * callback, which runs under it), or NULL if i is out of range.
 */
const struct kvpd_pool_pods *kvpd_server_pool_pods(const struct kvpd_server *s, size_t i);

/*
 * Attaches a second consumer of pool i's batches (the vLLM-wire publisher)
 * and returns the counters it should keep, or NULL if i is out of range.
 * fn NULL detaches it. Call before serving requests, or to detach after.
 */
struct kvpd_vllm_counters *kvpd_server_set_event_sink(struct kvpd_server *s, size_t i,
                                                      kvpd_events_fn fn, void *ctx);

/* Publishes a tick on every pool's stream (the reaper calls it about once a second). */
void kvpd_server_tick(struct kvpd_server *s);

/* Checks every pool's invariants; KVP_OK or KVP_EINTERNAL with a reason. */
int kvpd_server_check(struct kvpd_server *s, char *detail, size_t len);

/*
 * Sessions that ended (Goodbye or an expired lease), newest last: each pool
 * keeps the last KVPD_GONE_KEEP, so the log can say what an expiry released
 * and a call on a session that is gone can say why it is gone.
 */
#define KVPD_GONE_KEEP 64
/* Snapshot entries one page carries at most (the message limit may lower it). */
#define KVPD_SNAPSHOT_PAGE 65536
enum kvpd_gone_why { KVPD_GONE_GOODBYE = 1, KVPD_GONE_EXPIRED = 2 };
struct kvpd_gone_session {
	uint64_t id;
	uint64_t at_ms;        /* when, on the daemon's monotonic clock */
	uint64_t released;     /* block references it still held */
	uint32_t lease_ms;
	uint32_t requests;     /* requests it still had (ended with it) */
	uint8_t why;           /* enum kvpd_gone_why */
	char client[64];
};
/*
 * Copies up to cap of pool i's sessions that ended after *cursor (a count
 * of ended sessions; start at 0) into out and advances *cursor. Ends older
 * than the last KVPD_GONE_KEEP are skipped. Returns how many were copied.
 */
size_t kvpd_server_gone(struct kvpd_server *s, size_t i, uint64_t *cursor,
                        struct kvpd_gone_session *out, size_t cap);

/* Number of hosted pools, and a pool's name and counters (copied under its lock). */
size_t kvpd_server_num_pools(const struct kvpd_server *s);
const char *kvpd_server_pool_name(const struct kvpd_server *s, size_t i);
/* How pool i's executor was chosen and sized (a line for the log). */
const char *kvpd_server_pool_note(const struct kvpd_server *s, size_t i);
void kvpd_server_pool_counters(struct kvpd_server *s, size_t i, struct kvpd_pool_counters *out);

/* Why the transport closed a connection (kvpool_connections_closed_total{reason}). */
enum kvpd_close_reason {
	KVPD_CLOSE_IDLE,         /* no request for --idle-timeout-ms */
	KVPD_CLOSE_NO_READ,      /* a reply not taken within --send-timeout-ms */
	KVPD_CLOSE_TLS,          /* a TLS handshake failed (counted from nng's listener stats) */
	KVPD_CLOSE_ADDRESS_BOUND, /* one unauthenticated address held its share of contexts */
	KVPD_CLOSE_UNAUTH_BOUND,  /* unauthenticated peers together held half the contexts */
	KVPD_CLOSE_REASONS
};
/* Counts one close (any thread). An unknown reason is ignored. */
void kvpd_server_count_close(struct kvpd_server *s, enum kvpd_close_reason r);
/* Closes so far for reason r (0 for an unknown reason). */
uint64_t kvpd_server_closes(const struct kvpd_server *s, enum kvpd_close_reason r);
/* The reason's label value: "idle", "took_no_reply", "tls_handshake", "address_bound",
 * "unauthenticated_bound"; NULL for an unknown reason. */
const char *kvpd_close_reason_name(enum kvpd_close_reason r);

#endif /* KVPD_SERVER_H */
