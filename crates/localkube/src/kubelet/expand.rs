//! `$(VAR)` expansion exactly as Kubernetes defines it
//! (`third_party/forked/golang/expansion`): `$(NAME)` is replaced by the
//! variable's value when it is defined, `$$` is an escaped `$`, and anything
//! else (an unknown variable, an unterminated `$(`, a lone `$`) stays literal.

/// Expands `$(VAR)` references in `input`, looking names up with `lookup`.
/// Unresolved references are kept verbatim (`$(NAME)`).
pub fn expand(input: &str, lookup: impl Fn(&str) -> Option<String>) -> String {
    let bytes = input.as_bytes();
    let mut out: Vec<u8> = Vec::with_capacity(bytes.len());
    let mut checkpoint = 0;
    let mut cursor = 0;
    while cursor < bytes.len() {
        if bytes[cursor] == b'$' && cursor + 1 < bytes.len() {
            out.extend_from_slice(&bytes[checkpoint..cursor]);
            let rest = &bytes[cursor + 1..];
            let advance = match rest[0] {
                b'$' => {
                    out.push(b'$');
                    1
                }
                b'(' => match rest.iter().position(|&b| b == b')') {
                    Some(close) => {
                        // `rest[1..close]` lies between ASCII delimiters, so it is valid UTF-8.
                        let name = String::from_utf8_lossy(&rest[1..close]);
                        match lookup(&name) {
                            Some(value) => out.extend_from_slice(value.as_bytes()),
                            None => {
                                out.extend_from_slice(b"$(");
                                out.extend_from_slice(name.as_bytes());
                                out.push(b')');
                            }
                        }
                        close + 1
                    }
                    None => {
                        out.extend_from_slice(b"$(");
                        1
                    }
                },
                other => {
                    out.push(b'$');
                    out.push(other);
                    1
                }
            };
            cursor += advance;
            checkpoint = cursor + 1;
        }
        cursor += 1;
    }
    out.extend_from_slice(&bytes[checkpoint.min(bytes.len())..]);
    String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// Looks a name up in several maps in order (the kubelet's `MappingFuncFor`).
pub fn lookup_in<'a>(
    maps: &'a [&'a std::collections::BTreeMap<String, String>],
) -> impl Fn(&str) -> Option<String> + 'a {
    move |name| maps.iter().find_map(|m| m.get(name).cloned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn vars() -> BTreeMap<String, String> {
        [
            ("VAR_A", "A"),
            ("VAR_B", "B"),
            ("VAR_C", "C"),
            ("VAR_REF", "$(VAR_A)"),
            ("VAR_EMPTY", ""),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }

    fn ex(input: &str) -> String {
        let v = vars();
        expand(input, |n| v.get(n).cloned())
    }

    // Cases from Kubernetes' expansion_test.go (TestMapReference / TestMapping).
    #[test]
    fn kubernetes_cases() {
        let cases = [
            ("$(VAR_A)", "A"),
            ("___$(VAR_B)___", "___B___"),
            ("$(VAR_C)$(VAR_A)", "CA"),
            ("$(VAR_A)-1", "A-1"),
            ("$(VAR_A)_$(VAR_B)_$(VAR_C)", "A_B_C"),
            ("$$(VAR_B)_$(VAR_A)", "$(VAR_B)_A"),
            ("$$(VAR_A)$$(VAR_B)", "$(VAR_A)$(VAR_B)"),
            ("f000-$$VAR_A", "f000-$VAR_A"),
            ("foo\\$(VAR_C)bar", "foo\\Cbar"),
            ("foo\\\\$(VAR_C)bar", "foo\\\\Cbar"),
            ("foo\\\\\\\\$(VAR_A)bar", "foo\\\\\\\\Abar"),
            ("$(VAR_A$(VAR_B))", "$(VAR_A$(VAR_B))"),
            ("$(VAR_A$(VAR_B)", "$(VAR_A$(VAR_B)"),
            ("$(VAR_REF)", "$(VAR_A)"),
            ("foo$(VAR_EMPTY)bar", "foobar"),
            ("$(VAR_EMPTY)$(VAR_EMPTY)", ""),
            ("$(VAR_DNE)", "$(VAR_DNE)"),
            ("$(VAR_A)$(VAR_DNE)", "A$(VAR_DNE)"),
            ("$(VAR_A", "$(VAR_A"),
            ("$(VAR_A$(VAR_B)$(VAR_A)", "$(VAR_A$(VAR_B)A"),
            ("$(", "$("),
            ("$", "$"),
            ("$$", "$"),
            ("$$$", "$$"),
            ("$$$$", "$$"),
            ("$(VAR_A", "$(VAR_A"),
            ("$()", "$()"),
            ("$$$(VAR_A)", "$A"),
            ("$$$$(VAR_A)", "$$(VAR_A)"),
            ("$$$$$(VAR_A)", "$$A"),
            ("$VAR_A", "$VAR_A"),
            ("$_$(VAR_A)", "$_A"),
            ("$(VAR_A)$", "A$"),
            ("nothing", "nothing"),
            ("", ""),
            ("héllo $(VAR_A) wörld", "héllo A wörld"),
        ];
        for (input, want) in cases {
            assert_eq!(ex(input), want, "input {input:?}");
        }
    }

    #[test]
    fn lookup_order() {
        let a: BTreeMap<String, String> = [("X".to_string(), "1".to_string())].into();
        let b: BTreeMap<String, String> = [
            ("X".to_string(), "2".to_string()),
            ("Y".to_string(), "3".to_string()),
        ]
        .into();
        let maps = [&a, &b];
        assert_eq!(expand("$(X)$(Y)$(Z)", lookup_in(&maps)), "13$(Z)");
    }
}
