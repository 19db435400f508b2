// The CPUs a cgroup's CPU quota leaves this process (a container's `--cpus`, a Kubernetes CPU
// limit): auto_workers sizes its threads by it, as Go's runtime and the JVM size theirs.
// Internal to the library; the loader's tests read it.
#pragma once

#include <string_view>

namespace coload::detail {

/// ceil(quota / period) of the smallest CPU quota on this process's cgroup path, in the
/// cgroup v2 hierarchy (`cpu.max`) and the cgroup v1 `cpu` one (`cpu.cfs_quota_us` over
/// `cpu.cfs_period_us`): a parent's quota binds its children. 0 where no quota applies or
/// none can be read. `proc_cgroup` and `mountinfo` are the texts of /proc/self/cgroup and
/// /proc/self/mountinfo (the mount points they name are read).
int cgroup_cpu_limit(std::string_view proc_cgroup, std::string_view mountinfo);

/// cgroup_cpu_limit of this process's own files; 0 where they cannot be read.
int cgroup_cpu_limit();

}  // namespace coload::detail
