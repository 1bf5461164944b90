/* SPDX-License-Identifier: Apache-2.0 */
#include "service/conn_bounds.h"

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

void
kvpd_bound_check(const struct kvpd_held *held, size_t n, size_t contexts, uint32_t pipe,
                 uint64_t peer, struct kvpd_bound_verdict *out)
{
	size_t own = 0, same_addr = 0, unauth = 0;
	const struct kvpd_held *oldest_addr = NULL, *oldest_unauth = NULL, *victim = NULL;
	uint64_t addr = kvpd_peer_addr(peer);

	if (out == NULL)
		return;
	*out = (struct kvpd_bound_verdict){.close = 0, .reason = KVPD_CLOSE_NO_READ, .serve = true};
	if (held == NULL || contexts == 0 || pipe == 0)
		return;
	for (size_t i = 0; i < n; i++) {
		const struct kvpd_held *h = &held[i];
		own += h->pipe == pipe;
		if (trusted(h->peer))
			continue;
		unauth++;
		if (oldest_unauth == NULL || h->since_ms < oldest_unauth->since_ms)
			oldest_unauth = h;
		if (addr != 0 && kvpd_peer_addr(h->peer) == addr) {
			same_addr++;
			if (oldest_addr == NULL || h->since_ms < oldest_addr->since_ms)
				oldest_addr = h;
		}
	}
	if (own > 0 && own * 2 >= contexts) {
		out->close = pipe;
		out->serve = false;
		return;
	}
	if (trusted(peer))
		return;
	size_t per_addr = contexts / 4 ? contexts / 4 : 1, all = contexts / 2 ? contexts / 2 : 1;
	if (oldest_addr != NULL && same_addr >= per_addr) {
		victim = oldest_addr;
		out->reason = KVPD_CLOSE_ADDRESS_BOUND;
	} else if (oldest_unauth != NULL && unauth >= all) {
		victim = oldest_unauth;
		out->reason = KVPD_CLOSE_UNAUTH_BOUND;
	} else {
		return;
	}
	out->close = victim->pipe;
	out->serve = victim->pipe != pipe;
}

uint32_t
kvpd_pressure_victim(const struct kvpd_held *held, size_t n, size_t contexts, uint64_t now_ms,
                     uint64_t slow_ms, size_t *slow)
{
	const struct kvpd_held *any = NULL, *unauth = NULL;
	size_t count = 0;

	for (size_t i = 0; held != NULL && i < n; i++) {
		const struct kvpd_held *h = &held[i];
		if (now_ms < h->since_ms || now_ms - h->since_ms < slow_ms)
			continue;
		count++;
		if (any == NULL || h->since_ms < any->since_ms)
			any = h;
		if (!trusted(h->peer) && (unauth == NULL || h->since_ms < unauth->since_ms))
			unauth = h;
	}
	if (slow != NULL)
		*slow = count;
	if (count == 0 || count * 2 < contexts)
		return 0;
	return unauth != NULL ? unauth->pipe : any->pipe;
}
