//! `journal`: a file sink that owns its positions, for crash tests and as the
//! smallest example of the pattern the transactional sinks follow.
//!
//! Every batch becomes **one line** holding the batch's records *and* its
//! position (`group`, `topic`, `partition`, `next`), appended with a single
//! `write` and, by default, `fsync`ed before `apply` returns. A line is either
//! complete — records applied and position stored together — or torn by a
//! crash mid-write, in which case readers ignore it entirely (a torn line
//! cannot be valid JSON, and every line is written after a newline so that it
//! never extends a torn one). [`Sink::load_positions`] reads the file again on
//! every assignment, so several runner processes may share one journal.
//!
//! **Delivery:** exactly once per record, as long as the journal file is kept.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{json, Value};

use super::json::record_json;
use crate::error::{ConfigError, SinkError};
use crate::sink::{Batch, Positions, Sink, TopicPartition};

/// `[sink] kind = "journal"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JournalConfig {
    /// `path`: the journal file (created if missing).
    pub path: PathBuf,
    /// `fsync`: flush every batch to disk before acknowledging it (default true).
    #[serde(default = "yes")]
    pub fsync: bool,
}

fn yes() -> bool {
    true
}

impl JournalConfig {
    /// Checks the values; errors name `sink.<key>`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.path.as_os_str().is_empty() {
            return Err(ConfigError::new("sink.path", "must not be empty"));
        }
        Ok(())
    }
}

#[async_trait]
impl super::SinkKind for JournalConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        JournalConfig::validate(self)
    }
    async fn build(&self) -> Result<Arc<dyn Sink>, SinkError> {
        Ok(Arc::new(JournalSink::open(self)?))
    }
}

/// One complete journal line.
#[derive(Debug, Clone, Deserialize)]
pub struct JournalEntry {
    /// Consumer group.
    pub group: String,
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Stored position: the next offset to read.
    pub next: i64,
    /// The batch's records, as the `file` sink writes them (without row images).
    pub records: Vec<Value>,
}

/// Reads every complete entry of a journal, skipping torn lines.
pub fn read_journal(path: &Path) -> std::io::Result<Vec<JournalEntry>> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for line in BufReader::new(file).split(b'\n') {
        let line = line?;
        if let Ok(entry) = serde_json::from_slice::<JournalEntry>(&line) {
            out.push(entry);
        }
    }
    Ok(out)
}

/// The `journal` sink (see the module docs).
pub struct JournalSink {
    file: Arc<Mutex<File>>,
    path: PathBuf,
    fsync: bool,
}

impl JournalSink {
    /// Opens (creates) the journal for appending.
    pub fn open(config: &JournalConfig) -> Result<Self, SinkError> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&config.path)
            .map_err(|e| SinkError::fatal_from(format!("open {}", config.path.display()), e))?;
        Ok(Self {
            file: Arc::new(Mutex::new(file)),
            path: config.path.clone(),
            fsync: config.fsync,
        })
    }
}

#[async_trait]
impl Sink for JournalSink {
    fn name(&self) -> &str {
        "journal"
    }

    fn owns_positions(&self) -> bool {
        true
    }

    async fn load_positions(
        &self,
        group: &str,
        partitions: &[TopicPartition],
    ) -> Result<Positions, SinkError> {
        let path = self.path.clone();
        let entries = tokio::task::spawn_blocking(move || read_journal(&path))
            .await
            .map_err(|e| SinkError::fatal_from("reader task", e))?
            .map_err(|e| SinkError::retriable_from("read journal", e))?;
        let mut last: HashMap<TopicPartition, i64> = HashMap::new();
        for e in entries.into_iter().filter(|e| e.group == group) {
            last.insert(TopicPartition::new(e.topic, e.partition), e.next);
        }
        Ok(partitions
            .iter()
            .filter_map(|tp| last.get(tp).map(|n| (tp.clone(), *n)))
            .collect())
    }

    async fn apply(&self, batch: &Batch) -> Result<(), SinkError> {
        let records: Vec<Value> = batch
            .records()
            .iter()
            .map(|r| record_json(batch, r, false))
            .collect();
        let entry = json!({
            "group": batch.group(),
            "topic": batch.topic(),
            "partition": batch.partition(),
            "next": batch.next_offset(),
            "records": records,
        });
        let mut line = Vec::with_capacity(records.len() * 96 + 128);
        line.push(b'\n');
        line.extend_from_slice(entry.to_string().as_bytes());
        line.push(b'\n');
        let (file, fsync) = (self.file.clone(), self.fsync);
        tokio::task::spawn_blocking(move || {
            let mut f = file.lock().unwrap_or_else(PoisonError::into_inner);
            f.write_all(&line)?;
            if fsync {
                f.sync_data()?;
            }
            Ok::<(), std::io::Error>(())
        })
        .await
        .map_err(|e| SinkError::fatal_from("writer task", e))?
        .map_err(|e| SinkError::retriable_from("append to journal", e))
    }
}
