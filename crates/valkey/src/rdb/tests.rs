use std::collections::BTreeSet;

use proptest::prelude::*;

use super::cursor::{Cursor, Len, Stop, lzf_decompress};
use super::*;

/// RDBs written by real servers (see `write_rdb_fixtures` in
/// `tests/real_valkey_rdb_records.rs`), and each server's `DUMP` of every key.
const VALKEY9_RDB: &[u8] = include_bytes!("testdata/valkey-9.1.rdb");
const VALKEY9_DUMPS: &[u8] = include_bytes!("testdata/valkey-9.1.dumps");
const VALKEY8_RDB: &[u8] = include_bytes!("testdata/valkey-8.0.rdb");
const VALKEY8_DUMPS: &[u8] = include_bytes!("testdata/valkey-8.0.dumps");
/// Saved by a 9.1 primary importing slot 15495 (atomic slot migration), 450 of its 3000 keys
/// received.
const VALKEY9_SLOT_IMPORT_RDB: &[u8] = include_bytes!("testdata/valkey-9.1-slot-import.rdb");

/// The library the fixtures' servers loaded.
const LIBRARY: &str = "#!lua name=rdblib\n\
    -- a library restored from an RDB: this comment is long enough, and repetitive enough,\n\
    -- to be LZF-compressed in the RDB, repetitive enough, repetitive enough, repetitive.\n\
    server.register_function('rdb_echo', function(keys, args) return args[1] end)\n";

/// (db, key, payload) of a `.dumps` fixture.
fn parse_dumps(mut d: &[u8]) -> Vec<(u64, Vec<u8>, Vec<u8>)> {
    fn take<'a>(d: &mut &'a [u8], n: usize) -> &'a [u8] {
        let (a, b) = d.split_at(n);
        *d = b;
        a
    }
    let mut out = Vec::new();
    while !d.is_empty() {
        let db = u64::from_le_bytes(take(&mut d, 8).try_into().unwrap());
        let mut field = || {
            let n = u32::from_le_bytes(take(&mut d, 4).try_into().unwrap()) as usize;
            take(&mut d, n).to_vec()
        };
        let key = field();
        let payload = field();
        out.push((db, key, payload));
    }
    out
}

/// Every item and the summary (or the error) of `rdb` fed in pieces of the given sizes
/// (cycled).
fn split(rdb: &[u8], sizes: &[usize]) -> Result<(Vec<Item>, Summary), RdbError> {
    let mut r = RecordReader::new();
    let mut items = Vec::new();
    let mut at = 0;
    for &n in sizes.iter().cycle() {
        if at >= rdb.len() {
            break;
        }
        let end = (at + n.max(1)).min(rdb.len());
        r.feed(&rdb[at..end])?;
        at = end;
        items.extend(std::iter::from_fn(|| r.next_item()));
    }
    Ok((items, r.finish()?))
}

fn records(items: &[Item]) -> Vec<&Record> {
    items
        .iter()
        .filter_map(|i| match i {
            Item::Key(r) => Some(r),
            _ => None,
        })
        .collect()
}

// --- Building RDBs by hand -------------------------------------------------------------

/// An RDB length.
fn len(n: u64) -> Vec<u8> {
    if n < 64 {
        vec![n as u8]
    } else if n < 16384 {
        vec![0x40 | (n >> 8) as u8, n as u8]
    } else if n <= u64::from(u32::MAX) {
        let mut v = vec![0x80];
        v.extend_from_slice(&(n as u32).to_be_bytes());
        v
    } else {
        let mut v = vec![0x81];
        v.extend_from_slice(&n.to_be_bytes());
        v
    }
}

/// A plain RDB string.
fn s(b: impl AsRef<[u8]>) -> Vec<u8> {
    let b = b.as_ref();
    let mut v = len(b.len() as u64);
    v.extend_from_slice(b);
    v
}

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

/// A whole RDB: `header`, `body`, EOF and checksum.
fn rdb_with(header: &[u8], body: &[u8]) -> Vec<u8> {
    let mut v = cat(&[header, body, &[0xFF]]);
    let crc = CRC64.checksum(&v);
    v.extend_from_slice(&crc.to_le_bytes());
    v
}

fn rdb9(body: &[u8]) -> Vec<u8> {
    rdb_with(b"VALKEY080", body)
}

/// A key record: type, key, value.
fn key(t: u8, k: &str, value: &[u8]) -> Vec<u8> {
    cat(&[&[t], &s(k), value])
}

/// The single record of a one-key RDB, checking its payload wraps `value`.
fn one_key(t: u8, value: &[u8]) -> Record {
    let rdb = rdb9(&cat(&[&[opcodes::SELECTDB, 0], &key(t, "k", value)]));
    let (items, summary) = split(&rdb, &[rdb.len()]).unwrap_or_else(|e| panic!("type {t}: {e}"));
    assert_eq!(summary.keys, 1);
    let [Item::Key(r)] = items.as_slice() else {
        panic!("{items:?}")
    };
    assert_eq!(r.payload, dump_payload(t, value, 80), "type {t}");
    assert_eq!(split_dump_payload(&r.payload), Some((t, value, 80)));
    r.clone()
}

// --- Primitives ------------------------------------------------------------------------

fn read<T>(data: &[u8], f: impl FnOnce(&mut Cursor<'_>) -> Result<T, Stop>) -> Result<T, Stop> {
    let mut c = Cursor::new(data, 0, 100);
    let v = f(&mut c)?;
    assert_eq!(c.pos(), data.len(), "all of {data:?} read");
    Ok(v)
}

#[test]
fn lengths_in_every_width() {
    for n in [
        0,
        1,
        63,
        64,
        300,
        16383,
        16384,
        1 << 31,
        u64::from(u32::MAX),
        1 << 40,
    ] {
        let enc = len(n);
        assert_eq!(read(&enc, |c| c.len()).unwrap(), n, "{enc:?}");
        // Each prefix is incomplete, and says how long the whole is.
        for cut in 0..enc.len() {
            match read(&enc[..cut], |c| c.len()) {
                Err(Stop::More(m)) => assert!(m > cut && m <= enc.len()),
                other => panic!("{n} cut at {cut}: {other:?}"),
            }
        }
    }
    assert!(matches!(
        read(&[0x82, 0, 0, 0, 0], |c| c.len()),
        Err(Stop::Bad(RdbError::BadLength {
            byte: 0x82,
            offset: 100
        }))
    ));
    assert!(matches!(
        read(&[0xC0], |c| c.len_or_encoding()),
        Ok(Len::Encoded(0))
    ));
    // A string encoding where a count belongs.
    assert!(matches!(
        read(&[0xC1], |c| c.len()),
        Err(Stop::Bad(RdbError::BadLength { byte: 0xC1, .. }))
    ));
}

#[test]
fn strings_in_every_encoding() {
    let cases: &[(&[u8], &[u8])] = &[
        (b"\x00", b""),
        (b"\x03abc", b"abc"),
        (b"\xC0\xFB", b"-5"),
        (b"\xC0\x7F", b"127"),
        (b"\xC1\xE8\x03", b"1000"),
        (b"\xC1\x00\x80", b"-32768"),
        (b"\xC2\x60\x79\xFE\xFF", b"-100000"),
        (b"\xC2\xFF\xFF\xFF\x7F", b"2147483647"),
        // LZF: literal "abc", then a back reference of 7 bytes at distance 3.
        (b"\xC3\x06\x0A\x02abc\xA0\x02", b"abcabcabca"),
    ];
    for (enc, want) in cases {
        assert_eq!(read(enc, |c| c.string()).unwrap(), *want, "{enc:?}");
        read(enc, |c| c.skip_string()).unwrap();
        for cut in 0..enc.len() {
            assert!(
                matches!(read(&enc[..cut], |c| c.string()), Err(Stop::More(_))),
                "{enc:?} cut at {cut}"
            );
        }
    }
    let long = vec![b'x'; 20_000];
    assert_eq!(read(&s(&long), |c| c.string()).unwrap(), long);
    assert!(matches!(
        read(b"\xC4", |c| c.skip_string()),
        Err(Stop::Bad(RdbError::BadStringEncoding {
            encoding: 4,
            offset: 100
        }))
    ));
    // An LZF string that does not decompress to its stated length.
    assert!(matches!(
        read(b"\xC3\x04\x09\x02abc", |c| c.string()),
        Err(Stop::Bad(RdbError::BadLzf { offset: 100 }))
    ));
    // Skipping does not decompress.
    read(b"\xC3\x04\x09\x02abc", |c| c.skip_string()).unwrap();
    // Text doubles of the old sorted set: NaN, +inf, -inf have no text.
    for enc in [&b"\xFD"[..], b"\xFE", b"\xFF", b"\x031.5"] {
        read(enc, |c| c.skip_text_double()).unwrap();
    }
}

#[test]
fn lzf_back_references() {
    // A long back reference (7 + extra length byte) that overlaps what it copies.
    let input = b"\x00a\xE0\x0A\x00";
    assert_eq!(lzf_decompress(input, 20).unwrap(), vec![b'a'; 20]);
    // Wrong lengths, a distance before the start, a cut literal.
    assert_eq!(lzf_decompress(input, 19), None);
    assert_eq!(lzf_decompress(input, 21), None);
    assert_eq!(lzf_decompress(b"\x00a\x20\x05", 4), None);
    assert_eq!(lzf_decompress(b"\x05ab", 6), None);
}

// --- Value types -----------------------------------------------------------------------

#[test]
fn every_value_type_is_copied_whole() {
    let strings = |n: u64| {
        cat(&[
            &len(n),
            &(0..n).flat_map(|i| s(format!("e{i}"))).collect::<Vec<_>>(),
        ])
    };
    let blob = s(b"\x0b\x00\x00\x00\x01\x00\x81a\x02\xff");
    let cases: Vec<(u8, Vec<u8>)> = vec![
        (types::STRING, s("value")),
        (types::STRING, b"\xC2\x01\x02\x03\x04".to_vec()),
        (types::STRING, b"\xC3\x06\x0A\x02abc\xA0\x02".to_vec()),
        (types::LIST, strings(3)),
        (types::SET, strings(70)),
        (types::LIST_QUICKLIST, cat(&[&len(2), &blob, &blob])),
        // Old sorted set: member, text score (1.5, NaN, +inf, -inf).
        (
            types::ZSET,
            cat(&[
                &len(4),
                &s("a"),
                b"\x031.5",
                &s("b"),
                b"\xFD",
                &s("c"),
                b"\xFE",
                &s("d"),
                b"\xFF",
            ]),
        ),
        (
            types::ZSET_2,
            cat(&[
                &len(2),
                &s("a"),
                &1.5f64.to_le_bytes(),
                b"\xC0\x05",
                &2f64.to_le_bytes(),
            ]),
        ),
        (
            types::HASH,
            cat(&[&len(2), &s("f"), &s("v"), &s("g"), b"\xC0\x01"]),
        ),
        (
            types::HASH_2,
            cat(&[
                &len(2),
                &s("f"),
                &s("v"),
                &(-1i64).to_le_bytes(),
                &s("g"),
                b"\xC0\x01",
                &1_900_000_000_000i64.to_le_bytes(),
            ]),
        ),
        // Quicklist 2: a packed (2) and a plain (1) node.
        (
            types::LIST_QUICKLIST_2,
            cat(&[&len(2), &[2], &blob, &[1], &s("plain")]),
        ),
    ];
    let mut cases = cases;
    for t in [
        types::HASH_ZIPMAP,
        types::LIST_ZIPLIST,
        types::SET_INTSET,
        types::ZSET_ZIPLIST,
        types::HASH_ZIPLIST,
        types::HASH_LISTPACK,
        types::ZSET_LISTPACK,
        types::SET_LISTPACK,
    ] {
        cases.push((t, blob.clone()));
    }
    for (t, value) in &cases {
        one_key(*t, value);
    }
    // Empty collections.
    for t in [
        types::LIST,
        types::SET,
        types::ZSET,
        types::ZSET_2,
        types::HASH,
        types::HASH_2,
    ] {
        one_key(t, &len(0));
    }
}

/// A stream value of type `t` (15, 19 or 21) with two listpacks, a group with two pending
/// entries, consumers with and without pending entries.
fn stream(t: u8) -> Vec<u8> {
    let id = |ms: u64, seq: u64| cat(&[&ms.to_be_bytes(), &seq.to_be_bytes()]);
    let mut v = len(2);
    for ms in [1u64, 5] {
        v.extend(s(id(ms, 0)));
        v.extend(s(b"\x0f\x00\x00\x00\x02\x00\x01\x01\x01\x01\xff"));
    }
    // Length, last ID.
    v.extend(cat(&[&len(7), &len(9), &len(1)]));
    if t != types::STREAM_LISTPACKS {
        // First ID, max deleted ID, entries added.
        v.extend(cat(&[&len(1), &len(0), &len(4), &len(0), &len(8)]));
    }
    v.extend(len(2));
    for (g, pending) in [("g1", 2u64), ("g2", 0)] {
        v.extend(cat(&[&s(g), &len(9), &len(1)]));
        if t != types::STREAM_LISTPACKS {
            v.extend(len(7)); // entries read
        }
        v.extend(len(pending));
        for i in 0..pending {
            v.extend(cat(&[
                &id(1, i),
                &1_700_000_000_000i64.to_le_bytes(),
                &len(3),
            ]));
        }
        let consumers: &[(&str, u64)] = if pending > 0 {
            &[("alice", 2), ("bob", 0)]
        } else {
            &[]
        };
        v.extend(len(consumers.len() as u64));
        for (name, n) in consumers {
            v.extend(cat(&[&s(name), &1_700_000_000_001i64.to_le_bytes()]));
            if t == types::STREAM_LISTPACKS_3 {
                v.extend(1_700_000_000_002i64.to_le_bytes());
            }
            v.extend(len(*n));
            for i in 0..*n {
                v.extend(id(1, i));
            }
        }
    }
    v
}

#[test]
fn streams_of_every_version() {
    for t in [
        types::STREAM_LISTPACKS,
        types::STREAM_LISTPACKS_2,
        types::STREAM_LISTPACKS_3,
    ] {
        let value = stream(t);
        one_key(t, &value);
        // Read as another version, the layout does not fit: the walk ends elsewhere.
        let other = if t == types::STREAM_LISTPACKS_3 {
            types::STREAM_LISTPACKS_2
        } else {
            types::STREAM_LISTPACKS_3
        };
        let rdb = rdb9(&key(other, "k", &value));
        let r = split(&rdb, &[rdb.len()]);
        assert!(
            !matches!(&r, Ok((items, _)) if records(items)[0].payload == dump_payload(other, &value, 80)),
            "{t} read as {other}: {r:?}"
        );
    }
}

#[test]
fn module_and_unknown_types_are_errors_naming_byte_and_offset() {
    let header = 9u64;
    for (t, want) in [
        (types::MODULE_2, RdbError::ModuleData { offset: header }),
        (
            types::MODULE_PRE_GA,
            RdbError::ModuleData { offset: header },
        ),
        (
            8,
            RdbError::UnknownType {
                byte: 8,
                offset: header,
            },
        ),
        (
            23,
            RdbError::UnknownType {
                byte: 23,
                offset: header,
            },
        ),
        (
            0xF0,
            RdbError::UnknownType {
                byte: 0xF0,
                offset: header,
            },
        ),
    ] {
        let rdb = rdb9(&key(t, "k", b"\x00"));
        assert_eq!(split(&rdb, &[3]).unwrap_err(), want);
    }
    let e = split(&rdb9(&[0x17]), &[100]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "unknown RDB opcode or value type 0x17 at offset 9"
    );
    let e = split(&rdb9(&cat(&[&[opcodes::MODULE_AUX], &len(1)])), &[100]).unwrap_err();
    assert_eq!(e, RdbError::ModuleData { offset: 9 });
    assert!(e.to_string().contains("cannot be restored"), "{e}");
    let e = split(&rdb9(&[opcodes::FUNCTION_PRE_GA]), &[100]).unwrap_err();
    assert_eq!(e, RdbError::PreGaFunctions { offset: 9 });
}

// --- Opcodes ---------------------------------------------------------------------------

#[test]
fn opcodes_set_database_expiry_and_lru_lfu() {
    let body = cat(&[
        &[opcodes::AUX],
        &s("valkey-ver"),
        &s("9.1.2"),
        &[opcodes::AUX],
        &s("redis-bits"),
        b"\xC0\x40",
        &[opcodes::FUNCTION2],
        &s("#!lua name=x\n"),
        &[opcodes::SELECTDB],
        &len(0),
        &[opcodes::RESIZEDB],
        &len(2),
        &len(1),
        &[opcodes::AUX],
        &s("slot-info"),
        &s("12182,2,0,0"),
        &[opcodes::EXPIRETIME_MS],
        &1_900_000_000_123i64.to_le_bytes(),
        &[opcodes::FREQ, 7],
        &key(types::STRING, "a", &s("1")),
        &[opcodes::SLOT_INFO],
        &len(5),
        &len(1),
        &len(0),
        &[opcodes::SELECTDB],
        &len(300),
        &[opcodes::EXPIRETIME],
        &1_900_000_000i32.to_le_bytes(),
        &[opcodes::IDLE],
        &len(100_000),
        &key(types::STRING, "b", &s("2")),
        &key(types::STRING, "c", &s("3")),
    ]);
    let rdb = rdb_with(b"REDIS0011", &body);
    let (items, summary) = split(&rdb, &[1]).unwrap();
    assert_eq!(items[0], Item::Function(b"#!lua name=x\n".to_vec()));
    let r = records(&items);
    assert_eq!(r.len(), 3);
    assert_eq!(
        (
            r[0].db,
            &r[0].key[..],
            r[0].expire_at_ms,
            r[0].lfu_freq,
            r[0].idle_secs
        ),
        (0, &b"a"[..], Some(1_900_000_000_123), Some(7), None)
    );
    // The record starts at its first attribute opcode.
    assert_eq!(rdb[r[0].offset as usize], opcodes::EXPIRETIME_MS);
    assert_eq!(
        (
            r[1].db,
            &r[1].key[..],
            r[1].expire_at_ms,
            r[1].lfu_freq,
            r[1].idle_secs
        ),
        (300, &b"b"[..], Some(1_900_000_000_000), None, Some(100_000))
    );
    // Attributes belong to one key only.
    assert_eq!(
        (r[2].db, r[2].expire_at_ms, r[2].idle_secs),
        (300, None, None)
    );
    assert_eq!(rdb[r[2].offset as usize], types::STRING);
    // Version 11: the payloads say so.
    assert_eq!(
        split_dump_payload(&r[0].payload),
        Some((0, &b"\x011"[..], 11))
    );
    assert_eq!(summary.magic, RdbMagic::Redis);
    assert_eq!(summary.version, 11);
    assert_eq!(summary.server_version(), Some("9.1.2"));
    assert_eq!(summary.aux["redis-bits"], "64");
    assert_eq!(summary.slot_info_fields, 1);
    assert_eq!(summary.keys, 3);
    assert_eq!(summary.keys_with_ttl, 2);
    assert_eq!(summary.keys_per_db, BTreeMap::from([(0, 1), (300, 2)]));
    assert_eq!(summary.db_size_hints, BTreeMap::from([(0, (2, 1))]));
    assert_eq!(summary.functions, 1);
    assert_eq!(summary.bytes, rdb.len() as u64);
}

#[test]
fn slot_imports_are_items() {
    let body = cat(&[
        &[opcodes::SLOT_IMPORT],
        &s("a".repeat(40)),
        &len(2),
        &len(0),
        &len(100),
        &len(16000),
        &len(16383),
        &key(types::STRING, "k", &s("v")),
    ]);
    let rdb = rdb9(&body);
    let (items, summary) = split(&rdb, &[2]).unwrap();
    assert_eq!(
        items[0],
        Item::SlotImport(SlotImport {
            job: vec![b'a'; 40],
            ranges: vec![
                SlotRange::new(0, 100).unwrap(),
                SlotRange::new(16000, 16383).unwrap()
            ],
        })
    );
    assert_eq!(summary.slot_imports, 1);
    let bad = rdb9(&cat(&[
        &[opcodes::SLOT_IMPORT],
        &s("j"),
        &len(1),
        &len(5),
        &len(16384),
    ]));
    assert_eq!(
        split(&bad, &[100]).unwrap_err(),
        RdbError::BadSlotRange {
            start: 5,
            end: 16384,
            offset: 9
        }
    );
}

// --- Stream ends, headers, checksums ----------------------------------------------------

#[test]
fn stream_must_end_with_eof_and_a_matching_checksum() {
    let rdb = rdb9(&key(types::STRING, "k", &s("v")));
    // Every proper prefix is truncated.
    for cut in 0..rdb.len() {
        let e = split(&rdb[..cut], &[5]).unwrap_err();
        assert!(
            matches!(e, RdbError::Truncated { offset, .. } if offset == cut as u64),
            "{cut}: {e}"
        );
    }
    let e = split(&rdb[..12], &[100]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "RDB stream ended at offset 12 before its EOF opcode and checksum (in a key's value)"
    );
    // A wrong checksum; none (rdbchecksum no) is accepted.
    let mut bad = rdb.clone();
    *bad.last_mut().unwrap() ^= 1;
    assert!(matches!(
        split(&bad, &[100]).unwrap_err(),
        RdbError::Checksum { .. }
    ));
    let mut none = rdb.clone();
    let n = none.len();
    none[n - 8..].fill(0);
    assert_eq!(split(&none, &[100]).unwrap().1.checksum, 0);
    // Bytes after the checksum, in the same chunk or a later one.
    let mut extra = rdb.clone();
    extra.push(0);
    for sizes in [&[100][..], &[rdb.len()]] {
        assert_eq!(
            split(&extra, sizes).unwrap_err(),
            RdbError::TrailingData {
                offset: rdb.len() as u64,
                len: 1
            }
        );
    }
    // Errors stick.
    let mut r = RecordReader::new();
    assert!(r.feed(&bad).is_err());
    assert!(matches!(r.feed(b"x"), Err(RdbError::Checksum { .. })));
    assert!(r.next_item().is_none());
    assert!(matches!(r.finish(), Err(RdbError::Checksum { .. })));
}

#[test]
fn headers() {
    for (h, ok) in [
        (&b"REDIS0011"[..], true),
        (b"REDIS0009", true),
        (b"VALKEY080", true),
        (b"VALKEY081", true),
        (b"REDIS0012", false),
        (b"REDIS0080", false),
        (b"VALKEY011", false),
        (b"REDIS0000", false),
    ] {
        let r = split(&rdb_with(h, &[]), &[4]);
        assert_eq!(r.is_ok(), ok, "{h:?}: {r:?}");
    }
    assert!(matches!(
        split(&rdb_with(b"VALKEY011", &[]), &[4]).unwrap_err(),
        RdbError::UnsupportedVersion {
            magic: RdbMagic::Valkey,
            version: 11
        }
    ));
    assert!(matches!(
        split(b"HTTP/1.1 200 OK\r\n", &[4]).unwrap_err(),
        RdbError::BadHeader(_)
    ));
    let mut r = RecordReader::new();
    r.feed(b"VALKEY0").unwrap();
    assert_eq!(r.header(), None);
    r.feed(b"80").unwrap();
    assert_eq!(r.header(), Some((RdbMagic::Valkey, 80)));
}

/// One huge list fed a byte at a time: the walk resumes where it stopped, so this takes
/// linear time (walking from the value's start on each byte would take hours).
#[test]
fn large_values_are_walked_once() {
    let n = 300_000u64;
    let value: Vec<u8> = cat(&[
        &len(n),
        &(0..n)
            .flat_map(|i| s(format!("{i:06}")))
            .collect::<Vec<_>>(),
    ]);
    let rdb = rdb9(&key(types::LIST, "big", &value));
    let mut r = RecordReader::new();
    for b in rdb.chunks(1) {
        r.feed(b).unwrap();
    }
    let Some(Item::Key(rec)) = r.next_item() else {
        panic!("no key")
    };
    assert_eq!(rec.payload, dump_payload(types::LIST, &value, 80));
    assert!(r.buffered() == 0);
    r.finish().unwrap();
}

// --- Real RDBs -------------------------------------------------------------------------

/// A fixture's items, checked against its server's `DUMP`s.
fn check_fixture(rdb: &[u8], dumps: &[u8], version: u32) -> (Vec<Item>, Summary) {
    let (items, summary) = split(rdb, &[rdb.len()]).unwrap();
    assert_eq!(summary.version, version);
    let dumps = parse_dumps(dumps);
    let recs = records(&items);
    assert_eq!(recs.len(), dumps.len());
    for (r, (db, key, payload)) in recs.iter().zip(&dumps) {
        assert_eq!((r.db, &r.key), (*db, key));
        assert_eq!(
            &r.payload,
            payload,
            "{} (type {}) differs from the server's DUMP",
            r.key.escape_ascii(),
            r.rdb_type
        );
    }
    assert_eq!(
        items.iter().find(|i| matches!(i, Item::Function(_))),
        Some(&Item::Function(LIBRARY.as_bytes().to_vec()))
    );
    assert_eq!(summary.keys, dumps.len() as u64);
    assert_eq!(summary.functions, 1);
    assert!(summary.keys_with_ttl > 5);
    (items, summary)
}

#[test]
fn valkey9_rdb_matches_its_dumps() {
    let (items, summary) = check_fixture(VALKEY9_RDB, VALKEY9_DUMPS, 80);
    assert_eq!(summary.magic, RdbMagic::Valkey);
    assert!(summary.server_version().unwrap().starts_with("9.1."));
    let recs = records(&items);
    let seen: BTreeSet<u8> = recs.iter().map(|r| r.rdb_type).collect();
    assert!(seen.is_superset(&BTreeSet::from([
        types::STRING,
        types::SET,
        types::ZSET_2,
        types::HASH,
        types::SET_INTSET,
        types::HASH_LISTPACK,
        types::ZSET_LISTPACK,
        types::LIST_QUICKLIST_2,
        types::SET_LISTPACK,
        types::STREAM_LISTPACKS_3,
        types::HASH_2,
    ])));
    assert_eq!(
        summary.keys_per_db.keys().copied().collect::<Vec<_>>(),
        [0, 3, 5]
    );
    // LFU policy: every key has its counter.
    assert!(
        recs.iter()
            .all(|r| r.lfu_freq.is_some() && r.idle_secs.is_none())
    );
    let int_key = recs.iter().find(|r| r.key == b"12345").unwrap();
    assert_eq!(int_key.rdb_type, types::STRING);
    assert!(recs.iter().any(|r| r.key == "k".repeat(80).as_bytes()));
}

#[test]
fn valkey8_rdb_matches_its_dumps() {
    let (items, summary) = check_fixture(VALKEY8_RDB, VALKEY8_DUMPS, 11);
    assert_eq!(summary.magic, RdbMagic::Redis);
    assert!(summary.server_version().unwrap().starts_with("8.0."));
    // LRU policy: every key has its idle time.
    assert!(
        records(&items)
            .iter()
            .all(|r| r.idle_secs.is_some() && r.lfu_freq.is_none())
    );
}

#[test]
fn valkey9_rdb_saved_mid_slot_import() {
    let (items, summary) = split(VALKEY9_SLOT_IMPORT_RDB, &[7]).unwrap();
    let Item::SlotImport(import) = &items[0] else {
        panic!("{:?}", items[0])
    };
    assert_eq!(import.job, b"2962ed2f337dea6ea13bd63c4ff3ab9ced6ccc94");
    assert_eq!(import.ranges, [SlotRange::single(15495).unwrap()]);
    assert_eq!(summary.slot_imports, 1);
    assert_eq!(summary.keys, 450);
    assert!(records(&items).iter().all(|r| r.slot() == 15495));
}

/// For each item of `rdb`, the shortest prefix that yields it (fed a byte at a time).
fn first_available(rdb: &[u8]) -> Vec<usize> {
    let mut r = RecordReader::new();
    let mut at = Vec::new();
    for (i, b) in rdb.chunks(1).enumerate() {
        r.feed(b).unwrap();
        while r.next_item().is_some() {
            at.push(i + 1);
        }
    }
    at
}

/// A fixture's items, summary, and when each item is available (see [`first_available`]).
type Split = (Vec<Item>, Summary, Vec<usize>);

fn fixture(nine: bool) -> &'static Split {
    static CACHE: std::sync::OnceLock<[Split; 2]> = std::sync::OnceLock::new();
    let all = CACHE.get_or_init(|| {
        [VALKEY8_RDB, VALKEY9_RDB].map(|rdb| {
            let (items, summary) = split(rdb, &[rdb.len()]).unwrap();
            (items, summary, first_available(rdb))
        })
    });
    &all[usize::from(nine)]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Any chunking gives the same items and summary, and each item is available right after
    /// the feed that completes it.
    #[test]
    fn chunking_does_not_matter(
        sizes in prop::collection::vec(prop_oneof![1usize..16, 1usize..600, 1usize..70_000], 1..40),
        nine in any::<bool>(),
    ) {
        let rdb = if nine { VALKEY9_RDB } else { VALKEY8_RDB };
        let (items, summary, available_at) = fixture(nine);
        let mut r = RecordReader::new();
        let mut got = Vec::new();
        let mut at = 0usize;
        for &n in sizes.iter().cycle() {
            if at >= rdb.len() {
                break;
            }
            let start = at;
            at = (at + n).min(rdb.len());
            r.feed(&rdb[start..at]).unwrap();
            got.extend(std::iter::from_fn(|| r.next_item()));
            let due = available_at.iter().take_while(|&&a| a <= at).count();
            prop_assert_eq!(got.len(), due, "after {} bytes", at);
        }
        prop_assert_eq!(&got, items);
        prop_assert_eq!(&r.finish().unwrap(), summary);
    }
}
