/*
 * vrnic's librdmacm.so.1 against a scripted agent (tests/cm_agent.rs),
 * the way rdma-core's examples (rping, ucmatose) drive it.
 *
 *   cm_agent guid      prints "guid 0x..." of the first device (as
 *                      ibv_get_device_guid gives it, network order, printed raw)
 *   cm_agent active    rping's active side: resolve address and route,
 *                      a QP, connect (ESTABLISHED after the library's
 *                      RTR/RTS and ACCEPT), disconnect
 *   cm_agent passive   listen, a request as a new id with the listener's
 *                      device, a QP, accept, ESTABLISHED
 *   cm_agent errors    the agent's errors as errno and event statuses
 *   cm_agent nonblock  O_NONBLOCK on the channel fd: EAGAIN, then poll
 *   cm_agent vanish    blocked in rdma_get_cm_event when the agent goes
 *   cm_agent closed    the channel destroyed under a thread blocked in
 *                      rdma_get_cm_event: it stays blocked (go line on stdin)
 *   cm_agent threads   a thread blocked in rdma_get_cm_event while another
 *                      sends a command (after a line on stdin: the test
 *                      says when the first is blocked)
 *   cm_agent ep        rdma_server's synchronous passive side:
 *                      rdma_create_ep, rdma_listen, rdma_get_request (QP
 *                      made), rdma_accept, rdma_disconnect
 *   cm_agent ud        a UD id: its QP to RTS at creation, ESTABLISHED (SIDR)
 *                      with the peer's QP, Q_Key and address handle
 *   cm_agent rejected  a connection rejected: REJECTED with the reason,
 *                      the QP in ERROR
 *   cm_agent noagent   no agent: rdma_create_event_channel fails ENODEV
 *
 * Prints "cm_agent: ok" at the end when all passed.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <rdma/rdma_cma.h>
#include <infiniband/verbs.h>

#define FAIL(...) do { fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); exit(1); } while (0)
#define CHECK(c, ...) do { if (!(c)) FAIL(__VA_ARGS__); } while (0)
#define MINUS1(call, e) do { errno = 0; long r_ = (long)(call); \
	CHECK(r_ == -1 && errno == (e), "%s: want -1 with errno %d (%s), got %ld errno %d (%s)", \
	      #call, (e), strerror(e), r_, errno, strerror(errno)); } while (0)
#define OK(call) do { errno = 0; int r_ = (call); \
	CHECK(r_ == 0, "%s: %d errno %d (%s)", #call, r_, errno, strerror(errno)); } while (0)

static struct sockaddr_in addr(const char *ip, int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	inet_pton(AF_INET, ip, &a.sin_addr);
	return a;
}

/* The next event, which must be `want` with status `status`. */
static struct rdma_cm_event *expect(struct rdma_event_channel *ch, enum rdma_cm_event_type want,
				    int status)
{
	struct rdma_cm_event *ev = NULL;
	OK(rdma_get_cm_event(ch, &ev));
	CHECK(ev->event == want && ev->status == status, "event %s status %d, want %s status %d",
	      rdma_event_str(ev->event), ev->status, rdma_event_str(want), status);
	printf("event %s\n", rdma_event_str(ev->event));
	return ev;
}

static enum ibv_qp_state qp_state(struct ibv_qp *qp)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr i;
	OK(ibv_query_qp(qp, &a, IBV_QP_STATE, &i));
	return a.qp_state;
}

static struct ibv_qp_init_attr qp_attr(void)
{
	struct ibv_qp_init_attr a;
	memset(&a, 0, sizeof a);
	a.cap.max_send_wr = 8;
	a.cap.max_recv_wr = 8;
	a.cap.max_send_sge = 1;
	a.cap.max_recv_sge = 1;
	a.qp_type = IBV_QPT_RC;
	return a;
}

static void guid(void)
{
	int n = 0;
	struct ibv_device **l = ibv_get_device_list(&n);
	CHECK(l && n > 0, "no device");
	printf("guid %#llx\n", (unsigned long long)ibv_get_device_guid(l[0]));
	ibv_free_device_list(l);
}

static void active(void)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	CHECK(ch, "rdma_create_event_channel: errno %d", errno);
	struct rdma_cm_id *id = NULL;
	int ctx;
	OK(rdma_create_id(ch, &id, &ctx, RDMA_PS_TCP));
	struct sockaddr_in dst = addr("127.0.0.1", 7471);
	OK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000));
	/* The event arrives through the channel's fd. */
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	CHECK(poll(&p, 1, 10000) == 1, "the channel's fd did not become readable");
	struct rdma_cm_event *ev = expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED, 0);
	CHECK(ev->id == id, "event's id");
	CHECK(id->verbs && id->pd && id->port_num == 1, "ADDR_RESOLVED: verbs %p pd %p port %u",
	      (void *)id->verbs, (void *)id->pd, id->port_num);
	CHECK(rdma_get_dst_port(id) == htons(7471) && rdma_get_src_port(id) == htons(40000),
	      "ports %u %u", ntohs(rdma_get_src_port(id)), ntohs(rdma_get_dst_port(id)));
	OK(rdma_ack_cm_event(ev));
	OK(rdma_resolve_route(id, 2000));
	ev = expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED, 0);
	CHECK(id->route.num_paths == 1 && id->route.path_rec &&
	      id->route.path_rec[0].pkey == htons(0xffff), "route: %d paths", id->route.num_paths);
	OK(rdma_ack_cm_event(ev));

	struct ibv_qp_init_attr qa = qp_attr();
	OK(rdma_create_qp(id, NULL, &qa));
	CHECK(id->qp && id->send_cq && id->recv_cq && qp_state(id->qp) == IBV_QPS_INIT,
	      "rdma_create_qp: QP in INIT with the library's CQs");
	printf("qpn %u\n", id->qp->qp_num);

	struct rdma_conn_param cp;
	memset(&cp, 0, sizeof cp);
	cp.private_data = "hello";
	cp.private_data_len = 6;
	cp.responder_resources = 1;
	cp.initiator_depth = 1;
	cp.retry_count = 7;
	cp.rnr_retry_count = 7;
	OK(rdma_connect(id, &cp));
	ev = expect(ch, RDMA_CM_EVENT_ESTABLISHED, 0);
	CHECK(ev->param.conn.private_data_len == 6 &&
	      !strcmp(ev->param.conn.private_data, "world"), "the REP's private data");
	CHECK(qp_state(id->qp) == IBV_QPS_RTS, "QP in RTS after ESTABLISHED");
	OK(rdma_ack_cm_event(ev));

	OK(rdma_disconnect(id));
	CHECK(qp_state(id->qp) == IBV_QPS_ERR, "QP in ERR after rdma_disconnect");
	ev = expect(ch, RDMA_CM_EVENT_DISCONNECTED, 0);
	OK(rdma_ack_cm_event(ev));
	rdma_destroy_qp(id);
	OK(rdma_destroy_id(id));
	rdma_destroy_event_channel(ch);
}

static void passive(void)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	CHECK(ch, "rdma_create_event_channel: errno %d", errno);
	struct rdma_cm_id *listen = NULL;
	int ctx;
	OK(rdma_create_id(ch, &listen, &ctx, RDMA_PS_TCP));
	struct sockaddr_in src = addr("127.0.0.1", 7471);
	OK(rdma_bind_addr(listen, (struct sockaddr *)&src));
	CHECK(listen->verbs && listen->pd, "bound: a device");
	OK(rdma_listen(listen, 4));
	struct rdma_cm_event *ev = expect(ch, RDMA_CM_EVENT_CONNECT_REQUEST, 0);
	struct rdma_cm_id *id = ev->id;
	CHECK(ev->listen_id == listen && id && id != listen, "the request's ids");
	CHECK(id->verbs == listen->verbs && id->pd == listen->pd && id->context == &ctx &&
	      id->channel == ch && id->ps == RDMA_PS_TCP && id->qp_type == IBV_QPT_RC,
	      "the new id has the listener's device, PD, context, channel");
	CHECK(ev->param.conn.private_data_len == 3 && !strcmp(ev->param.conn.private_data, "hi"),
	      "the REQ's private data");
	struct ibv_qp_init_attr qa = qp_attr();
	OK(rdma_create_qp(id, NULL, &qa));
	CHECK(qp_state(id->qp) == IBV_QPS_INIT, "QP in INIT");
	struct rdma_conn_param cp;
	memset(&cp, 0, sizeof cp);
	cp.responder_resources = 1;
	cp.initiator_depth = 1;
	OK(rdma_accept(id, &cp));
	CHECK(qp_state(id->qp) == IBV_QPS_RTS, "QP in RTS after rdma_accept");
	OK(rdma_ack_cm_event(ev));
	ev = expect(ch, RDMA_CM_EVENT_ESTABLISHED, 0);
	CHECK(ev->id == id, "ESTABLISHED for the new id");
	OK(rdma_ack_cm_event(ev));
	rdma_destroy_qp(id);
	OK(rdma_destroy_id(id));
	OK(rdma_destroy_id(listen));
	rdma_destroy_event_channel(ch);
}

static void errors(void)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	CHECK(ch, "rdma_create_event_channel: errno %d", errno);
	struct rdma_cm_id *id = NULL;
	OK(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP));
	struct sockaddr_in dst = addr("10.9.9.9", 7471);
	/* 1: the agent refuses the command. */
	MINUS1(rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000), EHOSTUNREACH);
	/* 2: accepted, then ADDR_ERROR with the agent's status. */
	OK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000));
	struct rdma_cm_event *ev = expect(ch, RDMA_CM_EVENT_ADDR_ERROR, -ETIMEDOUT);
	OK(rdma_ack_cm_event(ev));
	/* 3: ADDR_RESOLVED naming a device this process does not have. */
	OK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000));
	ev = expect(ch, RDMA_CM_EVENT_ADDR_ERROR, -ENODEV);
	OK(rdma_ack_cm_event(ev));
	CHECK(!id->verbs, "no device");
	/* Calls needing a device fail, not crash. */
	struct ibv_qp_init_attr qa = qp_attr();
	MINUS1(rdma_create_qp(id, NULL, &qa), EINVAL);
	MINUS1(rdma_disconnect(id), EINVAL);
	/* 4: a synchronous id: the event's status is the call's errno. */
	struct rdma_cm_id *sid = NULL;
	OK(rdma_create_id(NULL, &sid, NULL, RDMA_PS_TCP));
	MINUS1(rdma_resolve_addr(sid, NULL, (struct sockaddr *)&dst, 2000), ETIMEDOUT);
	OK(rdma_destroy_id(sid));
	/* 5: multicast is not supported. */
	MINUS1(rdma_join_multicast(id, (struct sockaddr *)&dst, NULL), ENOSYS);
	OK(rdma_destroy_id(id));
	rdma_destroy_event_channel(ch);
}

static void nonblock(void)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	CHECK(ch, "rdma_create_event_channel: errno %d", errno);
	int fl = fcntl(ch->fd, F_GETFL);
	CHECK(fl >= 0 && fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK) == 0, "O_NONBLOCK");
	struct rdma_cm_id *id = NULL;
	OK(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP));
	struct rdma_cm_event *ev = NULL;
	MINUS1(rdma_get_cm_event(ch, &ev), EAGAIN);
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	CHECK(poll(&p, 1, 0) == 0, "the fd is readable with no event");
	struct sockaddr_in dst = addr("10.9.9.9", 7471);
	OK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000));
	CHECK(poll(&p, 1, 10000) == 1, "the fd did not become readable");
	ev = expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED, 0);
	OK(rdma_ack_cm_event(ev));
	CHECK(poll(&p, 1, 0) == 0, "the fd stays readable after the last event");
	MINUS1(rdma_get_cm_event(ch, &ev), EAGAIN);
	OK(rdma_destroy_id(id));
	rdma_destroy_event_channel(ch);
}

static void vanish(void)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	CHECK(ch, "rdma_create_event_channel: errno %d", errno);
	struct rdma_cm_event *ev = NULL;
	printf("waiting\n");
	errno = 0;
	int r = rdma_get_cm_event(ch, &ev);
	CHECK(r == -1 && errno != 0 && errno != EAGAIN, "rdma_get_cm_event: %d errno %d", r, errno);
	printf("gone errno %d\n", errno);
	rdma_destroy_event_channel(ch);
}

static struct rdma_event_channel *waiter_ch;

static void *waiter(void *arg)
{
	struct rdma_cm_event **ev = arg;
	if (rdma_get_cm_event(waiter_ch, ev))
		*ev = NULL;
	return NULL;
}

static void threads(void)
{
	waiter_ch = rdma_create_event_channel();
	CHECK(waiter_ch, "rdma_create_event_channel: errno %d", errno);
	struct rdma_cm_id *id = NULL;
	OK(rdma_create_id(waiter_ch, &id, NULL, RDMA_PS_TCP));
	struct rdma_cm_event *ev = NULL;
	pthread_t t;
	CHECK(pthread_create(&t, NULL, waiter, &ev) == 0, "pthread_create");
	char line[16];
	CHECK(fgets(line, sizeof line, stdin), "no go line");
	struct sockaddr_in dst = addr("10.9.9.9", 7471);
	OK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000));
	CHECK(pthread_join(t, NULL) == 0, "pthread_join");
	CHECK(ev && ev->event == RDMA_CM_EVENT_ADDR_RESOLVED && ev->id == id,
	      "the waiting thread got the event");
	OK(rdma_ack_cm_event(ev));
	OK(rdma_destroy_id(id));
	rdma_destroy_event_channel(waiter_ch);
}

/* rping's exit: main destroys the channel while its CM thread waits in
 * rdma_get_cm_event. As with the kernel (the blocked read(2) holds the file),
 * the waiter stays blocked rather than returning an error. */
static void closed(void)
{
	waiter_ch = rdma_create_event_channel();
	CHECK(waiter_ch, "rdma_create_event_channel: errno %d", errno);
	struct rdma_cm_event *ev = (struct rdma_cm_event *)1;
	pthread_t t;
	CHECK(pthread_create(&t, NULL, waiter, &ev) == 0, "pthread_create");
	char line[16];
	CHECK(fgets(line, sizeof line, stdin), "no go line");
	rdma_destroy_event_channel(waiter_ch);
	usleep(300 * 1000);
	CHECK(ev == (struct rdma_cm_event *)1, "the waiter returned after the channel was destroyed");
	printf("still waiting\n");
}

static void ep(void)
{
	struct rdma_addrinfo hints, *res = NULL;
	memset(&hints, 0, sizeof hints);
	hints.ai_flags = RAI_PASSIVE;
	hints.ai_port_space = RDMA_PS_TCP;
	OK(rdma_getaddrinfo("127.0.0.1", "7471", &hints, &res));
	struct ibv_qp_init_attr qa = qp_attr();
	struct rdma_cm_id *listen = NULL, *id = NULL;
	OK(rdma_create_ep(&listen, res, NULL, &qa));
	CHECK(listen->verbs && listen->channel, "a bound synchronous endpoint");
	OK(rdma_listen(listen, 0));
	OK(rdma_get_request(listen, &id));
	CHECK(id != listen && id->qp && id->event &&
	      id->event->event == RDMA_CM_EVENT_CONNECT_REQUEST, "a request with a QP");
	CHECK(id->channel && id->channel != listen->channel, "the request's id has its own channel");
	CHECK(qp_state(id->qp) == IBV_QPS_INIT, "the request's QP in INIT");
	OK(rdma_accept(id, NULL));
	CHECK(qp_state(id->qp) == IBV_QPS_RTS && id->event->event == RDMA_CM_EVENT_ESTABLISHED,
	      "accepted synchronously: ESTABLISHED, QP in RTS");
	OK(rdma_disconnect(id));
	CHECK(id->event->event == RDMA_CM_EVENT_DISCONNECTED, "disconnected synchronously");
	rdma_destroy_ep(id);
	rdma_destroy_ep(listen);
	rdma_freeaddrinfo(res);
}

/* An id of `ps` with its address and route resolved, on channel `ch`. */
static struct rdma_cm_id *resolved(struct rdma_event_channel *ch, enum rdma_port_space ps)
{
	struct rdma_cm_id *id = NULL;
	OK(rdma_create_id(ch, &id, NULL, ps));
	struct sockaddr_in dst = addr("127.0.0.1", 7471);
	OK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000));
	OK(rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED, 0)));
	OK(rdma_resolve_route(id, 2000));
	OK(rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED, 0)));
	CHECK(id->verbs, "a device");
	return id;
}

static void ud(void)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	CHECK(ch, "rdma_create_event_channel: errno %d", errno);
	struct rdma_cm_id *id = resolved(ch, RDMA_PS_UDP);
	CHECK(id->qp_type == IBV_QPT_UD, "PS_UDP: UD");
	struct ibv_qp_init_attr qa = qp_attr();
	qa.qp_type = IBV_QPT_UD;
	OK(rdma_create_qp(id, NULL, &qa));
	CHECK(qp_state(id->qp) == IBV_QPS_RTS, "a UD QP is in RTS once created");
	struct rdma_conn_param cp;
	memset(&cp, 0, sizeof cp);
	OK(rdma_connect(id, &cp));
	struct rdma_cm_event *ev = expect(ch, RDMA_CM_EVENT_ESTABLISHED, 0);
	struct rdma_ud_param *u = &ev->param.ud;
	CHECK(u->qp_num == 0x99 && u->qkey == 0x01234567 && u->ah_attr.is_global == 1 &&
	      u->ah_attr.port_num == 1 && u->ah_attr.grh.dgid.raw[15] == 1 &&
	      u->ah_attr.grh.sgid_index == 1 && u->private_data_len == 5 &&
	      !strcmp(u->private_data, "sidr"),
	      "UD parameters: qpn %#x qkey %#x global %d", u->qp_num, u->qkey, u->ah_attr.is_global);
	OK(rdma_ack_cm_event(ev));
	rdma_destroy_qp(id);
	OK(rdma_destroy_id(id));
	rdma_destroy_event_channel(ch);
}

static void rejected(void)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	CHECK(ch, "rdma_create_event_channel: errno %d", errno);
	struct rdma_cm_id *id = resolved(ch, RDMA_PS_TCP);
	struct ibv_qp_init_attr qa = qp_attr();
	OK(rdma_create_qp(id, NULL, &qa));
	struct rdma_conn_param cp;
	memset(&cp, 0, sizeof cp);
	OK(rdma_connect(id, &cp));
	struct rdma_cm_event *ev = expect(ch, RDMA_CM_EVENT_REJECTED, 28);
	CHECK(ev->param.conn.private_data_len == 3 && !strcmp(ev->param.conn.private_data, "no"),
	      "the REJ's private data");
	CHECK(qp_state(id->qp) == IBV_QPS_ERR, "QP in ERROR after REJECTED");
	OK(rdma_ack_cm_event(ev));
	rdma_destroy_qp(id);
	OK(rdma_destroy_id(id));
	rdma_destroy_event_channel(ch);
}

static void noagent(void)
{
	errno = 0;
	struct rdma_event_channel *ch = rdma_create_event_channel();
	CHECK(!ch && errno == ENODEV, "rdma_create_event_channel: %p errno %d", (void *)ch, errno);
	struct rdma_cm_id *id = NULL;
	MINUS1(rdma_create_id(NULL, &id, NULL, RDMA_PS_TCP), ENODEV);
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "";
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (!strcmp(mode, "guid"))
		guid();
	else if (!strcmp(mode, "active"))
		active();
	else if (!strcmp(mode, "passive"))
		passive();
	else if (!strcmp(mode, "errors"))
		errors();
	else if (!strcmp(mode, "nonblock"))
		nonblock();
	else if (!strcmp(mode, "vanish"))
		vanish();
	else if (!strcmp(mode, "closed"))
		closed();
	else if (!strcmp(mode, "threads"))
		threads();
	else if (!strcmp(mode, "ep"))
		ep();
	else if (!strcmp(mode, "ud"))
		ud();
	else if (!strcmp(mode, "rejected"))
		rejected();
	else if (!strcmp(mode, "noagent"))
		noagent();
	else
		FAIL("usage: cm_agent guid|active|passive|errors|nonblock|vanish|closed|threads|ep|ud|rejected|noagent");
	printf("cm_agent: ok\n");
	return 0;
}
