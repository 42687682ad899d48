/* Calls operations on made-up communicators (through the shim, on fake_operations_nccl.c as the
 * real NCCL) for the tests of what the shim records: on comm 0x1000 (rank 0) 100 float
 * all-reduces of 1 KiB, 5 all-gathers of 8 MiB of bytes, a broadcast from root 1, a send to and
 * a receive from peer 1, then it is destroyed; 4 threads, each on a communicator of its own
 * (0x2000 to 0x5000, as NCCL wants), 5000 all-reduces each; with "fork", a child process makes
 * 10 all-reduces on comm 0x6000;
 * with "signal", the process raises SIGUSR1 and waits a moment; with "groups", only groups on
 * comm 0x1000: empty, of one all-reduce, nested, simulated (ncclGroupSimulateEnd), and an end
 * without a start, each named first;
 * with "windows", registrations on comm 0x1000 of nothing, refused (no communicator) and of a
 * buffer, each with a handle slot holding 0xdead before, and what the slot holds after; with
 * "empty", calls of no elements on a communicator made through ncclCommInitRank (valid ones in a
 * group, with questions to the communicator, and alone, then ones NCCL refuses), a call with
 * elements, and one after it is destroyed,
 * each named first; with "checkmode", a call of no elements on a communicator, then on one made
 * once NCCL_CHECK_MODE is set; with "pair RANK", rank RANK of 2 of a communicator named by
 * PAIR_ID (its other rank another process), and an all-reduce on it. Prints "done" at the end. */
#include <nccl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define COMM(n) ((ncclComm_t)(uintptr_t)(n))

static void* all_reduces(void* comm) {
  for (int i = 0; i < 5000; i++) ncclAllReduce((void*)16, (void*)16, 8, ncclInt64, ncclMax, (ncclComm_t)comm, NULL);
  return NULL;
}

int main(int argc, char** argv) {
  // Unbuffered, so that its lines and the shim's (written at once) come in the order made.
  setvbuf(stdout, NULL, _IONBF, 0);
  int fork_child = argc > 1 && !strcmp(argv[1], "fork");
  int signal_self = argc > 1 && !strcmp(argv[1], "signal");
  int wait_signal = argc > 1 && !strcmp(argv[1], "wait");
  if (argc > 1 && !strcmp(argv[1], "windows")) {
    struct {
      const char* name;
      ncclComm_t comm;
      void* buff;
      size_t size;
    } cases[] = {{"nothing", COMM(0x1000), NULL, 0},
                 {"refused", NULL, (void*)16, 64},
                 {"a buffer", COMM(0x1000), (void*)16, 64}};
    for (int i = 0; i < 3; i++) {
      ncclWindow_t win = (ncclWindow_t)(uintptr_t)0xdead;
      ncclResult_t r = ncclCommWindowRegister(cases[i].comm, cases[i].buff, cases[i].size, &win,
                                              NCCL_WIN_COLL_SYMMETRIC);
      printf("window of %s: result %d, handle %#lx\n", cases[i].name, (int)r,
             (unsigned long)(uintptr_t)win);
    }
    printf("done\n");
    return 0;
  }
  if (argc > 1 && !strcmp(argv[1], "empty")) {
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    ncclComm_t comm = NULL;
    printf("made: %d\n", (int)ncclCommInitRank(&comm, 2, id, 0));
    printf("a group of two empty all-reduces\n");
    int nranks = 0, rank = -1;
    ncclGroupStart();
    // Questions in the group, as nccl-tests asks them before a gather.
    ncclCommCount(comm, &nranks);
    ncclCommUserRank(comm, &rank);
    ncclAllReduce((void*)16, (void*)16, 0, ncclFloat, ncclSum, comm, NULL);
    ncclAllReduce(NULL, NULL, 0, ncclBfloat16, ncclAvg, comm, NULL);
    ncclGroupEnd();
    printf("rank %d of %d\n", rank, nranks);
    printf("an empty broadcast from root 1\n");
    ncclBroadcast(NULL, NULL, 0, ncclFloat, 1, comm, NULL);
    printf("an empty broadcast from root 2\n");
    ncclBroadcast(NULL, NULL, 0, ncclFloat, 2, comm, NULL);
    printf("an empty all-reduce of type 255\n");
    ncclAllReduce(NULL, NULL, 0, (ncclDataType_t)255, ncclSum, comm, NULL);
    printf("an empty all-reduce of op 5\n");
    ncclAllReduce(NULL, NULL, 0, ncclFloat, (ncclRedOp_t)5, comm, NULL);
    printf("an empty all-reduce of 8-bit floats\n");
    ncclAllReduce(NULL, NULL, 0, ncclFloat8e4m3, ncclSum, comm, NULL);
    printf("an all-reduce of 4\n");
    ncclAllReduce((void*)16, (void*)16, 4, ncclFloat, ncclSum, comm, NULL);
    ncclCommDestroy(comm);
    printf("an empty all-reduce once destroyed\n");
    ncclAllReduce((void*)16, (void*)16, 0, ncclFloat, ncclSum, comm, NULL);
    printf("done\n");
    return 0;
  }
  if (argc > 2 && !strcmp(argv[1], "pair")) {
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    const char* name = getenv("PAIR_ID");
    if (name) strncpy(id.internal, name, sizeof id.internal - 1);
    int rank = atoi(argv[2]);
    ncclComm_t comm = NULL;
    printf("made: %d\n", (int)ncclCommInitRank(&comm, 2, id, rank));
    printf("an all-reduce\n");
    ncclAllReduce((void*)16, (void*)16, 4, ncclFloat, ncclSum, comm, NULL);
    printf("done\n");
    return 0;
  }
  if (argc > 1 && !strcmp(argv[1], "checkmode")) {
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    ncclComm_t first = NULL, second = NULL;
    printf("made: %d\n", (int)ncclCommInitRank(&first, 2, id, 0));
    printf("an empty all-reduce\n");
    ncclAllReduce((void*)16, (void*)16, 0, ncclFloat, ncclSum, first, NULL);
    setenv("NCCL_CHECK_MODE", "DEBUG_LOCAL", 1);
    printf("made with NCCL_CHECK_MODE: %d\n", (int)ncclCommInitRank(&second, 2, id, 1));
    printf("an empty all-reduce on it\n");
    ncclAllReduce((void*)16, (void*)16, 0, ncclFloat, ncclSum, second, NULL);
    printf("done\n");
    return 0;
  }
  if (argc > 1 && !strcmp(argv[1], "groups")) {
    printf("empty\n");
    ncclGroupStart();
    ncclGroupEnd();
    printf("one call\n");
    ncclGroupStart();
    ncclAllReduce((void*)16, (void*)16, 256, ncclFloat, ncclSum, COMM(0x1000), NULL);
    ncclGroupEnd();
    printf("nested, the call inside\n");
    ncclGroupStart();
    ncclGroupStart();
    ncclAllReduce((void*)16, (void*)16, 256, ncclFloat, ncclSum, COMM(0x1000), NULL);
    ncclGroupEnd();
    ncclGroupEnd();
    printf("nested, the call after the inner one\n");
    ncclGroupStart();
    ncclGroupStart();
    ncclGroupEnd();
    ncclAllReduce((void*)16, (void*)16, 256, ncclFloat, ncclSum, COMM(0x1000), NULL);
    ncclGroupEnd();
    printf("simulated, empty\n");
    ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
    ncclGroupStart();
    ncclGroupSimulateEnd(&sim);
    printf("simulated, one call\n");
    ncclGroupStart();
    ncclAllReduce((void*)16, (void*)16, 256, ncclFloat, ncclSum, COMM(0x1000), NULL);
    ncclGroupSimulateEnd(&sim);
    printf("nested, the inner one simulated\n");
    ncclGroupStart();
    ncclGroupStart();
    ncclAllReduce((void*)16, (void*)16, 256, ncclFloat, ncclSum, COMM(0x1000), NULL);
    ncclGroupSimulateEnd(&sim);
    ncclGroupEnd();
    printf("an end without a start\n");
    ncclGroupEnd();
    printf("done\n");
    return 0;
  }
  for (int i = 0; i < 100; i++) ncclAllReduce((void*)16, (void*)16, 256, ncclFloat, ncclSum, COMM(0x1000), NULL);
  for (int i = 0; i < 5; i++) ncclAllGather((void*)16, (void*)16, 8 << 20, ncclUint8, COMM(0x1000), NULL);
  ncclBroadcast((void*)16, (void*)16, 4, ncclBfloat16, 1, COMM(0x1000), NULL);
  ncclSend((void*)16, 2, ncclDouble, 1, COMM(0x1000), NULL);
  ncclRecv((void*)16, 2, ncclDouble, 1, COMM(0x1000), NULL);
  pthread_t threads[4];
  for (int t = 0; t < 4; t++) pthread_create(&threads[t], NULL, all_reduces, COMM(0x2000 + 0x1000 * t));
  for (int t = 0; t < 4; t++) pthread_join(threads[t], NULL);
  if (signal_self) {
    raise(SIGUSR1);
    usleep(300000);
  }
  if (wait_signal) {
    printf("waiting\n");
    fflush(stdout);
    sleep(10); /* a signal ends it early */
    usleep(300000);
  }
  ncclCommDestroy(COMM(0x1000));
  if (fork_child) {
    pid_t child = fork();
    if (child == 0) {
      for (int i = 0; i < 10; i++) ncclAllReduce((void*)16, (void*)16, 1, ncclInt32, ncclSum, COMM(0x6000), NULL);
      return 0;
    }
    waitpid(child, NULL, 0);
  }
  printf("done\n");
  return 0;
}
