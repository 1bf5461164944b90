/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvp_test.h: what every kvpool cmocka test includes. cmocka needs these
 * system headers first; the helpers print status names and whole id lists
 * on failure, so a failing scenario says what it saw.
 */
#ifndef KVP_TEST_H
#define KVP_TEST_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "common/kvp_status.h"

#define N_ELEMS(a) (sizeof(a) / sizeof((a)[0]))

/* Asserts a status code, naming both on failure. */
#define assert_status(got, want)                                                   \
	do {                                                                       \
		int got_ = (got), want_ = (want);                                  \
		if (got_ != want_)                                                 \
			fail_msg("%s: got %s, want %s", #got, kvp_status_name(got_),  \
			         kvp_status_name(want_));                          \
	} while (0)

#define assert_ok(expr) assert_status((expr), KVP_OK)

static inline void
kvp_test_ids_equal(const int32_t *got, size_t ngot, const int32_t *want, size_t nwant,
                   const char *what, const char *file, int line)
{
	int same = ngot == nwant;
	for (size_t i = 0; same && i < ngot; i++)
		same = got[i] == want[i];
	if (same)
		return;
	char a[1024] = "", b[1024] = "";
	size_t la = 0, lb = 0;
	for (size_t i = 0; i < ngot && la < sizeof(a) - 16; i++)
		la += (size_t)snprintf(a + la, sizeof(a) - la, "%s%d", i ? "," : "", got[i]);
	for (size_t i = 0; i < nwant && lb < sizeof(b) - 16; i++)
		lb += (size_t)snprintf(b + lb, sizeof(b) - lb, "%s%d", i ? "," : "", want[i]);
	fail_msg("%s:%d: %s: got [%s], want [%s]", file, line, what, a, b);
}

/* assert_ids(got, ngot, 1, 2, 3): compares an id list with literal ids. */
#define assert_ids(got, ngot, ...)                                                 \
	do {                                                                       \
		const int32_t want_[] = {__VA_ARGS__};                             \
		kvp_test_ids_equal((got), (ngot), want_, N_ELEMS(want_), #got,     \
		                   __FILE__, __LINE__);                            \
	} while (0)

#define assert_ids_empty(got, ngot)                                                \
	kvp_test_ids_equal((got), (ngot), NULL, 0, #got, __FILE__, __LINE__)

/* Parses lowercase hex into out; returns the byte count. */
static inline size_t
kvp_test_unhex(const char *hex, uint8_t *out, size_t cap)
{
	size_t n = 0;
	for (; hex[0] && hex[1] && n < cap; hex += 2) {
		unsigned v;
		if (sscanf(hex, "%2x", &v) != 1)
			break;
		out[n++] = (uint8_t)v;
	}
	return n;
}

/* xorshift64: the seeded generator of the randomized tests (state never 0). */
static inline uint64_t
kvp_test_rand(uint64_t *state)
{
	uint64_t x = *state;
	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return *state = x;
}

/* A value of every varint width from kvp_test_rand: zero, one byte, two or three, any. */
static inline uint64_t
kvp_test_rand_wide(uint64_t *state)
{
	switch (kvp_test_rand(state) % 4) {
	case 0:
		return 0;
	case 1:
		return kvp_test_rand(state) % 128;
	case 2:
		return kvp_test_rand(state) % 300000;
	default:
		return kvp_test_rand(state) >> (kvp_test_rand(state) % 64);
	}
}

#endif /* KVP_TEST_H */
