//! Top-k exactly as PyTorch's CPU `torch.topk(values, k)` (largest, sorted) computes it, so
//! that among equal confidences at the k boundary the official sampler's choice is ours, and
//! so is the order of the k it returns.
//!
//! PyTorch (`aten/src/ATen/native/TopKImpl.h`) pairs every value with its index and, with a
//! comparator on the value alone (NaN above everything), calls libstdc++'s
//! `std::partial_sort(first, first + k, last)` when `k * 64 <= n`, and otherwise
//! `std::nth_element(first, first + k - 1, last)` followed by `std::sort(first, first + k - 1)`.
//! None of these is stable: which of several equal values ends up in front is decided by the
//! exact comparisons and moves the algorithms make. The functions below make the same ones, in
//! the same order, as libstdc++'s `bits/stl_algo.h` and `bits/stl_heap.h` (read in GCC 12's
//! headers; PyTorch's Linux wheels are built with GCC), one function per libstdc++ helper.
//! `tests/data/topk_libstdcxx.txt` pins them against the real `std::` algorithms
//! (`tools/topk/reference.cpp`); `tools/topk/check_torch.py` checks the same cases against
//! `torch.topk` itself.

/// A confidence type: the official sampler's is float32, Fast-dLLM's float64.
pub trait Score: Copy + PartialOrd {
    fn is_nan(self) -> bool;
}

impl Score for f32 {
    fn is_nan(self) -> bool {
        f32::is_nan(self)
    }
}

impl Score for f64 {
    fn is_nan(self) -> bool {
        f64::is_nan(self)
    }
}

/// A value and its index, as PyTorch's `std::pair<scalar_t, int64_t>`.
type Entry<T> = (T, usize);

/// PyTorch's comparator for `largest`: `x` goes before `y` (NaN first, then larger values).
fn before<T: Score>(x: &Entry<T>, y: &Entry<T>) -> bool {
    (x.0.is_nan() && !y.0.is_nan()) || x.0 > y.0
}

/// The indices of the `k` largest `values`, in the order `torch.topk` returns them. `k` above
/// `values.len()` is cut to it (PyTorch rejects it).
pub fn topk<T: Score>(values: &[T], k: usize) -> Vec<usize> {
    let mut queue = Vec::with_capacity(values.len());
    topk_in(values, k, &mut queue).collect()
}

/// [`topk`] in a caller's buffer (`queue`, reused: no allocation once it holds `values.len()`
/// entries), for the sampler's steps.
pub fn topk_in<'q, T: Score>(values: &[T], k: usize, queue: &'q mut Vec<(T, usize)>) -> impl Iterator<Item = usize> + 'q {
    let k = k.min(values.len());
    queue.clear();
    queue.extend(values.iter().copied().zip(0..));
    if k > 0 {
        if k * 64 <= values.len() {
            partial_sort(queue, k);
        } else {
            nth_element(queue, k - 1);
            sort(&mut queue[..k - 1]);
        }
    }
    queue[..k].iter().map(|e| e.1)
}

/// `std::__lg`: floor(log2(n)) for n > 0.
fn lg(n: usize) -> u32 {
    usize::BITS - 1 - n.leading_zeros()
}

/// `std::nth_element(s, s + nth, s + len)`.
fn nth_element<T: Score>(s: &mut [Entry<T>], nth: usize) {
    if s.is_empty() || nth == s.len() {
        return;
    }
    let depth = 2 * lg(s.len());
    introselect(s, nth, depth);
}

/// `std::__introselect`: quickselect with median-of-three pivots, falling back to a heap
/// select when the depth budget runs out and to insertion sort for 3 elements or fewer.
fn introselect<T: Score>(s: &mut [Entry<T>], nth: usize, mut depth: u32) {
    let (mut first, mut last) = (0, s.len());
    while last - first > 3 {
        if depth == 0 {
            heap_select(&mut s[first..last], nth - first + 1);
            s.swap(first, nth);
            return;
        }
        depth -= 1;
        let cut = first + partition_pivot(&mut s[first..last]);
        if cut <= nth {
            first = cut;
        } else {
            last = cut;
        }
    }
    insertion_sort(&mut s[first..last]);
}

/// `std::__partial_sort(s, s + middle, s + len)`.
fn partial_sort<T: Score>(s: &mut [Entry<T>], middle: usize) {
    heap_select(s, middle);
    sort_heap(&mut s[..middle]);
}

/// `std::sort` (`std::__sort`): introsort down to runs of 16, then one insertion sort.
fn sort<T: Score>(s: &mut [Entry<T>]) {
    if s.is_empty() {
        return;
    }
    let depth = 2 * lg(s.len());
    introsort_loop(s, depth);
    final_insertion_sort(s);
}

/// `_S_threshold` of libstdc++'s sort.
const SORT_THRESHOLD: usize = 16;

/// `std::__introsort_loop`: recurses on the right part, loops on the left.
fn introsort_loop<T: Score>(s: &mut [Entry<T>], mut depth: u32) {
    let mut last = s.len();
    while last > SORT_THRESHOLD {
        if depth == 0 {
            partial_sort(&mut s[..last], last);
            return;
        }
        depth -= 1;
        let cut = partition_pivot(&mut s[..last]);
        introsort_loop(&mut s[cut..last], depth);
        last = cut;
    }
}

/// `std::__final_insertion_sort`.
fn final_insertion_sort<T: Score>(s: &mut [Entry<T>]) {
    if s.len() > SORT_THRESHOLD {
        insertion_sort(&mut s[..SORT_THRESHOLD]);
        for i in SORT_THRESHOLD..s.len() {
            unguarded_linear_insert(s, i);
        }
    } else {
        insertion_sort(s);
    }
}

/// `std::__unguarded_partition_pivot`: the median of the second, middle and last elements is
/// moved to the front and the rest partitioned around it; returns the cut.
fn partition_pivot<T: Score>(s: &mut [Entry<T>]) -> usize {
    let len = s.len();
    move_median_to_first(s, 0, 1, len / 2, len - 1);
    unguarded_partition(s, 1, len, 0)
}

/// `std::__move_median_to_first`: swaps the median of `s[a]`, `s[b]`, `s[c]` into `s[result]`.
fn move_median_to_first<T: Score>(s: &mut [Entry<T>], result: usize, a: usize, b: usize, c: usize) {
    let median = if before(&s[a], &s[b]) {
        if before(&s[b], &s[c]) {
            b
        } else if before(&s[a], &s[c]) {
            c
        } else {
            a
        }
    } else if before(&s[a], &s[c]) {
        a
    } else if before(&s[b], &s[c]) {
        c
    } else {
        b
    };
    s.swap(result, median);
}

/// `std::__unguarded_partition` of `s[first..last]` around `s[pivot]` (which is outside it).
/// Unguarded: the median-of-three leaves an element on each side that stops the scans, which
/// holds because the comparator is a strict weak order (NaNs form one class above all values).
fn unguarded_partition<T: Score>(s: &mut [Entry<T>], mut first: usize, mut last: usize, pivot: usize) -> usize {
    loop {
        while before(&s[first], &s[pivot]) {
            first += 1;
        }
        last -= 1;
        while before(&s[pivot], &s[last]) {
            last -= 1;
        }
        if first >= last {
            return first;
        }
        s.swap(first, last);
        first += 1;
    }
}

/// `std::__insertion_sort`: an element that goes before the first is moved to the front in
/// one shift; the others are inserted by an unguarded scan.
fn insertion_sort<T: Score>(s: &mut [Entry<T>]) {
    for i in 1..s.len() {
        if before(&s[i], &s[0]) {
            let value = s[i];
            s.copy_within(0..i, 1);
            s[0] = value;
        } else {
            unguarded_linear_insert(s, i);
        }
    }
}

/// `std::__unguarded_linear_insert`: moves `s[last]` left past every element it goes before.
/// An element not before it lies to its left (the caller's guarantee), so the scan stops.
fn unguarded_linear_insert<T: Score>(s: &mut [Entry<T>], mut last: usize) {
    let value = s[last];
    let mut next = last - 1;
    while before(&value, &s[next]) {
        s[last] = s[next];
        last = next;
        next -= 1;
    }
    s[last] = value;
}

/// `std::__heap_select(s, s + middle, s + len)`: a heap of the first `middle` with the
/// *last* in order at its top; every later element that goes before the top replaces it.
fn heap_select<T: Score>(s: &mut [Entry<T>], middle: usize) {
    make_heap(&mut s[..middle]);
    for i in middle..s.len() {
        if before(&s[i], &s[0]) {
            pop_heap(s, middle, i);
        }
    }
}

/// `std::__make_heap`.
fn make_heap<T: Score>(h: &mut [Entry<T>]) {
    let len = h.len();
    if len < 2 {
        return;
    }
    let mut parent = (len - 2) / 2;
    loop {
        let value = h[parent];
        adjust_heap(h, parent, value);
        if parent == 0 {
            return;
        }
        parent -= 1;
    }
}

/// `std::__sort_heap`.
fn sort_heap<T: Score>(h: &mut [Entry<T>]) {
    let mut last = h.len();
    while last > 1 {
        last -= 1;
        pop_heap(h, last, last);
    }
}

/// `std::__pop_heap(s, s + last, s + result)`: the top of the heap `s[..last]` goes to
/// `s[result]`, whose value is sifted into the heap.
fn pop_heap<T: Score>(s: &mut [Entry<T>], last: usize, result: usize) {
    let value = s[result];
    s[result] = s[0];
    adjust_heap(&mut s[..last], 0, value);
}

/// `std::__adjust_heap`: moves the hole at `hole` down to a leaf along the larger children,
/// then pushes `value` up from there.
fn adjust_heap<T: Score>(h: &mut [Entry<T>], mut hole: usize, value: Entry<T>) {
    let len = h.len();
    let top = hole;
    let mut child = hole;
    while child < (len - 1) / 2 {
        child = 2 * (child + 1);
        if before(&h[child], &h[child - 1]) {
            child -= 1;
        }
        h[hole] = h[child];
        hole = child;
    }
    if len % 2 == 0 && child == (len - 2) / 2 {
        child = 2 * (child + 1);
        h[hole] = h[child - 1];
        hole = child - 1;
    }
    push_heap(h, hole, top, value);
}

/// `std::__push_heap`: moves `value` up from `hole` while its parent goes before it.
fn push_heap<T: Score>(h: &mut [Entry<T>], mut hole: usize, top: usize, value: Entry<T>) {
    while hole > top {
        let parent = (hole - 1) / 2;
        if !before(&h[parent], &value) {
            break;
        }
        h[hole] = h[parent];
        hole = parent;
    }
    h[hole] = value;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SplitMix64, shared with `tools/topk/reference.cpp` and `check_torch.py`, which generate
    /// the same cases.
    struct SplitMix(u64);

    impl SplitMix {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// Case `i`: length, k and a tie-heavy pool of values; float64 values that round to the
    /// same float32 tie only in float32.
    fn case(rng: &mut SplitMix) -> (Vec<f64>, usize) {
        const POOL: [f64; 8] = [1.0, 1.0 - 1.0 / (1u64 << 40) as f64, 0.5, 0.25, 0.0, -0.0, f64::NEG_INFINITY, f64::NAN];
        let n = 1 + rng.below(300) as usize;
        // Half the cases take the partial-sort path (k * 64 <= n) where n allows it.
        let k = if rng.below(2) == 0 && n >= 64 { 1 + rng.below((n / 64) as u64) as usize } else { 1 + rng.below(n as u64) as usize };
        // Fewer distinct values in some cases, NaN rarely.
        let distinct = 2 + rng.below(6);
        let values = (0..n)
            .map(|_| {
                let v = rng.below(1000);
                if v == 0 {
                    POOL[7]
                } else {
                    POOL[(v % distinct) as usize]
                }
            })
            .collect();
        (values, k)
    }

    /// The fixture: per case, a line `f32: i i i` and a line `f64: i i i` from the real
    /// libstdc++ algorithms under PyTorch's loop.
    const FIXTURE: &str = include_str!("../tests/data/topk_libstdcxx.txt");

    #[test]
    fn selection_and_order_match_libstdcxx_under_pytorchs_loop() {
        let mut rng = SplitMix(2026);
        let mut lines = FIXTURE.lines().filter(|l| !l.starts_with('#'));
        let mut cases = 0;
        while let Some(f32_line) = lines.next() {
            let f64_line = lines.next().expect("fixture: f64 line");
            let (values, k) = case(&mut rng);
            let as_f32: Vec<f32> = values.iter().map(|&v| v as f32).collect();
            let parse = |line: &str, tag: &str| -> Vec<usize> {
                let rest = line.strip_prefix(tag).unwrap_or_else(|| panic!("fixture line {line:?} lacks {tag}"));
                rest.split_whitespace().map(|t| t.parse().unwrap()).collect()
            };
            assert_eq!(topk(&as_f32, k), parse(f32_line, "f32:"), "case {cases} (n {}, k {k}), float32", values.len());
            assert_eq!(topk(&values, k), parse(f64_line, "f64:"), "case {cases} (n {}, k {k}), float64", values.len());
            cases += 1;
        }
        assert_eq!(cases, 1000, "the fixture holds 1000 cases");
    }

    #[test]
    fn distinct_values_come_out_largest_first() {
        let values = [0.3f32, 0.9, 0.1, 0.7, f32::NEG_INFINITY, 0.5];
        assert_eq!(topk(&values, 3), vec![1, 3, 5]);
        assert_eq!(topk(&values, 6), vec![1, 3, 5, 0, 2, 4]);
        assert_eq!(topk(&values, 9).len(), 6);
        assert!(topk(&values, 0).is_empty());
        assert!(topk::<f32>(&[], 2).is_empty());
    }

    #[test]
    fn nan_counts_as_the_largest() {
        assert_eq!(topk(&[0.5f64, f64::NAN, 1.0], 2), vec![1, 2]);
    }

    #[test]
    fn ties_are_not_broken_by_position() {
        // A sample the fixture pins: PyTorch's choice among equal values is not "lowest index
        // first", which is why the sampler cannot simply sort stably.
        let values = [1.0f32; 20];
        assert_ne!(topk(&values, 3), vec![0, 1, 2]);
    }
}
