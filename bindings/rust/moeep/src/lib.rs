//! libmoeep from Rust: expert-parallel dispatch and combine.
//!
//! [`Comm`] is a communicator (`epComm_t`) and [`Handle`] a routing handle
//! (`epHandle_t`); both are released when dropped. Every call returns a
//! [`Result`] whose [`Error`] carries the library's own message. The calls
//! on slices ([`Comm::dispatch`], [`Comm::combine`], the low-latency ones)
//! serve the host backend, where the data is host memory; GPU memory goes
//! through the `unsafe` `*_raw` calls with the `moeep_sys` argument structs
//! and the caller's CUDA stream.
//!
//! Threads: a `Comm` is `Send` and `Sync` because the C API allows its use
//! from several threads (queries beside a call; a second data call made while
//! one runs is refused with `epInvalidUsage`, not undefined), and `Drop`
//! takes it whole, so it is never destroyed under a running call. A `Handle`
//! is `Send` (it may be destroyed in any thread, even after its communicator)
//! but not `Sync`: calls that change it (a cached re-dispatch, a low-latency
//! completion) take it by `&mut`.

use moeep_sys as sys;
use std::ffi::CStr;
use std::fmt;
use std::os::raw::c_int;
use std::ptr;

mod types;
pub use types::{Bf16, DataType, Element, Fp8, Rows, F16};

/// A failed call: the `epResult_t` and the library's message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    pub code: i32,
    pub message: String,
}

impl Error {
    /// The name of the code in moeep.h (`epInvalidArgument`, ...).
    pub fn name(&self) -> &'static str {
        match self.code {
            sys::epSuccess => "epSuccess",
            sys::epUnhandledCudaError => "epUnhandledCudaError",
            sys::epSystemError => "epSystemError",
            sys::epInternalError => "epInternalError",
            sys::epInvalidArgument => "epInvalidArgument",
            sys::epInvalidUsage => "epInvalidUsage",
            sys::epRemoteError => "epRemoteError",
            sys::epInProgress => "epInProgress",
            sys::epTimeout => "epTimeout",
            sys::epNotSupported => "epNotSupported",
            sys::epAborted => "epAborted",
            sys::epOutOfMemory => "epOutOfMemory",
            _ => "epResult",
        }
    }

    fn usage(message: String) -> Error {
        Error { code: sys::epInvalidUsage, message }
    }

    fn argument(message: String) -> Error {
        Error { code: sys::epInvalidArgument, message }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.name(), self.message)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

/// Turns a result code into a Result, with the message the library kept for
/// comm (or for this thread when comm is null).
fn check(code: sys::epResult_t, comm: sys::epComm_t) -> Result<()> {
    if code == sys::epSuccess {
        return Ok(());
    }
    // SAFETY: epGetLastError never returns NULL; the text lives until the next call.
    let message = unsafe { CStr::from_ptr(sys::epGetLastError(comm)) }.to_string_lossy().into_owned();
    Err(Error { code, message })
}

/// `epGetVersion` of the loaded library: (major, minor, patch).
pub fn version() -> Result<(i32, i32, i32)> {
    let mut v: c_int = 0;
    // SAFETY: a valid out pointer.
    check(unsafe { sys::epGetVersion(&mut v) }, ptr::null_mut())?;
    Ok((v / 10000, v / 100 % 100, v % 100))
}

/// The 128 bytes every rank of a communicator is given.
#[derive(Clone, Copy)]
pub struct UniqueId(sys::epUniqueId);

impl UniqueId {
    /// `epGetUniqueId`: on the root rank, whose process then serves the
    /// bootstrap of one communicator; with EP_COMM_ID set, on any rank.
    pub fn new() -> Result<UniqueId> {
        let mut id = sys::epUniqueId { internal: [0; sys::EP_UNIQUE_ID_BYTES] };
        // SAFETY: a valid out pointer.
        check(unsafe { sys::epGetUniqueId(&mut id) }, ptr::null_mut())?;
        Ok(UniqueId(id))
    }

    pub fn from_bytes(bytes: &[u8; sys::EP_UNIQUE_ID_BYTES]) -> UniqueId {
        let mut id = sys::epUniqueId { internal: [0; sys::EP_UNIQUE_ID_BYTES] };
        for (d, s) in id.internal.iter_mut().zip(bytes.iter()) {
            *d = *s as _;
        }
        UniqueId(id)
    }

    pub fn to_bytes(&self) -> [u8; sys::EP_UNIQUE_ID_BYTES] {
        let mut out = [0u8; sys::EP_UNIQUE_ID_BYTES];
        for (d, s) in out.iter_mut().zip(self.0.internal.iter()) {
            *d = *s as u8;
        }
        out
    }
}

/// Where a communicator's data lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Auto,
    Host,
    Cuda,
}

/// `epConfig_t`, field by field; `Config::new` fills the four sizes and
/// leaves the rest to their EP_* variables or defaults (0 / -1, as in C).
#[derive(Clone, Debug)]
pub struct Config(pub sys::epConfig_t);

impl Config {
    pub fn new(num_experts: i32, hidden: i32, max_tokens_per_rank: i32, max_topk: i32) -> Config {
        let mut c = sys::epConfig_t::initializer();
        c.num_experts = num_experts;
        c.hidden = hidden;
        c.max_tokens_per_rank = max_tokens_per_rank;
        c.max_topk = max_topk;
        Config(c)
    }

    pub fn backend(mut self, backend: Backend) -> Config {
        self.0.backend = match backend {
            Backend::Auto => sys::epBackendAuto,
            Backend::Host => sys::epBackendHost,
            Backend::Cuda => sys::epBackendCuda,
        };
        self
    }

    pub fn types(mut self, dispatch: DataType, combine: DataType) -> Config {
        self.0.dispatch_type = dispatch.raw();
        self.0.combine_type = combine.raw();
        self
    }

    pub fn low_latency(mut self, on: bool) -> Config {
        self.0.low_latency = on as c_int;
        self
    }

    pub fn timeout_ms(mut self, ms: i32) -> Config {
        self.0.timeout_ms = ms;
        self
    }
}

/// A communicator; destroyed when dropped (`epCommDestroy`).
pub struct Comm {
    raw: sys::epComm_t,
    cfg: sys::epConfig_t,
    rank: i32,
    size: i32,
    first_expert: i32,
    local_experts: i32,
}

// SAFETY: the C API serialises a communicator's data calls itself (an
// overlapping one returns epInvalidUsage) and lets queries run beside them;
// destruction needs ownership here, so no call can be running then.
unsafe impl Send for Comm {}
unsafe impl Sync for Comm {}

impl Comm {
    /// `epCommInitRank`: collective over `nranks` processes or threads.
    pub fn init_rank(nranks: i32, id: &UniqueId, rank: i32, config: &Config) -> Result<Comm> {
        let mut raw: sys::epComm_t = ptr::null_mut();
        // SAFETY: valid pointers; the id is passed by value as in C.
        check(unsafe { sys::epCommInitRank(&mut raw, nranks, id.0, rank, &config.0) }, ptr::null_mut())?;
        Comm::adopt(raw, config.0)
    }

    /// `epCommInitAll`: every rank in this process (on the host backend,
    /// call each rank's collectives from its own thread).
    pub fn init_all(nranks: i32, config: &Config) -> Result<Vec<Comm>> {
        let mut raws: Vec<sys::epComm_t> = vec![ptr::null_mut(); nranks.max(0) as usize];
        // SAFETY: room for nranks communicators; devices NULL is allowed.
        check(unsafe { sys::epCommInitAll(raws.as_mut_ptr(), nranks, ptr::null(), &config.0) }, ptr::null_mut())?;
        raws.into_iter().map(|raw| Comm::adopt(raw, config.0)).collect()
    }

    fn adopt(raw: sys::epComm_t, cfg: sys::epConfig_t) -> Result<Comm> {
        let mut c = Comm { raw, cfg, rank: 0, size: 0, first_expert: 0, local_experts: 0 };
        // SAFETY: raw is a live communicator; valid out pointers.
        unsafe {
            check(sys::epCommRank(raw, &mut c.rank), raw)?;
            check(sys::epCommSize(raw, &mut c.size), raw)?;
            check(sys::epCommLocalExperts(raw, &mut c.first_expert, &mut c.local_experts), raw)?;
        }
        Ok(c)
    }

    pub fn rank(&self) -> i32 {
        self.rank
    }
    pub fn size(&self) -> i32 {
        self.size
    }
    /// Experts of this rank: `first..first + count`.
    pub fn local_experts(&self) -> (i32, i32) {
        (self.first_expert, self.local_experts)
    }
    pub fn config(&self) -> &sys::epConfig_t {
        &self.cfg
    }
    /// The raw communicator, for the `moeep_sys` calls.
    pub fn as_raw(&self) -> sys::epComm_t {
        self.raw
    }

    /// `epCommBufferBytes`.
    pub fn buffer_bytes(&self) -> Result<usize> {
        let mut n = 0usize;
        // SAFETY: live communicator, valid out pointer.
        check(unsafe { sys::epCommBufferBytes(self.raw, &mut n) }, self.raw)?;
        Ok(n)
    }

    /// `epCommAbort`: calls blocked on this communicator in other threads
    /// return epAborted; then it is freed.
    pub fn abort(self) -> Result<()> {
        let raw = self.raw;
        std::mem::forget(self);
        // SAFETY: raw is live and, forgotten above, never used again.
        check(unsafe { sys::epCommAbort(raw) }, ptr::null_mut())
    }

    fn host_only(&self, what: &str) -> Result<()> {
        if self.cfg.backend != sys::epBackendHost {
            return Err(Error::usage(format!(
                "{}: the slice calls serve a communicator made with Backend::Host (its data is host memory); \
                 use the *_raw calls with device pointers",
                what
            )));
        }
        Ok(())
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        // SAFETY: owned and live; no call can be running (drop takes it whole).
        unsafe { sys::epCommDestroy(self.raw) };
    }
}

/// A routing handle; destroyed when dropped (`epHandleDestroy`), which may
/// come after its communicator was.
pub struct Handle {
    raw: sys::epHandle_t,
    num_tokens: usize,
    num_topk: usize,
}

// SAFETY: epHandleDestroy may run in any thread, even during its
// communicator's destroy or abort in another (moeep.h).
unsafe impl Send for Handle {}

impl Handle {
    /// `epHandleRecvCount`: rows this rank receives (None while on the device only).
    pub fn num_recv(&self) -> Option<usize> {
        let mut n: i64 = -1;
        // SAFETY: a live handle, valid out pointer.
        let res = unsafe { sys::epHandleRecvCount(self.raw, &mut n) };
        if res == sys::epSuccess {
            Some(n as usize)
        } else {
            None
        }
    }

    /// Tokens of the dispatch that made it (this rank's T).
    pub fn num_tokens(&self) -> usize {
        self.num_tokens
    }

    /// Top-k width of the dispatch that made it.
    pub fn num_topk(&self) -> usize {
        self.num_topk
    }

    pub fn as_raw(&self) -> sys::epHandle_t {
        self.raw
    }

    /// Takes ownership of a handle a raw call returned.
    ///
    /// # Safety
    /// `raw` must be a live handle not owned by another `Handle`.
    pub unsafe fn from_raw(raw: sys::epHandle_t, num_tokens: usize, num_topk: usize) -> Handle {
        Handle { raw, num_tokens, num_topk }
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: owned and live.
        unsafe { sys::epHandleDestroy(self.raw) };
    }
}

mod host;
pub use host::{LlReceived, LlRows, LlWire, Received, Tokens};

impl Comm {
    /// `epDispatch` with raw arguments (device pointers on the GPU backend).
    /// `*handle` null: a new routing, and the new handle is returned there.
    ///
    /// # Safety
    /// Every pointer in `args` must be valid for what moeep.h says the call
    /// reads or writes, until the call completes on `stream`.
    pub unsafe fn dispatch_raw(
        &self,
        args: &sys::epDispatchArgs_t,
        handle: &mut sys::epHandle_t,
        stream: sys::epStream_t,
    ) -> Result<()> {
        check(sys::epDispatch(self.raw, args, handle, stream), self.raw)
    }

    /// `epCombine` with raw arguments.
    ///
    /// # Safety
    /// As for [`Comm::dispatch_raw`].
    pub unsafe fn combine_raw(&self, args: &sys::epCombineArgs_t, handle: &Handle, stream: sys::epStream_t) -> Result<()> {
        check(sys::epCombine(self.raw, args, handle.raw, stream), self.raw)
    }

    /// `epLowLatencyDispatch` with raw arguments.
    ///
    /// # Safety
    /// As for [`Comm::dispatch_raw`].
    pub unsafe fn ll_dispatch_raw(&self, args: &sys::epLowLatencyDispatchArgs_t, stream: sys::epStream_t) -> Result<Handle> {
        let mut h: sys::epHandle_t = ptr::null_mut();
        check(sys::epLowLatencyDispatch(self.raw, args, &mut h, stream), self.raw)?;
        Ok(Handle::from_raw(h, args.num_tokens as usize, args.num_topk as usize))
    }

    /// `epLowLatencyCombine` with raw arguments.
    ///
    /// # Safety
    /// As for [`Comm::dispatch_raw`].
    pub unsafe fn ll_combine_raw(&self, args: &sys::epLowLatencyCombineArgs_t, handle: &Handle, stream: sys::epStream_t) -> Result<()> {
        check(sys::epLowLatencyCombine(self.raw, args, handle.raw, stream), self.raw)
    }

    /// `epLowLatencyComplete`: the receive half of a send-only call.
    ///
    /// # Safety
    /// The outputs of the call being completed must still be valid.
    pub unsafe fn ll_complete_raw(&self, handle: &mut Handle, stream: sys::epStream_t) -> Result<()> {
        check(sys::epLowLatencyComplete(self.raw, handle.raw, stream), self.raw)
    }
}
