/* vrnic: included before every vendored file (-include). vrnic's
 * librdmacm.so.1 exports each rsocket function through a trampoline with
 * its .symver (guest-lib/rdmacm/src/symbols.rs), as it exports the rdma_*
 * functions, so rsocket.c's definitions take these hidden names and the
 * trampolines branch to them. The renaming applies to <rdma/rsocket.h>'s
 * prototypes as well, so rsocket.c compiles unchanged. Not part of
 * rdma-core. */
#ifndef VRNIC_RSOCKET_NAMES_H
#define VRNIC_RSOCKET_NAMES_H

#define raccept vrnic_rs_raccept
#define rbind vrnic_rs_rbind
#define rclose vrnic_rs_rclose
#define rconnect vrnic_rs_rconnect
#define rfcntl vrnic_rs_rfcntl
#define rgetpeername vrnic_rs_rgetpeername
#define rgetsockname vrnic_rs_rgetsockname
#define rgetsockopt vrnic_rs_rgetsockopt
#define riomap vrnic_rs_riomap
#define riounmap vrnic_rs_riounmap
#define riowrite vrnic_rs_riowrite
#define rlisten vrnic_rs_rlisten
#define rpoll vrnic_rs_rpoll
#define rread vrnic_rs_rread
#define rreadv vrnic_rs_rreadv
#define rrecv vrnic_rs_rrecv
#define rrecvfrom vrnic_rs_rrecvfrom
#define rrecvmsg vrnic_rs_rrecvmsg
#define rselect vrnic_rs_rselect
#define rsend vrnic_rs_rsend
#define rsendmsg vrnic_rs_rsendmsg
#define rsendto vrnic_rs_rsendto
#define rsetsockopt vrnic_rs_rsetsockopt
#define rshutdown vrnic_rs_rshutdown
#define rsocket vrnic_rs_rsocket
#define rwrite vrnic_rs_rwrite
#define rwritev vrnic_rs_rwritev

#endif
