// The shrink build of ll_dispatch.cu (ll_variant.h).
#define EP_LL_SHRINK 1
#include "ll_dispatch.cu"
