//! `file` and `stdout`: JSON lines, one per record, for inspection, demos and tests.
//!
//! **Delivery:** at least once. These sinks do not own positions: the runner
//! commits to Kafka after a batch is written, so after a crash the records
//! written but not yet committed are written again — exactly the uncommitted
//! tail. With `assignments = true` the file also records, for every assigned
//! partition, the offset consumption starts at (`{"assigned": {...}}` lines),
//! which makes that tail visible.
//!
//! A batch is written with one `write` call; with `fsync = true` the file is
//! also flushed to disk before the batch counts as applied (a SIGKILL does not
//! lose written data, a power cut does without it).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::json;

use super::json::record_json;
use crate::error::{ConfigError, SinkError};
use crate::sink::{Batch, Positions, Sink};

/// `[sink] kind = "file"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// `path`: the file to append to (created if missing).
    pub path: PathBuf,
    /// `fsync`: flush to disk after every batch (default false).
    #[serde(default)]
    pub fsync: bool,
    /// `rows`: include the `before`/`after` images (default true).
    #[serde(default = "yes")]
    pub rows: bool,
    /// `assignments`: write a line per assigned partition with its start offset (default false).
    #[serde(default)]
    pub assignments: bool,
}

/// `[sink] kind = "stdout"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StdoutConfig {
    /// `rows`: include the `before`/`after` images (default true).
    #[serde(default = "yes")]
    pub rows: bool,
}

fn yes() -> bool {
    true
}

impl FileConfig {
    /// Checks the values; errors name `sink.<key>`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.path.as_os_str().is_empty() {
            return Err(ConfigError::new("sink.path", "must not be empty"));
        }
        Ok(())
    }
}

#[async_trait]
impl super::SinkKind for FileConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        FileConfig::validate(self)
    }
    async fn build(&self) -> Result<Arc<dyn Sink>, SinkError> {
        Ok(Arc::new(FileSink::open(self)?))
    }
}

#[async_trait]
impl super::SinkKind for StdoutConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        Ok(())
    }
    async fn build(&self) -> Result<Arc<dyn Sink>, SinkError> {
        Ok(Arc::new(FileSink::stdout(self)))
    }
}

enum Output {
    File(File),
    Stdout,
}

/// The `file` / `stdout` sink (see the module docs).
pub struct FileSink {
    out: Arc<Mutex<Output>>,
    fsync: bool,
    rows: bool,
    assignments: bool,
    name: String,
}

impl FileSink {
    /// Opens (creates) the file for appending.
    /// A line torn by a crash is terminated first, so that it cannot swallow the next line.
    pub fn open(config: &FileConfig) -> Result<Self, SinkError> {
        let open_error = |e| SinkError::fatal_from(format!("open {}", config.path.display()), e);
        let mut file = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(&config.path)
            .map_err(open_error)?;
        if ends_without_newline(&mut file).map_err(open_error)? {
            file.write_all(b"\n").map_err(open_error)?;
        }
        Ok(Self {
            out: Arc::new(Mutex::new(Output::File(file))),
            fsync: config.fsync,
            rows: config.rows,
            assignments: config.assignments,
            name: "file".into(),
        })
    }

    /// Writes to standard output.
    pub fn stdout(config: &StdoutConfig) -> Self {
        Self {
            out: Arc::new(Mutex::new(Output::Stdout)),
            fsync: false,
            rows: config.rows,
            assignments: false,
            name: "stdout".into(),
        }
    }

    async fn write(&self, buf: Vec<u8>) -> Result<(), SinkError> {
        let out = self.out.clone();
        let fsync = self.fsync;
        let written = tokio::task::spawn_blocking(move || {
            let mut out = out.lock().unwrap_or_else(PoisonError::into_inner);
            match &mut *out {
                Output::File(f) => {
                    f.write_all(&buf)?;
                    if fsync {
                        f.sync_data()?;
                    }
                    Ok(())
                }
                Output::Stdout => {
                    let mut s = std::io::stdout().lock();
                    s.write_all(&buf)?;
                    s.flush()
                }
            }
        })
        .await
        .map_err(|e| SinkError::fatal_from("writer task", e))?;
        // Disk full, I/O errors: transient unless proven otherwise.
        written.map_err(|e| SinkError::retriable_from("write", e))
    }
}

fn ends_without_newline(file: &mut File) -> std::io::Result<bool> {
    use std::io::{Read, Seek, SeekFrom};
    if file.metadata()?.len() == 0 {
        return Ok(false);
    }
    file.seek(SeekFrom::End(-1))?;
    let mut last = [0u8; 1];
    file.read_exact(&mut last)?;
    Ok(last[0] != b'\n')
}

#[async_trait]
impl Sink for FileSink {
    fn name(&self) -> &str {
        &self.name
    }

    async fn assigned(&self, starts: &Positions) -> Result<(), SinkError> {
        if !self.assignments {
            return Ok(());
        }
        let mut buf = Vec::new();
        for (tp, start) in starts {
            let line =
                json!({"assigned": {"topic": tp.topic, "partition": tp.partition, "start": start}});
            buf.extend_from_slice(line.to_string().as_bytes());
            buf.push(b'\n');
        }
        self.write(buf).await
    }

    async fn apply(&self, batch: &Batch) -> Result<(), SinkError> {
        if batch.is_empty() {
            return Ok(());
        }
        let mut buf = Vec::with_capacity(batch.len() * 128);
        for r in batch.records() {
            buf.extend_from_slice(record_json(batch, r, self.rows).to_string().as_bytes());
            buf.push(b'\n');
        }
        self.write(buf).await
    }
}
