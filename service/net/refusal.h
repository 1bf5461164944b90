/* SPDX-License-Identifier: Apache-2.0 */
/*
 * refusal.h: a call's refusal in the log, beneath the nng transport and the
 * same-host channels (net/chan.c), which both serve calls.
 */
#ifndef KVPD_REFUSAL_H
#define KVPD_REFUSAL_H

#include "service/log.h"
#include "service/rpc/sink.h"

/*
 * Logs a refusal worth an operator's eye (sink->refusal: auth, the session
 * limit, a request too large) with its peer and connection, within
 * lim[KVPD_NUM_REFUSALS]'s rate (the caller serialises calls on lim).
 */
void kvpd_log_refusal(struct kvpd_log_limit *lim, const char *peer, const char *conn,
                      const struct kvpd_sink *sink);

#endif
