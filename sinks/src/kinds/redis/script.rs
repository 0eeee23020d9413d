//! The one Lua script that applies a chunk of changes and stores the position.
//!
//! Redis runs a script atomically: no other command runs in between, and the
//! writes of a script reach the append-only file (and replicas) as one unit,
//! so after any crash of the sink *or* of Redis, either the whole call — rows,
//! versions and position — is there, or none of it is.
//!
//! A script that raises an error half-way is **not** rolled back; so the
//! position is written last, only when every change went through, and every
//! row write is guarded by its version: a failed call is safe to repeat.
//!
//! # Arguments
//!
//! `KEYS[1]` is the positions hash; then two keys per change: the row key and
//! the version key. `ARGV` is a header — position field, next offset (`""` =
//! do not store a position), row TTL ms, tombstone TTL ms — then per change:
//!
//! | op | arguments |
//! | --- | --- |
//! | `H` hash row | version, n, n × (field, value), m, m × null field |
//! | `J` JSON row | version, JSON text |
//! | `D` delete | version |
//!
//! `H` sets the given fields and removes the null ones, keeping every other
//! field: unchanged TOAST columns are simply not mentioned, and a column
//! dropped from the table stays in the hash until the row is deleted (one
//! `HSET`, no read-modify-write). A change is applied only if its version is
//! greater than the stored one: one `SET version-key ours GET` reads the
//! stored version and writes ours in a single command (Redis ≥ 6.2), and the
//! rare stale change puts the stored version back. Versions are 40 ASCII digits (zero-padded
//! commit LSN and event ordinal), so Lua's string `<` orders them exactly in
//! any locale, without Lua's 53-bit numbers.
//!
//! # Reply
//!
//! `{0, applied, skipped}`; or `{1, i, ...}`: the 1-based changes whose row key
//! holds another Redis type (`WRONGTYPE`), in which case no position was
//! stored. Any other error of a Redis command aborts the call with that error.

use crate::event::Version;

/// The Lua source. Loaded once per connection (SCRIPT LOAD) and called by SHA.
pub const APPLY_SCRIPT: &str = r#"
local ttl = tonumber(ARGV[3])
local tomb_ttl = tonumber(ARGV[4])
local applied, skipped = 0, 0
local wrongtype = {}
local a, k, i = 5, 2, 0

-- Runs a write; true when it worked, false on WRONGTYPE; other errors abort the call.
local function write(...)
  local r = redis.pcall(...)
  if type(r) == 'table' and r.err then
    if string.sub(r.err, 1, 9) == 'WRONGTYPE' then return false end
    error(r)
  end
  return true
end

local function expire(key, ms)
  if ms > 0 then redis.call('PEXPIRE', key, ms) end
end

-- Puts back a version that ours did not supersede. A version whose row is
-- gone is a tombstone and gets the tombstone expiry again (restarted, so a
-- stale replay can only lengthen its life).
local function restore(vkey, prev, row)
  if not prev then
    redis.call('DEL', vkey)
  elseif tomb_ttl > 0 and redis.call('EXISTS', row) == 0 then
    redis.call('SET', vkey, prev, 'PX', tomb_ttl)
  elseif ttl > 0 then
    redis.call('SET', vkey, prev, 'PX', ttl)
  else
    redis.call('SET', vkey, prev)
  end
end

while a <= #ARGV do
  i = i + 1
  local op, ver = ARGV[a], ARGV[a + 1]
  local row, vkey = KEYS[k], KEYS[k + 1]
  k = k + 2
  local first, last, nulls_from, nulls_to
  if op == 'H' then
    local n = tonumber(ARGV[a + 2])
    first, last = a + 3, a + 2 + 2 * n
    local m = tonumber(ARGV[last + 1])
    nulls_from, nulls_to = last + 2, last + 1 + m
    a = nulls_to + 1
  elseif op == 'J' then
    a = a + 3
  else
    a = a + 2
  end
  -- One write both reads the stored version and stores ours (SET .. GET);
  -- when ours is not newer, the stored one is put back.
  local prev
  local px = ttl
  if op == 'D' then px = tomb_ttl end
  if px > 0 then
    prev = redis.call('SET', vkey, ver, 'PX', px, 'GET')
  else
    prev = redis.call('SET', vkey, ver, 'GET')
  end
  if prev and prev >= ver then
    restore(vkey, prev, row)
    skipped = skipped + 1
  else
    local ok = true
    if op == 'D' then
      redis.call('DEL', row)
    elseif op == 'J' then
      ok = write('SET', row, ARGV[a - 1])
    else
      if nulls_to >= nulls_from then
        ok = write('HDEL', row, unpack(ARGV, nulls_from, nulls_to))
      end
      if ok and last >= first then
        ok = write('HSET', row, unpack(ARGV, first, last))
      end
    end
    if ok then
      if op ~= 'D' then expire(row, ttl) end
      applied = applied + 1
    else
      restore(vkey, prev, row)
      wrongtype[#wrongtype + 1] = i
    end
  end
end

if #wrongtype > 0 then
  table.insert(wrongtype, 1, 1)
  return wrongtype
end
if ARGV[2] ~= '' then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
end
return {0, applied, skipped}
"#;

/// A version as the script compares it: 40 ASCII digits.
pub fn encode_version(v: Version) -> String {
    format!("{:020}{:020}", v.lsn, v.seq)
}

/// Parses [`encode_version`]'s output.
pub fn decode_version(s: &str) -> Option<Version> {
    if s.len() != 40 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(Version::new(s[..20].parse().ok()?, s[20..].parse().ok()?))
}

/// The field of a partition in the positions hash: `<topic>:<partition>`
/// (Kafka topic names cannot contain `:`).
pub fn position_field(topic: &str, partition: i32) -> String {
    format!("{topic}:{partition}")
}

/// What one script call reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// Every change went through (applied or skipped as not newer); the position is stored.
    Done {
        /// Changes written.
        applied: u64,
        /// Changes not newer than the stored version.
        skipped: u64,
    },
    /// These changes (0-based within the call) met a key of another type; no position stored.
    WrongType(Vec<usize>),
}

impl Reply {
    /// Decodes the script's integer array; `None` when it has an unexpected shape.
    pub fn parse(values: &[i64]) -> Option<Self> {
        match values {
            [0, applied, skipped] => Some(Self::Done {
                applied: u64::try_from(*applied).ok()?,
                skipped: u64::try_from(*skipped).ok()?,
            }),
            [1, rest @ ..] if !rest.is_empty() => rest
                .iter()
                .map(|i| usize::try_from(*i).ok()?.checked_sub(1))
                .collect::<Option<Vec<_>>>()
                .map(Self::WrongType),
            _ => None,
        }
    }
}
