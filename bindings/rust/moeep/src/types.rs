//! Element types of rows. BF16, FP16 and FP8-E4M3 are their bits in newtypes
//! (no crate is needed for them); `Bf16` converts from and to f32.
use moeep_sys as sys;

/// Row types of dispatch and combine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataType {
    Bfloat16,
    Float16,
    Float32,
    Float8E4M3,
}

impl DataType {
    pub fn raw(self) -> sys::epDataType_t {
        match self {
            DataType::Bfloat16 => sys::epBfloat16,
            DataType::Float16 => sys::epFloat16,
            DataType::Float32 => sys::epFloat32,
            DataType::Float8E4M3 => sys::epFloat8E4M3,
        }
    }
}

/// BF16 bits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(transparent)]
pub struct Bf16(pub u16);

impl Bf16 {
    /// Rounded to nearest even, as the library rounds.
    pub fn from_f32(v: f32) -> Bf16 {
        let bits = v.to_bits();
        if v.is_nan() {
            return Bf16((bits >> 16) as u16 | 0x40);
        }
        Bf16(((bits + 0x7fff + ((bits >> 16) & 1)) >> 16) as u16)
    }

    pub fn to_f32(self) -> f32 {
        f32::from_bits((self.0 as u32) << 16)
    }
}

/// FP16 bits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(transparent)]
pub struct F16(pub u16);

/// FP8-E4M3 bits (the "fn" variant: saturating, no infinities).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(transparent)]
pub struct Fp8(pub u8);

/// A row element: its size is the library type's.
///
/// # Safety
/// `size_of::<Self>()` must be the size of `TYPE` in the library, its
/// alignment at most 16, and all-zero bits a valid value.
pub unsafe trait Element: Copy + Default {
    const TYPE: DataType;
}

// SAFETY: each is exactly its type's size (repr(transparent) over u16 / u8, or f32).
unsafe impl Element for Bf16 {
    const TYPE: DataType = DataType::Bfloat16;
}
unsafe impl Element for F16 {
    const TYPE: DataType = DataType::Float16;
}
unsafe impl Element for f32 {
    const TYPE: DataType = DataType::Float32;
}
unsafe impl Element for Fp8 {
    const TYPE: DataType = DataType::Float8E4M3;
}

/// 16-byte lines: the library wants rows 16-byte aligned, more than the
/// element types' own alignment gives a `Vec`.
#[repr(C, align(16))]
#[derive(Clone, Copy)]
struct Line([u8; 16]);

/// Elements in 16-byte aligned memory: what the calls on slices return, and
/// what their row inputs (`x`, `y`, `bias`) must be in (a `Vec` of BF16 is
/// only 2-byte aligned: the library refuses it with `epInvalidArgument`).
#[derive(Clone)]
pub struct Rows<T: Element> {
    lines: Vec<Line>,
    len: usize,
    _elem: std::marker::PhantomData<T>,
}

impl<T: Element> Rows<T> {
    /// `len` elements of all-zero bits.
    pub fn zeroed(len: usize) -> Rows<T> {
        let bytes = len * std::mem::size_of::<T>();
        Rows { lines: vec![Line([0; 16]); (bytes + 15) / 16], len, _elem: std::marker::PhantomData }
    }

    pub fn from_slice(values: &[T]) -> Rows<T> {
        let mut r = Rows::zeroed(values.len());
        r.copy_from_slice(values);
        r
    }
}

impl<T: Element> std::ops::Deref for Rows<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: the lines hold at least len elements (zeroed(): all-zero bits
        // are a valid T by Element's contract), aligned to 16 >= align_of::<T>().
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr() as *const T, self.len) }
    }
}

impl<T: Element> std::ops::DerefMut for Rows<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in deref, and &mut self makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr() as *mut T, self.len) }
    }
}

impl<T: Element + std::fmt::Debug> std::fmt::Debug for Rows<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}
