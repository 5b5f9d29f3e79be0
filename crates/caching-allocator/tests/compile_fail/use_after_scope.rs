use caching_allocator::CachingAllocator;

fn main() {
    let alloc = CachingAllocator::new(1 << 20);
    let scope = alloc.scope();
    let xs = scope.alloc_slice_fill(4, 0.0f32).unwrap();
    drop(scope);
    xs[0] = 1.0;
}
