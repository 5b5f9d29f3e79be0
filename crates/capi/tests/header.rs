//! The checked-in header is what cbindgen makes of the source now.
//!
//! Fails when `include/caching_allocator.h` is out of date; `CA_BLESS=1` rewrites it instead.

use std::path::Path;

#[test]
fn checked_in_header_is_up_to_date() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config =
        cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("cbindgen.toml parses");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_config(config)
        .with_src(crate_dir.join("src/lib.rs"))
        .generate()
        .expect("cbindgen generates the header")
        .write(&mut generated);
    let generated = String::from_utf8(generated).expect("the header is UTF-8");

    let path = crate_dir.join("include/caching_allocator.h");
    if std::env::var_os("CA_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(&path, &generated).expect("write the header");
        return;
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    if checked_in != generated {
        let first_difference = checked_in
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(checked_in.lines().count().min(generated.lines().count()));
        panic!(
            "{} is out of date (first difference at line {}): regenerate it with\n  \
             CA_BLESS=1 cargo test -p caching-allocator-capi --test header\n\
             and commit it.\n--- generated ---\n{generated}",
            path.display(),
            first_difference + 1
        );
    }
}
