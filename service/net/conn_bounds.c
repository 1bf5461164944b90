/* SPDX-License-Identifier: Apache-2.0 */
#include "service/net/conn_bounds.h"

#include <string.h>

/* Bits 61-62 of a peer value: the address family (never 0, so neither is the value). */
#define TAG_SHIFT 61
#define TAG_MASK (UINT64_C(3) << TAG_SHIFT)
#define TAG_V4 (UINT64_C(1) << TAG_SHIFT)
#define TAG_V6 (UINT64_C(2) << TAG_SHIFT)
#define TAG_NONE (UINT64_C(3) << TAG_SHIFT)
#define PAYLOAD ((UINT64_C(1) << TAG_SHIFT) - 1)

uint64_t
kvpd_peer_value(const nng_sockaddr *sa)
{
	if (sa == NULL)
		return TAG_NONE;
	if (sa->s_family == NNG_AF_INET)
		return TAG_V4 | (uint64_t)sa->s_in.sa_addr;
	if (sa->s_family == NNG_AF_INET6) {
		/* One /64 is one site's: its hosts are one address here. */
		uint64_t prefix;
		memcpy(&prefix, sa->s_in6.sa_addr, sizeof(prefix));
		return TAG_V6 | (prefix & PAYLOAD);
	}
	return TAG_NONE; /* ipc:// (local, file permissions), or unknown */
}

uint64_t
kvpd_peer_addr(uint64_t peer)
{
	peer &= ~KVPD_PEER_TRUSTED;
	return (peer & TAG_MASK) == TAG_NONE || (peer & TAG_MASK) == 0 ? 0 : peer;
}

static bool
trusted(uint64_t peer)
{
	return (peer & KVPD_PEER_TRUSTED) != 0;
}

static bool
waited(const struct kvpd_held *h, uint64_t now_ms, uint64_t ms)
{
	return now_ms >= h->since_ms && now_ms - h->since_ms >= ms;
}

/* The shares: one unauthenticated address's, all unauthenticated connections'. */
static size_t
address_share(size_t contexts)
{
	return contexts / 4 ? contexts / 4 : 1;
}

static size_t
unauth_share(size_t contexts)
{
	return contexts / 2 ? contexts / 2 : 1;
}

/*
 * The stale unauthenticated replies (waiting stale_ms): how many in all and
 * how many from address addr (0: none counted), and the longest waiter of
 * each.
 */
struct stale {
	size_t all, same;
	const struct kvpd_held *oldest_all, *oldest_same;
};

static void
count_stale(const struct kvpd_held *held, size_t n, uint64_t addr, uint64_t now_ms,
            uint64_t stale_ms, struct stale *st)
{
	*st = (struct stale){0};
	for (size_t i = 0; i < n; i++) {
		const struct kvpd_held *h = &held[i];
		if (trusted(h->peer) || !waited(h, now_ms, stale_ms))
			continue;
		st->all++;
		if (st->oldest_all == NULL || h->since_ms < st->oldest_all->since_ms)
			st->oldest_all = h;
		if (addr != 0 && kvpd_peer_addr(h->peer) == addr) {
			st->same++;
			if (st->oldest_same == NULL || h->since_ms < st->oldest_same->since_ms)
				st->oldest_same = h;
		}
	}
}

void
kvpd_bound_check(const struct kvpd_held *held, size_t n, size_t contexts, uint32_t pipe,
                 uint64_t peer, uint64_t now_ms, uint64_t stale_ms,
                 struct kvpd_bound_verdict *out)
{
	const struct kvpd_held *victim = NULL;
	struct stale st;
	size_t own = 0;

	if (out == NULL)
		return;
	*out = (struct kvpd_bound_verdict){.close = 0, .reason = KVPD_CLOSE_NO_READ, .serve = true};
	if (held == NULL || contexts == 0 || pipe == 0)
		return;
	for (size_t i = 0; i < n; i++)
		own += held[i].pipe == pipe;
	if (own > 0 && own * 2 >= contexts) {
		out->close = pipe;
		out->serve = false;
		return;
	}
	if (trusted(peer))
		return;
	count_stale(held, n, kvpd_peer_addr(peer), now_ms, stale_ms, &st);
	if (st.oldest_same != NULL && st.same >= address_share(contexts)) {
		victim = st.oldest_same;
		out->reason = KVPD_CLOSE_ADDRESS_BOUND;
	} else if (st.oldest_all != NULL && st.all >= unauth_share(contexts)) {
		victim = st.oldest_all;
		out->reason = KVPD_CLOSE_UNAUTH_BOUND;
	} else {
		return;
	}
	out->close = victim->pipe;
	out->serve = victim->pipe != pipe;
}

uint32_t
kvpd_pressure_victim(const struct kvpd_held *held, size_t n, size_t contexts, uint64_t now_ms,
                     uint64_t slow_ms, uint64_t stale_ms, size_t *slow,
                     enum kvpd_close_reason *reason)
{
	const struct kvpd_held *any = NULL, *unauth = NULL;
	size_t count = 0;
	enum kvpd_close_reason why = KVPD_CLOSE_NO_READ;
	uint32_t victim = 0;

	for (size_t i = 0; held != NULL && i < n; i++) {
		const struct kvpd_held *h = &held[i];
		if (!waited(h, now_ms, slow_ms))
			continue;
		count++;
		if (any == NULL || h->since_ms < any->since_ms)
			any = h;
		if (!trusted(h->peer) && (unauth == NULL || h->since_ms < unauth->since_ms))
			unauth = h;
	}
	if (slow != NULL)
		*slow = count;
	if (count > 0 && count * 2 >= contexts) {
		victim = unauth != NULL ? unauth->pipe : any->pipe;
	} else if (held != NULL && contexts > 0) {
		/* Past a share with no request to enforce it: every address is checked. */
		struct stale st;
		for (size_t i = 0; i < n && victim == 0; i++) {
			uint64_t addr = kvpd_peer_addr(held[i].peer);
			if (trusted(held[i].peer) || addr == 0)
				continue;
			count_stale(held, n, addr, now_ms, stale_ms, &st);
			if (st.same > address_share(contexts)) {
				victim = st.oldest_same->pipe;
				why = KVPD_CLOSE_ADDRESS_BOUND;
			}
		}
		count_stale(held, n, 0, now_ms, stale_ms, &st);
		if (victim == 0 && st.all > unauth_share(contexts)) {
			victim = st.oldest_all->pipe;
			why = KVPD_CLOSE_UNAUTH_BOUND;
		}
	}
	if (reason != NULL)
		*reason = why;
	return victim;
}

const char *
kvpd_bound_why(enum kvpd_close_reason reason)
{
	switch (reason) {
	case KVPD_CLOSE_NO_READ:
		return "closed a connection that sent a request while half the contexts held "
		       "replies it had not taken";
	case KVPD_CLOSE_ADDRESS_BOUND:
		return "closed a connection that held the contexts one unauthenticated address may "
		       "hold, and that address sent another request";
	case KVPD_CLOSE_UNAUTH_BOUND:
		return "closed a connection that held the contexts unauthenticated peers may hold, "
		       "and another such request came";
	default:
		return "closed a connection that held too many contexts";
	}
}
