/*
 * Two MPI ranks (Open MPI, --mca pml ucx, tests/mpi.rs runs it): a
 * ping-pong of checked messages of every size from 1 B to 4 MiB (doubling),
 * then MPI_Allreduce of a vector whose sum is known. Prints one line per
 * size on rank 0 ("pingpong BYTES usec_per_iter MB/s"), then
 * "mpi_pingpong: ok" and exits 0; any mismatch or MPI error names the step
 * and aborts the job (MPI_Abort).
 *
 * "mpi_pingpong --bw BYTES SECONDS" (scripts/bench.sh's figure) instead
 * times an unchecked ping-pong of BYTES for about SECONDS: 2 rounds of
 * warm-up (UCX's rendezvous set-up and registrations), 3 timed on rank 0
 * to choose the count (broadcast, so both ranks run the same), then the
 * count timed; rank 0 prints "pingpong_bw BYTES ROUNDS usec_per_message
 * MiB/s" (MiB = 2^20 bytes, the MB of perftest and ucx_perftest; a round
 * is a message each way, so the figure is 2 * BYTES * ROUNDS / time).
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAIL(...) do { fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); MPI_Abort(MPI_COMM_WORLD, 1); } while (0)
#define CHECK(c, ...) do { if (!(c)) FAIL(__VA_ARGS__); } while (0)

static void fill(unsigned char *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (unsigned char)(i * 31 + seed * 7 + 1);
}

/* ROUNDS ping-pong rounds of N bytes of BUF between ranks 0 and 1, unchecked; seconds taken. */
static double rounds(int rank, unsigned char *buf, size_t n, long count)
{
	int peer = !rank;
	double t0 = MPI_Wtime();
	for (long it = 0; it < count; it++) {
		if (rank == 0) {
			CHECK(MPI_Send(buf, (int)n, MPI_BYTE, peer, 1, MPI_COMM_WORLD) == MPI_SUCCESS, "send %zu", n);
			CHECK(MPI_Recv(buf, (int)n, MPI_BYTE, peer, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE) == MPI_SUCCESS, "recv %zu", n);
		} else {
			CHECK(MPI_Recv(buf, (int)n, MPI_BYTE, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE) == MPI_SUCCESS, "recv %zu", n);
			CHECK(MPI_Send(buf, (int)n, MPI_BYTE, peer, 2, MPI_COMM_WORLD) == MPI_SUCCESS, "send %zu", n);
		}
	}
	return MPI_Wtime() - t0;
}

/* The --bw mode (see the top). */
static int bandwidth(int rank, size_t n, double secs)
{
	unsigned char *buf = malloc(n);
	CHECK(buf, "malloc %zu", n);
	memset(buf, rank + 1, n);
	rounds(rank, buf, n, 2);
	double dt = rounds(rank, buf, n, 3);
	/* Between 3 and 100000 rounds: a wedged first estimate cannot make the run endless. */
	long count = (long)(secs / (dt / 3));
	count = count < 3 ? 3 : count > 100000 ? 100000 : count;
	CHECK(MPI_Bcast(&count, 1, MPI_LONG, 0, MPI_COMM_WORLD) == MPI_SUCCESS, "MPI_Bcast");
	dt = rounds(rank, buf, n, count);
	if (rank == 0)
		printf("pingpong_bw %zu %ld %.2f %.2f\n", n, count, dt / count / 2 * 1e6,
		       2.0 * (double)n * count / dt / (1 << 20));
	free(buf);
	MPI_Finalize();
	return 0;
}

int main(int argc, char **argv)
{
	int rank, size;
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	CHECK(size == 2, "needs 2 ranks, has %d", size);
	if (argc == 4 && strcmp(argv[1], "--bw") == 0) {
		long n = atol(argv[2]);
		double secs = atof(argv[3]);
		CHECK(n > 0 && n <= (1L << 30) && secs > 0, "--bw BYTES SECONDS: BYTES 1 to 2^30, SECONDS > 0");
		return bandwidth(rank, (size_t)n, secs);
	}
	const size_t max = 4 << 20;
	unsigned char *buf = malloc(max), *want = malloc(max);
	CHECK(buf && want, "malloc");
	for (size_t n = 1; n <= max; n *= 2) {
		int iters = n >= (1 << 20) ? 5 : 50;
		double t0 = MPI_Wtime();
		for (int it = 0; it < iters; it++) {
			unsigned seed = (unsigned)(n + it);
			if (rank == 0) {
				fill(buf, n, seed);
				CHECK(MPI_Send(buf, (int)n, MPI_BYTE, 1, 1, MPI_COMM_WORLD) == MPI_SUCCESS, "send %zu", n);
				CHECK(MPI_Recv(buf, (int)n, MPI_BYTE, 1, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE) == MPI_SUCCESS, "recv %zu", n);
				fill(want, n, seed + 1);
				CHECK(memcmp(buf, want, n) == 0, "rank 0: %zu bytes came back altered", n);
			} else {
				CHECK(MPI_Recv(buf, (int)n, MPI_BYTE, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE) == MPI_SUCCESS, "recv %zu", n);
				fill(want, n, seed);
				CHECK(memcmp(buf, want, n) == 0, "rank 1: %zu bytes arrived altered", n);
				fill(buf, n, seed + 1);
				CHECK(MPI_Send(buf, (int)n, MPI_BYTE, 0, 2, MPI_COMM_WORLD) == MPI_SUCCESS, "send %zu", n);
			}
		}
		double dt = MPI_Wtime() - t0;
		if (rank == 0)
			printf("pingpong %zu %.2f %.2f\n", n, dt / iters / 2 * 1e6, 2.0 * n * iters / dt / 1e6);
	}
	/* MPI_Allreduce: element i of rank r is i + r * 1000; the sum is 2i + 1000. */
	enum { N = 1 << 16 };
	static long v[N], s[N];
	for (int i = 0; i < N; i++)
		v[i] = i + rank * 1000L;
	CHECK(MPI_Allreduce(v, s, N, MPI_LONG, MPI_SUM, MPI_COMM_WORLD) == MPI_SUCCESS, "MPI_Allreduce");
	for (int i = 0; i < N; i++)
		CHECK(s[i] == 2L * i + 1000, "MPI_Allreduce: element %d is %ld, want %ld", i, s[i], 2L * i + 1000);
	if (rank == 0)
		printf("mpi_pingpong: ok\n");
	free(buf);
	free(want);
	MPI_Finalize();
	return 0;
}
