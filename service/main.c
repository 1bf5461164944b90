/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvpoold: serves kvpool pools over nng. See `kvpoold --help`.
 *
 * Prints its effective configuration, listens, and runs until SIGTERM or
 * SIGINT; then it stops accepting connections, lets calls in flight finish
 * (drain-ms), releases every session's blocks and exits 0.
 */
#define _POSIX_C_SOURCE 200809L

#include <nng/nng.h>
#include <nng/supplemental/util/platform.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "service/admin.h"
#include "service/config.h"
#include "common/kvp_status.h"
#include "service/server.h"
#include "service/transport.h"
#include "service/vllm_pub.h"

static atomic_bool stopping;
static atomic_bool ready;

struct reaper {
	struct kvpd_server *srv;
	uint32_t period_ms;
};

/* Ends expired sessions a few times per lease; publishes the streams' ticks. */
static void
reaper_main(void *arg)
{
	struct reaper *r = arg;
	nng_time last_tick = nng_clock();
	while (!atomic_load(&stopping)) {
		for (uint32_t t = 0; t < r->period_ms && !atomic_load(&stopping); t += 20)
			nng_msleep(20);
		size_t n = kvpd_server_expire(r->srv, nng_clock());
		if (n > 0)
			fprintf(stderr, "kvpoold: %zu session(s) expired; their blocks were released\n", n);
		/* Idle streams still tell subscribers their epoch and next seq. */
		if (nng_clock() - last_tick >= 1000) {
			kvpd_server_tick(r->srv);
			last_tick = nng_clock();
		}
	}
}

int
main(int argc, char **argv, char **envp)
{
	struct kvpd_config cfg;
	struct kvpd_server *srv = NULL;
	struct kvpd_transport *tr = NULL;
	struct kvpd_admin *admin = NULL;
	struct kvpd_vllm *vllm = NULL;
	nng_thread *reaper_thr = NULL;
	char err[512] = "";
	sigset_t sigs;
	int sig = 0, rv;

	rv = kvpd_config_load(&cfg, argc, argv, envp, stdout, stderr);
	if (rv != 0)
		return rv > 0 ? 0 : 2;
	if (!cfg.quiet) {
		printf("kvpoold: effective configuration\n");
		kvpd_config_print(&cfg, stdout);
	}
	/* Block the stop signals in every thread (nng's inherit this mask) and
	 * take them synchronously below. */
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGINT);
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);

	if ((rv = kvpd_server_create(&cfg, &srv, err, sizeof(err))) != KVP_OK) {
		fprintf(stderr, "kvpoold: %s\n", err);
		return 1;
	}
	for (size_t i = 0; i < kvpd_server_num_pools(srv); i++)
		printf("kvpoold: pool %s: %s\n", kvpd_server_pool_name(srv, i),
		       kvpd_server_pool_note(srv, i));
	/* The vLLM wire first, so it carries the batches of the very first call. */
	if ((rv = kvpd_vllm_open(srv, &cfg, &vllm, err, sizeof(err))) != KVP_OK) {
		fprintf(stderr, "kvpoold: %s\n", err);
		kvpd_server_destroy(srv);
		return 1;
	}
	if ((rv = kvpd_transport_open(srv, &cfg, &tr, err, sizeof(err))) != KVP_OK) {
		fprintf(stderr, "kvpoold: %s\n", err);
		kvpd_vllm_close(vllm);
		kvpd_server_destroy(srv);
		return 1;
	}
	if (cfg.admin[0] != '\0' &&
	    kvpd_admin_open(srv, cfg.admin, &ready, &admin, err, sizeof(err)) != KVP_OK) {
		fprintf(stderr, "kvpoold: %s\n", err);
		kvpd_transport_close(tr, 0);
		kvpd_vllm_close(vllm);
		kvpd_server_destroy(srv);
		return 1;
	}
	struct reaper r = {.srv = srv, .period_ms = cfg.lease_ms / 4 ? cfg.lease_ms / 4 : 25};
	if (r.period_ms > 250)
		r.period_ms = 250; /* also the tick's resolution */
	if (nng_thread_create(&reaper_thr, reaper_main, &r) != 0) {
		fprintf(stderr, "kvpoold: cannot start the lease reaper\n");
		kvpd_admin_close(admin);
		kvpd_transport_close(tr, 0);
		kvpd_vllm_close(vllm);
		kvpd_server_destroy(srv);
		return 1;
	}
	atomic_store(&ready, true);
	printf("kvpoold: ready: %zu pool(s) on", cfg.num_pools);
	for (size_t i = 0; i < cfg.num_rpc; i++)
		printf(" %s", cfg.rpc[i]);
	if (admin)
		printf(", admin %s", cfg.admin);
	if (vllm)
		printf(", vLLM events %s%s%s", cfg.vllm.endpoint, cfg.vllm.replay[0] ? " replay " : "",
		       cfg.vllm.replay);
	printf("\n");
	fflush(stdout);

	sigwait(&sigs, &sig);
	printf("kvpoold: %s: draining (up to %u ms)\n", sig == SIGTERM ? "SIGTERM" : "SIGINT",
	       cfg.drain_ms);
	fflush(stdout);
	atomic_store(&ready, false); /* /readyz turns 503 while draining */
	kvpd_transport_close(tr, cfg.drain_ms);
	kvpd_admin_close(admin);
	atomic_store(&stopping, true);
	nng_thread_destroy(reaper_thr);
	kvpd_vllm_close(vllm); /* after the reaper: expiries publish too */
	char detail[256] = "";
	rv = kvpd_server_check(srv, detail, sizeof(detail));
	kvpd_server_destroy(srv);
	if (rv != KVP_OK) {
		fprintf(stderr, "kvpoold: invariant broken at exit: %s\n", detail);
		return 1;
	}
	printf("kvpoold: stopped cleanly\n");
	return 0;
}
