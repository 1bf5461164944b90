/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ring.h: the replay ring both event wires keep: encoded batches by seq,
 * bounded by count and by bytes. When either bound is passed the oldest
 * batches go first; the newest batch is always kept, whatever its size.
 *
 * Not locked: the caller holds whatever lock guards the wire's seq. Every
 * call is O(1) amortised (a put drops at most as many batches as were put).
 */
#ifndef KVPD_RING_H
#define KVPD_RING_H

#include <stddef.h>
#include <stdint.h>

struct kvpd_ring_slot {
	uint64_t seq;
	uint8_t *bytes;           /* NULL: empty */
	size_t len;
};

struct kvpd_ring {
	struct kvpd_ring_slot *slots;
	uint32_t cap;              /* most batches held */
	size_t max_bytes;          /* most bytes held (but the newest batch is always kept) */
	size_t bytes;              /* held now */
	uint64_t oldest;           /* no seq below this is held */
	uint64_t end;              /* one past the newest seq put */
	uint64_t dropped_for_bytes;/* batches dropped early to stay under max_bytes */
};

/* KVP_OK, KVP_EINVAL (cap or max_bytes 0), KVP_ENOMEM. */
int kvpd_ring_init(struct kvpd_ring *r, uint32_t cap, size_t max_bytes);
void kvpd_ring_fini(struct kvpd_ring *r);

/*
 * Keeps batch seq (seq >= every seq put before), taking ownership of bytes
 * (malloc'd; freed when the batch is dropped). bytes NULL records seq as
 * lost: Replay skips it and subscribers see the gap.
 */
void kvpd_ring_put(struct kvpd_ring *r, uint64_t seq, uint8_t *bytes, size_t len);

/* The batch with this seq, or NULL if the ring no longer (or never) held it. */
const struct kvpd_ring_slot *kvpd_ring_get(const struct kvpd_ring *r, uint64_t seq);

/* The oldest seq the ring may still hold (== end when it is empty). */
uint64_t kvpd_ring_oldest(const struct kvpd_ring *r);

#endif /* KVPD_RING_H */
