/* SPDX-License-Identifier: Apache-2.0 */
/*
 * data_wire.h: the data plane's bytes and limits, written once for both
 * ends: how many blocks (or tokens) one call may carry, and the ReadBlocks
 * reply that the daemon writes in place (the executor reads the blocks
 * straight into the outgoing message) and the client parses in place (the
 * payload is copied once, into the caller's buffer).
 *
 * The reply is Reply{call_id = 1, read_blocks = 28 {payload = 1,
 * crc32c = 2 (packed fixed32)}}: the bytes protobuf-c produces for the same
 * message (tests/test_wire.c holds both functions to protobuf-c).
 *
 * Pure: no I/O, no allocation, no state; thread-safe.
 */
#ifndef KVP_DATA_WIRE_H
#define KVP_DATA_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Room kept in every data message for the envelope (ids, call id, pool, session). */
#define KVP_WIRE_ENVELOPE 4096u
/* What one block costs on the wire besides its bytes: its id and its checksum, with slack. */
#define KVP_WIRE_BLOCK_EXTRA 16u

/*
 * How many units of `unit` bytes one message of max_msg bytes carries,
 * keeping KVP_WIRE_ENVELOPE free, capped at max_ids (0: no cap). 0 when not
 * even one fits (or unit is 0). The daemon refuses a call above it and the
 * client splits below it: both use this one formula.
 */
uint64_t kvp_wire_units_per_call(uint64_t max_msg, uint64_t max_ids, uint64_t unit);

/* Blocks of block_bytes one ReadBlocks or WriteBlocks call may carry. */
static inline uint64_t
kvp_wire_blocks_per_call(uint64_t max_msg, uint64_t max_ids, uint64_t block_bytes)
{
	return kvp_wire_units_per_call(max_msg, max_ids, block_bytes + KVP_WIRE_BLOCK_EXTRA);
}

/* Bytes of a successful ReadBlocks reply carrying n blocks of bb bytes (call_id 0: absent). */
size_t kvp_wire_read_reply_size(uint64_t call_id, uint64_t n, uint64_t bb);

/*
 * Writes a successful ReadBlocks reply's envelope into buf (of
 * kvp_wire_read_reply_size bytes). Sets *payload to where the n * bb bytes
 * of the blocks go and returns where the n checksums go; fill them with
 * kvp_wire_put_crc, in block order, and the message is complete.
 */
uint8_t *kvp_wire_read_reply_begin(uint8_t *buf, uint64_t call_id, uint64_t n, uint64_t bb,
                                   uint8_t **payload);

/* Writes one checksum (fixed32, little-endian) and returns the next position. */
static inline uint8_t *
kvp_wire_put_crc(uint8_t *p, uint32_t crc)
{
	p[0] = (uint8_t)crc;
	p[1] = (uint8_t)(crc >> 8);
	p[2] = (uint8_t)(crc >> 16);
	p[3] = (uint8_t)(crc >> 24);
	return p + 4;
}

/* Reads checksum i of a parsed reply's packed checksums. */
static inline uint32_t
kvp_wire_get_crc(const uint8_t *crcs, size_t i)
{
	const uint8_t *q = crcs + 4 * i;
	return (uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 | (uint32_t)q[3] << 24;
}

/*
 * Finds a successful ReadBlocks reply's payload and packed checksums inside
 * the message b[0..len) without copying. true only for a well-formed reply
 * with status OK whose call id is call_id (or absent); anything else (an
 * error status, unpacked checksums, another result, truncation) gives false
 * and the caller decodes the message the ordinary way.
 */
bool kvp_wire_read_reply_parse(const uint8_t *b, size_t len, uint64_t call_id,
                               const uint8_t **payload, uint64_t *plen, const uint8_t **crcs,
                               uint64_t *clen);

#endif /* KVP_DATA_WIRE_H */
