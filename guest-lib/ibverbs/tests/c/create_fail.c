/*
 * Failing verbs under the C ABI (issue 30 point 2; tests/open_fail.rs runs
 * it on a vrnic function behind VRNIC_VHOST_USER): each create with bad
 * arguments or past the device's limits returns NULL with the errno rxe's
 * kernel driver and rdma-core give (EINVAL for attributes past
 * ibv_query_device's limits, rxe_cq_chk_attr / rxe_qp_chk_init /
 * rxe_srq_chk_init; EFAULT for memory that is not mapped, ib_umem_get;
 * EINVAL for remote write access without local write, ib_check_mr_access),
 * each failing call that returns an int returns the errno (an invalid QP
 * state transition, ibv_modify_qp(3); a post before the QP may, rxe's
 * provider; a PD still in use, EBUSY), and after all of them the process
 * lives and the context still creates and destroys every object. Prints
 * "create_fail: ok" and exits 0, or names the failed step and exits 1 (or
 * dies, which the test reports).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <infiniband/verbs.h>
#include "check.h"


static struct ibv_qp *rc_qp(struct ibv_pd *pd, struct ibv_cq *cq, uint32_t wr, uint32_t sge)
{
	struct ibv_qp_init_attr ia = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = wr, .max_recv_wr = wr, .max_send_sge = sge, .max_recv_sge = sge },
	};
	return ibv_create_qp(pd, &ia);
}

int main(void)
{
	struct ibv_device **list = one_device_list();
	struct ibv_context *ctx = ibv_open_device(list[0]);
	CHECK(ctx, "ibv_open_device: errno %d", errno);
	struct ibv_device_attr da;
	CHECK(ibv_query_device(ctx, &da) == 0, "ibv_query_device");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd, "ibv_alloc_pd: errno %d", errno);

	/* CQs past the limits. */
	REFUSED(ibv_create_cq(ctx, da.max_cqe + 1, NULL, NULL, 0), EINVAL);
	REFUSED(ibv_create_cq(ctx, -1, NULL, NULL, 0), EINVAL);
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	CHECK(cq, "ibv_create_cq(16): errno %d", errno);

	/* QPs past the limits. */
	REFUSED(rc_qp(pd, cq, da.max_qp_wr + 1, 1), EINVAL);
	REFUSED(rc_qp(pd, cq, 4, da.max_sge + 1), EINVAL);
	struct ibv_qp_init_attr bad_type = { .send_cq = cq, .recv_cq = cq, .qp_type = (enum ibv_qp_type)77,
		.cap = { .max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1 } };
	errno = 0;
	struct ibv_qp *bt = ibv_create_qp(pd, &bad_type);
	CHECK(!bt && errno != 0, "ibv_create_qp of QP type 77: want NULL with an errno, got %p errno %d",
	      (void *)bt, errno);

	/* SRQs past the limits. */
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = da.max_srq_wr + 1, .max_sge = 1 } };
	REFUSED(ibv_create_srq(pd, &sa), EINVAL);
	sa.attr.max_wr = 4;
	sa.attr.max_sge = da.max_srq_sge + 1;
	REFUSED(ibv_create_srq(pd, &sa), EINVAL);

	/* MRs: memory that is not mapped, remote write without local write. */
	void *hole = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(hole != MAP_FAILED, "mmap");
	CHECK(munmap(hole, 8192) == 0, "munmap");
	REFUSED(ibv_reg_mr(pd, hole, 8192, IBV_ACCESS_LOCAL_WRITE), EFAULT);
	static char buf[8192] __attribute__((aligned(4096)));
	REFUSED(ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_REMOTE_WRITE), EINVAL);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr, "ibv_reg_mr: errno %d", errno);

	/* A QP in RESET: no post, no jump to RTR; its PD is busy. */
	struct ibv_qp *qp = rc_qp(pd, cq, 4, 1);
	CHECK(qp, "ibv_create_qp: errno %d", errno);
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 64, .lkey = mr->lkey };
	struct ibv_send_wr wr = { .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND }, *bad_wr;
	RETURNS(ibv_post_send(qp, &wr, &bad_wr), EINVAL);
	struct ibv_recv_wr rwr = { .sg_list = &sge, .num_sge = 1 }, *bad_rwr;
	RETURNS(ibv_post_recv(qp, &rwr, &bad_rwr), EINVAL);
	struct ibv_qp_attr qa = { .qp_state = IBV_QPS_RTR };
	RETURNS(ibv_modify_qp(qp, &qa, IBV_QP_STATE), EINVAL);
	RETURNS(ibv_dealloc_pd(pd), EBUSY);

	/* All still works: a QP to INIT, a receive posted, everything freed. */
	struct ibv_qp_attr init = { .qp_state = IBV_QPS_INIT, .port_num = 1,
		.qp_access_flags = IBV_ACCESS_LOCAL_WRITE };
	RETURNS(ibv_modify_qp(qp, &init, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), 0);
	RETURNS(ibv_post_recv(qp, &rwr, &bad_rwr), 0);
	RETURNS(ibv_destroy_qp(qp), 0);
	RETURNS(ibv_dereg_mr(mr), 0);
	RETURNS(ibv_destroy_cq(cq), 0);
	RETURNS(ibv_dealloc_pd(pd), 0);
	RETURNS(ibv_close_device(ctx), 0);
	ibv_free_device_list(list);
	printf("create_fail: ok\n");
	return 0;
}
