/*
 * What the C tests share: failing with a message (FAIL, CHECK), a call's
 * expected error (REFUSED for NULL with errno, RETURNS for an errno
 * returned), and the device list with the one vrnic function each test is
 * given.
 */
#ifndef CHECK_H
#define CHECK_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

#define FAIL(...) do { fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); exit(1); } while (0)
#define CHECK(c, ...) do { if (!(c)) FAIL(__VA_ARGS__); } while (0)
/* A call that must return NULL with errno e. */
#define REFUSED(call, e) do { errno = 0; void *r_ = (void *)(call); \
	CHECK(!r_ && errno == (e), "%s: want NULL with errno %d (%s), got %p errno %d (%s)", \
	      #call, (e), strerror(e), r_, errno, strerror(errno)); } while (0)
/* A call that must return the errno e. */
#define RETURNS(call, e) do { int r_ = (call); \
	CHECK(r_ == (e), "%s: want %d (%s), got %d (%s)", #call, (e), strerror(e), r_, \
	      r_ > 0 ? strerror(r_) : "-"); } while (0)

/* ibv_get_device_list, which must list exactly one device (the test's vrnic
 * function); the caller frees it with ibv_free_device_list. */
static inline struct ibv_device **one_device_list(void)
{
	int n = -1;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n == 1, "ibv_get_device_list: %d devices (errno %d)", n, errno);
	return list;
}

#endif
