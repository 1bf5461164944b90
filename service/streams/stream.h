/* SPDX-License-Identifier: Apache-2.0 */
/*
 * stream.h: a pool's event stream: it turns the engine's events after each
 * call into one EventBatch (epoch, consecutive seq, timestamp), keeps the
 * last N encoded batches for Replay, and hands each to the publisher.
 *
 * Internal to the daemon; every function runs under the pool's lock. The
 * publisher callback is the only I/O, and is set by main (nng PUB).
 */
#ifndef KVPD_STREAM_H
#define KVPD_STREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/events.h"
#include "proto/event_seal.h"
#include "service/streams/ring.h"

/*
 * A second consumer of every batch (the vLLM-wire publisher): called under
 * the pool's lock with the engine's events, after the native stream has
 * them, so both wires carry the same events in the same order.
 */
typedef void (*kvpd_events_fn)(void *ctx, const struct kvp_event_batch *b, uint64_t ts_unix_ns);

/* The vLLM-wire publisher's counters; written by its threads, read by /metrics. */
struct kvpd_vllm_counters {
	_Atomic uint64_t batches, bytes, replays, bad_replay_requests, send_failures, replays_cut,
		publisher_resets;
};

/* Sends one message: the pool's name, a 0 byte, then an encoded EventBatch. */
typedef void (*kvpd_publish_fn)(void *ctx, const char *pool, const uint8_t *batch, size_t len);

struct kvpd_stream {
	uint64_t epoch;           /* random, non-zero, chosen at pool start */
	uint64_t next_seq;        /* the seq of the next batch */
	struct kvpd_ring ring;     /* encoded EventBatches, for Replay */
	uint64_t batches, events, publish_failures;
	kvpd_publish_fn publish;
	void *publish_ctx;
	bool sealed;               /* a pool with a token: published batches are sealed */
	struct kvp_seal_key key;   /* sealed: the key, given in PoolInfo to token holders */
	uint64_t seal_counter;     /* sealed: the next nonce counter */
	kvpd_events_fn on_events;  /* NULL: no second wire */
	void *on_events_ctx;
	struct kvpd_vllm_counters vllm;
};

/*
 * sealed: the pool has a token, so its published batches and ticks are
 * sealed under a fresh key (proto/event_seal.h); the ring keeps them in
 * clear for Replay, which goes to sessions only. The ring holds at most
 * ring_cap batches and ring_bytes bytes (service/streams/ring.h). KVP_OK or
 * KVP_ENOMEM / KVP_EINVAL (a bound of 0) / KVP_EINTERNAL (no randomness for
 * the key).
 */
int kvpd_stream_init(struct kvpd_stream *s, uint32_t ring_cap, size_t ring_bytes, bool sealed);
void kvpd_stream_fini(struct kvpd_stream *s);

/*
 * Encodes the events in b (if any) as the next batch of pool `name`, keeps
 * it in the ring and publishes it. Returns KVP_OK, or KVP_ENOMEM (the batch
 * is then lost to replay but its seq is still used, so subscribers see the
 * gap and take a Snapshot).
 */
int kvpd_stream_emit(struct kvpd_stream *s, const char *name, const struct kvp_event_batch *b,
                     uint64_t ts_unix_ns);

/* Publishes a tick (no events, seq = next_seq, not stored). */
void kvpd_stream_tick(struct kvpd_stream *s, const char *name, uint64_t ts_unix_ns);

/* The ring's slot for seq, or NULL if it no longer (or never) held it. */
const struct kvpd_ring_slot *kvpd_stream_get(const struct kvpd_stream *s, uint64_t seq);
/* The oldest seq the ring still holds (== next_seq when it is empty). */
uint64_t kvpd_stream_oldest(const struct kvpd_stream *s);

#endif /* KVPD_STREAM_H */
