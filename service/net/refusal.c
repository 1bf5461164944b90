/* SPDX-License-Identifier: Apache-2.0 */
/* Refusals in the log, for the nng transport and the same-host channels: refusal.h. */
#include "service/net/refusal.h"

#include <nng/nng.h>
#include <nng/supplemental/util/platform.h>
#include <stdio.h>

#include "service/log.h"

void
kvpd_log_refusal(struct kvpd_log_limit *lim, const char *peer, const char *conn,
                 const struct kvpd_sink *sink)
{
	static const char *const what[KVPD_NUM_REFUSALS][2] = {
		{"", ""},
		{"auth", "refused authentication"},
		{"session", "refused a session: the pool is at --max-sessions"},
		{"transport", "refused a request larger than --max-msg-bytes"},
	};
	uint64_t dropped = 0;
	char more[24];
	unsigned k = sink->refusal;
	if (k == 0 || k >= KVPD_NUM_REFUSALS || !kvpd_log_enabled(KVPD_WARN) ||
	    !kvpd_log_limit_take(&lim[k], (uint64_t)nng_clock(), &dropped))
		return;
	snprintf(more, sizeof(more), "%llu", (unsigned long long)dropped);
	struct kvpd_log_field f[] = {{"pool", sink->refusal_pool}, {"peer", peer},
	                             {"connection", conn}, {"reason", sink->refusal_why},
	                             {"not_logged_before", more}};
	kvpd_log_fields(KVPD_WARN, what[k][0], what[k][1], f, dropped ? 5 : 4);
}
