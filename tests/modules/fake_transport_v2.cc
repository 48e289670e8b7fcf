// Network transport modules (table versions 2 and 3) for the loader tests,
// built five ways by the Makefile:
//   libmoeep-transport-fakenet.so    a valid version-2 table named "fakenet"
//   libmoeep-transport-noput.so      a version-2 table without put (FAKE_NO_PUT)
//   libmoeep-transport-both.so       exports epTransport_v1 and epTransport_v2
//                                    (FAKE_BOTH): the core takes v2
//   libmoeep-transport-waits.so      exports epTransport_v2 and epTransport_v3
//                                    (FAKE_V3): the core takes v3, with wait
//   libmoeep-transport-badthree.so   the same, its v3 table saying version 7
//                                    (FAKE_V3_BAD): the core takes v2
// They move no data: init succeeds, which is all the loader looks at; the
// other callbacks fail.
#include <cstdio>
#include <cstdlib>

#include "moeep_transport.h"

#ifndef FAKE_NAME
#define FAKE_NAME "fakenet"
#endif

namespace {

epResult_t fakeInit(const epTransportEnv_v1_t* env, void** ctx) {
  env->log(epTransportLogInfo, FAKE_NAME, "loaded");
  *ctx = nullptr;
  return epSuccess;
}
epResult_t fakeCommOpen(void*, const epTransportCommInfo_v2_t*, void**) { return epNotSupported; }
epResult_t fakeEndpoint(void*, int, epTrafficClass_t, void*, size_t*) { return epNotSupported; }
epResult_t fakeConnect(void*, int, epTrafficClass_t, const void*, size_t, void**) { return epNotSupported; }
epResult_t fakeRegMem(void*, void*, size_t, int, int, uint64_t, void**) { return epNotSupported; }
epResult_t fakeMemHandle(void*, void*, size_t*) { return epNotSupported; }
epResult_t fakeDeregMem(void*, void*) { return epSuccess; }
[[maybe_unused]] epResult_t fakePut(void*, void*, size_t, const void*, size_t, size_t, size_t, uint64_t, unsigned,
                                    uint64_t*) {
  return epNotSupported;
}
epResult_t fakeTest(void*, uint64_t, int*) { return epNotSupported; }
epResult_t fakeProgress(void*) { return epSuccess; }
epResult_t fakeLastError(void*, int* peer, char* msg, size_t len) {
  *peer = -1;
  if (len) msg[0] = '\0';
  return epSuccess;
}
epResult_t fakeClose(void*) { return epSuccess; }
epResult_t fakeCommClose(void*) { return epSuccess; }
// Writes "finalize NAME" into the file FAKE_FINALIZE_FILE names: the loader
// test's proof that the core called it, once, as the process exited.
epResult_t fakeFinalize(void*) {
  if (const char* path = getenv("FAKE_FINALIZE_FILE"))
    if (FILE* f = fopen(path, "a")) {
      fprintf(f, "finalize %s\n", FAKE_NAME);
      fclose(f);
    }
  return epSuccess;
}

#ifdef FAKE_V3
epResult_t fakeWait(void*, int) { return epSuccess; }
epResult_t fakeDropPeer(void*, int) { return epSuccess; }
#endif

#ifdef FAKE_NO_PUT
#define FAKE_PUT nullptr
#else
#define FAKE_PUT fakePut
#endif

const epTransport_v2_t fakeNet = {
    FAKE_NAME,    2,          fakeInit,      nullptr,   nullptr,       fakeCommOpen, fakeEndpoint, fakeConnect,
    fakeRegMem,   fakeMemHandle, fakeDeregMem, FAKE_PUT, fakeTest,     fakeProgress, nullptr,      fakeLastError,
    fakeClose,    fakeCommClose, fakeFinalize};

#ifdef FAKE_BOTH
epResult_t v1RegMem(void*, size_t, int, void**, void*, void**) { return epInternalError; }
epResult_t v1Dereg(void*, void*) { return epSuccess; }
epResult_t v1Connect(void*, const epPeerInfo_v1_t*, const void*, void**, void**) { return epInternalError; }
epResult_t v1Connected(void*, void*) { return epSuccess; }
epResult_t v1Close(void*, void*) { return epSuccess; }
epResult_t v1CanConnect(void*, const epPeerInfo_v1_t*, const epPeerInfo_v1_t*, int* ok) {
  *ok = 0;
  return epSuccess;
}
const epTransport_v1_t fakeOld = {FAKE_NAME, 1,       fakeInit, nullptr, v1CanConnect, v1RegMem, v1Dereg,
                                  v1Connect, v1Connected, nullptr, nullptr, v1Close, nullptr};
#endif

#ifdef FAKE_V3
#ifdef FAKE_V3_BAD
#define FAKE_V3_VERSION 7
#else
#define FAKE_V3_VERSION 3
#endif
const epTransport_v3_t fakeNet3 = {
    FAKE_NAME,    FAKE_V3_VERSION,          fakeInit,      nullptr,   nullptr,       fakeCommOpen, fakeEndpoint, fakeConnect,
    fakeRegMem,   fakeMemHandle, fakeDeregMem, FAKE_PUT, fakeTest,     fakeProgress, nullptr,      fakeLastError,
    fakeClose,    fakeCommClose, fakeFinalize, fakeWait, fakeDropPeer};
#endif

}  // namespace

extern "C" __attribute__((visibility("default"))) const epTransport_v2_t epTransport_v2 = fakeNet;
#ifdef FAKE_BOTH
extern "C" __attribute__((visibility("default"))) const epTransport_v1_t epTransport_v1 = fakeOld;
#endif
#ifdef FAKE_V3
extern "C" __attribute__((visibility("default"))) const epTransport_v3_t epTransport_v3 = fakeNet3;
#endif
