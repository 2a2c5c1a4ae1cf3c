//! The RDB's prelude: the auxiliary fields and function libraries before the first database,
//! read as far as that database's `RESIZEDB` record, which carries the server's own count of
//! its keys when it wrote the file. Values are never parsed.

/// `RESIZEDB`: the database's key count and count of keys with a TTL follow.
const OPCODE_RESIZEDB: u8 = 0xFB;
/// `SELECTDB`: the database number follows.
const OPCODE_SELECTDB: u8 = 0xFE;
/// `AUX`: a field name and value (two strings) follow.
const OPCODE_AUX: u8 = 0xFA;
/// `FUNCTION2`: a function library's source (one string) follows.
const OPCODE_FUNCTION2: u8 = 0xF5;
/// `EOF`: the end of the content.
const OPCODE_EOF: u8 = 0xFF;

/// The most of a prelude held while looking for the first database (function libraries can
/// make it long); beyond it the key count is left unknown.
pub const MAX_PRELUDE: usize = 4 * 1024 * 1024;

/// What the prelude said about the first database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prelude {
    /// More bytes are needed.
    Incomplete,
    /// The first database's number, key count and count of keys with a TTL.
    FirstDb {
        /// Database number.
        db: u64,
        /// Keys in it.
        keys: u64,
        /// Keys with a TTL.
        expires: u64,
    },
    /// The RDB has no database (it holds no key).
    Empty,
    /// Something other than the expected records (a module's data, an unknown opcode).
    Unknown(String),
}

/// Reads an RDB length at `pos`: `(value, bytes used)`, or `None` when incomplete; an error
/// for a special (integer or compressed) encoding where a length belongs.
fn length(buf: &[u8], pos: usize) -> Result<Option<(u64, usize)>, String> {
    let Some(&b) = buf.get(pos) else {
        return Ok(None);
    };
    let need = |n: usize| buf.len() >= pos + n;
    Ok(match b >> 6 {
        0 => Some((u64::from(b & 0x3F), 1)),
        1 => need(2).then(|| ((u64::from(b & 0x3F) << 8) | u64::from(buf[pos + 1]), 2)),
        2 if b == 0x80 => need(5).then(|| {
            let v = u32::from_be_bytes(buf[pos + 1..pos + 5].try_into().unwrap_or_default());
            (u64::from(v), 5)
        }),
        2 if b == 0x81 => need(9).then(|| {
            let v = u64::from_be_bytes(buf[pos + 1..pos + 9].try_into().unwrap_or_default());
            (v, 9)
        }),
        _ => return Err(format!("unexpected length byte {b:#04x}")),
    })
}

/// Skips an RDB string at `pos`: the bytes it takes, or `None` when incomplete.
fn string(buf: &[u8], pos: usize) -> Result<Option<usize>, String> {
    let Some(&b) = buf.get(pos) else {
        return Ok(None);
    };
    if b >> 6 == 3 {
        let used = match b & 0x3F {
            0 => 2,
            1 => 3,
            2 => 5,
            3 => {
                // LZF: compressed length, uncompressed length, compressed bytes.
                let Some((clen, a)) = length(buf, pos + 1)? else {
                    return Ok(None);
                };
                let Some((_, c)) = length(buf, pos + 1 + a)? else {
                    return Ok(None);
                };
                1 + a + c + clen as usize
            }
            other => return Err(format!("unknown string encoding {other}")),
        };
        return Ok((buf.len() >= pos + used).then_some(used));
    }
    let Some((len, used)) = length(buf, pos)? else {
        return Ok(None);
    };
    let total = used + len as usize;
    Ok((buf.len() >= pos + total).then_some(total))
}

/// Reads the prelude of the RDB in `buf` (from its first byte, the 9-byte header included).
pub fn scan(buf: &[u8]) -> Prelude {
    match scan_inner(buf) {
        Ok(Some(p)) => p,
        Ok(None) if buf.len() >= MAX_PRELUDE => {
            Prelude::Unknown(format!("no database in the first {MAX_PRELUDE} bytes"))
        }
        Ok(None) => Prelude::Incomplete,
        Err(e) => Prelude::Unknown(e),
    }
}

fn scan_inner(buf: &[u8]) -> Result<Option<Prelude>, String> {
    let mut pos = super::rdb::RDB_HEADER_LEN;
    let mut db = None;
    loop {
        let Some(&op) = buf.get(pos) else {
            return Ok(None);
        };
        pos += 1;
        match op {
            OPCODE_AUX => {
                let Some(a) = string(buf, pos)? else {
                    return Ok(None);
                };
                let Some(b) = string(buf, pos + a)? else {
                    return Ok(None);
                };
                pos += a + b;
            }
            OPCODE_FUNCTION2 => {
                let Some(a) = string(buf, pos)? else {
                    return Ok(None);
                };
                pos += a;
            }
            OPCODE_SELECTDB => {
                let Some((n, used)) = length(buf, pos)? else {
                    return Ok(None);
                };
                db = Some(n);
                pos += used;
            }
            OPCODE_RESIZEDB => {
                let Some((keys, a)) = length(buf, pos)? else {
                    return Ok(None);
                };
                let Some((expires, _)) = length(buf, pos + a)? else {
                    return Ok(None);
                };
                return Ok(Some(Prelude::FirstDb {
                    db: db.unwrap_or(0),
                    keys,
                    expires,
                }));
            }
            OPCODE_EOF => return Ok(Some(Prelude::Empty)),
            other => {
                return Err(format!(
                    "record {other:#04x} before the first database's size"
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The start of what Valkey 9.1 wrote for a cluster node with 2 keys, one with a TTL.
    const VALKEY_9: &[u8] = b"VALKEY080\xfa\x0avalkey-ver\x059.1.2\xfa\x0aredis-bits\xc0\x40\
\xfa\x05ctime\xc2\x2d\x06\x17\x6b\xfa\x08used-mem\xc2\x38\xd1\x28\x00\xfa\x08aof-base\xc0\x00\
\xfe\x00\xfb\x02\x01\xfa\x09slot-info";

    #[test]
    fn the_first_database_size_is_found_at_every_split() {
        for cut in 0..VALKEY_9.len() {
            let got = scan(&VALKEY_9[..cut]);
            let whole = cut >= VALKEY_9.len() - 11;
            if whole {
                assert_eq!(
                    got,
                    Prelude::FirstDb {
                        db: 0,
                        keys: 2,
                        expires: 1
                    }
                );
            } else {
                assert_eq!(got, Prelude::Incomplete, "cut at {cut}");
            }
        }
    }

    #[test]
    fn an_rdb_without_keys_is_empty() {
        let rdb = b"REDIS0011\xfa\x0avalkey-ver\x058.0.1\xff\x00\x00\x00\x00\x00\x00\x00\x00";
        assert_eq!(scan(rdb), Prelude::Empty);
    }

    #[test]
    fn long_lengths_and_compressed_strings_are_skipped() {
        let mut rdb = b"REDIS0011".to_vec();
        // An AUX field whose value is LZF-compressed (3 compressed bytes of 10).
        rdb.extend_from_slice(b"\xfa\x01k\xc3\x03\x0a\x01\x02\x03");
        // A function library of 300 bytes (14-bit length).
        rdb.extend_from_slice(&[0xF5, 0x41, 0x2C]);
        rdb.extend_from_slice(&[b'x'; 300]);
        // Database 3 with 70,000 keys (32-bit length), 5 with a TTL.
        rdb.extend_from_slice(&[0xFE, 0x03, 0xFB, 0x80, 0x00, 0x01, 0x11, 0x70, 0x05]);
        assert_eq!(
            scan(&rdb),
            Prelude::FirstDb {
                db: 3,
                keys: 70_000,
                expires: 5
            }
        );
    }

    #[test]
    fn a_module_record_leaves_the_count_unknown() {
        let rdb = b"REDIS0011\xf7\x01\x02";
        assert!(matches!(scan(rdb), Prelude::Unknown(m) if m.contains("0xf7")));
    }
}
