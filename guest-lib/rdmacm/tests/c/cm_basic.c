/*
 * vrnic's librdmacm.so.1, what needs no working connection manager
 * (tests/cm_basic.rs).
 *
 *   cm_basic compare   prints, one per line prefixed "= ", what must equal
 *                      Debian's librdmacm: rdma_event_str of every event and
 *                      around, rdma_getaddrinfo for numeric, passive and
 *                      hint-only cases (run against both libraries, diffed)
 *   cm_basic checks    checks event channels, ids, options, ports, ECE,
 *                      getaddrinfo's errors, and the CM's calls against an
 *                      agent that refuses every command (its errno, or the
 *                      library's own EINVAL), never a crash
 *   cm_basic devices   prints "devices N" and "dev NAME" per device
 *
 * Prints "cm_basic: ok" at the end when all passed.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <rdma/rsocket.h>

#define FAIL(...) do { fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); exit(1); } while (0)
#define CHECK(c, ...) do { if (!(c)) FAIL(__VA_ARGS__); } while (0)
/* A call that must return -1 with errno e. */
#define MINUS1(call, e) do { errno = 0; long r_ = (long)(call); \
	CHECK(r_ == -1 && errno == (e), "%s: want -1 with errno %d (%s), got %ld errno %d (%s)", \
	      #call, (e), strerror(e), r_, errno, strerror(errno)); } while (0)
/* A call that must return NULL with errno e. */
#define REFUSED(call, e) do { errno = 0; void *r_ = (void *)(call); \
	CHECK(!r_ && errno == (e), "%s: want NULL with errno %d (%s), got %p errno %d (%s)", \
	      #call, (e), strerror(e), r_, errno, strerror(errno)); } while (0)
/* A void call that must set errno e. */
#define SETS(call, e) do { errno = 0; call; \
	CHECK(errno == (e), "%s: want errno %d (%s), got %d", #call, (e), strerror(e), errno); } while (0)
#define OK(call) do { errno = 0; int r_ = (call); \
	CHECK(r_ == 0, "%s: %d errno %d (%s)", #call, r_, errno, strerror(errno)); } while (0)

static const char *addr_str(const struct sockaddr *sa, socklen_t len, char *buf, size_t n)
{
	char host[INET6_ADDRSTRLEN] = "?";
	if (!sa)
		return "-";
	if (sa->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
		const struct sockaddr_in *s = (const void *)sa;
		inet_ntop(AF_INET, &s->sin_addr, host, sizeof host);
		snprintf(buf, n, "%s:%u", host, ntohs(s->sin_port));
	} else if (sa->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
		const struct sockaddr_in6 *s = (const void *)sa;
		inet_ntop(AF_INET6, &s->sin6_addr, host, sizeof host);
		snprintf(buf, n, "[%s]:%u", host, ntohs(s->sin6_port));
	} else {
		snprintf(buf, n, "family%d/len%u", sa->sa_family, (unsigned)len);
	}
	return buf;
}

static void gai(const char *tag, const char *node, const char *service,
		const struct rdma_addrinfo *hints)
{
	struct rdma_addrinfo *res = NULL;
	char a[128], b[128];
	errno = 0;
	int ret = rdma_getaddrinfo(node, service, hints, &res);
	if (ret) {
		printf("= gai %s ret %d errno %d\n", tag, ret, ret == -1 ? errno : 0);
		CHECK(!res, "gai %s: failed but res set", tag);
		return;
	}
	CHECK(res, "gai %s: no result", tag);
	printf("= gai %s ret 0 flags %#x family %d qp_type %d ps %#x src %s (%u) dst %s (%u) "
	       "canon %s/%s route %zu connect %zu next %s\n", tag, res->ai_flags, res->ai_family,
	       res->ai_qp_type, res->ai_port_space,
	       addr_str(res->ai_src_addr, res->ai_src_len, a, sizeof a), (unsigned)res->ai_src_len,
	       addr_str(res->ai_dst_addr, res->ai_dst_len, b, sizeof b), (unsigned)res->ai_dst_len,
	       res->ai_src_canonname ? res->ai_src_canonname : "-",
	       res->ai_dst_canonname ? res->ai_dst_canonname : "-",
	       res->ai_route_len, res->ai_connect_len, res->ai_next ? "yes" : "no");
	rdma_freeaddrinfo(res);
}

static void compare(void)
{
	for (int i = -1; i <= 17; i++)
		printf("= event %d %s\n", i, rdma_event_str(i));
	printf("= event 1000 %s\n", rdma_event_str(1000));

	struct rdma_addrinfo h;
	memset(&h, 0, sizeof h);
	h.ai_flags = RAI_PASSIVE | RAI_NUMERICHOST;
	gai("passive-v4", "127.0.0.1", "7471", &h);
	gai("passive-any", NULL, "7471", &h);
	h.ai_family = AF_INET;
	gai("passive-any-v4", NULL, "7471", &h);
	h.ai_family = AF_INET6;
	gai("passive-any-v6", NULL, "7471", &h);
	h.ai_flags = RAI_PASSIVE;
	h.ai_family = 0;
	h.ai_port_space = RDMA_PS_UDP;
	gai("passive-udp", "10.1.2.3", "18515", &h);

	memset(&h, 0, sizeof h);
	h.ai_flags = RAI_NUMERICHOST;
	gai("active-v4", "192.168.7.1", "7471", &h);
	gai("active-v6", "fe80::1", "7471", &h);
	gai("active-v4-noservice", "192.168.7.1", NULL, &h);
	gai("active-name-numeric", "no-such-host.invalid", "7471", &h);
	h.ai_family = AF_INET6;
	h.ai_flags |= RAI_FAMILY;
	gai("active-family-mismatch", "192.168.7.1", "7471", &h);
	gai("active-family-v6", "::1", "7471", &h);
	memset(&h, 0, sizeof h);
	h.ai_qp_type = IBV_QPT_UD;
	gai("active-ud", "10.0.0.9", "4791", &h);
	h.ai_port_space = RDMA_PS_IB;
	gai("active-ud-ps-ib", "10.0.0.9", "4791", &h);
	h.ai_qp_type = IBV_QPT_RC;
	gai("active-rc-ps-ib", "10.0.0.9", "4791", &h);
	h.ai_qp_type = 0;
	h.ai_port_space = RDMA_PS_TCP;
	gai("active-ps-tcp", "10.0.0.9", "4791", &h);
	gai("nohints", "10.0.0.9", "4791", NULL);
	gai("nohints-v6", "2001:db8::5", NULL, NULL);
	gai("nohints-service", NULL, "4791", NULL);
	gai("nothing", NULL, NULL, NULL);

	/* Hints only: copied, with their addresses. */
	struct sockaddr_in src = { .sin_family = AF_INET, .sin_port = htons(1234) };
	struct sockaddr_in dst = { .sin_family = AF_INET, .sin_port = htons(5678) };
	inet_pton(AF_INET, "10.0.0.1", &src.sin_addr);
	inet_pton(AF_INET, "10.0.0.2", &dst.sin_addr);
	memset(&h, 0, sizeof h);
	h.ai_flags = RAI_NUMERICHOST | RAI_NOROUTE;
	h.ai_family = AF_INET;
	h.ai_qp_type = IBV_QPT_RC;
	h.ai_port_space = RDMA_PS_TCP;
	h.ai_src_addr = (struct sockaddr *)&src;
	h.ai_src_len = sizeof src;
	h.ai_dst_addr = (struct sockaddr *)&dst;
	h.ai_dst_len = sizeof dst;
	gai("hints-only", NULL, NULL, &h);
	/* A hinted source beside a resolved destination. */
	gai("hint-src-active", "10.0.0.3", "99", &h);
	h.ai_flags |= RAI_PASSIVE;
	gai("hint-src-passive", "10.0.0.4", "99", &h);
}

static void checks(void)
{
	/* Event channel (a connection to the agent): a pollable fd, quiet
	 * while no event exists. */
	struct rdma_event_channel *ch = rdma_create_event_channel();
	CHECK(ch && ch->fd >= 0, "rdma_create_event_channel: %p errno %d", (void *)ch, errno);
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	CHECK(poll(&p, 1, 0) == 0, "a new channel's fd is readable (revents %#x)", p.revents);
	int fl = fcntl(ch->fd, F_GETFL);
	CHECK(fl >= 0 && fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK) == 0, "O_NONBLOCK on the channel fd");

	/* Ids. */
	struct rdma_cm_id *id = NULL, *ud = NULL, *ib = NULL, *sync_id = NULL;
	int ctx;
	OK(rdma_create_id(ch, &id, &ctx, RDMA_PS_TCP));
	CHECK(id && id->channel == ch && id->context == &ctx && id->ps == RDMA_PS_TCP &&
	      id->qp_type == IBV_QPT_RC && !id->verbs && !id->qp && !id->pd && !id->event &&
	      id->port_num == 0 && !id->route.path_rec && id->route.num_paths == 0,
	      "rdma_create_id(PS_TCP): fields");
	OK(rdma_create_id(ch, &ud, NULL, RDMA_PS_UDP));
	CHECK(ud->qp_type == IBV_QPT_UD && ud->ps == RDMA_PS_UDP, "PS_UDP: UD");
	OK(rdma_create_id(ch, &ib, NULL, RDMA_PS_IB));
	CHECK(ib->qp_type == IBV_QPT_RC, "PS_IB: RC");
	OK(rdma_create_id(NULL, &sync_id, NULL, RDMA_PS_IPOIB));
	CHECK(sync_id->channel && sync_id->channel != ch && sync_id->channel->fd >= 0 &&
	      sync_id->qp_type == IBV_QPT_UD, "a synchronous id has a channel of its own");
	int sync_fd = sync_id->channel->fd;
	MINUS1(rdma_create_id(ch, &id, NULL, 0x1234), EINVAL);
	MINUS1(rdma_create_id(ch, NULL, NULL, RDMA_PS_TCP), EINVAL);

	/* Ports: 0 unbound; the address the id holds otherwise. */
	CHECK(rdma_get_src_port(id) == 0 && rdma_get_dst_port(id) == 0, "unbound ports are 0");
	id->route.addr.src_sin.sin_family = AF_INET;
	id->route.addr.src_sin.sin_port = htons(7471);
	id->route.addr.dst_sin6.sin6_family = AF_INET6;
	id->route.addr.dst_sin6.sin6_port = htons(18515);
	CHECK(rdma_get_src_port(id) == htons(7471), "src port %u", ntohs(rdma_get_src_port(id)));
	CHECK(rdma_get_dst_port(id) == htons(18515), "dst port %u", ntohs(rdma_get_dst_port(id)));
	memset(&id->route.addr, 0, sizeof id->route.addr);
	errno = 0;
	CHECK(rdma_get_src_port(NULL) == 0 && errno == EINVAL, "rdma_get_src_port(NULL)");
	errno = 0;
	CHECK(rdma_get_dst_port(NULL) == 0 && errno == EINVAL, "rdma_get_dst_port(NULL)");

	/* Options, checked as the kernel's rdma_ucm checks them. */
	uint8_t tos = 32, tmo = 14;
	int one = 1;
	OK(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, sizeof tos));
	OK(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &tmo, sizeof tmo));
	OK(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &one, sizeof one));
	OK(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, &one, sizeof one));
	MINUS1(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &one, sizeof one), EINVAL);
	MINUS1(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &tos, sizeof tos), EINVAL);
	MINUS1(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, NULL, 1), EFAULT);
	MINUS1(rdma_set_option(id, RDMA_OPTION_ID, 77, &one, sizeof one), ENOSYS);
	MINUS1(rdma_set_option(id, 99, 0, &one, sizeof one), ENOSYS);
	struct ibv_path_data path[2];
	memset(path, 0, sizeof path);
	MINUS1(rdma_set_option(id, RDMA_OPTION_IB, RDMA_OPTION_IB_PATH, path, sizeof path), EINVAL);
	MINUS1(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, (size_t)64 << 20), EINVAL);
	MINUS1(rdma_set_option(NULL, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, 1), EINVAL);

	/* ECE, as rdma-core checks it. */
	struct ibv_ece ece = { 0 };
	MINUS1(rdma_set_local_ece(id, &ece), EINVAL);
	ece.vendor_id = 0x15b3;
	ece.options = 7;
	OK(rdma_set_local_ece(id, &ece));
	ece.comp_mask = 1;
	MINUS1(rdma_set_local_ece(id, &ece), EINVAL);
	MINUS1(rdma_set_local_ece(NULL, &ece), EINVAL);
	memset(&ece, 0xff, sizeof ece);
	OK(rdma_get_remote_ece(id, &ece));
	CHECK(ece.vendor_id == 0 && ece.options == 0 && ece.comp_mask == 0, "no remote ECE");
	MINUS1(rdma_get_remote_ece(id, NULL), EINVAL);

	/* The CM's calls against an agent that refuses every command
	 * (EOPNOTSUPP): its errno, or the library's own EINVAL where the id
	 * has no device, is not synchronous, or is NULL; never a crash. */
	struct sockaddr_in dst = { .sin_family = AF_INET, .sin_port = htons(7471) };
	inet_pton(AF_INET, "10.0.0.2", &dst.sin_addr);
	struct rdma_cm_event *ev = NULL;
	struct rdma_conn_param cp = { 0 };
	struct ibv_qp_init_attr qpa = { 0 };
	struct ibv_qp_attr qattr;
	int mask;
	MINUS1(rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000), EOPNOTSUPP);
	MINUS1(rdma_resolve_addr(NULL, NULL, (struct sockaddr *)&dst, 2000), EINVAL);
	MINUS1(rdma_resolve_addr(id, NULL, NULL, 2000), EINVAL);
	MINUS1(rdma_bind_addr(id, (struct sockaddr *)&dst), EOPNOTSUPP);
	MINUS1(rdma_bind_addr(NULL, NULL), EINVAL);
	MINUS1(rdma_resolve_route(id, 2000), EOPNOTSUPP);
	MINUS1(rdma_listen(id, 10), EOPNOTSUPP);
	MINUS1(rdma_connect(id, &cp), EINVAL);
	MINUS1(rdma_accept(id, NULL), EINVAL);
	MINUS1(rdma_reject(id, NULL, 0), EOPNOTSUPP);
	MINUS1(rdma_disconnect(id), EINVAL);
	MINUS1(rdma_establish(id), EOPNOTSUPP);
	MINUS1(rdma_create_qp(id, NULL, &qpa), EINVAL);
	MINUS1(rdma_create_qp(id, NULL, NULL), EINVAL);
	MINUS1(rdma_init_qp_attr(id, &qattr, &mask), EOPNOTSUPP);
	MINUS1(rdma_notify(id, IBV_EVENT_COMM_EST), EOPNOTSUPP);
	OK(rdma_migrate_id(id, ch));
	MINUS1(rdma_join_multicast(id, (struct sockaddr *)&dst, NULL), ENOSYS);
	MINUS1(rdma_leave_multicast(id, (struct sockaddr *)&dst), ENOSYS);
	MINUS1(rdma_get_request(id, &ud), EINVAL);
	MINUS1(rdma_get_request(id, NULL), EINVAL);
	MINUS1(rdma_get_cm_event(ch, &ev), EAGAIN);
	MINUS1(rdma_get_cm_event(NULL, &ev), EINVAL);
	MINUS1(rdma_ack_cm_event(NULL), EINVAL);
	MINUS1(rdma_create_ep(NULL, NULL, NULL, NULL), EINVAL);
	SETS(rdma_destroy_qp(id), 0);
	SETS(rdma_destroy_qp(NULL), EINVAL);
	SETS(rdma_destroy_srq(NULL), EINVAL);
	/* rsockets (rdma-core's rsocket.c): a stream rsocket is a synchronous
	 * id, its connect fails with the agent's errno; argument checks; calls
	 * on a descriptor that is no rsocket (EBADF); rpoll on an ordinary
	 * descriptor is poll(2). */
	int rs = rsocket(AF_INET, SOCK_STREAM, 0);
	CHECK(rs >= 0, "rsocket: %d errno %d", rs, errno);
	MINUS1(rconnect(rs, (struct sockaddr *)&dst, sizeof dst), EOPNOTSUPP);
	OK(rclose(rs));
	MINUS1(rsocket(AF_UNIX, SOCK_STREAM, 0), ENOTSUP);
	MINUS1(rsocket(AF_INET, SOCK_RAW, 0), ENOTSUP);
	MINUS1(rsend(3, "x", 1, 0), EBADF);
	/* rdma-core's rclose returns EBADF itself, not -1. */
	CHECK(rclose(3) == EBADF, "rclose of no rsocket");
	errno = 0;
	CHECK(rpoll(&p, 1, 0) == 0 && p.revents == 0, "rpoll of an idle channel: %d", errno);
	MINUS1(rfcntl(3, F_GETFL), EBADF);
	MINUS1(riomap(3, NULL, 0, 0, 0, 0), EBADF);
	errno = 0;
	CHECK(riowrite(3, "x", 1, 0, 0) == (size_t)-1 && errno == EBADF, "riowrite");

	/* getaddrinfo's argument checks. */
	struct rdma_addrinfo *res = NULL;
	MINUS1(rdma_getaddrinfo(NULL, NULL, NULL, &res), EINVAL);
	MINUS1(rdma_getaddrinfo("127.0.0.1", NULL, NULL, NULL), EINVAL);
	rdma_freeaddrinfo(NULL);

	/* Destroy: ids, then the channel (its fd closed). */
	OK(rdma_destroy_id(id));
	OK(rdma_destroy_id(ud));
	OK(rdma_destroy_id(ib));
	OK(rdma_destroy_id(sync_id));
	CHECK(fcntl(sync_fd, F_GETFD) == -1 && errno == EBADF, "a synchronous id's channel is closed");
	MINUS1(rdma_destroy_id(NULL), EINVAL);
	int fd = ch->fd;
	rdma_destroy_event_channel(ch);
	CHECK(fcntl(fd, F_GETFD) == -1 && errno == EBADF, "the channel's fd is closed");
	SETS(rdma_destroy_event_channel(NULL), EINVAL);
	SETS(rdma_destroy_ep(NULL), EINVAL);
}

static void devices(void)
{
	int n = -7;
	errno = 0;
	struct ibv_context **list = rdma_get_devices(&n);
	printf("devices %d errno %d\n", n, list ? 0 : errno);
	if (!list)
		return;
	int i = 0;
	for (; list[i]; i++)
		printf("dev %s\n", ibv_get_device_name(list[i]->device));
	CHECK(i == n, "the list has %d entries, num_devices says %d", i, n);
	/* A second call gives the same contexts (devices stay open). */
	struct ibv_context **again = rdma_get_devices(NULL);
	CHECK(again && again[0] == list[0], "a second list differs");
	rdma_free_devices(again);
	rdma_free_devices(list);
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "";
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (!strcmp(mode, "compare"))
		compare();
	else if (!strcmp(mode, "checks"))
		checks();
	else if (!strcmp(mode, "devices"))
		devices();
	else
		FAIL("usage: cm_basic compare|checks|devices");
	printf("cm_basic: ok\n");
	return 0;
}
