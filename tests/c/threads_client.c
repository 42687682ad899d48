/* Calls through ncclshim from several threads at once, from the very first call (so that they
 * race on loading the real NCCL), and checks every answer.
 *   threads_client real   against NVIDIA's NCCL: versions, error strings, argument checks
 *   threads_client fake   against fake_nccl.c: nested calls go straight to the real library */
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define THREADS 8
#define CALLS 20000

static int fake_mode;
static int expected_version;
static pthread_barrier_t start;

static void* worker(void* arg) {
  long wrong = 0;
  (void)arg;
  pthread_barrier_wait(&start);
  for (int i = 0; i < CALLS; i++) {
    int version = 0;
    wrong += ncclGetVersion(&version) != ncclSuccess || version != expected_version;
    int count = -1;
    ncclResult_t rc = ncclCommCount(NULL, &count);
    if (fake_mode) {
      wrong += rc != ncclSuccess || count != 1;
    } else {
      wrong += rc != ncclInvalidArgument || count != -1;
      wrong += strcmp(ncclGetErrorString(ncclInvalidUsage), "invalid usage (run with NCCL_DEBUG=WARN for details)") != 0;
    }
  }
  return (void*)wrong;
}

int main(int argc, char** argv) {
  fake_mode = argc > 1 && strcmp(argv[1], "fake") == 0;
  expected_version = argc > 2 ? atoi(argv[2]) : 22707;
  if (fake_mode) {
    /* On this thread first: a function the fake lacks leaves ncclshim's own last error... */
    ncclComm_t child;
    ncclResult_t rc = ncclCommShrink(NULL, NULL, 0, &child, NULL, 0);
    printf("missing function: rc=%d\n", (int)rc);
    /* ...which the router gives to the application... */
    printf("application's last error: %s\n", ncclGetLastError(NULL));
    /* ...while a nested call from inside the real library goes straight back to it. */
    int count = -1;
    rc = ncclCommCount(NULL, &count);
    printf("nested call reached the real library: rc=%d count=%d\n", (int)rc, count);
  }
  pthread_t threads[THREADS];
  pthread_barrier_init(&start, NULL, THREADS);
  for (int t = 0; t < THREADS; t++) pthread_create(&threads[t], NULL, worker, NULL);
  long wrong = 0;
  for (int t = 0; t < THREADS; t++) {
    void* result;
    pthread_join(threads[t], &result);
    wrong += (long)result;
  }
  printf("threads=%d calls=%d wrong=%ld\n", THREADS, THREADS * CALLS, wrong);
  return 0;
}
