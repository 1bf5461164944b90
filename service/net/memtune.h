/* SPDX-License-Identifier: Apache-2.0 */
/*
 * memtune.h: how the daemon's malloc gives memory back. Every request and
 * reply is a fresh nng message that nng allocates zeroed (calloc). With
 * glibc's defaults a worker thread's arena hands a freed 80 KB Batch back
 * to the kernel at once (madvise), so the next message faults its pages in
 * again while memset zeroes them, and every such madvise flushes the other
 * CPUs' TLBs. Under eight batching clients that was a fifth of the
 * daemon's perf samples, and kvpoold's CPU per Batch fell by about a third
 * without it (kvp-bench-service, BENCHMARKS.md). kvpoold therefore keeps
 * freed memory for reuse up to a bound per arena, and serves messages
 * below a fixed size from its heaps.
 */
#ifndef KVPD_MEMTUNE_H
#define KVPD_MEMTUNE_H

/* Freed memory kept per arena, and the size from which malloc maps afresh. */
#define KVPD_MALLOC_TRIM_THRESHOLD (16u << 20)
#define KVPD_MALLOC_MMAP_THRESHOLD (4u << 20)

/*
 * Sets those two (glibc only), unless the environment already chose
 * (MALLOC_TRIM_THRESHOLD_, MALLOC_MMAP_THRESHOLD_ or GLIBC_TUNABLES), and
 * logs what malloc does.
 */
void kvpd_malloc_tune(void);

#endif
