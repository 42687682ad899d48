/* Drives the test fixture net_socket_plugin.c (path in argv[1]) as NCCL's proxy thread does,
 * without a GPU: listen, connect and accept from one thread (each may have to be called again),
 * then messages both ways of 0, 1, 4096, 1 MiB + 3 and 8 MiB bytes, the 8 MiB ones posted both
 * ways before either side receives (a plugin that blocks in a send hangs here), several requests
 * in flight per comm, every byte and reported size checked. With "threads", each end is driven
 * by a thread of its own. Prints "ok ..." and exits 0, or says what went wrong and exits 1. */
#include <dlfcn.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "net_plugin_v8.h"

static const ncclNet_v8_t* net;

#define CHECK(call)                                              \
  do {                                                           \
    ncclResult_t r_ = (call);                                    \
    if (r_ != ncclSuccess) {                                     \
      printf("%s:%d: %s returned %d\n", __FILE__, __LINE__, #call, r_); \
      exit(1);                                                   \
    }                                                            \
  } while (0)

static void logger(int level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  (void)flags, (void)file, (void)line;
  va_list args;
  va_start(args, fmt);
  printf("log %d: ", level);
  vprintf(fmt, args);
  printf("\n");
  va_end(args);
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Tests the requests until all are done, within 20 s; checks the sizes reported. */
static void wait_all(void** requests, const int* expected, int n) {
  double start = now();
  int left = n;
  while (left) {
    for (int i = 0; i < n; i++) {
      if (!requests[i]) continue;
      int done = 0, size = -1;
      CHECK(net->test(requests[i], &done, &size));
      if (!done) continue;
      if (size != expected[i]) {
        printf("request %d: size %d reported, %d expected\n", i, size, expected[i]);
        exit(1);
      }
      requests[i] = NULL;
      left--;
    }
    if (now() - start > 20) {
      printf("%d requests not done after 20 s: the plugin is stuck\n", left);
      exit(1);
    }
  }
}

static void* post_send(void* comm, char* data, int size) {
  void* request = NULL;
  while (!request) CHECK(net->isend(comm, data, size, 0, NULL, &request));
  return request;
}

static void* post_recv(void* comm, char* data, int max) {
  void* request = NULL;
  int tag = 0;
  void* mhandle = NULL;
  while (!request) CHECK(net->irecv(comm, 1, (void**)&data, &max, &tag, &mhandle, &request));
  return request;
}

static char* pattern(size_t size, int seed) {
  char* data = malloc(size + 1);
  for (size_t i = 0; i < size; i++) data[i] = (char)(i * 31 + seed);
  return data;
}

static void check(const char* got, size_t size, int seed, const char* what) {
  for (size_t i = 0; i < size; i++) {
    if (got[i] != (char)(i * 31 + seed)) {
      printf("%s: byte %zu wrong\n", what, i);
      exit(1);
    }
  }
}

static const int sizes[] = {0, 1, 4096, (1 << 20) + 3, 8 << 20};
enum { SIZES = sizeof sizes / sizeof sizes[0] };

/* One end's traffic: every size sent and received through (send, recv), the sends all posted
 * before the receives. */
static void exchange(void* send, void* recv, int seed_out, int seed_in) {
  void* requests[2 * SIZES];
  int expected[2 * SIZES];
  char* out[SIZES];
  char* in[SIZES];
  for (int i = 0; i < SIZES; i++) {
    out[i] = pattern(sizes[i], seed_out + i);
    in[i] = calloc(1, sizes[i] + 16);
    requests[i] = post_send(send, out[i], sizes[i]);
    expected[i] = sizes[i];
  }
  for (int i = 0; i < SIZES; i++) {
    requests[SIZES + i] = post_recv(recv, in[i], sizes[i] + 16);
    expected[SIZES + i] = sizes[i];
  }
  wait_all(requests, expected, 2 * SIZES);
  for (int i = 0; i < SIZES; i++) {
    check(in[i], sizes[i], seed_in + i, "received");
    free(out[i]);
    free(in[i]);
  }
}

struct end {
  void *send, *recv;
  int seed_out, seed_in;
};

static void* run_end(void* arg) {
  struct end* e = arg;
  exchange(e->send, e->recv, e->seed_out, e->seed_in);
  return NULL;
}

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  int threads = argc > 2 && !strcmp(argv[2], "threads");
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib || !(net = dlsym(lib, "ncclNetPlugin_v8"))) {
    printf("no ncclNetPlugin_v8 in %s: %s\n", argv[1], dlerror());
    return 1;
  }
  CHECK(net->init(logger));
  int ndev = 0;
  CHECK(net->devices(&ndev));
  ncclNetProperties_v8_t props;
  CHECK(net->getProperties(0, &props));
  if (ndev != 1 || props.maxRecvs != 1 || props.ptrSupport != NCCL_PTR_HOST) {
    printf("unexpected: %d devices, maxRecvs %d, ptrSupport %d\n", ndev, props.maxRecvs, props.ptrSupport);
    return 1;
  }
  /* Two connections, a -> b and b -> a, set up from this one thread. */
  void *send[2] = {NULL, NULL}, *recv[2] = {NULL, NULL};
  for (int c = 0; c < 2; c++) {
    char handle[NCCL_NET_HANDLE_MAXSIZE];
    void* listener;
    CHECK(net->listen(0, handle, &listener));
    for (double start = now(); !send[c] || !recv[c];) {
      if (!send[c]) CHECK(net->connect(0, handle, &send[c], NULL));
      if (!recv[c]) CHECK(net->accept(listener, &recv[c], NULL));
      if (now() - start > 20) {
        printf("connection %d not made in 20 s\n", c);
        return 1;
      }
    }
    CHECK(net->closeListen(listener));
  }
  /* End a sends on connection 0 and receives on 1; end b the other way round. */
  struct end a = {send[0], recv[1], 10, 20}, b = {send[1], recv[0], 20, 10};
  if (threads) {
    pthread_t t[2];
    pthread_create(&t[0], NULL, run_end, &a);
    pthread_create(&t[1], NULL, run_end, &b);
    pthread_join(t[0], NULL);
    pthread_join(t[1], NULL);
  } else {
    /* One thread: both ends' sends posted, then both ends' receives; progress only in test. */
    void* requests[4 * SIZES];
    int expected[4 * SIZES];
    char *out[2][SIZES], *in[2][SIZES];
    struct end* ends[2] = {&a, &b};
    for (int e = 0; e < 2; e++)
      for (int i = 0; i < SIZES; i++) {
        out[e][i] = pattern(sizes[i], ends[e]->seed_out + i);
        requests[e * SIZES + i] = post_send(ends[e]->send, out[e][i], sizes[i]);
        expected[e * SIZES + i] = sizes[i];
      }
    for (int e = 0; e < 2; e++)
      for (int i = 0; i < SIZES; i++) {
        in[e][i] = calloc(1, sizes[i] + 16);
        requests[(2 + e) * SIZES + i] = post_recv(ends[e]->recv, in[e][i], sizes[i] + 16);
        expected[(2 + e) * SIZES + i] = sizes[i];
      }
    wait_all(requests, expected, 4 * SIZES);
    for (int e = 0; e < 2; e++)
      for (int i = 0; i < SIZES; i++) check(in[e][i], sizes[i], ends[e]->seed_in + i, "received");
  }
  for (int c = 0; c < 2; c++) {
    CHECK(net->closeSend(send[c]));
    CHECK(net->closeRecv(recv[c]));
  }
  printf("ok %s: %d sizes both ways, up to %d bytes\n", threads ? "threads" : "one thread", SIZES, sizes[SIZES - 1]);
  return 0;
}
