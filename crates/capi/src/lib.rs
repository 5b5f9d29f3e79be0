//! C ABI for caching-allocator (work in progress).
