/*
 * Completion channels of two contexts of one process on one vrnic function
 * (tests/multi_open.rs runs it, as multi_open.c): each channel gets only
 * its own context's completion events. QPs of contexts 0 and 1 connected,
 * both CQs armed, each on a channel of its own; an unsignaled SEND 0 -> 1
 * completes only on context 1's CQ (its receive), so only its channel may
 * become readable and deliver its CQ; then the other way round, read with
 * the blocking ibv_get_cq_event. Prints "multi_events: ok" and exits 0, or
 * names the failed step and exits 1. Every wait is bounded (poll(2)
 * timeouts; the blocking read follows a readable poll).
 */
#include "rc_pair.h"

/* Arms both CQs, sends from a to b unsignaled, and checks that b's
 * channel, and only it, delivers b's CQ. */
static void one_way(struct side *a, struct side *b, const char *name, unsigned seed)
{
	CHECK(ibv_req_notify_cq(a->cq, 0) == 0 && ibv_req_notify_cq(b->cq, 0) == 0,
	      "%s: ibv_req_notify_cq", name);
	CHECK(!readable(a->ch->fd, 0) && !readable(b->ch->fd, 0), "%s: a channel readable before", name);
	memset(b->buf, 0, 1024);
	post_recv(b, 0, 1024);
	fill(a->buf, 1024, seed);
	post_send(a, 0, 1024, a->mr->lkey, 0);
	CHECK(readable(b->ch->fd, 10000), "%s: the receiver's channel not readable within 10 s", name);
	struct ibv_cq *cq = NULL;
	void *cookie = NULL;
	CHECK(ibv_get_cq_event(b->ch, &cq, &cookie) == 0, "%s: ibv_get_cq_event", name);
	CHECK(cq == b->cq && cookie == b, "%s: the event names CQ %p, want %p", name, (void *)cq,
	      (void *)b->cq);
	ibv_ack_cq_events(cq, 1);
	struct ibv_wc wc = side_wait(b, name);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV && wc.byte_len == 1024,
	      "%s: RECV status %d (%s)", name, wc.status, ibv_wc_status_str(wc.status));
	CHECK(intact(b->buf, 1024, seed), "%s: the received data differ", name);
	/* The sender's CQ had no completion: its channel stays quiet. */
	CHECK(!readable(a->ch->fd, 200), "%s: the sender's channel got an event", name);
	CHECK(ibv_poll_cq(a->cq, 1, &wc) == 0, "%s: a completion on the sender's CQ", name);
}

int main(void)
{
	struct ibv_device **list = one_device_list();
	struct ibv_context *c0 = ibv_open_device(list[0]);
	struct ibv_context *c1 = ibv_open_device(list[0]);
	CHECK(c0 && c1, "ibv_open_device twice: errno %d", errno);
	struct side s0, s1;
	side_init(&s0, c0, 1);
	side_init(&s1, c1, 1);
	/* Unsignaled sends complete nothing on the sender's CQ. */
	side_connect(&s0, s1.qp->qp_num);
	side_connect(&s1, s0.qp->qp_num);

	one_way(&s0, &s1, "0 -> 1", 1);
	one_way(&s1, &s0, "1 -> 0", 2);
	one_way(&s0, &s1, "0 -> 1 again", 3);

	/* Async: neither context got any. */
	CHECK(!readable(c0->async_fd, 0) && !readable(c1->async_fd, 0), "an async event");
	side_fini(&s0);
	side_fini(&s1);
	CHECK(ibv_close_device(c0) == 0 && ibv_close_device(c1) == 0, "ibv_close_device");
	ibv_free_device_list(list);
	printf("multi_events: ok\n");
	return 0;
}
