#pragma once
// How coload forks its worker processes (executor = processes, process_start = fork), for a
// program that must prepare the process around each fork: an interpreter that embeds coload.

#include <sys/types.h>

namespace coload {

/// Forks one worker process as fork(2) does: 0 in the child, the child's pid in the parent, -1
/// with errno set. Called on the loader's driver thread; the child goes on to the worker's loop
/// and never returns to the caller.
using WorkerFork = pid_t (*)();

/// Installs `fork` (nullptr: fork(2) itself) for every worker process that any loader of this
/// process forks from now on. The fork server's workers are not affected (the server has no
/// other thread to prepare for). Python's extension installs one that takes the GIL and wraps
/// fork(2) in PyOS_BeforeFork / PyOS_AfterFork_Parent / PyOS_AfterFork_Child, as os.fork()
/// does, so that a child can run the dataset's Python code.
void set_worker_fork(WorkerFork fork) noexcept;

}  // namespace coload
