/*
 * Registered memory across fork(2) (issue 30 point 6; tests/multi_open.rs
 * runs it against a function whose link reflects every frame, so QPs of the
 * function reach each other). vrnic's library answers
 * ibv_is_fork_initialized() with IBV_FORK_UNNEEDED, as rdma-core does on a
 * kernel with copy-on-fork: the child must get a private copy of the
 * parent's registered pages, and the parent's MRs must go on working.
 *
 * Two RC QPs a, b in one context. a's registered buffer is filled with
 * pattern 1, then the process forks: the child checks it sees pattern 1,
 * writes pattern 2 over its copy and exits. The parent then finds its
 * buffer still holding pattern 1, SENDs it to b (b receives pattern 1),
 * and b's buffer, written by the device after the fork, holds what was
 * sent. Then a second child, forked after b received, sees b's received
 * data in its copy, and the parent WRITEs a fresh pattern 3 into b while
 * that child waits: the child's copy keeps what it had. Prints
 * "fork_copy: ok" and exits 0, or names the failed step and exits 1.
 * Every wait is bounded.
 */
#include <sys/wait.h>
#include <unistd.h>
#include "rc_pair.h"

/* The child's verdict: 0 when its copy holds pattern seed, then it writes
 * pattern 2 over it. */
static int child_copy(unsigned char *buf, size_t len, unsigned seed)
{
	if (!intact(buf, len, seed))
		return 2;
	fill(buf, len, 2);
	return 0;
}

static void wait_child(pid_t pid, const char *what)
{
	int st = 0;
	long long end = now_ms() + 20000;
	pid_t r;
	while ((r = waitpid(pid, &st, WNOHANG)) == 0 && now_ms() < end)
		poll(NULL, 0, 5);
	CHECK(r == pid, "%s: the child did not exit within 20 s", what);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: child status %#x", what, st);
}

int main(void)
{
	struct ibv_device **list = one_device_list();
	struct ibv_context *ctx = ibv_open_device(list[0]);
	CHECK(ctx, "ibv_open_device: errno %d", errno);
	CHECK(ibv_is_fork_initialized() == IBV_FORK_UNNEEDED, "ibv_is_fork_initialized: %d",
	      ibv_is_fork_initialized());
	CHECK(ibv_fork_init() == 0, "ibv_fork_init: errno %d", errno);

	struct side a, b;
	side_init(&a, ctx, 0);
	side_init(&b, ctx, 0);
	side_connect(&a, b.qp->qp_num);
	side_connect(&b, a.qp->qp_num);

	/* The child's copy of a's buffer is its own. */
	fill(a.buf, BUF, 1);
	pid_t pid = fork();
	CHECK(pid >= 0, "fork: errno %d", errno);
	if (pid == 0)
		_exit(child_copy(a.buf, BUF, 1));
	wait_child(pid, "first fork");
	CHECK(intact(a.buf, BUF, 1), "the child's write reached the parent's registered buffer");

	/* The parent's MRs still work: a's buffer, as it is, goes to b. */
	memset(b.buf, 0, BUF);
	post_recv(&b, 0, BUF);
	post_send(&a, 0, BUF, a.mr->lkey, 1);
	struct ibv_wc wc = side_wait(&a, "SEND after fork");
	CHECK(wc.status == IBV_WC_SUCCESS, "SEND after fork: %s", ibv_wc_status_str(wc.status));
	wc = side_wait(&b, "RECV after fork");
	CHECK(wc.status == IBV_WC_SUCCESS && wc.byte_len == BUF, "RECV after fork: %s, %u bytes",
	      ibv_wc_status_str(wc.status), wc.byte_len);
	CHECK(intact(b.buf, BUF, 1), "b received other data than a's buffer held");

	/* A child forked now keeps its copy while the device writes the parent's. */
	int go[2];
	CHECK(pipe(go) == 0, "pipe: errno %d", errno);
	pid = fork();
	CHECK(pid >= 0, "fork: errno %d", errno);
	if (pid == 0) {
		char c;
		close(go[1]);
		struct pollfd p = { .fd = go[0], .events = POLLIN };
		if (poll(&p, 1, 20000) != 1 || read(go[0], &c, 1) != 1)
			_exit(3);
		_exit(intact(b.buf, BUF, 1) ? 0 : 4);
	}
	close(go[0]);
	fill(a.buf, BUF, 3);
	struct ibv_sge sge = { .addr = (uintptr_t)a.buf, .length = BUF, .lkey = a.mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 9, .sg_list = &sge, .num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = (uintptr_t)b.buf, .rkey = b.mr->rkey } }, *bad;
	CHECK(ibv_post_send(a.qp, &wr, &bad) == 0, "ibv_post_send WRITE: errno %d", errno);
	wc = side_wait(&a, "WRITE");
	CHECK(wc.status == IBV_WC_SUCCESS, "WRITE: %s", ibv_wc_status_str(wc.status));
	CHECK(intact(b.buf, BUF, 3), "the WRITE did not land in the parent's buffer");
	CHECK(write(go[1], "g", 1) == 1, "pipe write");
	wait_child(pid, "second fork");

	side_fini(&a);
	side_fini(&b);
	CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
	ibv_free_device_list(list);
	printf("fork_copy: ok\n");
	return 0;
}
