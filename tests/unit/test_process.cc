// processAlive (src/process.h), which the host backend's exchange and the
// CUDA backend's watcher use to tell that a peer process exited: this
// process is alive; a child that exited is not, both as a zombie (not yet
// reaped: it still answers kill()) and once reaped; pidNamespaceId, which
// decides whose pids a rank may watch.
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"

#include "process.h"

namespace {

void self_is_alive(void**) {
  assert_true(ep::processAlive(int(getpid())));
  assert_true(ep::processAlive(0));  // no pid known: assumed alive
}

void exited_child_is_not_alive(void**) {
  const pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) _exit(0);
  // A zombie until reaped: give it time to exit, then look before waitpid.
  bool zombie_seen = false;
  for (int i = 0; i < 200 && !zombie_seen; i++) {
    usleep(10 * 1000);
    zombie_seen = !ep::processAlive(int(pid));
  }
  assert_true(zombie_seen);
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_false(ep::processAlive(int(pid)));
}

void running_child_is_alive(void**) {
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  const pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {  // runs until the parent closes the pipe
    close(fds[1]);
    char c;
    while (read(fds[0], &c, 1) > 0) {
    }
    _exit(0);
  }
  close(fds[0]);
  assert_true(ep::processAlive(int(pid)));
  close(fds[1]);
  int status = 0;
  waitpid(pid, &status, 0);
}

// The pid namespace id is known on Linux and shared with a forked child
// (the case in which the backends watch a peer's pid).
void pid_namespace_is_shared_with_a_child(void**) {
  const unsigned long long mine = ep::pidNamespaceId();
  assert_true(mine != 0);
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  const pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    const unsigned long long child = ep::pidNamespaceId();
    _exit(write(fds[1], &child, sizeof(child)) == ssize_t(sizeof(child)) ? 0 : 1);
  }
  unsigned long long child = 0;
  assert_int_equal(read(fds[0], &child, sizeof(child)), ssize_t(sizeof(child)));
  int status = 0;
  waitpid(pid, &status, 0);
  close(fds[0]);
  close(fds[1]);
  assert_true(child == mine);
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(self_is_alive),
      cmocka_unit_test(exited_child_is_not_alive),
      cmocka_unit_test(running_child_is_alive),
      cmocka_unit_test(pid_namespace_is_shared_with_a_child),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
