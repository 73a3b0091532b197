//! Dense layers over a batch of observations at once, summed in the one order every
//! node keeps.
//!
//! Every output is `b[j] + w[j][0] * x[0] + w[j][1] * x[1] + ...`: the bias first,
//! then each product rounded to f32 and added in input order, with no fused
//! multiply-add (docs/policies.md; the Python node sums the same way). That order is
//! kept here while the work is vectorised *across observations*: activations are held
//! feature-major (`[features, k]`, one observation per column), so the same operation
//! on sixteen observations is one vector instruction, and each weight is loaded once
//! for a block of them. The result is bit for bit the one-observation-at-a-time sum,
//! whatever `k` and whatever vector unit the machine has.
//!
//! The kernel is compiled several times for the x86-64 vector extensions (AVX-512,
//! AVX2, AVX) and picks the best one the CPU has at run time ([`multiversion`]):
//! the build stays portable and downloads nothing.

use multiversion::multiversion;

/// Observations per vector block: one AVX-512 register of f32 (two AVX2 ones).
const WIDE: usize = 16;
/// Observations per narrow block: one SSE register of f32.
const NARROW: usize = 4;
/// Outputs computed together, so one load of the inputs serves this many weight rows.
const OUTS: usize = 4;

/// `yt[j][r] = b[j] + sum_i w[j][i] * xt[i][r]` for `j < n_out`, `r < k`: a dense
/// layer on `k` observations held feature-major.
///
/// `w` is the layer's weight row-major `[n_out, n_in]` (as torch's `nn.Linear` keeps
/// it: nothing is transposed or copied), `b` its bias `[n_out]`, `xt` the inputs
/// `[n_in, k]` and `yt` the outputs `[n_out, k]`.
///
/// # Panics
/// If a slice is shorter than its shape says (the caller sizes them once).
#[multiversion(targets("x86_64+avx512f", "x86_64+avx2", "x86_64+avx"))]
pub(super) fn dense_cols(w: &[f32], b: &[f32], n_in: usize, n_out: usize, xt: &[f32], k: usize, yt: &mut [f32]) {
    assert!(
        w.len() >= n_in * n_out && b.len() >= n_out && xt.len() >= n_in * k && yt.len() >= n_out * k,
        "dense_cols: slices shorter than their shapes"
    );
    let wide_end = k / WIDE * WIDE;
    let narrow_end = wide_end + (k - wide_end) / NARROW * NARROW;
    let mut j = 0;
    while j + OUTS <= n_out {
        let rows = &w[j * n_in..(j + OUTS) * n_in];
        let bias: [f32; OUTS] = std::array::from_fn(|q| b[j + q]);
        let out = &mut yt[j * k..(j + OUTS) * k];
        let mut r = 0;
        while r < wide_end {
            block::<WIDE, OUTS>(rows, bias, n_in, xt, k, r, out);
            r += WIDE;
        }
        while r < narrow_end {
            block::<NARROW, OUTS>(rows, bias, n_in, xt, k, r, out);
            r += NARROW;
        }
        while r < k {
            block::<1, OUTS>(rows, bias, n_in, xt, k, r, out);
            r += 1;
        }
        j += OUTS;
    }
    while j < n_out {
        let rows = &w[j * n_in..(j + 1) * n_in];
        let out = &mut yt[j * k..(j + 1) * k];
        let mut r = 0;
        while r < wide_end {
            block::<WIDE, 1>(rows, [b[j]], n_in, xt, k, r, out);
            r += WIDE;
        }
        while r < narrow_end {
            block::<NARROW, 1>(rows, [b[j]], n_in, xt, k, r, out);
            r += NARROW;
        }
        while r < k {
            block::<1, 1>(rows, [b[j]], n_in, xt, k, r, out);
            r += 1;
        }
        j += 1;
    }
}

/// `J` outputs (weight rows `rows`, `[J, n_in]`) for the `R` observations from column
/// `r0`, into `out` (`[J, k]`). The `R` lanes of `acc[q]` are independent sums, each
/// in input order.
#[inline(always)]
fn block<const R: usize, const J: usize>(
    rows: &[f32],
    bias: [f32; J],
    n_in: usize,
    xt: &[f32],
    k: usize,
    r0: usize,
    out: &mut [f32],
) {
    let w: [&[f32]; J] = std::array::from_fn(|q| &rows[q * n_in..(q + 1) * n_in]);
    let mut acc: [[f32; R]; J] = std::array::from_fn(|q| [bias[q]; R]);
    // One column of `R` inputs per step, every slice sized before the loop so that
    // nothing inside it is bounds-checked.
    for (i, col) in xt.chunks_exact(k).take(n_in).enumerate() {
        let x: &[f32; R] = match col[r0..r0 + R].try_into() {
            Ok(x) => x,
            Err(_) => unreachable!("a slice of R values"),
        };
        for (a, wq) in acc.iter_mut().zip(&w) {
            let wqi = wq[i];
            for (lane, &xv) in a.iter_mut().zip(x) {
                *lane += wqi * xv;
            }
        }
    }
    for (q, lanes) in acc.iter().enumerate() {
        out[q * k + r0..q * k + r0 + R].copy_from_slice(lanes);
    }
}

/// `dst[i][r] = src[r][i]`: `k` rows of `d` values turned feature-major (`[d, k]`).
#[inline]
pub(super) fn to_cols(src: &[f32], k: usize, d: usize, dst: &mut [f32]) {
    for (r, row) in src.chunks_exact(d).take(k).enumerate() {
        for (i, &v) in row.iter().enumerate() {
            dst[i * k + r] = v;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The order the module promises, written out one observation at a time.
    fn reference(w: &[f32], b: &[f32], n_in: usize, x: &[f32]) -> Vec<f32> {
        b.iter()
            .enumerate()
            .map(|(j, &bias)| {
                let mut s = bias;
                for i in 0..n_in {
                    s += w[j * n_in + i] * x[i];
                }
                s
            })
            .collect()
    }

    /// Deterministic values of mixed sign and magnitude, so a changed summation
    /// order shows in the last bits.
    fn values(n: usize, salt: u32) -> Vec<f32> {
        (0..n as u32)
            .map(|i| {
                let h = (i ^ salt).wrapping_mul(0x9e37_79b9).rotate_left(7) ^ salt.wrapping_mul(0x85eb_ca6b);
                (h as f32 / u32::MAX as f32 - 0.5) * if h.is_multiple_of(3) { 1000.0 } else { 0.01 }
            })
            .collect()
    }

    #[test]
    fn every_row_is_the_one_at_a_time_sum_bit_for_bit() {
        for &(n_in, n_out) in &[(1, 1), (3, 5), (4, 2), (17, 9), (64, 64), (256, 3)] {
            for k in [1, 2, 3, 4, 5, 15, 16, 17, 21, 33, 64] {
                let w = values(n_in * n_out, 1);
                let b = values(n_out, 2);
                let x = values(k * n_in, 3);
                let mut xt = vec![0.0; n_in * k];
                to_cols(&x, k, n_in, &mut xt);
                let mut yt = vec![f32::NAN; n_out * k];
                dense_cols(&w, &b, n_in, n_out, &xt, k, &mut yt);
                for r in 0..k {
                    let want = reference(&w, &b, n_in, &x[r * n_in..(r + 1) * n_in]);
                    for (j, e) in want.iter().enumerate() {
                        assert_eq!(
                            yt[j * k + r].to_bits(),
                            e.to_bits(),
                            "n_in {n_in} n_out {n_out} k {k}: row {r} output {j}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn to_cols_transposes() {
        let mut t = [0.0; 6];
        to_cols(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 2, 3, &mut t);
        assert_eq!(t, [1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
    }
}
