/* SPDX-License-Identifier: Apache-2.0 */
/*
 * pb_read.h: a proto3 message decoded into protobuf-c's own structs, driven
 * by protobuf-c's descriptors, without its unpacker's per-field overhead
 * (a scan of every field into a side table, then a second pass, allocating
 * each repeated array on its own). On a Batch of 384 block-level calls
 * protobuf-c's unpack was a third of the daemon's instructions.
 *
 * It decodes what kvpool's requests are made of: varint scalars (int32,
 * uint32, int64, uint64, bool, enum), strings, bytes, sub-messages, and
 * repeated fields of all of these, packed or not, occurring in pieces; and
 * packed repeated fixed32 fields in one piece (copied). On anything else it
 * declines (returns NULL) and the caller decodes with protobuf-c, which also
 * judges malformed input: unknown fields, other scalar types (fixed32 not
 * packed in one piece, fixed64, zigzag, float), a oneof set twice, a singular
 * sub-message given twice (protobuf-c merges them), required fields,
 * nesting deeper than KVP_PB_READ_DEPTH, and any malformed or truncated
 * encoding. Where it accepts, the result is protobuf-c's for the same bytes
 * (tests/test_pb_read.c holds it to that), except that bytes fields point
 * into the input instead of into a copy: the input must outlive the message.
 *
 * Everything is allocated from al, which must be an arena freed as a whole
 * (the daemon's decode arena; a client batch's results arena): a declined
 * decode leaves its allocations there, and the message is never freed
 * field by field.
 */
#ifndef KVP_PB_READ_H
#define KVP_PB_READ_H

#include <protobuf-c/protobuf-c.h>
#include <stddef.h>
#include <stdint.h>

#define KVP_PB_READ_DEPTH 8

/* desc's message from len bytes at data, allocated from al; NULL: declined. */
ProtobufCMessage *kvp_pb_read(const ProtobufCMessageDescriptor *desc, ProtobufCAllocator *al,
                              const uint8_t *data, size_t len);

#endif /* KVP_PB_READ_H */
