/*
 * rxe-rdma-peer: RDMA READ, compare-and-swap and fetch-and-add against a
 * peer's memory over libibverbs (RC QP), every byte and every returned value
 * checked. The C twin of vrnic-tools' vrnic-rdma (tools/src/bin/
 * vrnic-rdma.rs, whose module documentation is the protocol's specification);
 * the two speak the same protocol, so either can be on either side. rdma-core
 * has no stock tool for this.
 *
 *   rxe-rdma-peer [options]          passive side: owns the memory, TCP server
 *   rxe-rdma-peer [options] HOST     active side: the requester, TCP client
 *   rxe-rdma-peer --self-test        checks the pattern and the parsers, exit 0
 *
 * Options (as vrnic-rdma): -p PORT (18517), -s SIZES (comma-separated READ
 * sizes, "1,4097,1048576"), -r READS per size (2), -n FETCH_ADDS (100),
 * -m MTU (1024), -g GID_INDEX (1), -d DEVICE (first), -i IB_PORT (1),
 * -t/--timeout SECONDS bounding every single wait (60).
 *
 * The passive side's MR (64 + max size + 8192 bytes): bytes 0..8 the counter
 * (CNT0 = SEED << 32 | 0xffffff00), 8..16 the compare-and-swap word (CAS0 =
 * ~CNT0), 16..64 guard (0xA5), from 64 the data region whose byte i is
 * pattern_byte(SEED, i). Lines over TCP, at most 256 bytes each:
 *   active -> passive  LID:QPN:PSN:GID
 *   passive -> active  LID:QPN:PSN:GID:ADDR:RKEY:LEN:SEED:CNT0:CAS0
 *   active: READs per size ("progress read S"), -n fetch-adds of 0x100000003
 *     ("progress fetch-add"), CAS CAS0->SWAP (swaps), CAS again (refused),
 *     8-byte READ of the word ("progress cmp-swap"), then "done N ADD SWAP"
 *   passive: checks its memory, answers "final COUNTER WORD"
 *   active: checks both, answers "ok"
 * A side that fails sends "fail MESSAGE". Output lines (grepped by the e2e
 * harness): "rdma-read verified: R reads of S bytes", "fetch-add verified:
 * ...", "cmp-swap verified: ..." (active), "responder verified: ..." (passive).
 * Exit status 0 on success, 1 on any error (printed as "rxe-rdma-peer: ...").
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#define DATA_OFF 64
#define CAS_OFF 8
#define SLACK 8192
#define GUARD 64
#define GUARD_FILL 0xa5
#define ADD 0x100000003ULL
#define SWAP_XOR 0x5a5a5a5aa5a5a5a5ULL
#define READ_STRIDE 4097
#define HOP_LIMIT 64
#define MAX_LINE 256
#define MAX_SIZES 16
#define MAX_SIZE (1u << 30)

static const char *prog = "rxe-rdma-peer";

/* ------------------------------------------------------------------ */
/* Errors: a failure message, sent to the peer once connected.         */

static char errbuf[512];
static int fail_fd = -1;

static void send_line(int fd, const char *line);

static void die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
static void die(const char *fmt, ...)
{
	va_list ap;
	char msg[MAX_LINE];

	va_start(ap, fmt);
	vsnprintf(errbuf, sizeof(errbuf), fmt, ap);
	va_end(ap);
	fflush(stdout);
	fprintf(stderr, "%s: %s\n", prog, errbuf);
	if (fail_fd >= 0) {
		int fd = fail_fd;

		fail_fd = -1; /* no recursion when the send fails */
		snprintf(msg, sizeof(msg), "fail %.*s", MAX_LINE - 6, errbuf);
		for (char *c = msg; *c; c++)
			if (*c == '\n' || *c == '\r')
				*c = ' ';
		send_line(fd, msg);
	}
	exit(1);
}

/* ------------------------------------------------------------------ */
/* Pattern (identical to vrnic-rdma's pattern_byte).                   */

static uint8_t pattern_byte(uint32_t seed, uint64_t i)
{
	uint32_t x = ((uint32_t)i * 0x9e3779b1u) ^ seed ^ (uint32_t)(i >> 32);

	x ^= x >> 15;
	x *= 0x85ebca77u;
	x ^= x >> 13;
	return (uint8_t)(x >> 24);
}

static uint64_t counter0(uint32_t seed)
{
	return ((uint64_t)seed << 32) | 0xffffff00u;
}

static uint64_t read_offset(uint32_t k, size_t size, size_t data_len)
{
	uint64_t span = (uint64_t)(data_len - size) + 1;

	return (1 + (uint64_t)k * READ_STRIDE) % span;
}

/* ------------------------------------------------------------------ */
/* Time and bounded TCP lines.                                         */

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static unsigned timeout_s = 60;

struct oob {
	int fd;
	char pending[2 * MAX_LINE + 2];
	size_t n;
};

static void send_line(int fd, const char *line)
{
	char buf[MAX_LINE + 2];
	size_t len = strlen(line), off = 0;
	double deadline = now() + timeout_s;

	if (len > MAX_LINE)
		len = MAX_LINE;
	memcpy(buf, line, len);
	buf[len++] = '\n';
	while (off < len) {
		struct pollfd p = { .fd = fd, .events = POLLOUT };
		int ms = (int)((deadline - now()) * 1000);
		ssize_t w;

		if (ms <= 0)
			die("sending \"%.40s\": timed out (--timeout)", line);
		if (poll(&p, 1, ms) < 0 && errno != EINTR)
			die("sending: poll: %s", strerror(errno));
		w = send(fd, buf + off, len - off, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (w < 0) {
			if (errno == EAGAIN || errno == EINTR)
				continue;
			/* Report it without trying to tell the (gone) peer. */
			fail_fd = -1;
			die("sending \"%.40s\" to the peer: %s", line, strerror(errno));
		}
		off += (size_t)w;
	}
}

/* Receives one line (without its newline) into out (MAX_LINE + 1 bytes). */
static void recv_line(struct oob *o, char *out, const char *what)
{
	double deadline = now() + timeout_s;

	for (;;) {
		char *nl = memchr(o->pending, '\n', o->n);

		if (nl) {
			size_t len = (size_t)(nl - o->pending);

			memcpy(out, o->pending, len);
			out[len] = 0;
			memmove(o->pending, nl + 1, o->n - len - 1);
			o->n -= len + 1;
			if (len && out[len - 1] == '\r')
				out[len - 1] = 0;
			if (!strncmp(out, "fail ", 5)) {
				fail_fd = -1;
				die("the peer failed: %s", out + 5);
			}
			return;
		}
		if (o->n > MAX_LINE)
			die("waiting for %s: the peer sent a line longer than %d bytes", what, MAX_LINE);
		int ms = (int)((deadline - now()) * 1000);
		if (ms <= 0)
			die("waiting for %s: nothing from the peer for %u s (--timeout)", what, timeout_s);
		struct pollfd p = { .fd = o->fd, .events = POLLIN };
		int r = poll(&p, 1, ms);

		if (r < 0 && errno != EINTR)
			die("waiting for %s: poll: %s", what, strerror(errno));
		if (r <= 0)
			continue;
		ssize_t got = recv(o->fd, o->pending + o->n, sizeof(o->pending) - o->n, MSG_DONTWAIT);
		if (got == 0) {
			fail_fd = -1;
			die("waiting for %s: the peer closed the connection", what);
		}
		if (got < 0) {
			if (errno == EAGAIN || errno == EINTR)
				continue;
			fail_fd = -1;
			die("waiting for %s: %s", what, strerror(errno));
		}
		o->n += (size_t)got;
	}
}

static void expect_line(struct oob *o, const char *want)
{
	char line[MAX_LINE + 1];

	recv_line(o, line, want);
	if (strcmp(line, want))
		die("protocol error: expected \"%s\", got \"%s\"", want, line);
}

static int listen_port(int port)
{
	int fd = socket(AF_INET6, SOCK_STREAM, 0), one = 1, zero = 0;

	if (fd >= 0) {
		struct sockaddr_in6 a = { .sin6_family = AF_INET6, .sin6_port = htons(port),
					  .sin6_addr = IN6ADDR_ANY_INIT };

		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
		if (!bind(fd, (struct sockaddr *)&a, sizeof(a)) && !listen(fd, 1))
			return fd;
		close(fd);
	}
	fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd >= 0) {
		struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port),
					 .sin_addr.s_addr = htonl(INADDR_ANY) };

		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (!bind(fd, (struct sockaddr *)&a, sizeof(a)) && !listen(fd, 1))
			return fd;
		close(fd);
	}
	die("Couldn't listen to port %d", port);
}

static int accept_bounded(int lfd)
{
	double deadline = now() + timeout_s;

	for (;;) {
		int ms = (int)((deadline - now()) * 1000);
		struct pollfd p = { .fd = lfd, .events = POLLIN };

		if (ms <= 0)
			die("no client connected within %u s (--timeout)", timeout_s);
		int r = poll(&p, 1, ms);

		if (r < 0 && errno != EINTR)
			die("poll() on the listening socket: %s", strerror(errno));
		if (r > 0) {
			int fd = accept(lfd, NULL, NULL);

			if (fd < 0)
				die("accept() failed: %s", strerror(errno));
			return fd;
		}
	}
}

/* Connects within --timeout, retrying a refused connection every 100 ms. */
static int connect_bounded(const char *host, int port)
{
	double deadline = now() + timeout_s;
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM }, *res, *ai;
	char service[16];
	int err = 0;

	snprintf(service, sizeof(service), "%d", port);
	if (getaddrinfo(host, service, &hints, &res))
		die("resolving %s:%d failed", host, port);
	for (;;) {
		for (ai = res; ai; ai = ai->ai_next) {
			int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK, 0);
			int ms = (int)((deadline - now()) * 1000);

			if (fd < 0)
				continue;
			if (connect(fd, ai->ai_addr, ai->ai_addrlen) && errno != EINPROGRESS) {
				err = errno;
				close(fd);
				continue;
			}
			struct pollfd p = { .fd = fd, .events = POLLOUT };
			socklen_t l = sizeof(err);

			err = ETIMEDOUT;
			if (ms > 0 && poll(&p, 1, ms) > 0 && !getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &l) &&
			    !err) {
				freeaddrinfo(res);
				return fd;
			}
			close(fd);
		}
		if (err != ECONNREFUSED || now() >= deadline)
			break;
		usleep(100000);
	}
	freeaddrinfo(res);
	die("couldn't connect to %s:%d within %u s (--timeout): %s", host, port, timeout_s,
	    strerror(err));
}

/* ------------------------------------------------------------------ */
/* Address messages.                                                    */

struct dest {
	unsigned lid, qpn, psn;
	union ibv_gid gid;
};

struct target {
	uint64_t addr;
	uint32_t rkey, len, seed;
	uint64_t cnt0, cas0;
};

static void gid_to_wire(const union ibv_gid *gid, char wgid[33])
{
	for (int i = 0; i < 16; i++)
		sprintf(wgid + 2 * i, "%02x", gid->raw[i]);
}

static void dest_wire(const struct dest *d, char *out, size_t len)
{
	char wgid[33];

	gid_to_wire(&d->gid, wgid);
	snprintf(out, len, "%04x:%06x:%06x:%s", d->lid, d->qpn, d->psn, wgid);
}

/* Parses a hex field of exactly 1..=width digits holding at most bits bits. */
static int hex_field(const char *s, size_t len, unsigned bits, uint64_t *v)
{
	uint64_t x = 0;

	if (len == 0 || len > 16)
		return -1;
	for (size_t i = 0; i < len; i++) {
		int c = s[i], d;

		if (c >= '0' && c <= '9')
			d = c - '0';
		else if (c >= 'a' && c <= 'f')
			d = c - 'a' + 10;
		else if (c >= 'A' && c <= 'F')
			d = c - 'A' + 10;
		else
			return -1;
		x = x << 4 | (uint64_t)d;
	}
	if (bits < 64 && x >> bits)
		return -1;
	*v = x;
	return 0;
}

/* Parses LID:QPN:PSN:GID[:ADDR:RKEY:LEN:SEED:CNT0:CAS0]; t NULL: 4 fields. */
static int parse_msg(const char *line, struct dest *d, struct target *t)
{
	const char *f[10];
	size_t fl[10];
	int n = 0, want = t ? 10 : 4;
	const char *p = line;
	uint64_t v[10];
	static const unsigned bits[10] = { 16, 24, 24, 0, 64, 32, 32, 32, 64, 64 };

	for (;;) {
		const char *c = strchr(p, ':');

		if (n == 10)
			return -1;
		f[n] = p;
		fl[n] = c ? (size_t)(c - p) : strlen(p);
		n++;
		if (!c)
			break;
		p = c + 1;
	}
	if (n != want)
		return -1;
	for (int i = 0; i < n; i++) {
		if (i == 3) {
			if (fl[3] != 32)
				return -1;
			for (int j = 0; j < 16; j++) {
				uint64_t b;

				if (hex_field(f[3] + 2 * j, 2, 8, &b))
					return -1;
				d->gid.raw[j] = (uint8_t)b;
			}
			continue;
		}
		if (hex_field(f[i], fl[i], bits[i], &v[i]))
			return -1;
	}
	d->lid = (unsigned)v[0];
	d->qpn = (unsigned)v[1];
	d->psn = (unsigned)v[2];
	if (t) {
		t->addr = v[4];
		t->rkey = (uint32_t)v[5];
		t->len = (uint32_t)v[6];
		t->seed = (uint32_t)v[7];
		t->cnt0 = v[8];
		t->cas0 = v[9];
	}
	return 0;
}

static void describe(const char *which, const struct dest *d)
{
	char gid[64];

	inet_ntop(AF_INET6, d->gid.raw, gid, sizeof(gid));
	printf("  %s LID 0x%04x, QPN 0x%06x, PSN 0x%06x, GID %s\n", which, d->lid, d->qpn, d->psn,
	       gid);
}

/* ------------------------------------------------------------------ */
/* Verbs.                                                               */

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_mr *mr;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	uint8_t *buf;
	size_t len;
	struct dest me;
};

static int ib_port = 1, gid_idx = 1;
static enum ibv_mtu mtu = IBV_MTU_1024;

static void open_side(struct side *s, const char *devname, size_t len, int passive)
{
	struct ibv_device **list = ibv_get_device_list(NULL), *dev = NULL;
	int access = passive ? IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC : 0;

	if (!list)
		die("Failed to get IB devices list");
	for (int i = 0; list[i]; i++)
		if (!devname || !strcmp(ibv_get_device_name(list[i]), devname)) {
			dev = list[i];
			break;
		}
	if (!dev)
		die("IB device %s not found", devname ? devname : "(any)");
	s->ctx = ibv_open_device(dev);
	if (!s->ctx)
		die("Couldn't get context for %s", ibv_get_device_name(dev));
	ibv_free_device_list(list);
	s->pd = ibv_alloc_pd(s->ctx);
	if (!s->pd)
		die("Couldn't allocate PD");
	s->len = len;
	if (posix_memalign((void **)&s->buf, 4096, len))
		die("Couldn't allocate work buf");
	memset(s->buf, GUARD_FILL, len);
	s->mr = ibv_reg_mr(s->pd, s->buf, len, IBV_ACCESS_LOCAL_WRITE | access);
	if (!s->mr)
		die("Couldn't register MR: %s", strerror(errno));
	s->cq = ibv_create_cq(s->ctx, 4, NULL, NULL, 0);
	if (!s->cq)
		die("Couldn't create CQ");
	struct ibv_qp_init_attr ia = {
		.send_cq = s->cq,
		.recv_cq = s->cq,
		.cap = { .max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};
	s->qp = ibv_create_qp(s->pd, &ia);
	if (!s->qp)
		die("Couldn't create QP");
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT,
		.pkey_index = 0,
		.port_num = ib_port,
		.qp_access_flags = access,
	};
	if (ibv_modify_qp(s->qp, &a,
			  IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		die("Failed to modify QP to INIT");
	struct ibv_port_attr pa;
	if (ibv_query_port(s->ctx, ib_port, &pa))
		die("Couldn't get port info");
	if (ibv_query_gid(s->ctx, ib_port, gid_idx, &s->me.gid))
		die("can't read sgid of index %d", gid_idx);
	s->me.lid = pa.lid;
	s->me.qpn = s->qp->qp_num;
	s->me.psn = (unsigned)(lrand48() & 0xffffff);
}

static void connect_qp(struct side *s, const struct dest *rem)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_RTR,
		.path_mtu = mtu,
		.dest_qp_num = rem->qpn,
		.rq_psn = rem->psn,
		.max_dest_rd_atomic = 1,
		.min_rnr_timer = 12,
		.ah_attr = {
			.is_global = 1,
			.dlid = (uint16_t)rem->lid,
			.port_num = ib_port,
			.grh = { .dgid = rem->gid, .sgid_index = gid_idx, .hop_limit = HOP_LIMIT },
		},
	};
	if (ibv_modify_qp(s->qp, &a,
			  IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		die("Failed to modify QP to RTR");
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = s->me.psn;
	a.max_rd_atomic = 1;
	if (ibv_modify_qp(s->qp, &a,
			  IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				  IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
		die("Failed to modify QP to RTS");
}

/* Posts one signalled WR, waits (bounded) for its successful completion. */
static struct ibv_wc post_wait(struct side *s, struct ibv_send_wr *wr, enum ibv_wc_opcode want,
			       const char *what)
{
	struct ibv_send_wr *bad;
	struct ibv_wc wc[2];
	double start = now();
	unsigned spins = 0;
	int n;

	if (ibv_post_send(s->qp, wr, &bad))
		die("%s: couldn't post", what);
	for (;;) {
		n = ibv_poll_cq(s->cq, 2, wc);
		if (n < 0)
			die("%s: poll CQ failed", what);
		if (n > 0)
			break;
		if (++spins % 64 == 0) {
			if (now() - start > timeout_s)
				die("%s: no completion within %u s (--timeout)", what, timeout_s);
			sched_yield();
		}
	}
	if (n > 1)
		die("%s: unexpected extra completion", what);
	if (wc[0].status != IBV_WC_SUCCESS)
		die("%s failed: status %s (%d), vendor error 0x%x, wr_id %" PRIu64, what,
		    ibv_wc_status_str(wc[0].status), wc[0].status, wc[0].vendor_err, wc[0].wr_id);
	if (wc[0].opcode != want || wc[0].wr_id != wr->wr_id)
		die("%s: completion opcode %d wr_id %" PRIu64 ", expected opcode %d wr_id %" PRIu64,
		    what, wc[0].opcode, wc[0].wr_id, want, wr->wr_id);
	return wc[0];
}

static void check_guards(const uint8_t *buf, size_t size, const char *what)
{
	for (size_t j = 0; j < GUARD; j++)
		if (buf[j] != GUARD_FILL)
			die("%s: guard byte %zu before the target is 0x%02x", what, GUARD - j, buf[j]);
	for (size_t j = 0; j < GUARD; j++)
		if (buf[GUARD + size + j] != GUARD_FILL)
			die("%s: guard byte %zu after the target is 0x%02x", what, j,
			    buf[GUARD + size + j]);
}

static void do_read(struct side *s, const struct target *t, uint32_t rkey, uint64_t off,
		    size_t size, const char *what)
{
	struct ibv_sge sge = { .addr = (uintptr_t)(s->buf + GUARD), .length = (uint32_t)size,
			       .lkey = s->mr->lkey };
	struct ibv_send_wr wr = {
		.wr_id = size,
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = IBV_WR_RDMA_READ,
		.send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = t->addr + off, .rkey = rkey },
	};
	struct ibv_wc wc;

	memset(s->buf, GUARD_FILL, GUARD + size + GUARD);
	wc = post_wait(s, &wr, IBV_WC_RDMA_READ, what);
	if (wc.byte_len != size)
		die("%s: byte_len %u, expected %zu", what, wc.byte_len, size);
	check_guards(s->buf, size, what);
}

static uint64_t do_atomic(struct side *s, const struct target *t, uint32_t rkey,
			  enum ibv_wr_opcode op, size_t off, uint64_t compare_add, uint64_t swap,
			  const char *what)
{
	struct ibv_sge sge = { .addr = (uintptr_t)(s->buf + GUARD), .length = 8,
			       .lkey = s->mr->lkey };
	struct ibv_send_wr wr = {
		.wr_id = 0xa7,
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = op,
		.send_flags = IBV_SEND_SIGNALED,
		.wr.atomic = { .remote_addr = t->addr + off, .compare_add = compare_add,
			       .swap = swap, .rkey = rkey },
	};
	uint64_t v;

	memset(s->buf, GUARD_FILL, GUARD + 8 + GUARD);
	post_wait(s, &wr, op == IBV_WR_ATOMIC_CMP_AND_SWP ? IBV_WC_COMP_SWAP : IBV_WC_FETCH_ADD,
		  what);
	check_guards(s->buf, 8, what);
	memcpy(&v, s->buf + GUARD, 8);
	return v;
}

/* ------------------------------------------------------------------ */
/* Sessions.                                                            */

static unsigned sizes[MAX_SIZES] = { 1, 4097, 1048576 }, nsizes = 3;
static unsigned reads = 2, fetch_adds = 100;

static size_t max_size(void)
{
	size_t m = 1;

	for (unsigned i = 0; i < nsizes; i++)
		if (sizes[i] > m)
			m = sizes[i];
	return m;
}

static void passive(const char *devname, int port)
{
	struct side s;
	size_t len = DATA_OFF + max_size() + SLACK;
	struct target t;
	struct oob o = { 0 };
	struct dest rem;
	char line[MAX_LINE + 1], msg[MAX_LINE + 1], wire[128];
	int lfd;

	open_side(&s, devname, len, 1);
	t.addr = (uintptr_t)s.buf;
	t.rkey = s.mr->rkey;
	t.len = (uint32_t)len;
	t.seed = (uint32_t)mrand48();
	t.cnt0 = counter0(t.seed);
	t.cas0 = ~t.cnt0;
	memcpy(s.buf, &t.cnt0, 8);
	memcpy(s.buf + CAS_OFF, &t.cas0, 8);
	for (size_t i = 0; i < len - DATA_OFF; i++)
		s.buf[DATA_OFF + i] = pattern_byte(t.seed, i);
	lfd = listen_port(port);
	describe("local address: ", &s.me);
	printf("  local region:   addr 0x%016" PRIx64 ", rkey 0x%08x, %u bytes, seed 0x%08x\n",
	       t.addr, t.rkey, t.len, t.seed);
	fflush(stdout);
	o.fd = accept_bounded(lfd);
	close(lfd);
	fail_fd = o.fd;
	recv_line(&o, line, "the active side's address");
	if (parse_msg(line, &rem, NULL))
		die("malformed address message \"%s\"", line);
	describe("remote address:", &rem);
	connect_qp(&s, &rem);
	dest_wire(&s.me, wire, sizeof(wire));
	snprintf(msg, sizeof(msg), "%s:%016" PRIx64 ":%08x:%08x:%08x:%016" PRIx64 ":%016" PRIx64,
		 wire, t.addr, t.rkey, t.len, t.seed, t.cnt0, t.cas0);
	send_line(o.fd, msg);
	do
		recv_line(&o, line, "\"progress ...\" or \"done N ADD SWAP\"");
	while (!strncmp(line, "progress ", 9));

	unsigned long long n, add, swap;
	char extra;
	if (sscanf(line, "done %llu %16llx %16llx%c", &n, &add, &swap, &extra) != 3)
		die("protocol error: expected \"done N ADD SWAP\", got \"%s\"", line);
	uint64_t cnt, cas, want = t.cnt0 + (uint64_t)n * add;
	memcpy(&cnt, s.buf, 8);
	memcpy(&cas, s.buf + CAS_OFF, 8);
	if (cnt != want)
		die("counter is 0x%016" PRIx64 " after %llu fetch-adds of 0x%llx from 0x%016" PRIx64
		    ", expected 0x%016" PRIx64, cnt, n, add, t.cnt0, want);
	if (cas != swap)
		die("compare-and-swap word is 0x%016" PRIx64 ", expected the swap value 0x%016llx",
		    cas, swap);
	for (size_t j = CAS_OFF + 8; j < DATA_OFF; j++)
		if (s.buf[j] != GUARD_FILL)
			die("guard byte at offset %zu changed to 0x%02x", j, s.buf[j]);
	for (size_t i = 0; i < len - DATA_OFF; i++)
		if (s.buf[DATA_OFF + i] != pattern_byte(t.seed, i))
			die("the data region changed at byte %zu (READs must not write)", i);
	snprintf(msg, sizeof(msg), "final %016" PRIx64 " %016" PRIx64, cnt, cas);
	send_line(o.fd, msg);
	expect_line(&o, "ok");
	printf("responder verified: %llu fetch-adds, counter 0x%016" PRIx64
	       ", compare-and-swap word 0x%016" PRIx64 ", data intact\n",
	       n, cnt, cas);
}

static void active(const char *devname, const char *host, int port)
{
	struct side s;
	struct target t;
	struct oob o = { 0 };
	struct dest rem;
	char line[MAX_LINE + 1], msg[MAX_LINE + 1], what[128];
	size_t data_len, ms = max_size();

	open_side(&s, devname, GUARD + (ms > 8 ? ms : 8) + GUARD, 0);
	describe("local address: ", &s.me);
	fflush(stdout);
	o.fd = connect_bounded(host, port);
	fail_fd = o.fd;
	dest_wire(&s.me, msg, sizeof(msg));
	send_line(o.fd, msg);
	recv_line(&o, line, "the passive side's address");
	if (parse_msg(line, &rem, &t))
		die("malformed address message \"%s\"", line);
	describe("remote address:", &rem);
	printf("  remote region:  addr 0x%016" PRIx64 ", rkey 0x%08x, %u bytes, seed 0x%08x\n",
	       t.addr, t.rkey, t.len, t.seed);
	if (t.len < DATA_OFF || t.len - DATA_OFF < ms)
		die("the passive side's region is %u bytes, too small for %zu-byte reads: both sides need the same -s",
		    t.len, ms);
	if (t.addr % 8)
		die("the passive side's region at 0x%" PRIx64 " is not 8-byte aligned", t.addr);
	data_len = t.len - DATA_OFF;
	connect_qp(&s, &rem);

	for (unsigned i = 0; i < nsizes; i++) {
		size_t size = sizes[i];

		for (unsigned k = 0; k < reads; k++) {
			uint64_t off = read_offset(k, size, data_len);

			snprintf(what, sizeof(what), "RDMA READ %u of %zu bytes at data offset %" PRIu64,
				 k, size, off);
			do_read(&s, &t, t.rkey, DATA_OFF + off, size, what);
			for (size_t j = 0; j < size; j++) {
				uint8_t e = pattern_byte(t.seed, off + j);

				if (s.buf[GUARD + j] != e)
					die("%s: data mismatch at byte %zu: 0x%02x, expected 0x%02x", what,
					    j, s.buf[GUARD + j], e);
			}
		}
		printf("rdma-read verified: %u reads of %zu bytes\n", reads, size);
		fflush(stdout);
		snprintf(msg, sizeof(msg), "progress read %zu", size);
		send_line(o.fd, msg);
	}

	uint64_t cur = t.cnt0;
	for (unsigned i = 0; i < fetch_adds; i++) {
		snprintf(what, sizeof(what), "fetch-add %u", i);
		uint64_t got = do_atomic(&s, &t, t.rkey, IBV_WR_ATOMIC_FETCH_AND_ADD, 0, ADD, 0, what);

		if (got != cur)
			die("%s: returned 0x%016" PRIx64 ", expected 0x%016" PRIx64, what, got, cur);
		cur += ADD;
	}
	send_line(o.fd, "progress fetch-add");

	uint64_t swap = t.cas0 ^ SWAP_XOR, got;
	got = do_atomic(&s, &t, t.rkey, IBV_WR_ATOMIC_CMP_AND_SWP, CAS_OFF, t.cas0, swap,
			"compare-and-swap (must swap)");
	if (got != t.cas0)
		die("compare-and-swap (must swap): returned 0x%016" PRIx64 ", expected 0x%016" PRIx64,
		    got, t.cas0);
	got = do_atomic(&s, &t, t.rkey, IBV_WR_ATOMIC_CMP_AND_SWP, CAS_OFF, t.cas0, ~swap,
			"compare-and-swap (must not swap)");
	if (got != swap)
		die("compare-and-swap (must not swap): returned 0x%016" PRIx64
		    ", expected the current 0x%016" PRIx64, got, swap);
	do_read(&s, &t, t.rkey, CAS_OFF, 8, "RDMA READ of the compare-and-swap word");
	memcpy(&got, s.buf + GUARD, 8);
	if (got != swap)
		die("RDMA READ of the compare-and-swap word: 0x%016" PRIx64 ", expected 0x%016" PRIx64,
		    got, swap);
	send_line(o.fd, "progress cmp-swap");

	snprintf(msg, sizeof(msg), "done %u %016llx %016" PRIx64, fetch_adds, ADD, swap);
	send_line(o.fd, msg);
	recv_line(&o, line, "\"final COUNTER WORD\"");
	unsigned long long cnt, cas;
	char extra;
	if (sscanf(line, "final %16llx %16llx%c", &cnt, &cas, &extra) != 2)
		die("protocol error: expected \"final COUNTER WORD\", got \"%s\"", line);
	if (cnt != cur)
		die("the passive side's counter is 0x%016llx, expected 0x%016" PRIx64, cnt, cur);
	if (cas != swap)
		die("the passive side's compare-and-swap word is 0x%016llx, expected 0x%016" PRIx64,
		    cas, swap);
	send_line(o.fd, "ok");
	printf("fetch-add verified: %u ops, counter 0x%016" PRIx64 " -> 0x%016" PRIx64
	       " (the responder agrees)\n",
	       fetch_adds, t.cnt0, cur);
	printf("cmp-swap verified: swapped 0x%016" PRIx64 " -> 0x%016" PRIx64
	       ", refused when stale\n",
	       t.cas0, swap);
}

/* ------------------------------------------------------------------ */
/* Options.                                                             */

static unsigned long parse_num(const char *s, const char *name, unsigned long min,
			       unsigned long max)
{
	char *end;
	unsigned long v;

	errno = 0;
	v = strtoul(s, &end, 0);
	if (errno || end == s || *end || v < min || v > max || *s == '-')
		die("%s: bad value \"%s\" (%lu to %lu)", name, s, min, max);
	return v;
}

static void parse_sizes(const char *arg)
{
	char buf[256], *tok, *save;

	if (strlen(arg) >= sizeof(buf))
		die("-s: list too long");
	strcpy(buf, arg);
	nsizes = 0;
	if (!*arg || arg[strlen(arg) - 1] == ',' || strstr(arg, ",,") || *arg == ',')
		die("-s: empty size in \"%s\"", arg);
	for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (nsizes == MAX_SIZES)
			die("-s: at most %d sizes", MAX_SIZES);
		sizes[nsizes++] = (unsigned)parse_num(tok, "-s", 1, MAX_SIZE);
	}
}

static int self_test(void)
{
	static const uint8_t vec[8] = { 0xdd, 0x9b, 0x73, 0x22, 0xa4, 0x03, 0x8e, 0x1e };
	struct dest d;
	struct target t;
	char wire[128];
	const char *pm = "0000:000011:abcdef:00000000000000000000ffff0a000002:00007f0012345000:"
			 "deadbeef:00102040:01020304:01020304ffffff00:fefdfcfb000000ff";

	for (int i = 0; i < 8; i++)
		if (pattern_byte(0x12345678, (uint64_t)i) != vec[i]) {
			fprintf(stderr, "%s: self-test: pattern byte %d differs from vrnic-rdma's\n",
				prog, i);
			return 1;
		}
	if (parse_msg(pm, &d, &t) || d.qpn != 0x11 || d.psn != 0xabcdef || d.gid.raw[15] != 2 ||
	    t.addr != 0x7f0012345000ULL || t.rkey != 0xdeadbeef || t.len != 0x102040 ||
	    t.seed != 0x01020304 || t.cnt0 != counter0(0x01020304) || t.cas0 != ~t.cnt0) {
		fprintf(stderr, "%s: self-test: passive message not parsed\n", prog);
		return 1;
	}
	dest_wire(&d, wire, sizeof(wire));
	if (strcmp(wire, "0000:000011:abcdef:00000000000000000000ffff0a000002") ||
	    parse_msg(wire, &d, NULL) || !parse_msg(wire, &d, &t) || !parse_msg(pm, &d, NULL) ||
	    !parse_msg("0000:1000000:000000:00000000000000000000ffff0a000002", &d, NULL) ||
	    read_offset(1, 1048576, 1048576 + SLACK) != 4098) {
		fprintf(stderr, "%s: self-test: message format or offsets differ\n", prog);
		return 1;
	}
	printf("%s: self-test ok\n", prog);
	return 0;
}

static void usage(void)
{
	printf("Usage:\n  %s [options]        passive side (owns the memory)\n"
	       "  %s [options] HOST   active side (READ, compare-and-swap, fetch-and-add)\n"
	       "  %s --self-test\n\nOptions:\n"
	       "  -p, --port=PORT        TCP port (default 18517)\n"
	       "  -s, --sizes=S1,S2,...  RDMA READ sizes (default 1,4097,1048576)\n"
	       "  -r, --reads=N          READs per size (default 2)\n"
	       "  -n, --fetch-adds=N     fetch-and-adds (default 100)\n"
	       "  -m, --mtu=BYTES        path MTU (default 1024)\n"
	       "  -g, --gid-idx=N        local GID index (default 1)\n"
	       "  -d, --ib-dev=DEV       IB device (default first)\n"
	       "  -i, --ib-port=PORT     IB port (default 1)\n"
	       "  -t, --timeout=SECONDS  bound on every single wait (default 60)\n",
	       prog, prog, prog);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "port", 1, NULL, 'p' },      { "sizes", 1, NULL, 's' },   { "reads", 1, NULL, 'r' },
		{ "fetch-adds", 1, NULL, 'n' }, { "mtu", 1, NULL, 'm' },     { "gid-idx", 1, NULL, 'g' },
		{ "ib-dev", 1, NULL, 'd' },    { "ib-port", 1, NULL, 'i' }, { "timeout", 1, NULL, 't' },
		{ "self-test", 0, NULL, 'T' }, { "help", 0, NULL, 'h' },    { 0 }
	};
	const char *devname = NULL;
	int port = 18517, c;

	setvbuf(stdout, NULL, _IOLBF, 0);
	while ((c = getopt_long(argc, argv, "p:s:r:n:m:g:d:i:t:h", opts, NULL)) != -1) {
		switch (c) {
		case 'p': port = (int)parse_num(optarg, "-p", 1, 65535); break;
		case 's': parse_sizes(optarg); break;
		case 'r': reads = (unsigned)parse_num(optarg, "-r", 1, 1000000); break;
		case 'n': fetch_adds = (unsigned)parse_num(optarg, "-n", 1, 100000000); break;
		case 'm':
			switch (parse_num(optarg, "-m", 256, 4096)) {
			case 256: mtu = IBV_MTU_256; break;
			case 512: mtu = IBV_MTU_512; break;
			case 1024: mtu = IBV_MTU_1024; break;
			case 2048: mtu = IBV_MTU_2048; break;
			case 4096: mtu = IBV_MTU_4096; break;
			default: die("-m: path MTU is one of 256, 512, 1024, 2048, 4096");
			}
			break;
		case 'g': gid_idx = (int)parse_num(optarg, "-g", 0, 255); break;
		case 'd': devname = optarg; break;
		case 'i': ib_port = (int)parse_num(optarg, "-i", 1, 255); break;
		case 't': timeout_s = (unsigned)parse_num(optarg, "-t", 1, 86400); break;
		case 'T': return self_test();
		case 'h': usage(); return 0;
		default: usage(); return 1;
		}
	}
	if (optind < argc - 1) {
		usage();
		return 1;
	}
	srand48(getpid() * time(NULL));
	if (optind == argc - 1)
		active(devname, argv[optind], port);
	else
		passive(devname, port);
	return 0;
}
