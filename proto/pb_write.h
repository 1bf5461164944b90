/* SPDX-License-Identifier: Apache-2.0 */
/*
 * pb_write.h: the few protobuf wire primitives kvpool writes by hand where
 * protobuf-c's descriptor-driven packer is too slow (replies, Batch
 * requests and event batches on the hot path). Every user is held to protobuf-c's own bytes by a test.
 */
#ifndef KVP_PB_WRITE_H
#define KVP_PB_WRITE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Wire types. */
#define KVP_PB_VARINT 0u
#define KVP_PB_LEN 2u

/* Bytes of v as a varint: its significant bits, 7 to a byte (bits * 9 / 64, rounded up). */
static inline size_t
kvp_pb_varint_len(uint64_t v)
{
	unsigned bits = 64u - (unsigned)__builtin_clzll(v | 1);
	return (bits * 9u + 64u) / 64u;
}

/* Bytes of a 32-bit value as a varint (the same count, in 32 bits). */
static inline size_t
kvp_pb_varint32_len(uint32_t v)
{
	unsigned bits = 32u - (unsigned)__builtin_clz(v | 1);
	return (bits * 9u + 64u) / 64u;
}

/* v as a varint at p; the end. One to three bytes (ids, counts, tokens) without a loop. */
static inline uint8_t *
kvp_pb_put_varint(uint8_t *p, uint64_t v)
{
	if (v < 1u << 7) {
		p[0] = (uint8_t)v;
		return p + 1;
	}
	if (v < 1u << 14) {
		p[0] = (uint8_t)(v | 0x80);
		p[1] = (uint8_t)(v >> 7);
		return p + 2;
	}
	if (v < 1u << 21) {
		p[0] = (uint8_t)(v | 0x80);
		p[1] = (uint8_t)(v >> 7 | 0x80);
		p[2] = (uint8_t)(v >> 14);
		return p + 3;
	}
	while (v >= 0x80) {
		*p++ = (uint8_t)(v | 0x80);
		v >>= 7;
	}
	*p++ = (uint8_t)v;
	return p;
}

/* An int32 field's varint: negative values take 10 bytes, sign-extended. */
static inline uint64_t
kvp_pb_int32(int32_t v)
{
	return (uint64_t)(int64_t)v;
}

static inline size_t
kvp_pb_tag_len(uint32_t field)
{
	return kvp_pb_varint_len((uint64_t)field << 3);
}

static inline uint8_t *
kvp_pb_put_tag(uint8_t *p, uint32_t field, uint32_t wire_type)
{
	return kvp_pb_put_varint(p, (uint64_t)field << 3 | wire_type);
}

/* A length-delimited field of len bytes, tag and length included. */
static inline size_t
kvp_pb_len_field(uint32_t field, size_t len)
{
	return kvp_pb_tag_len(field) + kvp_pb_varint_len(len) + len;
}

/* A proto3 scalar varint field: absent when 0. */
static inline size_t
kvp_pb_varint_field(uint32_t field, uint64_t v)
{
	return v ? kvp_pb_tag_len(field) + kvp_pb_varint_len(v) : 0;
}

static inline uint8_t *
kvp_pb_put_varint_field(uint8_t *p, uint32_t field, uint64_t v)
{
	if (v == 0)
		return p;
	p = kvp_pb_put_tag(p, field, KVP_PB_VARINT);
	return kvp_pb_put_varint(p, v);
}

/* ---- packed repeated fields: payload lengths, then bytes (absent when empty) ---- */

static inline size_t
kvp_pb_i32s_len(const int32_t *v, size_t n)
{
	size_t len = 0;
	for (size_t i = 0; i < n; i++) /* a negative int32 takes 10 bytes, sign-extended */
		len += kvp_pb_varint_len(kvp_pb_int32(v[i]));
	return len;
}

static inline size_t
kvp_pb_u32s_len(const uint32_t *v, size_t n)
{
	size_t len = 0;
	for (size_t i = 0; i < n; i++)
		len += kvp_pb_varint32_len(v[i]);
	return len;
}

static inline size_t
kvp_pb_u64s_len(const uint64_t *v, size_t n)
{
	size_t len = 0;
	for (size_t i = 0; i < n; i++)
		len += kvp_pb_varint_len(v[i]);
	return len;
}

/* A packed field of n elements, payload bytes: absent when empty. */
static inline size_t
kvp_pb_packed_len(uint32_t field, size_t payload, size_t n)
{
	return n ? kvp_pb_len_field(field, payload) : 0;
}

/* A length-delimited field's tag and length. */
static inline uint8_t *
kvp_pb_put_len_head(uint8_t *p, uint32_t field, size_t len)
{
	p = kvp_pb_put_tag(p, field, KVP_PB_LEN);
	return kvp_pb_put_varint(p, len);
}

static inline uint8_t *
kvp_pb_put_i32s(uint8_t *p, uint32_t field, const int32_t *v, size_t n, size_t payload)
{
	if (n == 0)
		return p;
	p = kvp_pb_put_len_head(p, field, payload);
	for (size_t i = 0; i < n; i++)
		p = kvp_pb_put_varint(p, kvp_pb_int32(v[i]));
	return p;
}

static inline uint8_t *
kvp_pb_put_u32s(uint8_t *p, uint32_t field, const uint32_t *v, size_t n, size_t payload)
{
	if (n == 0)
		return p;
	p = kvp_pb_put_len_head(p, field, payload);
	for (size_t i = 0; i < n; i++)
		p = kvp_pb_put_varint(p, v[i]);
	return p;
}

static inline uint8_t *
kvp_pb_put_u64s(uint8_t *p, uint32_t field, const uint64_t *v, size_t n, size_t payload)
{
	if (n == 0)
		return p;
	p = kvp_pb_put_len_head(p, field, payload);
	for (size_t i = 0; i < n; i++)
		p = kvp_pb_put_varint(p, v[i]);
	return p;
}

/* A length-delimited field of n bytes at v (a bytes or string field, present). */
static inline uint8_t *
kvp_pb_put_bytes(uint8_t *p, uint32_t field, const void *v, size_t n)
{
	p = kvp_pb_put_len_head(p, field, n);
	memcpy(p, v, n);
	return p + n;
}

#endif /* KVP_PB_WRITE_H */
