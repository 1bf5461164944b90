/* SPDX-License-Identifier: Apache-2.0 */
#include "service/rpc/envelope.h"

#include <string.h>

#include "common/kvp_status.h"

/* Request's field numbers (proto/kvpool.proto). */
enum { F_CALL_ID = 1, F_POOL = 2, F_SESSION_ID = 3, F_TOKEN = 4, F_FIRST_CALL = 10, F_LAST_CALL = 43,
       F_BATCH = 22, F_BATCH_CALLS = 1 };
enum { WT_VARINT = 0, WT_I64 = 1, WT_LEN = 2, WT_I32 = 5 };

/* One varint at *pos; advances it. 0, or -1 if malformed or cut short. */
static int
varint(const uint8_t *b, size_t n, size_t *pos, uint64_t *out)
{
	uint64_t v = 0;
	for (unsigned shift = 0; shift < 64; shift += 7) {
		if (*pos >= n)
			return -1;
		uint8_t byte = b[(*pos)++];
		v |= (uint64_t)(byte & 0x7f) << shift;
		if ((byte & 0x80) == 0) {
			*out = v;
			return 0;
		}
	}
	return -1; /* more than 10 bytes */
}

/*
 * The next field of a message: its number, wire type, value (varints) or
 * bytes (LEN). 1: a field, 0: the end, -1: malformed.
 */
static int
next_field(const uint8_t *b, size_t n, size_t *pos, uint32_t *field, unsigned *wt, uint64_t *v,
           const uint8_t **bytes)
{
	uint64_t tag, len;
	if (*pos == n)
		return 0;
	if (varint(b, n, pos, &tag) != 0 || (tag >> 3) == 0 || (tag >> 3) > 0x1fffffff)
		return -1;
	*field = (uint32_t)(tag >> 3);
	*wt = (unsigned)(tag & 7);
	switch (*wt) {
	case WT_VARINT:
		return varint(b, n, pos, v) == 0 ? 1 : -1;
	case WT_I64:
	case WT_I32:
		len = *wt == WT_I64 ? 8 : 4;
		break;
	case WT_LEN:
		if (varint(b, n, pos, &len) != 0)
			return -1;
		break;
	default:
		return -1; /* groups (3, 4) and the unused 6, 7 */
	}
	if (len > n - *pos)
		return -1;
	*bytes = b + *pos;
	*v = len;
	*pos += (size_t)len;
	return 1;
}

/* How many calls a BatchRequest body holds; -1 if malformed. */
static int
count_calls(const uint8_t *b, size_t n, size_t *calls)
{
	size_t pos = 0;
	uint32_t field;
	unsigned wt;
	uint64_t v;
	const uint8_t *bytes;
	int rv;
	while ((rv = next_field(b, n, &pos, &field, &wt, &v, &bytes)) == 1)
		if (field == F_BATCH_CALLS && wt == WT_LEN)
			(*calls)++;
	return rv;
}

int
kvpd_envelope_scan(const uint8_t *b, size_t n, struct kvpd_envelope *e)
{
	struct kvpd_envelope out;
	size_t pos = 0;
	uint32_t field;
	unsigned wt;
	uint64_t v = 0;
	const uint8_t *bytes = NULL;
	int rv;

	if ((b == NULL && n > 0) || e == NULL)
		return KVP_EINVAL;
	memset(&out, 0, sizeof(out));
	out.pool = (const uint8_t *)"";
	out.token = (const uint8_t *)"";
	while ((rv = next_field(b, n, &pos, &field, &wt, &v, &bytes)) == 1) {
		if (field == F_CALL_ID && wt == WT_VARINT) {
			out.call_id = v;
		} else if (field == F_SESSION_ID && wt == WT_VARINT) {
			out.session_id = v;
		} else if (field == F_POOL && wt == WT_LEN) {
			out.pool = bytes;
			out.pool_len = (size_t)v;
		} else if (field == F_TOKEN && wt == WT_LEN) {
			out.token = bytes;
			out.token_len = (size_t)v;
		} else if (field >= F_FIRST_CALL && field <= F_LAST_CALL && wt == WT_LEN) {
			out.call_case = field;
			/* A repeated message field merges: a Batch's calls add up. */
			if (field == F_BATCH && count_calls(bytes, (size_t)v, &out.batch_calls) != 0)
				return KVP_EINVAL;
		}
	}
	if (rv != 0)
		return KVP_EINVAL;
	*e = out;
	return KVP_OK;
}
