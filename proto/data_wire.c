/* SPDX-License-Identifier: Apache-2.0 */
#include "proto/data_wire.h"

#include "proto/pb_write.h"

/* Fields of kvpool.proto used here. */
enum {
	F_REPLY_CALL_ID = 1,
	F_REPLY_STATUS = 2,
	F_REPLY_READ_BLOCKS = 28,
	F_READ_PAYLOAD = 1,
	F_READ_CRC32C = 2,
};

uint64_t
kvp_wire_units_per_call(uint64_t max_msg, uint64_t max_ids, uint64_t unit)
{
	if (unit == 0 || max_msg <= KVP_WIRE_ENVELOPE)
		return 0;
	uint64_t k = (max_msg - KVP_WIRE_ENVELOPE) / unit;
	return max_ids && k > max_ids ? max_ids : k;
}

/* The read_blocks message's body: payload and checksums. */
static uint64_t
inner_len(uint64_t n, uint64_t bb)
{
	return kvp_pb_len_field(F_READ_PAYLOAD, n * bb) + kvp_pb_len_field(F_READ_CRC32C, 4 * n);
}

size_t
kvp_wire_read_reply_size(uint64_t call_id, uint64_t n, uint64_t bb)
{
	return (size_t)(kvp_pb_varint_field(F_REPLY_CALL_ID, call_id) +
	                kvp_pb_len_field(F_REPLY_READ_BLOCKS, inner_len(n, bb)));
}

uint8_t *
kvp_wire_read_reply_begin(uint8_t *buf, uint64_t call_id, uint64_t n, uint64_t bb,
                          uint8_t **payload)
{
	uint8_t *p = kvp_pb_put_varint_field(buf, F_REPLY_CALL_ID, call_id);
	p = kvp_pb_put_tag(p, F_REPLY_READ_BLOCKS, KVP_PB_LEN);
	p = kvp_pb_put_varint(p, inner_len(n, bb));
	p = kvp_pb_put_tag(p, F_READ_PAYLOAD, KVP_PB_LEN);
	p = kvp_pb_put_varint(p, n * bb);
	*payload = p;
	p += n * bb;
	p = kvp_pb_put_tag(p, F_READ_CRC32C, KVP_PB_LEN);
	return kvp_pb_put_varint(p, 4 * n);
}

/* Reads a varint at *p (< end); false if truncated or longer than 10 bytes. */
static bool
get_varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
	uint64_t x = 0;
	for (int shift = 0; shift < 70 && *p < end; shift += 7) {
		uint8_t b = *(*p)++;
		x |= (uint64_t)(b & 0x7f) << shift;
		if (!(b & 0x80)) {
			*v = x;
			return true;
		}
	}
	return false;
}

/* Skips a field of the given wire type; false if malformed. */
static bool
skip_field(const uint8_t **p, const uint8_t *end, unsigned wt)
{
	uint64_t v;
	switch (wt) {
	case 0:
		return get_varint(p, end, &v);
	case 1:
		return (size_t)(end - *p) >= 8 && (*p += 8, true);
	case 2:
		return get_varint(p, end, &v) && v <= (uint64_t)(end - *p) && (*p += v, true);
	case 5:
		return (size_t)(end - *p) >= 4 && (*p += 4, true);
	default:
		return false;
	}
}

/* Reads a length-delimited field's extent at *p; false if it overruns end. */
static bool
get_bytes(const uint8_t **p, const uint8_t *end, const uint8_t **at, uint64_t *len)
{
	if (!get_varint(p, end, len) || *len > (uint64_t)(end - *p))
		return false;
	*at = *p;
	*p += *len;
	return true;
}

/* The read_blocks message: payload and packed checksums; false for anything else. */
static bool
parse_inner(const uint8_t *q, const uint8_t *end, const uint8_t **payload, uint64_t *plen,
            const uint8_t **crcs, uint64_t *clen)
{
	uint64_t tag;
	*plen = *clen = 0;
	*payload = *crcs = q;
	while (q < end) {
		if (!get_varint(&q, end, &tag))
			return false;
		if (tag == ((uint64_t)F_READ_PAYLOAD << 3 | KVP_PB_LEN)) {
			if (!get_bytes(&q, end, payload, plen))
				return false;
		} else if (tag == ((uint64_t)F_READ_CRC32C << 3 | KVP_PB_LEN)) {
			if (!get_bytes(&q, end, crcs, clen) || *clen % 4 != 0)
				return false;
		} else if ((tag >> 3) == F_READ_CRC32C || !skip_field(&q, end, (unsigned)(tag & 7))) {
			return false; /* unpacked checksums and the like: the slow path */
		}
	}
	return true;
}

bool
kvp_wire_read_reply_parse(const uint8_t *b, size_t len, uint64_t call_id,
                          const uint8_t **payload, uint64_t *plen, const uint8_t **crcs,
                          uint64_t *clen)
{
	const uint8_t *p = b, *end = b + len, *q;
	bool found = false;
	uint64_t tag, v;

	if (b == NULL || payload == NULL || plen == NULL || crcs == NULL || clen == NULL)
		return false;
	while (p < end) {
		if (!get_varint(&p, end, &tag))
			return false;
		unsigned field = (unsigned)(tag >> 3), wt = (unsigned)(tag & 7);
		if (field == F_REPLY_CALL_ID && wt == KVP_PB_VARINT) {
			if (!get_varint(&p, end, &v) || (v != call_id && v != 0))
				return false;
		} else if (field == F_REPLY_STATUS && wt == KVP_PB_VARINT) {
			if (!get_varint(&p, end, &v) || v != 0)
				return false; /* an error status */
		} else if (field == F_REPLY_READ_BLOCKS && wt == KVP_PB_LEN) {
			if (!get_bytes(&p, end, &q, &v) ||
			    !parse_inner(q, q + v, payload, plen, crcs, clen))
				return false;
			found = true;
		} else if (!skip_field(&p, end, wt)) {
			return false;
		}
	}
	return found;
}
