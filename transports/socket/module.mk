# The socket transport module (included by the top Makefile): build/lib/
# libmoeep-transport-socket.so, beside libmoeep.so where the loader looks, and
# its test program, which loads the module with dlopen and links nothing else.
SOCKET_MOD := $(BUILD)/lib/libmoeep-transport-socket.so
SOCKET_TEST := $(BUILD)/tests/socket_transport_test
SOCKET_MOD_SRCS := $(filter-out transports/socket/socket_transport_test.cc,$(wildcard transports/socket/*.cc))
# src/socket.cc: the bootstrap's addresses, interface choice and listening
# (it holds no library state), compiled into the module as well.
SOCKET_MOD_OBJS := $(SOCKET_MOD_SRCS:%.cc=$(BUILD)/obj/%.o) $(BUILD)/obj/src/socket.o
MODULES += $(SOCKET_MOD) $(SOCKET_TEST)
tests: $(SOCKET_MOD) $(SOCKET_TEST)

$(SOCKET_MOD): $(SOCKET_MOD_OBJS)
	@mkdir -p $(dir $@)
	$(CXX) -shared -Wl,--no-undefined -pthread -o $@ $^ $(LDFLAGS)

$(SOCKET_TEST): transports/socket/socket_transport_test.cc transports/socket/test_harness.h transports/socket/wire.h \
                include/moeep_transport.h
	@mkdir -p $(dir $@)
	$(CXX) $(CPPFLAGS_BASE) $(CXXFLAGS_BASE) $(CXXFLAGS) $< -o $@ -ldl $(LDFLAGS)
