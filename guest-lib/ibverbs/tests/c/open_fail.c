/*
 * A refused ibv_open_device and the objects of the context that is open
 * (tests/open_fail.rs runs it, the device being a vrnic function behind a
 * vhost-user socket, VRNIC_VHOST_USER, which takes one frontend, one
 * process, at a time): ibv_open_device(NULL) is NULL with EINVAL; a second
 * open in this process succeeds (a device context of its own on the
 * process's connection) and its close leaves the first context working;
 * an open in another process (a child) is NULL with ENODEV and leaves the
 * first context working too; then, as pyverbs does after opens and
 * closes, the first context's MRs on small posix_memalign'd heap buffers
 * (pages malloc shares with other chunks) are deregistered: the buffers,
 * the heap chunks beside them and malloc's own bookkeeping must be intact
 * (free() of each, no abort), and the context, PD and list are released.
 * Prints "open_fail: ok" and exits 0, or names the failed step and exits 1
 * (or dies, which the test reports).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <infiniband/verbs.h>
#include "check.h"


/* Fills p[0..n) with a pattern of seed. */
static void fill(unsigned char *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (unsigned char)(i * 131 + seed);
}

/* Whether p[0..n) still holds the pattern of seed. */
static int intact(const unsigned char *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != (unsigned char)(i * 131 + seed))
			return 0;
	return 1;
}

int main(void)
{
	struct ibv_device **list = one_device_list();

	errno = 0;
	CHECK(!ibv_open_device(NULL) && errno == EINVAL,
	      "ibv_open_device(NULL): want NULL with EINVAL, errno %d", errno);

	struct ibv_context *ctx = ibv_open_device(list[0]);
	CHECK(ctx, "first ibv_open_device: errno %d", errno);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd, "ibv_alloc_pd: errno %d", errno);

	/* A second open in this process: a context of its own. */
	struct ibv_context *again = ibv_open_device(list[0]);
	CHECK(again && again != ctx, "second ibv_open_device: errno %d", errno);
	struct ibv_device_attr attr;
	CHECK(ibv_query_device(again, &attr) == 0, "ibv_query_device on the second context");
	struct ibv_pd *pd2 = ibv_alloc_pd(again);
	CHECK(pd2, "ibv_alloc_pd on the second context: errno %d", errno);
	CHECK(ibv_dealloc_pd(pd2) == 0 && ibv_close_device(again) == 0, "closing the second context");
	CHECK(ibv_query_device(ctx, &attr) == 0, "the first context after the second closed");

	/* Another process: the function serves this one, so it is refused. */
	fflush(NULL);
	pid_t child = fork();
	CHECK(child >= 0, "fork: errno %d", errno);
	if (child == 0) {
		errno = 0;
		struct ibv_context *other = ibv_open_device(list[0]);
		_exit(!other && errno == ENODEV ? 0 : other ? 2 : 3);
	}
	int st = 0;
	CHECK(waitpid(child, &st, 0) == child, "waitpid: errno %d", errno);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0,
	      "ibv_open_device in a child: want NULL with ENODEV (child status %#x)", st);
	CHECK(ibv_query_device(ctx, &attr) == 0, "the first context after the refused open");

	/*
	 * Rounds of pyverbs' MR: a 64-byte posix_memalign'd buffer at the
	 * start of a heap page whose rest malloc hands out (free space left
	 * by the hole, a neighbour chunk), registered and deregistered.
	 */
	for (unsigned round = 0; round < 8; round++) {
		void *hole = malloc(32 * 1024);
		void *guard = malloc(16);
		CHECK(hole && guard, "malloc");
		free(hole);
		void *buf = NULL;
		CHECK(posix_memalign(&buf, 4096, 64) == 0, "posix_memalign");
		unsigned char *next = malloc(200);
		CHECK(next, "malloc");
		fill(buf, 64, round);
		fill(next, 200, round + 100);
		struct ibv_mr *mr = ibv_reg_mr(pd, buf, 64, IBV_ACCESS_LOCAL_WRITE);
		CHECK(mr, "round %u: ibv_reg_mr: errno %d", round, errno);
		CHECK(ibv_dereg_mr(mr) == 0, "round %u: ibv_dereg_mr", round);
		CHECK(intact(buf, 64, round), "round %u: the MR's buffer changed", round);
		CHECK(intact(next, 200, round + 100),
		      "round %u: the heap chunk beside the MR changed", round);
		/* malloc's chunk headers in that page must have survived too. */
		free(next);
		free(buf);
		free(guard);
		void *churn[64];
		for (int i = 0; i < 64; i++)
			CHECK(churn[i] = malloc(16 + 97 * i), "malloc");
		for (int i = 0; i < 64; i++)
			free(churn[i]);
	}

	CHECK(ibv_dealloc_pd(pd) == 0, "ibv_dealloc_pd");
	CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
	ibv_free_device_list(list);
	printf("open_fail: ok\n");
	return 0;
}
