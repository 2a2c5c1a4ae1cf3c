//! What is checked of an RDB payload while it streams through: the magic and version at the
//! start, the `EOF` opcode and CRC-64 checksum at the end, the SHA-256 and length of the
//! whole, and the first database's key count (see [`super::prelude`]). Values are never
//! parsed, and nothing is held but the prelude and a few bytes at the end.

use sha2::{Digest, Sha256};

use super::prelude::{self, MAX_PRELUDE, Prelude};

/// Length of the RDB header: `REDIS` + 4 version digits, or `VALKEY` + 3.
pub const RDB_HEADER_LEN: usize = 9;
/// Opcode that ends the RDB content; the 8-byte checksum follows it.
const RDB_OPCODE_EOF: u8 = 0xFF;
/// Bytes of the trailing checksum.
const CHECKSUM_LEN: usize = 8;

/// The RDB header's magic: which server family wrote the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RdbMagic {
    /// `REDIS` + 4 digits: RDB versions up to 11 (Redis, Valkey 7.2 and 8.x; Valkey 9 when the
    /// reader did not announce a version of its own).
    Redis,
    /// `VALKEY` + 3 digits: RDB version 80 and later (Valkey 9).
    Valkey,
}

/// The magic and RDB version of a payload's first [`RDB_HEADER_LEN`] bytes, or a printable
/// excerpt of what was there instead.
pub fn parse_header(head: &[u8]) -> Result<(RdbMagic, u32), String> {
    let digits = |d: &[u8]| -> Option<u32> {
        d.iter()
            .all(u8::is_ascii_digit)
            .then(|| std::str::from_utf8(d).ok()?.parse().ok())
            .flatten()
    };
    let parsed = if head.len() < RDB_HEADER_LEN {
        None
    } else if let Some(d) = head.strip_prefix(b"REDIS") {
        digits(&d[..4]).map(|v| (RdbMagic::Redis, v))
    } else if let Some(d) = head.strip_prefix(b"VALKEY") {
        digits(&d[..3]).map(|v| (RdbMagic::Valkey, v))
    } else {
        None
    };
    parsed.ok_or_else(|| {
        format!(
            "payload does not start with an RDB header (REDIS0000 or VALKEY000): {}",
            head.escape_ascii()
        )
    })
}

/// The CRC-64 Valkey writes at the end of an RDB (CRC-64/Jones, as the `crc` crate's
/// catalogue names it `CRC_64_REDIS`).
pub static RDB_CRC: crc::Crc<u64> = crc::Crc::<u64>::new(&crc::CRC_64_REDIS);

/// What the end of a whole payload says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RdbTrailer {
    /// Payload length.
    pub len: u64,
    /// SHA-256 of the payload.
    pub sha256: [u8; 32],
    /// The checksum stored in the last 8 bytes (0: the server was configured with
    /// `rdbchecksum no` and wrote none).
    pub stored_crc: u64,
    /// The CRC-64 computed over everything before those 8 bytes.
    pub computed_crc: u64,
}

/// Digests a payload fed in order, in pieces of any size: length, SHA-256, the header, and
/// the CRC-64 of everything except the last 8 bytes (not known to be the last until the end,
/// so the latest 8 bytes are held back from the CRC).
pub struct RdbDigest {
    len: u64,
    sha: Sha256,
    head: Vec<u8>,
    crc: crc::Digest<'static, u64>,
    /// The latest (up to) 8 bytes, not yet in the CRC.
    tail: [u8; CHECKSUM_LEN],
    tail_len: usize,
    /// The last byte that went into the CRC (the `EOF` opcode, once the payload is whole).
    last_crc_byte: Option<u8>,
    /// The payload's first bytes, held until the prelude is read.
    prelude: Vec<u8>,
    /// What the prelude said, once read.
    prelude_read: Option<Prelude>,
}

impl Default for RdbDigest {
    fn default() -> Self {
        Self::new()
    }
}

impl RdbDigest {
    /// An empty digest.
    pub fn new() -> Self {
        Self {
            len: 0,
            sha: Sha256::new(),
            head: Vec::with_capacity(RDB_HEADER_LEN),
            crc: RDB_CRC.digest(),
            tail: [0; CHECKSUM_LEN],
            tail_len: 0,
            last_crc_byte: None,
            prelude: Vec::new(),
            prelude_read: None,
        }
    }

    /// What the prelude said about the first database (`Incomplete` until it is read).
    pub fn prelude(&self) -> Prelude {
        self.prelude_read.clone().unwrap_or(Prelude::Incomplete)
    }

    /// Bytes fed so far.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// The first bytes (up to [`RDB_HEADER_LEN`]).
    pub fn head(&self) -> &[u8] {
        &self.head
    }

    fn crc_update(&mut self, data: &[u8]) {
        if let Some(&b) = data.last() {
            self.crc.update(data);
            self.last_crc_byte = Some(b);
        }
    }

    /// Feeds the next bytes of the payload.
    pub fn update(&mut self, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        self.len += data.len() as u64;
        self.sha.update(data);
        if self.head.len() < RDB_HEADER_LEN {
            let n = (RDB_HEADER_LEN - self.head.len()).min(data.len());
            self.head.extend_from_slice(&data[..n]);
        }
        if self.prelude_read.is_none() {
            let n = (MAX_PRELUDE - self.prelude.len()).min(data.len());
            self.prelude.extend_from_slice(&data[..n]);
            match prelude::scan(&self.prelude) {
                Prelude::Incomplete => {}
                read => {
                    self.prelude_read = Some(read);
                    self.prelude = Vec::new();
                }
            }
        }
        if data.len() >= CHECKSUM_LEN {
            let tail = self.tail;
            self.crc_update(&tail[..self.tail_len]);
            let (body, last) = data.split_at(data.len() - CHECKSUM_LEN);
            self.crc_update(body);
            self.tail.copy_from_slice(last);
            self.tail_len = CHECKSUM_LEN;
        } else {
            let mut joined = [0u8; 2 * CHECKSUM_LEN];
            let n = self.tail_len + data.len();
            joined[..self.tail_len].copy_from_slice(&self.tail[..self.tail_len]);
            joined[self.tail_len..n].copy_from_slice(data);
            let keep_from = n.saturating_sub(CHECKSUM_LEN);
            self.crc_update(&joined[..keep_from]);
            self.tail[..n - keep_from].copy_from_slice(&joined[keep_from..n]);
            self.tail_len = n - keep_from;
        }
    }

    /// Ends the payload: its checks. An error when it is too short to be an RDB or does not
    /// end with the `EOF` opcode and a checksum.
    pub fn finish(self) -> Result<RdbTrailer, String> {
        if self.len < (RDB_HEADER_LEN + 1 + CHECKSUM_LEN) as u64 {
            return Err(format!(
                "payload of {} bytes is too short for an RDB",
                self.len
            ));
        }
        if self.last_crc_byte != Some(RDB_OPCODE_EOF) {
            return Err(format!(
                "payload does not end with the RDB EOF opcode and checksum (byte {:#04x} where \
                 0xff belongs)",
                self.last_crc_byte.unwrap_or_default()
            ));
        }
        Ok(RdbTrailer {
            len: self.len,
            sha256: self.sha.finalize().into(),
            stored_crc: u64::from_le_bytes(self.tail),
            computed_crc: self.crc.finalize(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Bit-at-a-time reference CRC: reflected CRC-64/Jones polynomial, initial value 0, no
    /// final xor.
    fn crc64_slow(data: &[u8]) -> u64 {
        let mut crc = 0u64;
        for &b in data {
            crc ^= u64::from(b);
            for _ in 0..8 {
                crc = if crc & 1 == 1 {
                    (crc >> 1) ^ 0x95ac_9329_ac4b_c9b5
                } else {
                    crc >> 1
                };
            }
        }
        crc
    }

    /// A well-formed fake RDB: header, some body, EOF opcode, checksum.
    fn fake_rdb(body: &[u8]) -> Vec<u8> {
        let mut v = b"REDIS0011".to_vec();
        v.extend_from_slice(body);
        v.push(0xFF);
        let crc = RDB_CRC.checksum(&v);
        v.extend_from_slice(&crc.to_le_bytes());
        v
    }

    #[test]
    fn crc64_check_value() {
        // The check value of CRC-64/Jones as Valkey's crc64 test prints it.
        assert_eq!(RDB_CRC.checksum(b"123456789"), 0xe9c6_d914_c4b8_d9ca);
        assert_eq!(crc64_slow(b"123456789"), 0xe9c6_d914_c4b8_d9ca);
        let text = b"This is a test of the emergency broadcast system.";
        assert_eq!(RDB_CRC.checksum(text), crc64_slow(text));
        let mut split = RDB_CRC.digest();
        split.update(&text[..13]);
        split.update(&text[13..]);
        assert_eq!(split.finalize(), RDB_CRC.checksum(text));
    }

    #[test]
    fn headers() {
        assert_eq!(parse_header(b"REDIS0011"), Ok((RdbMagic::Redis, 11)));
        assert_eq!(parse_header(b"VALKEY080"), Ok((RdbMagic::Valkey, 80)));
        assert!(parse_header(b"REDIS001").is_err());
        assert!(parse_header(b"REDIS00x1").is_err());
        assert!(parse_header(b"VALKEY08x").is_err());
        assert!(parse_header(b"+OK\r\n\0\0\0\0").is_err());
        let e = parse_header(b"HTTP/1.1 ").unwrap_err();
        assert!(e.contains("HTTP/1.1"), "{e}");
    }

    #[test]
    fn too_short_or_unterminated() {
        let mut d = RdbDigest::new();
        d.update(b"REDIS0011");
        assert!(d.finish().is_err());
        let mut rdb = fake_rdb(b"abc");
        let n = rdb.len();
        rdb[n - 9] = 0xFE;
        let mut d = RdbDigest::new();
        d.update(&rdb);
        assert!(d.finish().unwrap_err().contains("EOF opcode"));
    }

    proptest! {
        #[test]
        fn digest_is_independent_of_splits(
            body in proptest::collection::vec(any::<u8>(), 0..300),
            cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..12),
        ) {
            let rdb = fake_rdb(&body);
            let mut cuts: Vec<usize> = cuts.iter().map(|i| i.index(rdb.len() + 1)).collect();
            cuts.sort_unstable();
            let mut d = RdbDigest::new();
            let mut at = 0;
            for c in cuts.into_iter().chain([rdb.len()]) {
                d.update(&rdb[at..c]);
                at = c;
            }
            prop_assert_eq!(d.head(), &rdb[..RDB_HEADER_LEN]);
            let t = d.finish().unwrap();
            prop_assert_eq!(t.len, rdb.len() as u64);
            prop_assert_eq!(t.stored_crc, t.computed_crc);
            prop_assert_eq!(t.computed_crc, crc64_slow(&rdb[..rdb.len() - 8]));
            let sha: [u8; 32] = Sha256::digest(&rdb).into();
            prop_assert_eq!(t.sha256, sha);
        }
    }
}
