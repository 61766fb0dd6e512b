//! Where the benchmark's threads run: pinned to one CPU, or let onto several.

/// Pins this process (and so the test server's thread and every child started later) to CPU 0.
pub fn pin_to_first_cpu() {
    set_affinity(1);
}

/// Lets the calling thread, and the children it starts, run on the first `cpus` CPUs (a thread
/// the process started keeps its own affinity).
pub fn set_affinity(cpus: usize) {
    // SAFETY: a zeroed cpu_set_t is the empty set; CPU_SET and sched_setaffinity only read and
    // write that local set, and pid 0 names the calling thread.
    let set = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for cpu in 0..cpus.min(libc::CPU_SETSIZE as usize) {
            libc::CPU_SET(cpu, &mut set);
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    assert_eq!(set, 0, "sched_setaffinity failed");
}

/// The CPUs the machine has online, whatever this thread's affinity.
pub fn online_cpus() -> usize {
    // SAFETY: sysconf only reads a system constant.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    usize::try_from(n).unwrap_or(1).max(1)
}
