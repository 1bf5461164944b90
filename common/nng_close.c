/* SPDX-License-Identifier: Apache-2.0 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, pthread_condattr_setclock */
#include "common/nng_close.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

/* Shared by the caller and the closing thread; the last of the two frees it. */
struct closer {
	nng_socket sock;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool done;      /* nng_close returned */
	bool abandoned; /* the caller stopped waiting: the thread calls then */
	int refs;
	void (*then)(void *);
	void *arg;
};

static void
closer_unref(struct closer *c)
{
	/* Called with c->mu held; releases it. */
	bool last = --c->refs == 0;
	pthread_mutex_unlock(&c->mu);
	if (last) {
		pthread_cond_destroy(&c->cv);
		pthread_mutex_destroy(&c->mu);
		free(c);
	}
}

static void *
closer_main(void *arg)
{
	struct closer *c = arg;
	nng_close(c->sock);
	pthread_mutex_lock(&c->mu);
	c->done = true;
	pthread_cond_signal(&c->cv);
	if (c->abandoned && c->then != NULL) {
		void (*then)(void *) = c->then;
		void *targ = c->arg;
		closer_unref(c);
		then(targ);
		return NULL;
	}
	closer_unref(c);
	return NULL;
}

bool
kvp_nng_close_bounded(nng_socket s, int grace_ms, void (*then)(void *), void *arg)
{
	struct closer *c = calloc(1, sizeof(*c));
	pthread_condattr_t ca;
	pthread_attr_t ta;
	pthread_t thr;

	if (grace_ms < 0)
		grace_ms = 0;
	if (c == NULL)
		goto inline_close;
	if (pthread_mutex_init(&c->mu, NULL) != 0) {
		free(c);
		goto inline_close;
	}
	if (pthread_condattr_init(&ca) != 0) {
		pthread_mutex_destroy(&c->mu);
		free(c);
		goto inline_close;
	}
	int crv = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	if (crv == 0)
		crv = pthread_cond_init(&c->cv, &ca);
	pthread_condattr_destroy(&ca);
	if (crv != 0) {
		pthread_mutex_destroy(&c->mu);
		free(c);
		goto inline_close;
	}
	c->sock = s;
	c->refs = 2;
	c->then = then;
	c->arg = arg;
	if (pthread_attr_init(&ta) != 0) {
		pthread_cond_destroy(&c->cv);
		pthread_mutex_destroy(&c->mu);
		free(c);
		goto inline_close;
	}
	(void)pthread_attr_setdetachstate(&ta, PTHREAD_CREATE_DETACHED);
	int rv = pthread_create(&thr, &ta, closer_main, c);
	pthread_attr_destroy(&ta);
	if (rv != 0) {
		pthread_cond_destroy(&c->cv);
		pthread_mutex_destroy(&c->mu);
		free(c);
		goto inline_close;
	}

	struct timespec until;
	clock_gettime(CLOCK_MONOTONIC, &until);
	until.tv_sec += grace_ms / 1000;
	until.tv_nsec += (long)(grace_ms % 1000) * 1000000L;
	if (until.tv_nsec >= 1000000000L) {
		until.tv_sec++;
		until.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&c->mu);
	while (!c->done && pthread_cond_timedwait(&c->cv, &c->mu, &until) != ETIMEDOUT)
		;
	bool done = c->done;
	c->abandoned = !done;
	closer_unref(c);
	return done;

inline_close:
	nng_close(s);
	return true;
}
