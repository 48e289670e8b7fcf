/*
 * One mixture-of-experts layer on the host backend, shared by the C and MPI
 * examples. Rank r's token t picks experts (t + r) % E and (3t + 1 + r) % E
 * (never the same: E is even and they differ by an odd 2t + 1) with gate
 * weights 0.5 and 0.25. Dispatch sends each token once to every rank that
 * holds one of its experts; there each local expert e scales the row by
 * (e + 1) and the gate weight, and the rank adds its experts' results; combine
 * sums the ranks' rows back on the token's home rank. Every value is a small
 * multiple of 1/4, so float32 holds the sums exactly and the result must equal
 * the same layer computed locally, element for element.
 *
 * SPDX-License-Identifier: MIT
 */
#ifndef MOEEP_EXAMPLE_MOE_LAYER_H_
#define MOEEP_EXAMPLE_MOE_LAYER_H_

#include <moeep.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { kTokens = 32, kHidden = 128, kTopk = 2, kExpertsPerRank = 4 };

static epConfig_t moe_config(int nranks) {
  epConfig_t cfg = EP_CONFIG_INITIALIZER;
  cfg.num_experts = kExpertsPerRank * nranks;
  cfg.hidden = kHidden;
  cfg.max_tokens_per_rank = kTokens;
  cfg.max_topk = kTopk;
  cfg.dispatch_type = cfg.combine_type = epFloat32;
  cfg.backend = epBackendHost;
  return cfg;
}

/* 16-byte aligned rows, as the library requires. */
static float* rows(size_t n) {
  float* p = (float*)aligned_alloc(16, (n * kHidden * sizeof(float) + 15) / 16 * 16 + 16);
  if (p) memset(p, 0, n * kHidden * sizeof(float));
  return p;
}

#define MOE_CHECK(call)                                                                 \
  do {                                                                                  \
    epResult_t res_ = (call);                                                           \
    if (res_ != epSuccess) {                                                            \
      fprintf(stderr, "rank %d: %s: %s\n", rank, #call, epGetLastError(comm));          \
      goto done;                                                                        \
    }                                                                                   \
  } while (0)

/* Runs the layer on comm; 0 when every output is right, 1 otherwise. */
static int moe_layer(epComm_t comm, int rank, int nranks) {
  const int E = kExpertsPerRank * nranks;
  int status = 1, first = 0, count = 0;
  float *x = rows(kTokens), *out = rows(kTokens), *recv_x = NULL, *y = NULL;
  int64_t topk[kTokens * kTopk], *recv_idx = NULL;
  float weights[kTokens * kTopk], *recv_w = NULL;
  epHandle_t handle = NULL;
  int64_t num_recv = 0;
  if (!x || !out) goto done;
  for (int t = 0; t < kTokens; t++) {
    for (int j = 0; j < kHidden; j++) x[t * kHidden + j] = (float)((rank * kTokens + t + j) % 7 - 3);
    topk[t * kTopk] = (t + rank) % E;
    topk[t * kTopk + 1] = (3 * t + 1 + rank) % E;
    weights[t * kTopk] = 0.5f;
    weights[t * kTopk + 1] = 0.25f;
  }
  MOE_CHECK(epCommLocalExperts(comm, &first, &count));

  /* Exact sizing: prepare tells how many rows arrive, then dispatch moves them. */
  epDispatchArgs_t d = EP_DISPATCH_ARGS_INITIALIZER;
  d.x = x;
  d.x_type = epFloat32;
  d.topk_idx = topk;
  d.topk_weights = weights;
  d.num_tokens = kTokens;
  d.num_topk = kTopk;
  MOE_CHECK(epDispatchPrepare(comm, &d, &handle, NULL));
  MOE_CHECK(epHandleRecvCount(handle, &num_recv));
  recv_x = rows((size_t)num_recv);
  y = rows((size_t)num_recv);
  recv_idx = (int64_t*)malloc(sizeof(int64_t) * kTopk * (size_t)(num_recv + 1));
  recv_w = (float*)malloc(sizeof(float) * kTopk * (size_t)(num_recv + 1));
  if (!recv_x || !y || !recv_idx || !recv_w) goto done;
  d.recv_x = recv_x;
  d.recv_topk_idx = recv_idx;
  d.recv_topk_weights = recv_w;
  d.recv_capacity = num_recv;
  MOE_CHECK(epDispatch(comm, &d, &handle, NULL));

  /* The experts: each received row, scaled by its local experts' (id + 1) and gate weights. */
  for (int64_t i = 0; i < num_recv; i++) {
    float scale = 0.0f;
    for (int k = 0; k < kTopk; k++)
      if (recv_idx[i * kTopk + k] >= 0) scale += recv_w[i * kTopk + k] * (float)(first + recv_idx[i * kTopk + k] + 1);
    for (int j = 0; j < kHidden; j++) y[i * kHidden + j] = scale * recv_x[i * kHidden + j];
  }
  epCombineArgs_t c = EP_COMBINE_ARGS_INITIALIZER;
  c.y = y;
  c.y_type = epFloat32;
  c.out = out;
  MOE_CHECK(epCombine(comm, &c, handle, NULL));

  status = 0;
  for (int t = 0; t < kTokens && status == 0; t++) {
    const float scale = 0.5f * (float)(topk[t * kTopk] + 1) + 0.25f * (float)(topk[t * kTopk + 1] + 1);
    for (int j = 0; j < kHidden; j++) {
      if (out[t * kHidden + j] != scale * x[t * kHidden + j]) {
        fprintf(stderr, "rank %d: token %d element %d is %g, expected %g\n", rank, t, j, out[t * kHidden + j],
                scale * x[t * kHidden + j]);
        status = 1;
        break;
      }
    }
  }
  printf("rank %d of %d: received %lld rows for experts %d..%d, combined %d tokens: %s\n", rank, nranks,
         (long long)num_recv, first, first + count - 1, kTokens, status == 0 ? "correct" : "WRONG");
done:
  epHandleDestroy(handle);
  free(x);
  free(out);
  free(recv_x);
  free(y);
  free(recv_idx);
  free(recv_w);
  return status;
}

#endif /* MOEEP_EXAMPLE_MOE_LAYER_H_ */
