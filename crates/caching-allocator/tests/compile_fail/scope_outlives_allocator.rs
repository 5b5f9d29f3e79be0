use caching_allocator::CachingAllocator;

fn main() {
    let scope;
    {
        let alloc = CachingAllocator::new(1 << 20);
        scope = alloc.scope();
    }
    let _ = scope.alloc_slice_fill(4, 0u8);
}
