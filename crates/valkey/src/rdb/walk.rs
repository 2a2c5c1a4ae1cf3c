//! Where a value ends: each RDB value type as a small program of reads, run by a walker that
//! can stop wherever the input ends and resume there when more arrives (so a value of
//! millions of elements fed in small chunks is walked once, not once per chunk).

use super::RdbError;
use super::cursor::{Cursor, Stop};
use super::types;

/// One read of a value's serialization.
#[derive(Debug, Clone, Copy)]
pub(super) enum Op {
    /// A string in any encoding.
    Str,
    /// A length whose value does not matter here.
    Len,
    /// Raw bytes of a fixed size (binary doubles, millisecond times, stream IDs).
    Fixed(u8),
    /// A double as text with a one-byte length (the old `ZSET`).
    TextDouble,
    /// A count, then the body that many times.
    Repeat(&'static [Op]),
}

use Op::{Fixed, Len, Repeat, Str, TextDouble};

const ONE_STRING: &[Op] = &[Str];
const STRINGS: &[Op] = &[Repeat(&[Str])];
const ZSET_TEXT: &[Op] = &[Repeat(&[Str, TextDouble])];
const ZSET_BINARY: &[Op] = &[Repeat(&[Str, Fixed(8)])];
const HASH_PAIRS: &[Op] = &[Repeat(&[Str, Str])];
const HASH_PAIRS_EXPIRY: &[Op] = &[Repeat(&[Str, Str, Fixed(8)])];
/// Nodes of (container kind, listpack or plain string).
const QUICKLIST_2: &[Op] = &[Repeat(&[Len, Str])];

/// Entries of a consumer group's PEL: raw 128-bit ID, delivery time, delivery count.
const GROUP_PEL: Op = Repeat(&[Fixed(16), Fixed(8), Len]);
/// A consumer's PEL: raw IDs only.
const CONSUMER_PEL: Op = Repeat(&[Fixed(16)]);
/// Consumer: name, seen time, PEL.
const CONSUMERS_V1: Op = Repeat(&[Str, Fixed(8), CONSUMER_PEL]);
/// Consumer: name, seen time, active time, PEL.
const CONSUMERS_V3: Op = Repeat(&[Str, Fixed(8), Fixed(8), CONSUMER_PEL]);
/// Listpack nodes: master ID (a 16-byte string), listpack.
const STREAM_NODES: Op = Repeat(&[Str, Str]);
/// Length, last ID; groups: name, last ID, PEL, consumers.
const STREAM_V1: &[Op] = &[
    STREAM_NODES,
    Len,
    Len,
    Len,
    Repeat(&[Str, Len, Len, GROUP_PEL, CONSUMERS_V1]),
];
/// Length, last ID, first ID, max deleted ID, entries added; groups also hold their entries
/// read.
const STREAM_V2: &[Op] = &[
    STREAM_NODES,
    Len,
    Len,
    Len,
    Len,
    Len,
    Len,
    Len,
    Len,
    Repeat(&[Str, Len, Len, Len, GROUP_PEL, CONSUMERS_V1]),
];
/// As v2, and consumers also hold their active time.
const STREAM_V3: &[Op] = &[
    STREAM_NODES,
    Len,
    Len,
    Len,
    Len,
    Len,
    Len,
    Len,
    Len,
    Repeat(&[Str, Len, Len, Len, GROUP_PEL, CONSUMERS_V3]),
];

/// The program of value type `t` (at stream offset `offset`), or why it cannot be copied.
pub(super) fn program(t: u8, offset: u64) -> Result<&'static [Op], RdbError> {
    use types::*;
    Ok(match t {
        STRING | HASH_ZIPMAP | LIST_ZIPLIST | SET_INTSET | ZSET_ZIPLIST | HASH_ZIPLIST
        | HASH_LISTPACK | ZSET_LISTPACK | SET_LISTPACK => ONE_STRING,
        LIST | SET | LIST_QUICKLIST => STRINGS,
        ZSET => ZSET_TEXT,
        ZSET_2 => ZSET_BINARY,
        HASH => HASH_PAIRS,
        HASH_2 => HASH_PAIRS_EXPIRY,
        LIST_QUICKLIST_2 => QUICKLIST_2,
        STREAM_LISTPACKS => STREAM_V1,
        STREAM_LISTPACKS_2 => STREAM_V2,
        STREAM_LISTPACKS_3 => STREAM_V3,
        MODULE_PRE_GA | MODULE_2 => return Err(RdbError::ModuleData { offset }),
        _ => return Err(RdbError::UnknownType { byte: t, offset }),
    })
}

#[derive(Debug, Clone, Copy)]
struct Frame {
    prog: &'static [Op],
    pc: usize,
    /// Runs of `prog` left, the current one included.
    left: u64,
}

/// A value's walk: where it stands, resumable.
#[derive(Debug, Default)]
pub(super) struct Walk {
    stack: Vec<Frame>,
    /// Slice position after the last completed read.
    pub(super) at: usize,
}

impl Walk {
    /// Starts walking `prog` at slice position `at`.
    pub(super) fn start(&mut self, prog: &'static [Op], at: usize) {
        self.stack.clear();
        self.stack.push(Frame {
            prog,
            pc: 0,
            left: 1,
        });
        self.at = at;
    }

    /// Walks on through `data` (whose first byte is at stream offset `base`) from where it
    /// stopped. `Ok` once the value ends (at `self.at`); `Stop::More` leaves the walk ready to
    /// resume on a longer slice.
    pub(super) fn run(&mut self, data: &[u8], base: u64) -> Result<(), Stop> {
        let mut c = Cursor::new(data, self.at, base);
        while let Some(top) = self.stack.last_mut() {
            let Some(&op) = top.prog.get(top.pc) else {
                top.left -= 1;
                if top.left == 0 {
                    self.stack.pop();
                } else {
                    top.pc = 0;
                }
                continue;
            };
            match op {
                Str => c.skip_string()?,
                Len => {
                    c.len()?;
                }
                Fixed(n) => c.skip(u64::from(n))?,
                TextDouble => c.skip_text_double()?,
                Repeat(body) => {
                    let n = c.len()?;
                    top.pc += 1;
                    self.at = c.pos();
                    if n > 0 {
                        self.stack.push(Frame {
                            prog: body,
                            pc: 0,
                            left: n,
                        });
                    }
                    continue;
                }
            }
            top.pc += 1;
            self.at = c.pos();
        }
        Ok(())
    }
}
