//! Dispatch and combine on host slices (a communicator on the host backend).
//! Outputs are allocated here, sized exactly (a prepare first), so a call
//! never writes past a slice: lengths are checked against the shapes.
use crate::{check, Comm, Element, Error, Handle, Result};
use crate::{Bf16, DataType, Fp8, Rows};
use moeep_sys as sys;
use std::os::raw::{c_int, c_void};
use std::ptr;

/// This rank's tokens: x `[T, hidden]`, FP8 scales `[T, ceil(hidden/128)]`,
/// ids `[T, num_topk]` (global experts, -1 none), weights `[T, num_topk]`.
pub struct Tokens<'a, T> {
    pub x: &'a [T],
    pub scales: Option<&'a [f32]>,
    pub topk_idx: &'a [i64],
    pub topk_weights: Option<&'a [f32]>,
    pub num_topk: usize,
    pub expert_alignment: i32,
}

impl<'a, T> Tokens<'a, T> {
    pub fn new(x: &'a [T], topk_idx: &'a [i64], num_topk: usize) -> Self {
        Tokens { x, scales: None, topk_idx, topk_weights: None, num_topk, expert_alignment: 0 }
    }
}

/// What a rank received, by source rank then source token.
pub struct Received<T: Element> {
    pub num_recv: usize,
    pub x: Rows<T>,
    pub scales: Vec<f32>,
    pub topk_idx: Vec<i64>,
    pub topk_weights: Vec<f32>,
    pub tokens_per_expert: Vec<i32>,
}

/// The wire of a low-latency dispatch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LlWire {
    Fp8,
    Bf16,
}

/// Rows of a low-latency dispatch, expert-major `[local experts, R * M, hidden]`.
pub enum LlRows {
    Fp8(Rows<Fp8>),
    Bf16(Rows<Bf16>),
}

/// A low-latency dispatch's outputs (moeep.h's layout): rows, scales
/// `[local experts, ceil(hidden/128), R * M]` (FP8), valid rows per expert,
/// and each row's source (`rank * M + token`).
pub struct LlReceived {
    pub rows: LlRows,
    pub scales: Vec<f32>,
    pub count: Vec<i32>,
    pub src: Vec<i32>,
}

fn need(ok: bool, what: String) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(Error::argument(what))
    }
}

fn or_null<U>(v: &mut [U]) -> *mut U {
    if v.is_empty() {
        ptr::null_mut()
    } else {
        v.as_mut_ptr()
    }
}

impl Comm {
    fn hidden(&self) -> usize {
        self.cfg.hidden as usize
    }

    fn check_type<T: Element>(&self, want: sys::epDataType_t, what: &str) -> Result<()> {
        need(T::TYPE.raw() == want, format!("{}: rows of {:?}, the communicator's type is {}", what, T::TYPE, want))
    }

    fn token_args<T: Element>(&self, t: &Tokens<T>, what: &str) -> Result<(sys::epDispatchArgs_t, usize)> {
        let h = self.hidden();
        need(t.num_topk > 0, format!("{}: num_topk is 0", what))?;
        let n = t.topk_idx.len() / t.num_topk;
        need(t.topk_idx.len() == n * t.num_topk, format!("{}: topk_idx is not [T, {}]", what, t.num_topk))?;
        need(t.x.len() == n * h, format!("{}: x holds {} elements, [{}, {}] expected", what, t.x.len(), n, h))?;
        if let Some(w) = t.topk_weights {
            need(w.len() == t.topk_idx.len(), format!("{}: topk_weights is not the shape of topk_idx", what))?;
        }
        let nb = (h + 127) / 128;
        if let Some(s) = t.scales {
            need(s.len() == n * nb, format!("{}: scales hold {} values, [{}, {}] expected", what, s.len(), n, nb))?;
        }
        let mut a = sys::epDispatchArgs_t::initializer();
        a.x = t.x.as_ptr() as *const c_void;
        a.x_type = T::TYPE.raw();
        a.x_scales = t.scales.map_or(ptr::null(), |s| s.as_ptr());
        a.topk_idx = t.topk_idx.as_ptr() as *const c_void;
        a.topk_weights = t.topk_weights.map_or(ptr::null(), |w| w.as_ptr());
        a.num_tokens = n as c_int;
        a.num_topk = t.num_topk as c_int;
        a.expert_alignment = t.expert_alignment;
        Ok((a, n))
    }

    fn receive<T: Element>(&self, a: &mut sys::epDispatchArgs_t, rows: usize, k: usize, fp8: bool) -> Received<T> {
        let h = self.hidden();
        let mut r = Received {
            num_recv: rows,
            x: Rows::zeroed(rows * h),
            scales: vec![0.0; if fp8 { rows * ((h + 127) / 128) } else { 0 }],
            topk_idx: vec![0; rows * k],
            topk_weights: vec![0.0; if a.topk_weights.is_null() { 0 } else { rows * k }],
            tokens_per_expert: vec![0; self.local_experts as usize],
        };
        a.recv_x = or_null(&mut r.x[..]) as *mut c_void;
        a.recv_scales = or_null(&mut r.scales);
        a.recv_topk_idx = or_null(&mut r.topk_idx);
        a.recv_topk_weights = or_null(&mut r.topk_weights);
        a.recv_capacity = rows as i64;
        a.recv_tokens_per_expert = or_null(&mut r.tokens_per_expert);
        r
    }

    /// A new routing: `epDispatchPrepare` (the exact row count), then
    /// `epDispatch` into outputs of that size. Returns the handle for
    /// combine and cached re-dispatches.
    pub fn dispatch<T: Element>(&self, t: &Tokens<T>) -> Result<(Handle, Received<T>)> {
        self.host_only("dispatch")?;
        self.check_type::<T>(self.cfg.dispatch_type, "dispatch")?;
        let (mut a, n) = self.token_args(t, "dispatch")?;
        let mut raw: sys::epHandle_t = ptr::null_mut();
        // SAFETY: the argument pointers are the caller's live slices, checked above.
        check(unsafe { sys::epDispatchPrepare(self.raw, &a, &mut raw, ptr::null_mut()) }, self.raw)?;
        // SAFETY: a handle the library just returned.
        let handle = unsafe { Handle::from_raw(raw, n, t.num_topk) };
        let rows = handle.num_recv().expect("a prepared handle knows its count");
        let r = self.receive(&mut a, rows, t.num_topk, t.scales.is_some());
        let mut num_recv: i64 = -1;
        a.num_recv = &mut num_recv;
        let mut h = handle.raw;
        // SAFETY: outputs sized for `rows`, the count of this routing.
        check(unsafe { sys::epDispatch(self.raw, &a, &mut h, ptr::null_mut()) }, self.raw)?;
        debug_assert_eq!(num_recv as usize, rows);
        Ok((handle, r))
    }

    /// A cached re-dispatch of new rows with the routing of `handle`.
    pub fn dispatch_cached<T: Element>(&self, handle: &mut Handle, x: &[T], scales: Option<&[f32]>) -> Result<Received<T>> {
        self.host_only("dispatch_cached")?;
        self.check_type::<T>(self.cfg.dispatch_type, "dispatch_cached")?;
        let h = self.hidden();
        need(x.len() == handle.num_tokens * h, format!("dispatch_cached: x holds {} elements, [{}, {}] expected",
                                                       x.len(), handle.num_tokens, h))?;
        let rows = handle.num_recv().ok_or_else(|| Error::usage("dispatch_cached: the count is unknown".into()))?;
        let mut a = sys::epDispatchArgs_t::initializer();
        a.x = x.as_ptr() as *const c_void;
        a.x_type = T::TYPE.raw();
        a.x_scales = scales.map_or(ptr::null(), |s| s.as_ptr());
        if let Some(s) = scales {
            need(s.len() == handle.num_tokens * ((h + 127) / 128), "dispatch_cached: scales of the wrong size".into())?;
        }
        a.num_tokens = handle.num_tokens as c_int;
        let r = self.receive(&mut a, rows, 0, scales.is_some());
        let mut raw = handle.raw;
        // SAFETY: outputs sized for the handle's count; x checked above.
        check(unsafe { sys::epDispatch(self.raw, &a, &mut raw, ptr::null_mut()) }, self.raw)?;
        Ok(r)
    }

    /// `epCombine`: y `[num_recv, hidden]` (one row per received token) summed
    /// onto the tokens' home ranks: `out [T, hidden]` (+ bias `[T, hidden]`);
    /// with `recv_topk_weights` `[num_recv, K]` also the weights `[T, K]`.
    pub fn combine<T: Element>(
        &self,
        handle: &Handle,
        y: &[T],
        bias: Option<&[T]>,
        recv_topk_weights: Option<(&[f32], usize)>,
    ) -> Result<(Rows<T>, Vec<f32>)> {
        self.host_only("combine")?;
        self.check_type::<T>(self.cfg.combine_type, "combine")?;
        let h = self.hidden();
        let rows = handle.num_recv().ok_or_else(|| Error::usage("combine: the count is unknown".into()))?;
        need(y.len() == rows * h, format!("combine: y holds {} elements, [{}, {}] expected", y.len(), rows, h))?;
        let t = handle.num_tokens;
        if let Some(b) = bias {
            need(b.len() == t * h, "combine: bias is not [T, hidden]".into())?;
        }
        let mut out = Rows::<T>::zeroed(t * h);
        let mut a = sys::epCombineArgs_t::initializer();
        a.y = y.as_ptr() as *const c_void;
        a.y_type = T::TYPE.raw();
        a.bias = bias.map_or(ptr::null(), |b| b.as_ptr() as *const c_void);
        a.out = or_null(&mut out[..]) as *mut c_void;
        let mut out_w = Vec::new();
        if let Some((w, k)) = recv_topk_weights {
            need(w.len() == rows * k, "combine: recv_topk_weights is not [num_recv, K]".into())?;
            out_w = vec![0.0f32; t * k];
            a.recv_topk_weights = w.as_ptr();
            a.num_topk = k as c_int;
            a.out_topk_weights = or_null(&mut out_w);
        }
        // SAFETY: every slice checked against the handle's shapes above.
        check(unsafe { sys::epCombine(self.raw, &a, handle.raw, ptr::null_mut()) }, self.raw)?;
        Ok((out, out_w))
    }

    /// `epLowLatencyDispatch` (config.low_latency = 1) of x `[T, hidden]` BF16.
    /// `topk_weights` are the weights `ll_combine` applies (None: 1).
    pub fn ll_dispatch(
        &self,
        x: &[Bf16],
        topk_idx: &[i64],
        topk_weights: Option<&[f32]>,
        num_topk: usize,
        wire: LlWire,
    ) -> Result<(Handle, LlReceived)> {
        self.host_only("ll_dispatch")?;
        let h = self.hidden();
        need(num_topk > 0, "ll_dispatch: num_topk is 0".into())?;
        let n = topk_idx.len() / num_topk;
        need(x.len() == n * h && topk_idx.len() == n * num_topk, "ll_dispatch: x or topk_idx of the wrong size".into())?;
        if let Some(w) = topk_weights {
            need(w.len() == topk_idx.len(), "ll_dispatch: topk_weights is not the shape of topk_idx".into())?;
        }
        let slots = self.size as usize * self.cfg.max_tokens_per_rank as usize;
        let experts = self.local_experts as usize;
        let nb = (h + 127) / 128;
        let mut r = LlReceived {
            rows: match wire {
                LlWire::Fp8 => LlRows::Fp8(Rows::zeroed(experts * slots * h)),
                LlWire::Bf16 => LlRows::Bf16(Rows::zeroed(experts * slots * h)),
            },
            scales: vec![0.0; if wire == LlWire::Fp8 { experts * nb * slots } else { 0 }],
            count: vec![0; experts],
            src: vec![0; experts * slots],
        };
        let mut a = sys::epLowLatencyDispatchArgs_t::initializer();
        a.x = x.as_ptr() as *const c_void;
        a.topk_idx = topk_idx.as_ptr() as *const c_void;
        a.topk_weights = topk_weights.map_or(ptr::null(), |w| w.as_ptr());
        a.num_tokens = n as c_int;
        a.num_topk = num_topk as c_int;
        a.wire_type = match wire {
            LlWire::Fp8 => DataType::Float8E4M3.raw(),
            LlWire::Bf16 => DataType::Bfloat16.raw(),
        };
        a.recv_x = match &mut r.rows {
            LlRows::Fp8(v) => or_null(&mut v[..]) as *mut c_void,
            LlRows::Bf16(v) => or_null(&mut v[..]) as *mut c_void,
        };
        a.recv_scales = or_null(&mut r.scales);
        a.recv_count = or_null(&mut r.count);
        a.recv_src = or_null(&mut r.src);
        // SAFETY: outputs of the layout's full size, inputs checked above.
        let handle = unsafe { self.ll_dispatch_raw(&a, ptr::null_mut()) }?;
        Ok((handle, r))
    }

    /// `epLowLatencyCombine`: y `[local experts, R * M, hidden]` BF16 in the
    /// dispatch layout; returns `[T, hidden]` BF16, weighted by the
    /// dispatch's topk_weights.
    pub fn ll_combine(&self, handle: &Handle, y: &[Bf16]) -> Result<Rows<Bf16>> {
        self.host_only("ll_combine")?;
        let h = self.hidden();
        let slots = self.size as usize * self.cfg.max_tokens_per_rank as usize;
        need(y.len() == self.local_experts as usize * slots * h, "ll_combine: y is not [experts, R * M, hidden]".into())?;
        let mut out = Rows::<Bf16>::zeroed(handle.num_tokens * h);
        let mut a = sys::epLowLatencyCombineArgs_t::initializer();
        a.y = y.as_ptr() as *const c_void;
        a.out = or_null(&mut out[..]) as *mut c_void;
        // SAFETY: sizes checked above.
        unsafe { self.ll_combine_raw(&a, handle, ptr::null_mut()) }?;
        Ok(out)
    }
}
