use caching_allocator::CachingAllocator;

fn main() {
    let alloc = CachingAllocator::new(1 << 20);
    let scope = alloc.scope();
    std::thread::scope(|s| {
        s.spawn(move || drop(scope));
    });
}
