/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A program outside the tree, built against an installed libkvpool (by
 * check_install.sh, with pkg-config, find_package and the archive): it
 * dials a running kvpoold, allocates, reads the stats and frees.
 * usage: consumer URL POOL
 */
#include <stdio.h>

#include "clients/c/kvpool.h"

int
main(int argc, char **argv)
{
	struct kvp_client *c = NULL;
	struct kvp_client_stats st;
	int32_t ids[4];
	int rv = KVP_EBUSY;
	if (argc != 3) {
		fprintf(stderr, "usage: consumer URL POOL\n");
		return 2;
	}
	struct kvp_client_options o = {.url = argv[1], .pool = argv[2], .timeout_ms = 2000};
	for (int i = 0; i < 50 && rv != KVP_OK; i++) /* the daemon may still be starting */
		rv = kvp_client_open(&o, &c);
	if (rv != KVP_OK) {
		fprintf(stderr, "consumer: open: %s\n", kvp_status_name(rv));
		return 1;
	}
	if ((rv = kvp_client_allocate(c, 4, ids)) != KVP_OK ||
	    (rv = kvp_client_stats(c, &st)) != KVP_OK) {
		fprintf(stderr, "consumer: %s: %s\n", kvp_status_name(rv), kvp_client_last_detail(c));
		kvp_client_close(c);
		return 1;
	}
	printf("consumer: kvpoold %s, pool %s: %u of %u blocks free after allocating 4\n",
	       kvp_client_info(c)->server_version, argv[2], st.num_free, st.num_blocks);
	rv = kvp_client_free(c, ids, 4);
	kvp_client_close(c);
	return rv == KVP_OK && st.num_free + 4 == st.num_blocks - 1 ? 0 : 1;
}
