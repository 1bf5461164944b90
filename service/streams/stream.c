/* SPDX-License-Identifier: Apache-2.0 */
#include "service/streams/stream.h"

#include <nng/nng.h>
#include <nng/supplemental/util/platform.h>
#include <stdlib.h>
#include <string.h>

#include "common/kvp_status.h"
#include "proto/event_wire.h"

int
kvpd_stream_init(struct kvpd_stream *s, uint32_t ring_cap, size_t ring_bytes, bool sealed)
{
	int rv;

	memset(s, 0, sizeof(*s));
	if (ring_cap == 0 || ring_bytes == 0)
		return KVP_EINVAL;
	if (sealed && kvp_seal_key_new(&s->key) != KVP_OK)
		return KVP_EINTERNAL;
	s->sealed = sealed;
	if ((rv = kvpd_ring_init(&s->ring, ring_cap, ring_bytes)) != KVP_OK)
		return rv;
	do {
		s->epoch = (uint64_t)nng_random() << 32 | nng_random();
	} while (s->epoch == 0);
	return KVP_OK;
}

void
kvpd_stream_fini(struct kvpd_stream *s)
{
	kvpd_ring_fini(&s->ring);
	memset(s, 0, sizeof(*s)); /* the key too */
}

uint64_t
kvpd_stream_oldest(const struct kvpd_stream *s)
{
	return kvpd_ring_oldest(&s->ring);
}

const struct kvpd_ring_slot *
kvpd_stream_get(const struct kvpd_stream *s, uint64_t seq)
{
	return kvpd_ring_get(&s->ring, seq);
}

/* Hands one encoded batch (or tick) to the publisher, sealed if the pool has a token. */
static void
publish(struct kvpd_stream *s, const char *name, const uint8_t *bytes, size_t len)
{
	uint8_t *sealed;
	size_t slen;

	if (!s->sealed) {
		s->publish(s->publish_ctx, name, bytes, len);
		return;
	}
	if (kvp_seal_batch(&s->key, s->seal_counter++, name, bytes, len, &sealed, &slen) != KVP_OK) {
		s->publish_failures++; /* subscribers see the seq gap and repair it */
		return;
	}
	s->publish(s->publish_ctx, name, sealed, slen);
	free(sealed);
}

int
kvpd_stream_emit(struct kvpd_stream *s, const char *name, const struct kvp_event_batch *eb,
                 uint64_t ts_unix_ns)
{
	size_t n = kvp_event_batch_count(eb), len;
	struct kvp_wire_batch_hdr h = {.epoch = s->epoch, .ts_unix_ns = ts_unix_ns};
	uint8_t *bytes;
	int rv;

	if (n == 0)
		return KVP_OK;
	h.seq = s->next_seq++; /* used even if encoding fails: subscribers see the gap */
	s->batches++;
	s->events += n;
	if ((rv = kvp_wire_events_encode(name, &h, eb, &bytes, &len)) != KVP_OK) {
		kvpd_ring_put(&s->ring, h.seq, NULL, 0);
		return rv;
	}
	kvpd_ring_put(&s->ring, h.seq, bytes, len); /* the ring owns bytes, and keeps this one */
	if (s->publish)
		publish(s, name, bytes, len);
	return KVP_OK;
}

void
kvpd_stream_tick(struct kvpd_stream *s, const char *name, uint64_t ts_unix_ns)
{
	struct kvp_wire_batch_hdr h = {
		.epoch = s->epoch, .seq = s->next_seq, .ts_unix_ns = ts_unix_ns, .tick = true};
	uint8_t *bytes;
	size_t len;

	if (s->publish == NULL || kvp_wire_events_encode(name, &h, NULL, &bytes, &len) != KVP_OK)
		return;
	publish(s, name, bytes, len);
	free(bytes);
}
