// Whether a process of this machine still runs (peers of a node are watched
// by pid: the host backend's exchange and the CUDA backend's watcher).
#pragma once

namespace ep {

// False once the process `pid` exited or is a zombie (it will never make
// progress again); true while it runs, for pid <= 0, and where it cannot tell.
bool processAlive(int pid);

}  // namespace ep
