/* SPDX-License-Identifier: Apache-2.0 */
/*
 * sink.h: where one reply's bytes go, and the note a refused call leaves
 * for the transport's log. The call layer writes it, the transport reads
 * it; beneath rpc/dispatch.h and pool/server.h, which both include it.
 */
#ifndef KVPD_SINK_H
#define KVPD_SINK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "service/config/config.h"

/*
 * Where a reply's bytes go: alloc(ctx, len) returns len writable bytes (or
 * NULL), replacing any buffer an earlier alloc returned for the same reply.
 * The reply is then buf[0..len). kvpoold's transport allocates an nng
 * message, so a large reply (ReadBlocks) is written once, in place.
 */
struct kvpd_sink {
	void *(*alloc)(void *ctx, size_t len);
	void *ctx;
	uint8_t *buf;
	size_t len;
	/* Set by the call when its refusal is worth an operator's attention (for the log). */
	uint8_t refusal;                  /* enum kvpd_refusal; 0: none */
	bool authenticated;               /* the call carried a pool's token (the transport's precedence) */
	char refusal_pool[KVPD_NAME_MAX];
	char refusal_why[256];            /* the reply's detail: never a secret */
};

enum kvpd_refusal { KVPD_REFUSED_AUTH = 1, KVPD_REFUSED_SESSION_LIMIT, KVPD_REFUSED_TOO_LARGE };
#define KVPD_NUM_REFUSALS 4

/*
 * Records a refusal in the sink for the transport's log. Inline: the
 * dispatcher and the session calls record refusals, and neither may call
 * back into the server (no circle between the files).
 */
static inline void
kvpd_sink_refusal(struct kvpd_sink *sink, enum kvpd_refusal kind, const char *pool,
                  const char *why)
{
	if (sink == NULL)
		return;
	sink->refusal = (uint8_t)kind;
	snprintf(sink->refusal_pool, sizeof(sink->refusal_pool), "%s", pool ? pool : "");
	snprintf(sink->refusal_why, sizeof(sink->refusal_why), "%s", why ? why : "");
}

#endif /* KVPD_SINK_H */
