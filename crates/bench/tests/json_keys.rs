//! Every key of every JSON kind `allocbench` writes (`all` with its `sdpa` and `llm` sections,
//! `sdpa`, `llm`, `soak`) against the lists in `tests/json-keys/`, captured before the
//! harness was reorganised: no figure may disappear from the JSON unnoticed. A key added on
//! purpose goes into the list with the change that adds it.

mod common;

use std::collections::BTreeSet;
use std::path::Path;

/// Every key path of `v`: `a.b` for objects, `a[]` for the elements of arrays (all elements'
/// keys merged).
fn key_paths(v: &serde_json::Value, prefix: &str, out: &mut BTreeSet<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                let p = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                out.insert(p.clone());
                key_paths(x, &p, out);
            }
        }
        serde_json::Value::Array(xs) => {
            for x in xs {
                key_paths(x, &format!("{prefix}[]"), out);
            }
        }
        _ => {}
    }
}

/// Runs `allocbench args... --json FILE` and returns the key paths of what it wrote.
fn keys_of(name: &str, args: &[&str]) -> BTreeSet<String> {
    let (_, v) = common::json_of(&format!("keys-{name}"), args);
    let mut keys = BTreeSet::new();
    key_paths(&v, "", &mut keys);
    keys
}

fn expected(name: &str) -> BTreeSet<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/json-keys")
        .join(format!("{name}.txt"));
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect()
}

fn check(name: &str, args: &[&str]) {
    let got = keys_of(name, args);
    let want = expected(name);
    let missing: Vec<_> = want.difference(&got).collect();
    let extra: Vec<_> = got.difference(&want).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "`allocbench {}` JSON keys differ from tests/json-keys/{name}.txt\nmissing: \
         {missing:#?}\nnot listed (add them to the list if they are meant): {extra:#?}",
        args.join(" ")
    );
}

const SOURCES: &str = "static,caching,exact-cache,system";

#[test]
fn all_writes_every_key_it_wrote_before() {
    check("all", &["all", "--tiny", "--allocators", SOURCES]);
}

#[test]
fn sdpa_writes_every_key_it_wrote_before() {
    check("sdpa", &["sdpa", "--tiny", "--allocators", SOURCES]);
}

#[test]
fn llm_writes_every_key_it_wrote_before() {
    check("llm", &["llm", "--tiny", "--allocators", SOURCES]);
}

#[test]
fn soak_writes_every_key_it_wrote_before() {
    check("soak", &["soak", "--seconds", "0.2", "--threads", "2"]);
}
