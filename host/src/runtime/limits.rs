//! Sandbox limits of one run: memory cap, compute slice and run deadline.

use std::time::Duration;

use wasmtime::{ResourceLimiter, StoreLimits, StoreLimitsBuilder};

/// What one run of a policy may use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Linear memory the policy may grow to, in bytes.
    pub memory_bytes: usize,
    /// Guest compute allowed between two host calls.
    pub slice: Duration,
    /// Wall time allowed for the whole run (host calls included).
    pub run_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            memory_bytes: 64 << 20,
            slice: Duration::from_secs(2),
            run_timeout: Duration::from_secs(600),
        }
    }
}

/// Enforces the memory cap and remembers whether the policy hit it, so that the resulting trap
/// can be reported as what it is.
pub struct Limiter {
    inner: StoreLimits,
    pub memory_refused: bool,
}

impl Limiter {
    pub fn new(limits: &Limits) -> Self {
        Limiter {
            inner: StoreLimitsBuilder::new()
                .memory_size(limits.memory_bytes)
                .table_elements(100_000)
                .instances(64)
                .tables(64)
                .memories(16)
                .trap_on_grow_failure(true)
                .build(),
            memory_refused: false,
        }
    }
}

impl ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let allowed = self.inner.memory_growing(current, desired, maximum);
        if !matches!(allowed, Ok(true)) {
            self.memory_refused = true;
        }
        allowed
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        self.inner.table_growing(current, desired, maximum)
    }

    fn instances(&self) -> usize {
        self.inner.instances()
    }

    fn tables(&self) -> usize {
        self.inner.tables()
    }

    fn memories(&self) -> usize {
        self.inner.memories()
    }
}
