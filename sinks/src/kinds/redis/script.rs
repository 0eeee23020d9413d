//! The Lua scripts that apply a chunk of changes and store the position —
//! one per layout, each called once per chunk.
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
//! Versions are 40 ASCII digits (zero-padded commit LSN and event ordinal), so
//! Lua's string `<` orders them exactly in any locale, without Lua's 53-bit
//! numbers.
//!
//! # Hash layout ([`HASH_SCRIPT`])
//!
//! The version of a live row is a field of its hash (`version.field`); a
//! deleted row leaves its version in a separate tombstone key
//! (`<version.key.prefix><row key>`, with `tombstone.ttl.seconds`). Per
//! change: `HGET row version-field` reads the stored version (the one read
//! that can meet `WRONGTYPE`, before anything is written); only when the row
//! is absent is the tombstone read. A newer upsert **replaces** the row:
//! `DEL row`, then `HSET row version-field ours col val ...`, so a column
//! dropped or renamed in the source leaves the hash with the row's next full
//! image; only the fields of unavailable (unchanged TOAST) columns are kept,
//! read with `HMGET` before the `DEL` and written back, in the same atomic
//! call. It removes a tombstone it supersedes; a newer delete is `DEL row`
//! and the tombstone `SET`. A stale change writes nothing.
//!
//! `KEYS[1]` is the positions hash, `KEYS[2..=1 + m]` the key sets of the
//! tables the call writes, `KEYS[1 + m + i]` the row key of change `i`.
//! `ARGV` is a header — position field, next offset (`""` = do not store a
//! position), row TTL ms, tombstone TTL ms, version field, tombstone key
//! prefix, `m` — then per change (`set` is the 1-based index of its table's
//! key set):
//!
//! | op | arguments |
//! | --- | --- |
//! | `H` upsert (full row image) | version, set, fields |
//! | `K` upsert keeping unavailable columns | version, set, fields, kept fields |
//! | `D` delete | version, set |
//!
//! where *fields* is `field, value, field, value, ...` and *kept fields* is
//! `field, ...`, each packed as a sequence of MessagePack strings
//! ([`pack_str`]) that the script unpacks straight into `HSET`/`HMGET`
//! (`cmsgpack`, built into Redis). Packing matters: each script argument
//! costs Redis a parse, a Lua string and garbage collection, and with one
//! argument per field the script spent more time on its arguments than on
//! its commands (see BENCHMARKS.md).
//!
//! # JSON layout ([`JSON_SCRIPT`])
//!
//! The row is a string holding JSON, so its version lives beside it at
//! `<version.key.prefix><row key>` (the tombstone after a delete). One
//! `SET version-key ours GET` (Redis ≥ 6.2) reads the stored version and
//! writes ours in one command; the rare stale change puts the stored one back.
//! `KEYS[1]` is the positions hash, then the `m` key sets, then two keys per
//! change: the row key and the version key. `ARGV` is a header — position
//! field, next offset, row TTL ms, tombstone TTL ms, `m` — then per change
//! `J`, version, set, JSON text; or `D`, version, set.
//!
//! # Key sets and truncates ([`TRUNCATE_SCRIPT`])
//!
//! Every table has a set of its row keys (`<keyset.key.prefix><db>.<schema>.<table>`):
//! a newer upsert adds its row (`SADD`), a newer delete removes it, inside the
//! same call as the row write, so set and rows never disagree. With
//! `ttl.seconds` a row may expire while its key stays in the set; each new
//! member then checks two random members and removes those whose row is gone
//! (the set stays within about twice the live rows), and truncates drop them.
//!
//! A truncate is a call of its own: `KEYS` = positions hash, key set; `ARGV` =
//! position field, next offset, the truncate's version, an `SSCAN` cursor, a
//! budget of members (`script.max.changes`), layout (`H`/`J`), version field,
//! version key prefix. It goes through up to the budget's members and removes
//! each row whose version is older than the truncate (and its key from the
//! set); newer rows stay. It replies `{cursor, removed}`; cursor `"0"` means
//! done, and only then is the position stored, so the client calls again with
//! the cursor until then. Rows written between two calls are either newer
//! than the truncate (kept) or older ones read from another partition, whose
//! own copy of the truncate removes them after they were written; `SSCAN`
//! returns every member present for the whole scan, so nothing older than
//! the truncate that was there when it started is missed. A call repeated
//! after a crash changes nothing more.
//!
//! # Reply (both)
//!
//! `{0, applied, skipped}`; or `{1, i, ...}`: the 1-based changes whose row key
//! holds another Redis type (`WRONGTYPE`), in which case no position was
//! stored. Any other error of a Redis command aborts the call with that error.

use crate::event::Version;

/// Applies hash-layout changes (see the module docs). Loaded once per
/// connection (SCRIPT LOAD) and called by SHA.
pub const HASH_SCRIPT: &str = r#"
local ttl = tonumber(ARGV[3])
local tomb_ttl = tonumber(ARGV[4])
local vfield, tomb_prefix = ARGV[5], ARGV[6]
local sets = tonumber(ARGV[7])
local call, try, unpack_fields = redis.call, redis.pcall, cmsgpack.unpack
local applied, skipped = 0, 0
local wrongtype = {}
local nargs = #ARGV
local a, i = 8, 0

-- A new member of a key set whose rows expire: check two members at random
-- and forget those whose row expired, so the set stays within about twice
-- the live rows.
local function remember(set, row)
  if call('SADD', set, row) == 1 and ttl > 0 then
    for _, m in ipairs(call('SRANDMEMBER', set, 2)) do
      if call('EXISTS', m) == 0 then call('SREM', set, m) end
    end
  end
end

while a <= nargs do
  i = i + 1
  local op, ver = ARGV[a], ARGV[a + 1]
  local set = KEYS[1 + tonumber(ARGV[a + 2])]
  local row = KEYS[1 + sets + i]
  local fields, kept
  if op == 'H' then
    fields = ARGV[a + 3]
    a = a + 4
  elseif op == 'K' then
    fields, kept = ARGV[a + 3], ARGV[a + 4]
    a = a + 5
  else
    a = a + 3
  end
  -- The stored version: the live row's field, else the tombstone's.
  local stored = try('HGET', row, vfield)
  local foreign = false
  if type(stored) == 'table' then
    if string.sub(stored.err, 1, 9) ~= 'WRONGTYPE' then error(stored) end
    stored, foreign = false, true
  end
  local tomb
  if not stored then
    tomb = tomb_prefix .. row
    stored = call('GET', tomb)
  end
  if foreign and op ~= 'D' then
    wrongtype[#wrongtype + 1] = i
  elseif stored and stored >= ver then
    skipped = skipped + 1
  elseif op == 'D' then
    call('DEL', row)
    call('SREM', set, row)
    if tomb_ttl > 0 then
      call('SET', tomb or (tomb_prefix .. row), ver, 'PX', tomb_ttl)
    else
      call('SET', tomb or (tomb_prefix .. row), ver)
    end
    applied = applied + 1
  else
    -- The row image replaces the hash; unavailable columns keep their field.
    local keep_names, keep_values
    if kept then
      keep_names = {unpack_fields(kept)}
      keep_values = call('HMGET', row, unpack(keep_names))
    end
    call('DEL', row)
    call('HSET', row, vfield, ver, unpack_fields(fields))
    if kept then
      for j, name in ipairs(keep_names) do
        if keep_values[j] then call('HSET', row, name, keep_values[j]) end
      end
    end
    if ttl > 0 then call('PEXPIRE', row, ttl) end
    if tomb and stored then call('DEL', tomb) end
    remember(set, row)
    applied = applied + 1
  end
end

if #wrongtype > 0 then
  table.insert(wrongtype, 1, 1)
  return wrongtype
end
if ARGV[2] ~= '' then
  call('HSET', KEYS[1], ARGV[1], ARGV[2])
end
return {0, applied, skipped}
"#;

/// Applies JSON-layout changes (see the module docs). Loaded once per
/// connection (SCRIPT LOAD) and called by SHA.
pub const JSON_SCRIPT: &str = r#"
local ttl = tonumber(ARGV[3])
local tomb_ttl = tonumber(ARGV[4])
local sets = tonumber(ARGV[5])
local applied, skipped = 0, 0
local a, k = 6, 2 + sets

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

-- As in the hash script: a new member of a set whose rows expire checks two
-- members at random.
local function remember(set, row)
  if redis.call('SADD', set, row) == 1 and ttl > 0 then
    for _, m in ipairs(redis.call('SRANDMEMBER', set, 2)) do
      if redis.call('EXISTS', m) == 0 then redis.call('SREM', set, m) end
    end
  end
end

while a <= #ARGV do
  local op, ver = ARGV[a], ARGV[a + 1]
  local set = KEYS[1 + tonumber(ARGV[a + 2])]
  local row, vkey = KEYS[k], KEYS[k + 1]
  k = k + 2
  if op == 'J' then a = a + 4 else a = a + 3 end
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
    if op == 'D' then
      redis.call('DEL', row)
      redis.call('SREM', set, row)
    else
      redis.call('SET', row, ARGV[a - 1])
      if ttl > 0 then redis.call('PEXPIRE', row, ttl) end
      remember(set, row)
    end
    applied = applied + 1
  end
end

if ARGV[2] ~= '' then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
end
return {0, applied, skipped}
"#;

/// Applies one truncate, a part at a time (both layouts; see the module docs).
/// Loaded once per connection (SCRIPT LOAD) and called by SHA.
pub const TRUNCATE_SCRIPT: &str = r#"
local positions, set = KEYS[1], KEYS[2]
local ver, cursor, budget = ARGV[3], ARGV[4], tonumber(ARGV[5])
local layout, vfield, vprefix = ARGV[6], ARGV[7], ARGV[8]
local call = redis.call
local removed, seen = 0, 0

repeat
  local page = call('SSCAN', set, cursor, 'COUNT', 100)
  cursor = page[1]
  for _, row in ipairs(page[2]) do
    seen = seen + 1
    local stored
    if layout == 'H' then
      stored = redis.pcall('HGET', row, vfield)
      if type(stored) == 'table' then stored = false end
    elseif call('EXISTS', row) == 1 then
      stored = call('GET', vprefix .. row)
    else
      stored = false
    end
    if not stored then
      -- The row expired (or is no longer ours): forget it.
      call('SREM', set, row)
    elseif stored < ver then
      call('DEL', row)
      if layout == 'J' then call('DEL', vprefix .. row) end
      call('SREM', set, row)
      removed = removed + 1
    end
  end
until cursor == '0' or seen >= budget

if cursor == '0' and ARGV[2] ~= '' then
  call('HSET', positions, ARGV[1], ARGV[2])
end
return {cursor, removed}
"#;

/// A version as the scripts compare it: 40 ASCII digits.
pub fn encode_version(v: Version) -> String {
    let mut buf = [0u8; 40];
    write_version(v, &mut buf);
    buf.iter().map(|b| char::from(*b)).collect()
}

/// [`encode_version`] into a buffer, without allocating.
pub fn write_version(v: Version, out: &mut [u8; 40]) {
    let (lsn, seq) = out.split_at_mut(20);
    for (half, mut n) in [(lsn, v.lsn), (seq, v.seq)] {
        for b in half.iter_mut().rev() {
            *b = b'0' + (n % 10) as u8;
            n /= 10;
        }
    }
}

/// Parses [`encode_version`]'s output.
pub fn decode_version(s: &str) -> Option<Version> {
    if s.len() != 40 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(Version::new(s[..20].parse().ok()?, s[20..].parse().ok()?))
}

/// Appends `bytes` to `out` as one MessagePack string (the format family
/// `cmsgpack.unpack` returns as a Lua string).
pub fn pack_str(out: &mut Vec<u8>, bytes: &[u8]) {
    let n = bytes.len();
    if n < 32 {
        out.push(0xa0 | n as u8);
    } else if let Ok(n) = u8::try_from(n) {
        out.extend_from_slice(&[0xd9, n]);
    } else if let Ok(n) = u16::try_from(n) {
        out.push(0xda);
        out.extend_from_slice(&n.to_be_bytes());
    } else {
        // Redis bounds one argument at 512 MB, far below u32::MAX.
        out.push(0xdb);
        out.extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_be_bytes());
    }
    out.extend_from_slice(bytes);
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
