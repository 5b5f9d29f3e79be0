use caching_allocator::CachingAllocator;

fn main() {
    let mut alloc = CachingAllocator::new(1 << 20);
    let scope = alloc.scope();
    let xs = scope.alloc_slice_fill(4, 0u8).unwrap();
    alloc.reset();
    xs[0] = 1;
}
