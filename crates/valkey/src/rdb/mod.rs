//! An RDB stream split into per-key `DUMP` payloads, for restoring a backup into a cluster of
//! any shape: each key goes to its slot's primary as `RESTORE key <ttl> <payload> ABSTTL
//! REPLACE`.
//!
//! [`RecordReader`] is a push parser: [`feed`](RecordReader::feed) it the stream in chunks
//! of any size, take the [`Item`]s with [`next_item`](RecordReader::next_item), and end with
//! [`finish`](RecordReader::finish). Values are never decoded: the walker finds where each
//! one ends and copies its bytes verbatim, so a payload is byte-identical to what `DUMP`
//! returns on the server that wrote the file:
//!
//! `<RDB type byte><value as in the RDB><RDB version, u16 LE><CRC-64 over all before, u64 LE>`
//!
//! The version written is the file's (11 for `REDIS0011` from Valkey 8, 80 for `VALKEY080`
//! from Valkey 9.0 and 9.1, whose `DUMP` writes 80 as well). A server refuses a payload of a
//! version newer than its own: Valkey 8 answers `ERR DUMP payload version or checksum are
//! wrong` to one from a `VALKEY080` file.
//!
//! Only what is needed is held: the unparsed tail of the input (at most the record being
//! read) and the items not yet taken.
//!
//! What Valkey 8.0 and 9.1 write, as seen in their files: `slot-info` aux fields inside the
//! database section (cluster mode), `LFU`/`LRU` opcodes before keys when the eviction policy
//! keeps them, [`types::HASH_2`] for hashes with field expirations (9.x; a field already
//! expired is still saved, and `RESTORE` drops it, or the whole key when no field is left),
//! and [`opcodes::SLOT_IMPORT`] before the databases when a 9.x primary saves while it
//! imports slots (the file then holds part of those slots' keys: see [`Item::SlotImport`]).
//! A server that loads a payload may re-encode it (a small hash table becomes a listpack)
//! and iterates hash tables in its own order, so its `DUMP` of those can differ.

mod cursor;
mod walk;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, VecDeque};

use crate::slots::{Slot, SlotRange, key_slot};
pub use crate::snapshot::RdbMagic;
use crate::snapshot::rdb::{RDB_HEADER_LEN, parse_header};
use cursor::{Cursor, Stop};
use walk::Walk;

/// `RDB_TYPE_*` value types.
pub mod types {
    /// A string.
    pub const STRING: u8 = 0;
    /// A list: count, strings (before RDB 7).
    pub const LIST: u8 = 1;
    /// A hash-table set: count, strings.
    pub const SET: u8 = 2;
    /// A skiplist sorted set with scores as text (before RDB 8).
    pub const ZSET: u8 = 3;
    /// A hash table: count, field and value strings.
    pub const HASH: u8 = 4;
    /// A skiplist sorted set: count, member strings and 8-byte binary scores.
    pub const ZSET_2: u8 = 5;
    /// A module value (Redis 4.0 release candidates).
    pub const MODULE_PRE_GA: u8 = 6;
    /// A module value.
    pub const MODULE_2: u8 = 7;
    /// A zipmap hash (one string blob).
    pub const HASH_ZIPMAP: u8 = 9;
    /// A ziplist list (one string blob).
    pub const LIST_ZIPLIST: u8 = 10;
    /// An intset set (one string blob).
    pub const SET_INTSET: u8 = 11;
    /// A ziplist sorted set (one string blob).
    pub const ZSET_ZIPLIST: u8 = 12;
    /// A ziplist hash (one string blob).
    pub const HASH_ZIPLIST: u8 = 13;
    /// A quicklist of ziplists: count, string blobs.
    pub const LIST_QUICKLIST: u8 = 14;
    /// A stream (RDB 9).
    pub const STREAM_LISTPACKS: u8 = 15;
    /// A listpack hash (one string blob).
    pub const HASH_LISTPACK: u8 = 16;
    /// A listpack sorted set (one string blob).
    pub const ZSET_LISTPACK: u8 = 17;
    /// A quicklist of listpacks or plain nodes: count, (container kind, string blob).
    pub const LIST_QUICKLIST_2: u8 = 18;
    /// A stream with first ID, max deleted ID, entries added and groups' entries read (RDB 10).
    pub const STREAM_LISTPACKS_2: u8 = 19;
    /// A listpack set (one string blob, RDB 11).
    pub const SET_LISTPACK: u8 = 20;
    /// A stream whose consumers also have an active time (RDB 11).
    pub const STREAM_LISTPACKS_3: u8 = 21;
    /// A hash table with field expirations (Valkey 9, RDB 80): count, then per field its
    /// name and value strings and an 8-byte little-endian expire time in Unix milliseconds
    /// (-1: none).
    pub const HASH_2: u8 = 22;
}

/// `RDB_OPCODE_*`: the byte before a record that is not a key.
pub mod opcodes {
    /// Slot import in progress (Valkey 9): job name, slot ranges.
    pub const SLOT_IMPORT: u8 = 0xF3;
    /// Slot size hint of foreign (Redis 7.4+) RDBs: slot, sizes.
    pub const SLOT_INFO: u8 = 0xF4;
    /// Function library code.
    pub const FUNCTION2: u8 = 0xF5;
    /// Functions of Redis 7.0 release candidates.
    pub const FUNCTION_PRE_GA: u8 = 0xF6;
    /// Module auxiliary data.
    pub const MODULE_AUX: u8 = 0xF7;
    /// LRU idle seconds of the next key.
    pub const IDLE: u8 = 0xF8;
    /// LFU counter of the next key.
    pub const FREQ: u8 = 0xF9;
    /// Auxiliary field: two strings.
    pub const AUX: u8 = 0xFA;
    /// Key and expire counts of the selected database.
    pub const RESIZEDB: u8 = 0xFB;
    /// Expire time of the next key, milliseconds (8 bytes LE).
    pub const EXPIRETIME_MS: u8 = 0xFC;
    /// Expire time of the next key, seconds (4 bytes LE).
    pub const EXPIRETIME: u8 = 0xFD;
    /// Database of the keys that follow.
    pub const SELECTDB: u8 = 0xFE;
    /// End of the RDB; the CRC-64 checksum follows.
    pub const EOF: u8 = 0xFF;
}

/// CRC-64 of payloads and of the file (`CRC_64_REDIS`), with 16 tables for speed.
static CRC64: crc::Crc<u64, crc::Table<16>> =
    crc::Crc::<u64, crc::Table<16>>::new(&crc::CRC_64_REDIS);

/// Buffer capacity kept between records.
const SHRINK_ABOVE: usize = 4 << 20;

/// Highest RDB version with the `REDIS` magic that is Redis OSS/Valkey's (12 to 79 are
/// Redis formats Valkey does not read).
const LAST_REDIS_OSS_VERSION: u32 = 11;
/// First RDB version with the `VALKEY` magic.
const FIRST_VALKEY_VERSION: u32 = 80;

/// Why a stream cannot be split.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RdbError {
    /// The first bytes are not an RDB header.
    #[error("{0}")]
    BadHeader(String),
    /// An RDB format this reader does not know.
    #[error(
        "unsupported RDB version {version} ({magic:?} magic): only Redis OSS/Valkey RDB 1 to 11 \
         and Valkey RDB 80 and later are read"
    )]
    UnsupportedVersion {
        /// Header magic.
        magic: RdbMagic,
        /// Header version.
        version: u32,
    },
    /// A byte where an opcode or value type belongs that is neither.
    #[error("unknown RDB opcode or value type {byte:#04x} at offset {offset}")]
    UnknownType {
        /// The byte.
        byte: u8,
        /// Its stream offset.
        offset: u64,
    },
    /// A length with an invalid first byte.
    #[error("invalid RDB length encoding {byte:#04x} at offset {offset}")]
    BadLength {
        /// The byte.
        byte: u8,
        /// Its stream offset.
        offset: u64,
    },
    /// A string with an unknown special encoding.
    #[error("unknown RDB string encoding {encoding} at offset {offset}")]
    BadStringEncoding {
        /// The encoding number (low six bits of the length byte).
        encoding: u8,
        /// Stream offset of the string.
        offset: u64,
    },
    /// An LZF-compressed string (a key, an aux field, function code) that does not decompress.
    #[error("corrupt LZF-compressed string at offset {offset}")]
    BadLzf {
        /// Stream offset of the string.
        offset: u64,
    },
    /// A length too large for this machine.
    #[error("length {len} at offset {offset} is too large")]
    TooLarge {
        /// The length.
        len: u64,
        /// Stream offset of the length.
        offset: u64,
    },
    /// A module value or module aux data: only the module itself could read it, and the
    /// operator's servers load no modules.
    #[error(
        "module data at offset {offset}: keys or aux data of Valkey modules cannot be restored"
    )]
    ModuleData {
        /// Stream offset of the module type or opcode.
        offset: u64,
    },
    /// Functions in the format of Redis 7.0 release candidates.
    #[error("pre-GA function library (Redis 7.0 release candidate) at offset {offset}")]
    PreGaFunctions {
        /// Stream offset of the opcode.
        offset: u64,
    },
    /// A slot import record with a slot range out of bounds.
    #[error("invalid slot range {start}-{end} in a slot import record at offset {offset}")]
    BadSlotRange {
        /// Range start.
        start: u64,
        /// Range end.
        end: u64,
        /// Stream offset of the record.
        offset: u64,
    },
    /// The stream ended before the `EOF` opcode and checksum.
    #[error("RDB stream ended at offset {offset} before its EOF opcode and checksum ({context})")]
    Truncated {
        /// Bytes read.
        offset: u64,
        /// What was being read.
        context: &'static str,
    },
    /// The checksum after the `EOF` opcode does not match the content.
    #[error("RDB checksum mismatch: stored {stored:#018x}, computed {computed:#018x}")]
    Checksum {
        /// The stored CRC-64.
        stored: u64,
        /// The CRC-64 of everything before it.
        computed: u64,
    },
    /// Bytes after the checksum.
    #[error("{len} bytes after the RDB's EOF opcode and checksum (offset {offset})")]
    TrailingData {
        /// Stream offset of the first extra byte.
        offset: u64,
        /// How many were fed.
        len: u64,
    },
}

/// One key of the RDB, ready for `RESTORE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Database number.
    pub db: u64,
    /// Key name.
    pub key: Vec<u8>,
    /// Absolute expire time in Unix milliseconds (`RESTORE ... ABSTTL`), if any.
    pub expire_at_ms: Option<i64>,
    /// LRU idle time in seconds, when the server saved one (`RESTORE ... IDLETIME`).
    pub idle_secs: Option<u64>,
    /// LFU counter, when the server saved one (`RESTORE ... FREQ`).
    pub lfu_freq: Option<u8>,
    /// The value's RDB type (see [`types`]).
    pub rdb_type: u8,
    /// The value in `DUMP` format.
    pub payload: Vec<u8>,
    /// Stream offset of the record's first byte (its first opcode or its type).
    pub offset: u64,
}

impl Record {
    /// The key's hash slot.
    pub fn slot(&self) -> Slot {
        key_slot(&self.key)
    }
}

/// A slot import that was in progress when the RDB was written (Valkey 9 atomic slot
/// migration): the file holds a partial copy of these slots' keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotImport {
    /// The import job's name.
    pub job: Vec<u8>,
    /// Slots being imported.
    pub ranges: Vec<SlotRange>,
}

/// What the stream holds, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    /// A key.
    Key(Record),
    /// A function library's code (for `FUNCTION LOAD REPLACE`).
    Function(Vec<u8>),
    /// A slot import in progress (keys of these slots may be incomplete).
    SlotImport(SlotImport),
}

/// What a whole stream held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Header magic.
    pub magic: RdbMagic,
    /// RDB version (the version written into payloads).
    pub version: u32,
    /// Aux fields (`valkey-ver`, `ctime`, `used-mem`, `repl-id`, ...), the last value of each;
    /// `slot-info` fields are only counted in [`Summary::slot_info_fields`].
    pub aux: BTreeMap<String, String>,
    /// How many `slot-info` aux fields (Valkey 8+: one per non-empty slot in cluster mode).
    pub slot_info_fields: u64,
    /// Keys.
    pub keys: u64,
    /// Keys with an expire time.
    pub keys_with_ttl: u64,
    /// Keys per database.
    pub keys_per_db: BTreeMap<u64, u64>,
    /// `RESIZEDB` hints per database: (keys, keys with an expire time).
    pub db_size_hints: BTreeMap<u64, (u64, u64)>,
    /// Function libraries.
    pub functions: u64,
    /// Slot imports in progress.
    pub slot_imports: u64,
    /// Bytes of the stream.
    pub bytes: u64,
    /// The stored checksum (0: written with `rdbchecksum no`, not verified).
    pub checksum: u64,
}

impl Summary {
    /// The writing server's version (`valkey-ver`, else `redis-ver` aux field).
    pub fn server_version(&self) -> Option<&str> {
        self.aux
            .get("valkey-ver")
            .or_else(|| self.aux.get("redis-ver"))
            .map(String::as_str)
    }
}

/// A `DUMP` payload: `rdb_type`, `value` (its RDB serialization), `version` and the CRC-64.
pub fn dump_payload(rdb_type: u8, value: &[u8], version: u16) -> Vec<u8> {
    let mut p = Vec::with_capacity(1 + value.len() + 10);
    p.push(rdb_type);
    p.extend_from_slice(value);
    p.extend_from_slice(&version.to_le_bytes());
    let crc = CRC64.checksum(&p);
    p.extend_from_slice(&crc.to_le_bytes());
    p
}

/// The parts of a `DUMP` payload (type, value, version), when its checksum is right.
pub fn split_dump_payload(payload: &[u8]) -> Option<(u8, &[u8], u16)> {
    let (body, crc) = payload.split_last_chunk::<8>()?;
    if CRC64.checksum(body) != u64::from_le_bytes(*crc) {
        return None;
    }
    let (rest, version) = body.split_last_chunk::<2>()?;
    let (&t, value) = rest.split_first()?;
    Some((t, value, u16::from_le_bytes(*version)))
}

/// Attributes read before a key, for the next key.
#[derive(Debug, Default, Clone, Copy)]
struct KeyAttrs {
    expire_at_ms: Option<i64>,
    idle_secs: Option<u64>,
    lfu_freq: Option<u8>,
    /// Stream offset of the first attribute opcode.
    first: Option<u64>,
}

/// A key record whose value is being walked.
#[derive(Debug)]
struct PartialKey {
    rdb_type: u8,
    key: Vec<u8>,
    /// Position of the value in the record.
    value_start: usize,
}

/// One complete step of the stream.
enum Step {
    Aux(Vec<u8>, Vec<u8>),
    SelectDb(u64),
    ResizeDb(u64, u64),
    ExpireMs(i64),
    Idle(u64),
    Freq(u8),
    Function(Vec<u8>),
    SlotImport(SlotImport),
    SlotInfo,
    /// The key in [`Parser::partial`], whose value is now whole.
    Key,
    Eof(u64),
}

/// What reading a step needs besides the bytes: the RDB version and the key being walked.
#[derive(Debug, Default)]
struct Parser {
    version: u32,
    partial: Option<PartialKey>,
    walk: Walk,
}

impl Parser {
    /// Reads the step at the start of `data` (stream offset `base`): the step and its length.
    /// A key's value is walked from where an earlier call stopped.
    fn step(&mut self, data: &[u8], base: u64) -> Result<(Step, usize), Stop> {
        if self.partial.is_some() {
            self.walk.run(data, base)?;
            return Ok((Step::Key, self.walk.at));
        }
        let mut c = Cursor::new(data, 0, base);
        let step = match c.u8()? {
            opcodes::AUX => Step::Aux(c.string()?, c.string()?),
            opcodes::SELECTDB => Step::SelectDb(c.len()?),
            opcodes::RESIZEDB => Step::ResizeDb(c.len()?, c.len()?),
            opcodes::EXPIRETIME_MS => Step::ExpireMs(c.i64_le()?),
            opcodes::EXPIRETIME => Step::ExpireMs(i64::from(c.i32_le()?) * 1000),
            opcodes::IDLE => Step::Idle(c.len()?),
            opcodes::FREQ => Step::Freq(c.u8()?),
            opcodes::FUNCTION2 => Step::Function(c.string()?),
            opcodes::SLOT_IMPORT => Step::SlotImport(slot_import(&mut c, base)?),
            opcodes::SLOT_INFO => {
                for _ in 0..3 {
                    c.len()?;
                }
                Step::SlotInfo
            }
            opcodes::EOF => {
                let checksum = if self.version >= 5 {
                    u64::from_le_bytes(c.bytes(8)?.try_into().expect("8 bytes"))
                } else {
                    0
                };
                Step::Eof(checksum)
            }
            opcodes::MODULE_AUX => return Err(RdbError::ModuleData { offset: base }.into()),
            opcodes::FUNCTION_PRE_GA => {
                return Err(RdbError::PreGaFunctions { offset: base }.into());
            }
            rdb_type => {
                let prog = walk::program(rdb_type, base)?;
                let key = c.string()?;
                let value_start = c.pos();
                self.partial = Some(PartialKey {
                    rdb_type,
                    key,
                    value_start,
                });
                self.walk.start(prog, value_start);
                self.walk.run(data, base)?;
                return Ok((Step::Key, self.walk.at));
            }
        };
        Ok((step, c.pos()))
    }
}

/// The rest of a `SLOT_IMPORT` record: job name, count, (start, end) ranges.
fn slot_import(c: &mut Cursor<'_>, base: u64) -> Result<SlotImport, Stop> {
    let job = c.string()?;
    let n = c.len()?;
    let mut ranges = Vec::new();
    for _ in 0..n {
        let (start, end) = (c.len()?, c.len()?);
        let range = u16::try_from(start)
            .ok()
            .zip(u16::try_from(end).ok())
            .and_then(|(s, e)| SlotRange::new(s, e).ok())
            .ok_or(RdbError::BadSlotRange {
                start,
                end,
                offset: base,
            })?;
        ranges.push(range);
    }
    Ok(SlotImport { job, ranges })
}

/// The magic and version of a supported header.
fn read_header(data: &[u8]) -> Result<(RdbMagic, u32), Stop> {
    let head = data
        .get(..RDB_HEADER_LEN)
        .ok_or(Stop::More(RDB_HEADER_LEN))?;
    let (magic, version) = parse_header(head).map_err(RdbError::BadHeader)?;
    let supported = match magic {
        RdbMagic::Redis => (1..=LAST_REDIS_OSS_VERSION).contains(&version),
        RdbMagic::Valkey => (FIRST_VALKEY_VERSION..=u32::from(u16::MAX)).contains(&version),
    };
    if !supported {
        return Err(RdbError::UnsupportedVersion { magic, version }.into());
    }
    Ok((magic, version))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Header,
    Body,
    Done,
}

/// Splits an RDB stream, fed in chunks of any size, into [`Item`]s.
///
/// [`feed`](Self::feed) parses every record that the bytes fed so far complete: once it
/// returns, [`next_item`](Self::next_item) yields them all, and [`finish`](Self::finish)
/// finds no other. After an error, every call returns that error.
///
/// ```
/// use valkey_ops::rdb::{Item, RecordReader};
///
/// fn split(chunks: &[&[u8]]) -> Result<(), valkey_ops::rdb::RdbError> {
///     let mut reader = RecordReader::new();
///     for chunk in chunks {
///         reader.feed(chunk)?;
///         while let Some(item) = reader.next_item() {
///             match item {
///                 Item::Key(r) => println!("slot {}: {} payload bytes", r.slot(), r.payload.len()),
///                 Item::Function(code) => println!("library of {} bytes", code.len()),
///                 Item::SlotImport(s) => println!("partial slots {:?}", s.ranges),
///             }
///         }
///     }
///     let summary = reader.finish()?;
///     println!("{} keys", summary.keys);
///     Ok(())
/// }
/// ```
pub struct RecordReader {
    /// Unparsed input is `buf[pos..]`; `buf[0]` is at stream offset `base`.
    buf: Vec<u8>,
    pos: usize,
    base: u64,
    /// Parse again once `buf.len() - pos` reaches this.
    wanted: usize,
    phase: Phase,
    parser: Parser,
    db: u64,
    attrs: KeyAttrs,
    items: VecDeque<Item>,
    summary: Summary,
    crc: crc::Digest<'static, u64, crc::Table<16>>,
    error: Option<RdbError>,
}

impl std::fmt::Debug for RecordReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordReader")
            .field("offset", &(self.base + self.pos as u64))
            .field("buffered", &self.buffered())
            .field("phase", &self.phase)
            .field("items", &self.items.len())
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl Default for RecordReader {
    fn default() -> Self {
        Self::new()
    }
}

impl RecordReader {
    /// A reader at the start of a stream.
    pub fn new() -> Self {
        Self {
            buf: Vec::new(),
            pos: 0,
            base: 0,
            wanted: RDB_HEADER_LEN,
            phase: Phase::Header,
            parser: Parser::default(),
            db: 0,
            attrs: KeyAttrs::default(),
            items: VecDeque::new(),
            summary: Summary {
                magic: RdbMagic::Redis,
                version: 0,
                aux: BTreeMap::new(),
                slot_info_fields: 0,
                keys: 0,
                keys_with_ttl: 0,
                keys_per_db: BTreeMap::new(),
                db_size_hints: BTreeMap::new(),
                functions: 0,
                slot_imports: 0,
                bytes: 0,
                checksum: 0,
            },
            crc: CRC64.digest(),
            error: None,
        }
    }

    /// The header's magic and version, once read. The version is the one written into the
    /// payloads: a server refuses payloads newer than its own format.
    pub fn header(&self) -> Option<(RdbMagic, u32)> {
        (self.phase != Phase::Header).then_some((self.summary.magic, self.summary.version))
    }

    /// Bytes fed so far.
    pub fn bytes_fed(&self) -> u64 {
        self.base + self.buf.len() as u64
    }

    /// Bytes held: the unparsed tail of the input (at most the record being read).
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// Feeds the next bytes of the stream and parses the records they complete.
    pub fn feed(&mut self, data: &[u8]) -> Result<(), RdbError> {
        if let Some(e) = &self.error {
            return Err(e.clone());
        }
        if data.is_empty() {
            return Ok(());
        }
        if self.phase == Phase::Done {
            return self.fail(RdbError::TrailingData {
                offset: self.bytes_fed(),
                len: data.len() as u64,
            });
        }
        if self.pos > 0 {
            self.buf.drain(..self.pos);
            self.base += self.pos as u64;
            self.pos = 0;
            // Give back the room a large record took.
            if self.buf.capacity() > SHRINK_ABOVE && self.buf.capacity() > 4 * self.buf.len() {
                self.buf.shrink_to(SHRINK_ABOVE.max(2 * self.buf.len()));
            }
        }
        self.buf.extend_from_slice(data);
        if self.buffered() < self.wanted {
            return Ok(());
        }
        match self.parse() {
            Ok(()) => Ok(()),
            Err(e) => self.fail(e),
        }
    }

    /// The next item, in stream order.
    pub fn next_item(&mut self) -> Option<Item> {
        self.items.pop_front()
    }

    /// Ends the stream: its summary, or an error when it did not end with the `EOF` opcode
    /// and checksum (or failed before).
    pub fn finish(self) -> Result<Summary, RdbError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        if self.phase != Phase::Done {
            let context = match self.phase {
                Phase::Header => "in the header",
                _ if self.parser.partial.is_some() => "in a key's value",
                _ if self.buffered() > 0 => "in a record",
                _ => "between records",
            };
            return Err(RdbError::Truncated {
                offset: self.bytes_fed(),
                context,
            });
        }
        Ok(self.summary)
    }

    fn fail(&mut self, e: RdbError) -> Result<(), RdbError> {
        self.error = Some(e.clone());
        self.items.clear();
        self.buf = Vec::new();
        Err(e)
    }

    /// Parses steps from `buf[pos..]` until the input runs out.
    fn parse(&mut self) -> Result<(), RdbError> {
        loop {
            let data = &self.buf[self.pos..];
            let base = self.base + self.pos as u64;
            let result = match self.phase {
                Phase::Header => match read_header(data) {
                    Ok((magic, version)) => {
                        self.crc.update(&data[..RDB_HEADER_LEN]);
                        self.summary.magic = magic;
                        self.summary.version = version;
                        self.parser.version = version;
                        self.pos += RDB_HEADER_LEN;
                        self.phase = Phase::Body;
                        continue;
                    }
                    Err(stop) => Err(stop),
                },
                Phase::Body => self.parser.step(data, base),
                Phase::Done if data.is_empty() => return Ok(()),
                Phase::Done => {
                    return Err(RdbError::TrailingData {
                        offset: base,
                        len: data.len() as u64,
                    });
                }
            };
            match result {
                Ok((step, len)) => self.apply(step, len, base)?,
                Err(Stop::More(n)) => {
                    self.wanted = n;
                    return Ok(());
                }
                Err(Stop::Bad(e)) => return Err(e),
            }
        }
    }

    /// Applies a complete step: `len` bytes at `buf[pos..]`, stream offset `base`.
    fn apply(&mut self, step: Step, len: usize, base: u64) -> Result<(), RdbError> {
        let record = &self.buf[self.pos..self.pos + len];
        self.pos += len;
        self.wanted = 0;
        match step {
            Step::Aux(k, v) => {
                if k == b"slot-info" {
                    self.summary.slot_info_fields += 1;
                } else {
                    self.summary.aux.insert(
                        String::from_utf8_lossy(&k).into_owned(),
                        String::from_utf8_lossy(&v).into_owned(),
                    );
                }
            }
            Step::SelectDb(db) => self.db = db,
            Step::ResizeDb(keys, expires) => {
                self.summary.db_size_hints.insert(self.db, (keys, expires));
            }
            Step::ExpireMs(ms) => {
                self.attrs.first.get_or_insert(base);
                self.attrs.expire_at_ms = Some(ms);
            }
            Step::Idle(secs) => {
                self.attrs.first.get_or_insert(base);
                self.attrs.idle_secs = Some(secs);
            }
            Step::Freq(f) => {
                self.attrs.first.get_or_insert(base);
                self.attrs.lfu_freq = Some(f);
            }
            Step::Function(code) => {
                self.summary.functions += 1;
                self.items.push_back(Item::Function(code));
            }
            Step::SlotImport(s) => {
                self.summary.slot_imports += 1;
                self.items.push_back(Item::SlotImport(s));
            }
            Step::SlotInfo => {}
            Step::Key => {
                let p = self.parser.partial.take().expect("a key was walked");
                let attrs = std::mem::take(&mut self.attrs);
                // The version fits: `read_header` checked.
                let payload = dump_payload(
                    p.rdb_type,
                    &record[p.value_start..],
                    self.summary.version as u16,
                );
                self.summary.keys += 1;
                *self.summary.keys_per_db.entry(self.db).or_default() += 1;
                if attrs.expire_at_ms.is_some() {
                    self.summary.keys_with_ttl += 1;
                }
                self.items.push_back(Item::Key(Record {
                    db: self.db,
                    key: p.key,
                    expire_at_ms: attrs.expire_at_ms,
                    idle_secs: attrs.idle_secs,
                    lfu_freq: attrs.lfu_freq,
                    rdb_type: p.rdb_type,
                    payload,
                    offset: attrs.first.unwrap_or(base),
                }));
            }
            Step::Eof(stored) => {
                // The checksum covers everything up to and including the EOF opcode.
                self.crc.update(&record[..1]);
                let computed = self.crc.clone().finalize();
                self.summary.checksum = stored;
                self.summary.bytes = base + len as u64;
                self.phase = Phase::Done;
                if stored != 0 && stored != computed {
                    return Err(RdbError::Checksum { stored, computed });
                }
                return Ok(());
            }
        }
        self.crc.update(record);
        Ok(())
    }
}
