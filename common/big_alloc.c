/* SPDX-License-Identifier: Apache-2.0 */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS, madvise */

#include "common/big_alloc.h"

#include <stdint.h>
#include <stdlib.h>

#if defined(__linux__)
#include <sys/mman.h>
#define HUGE_ALIGN ((size_t)2 << 20)
#endif

void *
kvp_big_alloc(size_t n)
{
#if defined(__linux__)
	if (n >= HUGE_ALIGN) {
		size_t len = (n + HUGE_ALIGN - 1) & ~(HUGE_ALIGN - 1);
		size_t span = len + HUGE_ALIGN;
		uint8_t *raw = mmap(NULL, span, PROT_READ | PROT_WRITE,
		                    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (raw == MAP_FAILED)
			return NULL;
		uint8_t *p = (uint8_t *)(((uintptr_t)raw + HUGE_ALIGN - 1) & ~(HUGE_ALIGN - 1));
		/* Trim the unaligned head and the spare tail. */
		if (p > raw)
			munmap(raw, (size_t)(p - raw));
		if (raw + span > p + len)
			munmap(p + len, (size_t)(raw + span - (p + len)));
#ifdef MADV_HUGEPAGE
		(void)madvise(p, len, MADV_HUGEPAGE); /* a hint: fine if refused */
#endif
		return p;
	}
#endif
	return calloc(1, n ? n : 1);
}

void
kvp_big_free(void *p, size_t n)
{
	if (p == NULL)
		return;
#if defined(__linux__)
	if (n >= HUGE_ALIGN) {
		munmap(p, (n + HUGE_ALIGN - 1) & ~(HUGE_ALIGN - 1));
		return;
	}
#endif
	free(p);
}
