//! A call's limits inside its store: memory and table growth refused with an
//! error (a trap that ends the call `QuotaExceeded`, never a silent -1 to the
//! guest), the instance count, and the memory's peak for the report.

use palisade_protocol::plugin::PluginLimits;
use wasmtime::ResourceLimiter;

/// What ran out, in the words `CallOutcome::QuotaExceeded` carries.
#[derive(Debug, thiserror::Error)]
pub enum Quota {
    #[error("fuel: the budget of {0} ran out")]
    Fuel(u64),
    #[error("memory: growing to {desired} bytes exceeds the limit of {limit}")]
    Memory { desired: usize, limit: usize },
    #[error("table: growing to {desired} elements exceeds the limit of {limit}")]
    Table { desired: usize, limit: usize },
    #[error("instances: a call needs 1 and the limit is {0}")]
    Instances(u32),
    #[error("deadline: {0} ms passed")]
    Deadline(u64),
}

pub(crate) struct CallLimiter {
    max_memory: usize,
    max_table: usize,
    max_instances: usize,
    pub(crate) memory_peak: usize,
}

impl CallLimiter {
    /// `pool_memory`: the pool's slot size, which no call can exceed anyway.
    pub(crate) fn new(limits: &PluginLimits, pool_memory: u64) -> Self {
        let max_memory = limits.max_memory_bytes.min(pool_memory);
        CallLimiter {
            max_memory: usize::try_from(max_memory).unwrap_or(usize::MAX),
            max_table: limits.max_table_elements as usize,
            max_instances: limits.max_instances as usize,
            memory_peak: 0,
        }
    }
}

impl ResourceLimiter for CallLimiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.max_memory {
            return Err(wasmtime::Error::new(Quota::Memory { desired, limit: self.max_memory }));
        }
        self.memory_peak = self.memory_peak.max(desired);
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.max_table {
            return Err(wasmtime::Error::new(Quota::Table { desired, limit: self.max_table }));
        }
        Ok(true)
    }

    fn instances(&self) -> usize {
        self.max_instances
    }
}
