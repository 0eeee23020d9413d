//! The script calls of the `redis` sink: arguments of the changes and
//! truncate scripts, and how a batch is split into calls.

use super::config::Layout;
use super::plan::{json_text, Body, Change};
use super::script::pack_str;

/// What the sink's script calls are made of: the loaded scripts' SHAs and the
/// settings every call passes.
pub(super) struct Calls {
    pub(super) sha: String,
    pub(super) truncate_sha: String,
    pub(super) layout: Layout,
    pub(super) version_prefix: String,
    pub(super) version_field: String,
    pub(super) ttl_ms: u64,
    pub(super) tombstone_ttl_ms: u64,
    pub(super) max_changes: usize,
    pub(super) max_bytes: usize,
}

impl Calls {
    /// The key holding a row's tombstone after a delete (and, in the JSON
    /// layout, the version of a live row too).
    pub(super) fn version_key(&self, row_key: &str) -> String {
        format!("{}{row_key}", self.version_prefix)
    }

    /// The `EVALSHA` applying `chunk` (no truncates), storing `position` when
    /// given (the arguments are described in the script module).
    pub(super) fn script_cmd(
        &self,
        positions_key: &str,
        chunk: &[Change],
        position: Option<(&str, i64)>,
    ) -> redis::Cmd {
        // The key sets of the chunk's tables, each once (usually one).
        let mut sets: Vec<&str> = Vec::new();
        let set_of: Vec<usize> = chunk
            .iter()
            .map(|c| match sets.iter().position(|s| *s == c.key_set) {
                Some(i) => i + 1,
                None => {
                    sets.push(&c.key_set);
                    sets.len()
                }
            })
            .collect();
        let mut cmd = redis::cmd("EVALSHA");
        let keys_per_change = match self.layout {
            Layout::Hash => 1,
            Layout::Json => 2,
        };
        cmd.arg(&self.sha)
            .arg(1 + sets.len() + keys_per_change * chunk.len())
            .arg(positions_key);
        for set in &sets {
            cmd.arg(*set);
        }
        for c in chunk {
            cmd.arg(&c.row_key);
            if self.layout == Layout::Json {
                cmd.arg(self.version_key(&c.row_key));
            }
        }
        match position {
            Some((field, next)) => cmd.arg(field).arg(next),
            None => cmd.arg("").arg(""),
        };
        cmd.arg(self.ttl_ms).arg(self.tombstone_ttl_ms);
        if self.layout == Layout::Hash {
            cmd.arg(&self.version_field).arg(&self.version_prefix);
        }
        cmd.arg(sets.len());
        let mut packed = Vec::new();
        for (c, set) in chunk.iter().zip(set_of) {
            match &c.body {
                Body::Delete | Body::Truncate => {
                    cmd.arg("D").arg(&c.version[..]).arg(set);
                }
                Body::Json { row, unavailable } => {
                    cmd.arg("J")
                        .arg(&c.version[..])
                        .arg(set)
                        .arg(json_text(row, unavailable));
                }
                Body::Hash(row) => {
                    let op = if row.keep.is_empty() { "H" } else { "K" };
                    cmd.arg(op).arg(&c.version[..]).arg(set);
                    packed.clear();
                    for (f, v) in row.fields() {
                        pack_str(&mut packed, f);
                        pack_str(&mut packed, v);
                    }
                    cmd.arg(&packed[..]);
                    if !row.keep.is_empty() {
                        packed.clear();
                        for f in &row.keep {
                            pack_str(&mut packed, f.as_bytes());
                        }
                        cmd.arg(&packed[..]);
                    }
                }
            }
        }
        cmd
    }

    /// One call of the truncate script: the next part of `truncate`'s key set
    /// from `cursor` (see the script module).
    pub(super) fn truncate_cmd(
        &self,
        positions_key: &str,
        truncate: &Change,
        cursor: &str,
        position: Option<(&str, i64)>,
    ) -> redis::Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&self.truncate_sha)
            .arg(2)
            .arg(positions_key)
            .arg(&truncate.key_set);
        match position {
            Some((field, next)) => cmd.arg(field).arg(next),
            None => cmd.arg("").arg(""),
        };
        cmd.arg(&truncate.version[..])
            .arg(cursor)
            .arg(self.max_changes)
            .arg(match self.layout {
                Layout::Hash => "H",
                Layout::Json => "J",
            })
            .arg(&self.version_field)
            .arg(&self.version_prefix);
        cmd
    }

    /// Splits changes into calls bounded by `script.max.changes` and
    /// `script.max.bytes`, each truncate a part of its own, in order (a
    /// truncate must follow the older changes of its partition). At least one
    /// part, so the position is always stored.
    pub(super) fn parts<'a>(&self, changes: &'a [Change]) -> Vec<Part<'a>> {
        let mut out = Vec::new();
        let (mut start, mut bytes) = (0, 0);
        for (i, c) in changes.iter().enumerate() {
            if c.body == Body::Truncate {
                if i > start {
                    out.push(Part::Changes(&changes[start..i]));
                }
                out.push(Part::Truncate(c));
                (start, bytes) = (i + 1, 0);
                continue;
            }
            let w = c.weight(self.version_prefix.len());
            if i > start && (i - start >= self.max_changes || bytes + w > self.max_bytes) {
                out.push(Part::Changes(&changes[start..i]));
                start = i;
                bytes = 0;
            }
            bytes += w;
        }
        if start < changes.len() || out.is_empty() {
            out.push(Part::Changes(&changes[start..]));
        }
        out
    }
}

/// A part of a batch: one call of the changes script, or one truncate.
pub(super) enum Part<'a> {
    Changes(&'a [Change]),
    Truncate(&'a Change),
}
