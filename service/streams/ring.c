/* SPDX-License-Identifier: Apache-2.0 */
#include "service/streams/ring.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/kvp_status.h"

int
kvpd_ring_init(struct kvpd_ring *r, uint32_t cap, size_t max_bytes)
{
	memset(r, 0, sizeof(*r));
	if (cap == 0 || max_bytes == 0)
		return KVP_EINVAL;
	if ((r->slots = calloc(cap, sizeof(*r->slots))) == NULL)
		return KVP_ENOMEM;
	r->cap = cap;
	r->max_bytes = max_bytes;
	return KVP_OK;
}

void
kvpd_ring_fini(struct kvpd_ring *r)
{
	if (r->slots != NULL)
		for (uint32_t i = 0; i < r->cap; i++)
			free(r->slots[i].bytes);
	free(r->slots);
	memset(r, 0, sizeof(*r));
}

/*
 * Frees the slot of seq if it holds that batch or an older one (one left
 * behind by a jump in seq). Returns whether it freed anything.
 */
static bool
drop(struct kvpd_ring *r, uint64_t seq)
{
	struct kvpd_ring_slot *s = &r->slots[seq % r->cap];

	if (s->bytes == NULL || s->seq > seq)
		return false;
	r->bytes -= s->len;
	free(s->bytes);
	s->bytes = NULL;
	s->len = 0;
	return true;
}

void
kvpd_ring_put(struct kvpd_ring *r, uint64_t seq, uint8_t *bytes, size_t len)
{
	/* By count: everything below seq + 1 - cap goes (at most cap slots to look at). */
	if (seq + 1 > r->cap && r->oldest < seq + 1 - r->cap) {
		uint64_t to = seq + 1 - r->cap;
		if (to - r->oldest > r->cap)
			r->oldest = to - r->cap;
		while (r->oldest < to)
			drop(r, r->oldest++);
	}
	struct kvpd_ring_slot *s = &r->slots[seq % r->cap];
	drop(r, seq); /* holds a batch only after a jump in seq */
	s->seq = seq;
	s->bytes = bytes;
	s->len = bytes != NULL ? len : 0;
	r->bytes += s->len;
	r->end = seq + 1;
	/* By bytes: the oldest go first, the newest stays. */
	while (r->bytes > r->max_bytes && r->oldest < seq)
		if (drop(r, r->oldest++))
			r->dropped_for_bytes++;
}

const struct kvpd_ring_slot *
kvpd_ring_get(const struct kvpd_ring *r, uint64_t seq)
{
	if (seq < r->oldest || seq >= r->end)
		return NULL;
	const struct kvpd_ring_slot *s = &r->slots[seq % r->cap];
	return s->bytes != NULL && s->seq == seq ? s : NULL;
}

uint64_t
kvpd_ring_oldest(const struct kvpd_ring *r)
{
	return r->oldest;
}
