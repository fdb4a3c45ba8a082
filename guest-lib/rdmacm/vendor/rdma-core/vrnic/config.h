/* vrnic's stand-in for the config.h rdma-core's CMake makes from
 * buildlib/config.h.in: only what the vendored files (rsocket.c,
 * indexer.c, util/util.c and the ccan headers they include) use, with
 * Debian's values (sysconfdir /etc). Not part of rdma-core. */
#ifndef CONFIG_H_IN
#define CONFIG_H_IN

#define HAVE_STATEMENT_EXPR 1
#define HAVE_BUILTIN_TYPES_COMPATIBLE_P 1
#define HAVE_TYPEOF 1
#define HAVE_ISBLANK 1
#define HAVE_BUILTIN_CLZ 1
#define HAVE_BUILTIN_CLZL 1

#define PACKAGE_VERSION "44.0"

#define STREAM_CLOEXEC "e"

/* rsocket's tunables: files read once by rs_configure() (rsocket(7)). */
#define RS_CONF_DIR "/etc/rdma/rsocket"

#define HAVE_FUNC_ATTRIBUTE_ALWAYS_INLINE 1

#endif
