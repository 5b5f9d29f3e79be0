//! The borrow checker forbids using scratch after its scope is gone or across a reset.

#[test]
#[cfg_attr(miri, ignore = "trybuild runs rustc")]
fn misuse_does_not_compile() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/compile_fail/*.rs");
}
