/* SPDX-License-Identifier: Apache-2.0 */
/*
 * subscriber.h: follow a pool's event stream and never silently diverge.
 *
 * A subscriber receives one or more pools' EventBatch messages from the
 * daemon's PUB socket and hands each pool's to the caller in seq order,
 * exactly once each. It
 * detects what PUB/SUB cannot report: a gap in seq (a dropped message) is
 * filled with Replay; when the batches are gone from the replay ring, or the
 * epoch changes (the daemon restarted), it takes a Snapshot and reports a
 * reset, after which batches continue from the snapshot's seq. The caller's
 * view is therefore always the pool's state as of the last batch delivered.
 *
 * Not thread-safe: one thread polls a subscriber. Never prints.
 */
#ifndef KVPOOL_SUBSCRIBER_H
#define KVPOOL_SUBSCRIBER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/events.h"
#include "clients/c/kvpool.h"

struct kvp_sub_options {
	const char *events_url;     /* the daemon's --events endpoint */
	const char *rpc_url;        /* its RPC endpoint, for Replay and Snapshot */
	const char *pool;           /* one pool (NULL: "default"), unless pools is set */
	const char *const *pools;   /* several pools on one socket */
	size_t num_pools;
	const char *token;
	uint32_t timeout_ms;        /* RPC, per attempt; 0: 5000 */
	int recv_buffer;            /* SUB queue in messages; 0: 8192 */
	const char *tls_ca_file, *tls_cert_file, *tls_key_file, *tls_server_name;
	uint32_t connect_timeout_ms; /* how long kvp_sub_open waits for the daemon's RPC;
	                              * 0: as kvp_client_options' (timeout x attempts) */
	bool tls_insecure;          /* as kvp_client_options' */
};

struct kvp_sub_handler {
	void *ctx;
	/*
	 * Start over from an exact state: every cached (hash, group) and how
	 * many blocks hold it. Called at open, after an epoch change, and when a
	 * gap could not be replayed. Batches from next_seq on follow.
	 */
	void (*reset)(void *ctx, const char *pool, uint64_t epoch, uint64_t next_seq,
	              const struct kvp_snapshot_entry *entries, size_t n);
	/* One batch of one pool, in that pool's seq order, none missing, none twice. */
	void (*batch)(void *ctx, const char *pool, uint64_t epoch, uint64_t seq,
	              uint64_t ts_unix_ns, const struct kvp_event_batch *events);
};

struct kvp_sub_stats {
	uint64_t epoch;
	uint64_t next_seq;          /* the next batch the caller will see */
	uint64_t batches;           /* delivered */
	uint64_t gaps;              /* gaps seen in seq */
	uint64_t replayed;          /* batches delivered from Replay */
	uint64_t resets;            /* snapshots taken (the first one included) */
	uint64_t lag;               /* newest seq seen on the stream - next_seq + 1, 0 if caught up */
};

struct kvp_sub;

/*
 * Subscribes to each pool, then takes each pool's Snapshot and calls reset.
 * KVP_EINVAL, KVP_EINTERNAL (transport), or any status of the RPC client's
 * open and Snapshot (a session per pool, for Replay and Snapshot).
 */
int kvp_sub_open(const struct kvp_sub_options *o, const struct kvp_sub_handler *h,
                 struct kvp_sub **out);

/*
 * Waits up to timeout_ms for the stream, then delivers everything queued,
 * repairing gaps as it goes. KVP_OK (something or nothing delivered), or
 * the status of a repair that failed (the subscriber stays usable: the next
 * poll tries again).
 */
int kvp_sub_poll(struct kvp_sub *s, uint32_t timeout_ms);

/*
 * A file descriptor that polls readable while stream messages wait (for an
 * event loop: wait on it, then kvp_sub_poll(s, 0)). Owned by the subscriber,
 * valid until kvp_sub_close; never read or close it. KVP_OK, KVP_EINVAL, or
 * KVP_EINTERNAL if the transport gives none.
 */
int kvp_sub_fd(struct kvp_sub *s, int *fd);

/* A pool's counters (pool NULL: the first pool). KVP_ENOTFOUND if not followed. */
int kvp_sub_get_stats(const struct kvp_sub *s, const char *pool, struct kvp_sub_stats *out);
const char *kvp_sub_last_detail(const struct kvp_sub *s);
/* NULL: no-op. Waits for nng at most about a second (see kvp_client_close). */
void kvp_sub_close(struct kvp_sub *s);

/*
 * Decodes one encoded EventBatch into out (its previous events dropped).
 * KVP_EINVAL if the bytes are not a batch.
 */
int kvp_event_batch_decode(const uint8_t *bytes, size_t len, uint64_t *epoch, uint64_t *seq,
                           uint64_t *ts_unix_ns, struct kvp_event_batch *out);

#endif /* KVPOOL_SUBSCRIBER_H */
