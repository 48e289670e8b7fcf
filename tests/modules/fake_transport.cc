// A transport module for the loader tests, built three ways by the Makefile:
//   libmoeep-transport-fake.so     a valid version-1 module named "fake"
//   libmoeep-transport-future.so   claims a transport ABI newer than the library
//   libmoeep-transport-nosym.so    exports no epTransport_v1 (FAKE_NO_SYMBOL)
//   libmoeep-transport-noname.so   a table whose name is NULL (FAKE_NULL_NAME)
//   libmoeep-transport-noconnect.so  a table without its connect callback (FAKE_NO_CONNECT)
//   libmoeep-transport-noprops.so  without properties and finalize, which may be NULL (FAKE_NO_OPTIONAL)
//   libmoeep-transport-funcsym.so  exports epTransport_v1 as a function, not a table (FAKE_FUNCTION_SYMBOL)
// It moves no data: init succeeds and properties name it, which is all the
// loader looks at; the other mandatory callbacks are stubs that fail.
#define EP_TRANSPORT_MODULE 1
#include "transport.h"

#ifndef FAKE_NAME
#define FAKE_NAME "fake"
#endif
#ifndef FAKE_VERSION
#define FAKE_VERSION 1
#endif

namespace {

epResult_t fakeInit(const epTransportEnv_v1_t* env, void** ctx) {
  env->log(epTransportLogInfo, FAKE_NAME, "loaded");
  *ctx = nullptr;
  return epSuccess;
}
[[maybe_unused]] epResult_t fakeProperties(void*, epTransportProps_v1_t* props) {
  props->name = FAKE_NAME;
  props->caps = EP_TRANSPORT_CAP_HOST_MEM;
  props->latency_us = 1;
  props->bandwidth_gbps = 1;
  return epSuccess;
}
epResult_t fakeCanConnect(void*, const epPeerInfo_v1_t*, const epPeerInfo_v1_t*, int* ok) {
  *ok = 0;
  return epSuccess;
}
epResult_t fakeRegMem(void*, size_t, int, void**, void*, void**) { return epInternalError; }
epResult_t fakeDeregMem(void*, void*) { return epSuccess; }
[[maybe_unused]] epResult_t fakeConnect(void*, const epPeerInfo_v1_t*, const void*, void**, void**) {
  return epInternalError;
}
epResult_t fakeConnected(void*, void*) { return epSuccess; }
epResult_t fakeClose(void*, void*) { return epSuccess; }
[[maybe_unused]] epResult_t fakeFinalize(void*) { return epSuccess; }

#ifdef FAKE_NULL_NAME
#define FAKE_TABLE_NAME nullptr
#else
#define FAKE_TABLE_NAME FAKE_NAME
#endif
#ifdef FAKE_NO_CONNECT
#define FAKE_CONNECT nullptr
#else
#define FAKE_CONNECT fakeConnect
#endif
#ifdef FAKE_NO_OPTIONAL
#define FAKE_PROPERTIES nullptr
#define FAKE_FINALIZE nullptr
#else
#define FAKE_PROPERTIES fakeProperties
#define FAKE_FINALIZE fakeFinalize
#endif

const epTransport_v1_t fakeTransport = {FAKE_TABLE_NAME, FAKE_VERSION,  fakeInit,     FAKE_PROPERTIES,
                                        fakeCanConnect,  fakeRegMem,    fakeDeregMem, FAKE_CONNECT,
                                        fakeConnected,   nullptr,       nullptr,      fakeClose,
                                        FAKE_FINALIZE};

}  // namespace

#if defined(FAKE_FUNCTION_SYMBOL)
// A module author's mistake: a function where the table should be. Its first
// bytes are code, not a name pointer.
extern "C" __attribute__((visibility("default"))) const epTransport_v1_t* epTransport_v1() { return &fakeTransport; }
#elif !defined(FAKE_NO_SYMBOL)
EP_TRANSPORT_DEFINE(fakeTransport)
#else
extern "C" {
__attribute__((visibility("default"))) int epNotATransport = 1;
}
#endif
