/* SPDX-License-Identifier: Apache-2.0 */
/*
 * envelope.h: a request's envelope (call id, pool, session, which call)
 * read straight from its protobuf bytes, without decoding the call.
 *
 * The daemon checks the pool and the session before it decodes a body, so
 * a peer with no session cannot make it decode (and allocate for) a
 * megabyte-sized Batch; and it counts a Batch's calls the same way, so an
 * over-long one is refused before any of its calls is built.
 *
 * Pure functions over bytes; never allocate, never print.
 */
#ifndef KVPD_ENVELOPE_H
#define KVPD_ENVELOPE_H

#include <stddef.h>
#include <stdint.h>

struct kvpd_envelope {
	uint64_t call_id, session_id;
	const uint8_t *pool; /* not NUL-terminated; may hold a NUL (refused by the caller) */
	size_t pool_len;
	const uint8_t *token; /* the call's token bytes (may be empty) */
	size_t token_len;
	uint32_t call_case;  /* the call's field number (Request's oneof); 0: none */
	size_t batch_calls;  /* for a Batch: its calls, over every occurrence */
};

/*
 * Reads a kvpool.v1.Request's top-level fields, the last occurrence of each
 * winning as in protobuf. KVP_OK, or KVP_EINVAL where the bytes are not a
 * well-formed message (a bad varint, a length past the end, a group or an
 * unknown wire type, field number 0).
 */
int kvpd_envelope_scan(const uint8_t *b, size_t n, struct kvpd_envelope *e);

#endif /* KVPD_ENVELOPE_H */
