//! Enough PromQL and Prometheus text exposition to check that queries (alert rules, Grafana
//! dashboards) use only series that exist: the vector selectors of an expression, the series
//! of a `/metrics` body, and a check of one against the other.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

/// A vector selector of a PromQL expression: metric name and label matchers
/// `(label, operator, value)`.
#[derive(Debug)]
pub struct Selector {
    /// Metric name.
    pub name: String,
    /// Label matchers `(label, operator, value)`.
    pub matchers: Vec<(String, String, String)>,
}

/// Words of PromQL that are not metric names: binary operators, modifiers, aggregations.
const PROMQL_WORDS: [&str; 23] = [
    "and",
    "or",
    "unless",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "offset",
    "bool",
    "sum",
    "min",
    "max",
    "avg",
    "count",
    "stddev",
    "stdvar",
    "topk",
    "bottomk",
    "quantile",
    "count_values",
    "group",
];

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// Index of the character after the quoted string starting at `i`.
fn skip_string(c: &[char], i: usize) -> usize {
    let q = c[i];
    let mut j = i + 1;
    while j < c.len() && c[j] != q {
        j += if c[j] == '\\' { 2 } else { 1 };
    }
    j + 1
}

fn skip_space(c: &[char], mut i: usize) -> usize {
    while i < c.len() && c[i].is_whitespace() {
        i += 1;
    }
    i
}

/// The vector selectors of a PromQL expression (enough PromQL for alert rules and dashboards: functions,
/// aggregations with `by`/`without`, `on`/`ignoring`, `offset`, ranges, numbers, strings).
pub fn selectors(expr: &str) -> Vec<Selector> {
    let c: Vec<char> = expr.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < c.len() {
        let ch = c[i];
        if ch == '"' || ch == '\'' {
            i = skip_string(&c, i);
        } else if ch == '[' {
            while i < c.len() && c[i] != ']' {
                i += 1;
            }
            i += 1;
        } else if ch.is_ascii_digit() {
            while i < c.len() && (c[i].is_ascii_alphanumeric() || c[i] == '.') {
                i += 1;
            }
        } else if ch.is_ascii_alphabetic() || ch == '_' || ch == ':' {
            let start = i;
            while i < c.len() && is_ident(c[i]) {
                i += 1;
            }
            let word: String = c[start..i].iter().collect();
            let next = skip_space(&c, i);
            match word.as_str() {
                "by" | "without" | "on" | "ignoring" | "group_left" | "group_right" => {
                    if c.get(next) == Some(&'(') {
                        while i < c.len() && c[i] != ')' {
                            i += 1;
                        }
                        i += 1;
                    }
                }
                "offset" => {
                    i = next;
                    while i < c.len() && c[i].is_ascii_alphanumeric() {
                        i += 1;
                    }
                }
                w if PROMQL_WORDS.contains(&w) || c.get(next) == Some(&'(') => {}
                _ => {
                    let mut sel = Selector {
                        name: word,
                        matchers: Vec::new(),
                    };
                    if c.get(next) == Some(&'{') {
                        i = next + 1;
                        loop {
                            i = skip_space(&c, i);
                            if i >= c.len() || c[i] == '}' {
                                i += 1;
                                break;
                            }
                            if c[i] == ',' {
                                i += 1;
                                continue;
                            }
                            let l0 = i;
                            while i < c.len() && is_ident(c[i]) {
                                i += 1;
                            }
                            let label: String = c[l0..i].iter().collect();
                            i = skip_space(&c, i);
                            let o0 = i;
                            while i < c.len() && "=!~".contains(c[i]) {
                                i += 1;
                            }
                            let op: String = c[o0..i].iter().collect();
                            i = skip_space(&c, i);
                            let end = skip_string(&c, i);
                            let value: String = c[i + 1..end - 1].iter().collect();
                            i = end;
                            assert!(!label.is_empty() && !op.is_empty(), "bad matcher in {expr}");
                            sel.matchers.push((label, op, value));
                        }
                    }
                    out.push(sel);
                }
            }
        } else {
            i += 1;
        }
    }
    out
}

/// Metric name → label sets of the samples of a Prometheus text exposition.
pub type Samples = BTreeMap<String, Vec<BTreeMap<String, String>>>;

pub fn parse_exposition(text: &str, into: &mut Samples) {
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            // Families without samples yet still name their series.
            let mut w = rest.split_whitespace();
            if let (Some(name), Some(kind)) = (w.next(), w.next()) {
                let series: Vec<String> = match kind {
                    "counter" if !name.ends_with("_total") => vec![format!("{name}_total")],
                    "histogram" => ["_bucket", "_sum", "_count"]
                        .iter()
                        .map(|s| format!("{name}{s}"))
                        .collect(),
                    _ => vec![name.to_owned()],
                };
                for s in series {
                    into.entry(s).or_default();
                }
            }
            continue;
        }
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let c: Vec<char> = line.chars().collect();
        let end = c.iter().position(|&x| !is_ident(x)).unwrap_or(c.len());
        let name: String = c[..end].iter().collect();
        let mut labels = BTreeMap::new();
        if c.get(end) == Some(&'{') {
            let mut i = end + 1;
            while i < c.len() && c[i] != '}' {
                if c[i] == ',' {
                    i += 1;
                    continue;
                }
                let l0 = i;
                while c[i] != '=' {
                    i += 1;
                }
                let label: String = c[l0..i].iter().collect();
                let v_end = skip_string(&c, i + 1);
                labels.insert(label, c[i + 2..v_end - 1].iter().collect::<String>());
                i = v_end;
            }
        }
        into.entry(name).or_default().push(labels);
    }
}

/// Adds `labels` (target labels a scrape adds, e.g. `namespace`, `pod`) to every sample.
pub fn with_target_labels(samples: &mut Samples, labels: &BTreeMap<String, String>) {
    for series in samples.values_mut() {
        if series.is_empty() {
            series.push(BTreeMap::new());
        }
        for s in series.iter_mut() {
            for (k, v) in labels {
                s.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
    }
}

/// Merges `from` into `into`.
pub fn merge(into: &mut Samples, from: Samples) {
    for (name, series) in from {
        into.entry(name).or_default().extend(series);
    }
}

/// Checks one query against the series that exist: every selector names a series of
/// `samples`, every label a matcher uses occurs on that series, and every literal value an
/// `=` or `=~` (alternatives of plain words) matcher asks for occurs. Returns the metric names.
pub fn check_query(expr: &str, samples: &Samples) -> Result<Vec<String>, String> {
    let sels = selectors(expr);
    if sels.is_empty() {
        return Err(format!("no metric in {expr}"));
    }
    let mut used = Vec::new();
    for s in sels {
        let series = samples
            .get(&s.name)
            .ok_or_else(|| format!("{} is not exported (in {expr})", s.name))?;
        for (label, op, value) in &s.matchers {
            let seen: BTreeSet<&str> = series
                .iter()
                .filter_map(|l| l.get(label).map(String::as_str))
                .collect();
            if seen.is_empty() {
                return Err(format!("{} has no label {label} (in {expr})", s.name));
            }
            let literal = |v: &str| v.chars().all(|c| is_ident(c) || c == '-' || c == '.');
            let wanted: Vec<&str> = match op.as_str() {
                "=" => vec![value.as_str()],
                "=~" if value.split('|').all(literal) => value.split('|').collect(),
                _ => vec![],
            };
            if let Some(v) = wanted.into_iter().find(|v| !seen.contains(v)) {
                return Err(format!(
                    "{}{{{label}=\"{v}\"}} never occurs (values seen: {seen:?}; in {expr})",
                    s.name
                ));
            }
        }
        used.push(s.name);
    }
    Ok(used)
}

/// Grafana's interval variables, replaced by a duration PromQL accepts.
const GRAFANA_INTERVALS: [&str; 4] = ["$__rate_interval", "$__range", "$__interval", "$__auto"];

/// The expression with Grafana's interval variables replaced by `5m` and `$name`/`${name}`
/// by `vars[name]`.
pub fn substitute(expr: &str, vars: &BTreeMap<String, String>) -> String {
    let mut out = expr.to_owned();
    for v in GRAFANA_INTERVALS {
        out = out.replace(v, "5m");
    }
    for (k, v) in vars {
        out = out
            .replace(&format!("${{{k}}}"), v)
            .replace(&format!("${k}"), v);
    }
    out
}

/// The queries of a Grafana dashboard as `(where, PromQL)`: every target of every panel
/// (panels of collapsed rows included), and each `label_values(selector, label)` variable
/// query as the selector with `label!=""` added (the label must exist).
pub fn dashboard_queries(dashboard: &Value) -> Vec<(String, String)> {
    fn panels(list: &Value, out: &mut Vec<(String, String)>) {
        for p in list.as_array().into_iter().flatten() {
            let title = p["title"].as_str().unwrap_or("?");
            for t in p["targets"].as_array().into_iter().flatten() {
                if let Some(e) = t["expr"].as_str() {
                    out.push((format!("panel {title:?} {}", t["refId"]), e.to_owned()));
                }
            }
            panels(&p["panels"], out);
        }
    }
    let mut out = Vec::new();
    panels(&dashboard["panels"], &mut out);
    for v in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let q = v["query"]["query"].as_str().or(v["query"].as_str());
        let Some(args) = q.and_then(|q| q.strip_prefix("label_values(")?.strip_suffix(')')) else {
            continue;
        };
        let (sel, label) = args.rsplit_once(',').unwrap_or(("", args));
        let (sel, label) = (sel.trim(), label.trim());
        let query = match sel.strip_suffix('}') {
            Some(open) => format!("{open}, {label}!=\"\"}}"),
            None => format!("{sel}{{{label}!=\"\"}}"),
        };
        out.push((format!("variable {}", v["name"]), query));
    }
    out
}

/// The pod labels a PodMonitor's `relabelings` copy to target labels, read from its YAML
/// (`sourceLabels: [__meta_kubernetes_pod_label_<sanitized>]` followed by `targetLabel: <t>`),
/// as `(sanitized pod label, target label)`.
pub fn pod_label_relabelings(podmonitor_yaml: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut source: Option<String> = None;
    for line in podmonitor_yaml.lines() {
        let l = line.trim().trim_start_matches("- ");
        if let Some(rest) = l.strip_prefix("sourceLabels:") {
            source = rest
                .trim()
                .trim_matches(|c| c == '[' || c == ']')
                .strip_prefix("__meta_kubernetes_pod_label_")
                .map(str::to_owned);
        } else if let (Some(t), Some(s)) = (l.strip_prefix("targetLabel:"), source.take()) {
            out.push((s, t.trim().to_owned()));
        }
    }
    out
}

/// The target labels Prometheus gives a pod's scrape: `namespace`, `pod`, and each pod label
/// the relabelings copy (label names sanitized as Prometheus does: every character that is
/// not a letter, digit or `_` becomes `_`).
pub fn pod_target_labels(
    namespace: &str,
    pod: &str,
    pod_labels: &BTreeMap<String, String>,
    relabelings: &[(String, String)],
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::from([
        ("namespace".to_owned(), namespace.to_owned()),
        ("pod".to_owned(), pod.to_owned()),
    ]);
    for (k, v) in pod_labels {
        let sanitized: String = k
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        for (s, t) in relabelings {
            if *s == sanitized {
                out.insert(t.clone(), v.clone());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_of_dashboard_expressions() {
        let e = "max by (pod) (redis_master_repl_offset{namespace=\"n\"}) - on (pod) group_right () \
                 max by (pod, slave_ip) (redis_connected_slave_offset_bytes{pod=~\"a|b\"}) > 0";
        let s = selectors(e);
        let names: Vec<&str> = s.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "redis_master_repl_offset",
                "redis_connected_slave_offset_bytes"
            ]
        );
        assert_eq!(s[1].matchers, [("pod".into(), "=~".into(), "a|b".into())]);
    }

    #[test]
    fn check_query_names_what_is_missing() {
        let mut samples = Samples::new();
        parse_exposition(
            "# TYPE up gauge\nup{role=\"master\"} 1\n# TYPE hits counter\n",
            &mut samples,
        );
        assert!(check_query("up{role=\"master\"} + rate(hits_total[5m])", &samples).is_ok());
        let e = check_query("up{role=\"slave\"}", &samples).unwrap_err();
        assert!(e.contains("never occurs"), "{e}");
        let e = check_query("up{pod!=\"\"}", &samples).unwrap_err();
        assert!(e.contains("no label pod"), "{e}");
        let e = check_query("down", &samples).unwrap_err();
        assert!(e.contains("down is not exported"), "{e}");
        assert!(check_query("up{role=~\".+\"}", &samples).is_ok());
    }

    #[test]
    fn variables_and_target_labels() {
        let d: Value = serde_json::json!({
            "panels": [{"title": "r", "panels": [{"title": "p", "targets": [
                {"refId": "A", "expr": "rate(x_total{ns=\"$ns\"}[$__rate_interval])"}]}]}],
            "templating": {"list": [{"name": "ns", "query": {"query": "label_values(up{a=\"b\"}, ns)"}}]}
        });
        let q = dashboard_queries(&d);
        assert_eq!(q[1].1, "up{a=\"b\", ns!=\"\"}");
        let vars = BTreeMap::from([("ns".to_owned(), "prod".to_owned())]);
        assert_eq!(substitute(&q[0].1, &vars), "rate(x_total{ns=\"prod\"}[5m])");
        let r = pod_label_relabelings(
            "relabelings:\n  - sourceLabels: [__meta_kubernetes_pod_label_valkey_io_cluster]\n    targetLabel: valkey_cluster\n",
        );
        assert_eq!(
            r,
            [("valkey_io_cluster".to_owned(), "valkey_cluster".to_owned())]
        );
        let labels = BTreeMap::from([("valkey.io/cluster".to_owned(), "c1".to_owned())]);
        let t = pod_target_labels("ns", "p-0", &labels, &r);
        assert_eq!(t["valkey_cluster"], "c1");
        assert_eq!(t["pod"], "p-0");
    }
}
