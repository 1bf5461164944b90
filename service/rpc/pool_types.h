/* SPDX-License-Identifier: Apache-2.0 */
/*
 * pool_types.h: the parts of a pool's state that the call layer keeps and
 * pool/, net/ and streams/ read back: what a pool counts (per call and
 * status, latencies, sessions, streams), its engine gauges, the engine
 * pods its sessions name, the sessions that ended, why connections
 * closed. Types only; beneath rpc/dispatch.h and pool/server.h, which both
 * include it.
 */
#ifndef KVPD_POOL_TYPES_H
#define KVPD_POOL_TYPES_H

#include <stdbool.h>
#include <stdint.h>

#include "common/kvp_status.h"
#include "service/rpc/calls.h"

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
	bool warm;                                         /* restart=warm: the four below */
	uint64_t warm_kept, warm_dropped, warm_unproven, warm_proven; /* keep.h's stats */
	bool disk;                                         /* a disk tier: the six below */
	uint64_t disk_slots, disk_used, disk_writes, disk_write_skips, disk_fills,
		disk_fill_failures, disk_io_errors;        /* disk.h's stats */
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

/* Why the transport closed a connection (kvpool_connections_closed_total{reason}). */
enum kvpd_close_reason {
	KVPD_CLOSE_IDLE,         /* no request for --idle-timeout-ms */
	KVPD_CLOSE_NO_READ,      /* a reply not taken within --send-timeout-ms */
	KVPD_CLOSE_TLS,          /* a TLS handshake failed (counted from nng's listener stats) */
	KVPD_CLOSE_ADDRESS_BOUND, /* one unauthenticated address held its share of contexts */
	KVPD_CLOSE_UNAUTH_BOUND,  /* unauthenticated peers together held half the contexts */
	KVPD_CLOSE_REASONS
};

#endif /* KVPD_POOL_TYPES_H */
