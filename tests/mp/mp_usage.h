// What a test process holds, for soaks that must show nothing growing:
// open descriptors, threads, resident memory, and the ibverbs module's verbs
// objects. Shared by mp_dispatch --soak and mp_lowlat --rounds-after.
#pragma once

#include <dirent.h>
#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

namespace mp {

// What a process holds: open descriptors, threads, resident memory, and the
// ibverbs module's verbs objects (QPs, CQs, MRs, ...; -1: module not loaded).
struct Usage {
  int fds = 0, threads = 0;
  long rss_kb = 0, verbs = -1;
};

inline int entries(const char* dir) {
  int n = 0;
  if (DIR* d = opendir(dir)) {
    while (const dirent* e = readdir(d))
      if (e->d_name[0] != '.') n++;
    closedir(d);
  }
  return n;
}

inline long verbsObjects() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    const size_t at = line.find('/');
    if (at == std::string::npos || line.find("libmoeep-transport-ibverbs.so") == std::string::npos) continue;
    void* lib = dlopen(line.substr(at).c_str(), RTLD_NOW | RTLD_NOLOAD);
    if (lib == nullptr) return -1;
    auto live = reinterpret_cast<long (*)()>(dlsym(lib, "epIbverbsLiveObjects"));
    const long n = live ? live() : -1;
    dlclose(lib);
    return n;
  }
  return -1;
}

inline Usage usageNow() {
  Usage u;
  u.fds = entries("/proc/self/fd") - 1;  // opendir's own
  u.threads = entries("/proc/self/task");
  long pages = 0, resident = 0;
  if (FILE* f = fopen("/proc/self/statm", "r")) {
    if (fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    fclose(f);
  }
  u.rss_kb = resident * (sysconf(_SC_PAGESIZE) / 1024);
  u.verbs = verbsObjects();
  return u;
}

}  // namespace mp
