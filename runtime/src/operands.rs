//! Views of one window region as an op's inputs and outputs at once: shared slices of the
//! inputs and mutable slices of the outputs, checked disjoint (every CPU op, the host's and the
//! mixture-of-experts step's, reads and writes the activations this way).

use std::ops::Range;

/// Shared views of an op's inputs and a mutable view of its output, all in one window.
pub fn operands<'w, const N: usize>(win: &'w mut [f32], ins: [Range<usize>; N], out: Range<usize>) -> ([&'w [f32]; N], &'w mut [f32]) {
    let (ins, [out]) = operands_many(win, ins, [out]);
    (ins, out)
}

/// [`operands`] with several outputs.
pub fn operands_many<'w, const N: usize, const M: usize>(win: &'w mut [f32], ins: [Range<usize>; N], outs: [Range<usize>; M]) -> ([&'w [f32]; N], [&'w mut [f32]; M]) {
    let disjoint = |a: &Range<usize>, b: &Range<usize>| a.end <= b.start || b.end <= a.start;
    for (i, out) in outs.iter().enumerate() {
        assert!(out.end <= win.len(), "output outside the window");
        assert!(outs[..i].iter().all(|o| disjoint(o, out)), "two outputs overlap");
        for r in &ins {
            assert!(r.end <= win.len(), "input outside the window");
            assert!(disjoint(r, out), "output overlaps an input");
        }
    }
    let base = win.as_mut_ptr();
    // SAFETY: every range lies inside `win`, and every output range is disjoint from every
    // input range and from the other outputs (asserted above), so no mutable slice aliases
    // any other slice; all borrow `win` mutably for 'w, so nothing else can touch it meanwhile.
    unsafe {
        (
            ins.map(|r| std::slice::from_raw_parts(base.add(r.start), r.len())),
            outs.map(|r| std::slice::from_raw_parts_mut(base.add(r.start), r.len())),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::operands;

    #[test]
    fn operands_are_the_requested_ranges() {
        let mut win: Vec<f32> = (0..16).map(|i| i as f32).collect();
        let ([a, b], out) = operands(&mut win, [0..4, 2..6], 8..12);
        assert_eq!((a, b), (&[0.0, 1.0, 2.0, 3.0][..], &[2.0, 3.0, 4.0, 5.0][..]));
        out.copy_from_slice(&[9.0; 4]);
        assert_eq!(&win[8..12], &[9.0; 4]);
    }

    #[test]
    #[should_panic(expected = "two outputs overlap")]
    fn two_overlapping_outputs_are_refused() {
        let mut win = vec![0.0f32; 16];
        let _ = super::operands_many(&mut win, [0..2], [4..8, 6..10]);
    }

    #[test]
    #[should_panic(expected = "output overlaps an input")]
    fn an_output_overlapping_an_input_is_refused() {
        let mut win = vec![0.0f32; 16];
        let _ = operands(&mut win, [0..8], 4..12);
    }

    #[test]
    #[should_panic(expected = "outside the window")]
    fn a_range_outside_the_window_is_refused() {
        let mut win = vec![0.0f32; 16];
        let _ = operands(&mut win, [0..8], 12..20);
    }
}
