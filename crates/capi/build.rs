//! Gives the shared library its SONAME on Linux, so a program linked against it by full path
//! (as CMake does) records `libcaching_allocator.so`, not the path, as what it needs.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcaching_allocator.so");
    }
}
