"""Where libmoeep.so is found. In order:
  1. MOEEP_LIBRARY: the library file, or the directory that holds it;
  2. the installed prefix: lib/ under this Python's prefix (a venv that
     `make install PREFIX=$VIRTUAL_ENV` filled), its base prefix, /usr/local;
  3. the libdir of `pkg-config moeep` (PKG_CONFIG_PATH is honoured);
  4. the dynamic loader's own search (LD_LIBRARY_PATH, ld.so.cache).
The first that loads wins; a failure lists every place tried.
"""
import ctypes
import os
import subprocess
import sys

SONAME = "libmoeep.so.0"


class LibraryNotFound(OSError):
    pass


def _candidates():
    env = os.environ.get("MOEEP_LIBRARY")
    if env:
        # Only this one: a user who names a library must get that library or an error.
        yield ("MOEEP_LIBRARY", os.path.join(env, SONAME) if os.path.isdir(env) else env)
        return
    seen = set()
    for prefix in (sys.prefix, sys.base_prefix, "/usr/local"):
        path = os.path.join(prefix, "lib", SONAME)
        if path not in seen:
            seen.add(path)
            yield ("prefix " + prefix, path)
    try:
        libdir = subprocess.run(["pkg-config", "--variable=libdir", "moeep"], capture_output=True,
                                text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        libdir = ""
    if libdir:
        yield ("pkg-config", os.path.join(libdir, SONAME))
    yield ("dynamic loader", SONAME)


def load_library():
    tried = []
    for how, path in _candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append("%s: %s (no such file)" % (how, path))
            continue
        try:
            return ctypes.CDLL(path)
        except OSError as e:
            tried.append("%s: %s (%s)" % (how, path, e))
    raise LibraryNotFound("libmoeep not found; set MOEEP_LIBRARY to the library or its directory. Tried:\n  " +
                          "\n  ".join(tried))
