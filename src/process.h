// Whether a process of this machine still runs (peers of a node are watched
// by pid: the host backend's exchange and the CUDA backend's watcher).
#pragma once

namespace ep {

// False once the process `pid` exited or is a zombie (it will never make
// progress again); true while it runs, for pid <= 0, and where it cannot tell.
bool processAlive(int pid);

// This process's pid namespace (the inode of /proc/self/ns/pid), 0 where it
// cannot tell. A peer's pid means something here only when both namespaces
// are the same: ranks in containers with their own pid namespaces (sharing
// /dev/shm or the GPUs) cannot watch each other's pids.
unsigned long long pidNamespaceId();

}  // namespace ep
