//! Several host ranks in one process, each on its own thread: dispatch,
//! combine (bias, weights summed back), a cached re-dispatch and the
//! low-latency calls, every output against a reference computed from all
//! ranks' inputs (SPEC.md); and errors carrying the library's message.
use moeep::{Backend, Bf16, Comm, Config, LlRows, LlWire, Rows, Tokens, UniqueId};

const E_PER_RANK: usize = 3;
const H: usize = 40;
const M: usize = 10;
const K: usize = 2;

/// A small deterministic generator (no crate needed).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

struct Input {
    x: Vec<f32>,
    idx: Vec<i64>,
    w: Vec<f32>,
}

/// Rank r's tokens: small integers (sums stay exact in BF16), ids with some -1
/// and (rank 1) none at all, power-of-two weights.
fn input(rank: usize, ranks: usize, seed: u64) -> Input {
    let mut g = Lcg(seed * 1000 + rank as u64);
    let t = if rank == 1 { 0 } else { 1 + g.next(M as u64) as usize };
    let e = (E_PER_RANK * ranks) as u64;
    let x = (0..t * H).map(|_| g.next(17) as f32 - 8.0).collect();
    let idx = (0..t * K).map(|_| if g.next(5) == 0 { -1 } else { g.next(e) as i64 }).collect();
    let w = (0..t * K).map(|_| [0.5f32, 1.0, 2.0][g.next(3) as usize]).collect();
    Input { x, idx, w }
}

/// BF16 rows in 16-byte aligned memory, as the library wants them.
fn bf16(v: &[f32]) -> Rows<Bf16> {
    Rows::from_slice(&v.iter().map(|&f| Bf16::from_f32(f)).collect::<Vec<_>>())
}

fn tokens(i: &Input) -> usize {
    i.idx.len() / K
}

/// Rank `me`'s whole layer, checked; returns the number of checks made.
fn layer(comm: &Comm, all: &[Input]) -> usize {
    let me = comm.rank() as usize;
    let ranks = all.len();
    let mine = &all[me];
    let lo = (me * E_PER_RANK) as i64;
    let here = |e: i64| e >= lo && e < lo + E_PER_RANK as i64;
    let mut checks = 0;

    // Dispatch: rows by source rank, then source token.
    let x = bf16(&mine.x);
    let mut t = Tokens::new(&x, &mine.idx, K);
    t.topk_weights = Some(&mine.w);
    let (mut handle, got) = comm.dispatch(&t).expect("dispatch");
    let rows: Vec<(usize, usize)> = (0..ranks)
        .flat_map(|s| (0..tokens(&all[s])).map(move |tk| (s, tk)))
        .filter(|&(s, tk)| all[s].idx[tk * K..tk * K + K].iter().any(|&e| here(e)))
        .collect();
    assert_eq!(got.num_recv, rows.len(), "rank {}: num_recv", me);
    for (i, &(s, tk)) in rows.iter().enumerate() {
        let want = bf16(&all[s].x[tk * H..tk * H + H]);
        assert_eq!(&got.x[i * H..i * H + H], &want[..], "rank {}: row {} (from rank {} token {})", me, i, s, tk);
        for k in 0..K {
            let e = all[s].idx[tk * K + k];
            let (id, w) = if here(e) { (e - lo, all[s].w[tk * K + k]) } else { (-1, 0.0) };
            assert_eq!((got.topk_idx[i * K + k], got.topk_weights[i * K + k]), (id, w), "rank {}: row {} k {}", me, i, k);
        }
        checks += 1;
    }
    for e in 0..E_PER_RANK {
        let n = got.topk_idx.iter().filter(|&&v| v == e as i64).count() as i32;
        assert_eq!(got.tokens_per_expert[e], n, "rank {}: tokens of expert {}", me, e);
    }

    // Combine: each rank returns its rows times (rank + 1); the weights come back.
    let y = Rows::from_slice(&got.x.iter().map(|v| Bf16::from_f32(v.to_f32() * (me + 1) as f32)).collect::<Vec<_>>());
    let bias = bf16(&(0..tokens(mine) * H).map(|i| (i % 5) as f32).collect::<Vec<_>>());
    let (out, back) = comm.combine(&handle, &y, Some(&bias), Some((&got.topk_weights, K))).expect("combine");
    for tk in 0..tokens(mine) {
        let reached: std::collections::BTreeSet<i64> =
            mine.idx[tk * K..tk * K + K].iter().filter(|&&e| e >= 0).map(|&e| e / E_PER_RANK as i64).collect();
        let factor: f32 = reached.iter().map(|&r| (r + 1) as f32).sum();
        for j in 0..H {
            let want = Bf16::from_f32(mine.x[tk * H + j] * factor + ((tk * H + j) % 5) as f32);
            assert_eq!(out[tk * H + j], want, "rank {}: combine token {} element {}", me, tk, j);
        }
        for k in 0..K {
            let want = if mine.idx[tk * K + k] >= 0 { mine.w[tk * K + k] } else { 0.0 };
            assert_eq!(back[tk * K + k], want, "rank {}: weight back, token {} k {}", me, tk, k);
        }
        checks += 1;
    }

    // A cached re-dispatch: the same rows of new values.
    let x2 = bf16(&mine.x.iter().map(|v| -v).collect::<Vec<_>>());
    let again = comm.dispatch_cached(&mut handle, &x2, None).expect("cached dispatch");
    assert!(again.x.len() == got.x.len() && again.x.iter().zip(got.x.iter()).all(|(a, b)| a.to_f32() == -b.to_f32()),
            "rank {}: cached rows", me);
    drop(handle);

    // Low latency, BF16 wire: expert-major rows, combine weighted by the dispatch's weights.
    let (ll, recv) = comm.ll_dispatch(&x, &mine.idx, Some(&mine.w), K, LlWire::Bf16).expect("ll dispatch");
    let slots = ranks * M;
    let rows_ll = match &recv.rows {
        LlRows::Bf16(v) => v,
        LlRows::Fp8(_) => panic!("BF16 wire gave FP8 rows"),
    };
    let mut y = Rows::<Bf16>::zeroed(E_PER_RANK * slots * H);
    for e in 0..E_PER_RANK {
        let arrivals: Vec<(usize, usize)> = (0..ranks)
            .flat_map(|s| (0..tokens(&all[s])).map(move |tk| (s, tk)))
            .filter(|&(s, tk)| all[s].idx[tk * K..tk * K + K].contains(&(lo + e as i64)))
            .collect();
        assert_eq!(recv.count[e] as usize, arrivals.len(), "rank {}: ll count of expert {}", me, e);
        for (slot, &(s, tk)) in arrivals.iter().enumerate() {
            assert_eq!(recv.src[e * slots + slot] as usize, s * M + tk, "rank {}: ll source", me);
            let at = (e * slots + slot) * H;
            assert_eq!(&rows_ll[at..at + H], &bf16(&all[s].x[tk * H..tk * H + H])[..], "rank {}: ll row", me);
            for j in 0..H {
                y[at + j] = Bf16::from_f32(rows_ll[at + j].to_f32() * (lo as usize + e + 1) as f32);
            }
        }
        checks += 1;
    }
    let out = comm.ll_combine(&ll, &y).expect("ll combine");
    for tk in 0..tokens(mine) {
        for j in 0..H {
            let mut sum = 0.0f32;
            for k in 0..K {
                let e = mine.idx[tk * K + k];
                if e >= 0 {
                    sum += mine.w[tk * K + k] * mine.x[tk * H + j] * (e + 1) as f32;
                }
            }
            assert_eq!(out[tk * H + j], Bf16::from_f32(sum), "rank {}: ll combine token {} element {}", me, tk, j);
        }
    }
    checks + 1
}

fn config(ranks: usize) -> Config {
    Config::new((E_PER_RANK * ranks) as i32, H as i32, M as i32, K as i32)
        .backend(Backend::Host)
        .low_latency(true)
        .timeout_ms(20000) // a rank that panics leaves its peers waiting this long
}

#[test]
fn three_ranks_as_threads_of_one_process() {
    let comms = Comm::init_all(3, &config(3)).expect("init_all");
    let all: Vec<Input> = (0..3).map(|r| input(r, 3, 1)).collect();
    let checks: Vec<usize> = std::thread::scope(|s| {
        let handles: Vec<_> = comms.iter().map(|c| s.spawn(|| layer(c, &all))).collect();
        handles.into_iter().map(|h| h.join().expect("a rank failed")).collect()
    });
    assert!(checks.iter().all(|&n| n > 0), "checks per rank: {:?}", checks);
}

#[test]
fn two_ranks_sharing_a_unique_id() {
    let id = UniqueId::new().expect("unique id");
    let bytes = id.to_bytes(); // what a rank would send another process
    let all: Vec<Input> = (0..2).map(|r| input(r, 2, 2)).collect();
    std::thread::scope(|s| {
        let joins: Vec<_> = (0..2)
            .map(|r| {
                let all = &all;
                s.spawn(move || {
                    let comm = Comm::init_rank(2, &UniqueId::from_bytes(&bytes), r, &config(2)).expect("init_rank");
                    assert_eq!((comm.rank(), comm.size()), (r, 2));
                    assert_eq!(comm.local_experts(), (r * E_PER_RANK as i32, E_PER_RANK as i32));
                    layer(&comm, all)
                })
            })
            .collect();
        for j in joins {
            assert!(j.join().expect("a rank failed") > 0);
        }
    });
}

#[test]
fn errors_carry_the_library_message() {
    let comm = Comm::init_all(1, &config(1)).expect("init_all").pop().unwrap();
    let x = Rows::<Bf16>::zeroed(2 * H);
    let bad = [0i64, 1000, 1, 2];
    let err = comm.dispatch(&Tokens::new(&x, &bad, K)).err().expect("an id out of range must fail");
    assert_eq!(err.name(), "epInvalidArgument");
    assert!(err.message.contains("topk_idx"), "message: {}", err.message);
    // The communicator stays usable after an argument error.
    let good = [0i64, 1, 2, -1];
    let (_, got) = comm.dispatch(&Tokens::new(&x, &good, K)).expect("dispatch after an error");
    assert_eq!(got.num_recv, 2);
    let floats = Rows::<f32>::zeroed(2 * H);
    let err = comm.dispatch(&Tokens::new(&floats, &good, K)).err().expect("f32 rows on a BF16 communicator");
    assert!(err.message.contains("communicator's type"), "message: {}", err.message);
    let err = Comm::init_all(1, &Config::new(4, 0, 8, 2).backend(Backend::Host)).err().expect("hidden 0");
    assert!(err.message.contains("hidden"), "message: {}", err);
}

#[test]
fn comm_is_send_and_sync_handle_is_send() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<Comm>();
    send::<moeep::Handle>();
    assert_eq!(moeep::version().unwrap(), (0, 1, 0));
}
