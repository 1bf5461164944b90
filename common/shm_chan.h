/* SPDX-License-Identifier: Apache-2.0 */
/*
 * shm_chan.h: the same-host call channel (issue #63), shared by kvpoold
 * (service/net/chan.c) and the C client (clients/c/chan.c). A client of an
 * ipc:// daemon connects to the unix socket beside it (PATH.shm), says
 * KVP_CHAN_HELLO, and is handed a memfd over SCM_RIGHTS: a header page,
 * then a request area and a reply area of `area` bytes each. A call is the
 * very bytes it would send over nng: the client writes its request and its
 * length, bumps req_seq and wakes the futex; the daemon's thread for the
 * channel copies the request out, serves it as any other (the same
 * dispatch, statuses, sessions, tokens and limits), writes the reply and
 * its length, sets rep_seq to req_seq and wakes. Each side spins briefly
 * before it sleeps on the futex.
 *
 * The header lives in memory the peer can write: each side checks every
 * length against the area size it agreed at the handshake, and copies what
 * it reads out before decoding it. One call at a time per channel.
 */
#ifndef KVP_SHM_CHAN_H
#define KVP_SHM_CHAN_H

#include <errno.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define KVP_CHAN_MAGIC UINT64_C(0x314e414843505653) /* "SVPCHAN1", little-endian */
#define KVP_CHAN_HELLO "KVPCHAN1"                  /* what a client says first: 8 bytes */
#define KVP_CHAN_HDR 4096u                         /* the header's page */

struct kvp_chan_hdr {
	uint64_t magic;
	uint64_t area;               /* bytes of the request area, and of the reply area */
	_Atomic uint32_t req_seq;    /* the client's: bumped once a request is written */
	_Atomic uint32_t rep_seq;    /* the daemon's: set to req_seq once its reply is written */
	_Atomic uint32_t req_len;
	_Atomic uint32_t rep_len;
	_Atomic uint32_t spin_ok;    /* the daemon's, with each reply: 1 if the client may spin
	                              * long for its next reply (few channels are busy) */
};

/* The request area and the reply area of a mapped channel. */
static inline unsigned char *
kvp_chan_req(void *map)
{
	return (unsigned char *)map + KVP_CHAN_HDR;
}

static inline unsigned char *
kvp_chan_rep(void *map, uint64_t area)
{
	return (unsigned char *)map + KVP_CHAN_HDR + area;
}

/* Sleeps while *word == val, at most timeout_ms: 0 when woken (or it changed), else -1. */
static inline int
kvp_futex_wait(_Atomic uint32_t *word, uint32_t val, uint32_t timeout_ms)
{
	struct timespec ts = {(time_t)(timeout_ms / 1000), (long)(timeout_ms % 1000) * 1000000L};
	long rv = syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, val, &ts, NULL, 0);
	return rv == 0 || errno == EAGAIN || errno == EINTR ? 0 : -1;
}

static inline void
kvp_futex_wake(_Atomic uint32_t *word)
{
	(void)syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, 1, NULL, NULL, 0);
}

/*
 * The raw ping-pong floor of kvp-bench-samehost spins this many checks of
 * the word before sleeping (about 57 µs on these machines' CPUs); the
 * channel's two sides spin by time instead, for as long as a reply or
 * request is due (kvp_chan_spin: clients/c/chan.c, service/net/chan.c).
 */
#define KVP_CHAN_SPIN 2000

static inline void
kvp_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#endif
}

/* CLOCK_MONOTONIC in nanoseconds. */
static inline uint64_t
kvp_mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Spins until *word != val or spin_ns have passed since t0_ns; the word's last value. */
static inline uint32_t
kvp_chan_spin(_Atomic uint32_t *word, uint32_t val, uint64_t t0_ns, uint64_t spin_ns)
{
	uint32_t now = atomic_load(word);
	for (unsigned i = 1; now == val; i++) {
		kvp_cpu_relax();
		now = atomic_load(word);
		if (i % 64 == 0 && kvp_mono_ns() - t0_ns >= spin_ns)
			break;
	}
	return now;
}

#endif
