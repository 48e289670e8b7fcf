// The shrink build of ll_combine.cu (ll_variant.h).
#define EP_LL_SHRINK 1
#include "ll_combine.cu"
