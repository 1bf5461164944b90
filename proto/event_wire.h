/* SPDX-License-Identifier: Apache-2.0 */
/*
 * event_wire.h: the native event stream's bytes, both directions, written
 * once: the daemon encodes each of a pool's event batches (and ticks) with
 * these functions and the subscriber decodes them with the same file, so an
 * EventBatch field cannot reach one end and not the other. The encoder
 * writes protobuf's bytes by hand; tests/test_wire.c holds them to
 * protobuf-c's and round-trips every event kind through both.
 *
 * Pure apart from malloc; no I/O, no state; thread-safe.
 */
#ifndef KVP_EVENT_WIRE_H
#define KVP_EVENT_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/events.h"

/* An EventBatch's header. */
struct kvp_wire_batch_hdr {
	uint64_t epoch;       /* the stream's epoch (random per daemon start and pool) */
	uint64_t seq;         /* the batch's seq; a tick's: the next batch's */
	uint64_t ts_unix_ns;
	bool tick;            /* no events: tells a subscriber the newest seq */
};

/* Pool names longer than this are refused by the encoders (the wire's name limit). */
#define KVP_WIRE_EVENTS_MAX_POOL 128u

/*
 * Encodes the events of eb (eb NULL or h->tick: none) as one EventBatch of
 * `pool` with header h. On KVP_OK *out is a malloc'd buffer of *len bytes
 * that the caller frees. KVP_EINVAL (NULL argument, pool name too long),
 * KVP_ENOMEM; nothing is allocated on error.
 */
int kvp_wire_events_encode(const char *pool, const struct kvp_wire_batch_hdr *h,
                           const struct kvp_event_batch *eb, uint8_t **out, size_t *len);

/*
 * Decodes one EventBatch into *h and out (cleared first; its storage grows
 * as needed). Spec kinds are interned: events point at static names, never
 * into bytes. KVP_EINVAL for bytes that are not an EventBatch or an event
 * whose hashes are inconsistent (out then holds the events before it),
 * KVP_EUNAUTH for a sealed batch (a pool with a token: proto/event_seal.h
 * opens it; *h then holds no epoch or seq), KVP_ENOMEM.
 */
int kvp_wire_events_decode(const uint8_t *bytes, size_t len, struct kvp_wire_batch_hdr *h,
                           struct kvp_event_batch *out);

/*
 * vLLM's KVCacheSpecKind name equal to k, as a static string (events keep
 * it without owning it); "unknown" for a name vLLM does not define; NULL for
 * NULL or "".
 */
const char *kvp_wire_spec_kind(const char *k);

#endif /* KVP_EVENT_WIRE_H */
