/*
 * The extended verbs through vrnic's libibverbs.so.1, as an rdma-core
 * application uses them (tests/xverbs.rs runs it): ibv_query_device_ex,
 * ibv_create_cq_ex polled with ibv_start_poll/ibv_next_poll/ibv_end_poll
 * and the ibv_wc_read_* readers, ibv_create_qp_ex with
 * IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, ibv_qp_to_qp_ex and the ibv_wr_* API
 * with each opcode (SEND, SEND with immediate, inline SEND from a buffer
 * list, RDMA WRITE, RDMA WRITE with immediate, RDMA READ, both atomics),
 * a batch of two requests in one ibv_wr_complete, ibv_wr_abort, and
 * ibv_wr_complete failing without posting. The process forks: the parent
 * (device of VRNIC_LOOPBACK) owns the extended QP a, the child (device of
 * XVERBS_PEER, e.g. the other end of a veth pair) the plain QP b, whose
 * receives it checks with ibv_start_poll too; they exchange QPN, GID,
 * address and rkey over pipes. Data and completions are checked on both
 * sides. Then UD: b sends to a, a answers through ibv_create_ah_from_wc
 * (ibv_init_ah_from_wc checked) and ibv_wr_set_ud_addr. Prints "xverbs: ok" and exits 0, or names the failed step and
 * exits 1. Every wait is bounded (polls 10 s; pipes end with the peer).
 */
#include <endian.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/wait.h>
#include <infiniband/verbs.h>
#include "check.h"


/* What is being waited for (named by a failure). */
static const char *step = "";

struct comp {
	uint64_t wr_id;
	enum ibv_wc_status status;
	enum ibv_wc_opcode opcode;
	uint32_t byte_len, qp_num, vendor_err;
	unsigned int wc_flags;
	__be32 imm;
};

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static void read_comp(struct ibv_cq_ex *cq, struct comp *c)
{
	c->wr_id = cq->wr_id;
	c->status = cq->status;
	c->opcode = ibv_wc_read_opcode(cq);
	c->byte_len = ibv_wc_read_byte_len(cq);
	c->qp_num = ibv_wc_read_qp_num(cq);
	c->vendor_err = ibv_wc_read_vendor_err(cq);
	c->wc_flags = ibv_wc_read_wc_flags(cq);
	c->imm = (c->wc_flags & IBV_WC_WITH_IMM) ? ibv_wc_read_imm_data(cq) : 0;
	(void)ibv_wc_read_src_qp(cq);
	(void)ibv_wc_read_sl(cq);
	(void)ibv_wc_read_slid(cq);
	(void)ibv_wc_read_dlid_path_bits(cq);
}

/* Up to `max` completions of one polling batch, waiting (10 s at most) for
 * the first; their number. */
static int poll_batch(struct ibv_cq_ex *cq, struct comp *c, int max)
{
	struct ibv_poll_cq_attr attr = {};
	double end = now() + 10;
	int ret;
	while ((ret = ibv_start_poll(cq, &attr)) == ENOENT)
		if (now() > end)
			{ struct ibv_wc wc; int k = ibv_poll_cq(ibv_cq_ex_to_cq(cq), 1, &wc); FAIL("%s: no completion within 10 s (poll_cq %d status %d)", step, k, k > 0 ? (int)wc.status : -1); }
	CHECK(ret == 0, "ibv_start_poll: %d", ret);
	int n = 0;
	do
		read_comp(cq, &c[n++]);
	while (n < max && (ret = ibv_next_poll(cq)) == 0);
	CHECK(n == max || ret == ENOENT, "ibv_next_poll: %d", ret);
	ibv_end_poll(cq);
	return n;
}

static struct comp poll_one(struct ibv_cq_ex *cq, const char *what)
{
	struct comp c;
	step = what;
	poll_batch(cq, &c, 1);
	CHECK(c.status == IBV_WC_SUCCESS, "%s: status %s (vendor_err %u)", what,
	      ibv_wc_status_str(c.status), c.vendor_err);
	return c;
}

static void connect_qp(struct ibv_qp *qp, uint32_t dest, union ibv_gid gid)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
				   IBV_ACCESS_REMOTE_ATOMIC };
	CHECK(!ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
			     IBV_QP_ACCESS_FLAGS), "INIT");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dest;
	a.max_dest_rd_atomic = 4;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = gid;
	a.ah_attr.grh.sgid_index = 1;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = 1;
	CHECK(!ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			     IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER), "RTR");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 4;
	CHECK(!ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			     IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC), "RTS");
}

static void ud_ready(struct ibv_qp *qp)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = 0x11111111 };
	CHECK(!ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY),
	      "UD INIT");
	a.qp_state = IBV_QPS_RTR;
	CHECK(!ibv_modify_qp(qp, &a, IBV_QP_STATE), "UD RTR");
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 0;
	CHECK(!ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN), "UD RTS");
}

static struct ibv_wc poll_plain(struct ibv_cq *cq, const char *what)
{
	struct ibv_wc wc;
	double end = now() + 10;
	int k;
	while ((k = ibv_poll_cq(cq, 1, &wc)) == 0)
		CHECK(now() < end, "%s: no completion within 10 s", what);
	CHECK(k == 1 && wc.status == IBV_WC_SUCCESS, "%s: %s", what,
	      k == 1 ? ibv_wc_status_str(wc.status) : "poll error");
	return wc;
}

#define SZ 8192
/* What each side tells the other. */
struct info {
	uint32_t qpn, rkey, ud_qpn;
	uint64_t addr;
	union ibv_gid gid;
};

static void xfer(int wfd, int rfd, const struct info *mine, struct info *theirs)
{
	CHECK(write(wfd, mine, sizeof(*mine)) == sizeof(*mine), "pipe write");
	CHECK(read(rfd, theirs, sizeof(*theirs)) == sizeof(*theirs), "pipe read");
}

struct side {
	struct ibv_device **list;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	char *buf;
	struct ibv_mr *mr;
	struct ibv_cq_ex *cq;
	union ibv_gid gid;
};

static void open_side(struct side *s)
{
	int n;
	s->list = ibv_get_device_list(&n);
	CHECK(s->list && n >= 1, "no device");
	s->ctx = ibv_open_device(s->list[0]);
	CHECK(s->ctx, "ibv_open_device: %m");
	s->pd = ibv_alloc_pd(s->ctx);
	s->buf = calloc(1, SZ);
	int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
		  IBV_ACCESS_REMOTE_ATOMIC;
	s->mr = s->pd && s->buf ? ibv_reg_mr(s->pd, s->buf, SZ, acc) : NULL;
	CHECK(s->mr, "setup: %m");
	struct ibv_cq_init_attr_ex ca = { .cqe = 32, .wc_flags = IBV_WC_STANDARD_FLAGS };
	s->cq = ibv_create_cq_ex(s->ctx, &ca);
	CHECK(s->cq, "ibv_create_cq_ex: %m");
	CHECK(!ibv_query_gid(s->ctx, 1, 1, &s->gid), "ibv_query_gid: %m");
	/* ibv_query_gid_table(3): the used entries, GID index 1 among them
	 * as ibv_query_gid gave it; too small an array fails. */
	struct ibv_gid_entry tbl[32];
	ssize_t ng = ibv_query_gid_table(s->ctx, tbl, 32, 0);
	CHECK(ng >= 2 && ng <= 32, "ibv_query_gid_table: %zd", ng);
	int found = 0;
	for (ssize_t i = 0; i < ng; i++)
		found |= tbl[i].port_num == 1 && tbl[i].gid_index == 1 &&
			 tbl[i].gid_type == IBV_GID_TYPE_ROCE_V2 &&
			 !memcmp(tbl[i].gid.raw, s->gid.raw, 16);
	CHECK(found, "ibv_query_gid_table lacks GID index 1");
	CHECK(ibv_query_gid_table(s->ctx, tbl, 1, 0) == -EINVAL,
	      "ibv_query_gid_table into 1 entry of %zd", ng);
	/* cmd_fd can be dup'd (pyverbs' shared PD test does); importing a
	 * context from it is not supported: NULL with EOPNOTSUPP. */
	int fd = dup(s->ctx->cmd_fd);
	CHECK(fd >= 0, "dup(cmd_fd %d): %m", s->ctx->cmd_fd);
	errno = 0;
	CHECK(!ibv_import_device(fd) && errno == EOPNOTSUPP, "ibv_import_device: %m");
	close(fd);
}

static void close_side(struct side *s, struct ibv_qp *qp)
{
	CHECK(!ibv_destroy_qp(qp) && !ibv_destroy_cq(ibv_cq_ex_to_cq(s->cq)) &&
	      !ibv_dereg_mr(s->mr) && !ibv_dealloc_pd(s->pd) && !ibv_close_device(s->ctx),
	      "cleanup");
	ibv_free_device_list(s->list);
	free(s->buf);
}

/* Side b: a plain RC QP whose receives and memory side a's requests use. */
static int side_b(int wfd, int rfd)
{
	const char *peer = getenv("XVERBS_PEER");
	CHECK(peer && !setenv("VRNIC_LOOPBACK", peer, 1), "XVERBS_PEER not set");
	struct side s;
	open_side(&s);
	char *b = s.buf;
	struct ibv_qp_init_attr ib = {
		.send_cq = ibv_cq_ex_to_cq(s.cq), .recv_cq = ibv_cq_ex_to_cq(s.cq),
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 8, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct ibv_qp *qp = ibv_create_qp(s.pd, &ib);
	CHECK(qp, "b: ibv_create_qp: %m");
	CHECK(ibv_qp_to_qp_ex(qp) == NULL, "a plain QP has no ibv_qp_ex");
	memcpy(b + 7400, "read me back", 12);
	*(uint64_t *)(b + 7168) = 40;
	/* UD: b sends to a, a answers with an AH made from the completion. */
	struct ibv_cq *udcq = ibv_create_cq(s.ctx, 8, NULL, NULL, 0);
	struct ibv_qp_init_attr iu = { .send_cq = udcq, .recv_cq = udcq, .qp_type = IBV_QPT_UD,
		.cap = { .max_send_wr = 2, .max_recv_wr = 2, .max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp *ud = udcq ? ibv_create_qp(s.pd, &iu) : NULL;
	CHECK(ud, "b: UD QP: %m");
	ud_ready(ud);
	struct ibv_sge usge = { (uintptr_t)b + 7600, 40 + 64, s.mr->lkey };
	struct ibv_recv_wr urw = { .wr_id = 201, .sg_list = &usge, .num_sge = 1 }, *ubad;
	CHECK(!ibv_post_recv(ud, &urw, &ubad), "b: UD recv: %m");
	struct info mine = { qp->qp_num, s.mr->rkey, ud->qp_num, (uintptr_t)b, s.gid }, a;
	xfer(wfd, rfd, &mine, &a);
	connect_qp(qp, a.qpn, a.gid);
	/* Receives once the QP left RESET (rxe's post_recv refuses them there). */
	static const struct { uint64_t id; size_t off; uint32_t len; } rx[] = {
		{ 101, 0, 256 }, { 102, 512, 256 }, { 103, 1024, 256 }, { 105, 1536, 16 },
		{ 109, 1600, 64 }, { 110, 1700, 64 }, { 115, 1800, 64 },
	};
	for (unsigned i = 0; i < sizeof(rx) / sizeof(rx[0]); i++) {
		struct ibv_sge sge = { (uintptr_t)b + rx[i].off, rx[i].len, s.mr->lkey };
		struct ibv_recv_wr wr = { .wr_id = rx[i].id, .sg_list = &sge, .num_sge = 1 }, *bad;
		CHECK(!ibv_post_recv(qp, &wr, &bad), "ibv_post_recv: %m");
	}
	char ready = 1;
	CHECK(write(wfd, &ready, 1) == 1, "pipe write");

	struct comp c;
	c = poll_one(s.cq, "recv of send");
	CHECK(c.wr_id == 101 && c.opcode == IBV_WC_RECV && c.byte_len == 22 &&
	      c.qp_num == qp->qp_num && !(c.wc_flags & IBV_WC_WITH_IMM) &&
	      !strcmp(b, "hello, extended verbs"), "recv of send: data or completion");
	c = poll_one(s.cq, "recv of send_imm");
	CHECK(c.wr_id == 102 && c.byte_len == 7 && (c.wc_flags & IBV_WC_WITH_IMM) &&
	      c.imm == htobe32(0xc0ffee) && !memcmp(b + 512, "abcdefg", 7),
	      "recv of send_imm: data, imm or flags");
	c = poll_one(s.cq, "recv of inline send");
	CHECK(c.wr_id == 103 && c.byte_len == 11 && !memcmp(b + 1024, "inline-list", 11),
	      "recv of inline send");
	c = poll_one(s.cq, "recv of rdma_write_imm");
	CHECK(c.wr_id == 105 && c.opcode == IBV_WC_RECV_RDMA_WITH_IMM && c.byte_len == 3000 &&
	      c.imm == htobe32(77) && b[4096] == 0x5c && b[4096 + 2999] == 0x5c &&
	      !memcmp(b + 2048, "written", 7), "recv of rdma_write_imm, or the writes' data");
	struct comp cs[2];
	for (int got = 0; got < 2;)
		got += poll_batch(s.cq, cs + got, 2 - got);
	CHECK(cs[0].wr_id == 109 && cs[0].byte_len == 5 && cs[1].wr_id == 110 &&
	      cs[1].byte_len == 6 && cs[0].status == IBV_WC_SUCCESS &&
	      cs[1].status == IBV_WC_SUCCESS, "batch receives");
	c = poll_one(s.cq, "recv of the last send");
	CHECK(c.wr_id == 115 && *(uint64_t *)(b + 7168) == 1000 && !memcmp(b + 7900, "hello, e", 8),
	      "the atomics' or the last write's result at b");
	CHECK(ibv_start_poll(s.cq, &(struct ibv_poll_cq_attr){}) == ENOENT,
	      "b: a completion beyond the last request");
	struct ibv_ah_attr aa = { .is_global = 1, .port_num = 1,
		.grh = { .dgid = a.gid, .sgid_index = 1, .hop_limit = 1 } };
	struct ibv_ah *ah = ibv_create_ah(s.pd, &aa);
	CHECK(ah, "b: ibv_create_ah: %m");
	memcpy(b + 7800, "ping", 4);
	struct ibv_sge ssge = { (uintptr_t)b + 7800, 4, s.mr->lkey };
	struct ibv_send_wr sw = { .wr_id = 202, .sg_list = &ssge, .num_sge = 1,
		.opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *sbad;
	sw.wr.ud.ah = ah;
	sw.wr.ud.remote_qpn = a.ud_qpn;
	sw.wr.ud.remote_qkey = 0x11111111;
	CHECK(!ibv_post_send(ud, &sw, &sbad), "b: UD send: %m");
	struct ibv_wc w1 = poll_plain(udcq, "b: UD send");
	struct ibv_wc w2 = poll_plain(udcq, "b: UD reply");
	struct ibv_wc *rw = w1.wr_id == 201 ? &w1 : &w2;
	CHECK(rw->wr_id == 201 && rw->byte_len == 40 + 4 && rw->src_qp == a.ud_qpn &&
	      !memcmp(b + 7600 + 40, "pong", 4), "b: UD reply data or completion");
	CHECK(!ibv_destroy_ah(ah) && !ibv_destroy_qp(ud) && !ibv_destroy_cq(udcq), "b: UD cleanup");

	/* a is done with b's memory once it got our last message. */
	CHECK(write(wfd, &ready, 1) == 1 && read(rfd, &ready, 1) == 1, "pipe");
	close_side(&s, qp);
	return 0;
}

int main(void)
{
	int ab[2], ba[2];
	CHECK(!pipe(ab) && !pipe(ba), "pipe");
	pid_t pid = fork();
	CHECK(pid >= 0, "fork");
	if (pid == 0) {
		close(ab[1]);
		close(ba[0]);
		return side_b(ba[1], ab[0]);
	}
	close(ab[0]);
	close(ba[1]);
	int wfd = ab[1], rfd = ba[0];

	struct side s;
	open_side(&s);
	struct ibv_context *ctx = s.ctx;
	char *bufa = s.buf;
	struct ibv_mr *mra = s.mr;
	struct ibv_cq_ex *cqa = s.cq;

	struct ibv_device_attr_ex dx;
	memset(&dx, 0xa5, sizeof(dx));
	CHECK(!ibv_query_device_ex(ctx, NULL, &dx), "ibv_query_device_ex");
	CHECK(dx.orig_attr.max_qp > 0 && dx.orig_attr.phys_port_cnt == 1 &&
	      dx.completion_timestamp_mask == 0 && dx.hca_core_clock == 0 &&
	      dx.phys_port_cnt_ex == 1 && dx.odp_caps.general_caps == 0,
	      "ibv_query_device_ex: unexpected attributes");
	struct ibv_query_device_ex_input in = { .comp_mask = 1 };
	CHECK(ibv_query_device_ex(ctx, &in, &dx) == EINVAL, "query_device_ex comp_mask");

	struct ibv_cq_init_attr_ex ca = { .cqe = 32, .wc_flags = IBV_WC_EX_WITH_COMPLETION_TIMESTAMP };
	errno = 0;
	CHECK(!ibv_create_cq_ex(ctx, &ca) && errno == EOPNOTSUPP,
	      "a CQ with completion timestamps must fail with EOPNOTSUPP");
	struct ibv_poll_cq_attr pa = {};
	CHECK(ibv_start_poll(cqa, &pa) == ENOENT, "an empty CQ polls ENOENT");

	struct ibv_qp_init_attr_ex ia = {
		.send_cq = ibv_cq_ex_to_cq(cqa), .recv_cq = ibv_cq_ex_to_cq(cqa),
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 2, .max_recv_sge = 1,
			 .max_inline_data = 64 },
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.pd = s.pd,
		.send_ops_flags = IBV_QP_EX_WITH_BIND_MW,
	};
	errno = 0;
	CHECK(!ibv_create_qp_ex(ctx, &ia) && errno == EOPNOTSUPP, "BIND_MW must be refused");
	ia.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |
		IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
		IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
		IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;
	struct ibv_qp *qpa = ibv_create_qp_ex(ctx, &ia);
	CHECK(qpa, "ibv_create_qp_ex: %m");
	CHECK(ia.cap.max_inline_data >= 64, "max_inline_data written back");
	uint32_t max_inline = ia.cap.max_inline_data;
	struct ibv_qp_ex *qx = ibv_qp_to_qp_ex(qpa);
	CHECK(qx == (struct ibv_qp_ex *)qpa, "ibv_qp_to_qp_ex");

	struct ibv_cq *udcq = ibv_create_cq(ctx, 8, NULL, NULL, 0);
	struct ibv_qp_init_attr_ex iu = { .send_cq = udcq, .recv_cq = udcq, .qp_type = IBV_QPT_UD,
		.cap = { .max_send_wr = 2, .max_recv_wr = 2, .max_send_sge = 1, .max_recv_sge = 1 },
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, .pd = s.pd,
		.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM };
	struct ibv_qp *ud = udcq ? ibv_create_qp_ex(ctx, &iu) : NULL;
	CHECK(ud, "a: UD QP: %m");
	iu.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE;
	errno = 0;
	CHECK(!ibv_create_qp_ex(ctx, &iu) && errno == EOPNOTSUPP, "RDMA WRITE on UD must be refused");
	struct ibv_qp_ex *udx = ibv_qp_to_qp_ex(ud);
	CHECK(udx, "a: ibv_qp_to_qp_ex(UD)");
	ud_ready(ud);
	struct ibv_sge usge = { (uintptr_t)bufa + 7600, 40 + 64, mra->lkey };
	struct ibv_recv_wr urw = { .wr_id = 301, .sg_list = &usge, .num_sge = 1 }, *ubad;
	CHECK(!ibv_post_recv(ud, &urw, &ubad), "a: UD recv: %m");

	struct info mine = { qpa->qp_num, mra->rkey, ud->qp_num, (uintptr_t)bufa, s.gid }, b;
	xfer(wfd, rfd, &mine, &b);
	connect_qp(qpa, b.qpn, b.gid);
	char ready;
	CHECK(read(rfd, &ready, 1) == 1, "b is not ready");

	struct comp c;
	uint64_t rb = b.addr;

	/* SEND from an SGE. */
	strcpy(bufa, "hello, extended verbs");
	ibv_wr_start(qx);
	qx->wr_id = 1;
	qx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(qx);
	ibv_wr_set_sge(qx, mra->lkey, (uintptr_t)bufa, 22);
	CHECK(ibv_wr_complete(qx) == 0, "wr_complete send");
	c = poll_one(cqa, "send");
	CHECK(c.wr_id == 1 && c.opcode == IBV_WC_SEND && c.qp_num == qpa->qp_num, "send completion");

	/* SEND with immediate, two SGEs. */
	memcpy(bufa + 100, "abc", 3);
	memcpy(bufa + 200, "defg", 4);
	struct ibv_sge two[2] = { { (uintptr_t)bufa + 100, 3, mra->lkey },
				  { (uintptr_t)bufa + 200, 4, mra->lkey } };
	ibv_wr_start(qx);
	qx->wr_id = 2;
	qx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send_imm(qx, htobe32(0xc0ffee));
	ibv_wr_set_sge_list(qx, 2, two);
	CHECK(ibv_wr_complete(qx) == 0, "wr_complete send_imm");
	c = poll_one(cqa, "send_imm");
	CHECK(c.wr_id == 2 && c.opcode == IBV_WC_SEND, "send_imm completion");

	/* Inline SEND from a buffer list (the buffers may change right after). */
	char in1[] = "inline-", in2[] = "list";
	struct ibv_data_buf bl[2] = { { in1, 7 }, { in2, 4 } };
	ibv_wr_start(qx);
	qx->wr_id = 3;
	qx->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	ibv_wr_send(qx);
	ibv_wr_set_inline_data_list(qx, 2, bl);
	memset(in1, 'x', 7);
	CHECK(ibv_wr_complete(qx) == 0, "wr_complete inline send");
	c = poll_one(cqa, "inline send");
	CHECK(c.wr_id == 3, "inline send completion");

	/* RDMA WRITE, inline, unsignaled (checked by b after the next one). */
	ibv_wr_start(qx);
	qx->wr_id = 4;
	qx->wr_flags = IBV_SEND_INLINE;
	ibv_wr_rdma_write(qx, b.rkey, rb + 2048);
	ibv_wr_set_inline_data(qx, "written", 7);
	CHECK(ibv_wr_complete(qx) == 0, "wr_complete rdma_write");

	/* RDMA WRITE with immediate: consumes a receive. */
	memset(bufa + 4096, 0x5c, 3000);
	ibv_wr_start(qx);
	qx->wr_id = 5;
	qx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write_imm(qx, b.rkey, rb + 4096, htobe32(77));
	ibv_wr_set_sge(qx, mra->lkey, (uintptr_t)bufa + 4096, 3000);
	CHECK(ibv_wr_complete(qx) == 0, "wr_complete rdma_write_imm");
	c = poll_one(cqa, "rdma_write_imm");
	CHECK(c.wr_id == 5 && c.opcode == IBV_WC_RDMA_WRITE, "rdma_write_imm completion");

	/* RDMA READ. */
	ibv_wr_start(qx);
	qx->wr_id = 6;
	qx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_read(qx, b.rkey, rb + 7400);
	ibv_wr_set_sge(qx, mra->lkey, (uintptr_t)bufa + 7000, 12);
	CHECK(ibv_wr_complete(qx) == 0, "wr_complete rdma_read");
	c = poll_one(cqa, "rdma_read");
	CHECK(c.wr_id == 6 && c.opcode == IBV_WC_RDMA_READ && c.byte_len == 12 &&
	      !memcmp(bufa + 7000, "read me back", 12), "rdma_read completion or data: wr_id %lu opcode %d byte_len %u data %.12s", (unsigned long)c.wr_id, c.opcode, c.byte_len, bufa + 7000);

	/* Atomics on an 8-byte word of b (40, then 42, then 1000). */
	uint64_t *old = (uint64_t *)(bufa + 7168);
	ibv_wr_start(qx);
	qx->wr_id = 7;
	qx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_atomic_fetch_add(qx, b.rkey, rb + 7168, 2);
	ibv_wr_set_sge(qx, mra->lkey, (uintptr_t)old, 8);
	CHECK(ibv_wr_complete(qx) == 0, "wr_complete fetch_add");
	c = poll_one(cqa, "fetch_add");
	CHECK(c.wr_id == 7 && c.opcode == IBV_WC_FETCH_ADD && *old == 40,
	      "fetch_add: old %lu", (unsigned long)*old);
	ibv_wr_start(qx);
	qx->wr_id = 8;
	qx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_atomic_cmp_swp(qx, b.rkey, rb + 7168, 42, 1000);
	ibv_wr_set_sge(qx, mra->lkey, (uintptr_t)old, 8);
	CHECK(ibv_wr_complete(qx) == 0, "wr_complete cmp_swp");
	c = poll_one(cqa, "cmp_swp");
	CHECK(c.wr_id == 8 && c.opcode == IBV_WC_COMP_SWAP && *old == 42,
	      "cmp_swp: old %lu", (unsigned long)*old);

	/* A batch of two in one ibv_wr_complete, read in one polling batch. */
	ibv_wr_start(qx);
	qx->wr_id = 9;
	qx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(qx);
	ibv_wr_set_sge(qx, mra->lkey, (uintptr_t)bufa, 5);
	qx->wr_id = 10;
	ibv_wr_send(qx);
	ibv_wr_set_sge(qx, mra->lkey, (uintptr_t)bufa, 6);
	CHECK(ibv_wr_complete(qx) == 0, "wr_complete batch");
	struct comp cs[2];
	for (int got = 0; got < 2;)
		got += poll_batch(cqa, cs + got, 2 - got);
	CHECK(cs[0].wr_id == 9 && cs[1].wr_id == 10 && cs[0].status == IBV_WC_SUCCESS &&
	      cs[1].status == IBV_WC_SUCCESS, "batch send completions in order");

	/* Nothing is posted by ibv_wr_abort, nor by a failing ibv_wr_complete:
	 * a setter without an operation (EINVAL), inline data beyond
	 * max_inline_data (ENOSPC, as rxe). The next request's completion is
	 * the first one to appear, and b's receives see only the last send. */
	ibv_wr_start(qx);
	qx->wr_id = 11;
	qx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(qx);
	ibv_wr_set_sge(qx, mra->lkey, (uintptr_t)bufa, 8);
	ibv_wr_abort(qx);
	ibv_wr_start(qx);
	ibv_wr_set_sge(qx, mra->lkey, (uintptr_t)bufa, 8);
	CHECK(ibv_wr_complete(qx) == EINVAL, "a setter without an operation must fail (EINVAL)");
	ibv_wr_start(qx);
	qx->wr_id = 12;
	qx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(qx);
	ibv_wr_set_sge(qx, mra->lkey, (uintptr_t)bufa, 8);
	qx->wr_id = 13;
	ibv_wr_rdma_write(qx, b.rkey, rb);
	ibv_wr_set_inline_data(qx, bufa, max_inline + 1);
	CHECK(ibv_wr_complete(qx) == ENOSPC, "inline data beyond max_inline_data must fail (ENOSPC)");
	ibv_wr_start(qx);
	qx->wr_id = 14;
	qx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(qx, b.rkey, rb + 7900);
	ibv_wr_set_sge(qx, mra->lkey, (uintptr_t)bufa, 8);
	qx->wr_id = 15;
	ibv_wr_send(qx);
	ibv_wr_set_sge(qx, mra->lkey, (uintptr_t)bufa, 4);
	CHECK(ibv_wr_complete(qx) == 0, "wr_complete after the failures");
	c = poll_one(cqa, "write after the failures");
	CHECK(c.wr_id == 14, "a discarded request was posted: completion %lu", (unsigned long)c.wr_id);
	c = poll_one(cqa, "last send");
	CHECK(c.wr_id == 15, "last send completion %lu", (unsigned long)c.wr_id);

	/* UD: answer b's ping through an AH made from its completion. */
	struct ibv_wc uw = poll_plain(udcq, "a: UD receive");
	CHECK(uw.wr_id == 301 && (uw.wc_flags & IBV_WC_GRH) && uw.byte_len == 44 &&
	      uw.src_qp == b.ud_qpn && !memcmp(bufa + 7600 + 40, "ping", 4), "a: UD receive");
	struct ibv_ah_attr got;
	CHECK(!ibv_init_ah_from_wc(ctx, 1, &uw, (struct ibv_grh *)(bufa + 7600), &got) &&
	      got.is_global && got.grh.sgid_index == 1 &&
	      !memcmp(&got.grh.dgid, &b.gid, sizeof(b.gid)), "ibv_init_ah_from_wc");
	struct ibv_ah *ah = ibv_create_ah_from_wc(s.pd, &uw, (struct ibv_grh *)(bufa + 7600), 1);
	CHECK(ah, "ibv_create_ah_from_wc: %m");
	memcpy(bufa + 7800, "pong", 4);
	ibv_wr_start(udx);
	udx->wr_id = 302;
	udx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(udx);
	ibv_wr_set_ud_addr(udx, ah, uw.src_qp, 0x11111111);
	ibv_wr_set_sge(udx, mra->lkey, (uintptr_t)bufa + 7800, 4);
	CHECK(ibv_wr_complete(udx) == 0, "wr_complete UD");
	uw = poll_plain(udcq, "a: UD send");
	CHECK(uw.wr_id == 302, "a: UD send completion");
	ibv_wr_start(udx);
	udx->wr_id = 303;
	ibv_wr_send(udx);
	ibv_wr_set_sge(udx, mra->lkey, (uintptr_t)bufa + 7800, 4);
	CHECK(ibv_wr_complete(udx) == EINVAL, "a UD send without ibv_wr_set_ud_addr must fail");

	CHECK(read(rfd, &ready, 1) == 1, "b failed");
	CHECK(!ibv_destroy_ah(ah) && !ibv_destroy_qp(ud) && !ibv_destroy_cq(udcq), "a: UD cleanup");
	CHECK(ibv_start_poll(cqa, &pa) == ENOENT, "a: a completion beyond the last request");
	CHECK(write(wfd, &ready, 1) == 1, "pipe write");
	int st;
	CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0,
	      "side b failed");
	close_side(&s, qpa);
	printf("xverbs: ok\n");
	return 0;
}
