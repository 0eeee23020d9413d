//! `elasticsearch`: one index per captured table, equal to the source table,
//! with replays and duplicates harmless.
//!
//! * **Documents.** Index from `index.pattern` (default `{topic}`), `_id` = the
//!   primary key (see [`plan::document_id`]), `_source` = the row (`after`).
//! * **Versions.** Every document carries its exact event version. A write
//!   goes out as a bulk action with `version_type = external` at its
//!   version's clock ([`version`]); one Elasticsearch refuses (409) reads the
//!   stored version ([`merge`]), is dropped if not newer, else goes out just
//!   above the stored number — and is read again if the document changed
//!   meanwhile, at most [`MAX_ROUNDS`] rounds a batch.
//! * **Positions** are not owned: the runner commits offsets to Kafka after
//!   `apply` returned `Ok`, i.e. after every item of the batch is settled
//!   (applied, or stale). A crash replays the uncommitted tail; the versions
//!   make that harmless.
//! * **Deletes** are versioned deletes. Elasticsearch keeps the tombstone's
//!   version for `index.gc_deletes` only (default 60 s): replaying an older
//!   insert of a deleted row from further back than that resurrects it.
//!   `delete.mode = "soft"` keeps the document with `soft.delete.field = true`
//!   instead (and `false` on live documents), safe to replay from any point.
//! * **Unchanged TOAST** values keep the stored field (see [`merge`]).
//! * **Values and mapping.** Documents carry native values (`value.format =
//!   "native"`: dates as ISO-8601 text, JSON as JSON, see [`values`]) and
//!   the sink creates each index before its first write with a mapping
//!   derived from the columns' Connect schemas (dates `date`, decimals
//!   `double` + exact `keyword`, floating point `double`/`float`, values a
//!   field cannot index kept in `_source`; see [`mapping`]); an index
//!   template with mappings wins, and an index keeps the form it was made in.
//! * **Failures** ([`error`]): a record the cluster refuses (mapping conflict,
//!   bad index name) is rejected to the dead-letter topic and the rest of the
//!   batch applied again (harmlessly); 429/5xx/no response retry the batch
//!   with backoff; bad credentials or a refused request stop the runner.
//! * **Truncates** delete (or, soft, flag) the documents older than the
//!   truncate by a query on `version.field`, which every document carries
//!   (see [`truncate`]).
//! * **Dates out of Elasticsearch's range** ([`mapping`]): an index the
//!   sink creates maps every field dynamic date detection types as `date`
//!   with `ignore_malformed`, so a `timestamptz` of 44 BC or 294276 AD, or
//!   `infinity`, is kept exactly in `_source` (unindexed) instead of
//!   refusing the document.
//! * **Memory:** one bulk request (`bulk.max.actions` / `bulk.max.bytes`) is
//!   encoded at a time, beside the batch the runner bounds.

pub mod bulk;
pub mod config;
pub mod error;
pub mod generation;
pub mod mapping;
pub mod merge;
pub mod plan;
pub mod tombstones;
pub mod truncate;
pub mod values;
pub mod verify_reader;
pub mod version;

use std::collections::HashSet;

use ::elasticsearch::auth::Credentials;
use ::elasticsearch::cert::{Certificate, CertificateValidation};
use ::elasticsearch::cluster::ClusterHealthParts;
use ::elasticsearch::http::transport::{SingleNodeConnectionPool, TransportBuilder};
use ::elasticsearch::http::Url;
use ::elasticsearch::indices::IndicesPutIndexTemplateParts;
use ::elasticsearch::Elasticsearch;
use async_trait::async_trait;
use oncely_core::redact_url;

use self::bulk::{encode, Chunk, ItemMeta, VersionFields};
use self::error::{Class, EsError, OpKind};
use self::merge::ReadSpec;
use self::plan::{event_index, plan_with, Action, Write};
use self::version::next_external;
use crate::error::{RecordFailure, SinkError};
use crate::naming::TargetClaims;
use crate::sink::{Batch, Sink};
pub use config::{DeleteMode, ElasticsearchConfig, JsonMode};

#[async_trait]
impl super::SinkKind for ElasticsearchConfig {
    fn validate(&self) -> Result<(), crate::error::ConfigError> {
        ElasticsearchConfig::validate(self)
    }
    fn field_selection(
        &self,
    ) -> Result<Option<crate::fields::FieldSelection>, crate::error::ConfigError> {
        crate::fields::FieldSelection::parse(&self.fields_include, &self.fields_exclude)
    }
    async fn build(&self) -> Result<std::sync::Arc<dyn Sink>, SinkError> {
        Ok(std::sync::Arc::new(ElasticsearchSink::connect(self).await?))
    }
    async fn verify_reader(
        &self,
        ctx: &crate::verify_reader::VerifyContext<'_>,
    ) -> Option<
        Result<Box<dyn crate::verify_reader::VerifyReader>, crate::verify_reader::VerifyReadError>,
    > {
        let reader = verify_reader::ElasticsearchVerifyReader::connect(self, ctx).await;
        Some(reader.map(|m| Box::new(m) as Box<dyn crate::verify_reader::VerifyReader>))
    }
}

/// Why a write is read again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refused {
    /// Not refused, or refused over a stored document.
    No,
    /// Refused while the document read absent: a tombstone at or above its clock.
    Absent,
    /// Refused again just above a tombstone this process remembers: a newer
    /// delete replaced it.
    AboveTombstone,
}

/// Read-decide-write rounds of one batch before it is retried as a whole
/// (each round after the first serves writes whose document another writer
/// changed between the read and the write).
pub const MAX_ROUNDS: usize = 8;

/// The `elasticsearch` sink (see the module docs).
pub struct ElasticsearchSink {
    client: Elasticsearch,
    config: ElasticsearchConfig,
    /// Which table each index belongs to (lower-casing can merge two).
    claims: TargetClaims,
    /// The indexes seen, and whether the sink created them (see [`mapping`]).
    mappings: mapping::Mappings,
    /// The deletes applied lately (see [`tombstones`]).
    tombstones: tombstones::Tombstones,
}

impl ElasticsearchSink {
    /// Builds the client, checks the cluster answers, installs `template.file` if set.
    pub async fn connect(config: &ElasticsearchConfig) -> Result<Self, SinkError> {
        let client = client(config)?;
        let sink = Self {
            client,
            config: config.clone(),
            claims: TargetClaims::new("index", "sink.index.pattern"),
            mappings: mapping::Mappings::new(config),
            tombstones: tombstones::Tombstones::default(),
        };
        sink.check_cluster().await?;
        sink.install_template().await?;
        Ok(sink)
    }

    /// Refuses a batch whose table's index another table writes to.
    fn claim_indexes(&self, batch: &Batch) -> Result<(), SinkError> {
        for (event, schema, table) in batch.table_runs() {
            // A name Elasticsearch refuses is the record's failure (in the plan).
            if let Ok(index) = event_index(&self.config.index_pattern, batch.topic(), event) {
                self.claims.claim(&index, schema, table)?;
            }
        }
        Ok(())
    }

    /// The client, e.g. for tests and benchmarks against the same cluster.
    pub fn client(&self) -> &Elasticsearch {
        &self.client
    }

    async fn check_cluster(&self) -> Result<(), SinkError> {
        let response = self
            .client
            .cluster()
            .health(ClusterHealthParts::None)
            .send()
            .await
            .map_err(|e| {
                SinkError::fatal_from(format!("cannot reach {}", redact_url(&self.config.url)), e)
            })?;
        let status = response.status_code().as_u16();
        if (200..300).contains(&status) {
            return Ok(());
        }
        let body = response.bytes().await.unwrap_or_default();
        Err(SinkError::fatal_from(
            format!("{} refused the health check", redact_url(&self.config.url)),
            bulk::status_error("cluster health", status, &body),
        ))
    }

    async fn install_template(&self) -> Result<(), SinkError> {
        let Some(path) = &self.config.template_file else {
            return Ok(());
        };
        let text = std::fs::read_to_string(path).map_err(|e| {
            SinkError::fatal_from(format!("sink.template.file {}", path.display()), e)
        })?;
        let body: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
            SinkError::fatal_from(
                format!("sink.template.file {}: not JSON", path.display()),
                e,
            )
        })?;
        let name = self.config.template_name.as_str();
        let response = self
            .client
            .indices()
            .put_index_template(IndicesPutIndexTemplateParts::Name(name))
            .body(body)
            .send()
            .await
            .map_err(|e| SinkError::fatal_from("install index template", e))?;
        let status = response.status_code().as_u16();
        if (200..300).contains(&status) {
            tracing::info!(template = name, "index template installed");
            return Ok(());
        }
        let body = response.bytes().await.unwrap_or_default();
        Err(SinkError::fatal_from(
            format!("index template `{name}` from {} refused", path.display()),
            bulk::status_error("put index template", status, &body),
        ))
    }

    fn read_spec(&self) -> ReadSpec<'_> {
        ReadSpec {
            fields: self.version_fields(),
            legacy_field: &self.config.version_field,
            seq_bits: self.config.seq_bits,
            per_request: self.config.bulk_max_actions,
        }
    }

    fn version_fields(&self) -> VersionFields<'_> {
        VersionFields {
            lsn: &self.config.version_lsn_field,
            seq: &self.config.version_seq_field,
        }
    }

    /// Applies the writes: rounds of read, decide, write (see the module
    /// docs); returns the records the cluster refuses, or the first
    /// retriable/fatal error.
    async fn write_all(
        &self,
        mut pending: Vec<Write<'_>>,
    ) -> Result<Vec<RecordFailure>, SinkError> {
        let mut rejected = Vec::new();
        let mut refused = vec![Refused::No; pending.len()];
        for round in 0..MAX_ROUNDS {
            if pending.is_empty() {
                return Ok(rejected);
            }
            // The first round reads only for writes that need the stored
            // source; the others go out at their clock, as over an absent
            // document (see `merge`).
            let reads_it = |w: &Write<'_>| round > 0 || w.needs_stored();
            let reads: Vec<&Write<'_>> = pending.iter().filter(|w| reads_it(w)).collect();
            let mut stored = if reads.is_empty() {
                Vec::new()
            } else {
                merge::read(&self.client, &reads, self.read_spec()).await?
            }
            .into_iter();
            let mut ready = Vec::with_capacity(pending.len());
            let mut how = vec![Refused::No; pending.len()];
            for (slot, w) in pending.iter().enumerate() {
                let s = if reads_it(w) {
                    stored.next().flatten()
                } else {
                    None
                };
                let (external, source) = match s {
                    // Not newer than the stored document: stale.
                    Some(s) if !crate::event::replaces(w.version, s.version) => continue,
                    Some(s) => (Some(s.external), s.source),
                    None => match refused[slot] {
                        Refused::No => {
                            how[slot] = Refused::Absent;
                            (None, None)
                        }
                        // A tombstone at or above the event's clock: a
                        // delete this process remembers decides (see
                        // `tombstones`); else the event is taken for older
                        // than the delete and dropped.
                        Refused::Absent => match self.tombstones.get(&w.index, &w.id) {
                            Some((deleted, tombstone))
                                if crate::event::replaces(w.version, deleted) =>
                            {
                                how[slot] = Refused::AboveTombstone;
                                (Some(tombstone), None)
                            }
                            _ => continue,
                        },
                        Refused::AboveTombstone => continue,
                    },
                };
                let Some(external) = next_external(external, w.version, self.config.seq_bits)
                else {
                    rejected.push(RecordFailure::new(
                        w.offset,
                        format!(
                            "{}/{}: the stored external version is the largest Elasticsearch \
                             takes (written by the old packing at its last LSN); reindex",
                            w.index, w.id
                        ),
                    ));
                    continue;
                };
                let mut w = w.clone();
                merge::resolve(&mut w, source, &self.config.soft_delete_field);
                ready.push((slot, w, external));
            }
            let conflicts = self.send_all(&ready, &mut rejected).await?;
            let failed: HashSet<i64> = rejected.iter().map(|f| f.offset).collect();
            for (slot, w, external) in &ready {
                if w.action == Action::Delete
                    && !conflicts.contains(slot)
                    && !failed.contains(&w.offset)
                {
                    self.tombstones
                        .record(&w.index, &w.id, w.version, *external);
                }
            }
            let mut next = Vec::with_capacity(conflicts.len());
            let mut next_refused = Vec::with_capacity(conflicts.len());
            for slot in conflicts {
                next_refused.push(how[slot]);
                next.push(pending[slot].clone());
            }
            pending = next;
            refused = next_refused;
        }
        if pending.is_empty() {
            return Ok(rejected);
        }
        Err(SinkError::retriable(format!(
            "elasticsearch: {} documents changed between every read and write of {MAX_ROUNDS} \
             rounds (another writer of the same documents?); the batch is retried",
            pending.len()
        )))
    }

    /// Sends `ready` in bulk requests bounded by count and bytes; the slots
    /// refused for their external version.
    async fn send_all(
        &self,
        ready: &[(usize, Write<'_>, i64)],
        rejected: &mut Vec<RecordFailure>,
    ) -> Result<Vec<usize>, SinkError> {
        let (max_actions, max_bytes) = (self.config.bulk_max_actions, self.config.bulk_max_bytes);
        let mut conflicts = Vec::new();
        let mut chunk = Chunk::default();
        for (slot, w, external) in ready {
            let (op, doc) = match &w.action {
                Action::Index { doc, .. } => (OpKind::Index, Some(doc.as_ref())),
                Action::Delete => (OpKind::Delete, None),
                // Resolved into an index by `merge::resolve`.
                Action::SoftDelete { fallback } => (OpKind::Index, Some(fallback.as_ref())),
            };
            let meta = ItemMeta {
                index: w.index.clone(),
                id: w.id.clone(),
                op,
                offset: w.offset,
                slot: *slot,
            };
            let encoded = match encode(meta, *external, w.version, doc, self.version_fields()) {
                Ok(e) => e,
                Err(e) => {
                    rejected.push(RecordFailure::new(w.offset, format!("not JSON: {e}")));
                    continue;
                }
            };
            if !chunk.fits(encoded.len(), max_actions, max_bytes) {
                let full = std::mem::take(&mut chunk);
                conflicts.extend(self.send(full, rejected).await?);
            }
            chunk.push(encoded);
        }
        if !chunk.is_empty() {
            conflicts.extend(self.send(chunk, rejected).await?);
        }
        Ok(conflicts)
    }

    async fn send(
        &self,
        chunk: Chunk,
        rejected: &mut Vec<RecordFailure>,
    ) -> Result<Vec<usize>, SinkError> {
        let sent = bulk::send(&self.client, chunk, self.config.refresh).await?;
        let mut worst: Option<EsError> = None;
        for (meta, e) in sent.failures {
            match e.class() {
                Class::Record => rejected.push(RecordFailure::new(meta.offset, e.to_string())),
                Class::Fatal => return Err(e.into()),
                Class::Retriable if worst.is_none() => worst = Some(e),
                Class::Retriable | Class::Settled => {}
            }
        }
        match worst {
            Some(e) => Err(e.into()),
            None => Ok(sent.conflicts.into_iter().map(|m| m.slot).collect()),
        }
    }
}

#[async_trait]
impl Sink for ElasticsearchSink {
    fn name(&self) -> &str {
        "elasticsearch"
    }

    async fn apply(&self, batch: &Batch) -> Result<(), SinkError> {
        self.claim_indexes(batch)?;
        self.mappings
            .prepare(&self.client, batch, &self.config.index_pattern)
            .await?;
        let plan = plan_with(batch, &self.config, &|index| self.mappings.format(index));
        if !plan.rejected.is_empty() {
            // Before any write: the runner dead-letters them and hands the rest back.
            return Err(SinkError::Rejected(plan.rejected));
        }
        let mut rejected = self.write_all(plan.writes).await?;
        if !rejected.is_empty() {
            // The runner hands the rest back, truncates included.
            return Err(SinkError::Rejected(rejected));
        }
        for t in &plan.truncates {
            let outcome = truncate::apply(
                &self.client,
                &self.config,
                self.read_spec(),
                &self.tombstones,
                t,
            )
            .await?;
            match outcome {
                truncate::Outcome::Refused(reason) => {
                    rejected.push(RecordFailure::new(t.offset, reason));
                }
                outcome => tracing::info!(
                    partition = %batch.topic_partition(),
                    offset = t.offset,
                    index = %t.index,
                    ?outcome,
                    "elasticsearch truncate applied"
                ),
            }
        }
        if rejected.is_empty() {
            Ok(())
        } else {
            Err(SinkError::Rejected(rejected))
        }
    }
}

/// The client for `config`: URL, credentials, TLS, timeout.
fn client(config: &ElasticsearchConfig) -> Result<Elasticsearch, SinkError> {
    let url = Url::parse(config.url.trim())
        .map_err(|e| SinkError::fatal_from(format!("sink.url {:?}", redact_url(&config.url)), e))?;
    let mut builder = TransportBuilder::new(SingleNodeConnectionPool::new(url))
        .timeout(config.request_timeout())
        .disable_proxy();
    if let Some(key) = &config.api_key {
        builder = builder.auth(Credentials::EncodedApiKey(key.expose().to_owned()));
    } else if let (Some(user), Some(password)) = (&config.username, &config.password) {
        builder = builder.auth(Credentials::Basic(
            user.clone(),
            password.expose().to_owned(),
        ));
    }
    if !config.tls_verify {
        builder = builder.cert_validation(CertificateValidation::None);
    } else if let Some(path) = &config.tls_ca_file {
        let pem = std::fs::read(path).map_err(|e| {
            SinkError::fatal_from(format!("sink.tls.ca.file {}", path.display()), e)
        })?;
        let cert = Certificate::from_pem(&pem).map_err(|e| {
            SinkError::fatal_from(format!("sink.tls.ca.file {}: not PEM", path.display()), e)
        })?;
        builder = builder.cert_validation(CertificateValidation::Full(cert));
    }
    let transport = builder
        .build()
        .map_err(|e| SinkError::fatal_from("elasticsearch client", e))?;
    Ok(Elasticsearch::new(transport))
}
