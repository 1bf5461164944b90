/* SPDX-License-Identifier: Apache-2.0 */
/*
 * pb_write.h: the few protobuf wire primitives kvpool writes by hand where
 * protobuf-c's descriptor-driven packer is too slow (replies on the hot
 * path). Every user is held to protobuf-c's own bytes by a test.
 */
#ifndef KVP_PB_WRITE_H
#define KVP_PB_WRITE_H

#include <stddef.h>
#include <stdint.h>

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

#endif /* KVP_PB_WRITE_H */
