//! Messages that stay within the API's limits however large the cluster: lists are summarised
//! ("17 nodes: a, b, c, … and 14 more") and every text is clamped to its field's limit.

use std::fmt::Display;

/// The API's limit of an event's note (`events.k8s.io/v1`), in bytes.
pub const EVENT_NOTE_MAX: usize = 1024;
/// The API's limit of a condition's message, in bytes.
pub const CONDITION_MESSAGE_MAX: usize = 32 * 1024;
/// How many items a summarised list names.
pub const LISTED: usize = 8;

/// `items` joined with ", " when there are at most [`LISTED`]; otherwise the count and `noun`,
/// the first [`LISTED`] and how many more ("17 nodes: a, b, … and 9 more").
pub fn list<T: Display>(noun: &str, items: &[T]) -> String {
    let shown: Vec<String> = items.iter().take(LISTED).map(ToString::to_string).collect();
    if items.len() <= LISTED {
        return shown.join(", ");
    }
    format!(
        "{} {noun}: {}, … and {} more",
        items.len(),
        shown.join(", "),
        items.len() - LISTED
    )
}

/// `text` cut to at most `max` bytes at a character boundary, ending with "…" when cut.
pub fn clamp(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    const ELLIPSIS: &str = "…";
    let mut end = max.saturating_sub(ELLIPSIS.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{ELLIPSIS}", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_lists_are_joined_long_ones_summarised() {
        assert_eq!(list("nodes", &["a", "b"]), "a, b");
        let many: Vec<String> = (0..17).map(|i| format!("n{i}")).collect();
        assert_eq!(
            list("nodes", &many),
            "17 nodes: n0, n1, n2, n3, n4, n5, n6, n7, … and 9 more"
        );
    }

    #[test]
    fn clamping_keeps_characters_whole() {
        assert_eq!(clamp("abc", 3), "abc");
        assert_eq!(clamp("abcdef", 5), "ab…");
        let s = "é".repeat(600); // 1200 bytes
        let c = clamp(&s, EVENT_NOTE_MAX);
        assert!(c.len() <= EVENT_NOTE_MAX && c.ends_with('…'), "{}", c.len());
    }
}
