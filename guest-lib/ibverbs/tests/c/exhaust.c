/*
 * Out of resources under the C ABI (issue 30 point 2; tests/open_fail.rs
 * runs it on a vrnic function behind VRNIC_VHOST_USER): for each kind of
 * object with a device-wide count in ibv_query_device (PDs, MRs, CQs, QPs,
 * SRQs, AHs) it creates objects until a create fails and checks that
 *
 *  - exactly the advertised maximum was created (vrnic has no kernel
 *    consumer holding some of them; on rxe the kernel's MAD layer holds a
 *    PD, a CQ and QP1 from the same pools, ib_mad_port_open, so a program
 *    gets fewer);
 *  - the failing create is NULL with errno ENOMEM, and so is the next;
 *  - destroying one makes room for exactly one more;
 *  - all of them destroy.
 *
 * The same for the device's budget of ring entries, SQ + RQ + SRQ of all
 * QPs and SRQs together (vrnic's `max_total_wr`, not in ibv_device_attr:
 * the test passes it in VRNIC_TEST_MAX_TOTAL_WR): QPs of max_qp_wr send
 * and receive entries until the budget is spent.
 *
 * The library's own DMA memory, which it shares with the daemon (the
 * rings and records of CQs, QPs and SRQs; VRNIC_TEST_DMA_BYTES, 16 GiB),
 * cannot run out with live objects inside the device's limits (1024 CQs of
 * max_cqe entries take 2 GiB), but it did by churn: it was never given
 * back before the context closed, and after 4095 creates and destroys of
 * a CQ of max_cqe entries every create failed with ENOMEM though no CQ
 * was alive. So CQs of max_cqe entries, and QPs of max_qp_wr entries of
 * max_sge SGEs, are created and destroyed until more than the whole memory
 * went through them: every create must succeed.
 *
 * Then the context still works (a CQ, a QP moved to INIT, a receive
 * posted, all destroyed), a second context of the same device sees the
 * same device-wide limit while the first holds every QP and gets room once
 * they are gone, and the process lives. With the argument "again" (a
 * second process on the same function) only the limits are checked, and
 * the context's small work: the daemon freed what the first process had.
 * Prints "exhaust: ok" and exits 0, or names the failed step and exits 1
 * (or dies, which the test reports).
 *
 * Which errno. Linux rxe counts every kind of object in a pool
 * (rxe_pool.c): __rxe_add_to_pool fails once num_elem would pass
 * max_elem, with -EINVAL in today's kernels (since the pools moved to an
 * xarray; before, rxe_alloc returned NULL and its callers, e.g.
 * rxe_reg_user_mr, -ENOMEM), and ib_uverbs hands the driver's error to
 * the provider, whose create returns NULL with it as errno. Hardware
 * answers ENOMEM: mlx5's firmware says "limits exceeded"
 * (MLX5_CMD_STAT_LIM_ERR), which cmd_status_to_err (mlx5 core cmd.c)
 * turns into -ENOMEM for ib_uverbs to hand on. vrnic answers ENOMEM
 * (STATUS_ENOMEM, device spec §5.x.6.2) for a device-wide count or budget
 * and keeps EINVAL for one object past its own maximum (create_fail.c):
 * the two failures stay apart, and ENOMEM is what the verbs' errno lists
 * give for "Not enough resources to complete this operation".
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include "check.h"


static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static char buf[4096] __attribute__((aligned(4096)));

typedef void *(*create_fn)(void);
typedef int (*destroy_fn)(void *);

/*
 * Creates with `create` until it fails; checks that `max` were created and
 * the failure is ENOMEM, that one destroyed makes room for one more, and
 * destroys them all. Returns the objects' count.
 */
static int exhaust(const char *what, int max, create_fn create, destroy_fn destroy)
{
	void **objs = calloc((size_t)max + 1, sizeof(*objs));
	CHECK(objs, "calloc");
	int n = 0;
	for (;;) {
		errno = 0;
		void *o = create();
		if (!o)
			break;
		objs[n++] = o;
		CHECK(n <= max, "%s: %d created, past the advertised maximum %d", what, n, max);
	}
	int e = errno;
	CHECK(n == max, "%s: the create after %d failed (errno %d, %s); the device advertises %d",
	      what, n, e, strerror(e), max);
	CHECK(e == ENOMEM, "%s: the create past %d: want errno ENOMEM, got %d (%s)", what, max, e,
	      strerror(e));
	errno = 0;
	void *again = create();
	CHECK(!again && errno == ENOMEM, "%s: a second create past %d: want NULL with ENOMEM, got %p errno %d",
	      what, max, again, errno);
	/* One destroyed (from the middle): room for exactly one. */
	int k = max / 2;
	RETURNS(destroy(objs[k]), 0);
	objs[k] = create();
	CHECK(objs[k], "%s: a create after a destroy at the maximum: errno %d (%s)", what, errno,
	      strerror(errno));
	errno = 0;
	again = create();
	CHECK(!again && errno == ENOMEM, "%s: past %d again: want NULL with ENOMEM, got %p errno %d", what,
	      max, again, errno);
	for (int i = 0; i < n; i++)
		RETURNS(destroy(objs[i]), 0);
	free(objs);
	return n;
}

static void *new_pd(void) { return ibv_alloc_pd(ctx); }
static int free_pd(void *o) { return ibv_dealloc_pd(o); }

static void *new_mr(void) { return ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE); }
static int free_mr(void *o) { return ibv_dereg_mr(o); }

static void *new_cq(void) { return ibv_create_cq(ctx, 1, NULL, NULL, 0); }
static int free_cq(void *o) { return ibv_destroy_cq(o); }

static uint32_t qp_wr = 1;
static void *new_qp(void)
{
	struct ibv_qp_init_attr ia = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = qp_wr, .max_recv_wr = qp_wr, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	return ibv_create_qp(pd, &ia);
}
static int free_qp(void *o) { return ibv_destroy_qp(o); }

static void *new_srq(void)
{
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = 1, .max_sge = 1 } };
	return ibv_create_srq(pd, &sa);
}
static int free_srq(void *o) { return ibv_destroy_srq(o); }

static void *new_ah(void)
{
	struct ibv_ah_attr aa = { .is_global = 1, .port_num = 1,
		.grh = { .sgid_index = 1, .hop_limit = 64 } };
	/* ::ffff:10.0.0.2, a peer on the function's subnet. */
	aa.grh.dgid.raw[10] = 0xff;
	aa.grh.dgid.raw[11] = 0xff;
	uint32_t ip = htonl(0x0a000002);
	memcpy(&aa.grh.dgid.raw[12], &ip, 4);
	return ibv_create_ah(pd, &aa);
}
static int free_ah(void *o) { return ibv_destroy_ah(o); }

/* An RC QP on CQ `q` in PD `p`, moved to INIT, a receive posted: the context works. */
static void small_work(struct ibv_pd *p, struct ibv_cq *q)
{
	struct ibv_qp_init_attr ia = {
		.send_cq = q, .recv_cq = q, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct ibv_qp *qp = ibv_create_qp(p, &ia);
	CHECK(qp, "ibv_create_qp after the limits: errno %d", errno);
	struct ibv_qp_attr init = { .qp_state = IBV_QPS_INIT, .port_num = 1,
		.qp_access_flags = IBV_ACCESS_LOCAL_WRITE };
	RETURNS(ibv_modify_qp(qp, &init, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), 0);
	struct ibv_mr *mr = ibv_reg_mr(p, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr, "ibv_reg_mr after the limits: errno %d", errno);
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 64, .lkey = mr->lkey };
	struct ibv_recv_wr rwr = { .sg_list = &sge, .num_sge = 1 }, *bad;
	RETURNS(ibv_post_recv(qp, &rwr, &bad), 0);
	RETURNS(ibv_destroy_qp(qp), 0);
	RETURNS(ibv_dereg_mr(mr), 0);
}

int main(int argc, char **argv)
{
	/* "again": a second process on the same function, after this one. */
	int again = argc > 1 && strcmp(argv[1], "again") == 0;
	struct ibv_device **list = one_device_list();
	ctx = ibv_open_device(list[0]);
	CHECK(ctx, "ibv_open_device: errno %d", errno);
	struct ibv_device_attr da;
	RETURNS(ibv_query_device(ctx, &da), 0);
	const char *tw = getenv("VRNIC_TEST_MAX_TOTAL_WR");
	CHECK(tw, "VRNIC_TEST_MAX_TOTAL_WR is not set");
	long max_total_wr = strtol(tw, NULL, 0);
	fprintf(stderr, "exhaust: max_pd %d max_mr %d max_cq %d max_qp %d max_srq %d max_ah %d "
		"max_qp_wr %d max_total_wr %ld\n", da.max_pd, da.max_mr, da.max_cq, da.max_qp,
		da.max_srq, da.max_ah, da.max_qp_wr, max_total_wr);

	/* PDs first, none other alive. */
	exhaust("PD", da.max_pd, new_pd, free_pd);
	pd = ibv_alloc_pd(ctx);
	CHECK(pd, "ibv_alloc_pd: errno %d", errno);
	exhaust("MR", da.max_mr, new_mr, free_mr);
	exhaust("CQ", da.max_cq, new_cq, free_cq);
	cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	CHECK(cq, "ibv_create_cq: errno %d", errno);
	exhaust("QP", da.max_qp, new_qp, free_qp);
	exhaust("SRQ", da.max_srq, new_srq, free_srq);
	exhaust("AH", da.max_ah, new_ah, free_ah);
	/* The ring budget: QPs of the largest SQ and RQ. */
	qp_wr = (uint32_t)da.max_qp_wr;
	exhaust("QP of max_qp_wr entries", (int)(max_total_wr / (2L * da.max_qp_wr)), new_qp, free_qp);
	qp_wr = 1;

	/* The rest once: a second run checks the limits only. */
	if (again)
		goto done;

	/* Churn: more than the library's DMA memory through CQs and QPs. */
	const char *db = getenv("VRNIC_TEST_DMA_BYTES");
	CHECK(db, "VRNIC_TEST_DMA_BYTES is not set");
	long long dma_bytes = strtoll(db, NULL, 0);
	long long cq_bytes = 32LL * da.max_cqe; /* a CQE is 32 bytes */
	for (long long i = 0, n = dma_bytes / cq_bytes + 16; i < n; i++) {
		struct ibv_cq *big = ibv_create_cq(ctx, da.max_cqe, NULL, NULL, 0);
		CHECK(big, "CQ of %d entries, create %lld of %lld (none alive): errno %d (%s)", da.max_cqe,
		      i, n, errno, strerror(errno));
		RETURNS(ibv_destroy_cq(big), 0);
	}
	/* QPs of the largest rings: a WQE of max_sge SGEs is at least 16 bytes
	 * of header and 16 per SGE, in the SQ and in the RQ. One
	 * ibv_qp_init_attr for all, as programs do: ibv_create_qp(3) writes
	 * the granted capabilities into it, and they must be granted again. */
	struct ibv_qp_init_attr big_qp = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = da.max_qp_wr, .max_recv_wr = da.max_qp_wr,
			 .max_send_sge = da.max_sge, .max_recv_sge = da.max_sge },
	};
	long long qp_bytes = 2LL * da.max_qp_wr * (16 + 16LL * da.max_sge);
	for (long long i = 0, n = dma_bytes / qp_bytes + 16; i < n; i++) {
		struct ibv_qp *big = ibv_create_qp(pd, &big_qp);
		CHECK(big, "QP of %d entries and %d SGEs, create %lld of %lld (none alive): errno %d (%s)",
		      da.max_qp_wr, da.max_sge, i, n, errno, strerror(errno));
		RETURNS(ibv_destroy_qp(big), 0);
	}

	/* The context works on. */
	small_work(pd, cq);

	/* A second context of the device: its limits are the device's. */
	struct ibv_context *ctx2 = ibv_open_device(list[0]);
	CHECK(ctx2, "a second ibv_open_device: errno %d", errno);
	struct ibv_pd *pd2 = ibv_alloc_pd(ctx2);
	CHECK(pd2, "ibv_alloc_pd on the second context: errno %d", errno);
	struct ibv_cq *cq2 = ibv_create_cq(ctx2, 16, NULL, NULL, 0);
	CHECK(cq2, "ibv_create_cq on the second context: errno %d", errno);
	struct ibv_qp **qps = calloc((size_t)da.max_qp, sizeof(*qps));
	CHECK(qps, "calloc");
	for (int i = 0; i < da.max_qp; i++) {
		qps[i] = new_qp();
		CHECK(qps[i], "QP %d of %d: errno %d", i, da.max_qp, errno);
	}
	struct ibv_qp_init_attr ia2 = {
		.send_cq = cq2, .recv_cq = cq2, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	REFUSED(ibv_create_qp(pd2, &ia2), ENOMEM);
	for (int i = 0; i < da.max_qp; i++)
		RETURNS(ibv_destroy_qp(qps[i]), 0);
	free(qps);
	small_work(pd2, cq2);
	RETURNS(ibv_destroy_cq(cq2), 0);
	RETURNS(ibv_dealloc_pd(pd2), 0);
	RETURNS(ibv_close_device(ctx2), 0);

done:
	small_work(pd, cq);
	RETURNS(ibv_destroy_cq(cq), 0);
	RETURNS(ibv_dealloc_pd(pd), 0);
	RETURNS(ibv_close_device(ctx), 0);
	ibv_free_device_list(list);
	printf("exhaust: ok\n");
	return 0;
}
