/*
 * pin-check: registered memory stays in place under memory compaction.
 *
 * ibv_reg_mr(3) works on whatever the program allocated, and the device
 * reaches those pages by physical address for as long as the MR lives, so
 * the guest kernel must not move them, not even when it compacts memory.
 * This program judges the outcome, not the mechanism (mlock, long-term pins,
 * ...): it registers
 *   - a malloc'd buffer (16 MiB, posix_memalign, MADV_NOHUGEPAGE so that it
 *     is made of 4 KiB pages: compaction skips transparent huge pages, so a
 *     THP-backed buffer would prove nothing),
 *   - a 64 KiB buffer on the stack,
 *   - a 2 MiB MAP_HUGETLB mapping (skipped with a message if none is free),
 * (the two malloc'd buffers are faulted in among the pages of a large filler
 * mapping, which is then freed, so their pages are spread over memory among
 * free ones), reads every page's PFN from /proc/self/pagemap (root only), then several
 * times fragments memory (touches a large filler mapping and frees every
 * other page of it) and forces compaction (`1 > /proc/sys/vm/compact_memory`),
 * re-reads the PFNs and counts the pages that moved. As a control, an equally
 * sized malloc'd buffer that is NOT registered is watched the same way (its
 * moves are printed, not judged: they show that compaction did move pages).
 * Every buffer's contents are checked at the end too.
 *
 *   pin-check [--rounds N] [--filler-mb M] [--hold FILE] [--hold-timeout S]
 *       --hold FILE: once registered, print "pin-check: holding" and wait
 *       (at most --hold-timeout s, 60) until FILE exists: the caller can try
 *       a second process on the device meanwhile.
 *   pin-check --compact-loop SECS --stop FILE [--filler-mb M] [--interval-ms I]
 *       no device: fragment memory and compact it every I ms (200) until FILE
 *       exists or SECS have passed, then print the count (run in the background
 *       of a transfer that checks its data).
 *
 * Output (grepped by the e2e harness, tests/e2e/guest-pp.sh):
 *   pin-check: <what> <bytes> B registered: <pages> pages, <moved> moved
 *   pin-check: control <bytes> B not registered: <pages> pages, <moved> moved
 *   pin-check: result registered_moved=R registered_pages=N control_moved=M
 *       control_pages=P compactions=C migrated=K hugetlb=yes|skipped data=intact|corrupt
 *   pin-check: compact-loop compactions=C secs=S migrated=K
 * (migrated: the rise of /proc/vmstat pgmigrate_success.) Exit status 0 when
 * no registered page moved and every buffer kept its contents, 1 otherwise,
 * 2 on a set-up error.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#define PAGE 4096UL
#define MALLOC_LEN (16UL << 20)
#define STACK_LEN (64UL << 10)
#define HUGE_LEN (2UL << 20)

static const char *prog = "pin-check";
static int pagemap_fd = -1;

static void die(int rc, const char *what)
{
	fprintf(stderr, "%s: %s: %s\n", prog, what, strerror(errno));
	exit(rc);
}

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* PFN of the page at va (0 if not present; the caller touched it). */
static uint64_t pfn_of(uintptr_t va)
{
	uint64_t e;
	if (pread(pagemap_fd, &e, sizeof(e), (off_t)(va / PAGE) * 8) != sizeof(e))
		die(2, "reading /proc/self/pagemap");
	if (!(e >> 63 & 1))
		return 0;
	return e & ((1ULL << 55) - 1);
}

/* A watched buffer: its name, range and the PFNs first seen. */
struct buf {
	const char *what;
	unsigned char *p;
	size_t len;
	int registered;
	uint64_t *pfn;
	struct ibv_mr *mr;
	unsigned char seed;
};

static void fill(struct buf *b)
{
	for (size_t i = 0; i < b->len; i++)
		b->p[i] = (unsigned char)(b->seed + i * 7 + (i >> 12));
}

static int intact(const struct buf *b)
{
	for (size_t i = 0; i < b->len; i++)
		if (b->p[i] != (unsigned char)(b->seed + i * 7 + (i >> 12)))
			return 0;
	return 1;
}

static void snap(struct buf *b)
{
	size_t n = b->len / PAGE;
	b->pfn = calloc(n, sizeof(uint64_t));
	if (!b->pfn)
		die(2, "calloc");
	for (size_t i = 0; i < n; i++) {
		b->pfn[i] = pfn_of((uintptr_t)b->p + i * PAGE);
		if (b->pfn[i] == 0) {
			fprintf(stderr, "%s: %s: page %zu has no PFN (not present, or not root)\n", prog, b->what, i);
			exit(2);
		}
	}
}

static size_t moved(const struct buf *b)
{
	size_t n = b->len / PAGE, m = 0;
	for (size_t i = 0; i < n; i++)
		if (pfn_of((uintptr_t)b->p + i * PAGE) != b->pfn[i])
			m++;
	return m;
}

static unsigned long long vmstat(const char *name)
{
	char key[64];
	unsigned long long v, r = 0;
	FILE *f = fopen("/proc/vmstat", "r");
	if (!f)
		return 0;
	while (fscanf(f, "%63s %llu", key, &v) == 2)
		if (strcmp(key, name) == 0)
			r = v;
	fclose(f);
	return r;
}

static size_t mem_available(void)
{
	char key[64];
	unsigned long long v, r = 0;
	FILE *f = fopen("/proc/meminfo", "r");
	if (!f)
		return 0;
	while (fscanf(f, "%63s %llu kB\n", key, &v) == 2)
		if (strcmp(key, "MemAvailable:") == 0)
			r = v * 1024;
	fclose(f);
	return r;
}

/* The filler: anonymous 4 KiB pages for fragmenting memory. */
static unsigned char *filler;
static size_t filler_len;

static void filler_init(size_t mb)
{
	size_t want = mb << 20, avail = mem_available() / 3;
	filler_len = (want < avail ? want : avail) & ~(PAGE - 1);
	if (filler_len < (8UL << 20))
		filler_len = 8UL << 20;
	filler = mmap(NULL, filler_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (filler == MAP_FAILED)
		die(2, "mmap filler");
	madvise(filler, filler_len, MADV_NOHUGEPAGE);
}

/* Touch every page of the filler, then free every other one (odd or even by round): memory
 * full of holes, so compaction has pages to move. */
static void fragment(unsigned round)
{
	for (size_t off = 0; off < filler_len; off += PAGE)
		filler[off] = (unsigned char)(off >> 12);
	for (size_t off = (round & 1) * PAGE; off < filler_len; off += 2 * PAGE)
		madvise(filler + off, PAGE, MADV_DONTNEED);
}

static int compact(void)
{
	int fd = open("/proc/sys/vm/compact_memory", O_WRONLY);
	if (fd < 0)
		die(2, "opening /proc/sys/vm/compact_memory");
	if (write(fd, "1\n", 2) != 2)
		die(2, "writing /proc/sys/vm/compact_memory");
	close(fd);
	return 1;
}

static int compact_loop(double secs, const char *stop, long interval_ms, size_t filler_mb)
{
	unsigned long long m0 = vmstat("pgmigrate_success");
	double t0 = now();
	unsigned n = 0;
	struct stat st;
	filler_init(filler_mb);
	while (now() - t0 < secs && stat(stop, &st) != 0) {
		fragment(n);
		n += compact();
		/* Pacing (one compaction every interval), not a synchronisation. */
		struct timespec ts = { interval_ms / 1000, (interval_ms % 1000) * 1000000L };
		nanosleep(&ts, NULL);
	}
	printf("%s: compact-loop compactions=%u secs=%.1f migrated=%llu filler_mb=%zu\n", prog, n, now() - t0,
	       vmstat("pgmigrate_success") - m0, filler_len >> 20);
	return 0;
}

static void reg(struct ibv_pd *pd, struct buf *b)
{
	b->mr = ibv_reg_mr(pd, b->p, b->len,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	if (!b->mr) {
		fprintf(stderr, "%s: ibv_reg_mr(%s, %zu B): %s\n", prog, b->what, b->len, strerror(errno));
		exit(2);
	}
}

static unsigned char *malloc_buf(size_t len)
{
	void *p;
	if (posix_memalign(&p, PAGE, len) != 0)
		die(2, "posix_memalign");
	/* 4 KiB pages, which compaction does move (it skips THPs). */
	madvise(p, len, MADV_NOHUGEPAGE);
	return p;
}

int main(int argc, char **argv)
{
	unsigned rounds = 4;
	size_t filler_mb = 192;
	const char *hold = NULL, *stop = NULL;
	double hold_timeout = 60, loop_secs = -1;
	long interval_ms = 200;
	static const struct option opts[] = {
		{ "rounds", required_argument, 0, 'r' },
		{ "filler-mb", required_argument, 0, 'f' },
		{ "hold", required_argument, 0, 'H' },
		{ "hold-timeout", required_argument, 0, 'T' },
		{ "compact-loop", required_argument, 0, 'L' },
		{ "stop", required_argument, 0, 'S' },
		{ "interval-ms", required_argument, 0, 'i' },
		{ 0, 0, 0, 0 },
	};
	int c;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'r': rounds = (unsigned)atoi(optarg); break;
		case 'f': filler_mb = (size_t)atol(optarg); break;
		case 'H': hold = optarg; break;
		case 'T': hold_timeout = atof(optarg); break;
		case 'L': loop_secs = atof(optarg); break;
		case 'S': stop = optarg; break;
		case 'i': interval_ms = atol(optarg); break;
		default:
			fprintf(stderr, "usage: %s [--rounds N] [--filler-mb M] [--hold FILE] [--hold-timeout S]\n"
					"       %s --compact-loop SECS --stop FILE [--filler-mb M] [--interval-ms I]\n",
				prog, prog);
			return 2;
		}
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (loop_secs >= 0) {
		if (!stop) {
			fprintf(stderr, "%s: --compact-loop needs --stop FILE\n", prog);
			return 2;
		}
		return compact_loop(loop_secs, stop, interval_ms, filler_mb);
	}

	pagemap_fd = open("/proc/self/pagemap", O_RDONLY);
	if (pagemap_fd < 0)
		die(2, "opening /proc/self/pagemap");

	int ndev = 0;
	struct ibv_device **list = ibv_get_device_list(&ndev);
	if (!list || ndev == 0) {
		fprintf(stderr, "%s: no RDMA device\n", prog);
		return 2;
	}
	struct ibv_context *ctx = ibv_open_device(list[0]);
	if (!ctx)
		die(2, "ibv_open_device");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	if (!pd)
		die(2, "ibv_alloc_pd");
	printf("%s: device %s\n", prog, ibv_get_device_name(list[0]));

	/* The stack buffer lives in this frame until the end. */
	unsigned char stack_buf[STACK_LEN] __attribute__((aligned(4096)));
	struct buf bufs[4];
	int nb = 0;
	bufs[nb++] = (struct buf){ .what = "malloc", .p = malloc_buf(MALLOC_LEN), .len = MALLOC_LEN,
				   .registered = 1, .seed = 0x11 };
	bufs[nb++] = (struct buf){ .what = "stack", .p = stack_buf, .len = STACK_LEN, .registered = 1, .seed = 0x22 };
	int have_huge = 0;
	void *h = mmap(NULL, HUGE_LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
	if (h == MAP_FAILED) {
		printf("%s: hugetlb skipped: mmap(2 MiB, MAP_HUGETLB): %s (no free huge page?)\n", prog,
		       strerror(errno));
	} else {
		have_huge = 1;
		bufs[nb++] = (struct buf){ .what = "hugetlb", .p = h, .len = HUGE_LEN, .registered = 1, .seed = 0x33 };
	}
	/* The control: same size as the malloc'd one, never registered. */
	bufs[nb++] = (struct buf){ .what = "control", .p = malloc_buf(MALLOC_LEN), .len = MALLOC_LEN,
				   .registered = 0, .seed = 0x44 };
	/* Fault the two malloc'd buffers in page by page among the filler's pages (a few filler
	 * pages, then one page of each), then free the whole filler: their pages end up spread
	 * over memory, among free pages, where compaction looks for pages to move. */
	filler_init(filler_mb);
	size_t bpages = MALLOC_LEN / PAGE, fpages = filler_len / PAGE, k = fpages / bpages;
	for (size_t i = 0; i < bpages; i++) {
		for (size_t j = i * k; j < (i + 1) * k && j < fpages; j++)
			filler[j * PAGE] = 1;
		for (int b = 0; b < nb; b++)
			if (bufs[b].len == MALLOC_LEN)
				bufs[b].p[i * PAGE] = 1;
	}
	madvise(filler, filler_len, MADV_DONTNEED);
	for (int i = 0; i < nb; i++) {
		fill(&bufs[i]);
		if (bufs[i].registered)
			reg(pd, &bufs[i]);
	}
	for (int i = 0; i < nb; i++)
		snap(&bufs[i]);
	printf("%s: registered, PFNs read; filler %zu MiB, %u rounds\n", prog, filler_len >> 20, rounds);

	if (hold) {
		struct stat st;
		double t0 = now();
		printf("%s: holding the device until %s exists\n", prog, hold);
		while (stat(hold, &st) != 0 && now() - t0 < hold_timeout) {
			struct timespec ts = { 0, 50000000L };
			nanosleep(&ts, NULL);
		}
	}

	unsigned long long m0 = vmstat("pgmigrate_success");
	unsigned ncompact = 0;
	double t0 = now();
	for (unsigned r = 0; r < rounds; r++) {
		fragment(r + 1);
		ncompact += compact();
	}
	unsigned long long migrated = vmstat("pgmigrate_success") - m0;

	size_t reg_moved = 0, reg_pages = 0, ctl_moved = 0, ctl_pages = 0;
	int data_ok = 1;
	for (int i = 0; i < nb; i++) {
		struct buf *b = &bufs[i];
		size_t m = moved(b), n = b->len / PAGE;
		int ok = intact(b);
		data_ok &= ok;
		if (b->registered) {
			reg_moved += m;
			reg_pages += n;
			printf("%s: %s %zu B registered: %zu pages, %zu moved%s\n", prog, b->what, b->len, n, m,
			       ok ? "" : ", CONTENTS CHANGED");
		} else {
			ctl_moved += m;
			ctl_pages += n;
			printf("%s: control %zu B not registered: %zu pages, %zu moved%s\n", prog, b->len, n, m,
			       ok ? "" : ", CONTENTS CHANGED");
		}
	}
	printf("%s: result registered_moved=%zu registered_pages=%zu control_moved=%zu control_pages=%zu "
	       "compactions=%u migrated=%llu secs=%.1f hugetlb=%s data=%s\n",
	       prog, reg_moved, reg_pages, ctl_moved, ctl_pages, ncompact, migrated, now() - t0,
	       have_huge ? "yes" : "skipped", data_ok ? "intact" : "corrupt");

	for (int i = 0; i < nb; i++)
		if (bufs[i].mr && ibv_dereg_mr(bufs[i].mr) != 0)
			die(2, "ibv_dereg_mr");
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	return reg_moved == 0 && data_ok ? 0 : 1;
}
