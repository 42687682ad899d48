/* A minimal NCCL network plugin over TCP sockets ("shimtest"), a test fixture: the GPU suite
 * runs NCCL's multi-process jobs through it with NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1, under
 * the real NCCL and under the shim, to show that the shim does not get in the way of NCCL's
 * network plugins. tests/c/net_plugin_driver.c drives it as NCCL's proxy would, without a GPU.
 *
 * It exports the v8 interface (ncclNetPlugin_v8), which NCCL loads from 2.19 to 2.30 at least;
 * its types are declared here from the interface's published layout. One device, host memory
 * only (NCCL stages GPU data through host buffers), loopback TCP: one node only. Nothing blocks:
 * connect finishes at once on loopback (the kernel accepts for the listener), accept and every
 * transfer make what progress they can and return, so that one thread may drive both ends.
 * Each message goes as a 4-byte length, then its bytes; a receive reports the length sent. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "net_plugin_v8.h"

/* --- State --- */
static ncclDebugLogger_t logger;
#define LOG(level, ...) \
  do { \
    if (logger) logger(level, NCCL_INIT | NCCL_NET, __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)
#define FAIL(what) \
  do { \
    LOG(NCCL_LOG_WARN, "NET/shimtest : %s: %s", what, strerror(errno)); \
    return ncclSystemError; \
  } while (0)

struct handle { /* what the listener tells the connecting side; fits NCCL_NET_HANDLE_MAXSIZE */
  struct sockaddr_in address;
};

struct comm;
struct request {
  struct comm* comm;
  int used, sending, done;
  char* data;
  uint32_t size;   /* sending: the size; receiving: the most it may take, then the size sent */
  uint32_t length; /* the 4-byte length on the wire */
  size_t moved;    /* bytes of length + data moved so far */
};

struct comm {
  int fd;
  /* Requests in the order they were posted, moved in that order: next is the oldest not yet
   * moved in full, posted counts them all. */
  struct request requests[NCCL_NET_MAX_REQUESTS];
  unsigned next, posted;
};

static ncclResult_t set_nonblocking(int fd) {
  int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) FAIL("fcntl");
  return ncclSuccess;
}

static ncclResult_t shimtest_init(ncclDebugLogger_t logFunction) {
  logger = logFunction;
  LOG(NCCL_LOG_INFO, "NET/shimtest : ready (a test fixture: TCP on loopback, host memory)");
  return ncclSuccess;
}

static ncclResult_t shimtest_devices(int* ndev) {
  *ndev = 1;
  return ncclSuccess;
}

static ncclResult_t shimtest_get_properties(int dev, ncclNetProperties_v8_t* props) {
  if (dev != 0) return ncclInvalidArgument;
  memset(props, 0, sizeof *props);
  props->name = (char*)"shimtest0";
  props->pciPath = NULL;
  props->guid = 0x5348494d;
  props->ptrSupport = NCCL_PTR_HOST;
  props->speed = 10000;
  props->maxComms = 65536;
  props->maxRecvs = 1;
  return ncclSuccess;
}

static ncclResult_t shimtest_listen(int dev, void* opaque, void** listenComm) {
  (void)dev;
  _Static_assert(sizeof(struct handle) <= NCCL_NET_HANDLE_MAXSIZE, "handle too large");
  struct handle* handle = opaque;
  memset(handle, 0, sizeof *handle);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) FAIL("socket");
  struct sockaddr_in address = {.sin_family = AF_INET, .sin_port = 0};
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  if (bind(fd, (struct sockaddr*)&address, sizeof address) || listen(fd, 64) ||
      getsockname(fd, (struct sockaddr*)&address, &length)) {
    close(fd);
    FAIL("listen");
  }
  if (set_nonblocking(fd) != ncclSuccess) return ncclSystemError;
  handle->address = address;
  struct comm* comm = calloc(1, sizeof *comm);
  if (!comm) return ncclSystemError;
  comm->fd = fd;
  *listenComm = comm;
  return ncclSuccess;
}

static ncclResult_t new_comm(int fd, void** out) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (set_nonblocking(fd) != ncclSuccess) return ncclSystemError;
  struct comm* comm = calloc(1, sizeof *comm);
  if (!comm) return ncclSystemError;
  comm->fd = fd;
  *out = comm;
  return ncclSuccess;
}

static ncclResult_t shimtest_connect(int dev, void* opaque, void** sendComm, void** sendDevComm) {
  (void)dev;
  if (sendDevComm) *sendDevComm = NULL;
  struct handle* handle = opaque;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) FAIL("socket");
  /* On loopback the kernel completes the connection for the listener at once, before its
   * accept: this never waits for the other side. */
  if (connect(fd, (struct sockaddr*)&handle->address, sizeof handle->address)) {
    close(fd);
    FAIL("connect");
  }
  return new_comm(fd, sendComm);
}

static ncclResult_t shimtest_accept(void* listenComm, void** recvComm, void** recvDevComm) {
  if (recvDevComm) *recvDevComm = NULL;
  struct comm* listener = listenComm;
  *recvComm = NULL;
  int fd = accept(listener->fd, NULL, NULL);
  if (fd < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return ncclSuccess; /* call again */
    FAIL("accept");
  }
  return new_comm(fd, recvComm);
}

static ncclResult_t shimtest_reg_mr(void* comm, void* data, size_t size, int type, void** mhandle) {
  (void)comm, (void)data, (void)size;
  *mhandle = NULL;
  return type == NCCL_PTR_HOST ? ncclSuccess : ncclInternalError;
}

static ncclResult_t shimtest_reg_mr_dmabuf(void* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                                           void** mhandle) {
  (void)offset, (void)fd;
  return shimtest_reg_mr(comm, data, size, type, mhandle);
}

static ncclResult_t shimtest_dereg_mr(void* comm, void* mhandle) {
  (void)comm, (void)mhandle;
  return ncclSuccess;
}

/* Posts a request, or leaves *request NULL when the comm has NCCL_NET_MAX_REQUESTS in flight
 * (NCCL then posts it again later). */
static ncclResult_t post(struct comm* comm, int sending, void* data, uint32_t size, void** request) {
  struct request* r = &comm->requests[comm->posted % NCCL_NET_MAX_REQUESTS];
  *request = NULL;
  if (r->used) return ncclSuccess;
  *r = (struct request){.comm = comm, .used = 1, .sending = sending, .data = data, .size = size};
  r->length = size;
  comm->posted++;
  *request = r;
  return ncclSuccess;
}

static ncclResult_t shimtest_isend(void* sendComm, void* data, int size, int tag, void* mhandle, void** request) {
  (void)tag, (void)mhandle;
  return post(sendComm, 1, data, (uint32_t)size, request);
}

static ncclResult_t shimtest_irecv(void* recvComm, int n, void** data, int* sizes, int* tags, void** mhandles,
                                   void** request) {
  (void)tags, (void)mhandles;
  if (n != 1) return ncclInternalError; /* maxRecvs is 1 */
  return post(recvComm, 0, data[0], (uint32_t)sizes[0], request);
}

static ncclResult_t shimtest_iflush(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request) {
  (void)recvComm, (void)n, (void)data, (void)sizes, (void)mhandles;
  *request = NULL; /* host memory: nothing to flush */
  return ncclSuccess;
}

/* Moves what the socket takes of the comm's oldest requests, in order, without waiting. */
static ncclResult_t progress(struct comm* comm) {
  while (comm->next != comm->posted) {
    struct request* r = &comm->requests[comm->next % NCCL_NET_MAX_REQUESTS];
    while (r->moved < 4 + (size_t)r->length) {
      ssize_t n;
      if (r->moved < 4) {
        char* length = (char*)&r->length + r->moved;
        n = r->sending ? send(comm->fd, length, 4 - r->moved, MSG_DONTWAIT | MSG_NOSIGNAL)
                       : recv(comm->fd, length, 4 - r->moved, MSG_DONTWAIT);
      } else {
        char* at = r->data + (r->moved - 4);
        size_t left = 4 + (size_t)r->length - r->moved;
        n = r->sending ? send(comm->fd, at, left, MSG_DONTWAIT | MSG_NOSIGNAL) : recv(comm->fd, at, left, MSG_DONTWAIT);
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return ncclSuccess;
      if (n < 0) FAIL(r->sending ? "send" : "recv");
      if (n == 0 && !r->sending) {
        LOG(NCCL_LOG_WARN, "NET/shimtest : the peer closed the connection");
        return ncclSystemError;
      }
      r->moved += (size_t)n;
      if (!r->sending && r->moved == 4 && r->length > r->size) {
        LOG(NCCL_LOG_WARN, "NET/shimtest : a message of %u bytes for a receive of at most %u", r->length, r->size);
        return ncclInternalError;
      }
    }
    r->done = 1;
    comm->next++;
  }
  return ncclSuccess;
}

static ncclResult_t shimtest_test(void* request, int* done, int* sizes) {
  struct request* r = request;
  ncclResult_t result = progress(r->comm);
  if (result != ncclSuccess) return result;
  *done = r->done;
  if (r->done) {
    if (sizes) *sizes = (int)r->length;
    r->used = 0;
  }
  return ncclSuccess;
}

static ncclResult_t close_comm(void* opaque) {
  struct comm* comm = opaque;
  if (comm) {
    close(comm->fd);
    free(comm);
  }
  return ncclSuccess;
}

static ncclResult_t shimtest_get_device_mr(void* comm, void* mhandle, void** dptr_mhandle) {
  (void)comm, (void)mhandle, (void)dptr_mhandle;
  return ncclInternalError; /* no device offload */
}

static ncclResult_t shimtest_irecv_consumed(void* recvComm, int n, void* request) {
  (void)recvComm, (void)n, (void)request;
  return ncclSuccess;
}

__attribute__((visibility("default"))) const ncclNet_v8_t ncclNetPlugin_v8 = {
    .name = "shimtest",
    .init = shimtest_init,
    .devices = shimtest_devices,
    .getProperties = shimtest_get_properties,
    .listen = shimtest_listen,
    .connect = shimtest_connect,
    .accept = shimtest_accept,
    .regMr = shimtest_reg_mr,
    .regMrDmaBuf = shimtest_reg_mr_dmabuf,
    .deregMr = shimtest_dereg_mr,
    .isend = shimtest_isend,
    .irecv = shimtest_irecv,
    .iflush = shimtest_iflush,
    .test = shimtest_test,
    .closeSend = close_comm,
    .closeRecv = close_comm,
    .closeListen = close_comm,
    .getDeviceMr = shimtest_get_device_mr,
    .irecvConsumed = shimtest_irecv_consumed,
};
