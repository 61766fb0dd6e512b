//! Sandbox limits of one run: memory cap, compute slice and run deadline.

use std::time::Duration;

use wasmtime::{ResourceLimiter, StoreLimits, StoreLimitsBuilder};

/// What one run of a policy may use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Memory the policy may grow to, in bytes: all its linear memories and tables together.
    pub memory_bytes: usize,
    /// Guest compute allowed between two host calls (waits in WASI count too).
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

/// What one table element costs against the memory cap (a reference, as the runtime stores it).
pub const TABLE_ELEMENT_BYTES: usize = std::mem::size_of::<usize>();

/// Enforces the memory cap over everything the policy's instances allocate — every linear memory
/// (a component may have several) and every table — and remembers whether the policy hit it, so
/// that the resulting trap can be reported as what it is.
pub struct Limiter {
    /// Counts of instances, tables and memories, and elements per table.
    inner: StoreLimits,
    cap: usize,
    /// Bytes of memories and tables granted so far (they never shrink within a store).
    used: usize,
    /// The last growth granted, taken back if the runtime then fails it.
    last_grant: usize,
    pub memory_refused: bool,
}

impl Limiter {
    pub fn new(limits: &Limits) -> Self {
        Limiter {
            inner: StoreLimitsBuilder::new()
                .table_elements(100_000)
                .instances(64)
                .tables(64)
                .memories(16)
                .trap_on_grow_failure(true)
                .build(),
            cap: limits.memory_bytes,
            used: 0,
            last_grant: 0,
            memory_refused: false,
        }
    }

    /// Bytes of memories and tables the policy holds.
    pub fn used_bytes(&self) -> usize {
        self.used
    }

    /// Grants `more` bytes if the total stays within the cap; otherwise traps.
    fn grant(&mut self, more: usize) -> wasmtime::Result<bool> {
        let total = self.used.saturating_add(more);
        if total > self.cap {
            self.memory_refused = true;
            return Err(wasmtime::Error::msg(format!(
                "the policy's memories and tables would need {total} bytes, over its cap of {} bytes",
                self.cap
            )));
        }
        self.used = total;
        self.last_grant = more;
        Ok(true)
    }

    fn take_back_last_grant(&mut self) {
        self.used = self.used.saturating_sub(self.last_grant);
        self.last_grant = 0;
    }
}

impl ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if maximum.is_some_and(|max| desired > max) {
            return Ok(false);
        }
        self.grant(desired.saturating_sub(current))
    }

    fn memory_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        self.take_back_last_grant();
        self.inner.memory_grow_failed(error)
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let allowed = self.inner.table_growing(current, desired, maximum);
        if !matches!(allowed, Ok(true)) {
            return allowed;
        }
        self.grant(
            desired
                .saturating_sub(current)
                .saturating_mul(TABLE_ELEMENT_BYTES),
        )
    }

    fn table_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        self.take_back_last_grant();
        self.inner.table_grow_failed(error)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter(mib: usize) -> Limiter {
        Limiter::new(&Limits {
            memory_bytes: mib << 20,
            ..Limits::default()
        })
    }

    #[test]
    fn memories_count_together_against_one_cap() {
        let mut limiter = limiter(64);
        for _ in 0..2 {
            assert!(limiter.memory_growing(0, 30 << 20, None).unwrap());
        }
        assert_eq!(limiter.used_bytes(), 60 << 20);
        assert!(limiter.memory_growing(0, 30 << 20, None).is_err());
        assert!(limiter.memory_refused);
    }

    #[test]
    fn tables_count_against_the_same_cap() {
        let mut limiter = limiter(1);
        assert!(limiter.memory_growing(0, 512 << 10, None).unwrap());
        let elements = (512 << 10) / TABLE_ELEMENT_BYTES;
        assert!(limiter.table_growing(0, elements / 2, None).unwrap());
        assert!(limiter.table_growing(0, elements, None).is_err());
        assert!(limiter.memory_refused);
    }

    #[test]
    fn a_failed_growth_is_not_counted() {
        let mut limiter = limiter(64);
        assert!(limiter.memory_growing(0, 40 << 20, None).unwrap());
        // The failure itself traps (trap on grow failure); what was counted is taken back.
        let _ = limiter.memory_grow_failed(wasmtime::Error::msg("mmap failed"));
        assert_eq!(limiter.used_bytes(), 0);
        assert!(limiter.memory_growing(0, 40 << 20, None).unwrap());
    }
}
