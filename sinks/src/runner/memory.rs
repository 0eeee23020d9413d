//! A sink kept in memory, for the runner's unit tests: it records every batch
//! it is given and can be told to fail transiently or to reject records, so
//! the worker's ordering, retries, dead-lettering and progress are tested
//! without Kafka or a target.

use std::collections::BTreeSet;
use std::sync::Mutex;

use async_trait::async_trait;

use crate::error::{RecordFailure, SinkError};
use crate::sink::{Batch, Sink};

/// Records each `apply` call's offsets, in call order.
#[derive(Default)]
pub(crate) struct MemorySink {
    calls: Mutex<Vec<Vec<i64>>>,
    /// Offsets of the calls that succeeded.
    applied: Mutex<Vec<i64>>,
    /// How many more `apply` calls fail with a retriable error (after recording).
    transient_failures: Mutex<u32>,
    /// Offsets refused as records that can never be applied.
    rejected: Mutex<BTreeSet<i64>>,
}

impl MemorySink {
    /// The next `n` applies fail with a retriable error.
    pub(crate) fn fail_next(&self, n: u32) {
        *self.transient_failures.lock().expect("lock") = n;
    }

    /// Every batch holding `offset` is rejected naming that record.
    pub(crate) fn reject(&self, offset: i64) {
        self.rejected.lock().expect("lock").insert(offset);
    }

    /// The offsets of each `apply` call, in order.
    pub(crate) fn calls(&self) -> Vec<Vec<i64>> {
        self.calls.lock().expect("lock").clone()
    }

    /// The offsets of the calls that succeeded, in order: what the target holds.
    pub(crate) fn applied(&self) -> Vec<i64> {
        self.applied.lock().expect("lock").clone()
    }
}

#[async_trait]
impl Sink for MemorySink {
    fn name(&self) -> &str {
        "memory"
    }

    async fn apply(&self, batch: &Batch) -> Result<(), SinkError> {
        let offsets: Vec<i64> = batch.records().iter().map(|r| r.offset).collect();
        self.calls.lock().expect("lock").push(offsets.clone());
        let failures: Vec<RecordFailure> = {
            let rejected = self.rejected.lock().expect("lock");
            offsets
                .iter()
                .filter(|o| rejected.contains(o))
                .map(|&o| RecordFailure::new(o, format!("offset {o} is refused by the test")))
                .collect()
        };
        if !failures.is_empty() {
            return Err(SinkError::Rejected(failures));
        }
        let mut fail = self.transient_failures.lock().expect("lock");
        if *fail > 0 {
            *fail -= 1;
            return Err(SinkError::retriable("the target is briefly away"));
        }
        self.applied.lock().expect("lock").extend(offsets);
        Ok(())
    }
}
