# transports/ibverbs: build/lib/libmoeep-transport-ibverbs.so, and the
# program that drives it directly over real verbs (tests/rdma).
# Compiled against libibverbs-dev / librdmacm-dev headers (scripts/install-deps.sh);
# linked against neither: the module opens the libraries at run time.
IBVERBS_SRCS := $(wildcard transports/ibverbs/*.cc)
IBVERBS_OBJS := $(IBVERBS_SRCS:%.cc=$(BUILD)/obj/%.o)
IBVERBS_MODULE := $(BUILD)/lib/libmoeep-transport-ibverbs.so
IBVERBS_CHECK := $(BUILD)/tests/ib_transport_check

ifneq ($(and $(wildcard /usr/include/infiniband/verbs.h),$(wildcard /usr/include/rdma/rdma_cma.h)),)
MODULES += $(IBVERBS_MODULE) $(IBVERBS_CHECK)

$(IBVERBS_MODULE): $(IBVERBS_OBJS)
	@mkdir -p $(dir $@)
	$(CXX) -shared -Wl,--no-undefined -pthread -o $@ $^ -ldl $(LDFLAGS)

# It runs the proxy (src/proxy) over the module too: its sources are compiled in.
$(IBVERBS_CHECK): tests/rdma/ib_transport_check.cc include/moeep_transport.h $(wildcard src/proxy/*)
	@mkdir -p $(dir $@)
	$(CXX) $(CPPFLAGS_BASE) $(CXXFLAGS_BASE) $(CXXFLAGS) $< src/proxy/proxy.cc -o $@ -ldl -pthread $(LDFLAGS)
else
$(info transports/ibverbs not built: no <infiniband/verbs.h> or <rdma/rdma_cma.h> (scripts/install-deps.sh installs libibverbs-dev and librdmacm-dev))
endif
