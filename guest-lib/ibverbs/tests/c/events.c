/*
 * Completion channel and asynchronous events through vrnic's
 * libibverbs.so.1, as an rdma-core application sees them (tests/events.rs
 * runs it): a send with a bad lkey on an RC QP connected to itself
 * completes with IBV_WC_LOC_PROT_ERR and moves the QP to ERR, which must
 * (1) make the completion channel's fd readable for poll(2) and deliver the
 * CQ through ibv_get_cq_event, and (2) make the context's async_fd readable
 * and deliver IBV_EVENT_QP_FATAL for that QP through ibv_get_async_event.
 * Before the send, neither fd may be readable. Prints "events: ok" and
 * exits 0, or names the failed step and exits 1. Every wait is bounded.
 */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

#define FAIL(...) do { fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); return 1; } while (0)

static int readable(int fd, int ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	return poll(&p, 1, ms) == 1 && (p.revents & POLLIN);
}

int main(void)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n < 1)
		FAIL("no device");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	if (!ctx)
		FAIL("ibv_open_device: %m");
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	char *buf = malloc(4096);
	struct ibv_mr *mr = buf && pd ? ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE) : NULL;
	struct ibv_cq *cq = ch ? ibv_create_cq(ctx, 16, (void *)0x1234, ch, 0) : NULL;
	if (!ch || !pd || !mr || !cq)
		FAIL("setup: %m");
	struct ibv_qp_init_attr ia = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	if (!qp)
		FAIL("ibv_create_qp: %m");
	union ibv_gid gid;
	if (ibv_query_gid(ctx, 1, 1, &gid))
		FAIL("ibv_query_gid: %m");
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1 };
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		FAIL("INIT");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = qp->qp_num;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = gid;
	a.ah_attr.grh.sgid_index = 1;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		FAIL("RTR");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			  IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
		FAIL("RTS");
	if (ibv_req_notify_cq(cq, 0))
		FAIL("ibv_req_notify_cq");
	if (readable(ch->fd, 100) || readable(ctx->async_fd, 0))
		FAIL("an fd is readable before anything happened");

	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 64, .lkey = mr->lkey ^ 0x5a5a00 };
	struct ibv_send_wr wr = { .wr_id = 77, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *bad;
	if (ibv_post_send(qp, &wr, &bad))
		FAIL("ibv_post_send: %m");

	if (!readable(ch->fd, 10000))
		FAIL("completion channel fd not readable within 10 s");
	struct ibv_cq *ev_cq;
	void *ev_ctx;
	if (ibv_get_cq_event(ch, &ev_cq, &ev_ctx) || ev_cq != cq || ev_ctx != (void *)0x1234)
		FAIL("ibv_get_cq_event");
	ibv_ack_cq_events(cq, 1);
	struct ibv_wc wc;
	if (ibv_poll_cq(cq, 1, &wc) != 1 || wc.wr_id != 77 || wc.status != IBV_WC_LOC_PROT_ERR)
		FAIL("expected one LOC_PROT_ERR completion");

	if (!readable(ctx->async_fd, 10000))
		FAIL("async_fd not readable within 10 s");
	struct ibv_async_event ev;
	if (ibv_get_async_event(ctx, &ev))
		FAIL("ibv_get_async_event: %m");
	if (ev.event_type != IBV_EVENT_QP_FATAL || ev.element.qp != qp)
		FAIL("expected QP_FATAL for the QP, got %s", ibv_event_type_str(ev.event_type));
	ibv_ack_async_event(&ev);

	if (ibv_destroy_qp(qp) || ibv_destroy_cq(cq) || ibv_dereg_mr(mr) || ibv_dealloc_pd(pd) ||
	    ibv_destroy_comp_channel(ch) || ibv_close_device(ctx))
		FAIL("cleanup");
	ibv_free_device_list(list);
	free(buf);
	printf("events: ok\n");
	return 0;
}
