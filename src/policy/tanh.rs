//! `tanh` as every rollout node computes it: one fixed sequence of f32 operations
//! (docs/policies.md, "tanh"), so that a node in any language that has IEEE f32 gets
//! the same bits, and so that it vectorises: no branch, no table, no call into the C
//! library (whose `tanhf` is scalar, differs between libraries, and cost more than the
//! matrix products of a 64-64 network).
//!
//! Within 1.32 ulp of the exact tanh over all of f32 (the C library's is within about
//! 2); `tanh(±0) = ±0`, `tanh(±inf) = ±1`, NaN stays NaN.

use multiversion::multiversion;

/// Inputs are clamped to `[-10, 10]`: beyond, tanh rounds to ±1 in f32.
const CLAMP: f32 = 10.0;
/// Below this magnitude the odd polynomial is used, from it on the exponential form.
const SMALL: f32 = 0.625;
const LOG2E: f32 = std::f32::consts::LOG2_E;
/// ln 2 split in two (Cody and Waite): `n * LN2_HI` is exact for the `n` used here.
const LN2_HI: f32 = 355.0 / 512.0;
const LN2_LO: f32 = -2.121_944_4e-4;
/// `e^r` on `|r| <= ln2 / 2`, coefficients of `r^0, r^1, ...`.
const EXP: [f32; 7] = [
    1.0,
    1.0,
    4.999_999e-1,
    1.666_642_1e-1,
    4.166_836e-2,
    8.374_775e-3,
    1.382_942_4e-3,
];
/// `(tanh(a) - a) / a^3` as a polynomial in `a^2` on `a < SMALL`.
const ODD: [f32; 6] = [
    -3.333_333e-1,
    1.333_320_6e-1,
    -5.394_670_4e-2,
    2.170_049_2e-2,
    -8.177_074e-3,
    2.142_785e-3,
];

/// `c[0] + z (c[1] + z (c[2] + ...))`, innermost first: each step one product
/// rounded, then one sum rounded.
#[inline(always)]
fn horner<const N: usize>(c: &[f32; N], z: f32) -> f32 {
    let mut p = c[N - 1];
    for &v in c[..N - 1].iter().rev() {
        p = p * z + v;
    }
    p
}

/// `2^n` for a whole `n` in `-126..=127`, the exponent field written directly:
/// `n + 127 + 2^23` is exact in f32 and its mantissa field is `n + 127`, which the
/// shift moves into the exponent field.
#[inline(always)]
fn pow2(n: f32) -> f32 {
    f32::from_bits((n + (127.0 + 8_388_608.0)).to_bits() << 23)
}

/// rollout's tanh of one value.
#[inline(always)]
pub(crate) fn tanh(x: f32) -> f32 {
    let a = x.abs();
    let a = if a > CLAMP { CLAMP } else { a };
    let u = a * a;
    let small = a + (a * u) * horner(&ODD, u);
    let y = a + a;
    // y >= 0, so truncation is the floor: n = round(y / ln 2), a whole f32 in 0..=29.
    // Kept in f32 with no conversion to an integer: Rust's `as i32` saturates, which
    // the compiler cannot vectorise (it became 16 scalar conversions per AVX-512
    // vector, most of this function's time). NaN stays NaN through `r`.
    let nf = (y * LOG2E + 0.5).trunc();
    let r = (y - nf * LN2_HI) - nf * LN2_LO;
    let e = horner(&EXP, r) * pow2(nf);
    let large = 1.0 - 2.0 / (e + 1.0);
    let t = if a < SMALL { small } else { large };
    t.copysign(x)
}

/// [`tanh`] of every value of `v`, in place: the same bits, several values per
/// instruction (AVX-512, AVX2 or AVX, picked at run time).
#[multiversion(targets("x86_64+avx512f", "x86_64+avx2", "x86_64+avx"))]
pub fn tanh_in_place(v: &mut [f32]) {
    for x in v.iter_mut() {
        *x = tanh(*x);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Distance from the exact tanh in units of the f32 spacing at the result.
    fn ulps(x: f32) -> f64 {
        let want = (x as f64).tanh();
        let got = tanh(x) as f64;
        let w32 = want as f32;
        let spacing = (f32::from_bits(w32.abs().to_bits() + 1) - w32.abs()) as f64;
        (got - want).abs() / spacing
    }

    #[test]
    fn within_one_and_a_third_ulp_everywhere() {
        // Every 197th f32 from 0 to past the clamp, both signs: about 11 million values.
        let end = 11.0f32.to_bits();
        let mut worst = (0.0, 0.0f32);
        for bits in (0..end).step_by(197) {
            for x in [f32::from_bits(bits), -f32::from_bits(bits)] {
                let e = ulps(x);
                if e > worst.0 {
                    worst = (e, x);
                }
            }
        }
        assert!(worst.0 <= 1.32, "{} ulp at {}", worst.0, worst.1);
        // Both sides of the switch between the two forms.
        for x in [
            SMALL,
            f32::from_bits(SMALL.to_bits() - 1),
            f32::from_bits(SMALL.to_bits() + 1),
        ] {
            assert!(ulps(x) <= 1.32, "{x}");
        }
    }

    #[test]
    fn special_values() {
        assert_eq!(tanh(0.0).to_bits(), 0.0f32.to_bits());
        assert_eq!(tanh(-0.0).to_bits(), (-0.0f32).to_bits());
        assert_eq!(tanh(f32::INFINITY), 1.0);
        assert_eq!(tanh(f32::NEG_INFINITY), -1.0);
        assert_eq!(tanh(1e30), 1.0);
        assert_eq!(tanh(-20.0), -1.0);
        assert!(tanh(f32::NAN).is_nan());
        assert_eq!(tanh(1e-30), 1e-30);
        assert_eq!(tanh(f32::MIN_POSITIVE), f32::MIN_POSITIVE);
    }

    #[test]
    fn a_slice_gets_the_bits_of_one_value_at_a_time() {
        let mut v: Vec<f32> = (0..4099).map(|i| (i as f32 - 2049.0) * 0.00731).collect();
        v.extend([f32::INFINITY, -0.0, 0.625, -0.625, 9.99, 10.01]);
        let want: Vec<u32> = v.iter().map(|&x| tanh(x).to_bits()).collect();
        tanh_in_place(&mut v);
        assert_eq!(v.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), want);
    }

    /// The definition's literal form (docs/policies.md): `n` a 32-bit integer and
    /// `2^n` from it, as this module computed it before `n` stayed in f32.
    fn tanh_integer_n(x: f32) -> f32 {
        let a = x.abs().min(CLAMP);
        let u = a * a;
        let small = a + (a * u) * horner(&ODD, u);
        let y = a + a;
        let n = (y * LOG2E + 0.5) as i32;
        let nf = n as f32;
        let r = (y - nf * LN2_HI) - nf * LN2_LO;
        let e = horner(&EXP, r) * f32::from_bits(((n + 127) as u32) << 23);
        let t = if a < SMALL { small } else { 1.0 - 2.0 / (e + 1.0) };
        t.copysign(x)
    }

    #[test]
    fn pow2_is_the_integer_exponent() {
        for n in -126..=127i32 {
            assert_eq!(pow2(n as f32), 2f32.powi(n), "{n}");
        }
    }

    #[test]
    fn equals_the_definition_with_an_integer_n_bit_for_bit() {
        let end = 11.0f32.to_bits();
        for bits in (0..end).step_by(101) {
            for x in [f32::from_bits(bits), -f32::from_bits(bits)] {
                assert_eq!(tanh(x).to_bits(), tanh_integer_n(x).to_bits(), "{x}");
            }
        }
        let mut v: Vec<f32> = (0..20_000).map(|i| (i as f32 - 10_000.0) * 0.0011).collect();
        let want: Vec<u32> = v.iter().map(|&x| tanh_integer_n(x).to_bits()).collect();
        tanh_in_place(&mut v);
        assert_eq!(v.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), want);
    }

    #[test]
    fn odd_and_monotone() {
        let mut last = -1.0f32;
        for i in -2000..=2000 {
            let x = i as f32 * 0.006;
            assert_eq!(tanh(-x).to_bits(), (-tanh(x)).to_bits(), "{x}");
            assert!(tanh(x) >= last, "{x}");
            last = tanh(x);
        }
    }
}
