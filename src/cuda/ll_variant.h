// The two builds of the low-latency kernels. ll_dispatch.cu,
// ll_dispatch_small.cu and ll_combine.cu compile as they are (EP_LL_SHRINK
// 0, their launches in namespace ll_plain), and again through
// ll_*_shrink.cu with EP_LL_SHRINK 1 (namespace ll_shrink), whose kernels
// read the mask of an epCommShrink (ll_device.cuh: llDeadRanks). LLEngine
// takes the second build where config.enable_shrink is set, the first
// everywhere else, which thus runs the code it ran before shrink existed.
// The device functions of ll_device.cuh that test the mask (llDeadRanks,
// llIsDead, llSignal, ...) keep one name with two bodies, one per build:
// correct only because each translation unit is compiled whole (no -rdc,
// no device link-time optimisation, Makefile NVCCFLAGS) and they are
// inlined. A build with relocatable device code must move them into a
// namespace per build first.
#pragma once

#ifndef EP_LL_SHRINK
#define EP_LL_SHRINK 0
#endif
#if EP_LL_SHRINK
#define EP_LL_VARIANT ll_shrink
#else
#define EP_LL_VARIANT ll_plain
#endif
