/* SPDX-License-Identifier: Apache-2.0 */
/* pb_read.c: protobuf-c's structs decoded by hand (pb_read.h). */
#include "proto/pb_read.h"

#include <stdbool.h>
#include <string.h>

enum { WT_VARINT = 0, WT_I64 = 1, WT_LEN = 2, WT_I32 = 5 };

/*
 * A varint at *p (before end); advances *p. false if cut short or over 10
 * bytes. Bits past 64 are dropped, as protobuf-c drops them.
 */
static inline bool
varint(const uint8_t **p, const uint8_t *end, uint64_t *out)
{
	const uint8_t *q = *p;
	uint64_t v, b;
	if (q < end && *q < 0x80) { /* the common case: one byte */
		*out = *q;
		*p = q + 1;
		return true;
	}
	if (end - q >= 10) { /* room for the longest: no bounds checks */
		/* Two and three bytes (block ids, token ids) unrolled. */
		v = (uint64_t)(q[0] & 0x7f) | (uint64_t)(q[1] & 0x7f) << 7;
		if (q[1] < 0x80) {
			*out = v;
			*p = q + 2;
			return true;
		}
		v |= (uint64_t)(q[2] & 0x7f) << 14;
		if (q[2] < 0x80) {
			*out = v;
			*p = q + 3;
			return true;
		}
		q += 3;
		for (unsigned shift = 21; shift <= 63; shift += 7) {
			b = *q++;
			v |= (b & 0x7f) << shift;
			if (b < 0x80) {
				*out = v;
				*p = q;
				return true;
			}
		}
		return false;
	}
	v = 0;
	for (unsigned shift = 0; shift <= 63 && q < end; shift += 7) {
		b = *q++;
		v |= (b & 0x7f) << shift;
		if (b < 0x80) {
			*out = v;
			*p = q;
			return true;
		}
	}
	return false;
}

/* A field's tag and payload: its value (varint) or bytes (LEN). */
struct field {
	uint32_t number, wt;
	uint64_t v;
	const uint8_t *bytes;
	size_t len;
};

/* The next field at *p; false if malformed or of a wire type we never accept. */
static bool
next_field(const uint8_t **p, const uint8_t *end, struct field *f)
{
	uint64_t tag;
	if (!varint(p, end, &tag) || (tag >> 3) == 0 || (tag >> 3) > 536870911u)
		return false;
	f->number = (uint32_t)(tag >> 3);
	f->wt = (uint32_t)(tag & 7);
	if (f->wt == WT_VARINT)
		return varint(p, end, &f->v);
	if (f->wt != WT_LEN)
		return false; /* fixed-width and group fields: not ours */
	uint64_t len;
	if (!varint(p, end, &len) || len > (uint64_t)(end - *p))
		return false;
	f->bytes = *p;
	f->len = (size_t)len;
	*p += len;
	return true;
}

static bool
varint_type(ProtobufCType t)
{
	return t == PROTOBUF_C_TYPE_INT32 || t == PROTOBUF_C_TYPE_UINT32 ||
	       t == PROTOBUF_C_TYPE_INT64 || t == PROTOBUF_C_TYPE_UINT64 ||
	       t == PROTOBUF_C_TYPE_BOOL || t == PROTOBUF_C_TYPE_ENUM;
}

static size_t
elem_size(ProtobufCType t)
{
	switch (t) {
	case PROTOBUF_C_TYPE_INT64:
	case PROTOBUF_C_TYPE_UINT64:
		return sizeof(uint64_t);
	case PROTOBUF_C_TYPE_STRING:
		return sizeof(char *);
	case PROTOBUF_C_TYPE_BYTES:
		return sizeof(ProtobufCBinaryData);
	case PROTOBUF_C_TYPE_MESSAGE:
		return sizeof(ProtobufCMessage *);
	default: /* int32, uint32, enum, bool (protobuf_c_boolean is an int) */
		return sizeof(uint32_t);
	}
}

/* A varint scalar stored at dst as protobuf-c stores type t. */
static void
store_scalar(void *dst, ProtobufCType t, uint64_t v)
{
	switch (t) {
	case PROTOBUF_C_TYPE_INT64:
	case PROTOBUF_C_TYPE_UINT64:
		memcpy(dst, &v, sizeof(v));
		break;
	case PROTOBUF_C_TYPE_BOOL: {
		protobuf_c_boolean b = v != 0;
		memcpy(dst, &b, sizeof(b));
		break;
	}
	default: { /* int32, uint32, enum: the low 32 bits */
		uint32_t w = (uint32_t)v;
		memcpy(dst, &w, sizeof(w));
	}
	}
}

/* The field descriptor for number, or NULL (unknown, or a kind we decline). */
static inline const ProtobufCFieldDescriptor *
field_of(const ProtobufCMessageDescriptor *d, uint32_t number)
{
	/* field_ranges: runs of consecutive numbers, and a sentinel giving the last run's end. */
	const ProtobufCIntRange *r = d->field_ranges;
	const ProtobufCFieldDescriptor *f = NULL;
	for (unsigned i = 0; i < d->n_field_ranges; i++) {
		uint32_t start = (uint32_t)r[i].start_value;
		uint32_t run = (uint32_t)(r[i + 1].orig_index - r[i].orig_index);
		if (number >= start && number - start < run) {
			f = &d->fields[(uint32_t)r[i].orig_index + (number - start)];
			break;
		}
	}
	if (f == NULL || f->label == PROTOBUF_C_LABEL_REQUIRED)
		return NULL;
	if (f->type == PROTOBUF_C_TYPE_FIXED32) /* packed and repeated only */
		return f->label == PROTOBUF_C_LABEL_REPEATED ? f : NULL;
	if (!varint_type(f->type) && f->type != PROTOBUF_C_TYPE_STRING &&
	    f->type != PROTOBUF_C_TYPE_BYTES && f->type != PROTOBUF_C_TYPE_MESSAGE)
		return NULL;
	return f;
}

/* Varints in a packed payload, or -1 if it ends inside one. */
static long
packed_count(const uint8_t *b, size_t len)
{
	size_t n = 0, i = 0;
	for (; i + 8 <= len; i += 8) { /* a varint ends at each byte below 0x80 */
		uint64_t w;
		memcpy(&w, b + i, sizeof(w));
		/* the high bits' count, summed by a multiply (no popcount before SSE4.2) */
		n += 8 - (size_t)((((w & 0x8080808080808080ull) >> 7) * 0x0101010101010101ull) >> 56);
	}
	for (; i < len; i++)
		n += b[i] < 0x80;
	return len == 0 || b[len - 1] < 0x80 ? (long)n : -1;
}

static void *
alloc(ProtobufCAllocator *al, size_t n)
{
	return al->alloc(al->allocator_data, n ? n : 1);
}

/* n packed varints into arr as protobuf-c stores type t; false if one is malformed. */
static bool
read_packed(const uint8_t *q, const uint8_t *end, ProtobufCType t, void *arr, size_t n)
{
	uint64_t v;
	if (t == PROTOBUF_C_TYPE_INT64 || t == PROTOBUF_C_TYPE_UINT64) {
		uint64_t *a = arr;
		for (size_t k = 0; k < n; k++) {
			if (!varint(&q, end, &v))
				return false;
			a[k] = v;
		}
	} else if (t == PROTOBUF_C_TYPE_BOOL) {
		protobuf_c_boolean *a = arr;
		for (size_t k = 0; k < n; k++) {
			if (!varint(&q, end, &v))
				return false;
			a[k] = v != 0;
		}
	} else { /* int32, uint32, enum: the low 32 bits */
		uint32_t *a = arr;
		for (size_t k = 0; k < n; k++) {
			if (!varint(&q, end, &v))
				return false;
			a[k] = (uint32_t)v;
		}
	}
	return q == end;
}

static ProtobufCMessage *read_msg(const ProtobufCMessageDescriptor *d, ProtobufCAllocator *al,
                                  const uint8_t *data, size_t len, int depth);

/* One element of a length-delimited field (string, bytes, message) into dst. */
static bool
read_len(const ProtobufCFieldDescriptor *fd, ProtobufCAllocator *al, const struct field *f,
         void *dst, int depth)
{
	switch (fd->type) {
	case PROTOBUF_C_TYPE_STRING: {
		char *s = alloc(al, f->len + 1);
		if (s == NULL)
			return false;
		memcpy(s, f->bytes, f->len);
		s[f->len] = '\0';
		memcpy(dst, &s, sizeof(s));
		return true;
	}
	case PROTOBUF_C_TYPE_BYTES: {
		ProtobufCBinaryData b = {.len = f->len, .data = f->len ? (uint8_t *)f->bytes : NULL};
		memcpy(dst, &b, sizeof(b));
		return true;
	}
	default: { /* a message */
		ProtobufCMessage *m = read_msg(fd->descriptor, al, f->bytes, f->len, depth + 1);
		memcpy(dst, &m, sizeof(m));
		return m != NULL;
	}
	}
}

/* Occurrences of field number from p on, each length-delimited; -1 if not. */
static long
count_occurrences(const uint8_t *p, const uint8_t *end, uint32_t number)
{
	struct field f;
	long n = 0;
	while (p < end) {
		if (!next_field(&p, end, &f))
			return -1;
		if (f.number == number) {
			if (f.wt != WT_LEN)
				return -1;
			n++;
		}
	}
	return n;
}

/*
 * A repeated field's next element. Packed scalars come in one piece (a
 * second occurrence, or an unpacked element, is declined: appending would
 * copy). String, bytes and message elements each come as an occurrence:
 * the first counts the rest, so the array is allocated once.
 */
static bool
read_repeated(const ProtobufCFieldDescriptor *fd, ProtobufCAllocator *al, const struct field *f,
              char *m, const uint8_t *rest, const uint8_t *end, int depth)
{
	char *arr;
	size_t n, es = elem_size(fd->type);
	memcpy(&arr, m + fd->offset, sizeof(arr));
	memcpy(&n, m + fd->quantifier_offset, sizeof(n));
	if (fd->type == PROTOBUF_C_TYPE_FIXED32) { /* one packed piece: a copy (little-endian) */
		if (arr != NULL || f->wt != WT_LEN || f->len % 4 != 0)
			return false;
		if (f->len == 0)
			return true;
		if ((arr = alloc(al, f->len)) == NULL)
			return false;
		n = f->len / 4;
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
		memcpy(arr, f->bytes, f->len);
#else
		for (size_t k = 0; k < n; k++) {
			const uint8_t *b = f->bytes + 4 * k;
			uint32_t v = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
			             (uint32_t)b[3] << 24;
			memcpy(arr + 4 * k, &v, 4);
		}
#endif
	} else if (varint_type(fd->type)) {
		long count;
		if (arr != NULL || f->wt != WT_LEN || (count = packed_count(f->bytes, f->len)) < 0)
			return false;
		if (count == 0)
			return true; /* an empty piece: nothing, as protobuf-c has it */
		if ((arr = alloc(al, (size_t)count * es)) == NULL ||
		    !read_packed(f->bytes, f->bytes + f->len, fd->type, arr, (size_t)count))
			return false;
		n = (size_t)count;
	} else {
		if (f->wt != WT_LEN)
			return false;
		if (arr == NULL) {
			long more = count_occurrences(rest, end, fd->id);
			if (more < 0 || (arr = alloc(al, ((size_t)more + 1) * es)) == NULL)
				return false;
		}
		if (!read_len(fd, al, f, arr + es * n, depth))
			return false;
		n++;
	}
	memcpy(m + fd->offset, &arr, sizeof(arr));
	memcpy(m + fd->quantifier_offset, &n, sizeof(n));
	return true;
}

static ProtobufCMessage *
read_msg(const ProtobufCMessageDescriptor *d, ProtobufCAllocator *al, const uint8_t *data,
         size_t len, int depth)
{
	const uint8_t *p = data, *end = data + len;
	struct field f;

	if (depth > KVP_PB_READ_DEPTH || d->magic != PROTOBUF_C__MESSAGE_DESCRIPTOR_MAGIC)
		return NULL;
	ProtobufCMessage *m = alloc(al, d->sizeof_message);
	if (m == NULL)
		return NULL;
	protobuf_c_message_init(d, m);
	while (p < end) {
		if (!next_field(&p, end, &f))
			return NULL;
		const ProtobufCFieldDescriptor *fd = field_of(d, f.number);
		if (fd == NULL)
			return NULL;
		char *at = (char *)m + fd->offset;
		if (fd->label == PROTOBUF_C_LABEL_REPEATED) {
			if (!read_repeated(fd, al, &f, (char *)m, p, end, depth))
				return NULL;
			continue;
		}
		if (varint_type(fd->type) != (f.wt == WT_VARINT))
			return NULL; /* a wire type that does not fit the field */
		if (fd->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
			uint32_t *which = (uint32_t *)((char *)m + fd->quantifier_offset);
			if (*which != 0)
				return NULL; /* a oneof set twice: protobuf-c's rules */
			*which = fd->id;
		} else if (fd->label == PROTOBUF_C_LABEL_OPTIONAL && fd->type != PROTOBUF_C_TYPE_MESSAGE &&
		           fd->type != PROTOBUF_C_TYPE_STRING) {
			*(protobuf_c_boolean *)((char *)m + fd->quantifier_offset) = 1;
		}
		if (fd->type == PROTOBUF_C_TYPE_MESSAGE) {
			void *prev;
			memcpy(&prev, at, sizeof(prev));
			if (prev != NULL)
				return NULL; /* given twice: protobuf-c merges */
		}
		if (f.wt == WT_VARINT)
			store_scalar(at, fd->type, f.v);
		else if (!read_len(fd, al, &f, at, depth))
			return NULL;
	}
	return m;
}

ProtobufCMessage *
kvp_pb_read(const ProtobufCMessageDescriptor *desc, ProtobufCAllocator *al, const uint8_t *data,
            size_t len)
{
	if (desc == NULL || al == NULL || (data == NULL && len > 0))
		return NULL;
	return read_msg(desc, al, data, len, 0);
}
