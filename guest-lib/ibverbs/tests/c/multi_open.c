/*
 * Several ibv_open_device of one vrnic function in one process
 * (tests/multi_open.rs runs it, the function served by an in-process
 * daemon behind VRNIC_VHOST_USER on a link that reflects every frame, so
 * QPs of the function reach each other): the process's one vhost-user
 * connection carries a device context per open.
 *
 * Four contexts, each with its PD, CQ, MR and RC QP; QPs of contexts 0 and
 * 1 connected, and of 2 and 3. A SEND 0 -> 1 and an RDMA WRITE 1 -> 0 move
 * checked data between contexts, a SEND 2 -> 3 too. Context 0's lkey in a
 * send on context 2 completes with IBV_WC_LOC_PROT_ERR and raises
 * IBV_EVENT_QP_FATAL on context 2's async_fd only. Contexts 3 and 2 are
 * closed; 0 and 1 still move data; a context opened again works; the
 * buffers registered in two contexts at once (the same pages) stay intact.
 * Prints "multi_open: ok" and exits 0, or names the failed step and exits
 * 1. Every wait is bounded.
 */
#include "rc_pair.h"

#define N 4

int main(void)
{
	struct ibv_device **list = one_device_list();

	struct ibv_context *ctx[N];
	for (int i = 0; i < N; i++) {
		ctx[i] = ibv_open_device(list[0]);
		CHECK(ctx[i], "ibv_open_device #%d: errno %d", i + 1, errno);
		struct ibv_device_attr attr;
		CHECK(ibv_query_device(ctx[i], &attr) == 0, "ibv_query_device on open #%d", i + 1);
		for (int j = 0; j < i; j++)
			CHECK(ctx[i] != ctx[j] && ctx[i]->async_fd != ctx[j]->async_fd,
			      "opens #%d and #%d share a context", j + 1, i + 1);
	}

	struct side s[N];
	for (int i = 0; i < N; i++)
		side_init(&s[i], ctx[i], 0);
	for (int i = 0; i < N; i++)
		for (int j = 0; j < i; j++)
			CHECK(s[i].qp->qp_num != s[j].qp->qp_num, "two QPs numbered %u", s[i].qp->qp_num);
	side_connect(&s[0], s[1].qp->qp_num);
	side_connect(&s[1], s[0].qp->qp_num);
	side_connect(&s[2], s[3].qp->qp_num);
	side_connect(&s[3], s[2].qp->qp_num);

	/* Data between contexts: SEND 0 -> 1, WRITE 1 -> 0, SEND 2 -> 3. */
	send_checked(&s[0], &s[1], 4096, 1);
	fill(s[1].buf + 4096, 4096, 2);
	struct ibv_sge sge = { .addr = (uintptr_t)(s[1].buf + 4096), .length = 4096,
			       .lkey = s[1].mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 3, .sg_list = &sge, .num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = (uintptr_t)(s[0].buf + 4096), .rkey = s[0].mr->rkey } }, *bad;
	CHECK(ibv_post_send(s[1].qp, &wr, &bad) == 0, "ibv_post_send WRITE: errno %d", errno);
	struct ibv_wc wc = side_wait(&s[1], "WRITE");
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RDMA_WRITE,
	      "WRITE: status %d (%s)", wc.status, ibv_wc_status_str(wc.status));
	CHECK(intact(s[0].buf + 4096, 4096, 2), "the written data differ");
	send_checked(&s[2], &s[3], 2048, 3);

	/* The same pages registered in a second context. */
	struct ibv_mr *twice = ibv_reg_mr(s[1].pd, s[0].buf, BUF, IBV_ACCESS_LOCAL_WRITE);
	CHECK(twice, "ibv_reg_mr of context 0's buffer in context 1: errno %d", errno);

	/* Context 0's lkey is nothing in context 2. */
	CHECK(!readable(ctx[2]->async_fd, 0), "context 2's async_fd readable before the error");
	post_send(&s[2], 0, 64, s[0].mr->lkey, 1);
	wc = side_wait(&s[2], "SEND with another context's lkey");
	CHECK(wc.status == IBV_WC_LOC_PROT_ERR,
	      "SEND with context 0's lkey on context 2: status %d (%s), want LOC_PROT_ERR",
	      wc.status, ibv_wc_status_str(wc.status));
	CHECK(readable(ctx[2]->async_fd, 10000), "context 2's async_fd not readable within 10 s");
	struct ibv_async_event ev;
	CHECK(ibv_get_async_event(ctx[2], &ev) == 0, "ibv_get_async_event");
	CHECK(ev.event_type == IBV_EVENT_QP_FATAL && ev.element.qp == s[2].qp,
	      "async event %d for %p, want QP_FATAL for %p", ev.event_type, (void *)ev.element.qp,
	      (void *)s[2].qp);
	ibv_ack_async_event(&ev);
	for (int i = 0; i < N; i++)
		CHECK(i == 2 || !readable(ctx[i]->async_fd, i == 0 ? 200 : 0),
		      "context %d's async_fd readable: context 2's event went there", i);

	/* Close contexts 3 and 2; 0 and 1 go on. */
	side_fini(&s[3]);
	CHECK(ibv_close_device(ctx[3]) == 0, "ibv_close_device 3");
	side_fini(&s[2]);
	CHECK(ibv_close_device(ctx[2]) == 0, "ibv_close_device 2");
	send_checked(&s[0], &s[1], 4096, 4);
	send_checked(&s[1], &s[0], 1000, 5);

	/* Opened again (perhaps with a number just freed): works. */
	struct ibv_context *again = ibv_open_device(list[0]);
	CHECK(again, "ibv_open_device after closes: errno %d", errno);
	struct side t;
	side_init(&t, again, 0);
	send_checked(&s[0], &s[1], 512, 6);
	side_fini(&t);
	CHECK(ibv_close_device(again) == 0, "ibv_close_device again");

	/* The pages registered twice: one deregistration leaves them working. */
	CHECK(ibv_dereg_mr(twice) == 0, "ibv_dereg_mr twice");
	send_checked(&s[1], &s[0], 4096, 7);

	side_fini(&s[1]);
	CHECK(ibv_close_device(ctx[1]) == 0, "ibv_close_device 1");
	side_fini(&s[0]);
	CHECK(ibv_close_device(ctx[0]) == 0, "ibv_close_device 0");

	/* The last close closed the connection: opening connects anew. */
	struct ibv_context *last = ibv_open_device(list[0]);
	CHECK(last, "ibv_open_device after the last close: errno %d", errno);
	struct ibv_pd *pd = ibv_alloc_pd(last);
	CHECK(pd, "ibv_alloc_pd after reconnecting: errno %d", errno);
	CHECK(ibv_dealloc_pd(pd) == 0 && ibv_close_device(last) == 0, "closing after reconnecting");
	ibv_free_device_list(list);
	printf("multi_open: ok\n");
	return 0;
}
