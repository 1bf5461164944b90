/* SPDX-License-Identifier: Apache-2.0 */
/*
 * proto/pb_read.c against protobuf-c: random messages of every type in
 * kvpool.proto (built from the descriptors, so a new field is covered the
 * day it is added) decode to what protobuf-c decodes, byte for byte when
 * packed again; mutated encodings are declined or decoded as protobuf-c
 * decodes them; the encodings it must decline are declined.
 */
#include "kvp_test.h"

#include <stdbool.h>
#include <stdlib.h>

#include "kvpool.pb-c.h"
#include "proto/pb_read.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t
next_rand(void)
{
	return kvp_test_rand(&rng);
}

/* A bump arena, reset per decode, as the daemon's. */
static uint8_t *arena_buf;
static size_t arena_used, arena_cap = 16u << 20;

static void *
arena_alloc(void *d, size_t n)
{
	(void)d;
	size_t need = (n + 15) & ~(size_t)15;
	if (arena_used + need > arena_cap)
		return NULL;
	void *p = arena_buf + arena_used;
	arena_used += need;
	return p;
}

static void
arena_free(void *d, void *p)
{
	(void)d;
	(void)p;
}

static ProtobufCAllocator arena = {.alloc = arena_alloc, .free = arena_free};

static uint64_t
rand_wide(void)
{
	return kvp_test_rand_wide(&rng);
}

static bool
supported(ProtobufCType t)
{
	return t == PROTOBUF_C_TYPE_INT32 || t == PROTOBUF_C_TYPE_UINT32 ||
	       t == PROTOBUF_C_TYPE_INT64 || t == PROTOBUF_C_TYPE_UINT64 ||
	       t == PROTOBUF_C_TYPE_BOOL || t == PROTOBUF_C_TYPE_ENUM || t == PROTOBUF_C_TYPE_FIXED32 ||
	       t == PROTOBUF_C_TYPE_STRING || t == PROTOBUF_C_TYPE_BYTES ||
	       t == PROTOBUF_C_TYPE_MESSAGE;
}

static size_t
size_of(ProtobufCType t)
{
	switch (t) {
	case PROTOBUF_C_TYPE_INT64:
	case PROTOBUF_C_TYPE_UINT64:
	case PROTOBUF_C_TYPE_SINT64:
	case PROTOBUF_C_TYPE_FIXED64:
	case PROTOBUF_C_TYPE_SFIXED64:
	case PROTOBUF_C_TYPE_DOUBLE:
		return 8;
	case PROTOBUF_C_TYPE_STRING:
	case PROTOBUF_C_TYPE_MESSAGE:
		return sizeof(void *);
	case PROTOBUF_C_TYPE_BYTES:
		return sizeof(ProtobufCBinaryData);
	default:
		return 4;
	}
}

static void *rand_msg(const ProtobufCMessageDescriptor *d, int depth, bool *odd);

/* One random value of fd's type at dst (heap memory, freed by free_unpacked). */
static void
rand_value(const ProtobufCFieldDescriptor *fd, void *dst, int depth, bool *odd)
{
	uint64_t v = rand_wide();
	if (!supported(fd->type))
		*odd = true;
	switch (fd->type) {
	case PROTOBUF_C_TYPE_INT32: {
		int32_t x = next_rand() % 5 == 0 ? -(int32_t)(v % 1000) : (int32_t)v;
		memcpy(dst, &x, 4);
		break;
	}
	case PROTOBUF_C_TYPE_BOOL: {
		protobuf_c_boolean b = (protobuf_c_boolean)(v & 1);
		memcpy(dst, &b, sizeof(b));
		break;
	}
	case PROTOBUF_C_TYPE_ENUM: {
		int32_t x = (int32_t)(v % 20);
		memcpy(dst, &x, 4);
		break;
	}
	case PROTOBUF_C_TYPE_FLOAT:
	case PROTOBUF_C_TYPE_DOUBLE: {
		double x = (double)(v % 1000) / 8.0;
		float f = (float)x;
		if (fd->type == PROTOBUF_C_TYPE_FLOAT)
			memcpy(dst, &f, 4);
		else
			memcpy(dst, &x, 8);
		break;
	}
	case PROTOBUF_C_TYPE_STRING: {
		size_t n = next_rand() % 40;
		char *s = malloc(n + 1);
		for (size_t i = 0; i < n; i++)
			s[i] = (char)(' ' + next_rand() % 95);
		s[n] = '\0';
		memcpy(dst, &s, sizeof(s));
		break;
	}
	case PROTOBUF_C_TYPE_BYTES: {
		ProtobufCBinaryData b = {.len = next_rand() % 70};
		b.data = malloc(b.len ? b.len : 1);
		for (size_t i = 0; i < b.len; i++)
			b.data[i] = (uint8_t)next_rand();
		memcpy(dst, &b, sizeof(b));
		break;
	}
	case PROTOBUF_C_TYPE_MESSAGE: {
		void *m = rand_msg(fd->descriptor, depth + 1, odd);
		memcpy(dst, &m, sizeof(m));
		break;
	}
	default: /* the other integers: the width's low bytes */
		memcpy(dst, &v, size_of(fd->type));
	}
}

/* A random message of d: some fields set, some repeated, one member per oneof at most. */
static void *
rand_msg(const ProtobufCMessageDescriptor *d, int depth, bool *odd)
{
	ProtobufCMessage *m = calloc(1, d->sizeof_message);
	protobuf_c_message_init(d, m);
	for (unsigned i = 0; i < d->n_fields; i++) {
		const ProtobufCFieldDescriptor *fd = &d->fields[i];
		char *at = (char *)m + fd->offset;
		if (next_rand() % 3 == 0 || (fd->type == PROTOBUF_C_TYPE_MESSAGE && depth >= 4))
			continue;
		if (fd->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
			uint32_t *which = (uint32_t *)((char *)m + fd->quantifier_offset);
			if (*which != 0 || next_rand() % 3 != 0)
				continue;
			*which = fd->id;
		}
		if (fd->label == PROTOBUF_C_LABEL_REPEATED) {
			size_t n = next_rand() % (fd->type == PROTOBUF_C_TYPE_MESSAGE ? 5 : 40);
			char *arr = n ? calloc(n, size_of(fd->type)) : NULL;
			for (size_t k = 0; k < n; k++)
				rand_value(fd, arr + k * size_of(fd->type), depth, odd);
			memcpy(at, &arr, sizeof(arr));
			memcpy((char *)m + fd->quantifier_offset, &n, sizeof(n));
			continue;
		}
		if (fd->label == PROTOBUF_C_LABEL_OPTIONAL && fd->type != PROTOBUF_C_TYPE_MESSAGE &&
		    fd->type != PROTOBUF_C_TYPE_STRING)
			*(protobuf_c_boolean *)((char *)m + fd->quantifier_offset) = 1;
		rand_value(fd, at, depth, odd);
	}
	return m;
}

/* m packed by protobuf-c; caller frees. */
static uint8_t *
pack(const ProtobufCMessage *m, size_t *len)
{
	*len = protobuf_c_message_get_packed_size(m);
	uint8_t *b = malloc(*len ? *len : 1);
	assert_int_equal(protobuf_c_message_pack(m, b), *len);
	return b;
}

/*
 * Decodes b both ways: ours declined (false), or ours equal to protobuf-c's
 * when packed again (true). protobuf-c must accept what we accept.
 */
static bool
same_as_protobuf_c(const ProtobufCMessageDescriptor *d, const uint8_t *b, size_t len)
{
	arena_used = 0;
	ProtobufCMessage *mine = kvp_pb_read(d, &arena, b, len);
	if (mine == NULL)
		return false;
	ProtobufCMessage *theirs = protobuf_c_message_unpack(d, NULL, len, b);
	assert_non_null(theirs);
	size_t l1, l2;
	uint8_t *p1 = pack(mine, &l1), *p2 = pack(theirs, &l2);
	assert_int_equal(l1, l2);
	assert_memory_equal(p1, p2, l1);
	free(p1);
	free(p2);
	protobuf_c_message_free_unpacked(theirs, NULL);
	return true;
}

static void
random_messages_decode_as_protobuf_c_does(void **state)
{
	/* Every request type, and the Request envelope over all of them. */
	const ProtobufCMessageDescriptor *descs[] = {
		&kvpool__v1__request__descriptor, &kvpool__v1__batch_request__descriptor,
		&kvpool__v1__slots_run_request__descriptor, &kvpool__v1__cache_request__descriptor,
		&kvpool__v1__allocate_slots_request__descriptor, &kvpool__v1__lookup_request__descriptor,
		&kvpool__v1__write_blocks_request__descriptor, &kvpool__v1__hello_request__descriptor,
		/* and the replies a client reads with it */
		&kvpool__v1__reply__descriptor, &kvpool__v1__batch_reply__descriptor,
		&kvpool__v1__slots_run_reply__descriptor, &kvpool__v1__lookup_reply__descriptor};
	size_t accepted = 0, plain = 0, mutated_ok = 0;
	(void)state;
	for (int iter = 0; iter < 6000; iter++) {
		const ProtobufCMessageDescriptor *d = descs[iter % N_ELEMS(descs)];
		bool odd = false;
		ProtobufCMessage *m = rand_msg(d, 0, &odd);
		size_t len;
		uint8_t *b = pack(m, &len);
		bool ok = same_as_protobuf_c(d, b, len);
		if (ok) {
			/* Accepted: the very bytes back. */
			size_t l2;
			arena_used = 0;
			uint8_t *again = pack(kvp_pb_read(d, &arena, b, len), &l2);
			assert_int_equal(l2, len);
			assert_memory_equal(again, b, len);
			free(again);
			accepted++;
		}
		if (!odd) { /* nothing but the types we decode: never declined */
			plain++;
			if (!ok)
				fail_msg("iteration %d: a plain %s declined", iter, d->name);
		}
		/* Mutations: declined, or protobuf-c's reading. */
		for (int k = 0; k < 6 && len > 0; k++) {
			uint8_t *c = malloc(len + 8);
			size_t cl = len, at = next_rand() % len;
			memcpy(c, b, len);
			switch (k % 3) {
			case 0:
				c[at] ^= (uint8_t)(1u << (next_rand() % 8));
				break;
			case 1:
				cl = at;
				break;
			default:
				memmove(c + at + 1, c + at, len - at);
				c[at] = (uint8_t)next_rand();
				cl = len + 1;
			}
			mutated_ok += same_as_protobuf_c(d, c, cl);
			free(c);
		}
		free(b);
		protobuf_c_message_free_unpacked(m, NULL);
	}
	print_message("%zu accepted, %zu plain, %zu mutations accepted\n", accepted, plain, mutated_ok);
	/* The test means something only if both kinds happened. */
	assert_true(plain > 1000);
	assert_true(accepted >= plain);
	assert_true(mutated_ok > 1000);
}

/*
 * Packed varints of every length from one to ten bytes, each at every offset
 * in a run (a varint of up to eight bytes is decoded eight bytes at a time,
 * the last few bytes and longer ones one at a time): the values come back.
 */
static void
every_varint_length_in_a_packed_run(void **state)
{
	enum { N = 64 };
	int64_t v[N];
	int32_t w[N];
	(void)state;
	for (int shift = 0; shift < N; shift++) {
		for (int i = 0; i < N; i++) {
			int k = (i + shift) % 22; /* 0..9: 2^(7k) - 1 and 2^(7k); then the extremes */
			int bits = 7 * (k / 2 + 1); /* below 64 for k < 18 */
			if (k < 18)
				v[i] = (int64_t)((1ull << bits) - 1 + (uint64_t)(k % 2));
			else if (k < 20)
				v[i] = INT64_MAX - k % 2;
			else
				v[i] = k == 20 ? -1 : INT64_MIN;
			w[i] = (int32_t)v[i];
		}
		Kvpool__V1__AllocateSlotsRequest a = KVPOOL__V1__ALLOCATE_SLOTS_REQUEST__INIT;
		Kvpool__V1__FreeRequest f = KVPOOL__V1__FREE_REQUEST__INIT;
		a.n_prompt_token_ids = (size_t)(N - shift);
		a.prompt_token_ids = v;
		f.n_block_ids = (size_t)(N - shift);
		f.block_ids = w;
		size_t la, lf;
		uint8_t *ba = pack(&a.base, &la), *bf = pack(&f.base, &lf);
		arena_used = 0;
		Kvpool__V1__AllocateSlotsRequest *ra = (Kvpool__V1__AllocateSlotsRequest *)kvp_pb_read(
			&kvpool__v1__allocate_slots_request__descriptor, &arena, ba, la);
		Kvpool__V1__FreeRequest *rf = (Kvpool__V1__FreeRequest *)kvp_pb_read(
			&kvpool__v1__free_request__descriptor, &arena, bf, lf);
		assert_non_null(ra);
		assert_non_null(rf);
		assert_int_equal(ra->n_prompt_token_ids, N - shift);
		assert_int_equal(rf->n_block_ids, N - shift);
		assert_memory_equal(ra->prompt_token_ids, v, (size_t)(N - shift) * sizeof(v[0]));
		assert_memory_equal(rf->block_ids, w, (size_t)(N - shift) * sizeof(w[0]));
		assert_true(same_as_protobuf_c(&kvpool__v1__allocate_slots_request__descriptor, ba, la));
		free(ba);
		free(bf);
	}
}

/* A packed fixed32 field (a prompt's 32-bit ids) in one piece: copied, every value. */
static void
packed_fixed32_is_copied(void **state)
{
	uint32_t v[7] = {0, 1, 127, 128, 151642, 0x7fffffffu, 0xffffffffu};
	Kvpool__V1__AllocateSlotsRequest a = KVPOOL__V1__ALLOCATE_SLOTS_REQUEST__INIT;
	const ProtobufCMessageDescriptor *d = &kvpool__v1__allocate_slots_request__descriptor;
	size_t len;
	(void)state;
	a.request_id = 9;
	a.n_prompt_token_ids_u32 = 7;
	a.prompt_token_ids_u32 = v;
	uint8_t *b = pack(&a.base, &len);
	arena_used = 0;
	Kvpool__V1__AllocateSlotsRequest *r =
		(Kvpool__V1__AllocateSlotsRequest *)kvp_pb_read(d, &arena, b, len);
	assert_non_null(r);
	assert_int_equal(r->request_id, 9);
	assert_int_equal(r->n_prompt_token_ids_u32, 7);
	assert_memory_equal(r->prompt_token_ids_u32, v, sizeof(v));
	assert_true(same_as_protobuf_c(d, b, len));
	free(b);
	/* field 13, packed: a length that is no multiple of 4, and a second piece */
	const uint8_t ragged[] = {0x6a, 0x05, 1, 0, 0, 0, 2};
	const uint8_t pieces[] = {0x6a, 0x04, 1, 0, 0, 0, 0x6a, 0x04, 2, 0, 0, 0};
	/* field 13 as one unpacked fixed32 (wire type 5) */
	const uint8_t unpacked[] = {0x6d, 1, 0, 0, 0};
	assert_null(kvp_pb_read(d, &arena, ragged, sizeof(ragged)));
	assert_null(kvp_pb_read(d, &arena, pieces, sizeof(pieces)));
	assert_null(kvp_pb_read(d, &arena, unpacked, sizeof(unpacked)));
	assert_false(same_as_protobuf_c(d, pieces, sizeof(pieces)));
}

/* Encodings it declines, each one protobuf-c reads (or refuses) itself. */
static void
declines_what_it_does_not_take(void **state)
{
	(void)state;
	/* FreeRequest{block_ids} = 1 */
	const uint8_t packed[] = {0x0a, 0x03, 0x01, 0x02, 0x03};
	const uint8_t unpacked[] = {0x08, 0x01, 0x08, 0x02};
	const uint8_t two_pieces[] = {0x0a, 0x01, 0x01, 0x0a, 0x01, 0x02};
	const uint8_t empty_then_piece[] = {0x0a, 0x00, 0x0a, 0x01, 0x02};
	const uint8_t unknown[] = {0x0a, 0x01, 0x01, 0x10, 0x05};
	const uint8_t cut_short[] = {0x0a, 0x03, 0x01, 0x02};
	const uint8_t ends_in_varint[] = {0x0a, 0x02, 0x01, 0x82};
	const uint8_t fixed[] = {0x0d, 1, 2, 3, 4};
	/* -1 as a 10-byte int32 varint, and an 11-byte varint. */
	const uint8_t neg[] = {0x0a, 0x0a, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
	const uint8_t eleven[] = {0x0a, 0x0b, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
	                          0xff, 0xff, 0xff, 0xff, 0x01};
	const ProtobufCMessageDescriptor *fr = &kvpool__v1__free_request__descriptor;

	assert_true(same_as_protobuf_c(fr, packed, sizeof(packed)));
	assert_true(same_as_protobuf_c(fr, empty_then_piece, sizeof(empty_then_piece)));
	assert_true(same_as_protobuf_c(fr, neg, sizeof(neg)));
	arena_used = 0;
	Kvpool__V1__FreeRequest *f = (Kvpool__V1__FreeRequest *)kvp_pb_read(fr, &arena, neg, sizeof(neg));
	assert_int_equal(f->n_block_ids, 1);
	assert_int_equal(f->block_ids[0], -1);
	assert_false(same_as_protobuf_c(fr, unpacked, sizeof(unpacked)));
	assert_false(same_as_protobuf_c(fr, two_pieces, sizeof(two_pieces)));
	assert_false(same_as_protobuf_c(fr, unknown, sizeof(unknown)));
	assert_false(same_as_protobuf_c(fr, cut_short, sizeof(cut_short)));
	assert_false(same_as_protobuf_c(fr, ends_in_varint, sizeof(ends_in_varint)));
	assert_false(same_as_protobuf_c(fr, fixed, sizeof(fixed)));
	assert_false(same_as_protobuf_c(fr, eleven, sizeof(eleven)));
	/* A oneof set twice (BatchCall.free then .touch), a sub-message given twice. */
	const uint8_t oneof_twice[] = {0x6a, 0x00, 0x62, 0x00};
	const uint8_t sub_twice[] = {0x6a, 0x00, 0x6a, 0x00};
	const ProtobufCMessageDescriptor *bc = &kvpool__v1__batch_call__descriptor;
	assert_false(same_as_protobuf_c(bc, oneof_twice, sizeof(oneof_twice)));
	assert_false(same_as_protobuf_c(bc, sub_twice, sizeof(sub_twice)));
	/* Bad arguments. */
	assert_null(kvp_pb_read(NULL, &arena, packed, sizeof(packed)));
	assert_null(kvp_pb_read(fr, NULL, packed, sizeof(packed)));
	assert_null(kvp_pb_read(fr, &arena, NULL, 3));
	/* Empty input: a default message. */
	arena_used = 0;
	f = (Kvpool__V1__FreeRequest *)kvp_pb_read(fr, &arena, NULL, 0);
	assert_non_null(f);
	assert_int_equal(f->n_block_ids, 0);
}

static int
setup(void **state)
{
	(void)state;
	arena_buf = malloc(arena_cap);
	return arena_buf ? 0 : -1;
}

static int
teardown(void **state)
{
	(void)state;
	free(arena_buf);
	return 0;
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(random_messages_decode_as_protobuf_c_does),
		cmocka_unit_test(every_varint_length_in_a_packed_run),
		cmocka_unit_test(packed_fixed32_is_copied),
		cmocka_unit_test(declines_what_it_does_not_take),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
