# libmoeep — build with `make -j2`; see README.md.
#
#   make                  library, tools and tests in build/
#   make test             every test level this machine supports (unit, multi-process, abi)
#   make gpu-test         the GPU tests (fails where no GPU is found)
#   make install PREFIX=/usr/local
#   make abi-check        exported symbols, headers alone, abidiff against abi/libmoeep.abi
#
# CUDA=auto builds the CUDA backend when nvcc is found (CUDA=0 never, CUDA=1 always).

VERSION_MAJOR := 0
VERSION_MINOR := 1
VERSION_PATCH := 0
VERSION := $(VERSION_MAJOR).$(VERSION_MINOR).$(VERSION_PATCH)

.DEFAULT_GOAL := all
PREFIX ?= /usr/local
BUILD ?= build
CUDA ?= auto
CUDA_HOME ?= /usr/local/cuda
NVCC ?= $(CUDA_HOME)/bin/nvcc
# sm_90 always; add sm_80 with CUDA_ARCHS="80 90" where Ampere is wanted.
CUDA_ARCHS ?= 90

CXX ?= g++
CC ?= gcc
OPT ?= -O2
CXXFLAGS_BASE := -std=c++17 $(OPT) -g -fPIC -fvisibility=hidden -fvisibility-inlines-hidden \
                 -Wall -Wextra -Wno-missing-field-initializers -pthread
CPPFLAGS_BASE := -Iinclude -Isrc -MMD -MP
LDFLAGS_LIB := -shared -Wl,-soname,libmoeep.so.$(VERSION_MAJOR) -Wl,--no-undefined \
               -Wl,--version-script=src/libmoeep.map -Wl,--exclude-libs,ALL -pthread
LIBS := -ldl -lrt

ifeq ($(CUDA),auto)
  ifneq ($(and $(wildcard $(NVCC)),$(wildcard src/cuda/*.cc)),)
    CUDA := 1
  else
    CUDA := 0
  endif
endif

LIB_SRCS := $(wildcard src/*.cc) $(wildcard src/host/*.cc) $(wildcard src/topo/*.cc) $(wildcard src/proxy/*.cc) \
            $(wildcard src/recovery/*.cc) $(wildcard transports/shm/*.cc)

# hwloc (topology) when pkg-config finds it (HWLOC=0 never); without it the
# topology reports "hwloc not available" and everything else still works.
HWLOC ?= auto
ifneq ($(HWLOC),0)
  ifeq ($(shell pkg-config --exists hwloc && echo yes),yes)
    CPPFLAGS_BASE += -DEP_WITH_HWLOC=1 $(shell pkg-config --cflags hwloc)
    LIBS += $(shell pkg-config --libs hwloc)
  endif
endif

ifeq ($(CUDA),1)
  LIB_SRCS := $(filter-out src/cuda_stub.cc,$(LIB_SRCS)) $(wildcard src/cuda/*.cc) \
              $(wildcard transports/cuda_ipc/*.cc)
  CU_SRCS := $(wildcard src/cuda/*.cu)
  CPPFLAGS_BASE += -DEP_WITH_CUDA=1 -isystem $(CUDA_HOME)/include '-DEP_CUDA_ARCHS="$(CUDA_ARCHS)"'
  LIBS += -L$(CUDA_HOME)/lib64 -lcudart_static
  NVCC_GENCODE := $(foreach a,$(CUDA_ARCHS),-gencode=arch=compute_$(a),code=sm_$(a))
  NVCCFLAGS := -std=c++17 $(OPT) -lineinfo -Xcompiler -fPIC,-fvisibility=hidden \
               $(NVCC_GENCODE) -Iinclude -Isrc --expt-relaxed-constexpr
else
  CU_SRCS :=
endif

LIB_OBJS := $(LIB_SRCS:%.cc=$(BUILD)/obj/%.o) $(CU_SRCS:%.cu=$(BUILD)/obj/%.cu.o)
LIB_REAL := $(BUILD)/lib/libmoeep.so.$(VERSION)
LIB_SONAME := $(BUILD)/lib/libmoeep.so.$(VERSION_MAJOR)
LIB_DEV := $(BUILD)/lib/libmoeep.so
LIB_INTERNAL := $(BUILD)/lib/libmoeep_internal.a

TOOLS := $(patsubst tools/%.cc,$(BUILD)/bin/%,$(wildcard tools/*.cc))
ifeq ($(CUDA),1)
  # The GPU benchmark (ep_bench --backend cuda runs it): nvcc, NCCL opened at run time.
  TOOLS += $(BUILD)/bin/ep_bench_gpu
endif
TOOL_COMMON := $(wildcard tools/common/*.cc)

# Unit tests: CMocka suites against the internal archive (C++ sees the internals),
# linked whole so that built-in transports, which register from static
# initialisers, are in the program as they are in libmoeep.so.
UNIT_SRCS := $(wildcard tests/unit/test_*.cc)
UNIT_BINS := $(UNIT_SRCS:tests/unit/%.cc=$(BUILD)/tests/%)
# The bootstrap's own test programs (forked cases, no CMocka): the selftest,
# and strangers on its listening sockets.
$(BUILD)/tests/bootstrap_%: tests/unit/bootstrap_%.cc tests/unit/bootstrap_cases.h $(LIB_INTERNAL)
	@mkdir -p $(dir $@)
	$(CXX) $(CPPFLAGS_BASE) $(CXXFLAGS_BASE) $(CXXFLAGS) $< -o $@ \
	  -Wl,--whole-archive $(LIB_INTERNAL) -Wl,--no-whole-archive $(LIBS) $(LDFLAGS)

# Multi-process tests: public API only.
MP_SRCS := $(wildcard tests/mp/*.cc)
MP_BINS := $(MP_SRCS:tests/mp/%.cc=$(BUILD)/tests/%)

RPATH := -Wl,-rpath,'$$ORIGIN/../lib'

.PHONY: all lib tools tests modules test gpu-test install abi-check abi-baseline clean lint format
all: lib tools tests modules

# Transport modules (libmoeep-transport-NAME.so beside libmoeep.so, where the
# loader looks first): each transports/NAME/module.mk adds its module to
# MODULES and says how to build it.
MODULES :=
-include $(wildcard transports/*/module.mk)
modules: $(MODULES)

lib: $(LIB_DEV) $(LIB_INTERNAL)
tools: $(TOOLS)
SELFTEST_BINS := $(BUILD)/tests/bootstrap_selftest $(BUILD)/tests/bootstrap_guard
# Transport modules the loader tests find through EP_TRANSPORT_PATH.
TEST_MODULES := $(BUILD)/tests/modules/libmoeep-transport-fake.so \
                $(BUILD)/tests/modules/libmoeep-transport-future.so \
                $(BUILD)/tests/modules/libmoeep-transport-nosym.so \
                $(BUILD)/tests/modules/libmoeep-transport-noname.so \
                $(BUILD)/tests/modules/libmoeep-transport-noconnect.so \
                $(BUILD)/tests/modules/libmoeep-transport-noprops.so \
                $(BUILD)/tests/modules/libmoeep-transport-funcsym.so \
                $(BUILD)/tests/modules/libmoeep-transport-fakenet.so \
                $(BUILD)/tests/modules/libmoeep-transport-noput.so \
                $(BUILD)/tests/modules/libmoeep-transport-both.so \
                $(BUILD)/tests/modules/libmoeep-transport-waits.so \
                $(BUILD)/tests/modules/libmoeep-transport-badthree.so
tests: $(UNIT_BINS) $(MP_BINS) $(SELFTEST_BINS) $(TEST_MODULES)

MODULE_FLAGS = $(CPPFLAGS_BASE) $(CXXFLAGS_BASE) -shared
$(BUILD)/tests/modules/libmoeep-transport-fake.so: tests/modules/fake_transport.cc src/transport.h
	@mkdir -p $(dir $@)
	$(CXX) $(MODULE_FLAGS) $< -o $@
$(BUILD)/tests/modules/libmoeep-transport-future.so: tests/modules/fake_transport.cc src/transport.h
	@mkdir -p $(dir $@)
	$(CXX) $(MODULE_FLAGS) '-DFAKE_NAME="future"' -DFAKE_VERSION=99 $< -o $@
$(BUILD)/tests/modules/libmoeep-transport-nosym.so: tests/modules/fake_transport.cc src/transport.h
	@mkdir -p $(dir $@)
	$(CXX) $(MODULE_FLAGS) '-DFAKE_NAME="nosym"' -DFAKE_NO_SYMBOL $< -o $@
$(BUILD)/tests/modules/libmoeep-transport-noname.so: tests/modules/fake_transport.cc src/transport.h
	@mkdir -p $(dir $@)
	$(CXX) $(MODULE_FLAGS) '-DFAKE_NAME="noname"' -DFAKE_NULL_NAME $< -o $@
$(BUILD)/tests/modules/libmoeep-transport-noconnect.so: tests/modules/fake_transport.cc src/transport.h
	@mkdir -p $(dir $@)
	$(CXX) $(MODULE_FLAGS) '-DFAKE_NAME="noconnect"' -DFAKE_NO_CONNECT $< -o $@
$(BUILD)/tests/modules/libmoeep-transport-noprops.so: tests/modules/fake_transport.cc src/transport.h
	@mkdir -p $(dir $@)
	$(CXX) $(MODULE_FLAGS) '-DFAKE_NAME="noprops"' -DFAKE_NO_OPTIONAL $< -o $@
$(BUILD)/tests/modules/libmoeep-transport-funcsym.so: tests/modules/fake_transport.cc src/transport.h
	@mkdir -p $(dir $@)
	$(CXX) $(MODULE_FLAGS) '-DFAKE_NAME="funcsym"' -DFAKE_FUNCTION_SYMBOL $< -o $@

$(BUILD)/tests/modules/libmoeep-transport-fakenet.so: tests/modules/fake_transport_v2.cc include/moeep_transport.h
	@mkdir -p $(dir $@)
	$(CXX) $(MODULE_FLAGS) $< -o $@
$(BUILD)/tests/modules/libmoeep-transport-noput.so: tests/modules/fake_transport_v2.cc include/moeep_transport.h
	@mkdir -p $(dir $@)
	$(CXX) $(MODULE_FLAGS) '-DFAKE_NAME="noput"' -DFAKE_NO_PUT $< -o $@
$(BUILD)/tests/modules/libmoeep-transport-both.so: tests/modules/fake_transport_v2.cc include/moeep_transport.h
	@mkdir -p $(dir $@)
	$(CXX) $(MODULE_FLAGS) '-DFAKE_NAME="both"' -DFAKE_BOTH $< -o $@
$(BUILD)/tests/modules/libmoeep-transport-waits.so: tests/modules/fake_transport_v2.cc include/moeep_transport.h
	@mkdir -p $(dir $@)
	$(CXX) $(MODULE_FLAGS) '-DFAKE_NAME="waits"' -DFAKE_V3 $< -o $@
$(BUILD)/tests/modules/libmoeep-transport-badthree.so: tests/modules/fake_transport_v2.cc include/moeep_transport.h
	@mkdir -p $(dir $@)
	$(CXX) $(MODULE_FLAGS) '-DFAKE_NAME="badthree"' -DFAKE_V3 -DFAKE_V3_BAD $< -o $@

$(BUILD)/obj/%.o: %.cc
	@mkdir -p $(dir $@)
	$(CXX) $(CPPFLAGS_BASE) $(CPPFLAGS) $(CXXFLAGS_BASE) $(CXXFLAGS) -c $< -o $@

$(BUILD)/obj/%.cu.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -DEP_WITH_CUDA=1 -MMD -MP -c $< -o $@

$(LIB_REAL): $(LIB_OBJS) src/libmoeep.map
	@mkdir -p $(dir $@)
	$(CXX) $(LDFLAGS_LIB) -o $@ $(LIB_OBJS) $(LIBS) $(LDFLAGS)

$(LIB_SONAME): $(LIB_REAL)
	ln -sf $(notdir $<) $@
$(LIB_DEV): $(LIB_SONAME)
	ln -sf $(notdir $<) $@

$(LIB_INTERNAL): $(LIB_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/bin/ep_bench_gpu: tools/gpu/ep_bench_gpu.cu $(wildcard tools/gpu/*.h) $(LIB_DEV)
	@mkdir -p $(dir $@)
	$(NVCC) -std=c++17 $(OPT) $(NVCC_GENCODE) -Iinclude $< -o $@ -L$(BUILD)/lib -lmoeep -ldl \
	  -Xlinker -rpath -Xlinker '$$ORIGIN/../lib'

$(BUILD)/bin/%: tools/%.cc $(TOOL_COMMON) $(wildcard tools/common/*.h) $(LIB_DEV)
	@mkdir -p $(dir $@)
	$(CXX) $(CPPFLAGS_BASE) -Itools $(CXXFLAGS_BASE) $(CXXFLAGS) $< $(TOOL_COMMON) -o $@ \
	  -L$(BUILD)/lib -lmoeep $(RPATH) $(LDFLAGS)

$(BUILD)/tests/test_%: tests/unit/test_%.cc $(LIB_INTERNAL)
	@mkdir -p $(dir $@)
	$(CXX) $(CPPFLAGS_BASE) -Itests $(CXXFLAGS_BASE) $(CXXFLAGS) $< -o $@ \
	  -Wl,--whole-archive $(LIB_INTERNAL) -Wl,--no-whole-archive -lcmocka $(LIBS) $(LDFLAGS)

$(BUILD)/tests/%: tests/mp/%.cc tools/common/launch.cc $(LIB_DEV)
	@mkdir -p $(dir $@)
	$(CXX) $(CPPFLAGS_BASE) -Itests -Itools $(CXXFLAGS_BASE) $< tools/common/launch.cc -o $@ \
	  -L$(BUILD)/lib -lmoeep $(RPATH)

# Every level this machine supports, each saying what it ran or skipped.
test: all
	BUILD=$(BUILD) bash tests/run_all.sh

gpu-test: all
	BUILD=$(BUILD) bash tests/gpu/run.sh

abi-check: $(LIB_DEV)
	BUILD=$(BUILD) bash scripts/abi-check.sh

abi-baseline: $(LIB_DEV)
	BUILD=$(BUILD) bash scripts/abi-check.sh --update

install: lib tools
	install -d $(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/bin
	install -m 0755 $(LIB_REAL) $(DESTDIR)$(PREFIX)/lib/
	ln -sf libmoeep.so.$(VERSION) $(DESTDIR)$(PREFIX)/lib/libmoeep.so.$(VERSION_MAJOR)
	ln -sf libmoeep.so.$(VERSION_MAJOR) $(DESTDIR)$(PREFIX)/lib/libmoeep.so
	install -m 0644 include/moeep.h include/moeep_transport.h $(DESTDIR)$(PREFIX)/include/
	install -m 0755 $(TOOLS) $(DESTDIR)$(PREFIX)/bin/
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(VERSION)|g' pkgconfig/moeep.pc.in \
	  > $(DESTDIR)$(PREFIX)/lib/pkgconfig/moeep.pc

lint:
	bash scripts/lint.sh

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null) $(wildcard $(BUILD)/bin/*.d $(BUILD)/tests/*.d)
