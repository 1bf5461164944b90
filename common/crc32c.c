/* SPDX-License-Identifier: Apache-2.0 */
/*
 * CRC32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum every
 * block read carries. x86-64 with SSE4.2 uses the crc32 instruction over
 * three interleaved streams (the instruction's latency is 3 cycles, its
 * throughput 1), combined by a shift table; elsewhere slicing-by-8 tables.
 * Both give the same bits (tests compare them and the standard check value
 * 0xE3069283 of "123456789").
 */
#include <pthread.h>
#include <stdbool.h>
#include <string.h>

#include "common/crc32c.h"

#define POLY 0x82F63B78u

static uint32_t table[8][256];
static pthread_once_t once = PTHREAD_ONCE_INIT;
static bool have_hw;

static uint32_t crc_sw(uint32_t c, const unsigned char *p, size_t n);
#if defined(__x86_64__)
static void init_shift(void);
#endif

static void
init(void)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;
		for (int k = 0; k < 8; k++)
			c = c & 1 ? (c >> 1) ^ POLY : c >> 1;
		table[0][i] = c;
	}
	for (uint32_t i = 0; i < 256; i++)
		for (int s = 1; s < 8; s++)
			table[s][i] = (table[s - 1][i] >> 8) ^ table[0][table[s - 1][i] & 0xff];
#if defined(__x86_64__)
	__builtin_cpu_init();
	have_hw = __builtin_cpu_supports("sse4.2");
	if (have_hw)
		init_shift();
#endif
}

static uint32_t
crc_sw(uint32_t c, const unsigned char *p, size_t n)
{
	while (n >= 8) {
		uint64_t w;
		memcpy(&w, p, 8);
		w ^= c;
		c = table[7][w & 0xff] ^ table[6][(w >> 8) & 0xff] ^ table[5][(w >> 16) & 0xff] ^
		    table[4][(w >> 24) & 0xff] ^ table[3][(w >> 32) & 0xff] ^
		    table[2][(w >> 40) & 0xff] ^ table[1][(w >> 48) & 0xff] ^ table[0][w >> 56];
		p += 8;
		n -= 8;
	}
	while (n--)
		c = (c >> 8) ^ table[0][(c ^ *p++) & 0xff];
	return c;
}

#if defined(__x86_64__)
#include <nmmintrin.h>

#define STRIPE 4096u /* bytes per stream per round */

/* shift_tab: the linear map crc -> crc past STRIPE zero bytes, one table per byte. */
static uint32_t shift_tab[4][256];

static uint32_t
shift_slow(uint32_t crc, size_t len)
{
	static const unsigned char zeros[256];
	while (len > 0) {
		size_t k = len < sizeof(zeros) ? len : sizeof(zeros);
		crc = crc_sw(crc, zeros, k);
		len -= k;
	}
	return crc;
}

static void
init_shift(void)
{
	for (uint32_t b = 0; b < 4; b++)
		for (uint32_t i = 0; i < 256; i++)
			shift_tab[b][i] = shift_slow(i << (8 * b), STRIPE);
}

static uint32_t
shift(uint32_t c)
{
	return shift_tab[0][c & 0xff] ^ shift_tab[1][(c >> 8) & 0xff] ^
	       shift_tab[2][(c >> 16) & 0xff] ^ shift_tab[3][c >> 24];
}

__attribute__((target("sse4.2"))) static uint32_t
crc_hw(uint32_t c, const unsigned char *p, size_t n)
{
	while (n >= 3 * STRIPE) {
		uint64_t a = c, b = 0, d = 0, w0, w1, w2;
		for (size_t i = 0; i < STRIPE; i += 8) {
			memcpy(&w0, p + i, 8);
			memcpy(&w1, p + STRIPE + i, 8);
			memcpy(&w2, p + 2 * STRIPE + i, 8);
			a = _mm_crc32_u64(a, w0);
			b = _mm_crc32_u64(b, w1);
			d = _mm_crc32_u64(d, w2);
		}
		/* CRCs without the inversions are linear: crc(x, A|B) = shift(crc(x, A)) ^ crc(0, B). */
		c = shift(shift((uint32_t)a) ^ (uint32_t)b) ^ (uint32_t)d;
		p += 3 * STRIPE;
		n -= 3 * STRIPE;
	}
	uint64_t c64 = c;
	while (n >= 8) {
		uint64_t w;
		memcpy(&w, p, 8);
		c64 = _mm_crc32_u64(c64, w);
		p += 8;
		n -= 8;
	}
	c = (uint32_t)c64;
	while (n--)
		c = _mm_crc32_u8(c, *p++);
	return c;
}
#endif

uint32_t
kvp_crc32c(uint32_t crc, const void *data, size_t n)
{
	const unsigned char *p = data;
	uint32_t c = ~crc;
	if (n > 0 && data == NULL)
		return crc;
	pthread_once(&once, init);
#if defined(__x86_64__)
	if (have_hw)
		return ~crc_hw(c, p, n);
#endif
	return ~crc_sw(c, p, n);
}

uint32_t
kvp_crc32c_portable(uint32_t crc, const void *data, size_t n)
{
	if (n > 0 && data == NULL)
		return crc;
	pthread_once(&once, init);
	return ~crc_sw(~crc, data, n);
}
