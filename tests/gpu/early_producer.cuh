// Device side of the tests of programmatic dependent launch: the start of a
// kernel that lets the next kernel on its stream in at once
// (griddepcontrol.launch_dependents, as a kernel written for programmatic
// dependent launch may do) and then holds its own writes back for delay_ns,
// so that a dependent that read before its griddepcontrol.wait would read
// what was there before. For nvcc only (sm_90 and later).
#pragma once

__device__ __forceinline__ void letDependentsInThenWait(unsigned long long delay_ns) {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < delay_ns);
}
