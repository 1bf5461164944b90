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
#include <sys/stat.h>
#include <unistd.h>

#include "service/net/admin.h"
#include "service/config/config.h"
#include "common/kvp_status.h"
#include "common/kvp_version.h"
#include "service/net/fdlimit.h"
#include "service/net/memtune.h"
#include "service/log.h"
#include "service/pool/server.h"
#include "service/net/transport.h"
#include "service/streams/vllm_pub.h"

static atomic_bool stopping;
static atomic_bool ready;

struct reaper {
	struct kvpd_server *srv;
	uint32_t period_ms;
	uint64_t gone_seen[KVPD_MAX_POOLS]; /* sessions ended so far, per pool */
};

/* Logs the sessions that ended since last time: expiries at info, the rest at debug. */
static void
log_gone(struct reaper *r)
{
	for (size_t i = 0; i < kvpd_server_num_pools(r->srv); i++) {
		struct kvpd_gone_session g[16];
		size_t n;
		while ((n = kvpd_server_gone(r->srv, i, &r->gone_seen[i], g, 16)) > 0) {
			for (size_t k = 0; k < n; k++) {
				char id[24], refs[24], reqs[24], lease[24];
				snprintf(id, sizeof(id), "%llu", (unsigned long long)g[k].id);
				snprintf(refs, sizeof(refs), "%llu", (unsigned long long)g[k].released);
				snprintf(reqs, sizeof(reqs), "%u", g[k].requests);
				snprintf(lease, sizeof(lease), "%u", g[k].lease_ms);
				struct kvpd_log_field f[] = {
					{"pool", kvpd_server_pool_name(r->srv, i)}, {"session", id},
					{"client", g[k].client}, {"lease_ms", lease},
					{"references_released", refs}, {"requests_ended", reqs}};
				bool expired = g[k].why == KVPD_GONE_EXPIRED;
				kvpd_log_fields(expired ? KVPD_INFO : KVPD_DEBUG, "session",
				                expired ? "lease expired; session ended and its blocks "
				                          "released"
				                        : "session ended",
				                f, sizeof(f) / sizeof(f[0]));
			}
		}
	}
}

/*
 * The effective configuration as one record, a field per setting (a
 * repeated setting, such as pool, is one field per value, numbered).
 */
static void
log_config(const struct kvpd_config *cfg)
{
	char *text = NULL, *save = NULL;
	size_t len = 0, n = 0;
	FILE *mem = open_memstream(&text, &len);
	if (mem == NULL)
		return;
	kvpd_config_print(cfg, mem);
	fclose(mem);
	struct kvpd_log_field f[128];
	char names[128][64];
	for (char *line = strtok_r(text, "\n", &save); line && n < 128;
	     line = strtok_r(NULL, "\n", &save)) {
		char *eq = strstr(line, " = ");
		if (eq == NULL)
			continue;
		*eq = '\0';
		size_t seen = 0;
		for (size_t i = 0; i < n; i++)
			seen += strncmp(names[i], line, strlen(line)) == 0 &&
			        (names[i][strlen(line)] == '\0' || names[i][strlen(line)] == '.');
		if (seen == 0)
			snprintf(names[n], sizeof(names[n]), "%.40s", line);
		else
			snprintf(names[n], sizeof(names[n]), "%.40s.%u", line, (unsigned)(seen % 1000));
		f[n] = (struct kvpd_log_field){names[n], eq + 3};
		n++;
	}
	kvpd_log_fields(KVPD_INFO, "config", "effective configuration", f, n);
	free(text);
}

/*
 * A configuration that did not load: its messages (errs, one a line) go to
 * stderr as they are, or, when the configuration asks for JSON logs (as far
 * as it parses), as error log lines the cluster's pipeline can read.
 */
static void
report_config_errors(int argc, char **argv, char **envp, const char *errs, bool check)
{
	if (errs == NULL || errs[0] == '\0')
		return;
	if (check || kvpd_config_log_format(argc, argv, envp) != KVPD_LOG_JSON) {
		fputs(errs, stderr);
		return;
	}
	kvpd_log_setup(stderr, KVPD_ERROR, KVPD_LOG_JSON);
	for (const char *l = errs; *l != '\0';) {
		char text[1024];
		size_t len = 0;
		/* One message, and the "(at FILE:LINE)" line that may follow it. */
		do {
			size_t n = strcspn(l, "\n");
			const char *t = strncmp(l, "kvpoold: ", 9) == 0 ? l + 9 : l;
			int k = snprintf(text + len, sizeof(text) - len, "%s%.*s", len ? " " : "",
			                 (int)(n - (size_t)(t - l)), t);
			if (k > 0)
				len += (size_t)k < sizeof(text) - len ? (size_t)k : sizeof(text) - 1 - len;
			l += n + (l[n] == '\n');
		} while (strncmp(l, "kvpoold: (at ", 13) == 0);
		struct kvpd_log_field f[] = {{"error", text}};
		kvpd_log_fields(KVPD_ERROR, "config", "invalid configuration", f, 1);
	}
}

static int
fail(const char *what, const char *err)
{
	struct kvpd_log_field f[] = {{"error", err}};
	kvpd_log_fields(KVPD_ERROR, "main", what, f, 1);
	return 1;
}

/* Ends expired sessions a few times per lease; publishes the streams' ticks. */
static void
reaper_main(void *arg)
{
	struct reaper *r = arg;
	nng_time last_tick = nng_clock();
	struct kvpd_fd_watch fds = {0};
	while (!atomic_load(&stopping)) {
		for (uint32_t t = 0; t < r->period_ms && !atomic_load(&stopping); t += 20)
			nng_msleep(20);
		(void)kvpd_server_expire(r->srv, nng_clock());
		log_gone(r);
		/* Warm pools' rows committed without a CRC get one (about 50 ms of reading at most). */
		(void)kvpd_server_keep_sweep(r->srv, 512u << 20);
		/* Idle streams still tell subscribers their epoch and next seq. */
		if (nng_clock() - last_tick >= 1000) {
			kvpd_server_tick(r->srv);
			kvpd_fd_check(&fds, nng_clock());
			last_tick = nng_clock();
		}
	}
}

static void
log_starting(void)
{
	char pid[24];
	snprintf(pid, sizeof(pid), "%d", (int)getpid());
	struct kvpd_log_field f[] = {
		{"version", KVP_VERSION}, {"commit", KVP_GIT_COMMIT}, {"pid", pid}};
	kvpd_log_fields(KVPD_INFO, "main", "starting", f, 3);
}

static void
log_ready(const struct kvpd_config *cfg, bool admin, bool vllm)
{
	char pools[24], rpc[2048] = "";
	size_t k = 0;
	snprintf(pools, sizeof(pools), "%zu", cfg->num_pools);
	for (size_t i = 0; i < cfg->num_rpc && k < sizeof(rpc); i++)
		k += (size_t)snprintf(rpc + k, sizeof(rpc) - k, "%s%s", i ? " " : "", cfg->rpc[i]);
	struct kvpd_log_field f[] = {
		{"pools", pools}, {"rpc", rpc}, {"events", cfg->events[0] ? cfg->events : "none"},
		{"admin", admin ? cfg->admin : "none"},
		{"vllm_events", vllm ? cfg->vllm.endpoint : "none"},
		{"vllm_replay", vllm && cfg->vllm.replay[0] ? cfg->vllm.replay : "none"}};
	kvpd_log_fields(KVPD_INFO, "main", "ready", f, sizeof(f) / sizeof(f[0]));
}

static void
log_draining(int sig, uint32_t drain_ms)
{
	char drain[24];
	snprintf(drain, sizeof(drain), "%u", drain_ms);
	struct kvpd_log_field f[] = {{"signal", sig == SIGTERM ? "SIGTERM" : "SIGINT"},
	                             {"drain_ms", drain}};
	kvpd_log_fields(KVPD_INFO, "main", "draining", f, 2);
}

/* SIGHUP (logs go to stderr: nothing to reopen) and SIGUSR1/2 do nothing but this. */
static void
log_ignored(int sig)
{
	struct kvpd_log_field f[] = {
		{"signal", sig == SIGHUP ? "SIGHUP" : sig == SIGUSR1 ? "SIGUSR1" : "SIGUSR2"}};
	kvpd_log_fields(KVPD_INFO, "main", "signal ignored (SIGTERM or SIGINT stops)", f, 1);
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

	/* Messages are held until it is known how to log them (text or JSON). */
	char *errs = NULL;
	size_t errs_len = 0;
	FILE *errf = open_memstream(&errs, &errs_len);
	rv = kvpd_config_load(&cfg, argc, argv, envp, stdout, errf != NULL ? errf : stderr);
	if (errf != NULL)
		fclose(errf);
	if (rv < 0)
		report_config_errors(argc, argv, envp, errs, cfg.check_config);
	else if (errs != NULL)
		fputs(errs, stderr);
	free(errs);
	if (rv != 0)
		return rv > 0 ? 0 : 2;
	if (cfg.check_config) {
		printf("kvpoold: the configuration is good; it would run with:\n");
		kvpd_config_print(&cfg, stdout);
		return 0;
	}
	kvpd_log_setup(stderr, (enum kvpd_log_level)cfg.log_level,
	               (enum kvpd_log_format)cfg.log_format);
	log_starting();
	kvpd_fd_raise();
	kvpd_malloc_tune();
	if (cfg.token_in_argv)
		kvpd_log_fields(KVPD_WARN, "config",
		                "--token shows in the process list to every local user; use "
		                "--token-file (or KVPOOL_TOKEN_FILE)", NULL, 0);
	if (!cfg.quiet)
		log_config(&cfg);
	/* Block the stop signals in every thread (nng's inherit this mask) and
	 * take them synchronously below; SIGHUP and SIGUSR1/2, whose default
	 * action would end the daemon without a drain, are taken and ignored. */
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGINT);
	sigaddset(&sigs, SIGHUP);
	sigaddset(&sigs, SIGUSR1);
	sigaddset(&sigs, SIGUSR2);
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);

	if ((rv = kvpd_server_create(&cfg, &srv, err, sizeof(err))) != KVP_OK)
		return fail("cannot create the pools", err);
	for (size_t i = 0; i < kvpd_server_num_pools(srv); i++) {
		struct kvpd_log_field f[] = {{"pool", kvpd_server_pool_name(srv, i)},
		                             {"executor", kvpd_server_pool_note(srv, i)}};
		kvpd_log_fields(KVPD_INFO, "pool", "pool created", f, 2);
	}
	/* The sockets bound from here on get ipc-mode exactly (no window with
	 * looser permissions); only this thread creates files meanwhile. */
	mode_t old_mask = umask((mode_t)(~cfg.ipc_mode & 0777));
	/* The vLLM wire first, so it carries the batches of the very first call. */
	if ((rv = kvpd_vllm_open(srv, &cfg, &vllm, err, sizeof(err))) != KVP_OK) {
		kvpd_server_destroy(srv);
		return fail("cannot open the vLLM event wire", err);
	}
	if ((rv = kvpd_transport_open(srv, &cfg, &tr, err, sizeof(err))) != KVP_OK) {
		kvpd_vllm_close(vllm);
		kvpd_server_destroy(srv);
		return fail("cannot listen", err);
	}
	umask(old_mask);
	if (cfg.admin[0] != '\0' &&
	    kvpd_admin_open(srv, cfg.admin, &ready, &admin, err, sizeof(err)) != KVP_OK) {
		kvpd_transport_close(tr, 0);
		kvpd_vllm_close(vllm);
		kvpd_server_destroy(srv);
		return fail("cannot open the admin endpoint", err);
	}
	struct reaper r = {.srv = srv, .period_ms = cfg.lease_ms / 4 ? cfg.lease_ms / 4 : 25};
	if (r.period_ms > 250)
		r.period_ms = 250; /* also the tick's resolution */
	if (nng_thread_create(&reaper_thr, reaper_main, &r) != 0) {
		kvpd_admin_close(admin);
		kvpd_transport_close(tr, 0);
		kvpd_vllm_close(vllm);
		kvpd_server_destroy(srv);
		return fail("cannot start the lease reaper", "out of threads");
	}
	atomic_store(&ready, true);
	log_ready(&cfg, admin != NULL, vllm != NULL);

	for (;;) {
		if (sigwait(&sigs, &sig) != 0)
			continue;
		if (sig == SIGTERM || sig == SIGINT)
			break;
		log_ignored(sig);
	}
	log_draining(sig, cfg.drain_ms);
	atomic_store(&ready, false); /* /readyz turns 503 while draining */
	kvpd_transport_close(tr, cfg.drain_ms);
	kvpd_admin_close(admin);
	atomic_store(&stopping, true);
	nng_thread_destroy(reaper_thr);
	kvpd_vllm_close(vllm); /* after the reaper: expiries publish too */
	log_gone(&r);
	/* A warm pool's rows committed without a CRC get one now, so a clean stop keeps them all. */
	(void)kvpd_server_keep_sweep(srv, UINT64_MAX);
	char detail[256] = "";
	rv = kvpd_server_check(srv, detail, sizeof(detail));
	kvpd_server_destroy(srv);
	if (rv != KVP_OK)
		return fail("invariant broken at exit", detail);
	kvpd_log_fields(KVPD_INFO, "main", "stopped cleanly", NULL, 0);
	return 0;
}
