//! Small helpers to read RESP2/RESP3 [`redis::Value`] trees.

use redis::Value;

use crate::error::ParseError;

/// The text of a string-like value (bulk, simple, verbatim) or the decimal form of an integer.
pub fn as_string(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        Value::Okay => Some("OK".to_owned()),
        Value::Int(i) => Some(i.to_string()),
        Value::Attribute { data, .. } => as_string(data),
        _ => None,
    }
}

/// An integer, also accepted as a decimal string (RESP2 servers sometimes send numbers as strings).
pub fn as_i64(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        Value::Attribute { data, .. } => as_i64(data),
        other => as_string(other).and_then(|s| s.trim().parse().ok()),
    }
}

/// The elements of an array or set.
pub fn as_array(v: &Value) -> Option<&[Value]> {
    match v {
        Value::Array(a) | Value::Set(a) => Some(a),
        Value::Attribute { data, .. } => as_array(data),
        _ => None,
    }
}

/// Key/value pairs of a RESP3 map or of a RESP2 flat array `[k1, v1, k2, v2, …]`.
pub fn as_pairs(v: &Value) -> Option<Vec<(String, &Value)>> {
    match v {
        Value::Map(m) => m.iter().map(|(k, v)| Some((as_string(k)?, v))).collect(),
        Value::Array(a) if a.len().is_multiple_of(2) => a
            .chunks_exact(2)
            .map(|kv| Some((as_string(&kv[0])?, &kv[1])))
            .collect(),
        Value::Attribute { data, .. } => as_pairs(data),
        _ => None,
    }
}

/// Looks up `key` in a list of pairs.
pub fn lookup<'a>(pairs: &[(String, &'a Value)], key: &str) -> Option<&'a Value> {
    pairs.iter().find(|(k, _)| k == key).map(|(_, v)| *v)
}

/// A required string field.
pub fn req_string(pairs: &[(String, &Value)], key: &str) -> Result<String, ParseError> {
    let v = lookup(pairs, key).ok_or_else(|| ParseError::MissingField(key.to_owned()))?;
    as_string(v).ok_or_else(|| ParseError::field(key, format!("{v:?}")))
}

/// An optional string field (`Nil` counts as absent).
pub fn opt_string(pairs: &[(String, &Value)], key: &str) -> Option<String> {
    lookup(pairs, key).and_then(as_string)
}

/// An optional integer field; present but not an integer is an error.
pub fn opt_i64(pairs: &[(String, &Value)], key: &str) -> Result<Option<i64>, ParseError> {
    match lookup(pairs, key) {
        None | Some(Value::Nil) => Ok(None),
        Some(v) => as_i64(v)
            .map(Some)
            .ok_or_else(|| ParseError::field(key, format!("{v:?}"))),
    }
}

/// Turns a `ServerError` reply into a parse error instead of silently reading nothing.
pub fn reject_error(v: &Value) -> Result<(), ParseError> {
    if let Value::ServerError(e) = v {
        return Err(ParseError::UnexpectedReply(format!("server error: {e:?}")));
    }
    Ok(())
}
