//! Reading the RDB's primitives from a byte slice that may end anywhere: lengths, strings
//! (plain, integer-encoded, LZF-compressed), fixed-size fields.

use super::RdbError;

/// Why a read stopped short.
#[derive(Debug)]
pub(super) enum Stop {
    /// The input ends first: the read needs the slice to be at least this long.
    More(usize),
    /// The input is malformed.
    Bad(RdbError),
}

impl From<RdbError> for Stop {
    fn from(e: RdbError) -> Self {
        Stop::Bad(e)
    }
}

/// A length as the RDB writes it: a count, or (for strings) a special encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Len {
    /// A plain length.
    Plain(u64),
    /// `11xxxxxx`: the six bits name an encoding (`RDB_ENC_*`).
    Encoded(u8),
}

const ENC_INT8: u8 = 0;
const ENC_INT16: u8 = 1;
const ENC_INT32: u8 = 2;
const ENC_LZF: u8 = 3;

/// A position in `data`, whose first byte is at stream offset `base`.
pub(super) struct Cursor<'a> {
    data: &'a [u8],
    pos: usize,
    base: u64,
}

impl<'a> Cursor<'a> {
    /// A cursor at `pos` in `data`.
    pub(super) fn new(data: &'a [u8], pos: usize, base: u64) -> Self {
        Self { data, pos, base }
    }

    /// Position in the slice.
    pub(super) fn pos(&self) -> usize {
        self.pos
    }

    /// Stream offset of the next byte.
    pub(super) fn offset(&self) -> u64 {
        self.base + self.pos as u64
    }

    /// Stream offset of slice position `pos`.
    pub(super) fn offset_of(&self, pos: usize) -> u64 {
        self.base + pos as u64
    }

    /// The next `n` bytes.
    pub(super) fn bytes(&mut self, n: usize) -> Result<&'a [u8], Stop> {
        let end = self.pos.checked_add(n).ok_or(Stop::More(usize::MAX))?;
        let b = self.data.get(self.pos..end).ok_or(Stop::More(end))?;
        self.pos = end;
        Ok(b)
    }

    /// Skips `n` bytes (a length read from the stream).
    pub(super) fn skip(&mut self, n: u64) -> Result<(), Stop> {
        let n = usize::try_from(n).map_err(|_| RdbError::TooLarge {
            len: n,
            offset: self.offset(),
        })?;
        self.bytes(n).map(|_| ())
    }

    pub(super) fn u8(&mut self) -> Result<u8, Stop> {
        Ok(self.bytes(1)?[0])
    }

    /// 4-byte little-endian signed integer (`EXPIRETIME` seconds).
    pub(super) fn i32_le(&mut self) -> Result<i32, Stop> {
        let b = self.bytes(4)?;
        Ok(i32::from_le_bytes(b.try_into().expect("4 bytes")))
    }

    /// 8-byte little-endian signed integer (millisecond times).
    pub(super) fn i64_le(&mut self) -> Result<i64, Stop> {
        let b = self.bytes(8)?;
        Ok(i64::from_le_bytes(b.try_into().expect("8 bytes")))
    }

    /// A length or a string encoding: `00xxxxxx` (6 bits), `01xxxxxx xxxxxxxx` (14 bits, big
    /// endian), `0x80` + 4 bytes or `0x81` + 8 bytes (big endian), `11xxxxxx` (encoding).
    pub(super) fn len_or_encoding(&mut self) -> Result<Len, Stop> {
        let start = self.pos;
        let b = self.u8()?;
        Ok(match b >> 6 {
            0 => Len::Plain(u64::from(b & 0x3F)),
            1 => Len::Plain(u64::from(b & 0x3F) << 8 | u64::from(self.u8()?)),
            3 => Len::Encoded(b & 0x3F),
            _ => match b {
                0x80 => Len::Plain(u64::from(u32::from_be_bytes(
                    self.bytes(4)?.try_into().expect("4 bytes"),
                ))),
                0x81 => Len::Plain(u64::from_be_bytes(
                    self.bytes(8)?.try_into().expect("8 bytes"),
                )),
                _ => {
                    return Err(RdbError::BadLength {
                        byte: b,
                        offset: self.offset_of(start),
                    }
                    .into());
                }
            },
        })
    }

    /// A plain length (a string encoding is an error here).
    pub(super) fn len(&mut self) -> Result<u64, Stop> {
        let start = self.pos;
        match self.len_or_encoding()? {
            Len::Plain(n) => Ok(n),
            Len::Encoded(_) => Err(RdbError::BadLength {
                byte: self.data[start],
                offset: self.offset_of(start),
            }
            .into()),
        }
    }

    /// Skips a string in any encoding (an LZF one is not decompressed).
    pub(super) fn skip_string(&mut self) -> Result<(), Stop> {
        let start = self.pos;
        match self.len_or_encoding()? {
            Len::Plain(n) => self.skip(n),
            Len::Encoded(ENC_INT8) => self.skip(1),
            Len::Encoded(ENC_INT16) => self.skip(2),
            Len::Encoded(ENC_INT32) => self.skip(4),
            Len::Encoded(ENC_LZF) => {
                let compressed = self.len()?;
                self.len()?;
                self.skip(compressed)
            }
            Len::Encoded(enc) => Err(self.bad_encoding(enc, start)),
        }
    }

    /// A string, decoded: an integer encoding as its decimal text, LZF decompressed.
    pub(super) fn string(&mut self) -> Result<Vec<u8>, Stop> {
        let start = self.pos;
        match self.len_or_encoding()? {
            Len::Plain(n) => {
                let n = usize::try_from(n).map_err(|_| RdbError::TooLarge {
                    len: n,
                    offset: self.offset_of(start),
                })?;
                Ok(self.bytes(n)?.to_vec())
            }
            Len::Encoded(ENC_INT8) => Ok(decimal(i64::from(self.u8()? as i8))),
            Len::Encoded(ENC_INT16) => {
                let b = self.bytes(2)?;
                Ok(decimal(i64::from(i16::from_le_bytes([b[0], b[1]]))))
            }
            Len::Encoded(ENC_INT32) => Ok(decimal(i64::from(self.i32_le()?))),
            Len::Encoded(ENC_LZF) => {
                let compressed = self.len()?;
                let len = self.len()?;
                let too_large = || RdbError::TooLarge {
                    len: compressed.max(len),
                    offset: self.offset_of(start),
                };
                let compressed = usize::try_from(compressed).map_err(|_| too_large())?;
                let len = usize::try_from(len).map_err(|_| too_large())?;
                let data = self.bytes(compressed)?;
                lzf_decompress(data, len).ok_or_else(|| {
                    RdbError::BadLzf {
                        offset: self.offset_of(start),
                    }
                    .into()
                })
            }
            Len::Encoded(enc) => Err(self.bad_encoding(enc, start)),
        }
    }

    /// Skips a double written as text with a one-byte length (253, 254, 255: NaN, +inf,
    /// -inf, with no text), as in the old `ZSET` type.
    pub(super) fn skip_text_double(&mut self) -> Result<(), Stop> {
        match self.u8()? {
            253..=255 => Ok(()),
            n => self.skip(u64::from(n)),
        }
    }

    fn bad_encoding(&self, enc: u8, start: usize) -> Stop {
        RdbError::BadStringEncoding {
            encoding: enc,
            offset: self.offset_of(start),
        }
        .into()
    }
}

fn decimal(v: i64) -> Vec<u8> {
    v.to_string().into_bytes()
}

/// LZF decompression of `input` into exactly `len` bytes; `None` when the input is corrupt or
/// does not decompress to that length.
pub(super) fn lzf_decompress(input: &[u8], len: usize) -> Option<Vec<u8>> {
    let mut out: Vec<u8> = Vec::with_capacity(len);
    let mut i = 0;
    while i < input.len() {
        let ctrl = usize::from(input[i]);
        i += 1;
        if ctrl < 32 {
            // A literal run of ctrl + 1 bytes.
            let run = input.get(i..i + ctrl + 1)?;
            if out.len() + run.len() > len {
                return None;
            }
            out.extend_from_slice(run);
            i += run.len();
        } else {
            // A back reference: length in the top 3 bits (7: one more length byte), distance
            // in the low 5 bits and the next byte.
            let mut n = ctrl >> 5;
            if n == 7 {
                n += usize::from(*input.get(i)?);
                i += 1;
            }
            n += 2;
            let distance = ((ctrl & 0x1F) << 8) + usize::from(*input.get(i)?) + 1;
            i += 1;
            if distance > out.len() || out.len() + n > len {
                return None;
            }
            let from = out.len() - distance;
            for k in from..from + n {
                out.push(out[k]);
            }
        }
    }
    (out.len() == len).then_some(out)
}
