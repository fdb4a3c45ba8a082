/*
 * What tests/c/multi_open.c and multi_events.c share: an RC QP with its PD,
 * CQ and registered buffer in one context, connected to another on the same
 * vrnic function (the test's link reflects every frame back), and bounded
 * waits.
 */
#ifndef RC_PAIR_H
#define RC_PAIR_H

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <infiniband/verbs.h>
#include "check.h"


/* Bytes of each side's registered buffer. */
#define BUF 8192

struct side {
	struct ibv_context *ctx;
	struct ibv_comp_channel *ch; /* NULL unless asked for */
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	unsigned char *buf;
	struct ibv_mr *mr;
};

/* Milliseconds of CLOCK_MONOTONIC. */
static inline long long now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* Whether fd polls readable within ms milliseconds. */
static inline int readable(int fd, int ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	return poll(&p, 1, ms) == 1 && (p.revents & POLLIN);
}

/* PD, CQ (on a completion channel of its own with chan), buffer, MR and RC
 * QP in context ctx. */
static inline void side_init(struct side *s, struct ibv_context *ctx, int chan)
{
	memset(s, 0, sizeof(*s));
	s->ctx = ctx;
	if (chan)
		CHECK(s->ch = ibv_create_comp_channel(ctx), "ibv_create_comp_channel: errno %d", errno);
	CHECK(s->pd = ibv_alloc_pd(ctx), "ibv_alloc_pd: errno %d", errno);
	CHECK(s->cq = ibv_create_cq(ctx, 16, s, s->ch, 0), "ibv_create_cq: errno %d", errno);
	CHECK(posix_memalign((void **)&s->buf, 4096, BUF) == 0, "posix_memalign");
	memset(s->buf, 0, BUF);
	s->mr = ibv_reg_mr(s->pd, s->buf, BUF,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	CHECK(s->mr, "ibv_reg_mr: errno %d", errno);
	struct ibv_qp_init_attr ia = {
		.send_cq = s->cq, .recv_cq = s->cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	CHECK(s->qp = ibv_create_qp(s->pd, &ia), "ibv_create_qp: errno %d", errno);
}

/* Brings s's QP to RTS, connected to QP number peer on the same function. */
static inline void side_connect(struct side *s, uint32_t peer)
{
	union ibv_gid gid;
	CHECK(ibv_query_gid(s->ctx, 1, 1, &gid) == 0, "ibv_query_gid: errno %d", errno);
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ };
	CHECK(ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
			    IBV_QP_ACCESS_FLAGS) == 0, "INIT");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = peer;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = gid;
	a.ah_attr.grh.sgid_index = 1;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = 1;
	CHECK(ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			    IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) == 0,
	      "RTR: errno %d", errno);
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	CHECK(ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			    IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) == 0,
	      "RTS: errno %d", errno);
}

/* The next completion of s's CQ, waiting at most 10 s. */
static inline struct ibv_wc side_wait(struct side *s, const char *what)
{
	struct ibv_wc wc;
	long long end = now_ms() + 10000;
	for (;;) {
		int n = ibv_poll_cq(s->cq, 1, &wc);
		CHECK(n >= 0, "%s: ibv_poll_cq failed", what);
		if (n == 1)
			return wc;
		CHECK(now_ms() < end, "%s: no completion within 10 s", what);
		sched_yield();
	}
}

/* Posts a receive of len bytes at s->buf + off. */
static inline void post_recv(struct side *s, size_t off, uint32_t len)
{
	struct ibv_sge sge = { .addr = (uintptr_t)(s->buf + off), .length = len, .lkey = s->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = 2, .sg_list = &sge, .num_sge = 1 }, *bad;
	CHECK(ibv_post_recv(s->qp, &wr, &bad) == 0, "ibv_post_recv: errno %d", errno);
}

/* Posts a SEND of len bytes at s->buf + off with key lkey, signaled or not. */
static inline void post_send(struct side *s, size_t off, uint32_t len, uint32_t lkey, int signaled)
{
	struct ibv_sge sge = { .addr = (uintptr_t)(s->buf + off), .length = len, .lkey = lkey };
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1,
		.opcode = IBV_WR_SEND, .send_flags = signaled ? IBV_SEND_SIGNALED : 0 }, *bad;
	CHECK(ibv_post_send(s->qp, &wr, &bad) == 0, "ibv_post_send: errno %d", errno);
}

/* Fills p[0..n) with a pattern of seed. */
static inline void fill(unsigned char *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (unsigned char)(i * 131 + seed);
}

/* Whether p[0..n) holds the pattern of seed. */
static inline int intact(const unsigned char *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != (unsigned char)(i * 131 + seed))
			return 0;
	return 1;
}

/* Destroys s's objects (not its context). */
static inline void side_fini(struct side *s)
{
	CHECK(ibv_destroy_qp(s->qp) == 0, "ibv_destroy_qp");
	CHECK(ibv_dereg_mr(s->mr) == 0, "ibv_dereg_mr");
	CHECK(ibv_destroy_cq(s->cq) == 0, "ibv_destroy_cq");
	CHECK(ibv_dealloc_pd(s->pd) == 0, "ibv_dealloc_pd");
	if (s->ch)
		CHECK(ibv_destroy_comp_channel(s->ch) == 0, "ibv_destroy_comp_channel");
	free(s->buf);
}

/* SEND of len bytes from a to b (patterned with seed), both completions
 * checked, and the data. */
static inline void send_checked(struct side *a, struct side *b, uint32_t len, unsigned seed)
{
	memset(b->buf, 0, len);
	post_recv(b, 0, len);
	fill(a->buf, len, seed);
	post_send(a, 0, len, a->mr->lkey, 1);
	struct ibv_wc wc = side_wait(a, "SEND");
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_SEND,
	      "SEND: status %d (%s), opcode %d", wc.status, ibv_wc_status_str(wc.status), wc.opcode);
	wc = side_wait(b, "RECV");
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV && wc.byte_len == len,
	      "RECV: status %d (%s), opcode %d, %u bytes", wc.status, ibv_wc_status_str(wc.status),
	      wc.opcode, wc.byte_len);
	CHECK(intact(b->buf, len, seed), "the received data differ");
}

#endif
