/*
 * libmoeep beside NCCL in the same processes (tests/gpu/bindings_gpu.sh runs it).
 *
 * Two ranks as processes, each with an NCCL communicator and a libmoeep
 * communicator (CUDA backend), one stream for both: ncclAllReduce, dispatch
 * (capacity sizing, no host wait), ncclAllReduce, combine, interleaved on
 * the stream; first eagerly, then captured together in one CUDA graph and
 * replayed on new inputs. Every output is checked against what it must be:
 * the all-reduce sums exactly (small multiples of 1/2 in float32); combine of
 * the received rows gives each token times the number of ranks that hold its
 * experts (small integers, exact in BF16).
 *
 * With one GPU the two processes share it. NCCL refuses two ranks on one
 * GPU of one host, so each process sets its own NCCL_HOSTID then (NCCL takes
 * them for two hosts and goes through its network transport); libmoeep
 * allows ranks to share a GPU (docs/SEMANTICS.md: correct without MPS, if
 * slow). The parent forks the ranks before any CUDA call and passes both
 * unique ids from rank 0 to rank 1 through a pipe.
 *
 *   gcc -std=c11 tests/gpu/nccl_beside.c -Iinclude -I$CUDA_HOME/include -I$NCCL/include \
 *       -L$BUILD/lib -lmoeep -L$CUDA_HOME/lib64 -lcudart -L$NCCL/lib -l:libnccl.so.2
 *
 * SPDX-License-Identifier: MIT
 */
#define _POSIX_C_SOURCE 200809L
#include <cuda_runtime.h>
#include <moeep.h>
#include <nccl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { R = 2, T = 64, H = 256, E = 8, K = 2, N_REDUCE = 1 << 16, REPLAYS = 3 };

#define FAIL_IF(cond, ...)                                 \
  do {                                                     \
    if (cond) {                                            \
      fprintf(stderr, "rank %d: ", rank);                  \
      fprintf(stderr, __VA_ARGS__);                        \
      fprintf(stderr, "\n");                               \
      return 1;                                            \
    }                                                      \
  } while (0)
#define CUDA_OK(call)                                                                    \
  do {                                                                                   \
    cudaError_t e_ = (call);                                                             \
    FAIL_IF(e_ != cudaSuccess, "%s: %s", #call, cudaGetErrorString(e_));                 \
  } while (0)
#define NCCL_OK(call)                                                                    \
  do {                                                                                   \
    ncclResult_t n_ = (call);                                                            \
    FAIL_IF(n_ != ncclSuccess, "%s: %s", #call, ncclGetErrorString(n_));                 \
  } while (0)
#define EP_OK(comm, call)                                                                \
  do {                                                                                   \
    epResult_t r_ = (call);                                                              \
    FAIL_IF(r_ != epSuccess, "%s: %s", #call, epGetLastError(comm));                     \
  } while (0)

static uint16_t bf16(float v) {  /* exact for the small integers used here */
  uint32_t u;
  memcpy(&u, &v, 4);
  return (uint16_t)(u >> 16);
}
static float from_bf16(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float v;
  memcpy(&v, &u, 4);
  return v;
}

/* Inputs of rank r in round `round` (0: eager; 1..: graph replays). */
static float x_value(int r, int round, int t, int j) { return (float)((r * T + t + j + 3 * round) % 9 - 4); }
static int64_t expert(int r, int round, int t, int k) {
  return k == 0 ? (t + r + round) % E : (3 * t + 1 + r + round) % E;  /* differ by 2t + 1: odd, E even */
}
static float reduce_value(int r, int round, int i) { return (float)r + 0.5f * (float)(i % 64) + (float)round; }

typedef struct {
  uint16_t *x, *recv_x, *out;
  int64_t *topk, *num_recv;
  float *a, *a_sum, *b, *b_sum;
} Device;

static int fill_inputs(int rank, int round, Device* d, cudaStream_t s, uint16_t* hx, int64_t* ht, float* ha) {
  for (int t = 0; t < T; t++) {
    for (int j = 0; j < H; j++) hx[t * H + j] = bf16(x_value(rank, round, t, j));
    for (int k = 0; k < K; k++) ht[t * K + k] = expert(rank, round, t, k);
  }
  for (int i = 0; i < N_REDUCE; i++) ha[i] = reduce_value(rank, round, i);
  CUDA_OK(cudaMemcpyAsync(d->x, hx, sizeof(uint16_t) * T * H, cudaMemcpyHostToDevice, s));
  CUDA_OK(cudaMemcpyAsync(d->topk, ht, sizeof(int64_t) * T * K, cudaMemcpyHostToDevice, s));
  CUDA_OK(cudaMemcpyAsync(d->a, ha, sizeof(float) * N_REDUCE, cudaMemcpyHostToDevice, s));
  CUDA_OK(cudaMemcpyAsync(d->b, ha, sizeof(float) * N_REDUCE, cudaMemcpyHostToDevice, s));
  CUDA_OK(cudaStreamSynchronize(s));
  return 0;
}

/* The interleaved sequence: all-reduce, dispatch, all-reduce, combine. */
static int layer(int rank, ncclComm_t nccl, epComm_t ep, epHandle_t* handle, Device* d, cudaStream_t s) {
  NCCL_OK(ncclAllReduce(d->a, d->a_sum, N_REDUCE, ncclFloat, ncclSum, nccl, s));
  epDispatchArgs_t da = EP_DISPATCH_ARGS_INITIALIZER;
  da.flags = EP_DISPATCH_NO_HOST_SYNC;
  da.x = d->x;
  da.x_type = epBfloat16;
  da.topk_idx = d->topk;
  da.num_tokens = T;
  da.num_topk = K;
  da.recv_x = d->recv_x;
  da.recv_capacity = R * T;
  da.num_recv = d->num_recv;
  *handle = NULL;
  EP_OK(ep, epDispatch(ep, &da, handle, (epStream_t)s));
  NCCL_OK(ncclAllReduce(d->b, d->b_sum, N_REDUCE, ncclFloat, ncclSum, nccl, s));
  epCombineArgs_t ca = EP_COMBINE_ARGS_INITIALIZER;
  ca.y = d->recv_x;  /* the experts return the rows as they came: out = x * ranks reached */
  ca.y_type = epBfloat16;
  ca.out = d->out;
  EP_OK(ep, epCombine(ep, &ca, *handle, (epStream_t)s));
  return 0;
}

static int check(int rank, int round, Device* d, cudaStream_t s, uint16_t* hout, float* hsum) {
  CUDA_OK(cudaStreamSynchronize(s));
  CUDA_OK(cudaMemcpy(hout, d->out, sizeof(uint16_t) * T * H, cudaMemcpyDeviceToHost));
  for (int t = 0; t < T; t++) {
    const int r0 = (int)(expert(rank, round, t, 0) / (E / R)), r1 = (int)(expert(rank, round, t, 1) / (E / R));
    const float ranks = r0 == r1 ? 1.0f : 2.0f;
    for (int j = 0; j < H; j++)
      FAIL_IF(from_bf16(hout[t * H + j]) != x_value(rank, round, t, j) * ranks,
              "round %d: combine token %d element %d is %g, expected %g", round, t, j, from_bf16(hout[t * H + j]),
              x_value(rank, round, t, j) * ranks);
  }
  float* sums[2] = {d->a_sum, d->b_sum};
  for (int which = 0; which < 2; which++) {
    CUDA_OK(cudaMemcpy(hsum, sums[which], sizeof(float) * N_REDUCE, cudaMemcpyDeviceToHost));
    for (int i = 0; i < N_REDUCE; i++) {
      float want = 0;
      for (int r = 0; r < R; r++) want += reduce_value(r, round, i);
      FAIL_IF(hsum[i] != want, "round %d: all-reduce %d element %d is %g, expected %g", round, which, i, hsum[i], want);
    }
  }
  return 0;
}

static int rank_main(int rank, int id_fd_in, int id_fd_out) {
  int ndev = 0;
  CUDA_OK(cudaGetDeviceCount(&ndev));
  FAIL_IF(ndev < 1, "no GPU");
  const int dev = rank % ndev;
  if (ndev < R) {
    /* Ranks share a GPU: NCCL must see two hosts (it refuses two ranks on one GPU of one host). */
    char host_id[64];
    snprintf(host_id, sizeof(host_id), "moeep-nccl-beside-%d", rank);
    setenv("NCCL_HOSTID", host_id, 1);
  }
  ncclUniqueId nid;
  epUniqueId eid;
  if (rank == 0) {
    NCCL_OK(ncclGetUniqueId(&nid));
    EP_OK(NULL, epGetUniqueId(&eid));
    FAIL_IF(write(id_fd_out, &nid, sizeof(nid)) != (ssize_t)sizeof(nid) ||
                write(id_fd_out, &eid, sizeof(eid)) != (ssize_t)sizeof(eid), "cannot send the ids");
  } else {
    char buf[sizeof(nid) + sizeof(eid)];
    size_t got = 0;
    while (got < sizeof(buf)) {
      ssize_t n = read(id_fd_in, buf + got, sizeof(buf) - got);
      FAIL_IF(n <= 0, "no ids from rank 0");
      got += (size_t)n;
    }
    memcpy(&nid, buf, sizeof(nid));
    memcpy(&eid, buf + sizeof(nid), sizeof(eid));
  }
  CUDA_OK(cudaSetDevice(dev));
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  ncclComm_t nccl;
  NCCL_OK(ncclCommInitRank(&nccl, R, nid, rank));
  epConfig_t cfg = EP_CONFIG_INITIALIZER;
  cfg.num_experts = E;
  cfg.hidden = H;
  cfg.max_tokens_per_rank = T;
  cfg.max_topk = K;
  cfg.backend = epBackendCuda;
  cfg.device = dev;
  epComm_t ep;
  EP_OK(NULL, epCommInitRank(&ep, R, eid, rank, &cfg));

  Device d;
  CUDA_OK(cudaMalloc((void**)&d.x, sizeof(uint16_t) * T * H));
  CUDA_OK(cudaMalloc((void**)&d.recv_x, sizeof(uint16_t) * R * T * H));
  CUDA_OK(cudaMalloc((void**)&d.out, sizeof(uint16_t) * T * H));
  CUDA_OK(cudaMalloc((void**)&d.topk, sizeof(int64_t) * T * K));
  CUDA_OK(cudaMalloc((void**)&d.num_recv, sizeof(int64_t)));
  CUDA_OK(cudaMalloc((void**)&d.a, sizeof(float) * N_REDUCE));
  CUDA_OK(cudaMalloc((void**)&d.a_sum, sizeof(float) * N_REDUCE));
  CUDA_OK(cudaMalloc((void**)&d.b, sizeof(float) * N_REDUCE));
  CUDA_OK(cudaMalloc((void**)&d.b_sum, sizeof(float) * N_REDUCE));
  uint16_t *hx = malloc(sizeof(uint16_t) * T * H), *hout = malloc(sizeof(uint16_t) * T * H);
  int64_t* ht = malloc(sizeof(int64_t) * T * K);
  float *ha = malloc(sizeof(float) * N_REDUCE), *hsum = malloc(sizeof(float) * N_REDUCE);
  FAIL_IF(!hx || !hout || !ht || !ha || !hsum, "out of host memory");

  /* Eager. */
  epHandle_t handle = NULL;
  if (fill_inputs(rank, 0, &d, s, hx, ht, ha) || layer(rank, nccl, ep, &handle, &d, s) ||
      check(rank, 0, &d, s, hout, hsum))
    return 1;
  EP_OK(ep, epHandleDestroy(handle));
  printf("rank %d: eager all-reduce / dispatch / all-reduce / combine on one stream: correct\n", rank);

  /* One CUDA graph of the same sequence, replayed on new inputs. */
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  if (layer(rank, nccl, ep, &handle, &d, s)) return 1;
  CUDA_OK(cudaStreamEndCapture(s, &graph));
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int round = 1; round <= REPLAYS; round++) {
    if (fill_inputs(rank, round, &d, s, hx, ht, ha)) return 1;
    CUDA_OK(cudaGraphLaunch(exec, s));
    if (check(rank, round, &d, s, hout, hsum)) return 1;
  }
  printf("rank %d: the same in one CUDA graph, %d replays on new inputs: correct\n", rank, REPLAYS);
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  EP_OK(ep, epHandleDestroy(handle));  /* only now: the graph read its state at every launch */
  EP_OK(NULL, epCommDestroy(ep));
  NCCL_OK(ncclCommDestroy(nccl));
  return 0;
}

int main(void) {
  int fds[2];
  if (pipe(fds) != 0) return perror("pipe"), 1;
  fflush(stdout);
  pid_t pids[R];
  for (int r = 0; r < R; r++) {
    pids[r] = fork();
    if (pids[r] < 0) return perror("fork"), 1;
    if (pids[r] == 0) {
      close(r == 0 ? fds[0] : fds[1]);  /* rank 0 writes the ids, rank 1 reads them (EOF if rank 0 dies) */
      const int rc = rank_main(r, fds[0], fds[1]);
      fflush(stdout);
      _exit(rc);
    }
  }
  close(fds[0]);
  close(fds[1]);
  int ok = 1;
  const time_t deadline = time(NULL) + 600;
  for (int done = 0; done < R;) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      done++;
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ok = 0;
    } else if (time(NULL) > deadline) {
      fprintf(stderr, "nccl_beside: timed out\n");
      for (int r = 0; r < R; r++) kill(pids[r], SIGKILL);
      ok = 0;
      break;
    } else {
      const struct timespec tenth = {0, 100000000};
      nanosleep(&tenth, NULL);
    }
  }
  printf("nccl_beside: %s\n", ok ? "PASSED" : "FAILED");
  return ok ? 0 : 1;
}
